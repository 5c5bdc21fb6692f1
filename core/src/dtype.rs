//! Element types. Every dtype a backend may be asked to move, with a bit-exact host representation.

use half::{bf16, f16};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The element types Concord knows. `name()` is the spelling used in case names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DType {
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    F16,
    BF16,
    F32,
    F64,
}

impl DType {
    pub const ALL: [DType; 12] = [
        DType::I8,
        DType::U8,
        DType::I16,
        DType::U16,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 => 1,
            DType::I16 | DType::U16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 => 8,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I16 => "i16",
            DType::U16 => "u16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I64 => "i64",
            DType::U64 => "u64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    pub const fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    pub const fn is_signed_int(self) -> bool {
        matches!(self, DType::I8 | DType::I16 | DType::I32 | DType::I64)
    }

    /// Machine epsilon for floats (distance from 1.0 to the next value); 0 for integers.
    pub fn epsilon(self) -> f64 {
        match self {
            DType::F16 => f16::EPSILON.to_f64(),
            DType::BF16 => bf16::EPSILON.to_f64(),
            DType::F32 => f32::EPSILON as f64,
            DType::F64 => f64::EPSILON,
            _ => 0.0,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that stores one element of a [`DType`].
pub trait Element: bytemuck::Pod + PartialEq + fmt::Debug + Send + Sync + 'static {
    const DTYPE: DType;
    /// Lossy for 64-bit integers beyond 2^53; use the native type where exactness matters.
    fn to_f64(self) -> f64;
    /// Rounds to nearest for floats; saturating `as` cast for integers.
    fn from_f64(v: f64) -> Self;
}

macro_rules! int_element {
    ($($t:ty => $d:ident),*) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn to_f64(self) -> f64 { self as f64 }
            fn from_f64(v: f64) -> Self { v as $t }
        }
    )*};
}
int_element!(i8 => I8, u8 => U8, i16 => I16, u16 => U16, i32 => I32, u32 => U32, i64 => I64, u64 => U64);

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}
impl Element for f64 {
    const DTYPE: DType = DType::F64;
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> Self {
        v
    }
}
impl Element for f16 {
    const DTYPE: DType = DType::F16;
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
}
impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
}

/// Runs `$body` with `$T` bound to the Rust element type of `$dtype`.
///
/// ```
/// use concord_core::{dispatch_dtype, DType, Element};
/// let size = dispatch_dtype!(DType::BF16, T => std::mem::size_of::<T>());
/// assert_eq!(size, 2);
/// ```
#[macro_export]
macro_rules! dispatch_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::DType::I8 => {
                type $T = i8;
                $body
            }
            $crate::DType::U8 => {
                type $T = u8;
                $body
            }
            $crate::DType::I16 => {
                type $T = i16;
                $body
            }
            $crate::DType::U16 => {
                type $T = u16;
                $body
            }
            $crate::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::DType::U32 => {
                type $T = u32;
                $body
            }
            $crate::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::DType::U64 => {
                type $T = u64;
                $body
            }
            $crate::DType::F16 => {
                type $T = $crate::half::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $T = $crate::half::bf16;
                $body
            }
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
        }
    };
}

/// Rounds `v` once to the binary float format with `e_bits` exponent and `m_bits` explicit
/// mantissa bits (f16: 5, 10; bf16: 8, 7; f32: 8, 23) and returns its bit pattern in the low
/// bits: to nearest, ties to even, overflow to ±inf, gradual underflow to subnormals, NaN to a
/// quiet NaN of the same sign. Straight from f64 — going through f32 (or `half`'s `from_f64`,
/// which truncates low bits first) would round twice and misround near ties. The one rounding
/// rule the oracle and the shm kernels share.
pub fn round_f64_to_bits(v: f64, e_bits: u32, m_bits: u32) -> u64 {
    let width = 1 + e_bits + m_bits;
    let sign = (v.to_bits() >> 63) << (width - 1);
    let exp_all = ((1u64 << e_bits) - 1) << m_bits;
    if v.is_nan() {
        return sign | exp_all | (1u64 << (m_bits - 1));
    }
    if v.is_infinite() {
        return sign | exp_all;
    }
    if v == 0.0 {
        return sign;
    }
    let bias = (1i64 << (e_bits - 1)) - 1;
    let bits = v.abs().to_bits();
    let raw_exp = (bits >> 52) as i64;
    let (mut e, sig) = if raw_exp == 0 {
        let m = bits & ((1u64 << 52) - 1);
        let lz = m.leading_zeros() as i64 - 11;
        (1 - 1023 - lz, m << lz)
    } else {
        (raw_exp - 1023, (bits & ((1u64 << 52) - 1)) | (1u64 << 52))
    };
    let min_normal_exp = 1 - bias;
    let subnormal = e < min_normal_exp;
    let shift = 52 - m_bits as i64 + if subnormal { min_normal_exp - e } else { 0 };
    if shift >= 64 {
        return sign;
    }
    let shift = shift as u32;
    let mut q = sig >> shift;
    let rem = sig & ((1u64 << shift) - 1);
    let half = 1u64 << (shift - 1);
    if rem > half || (rem == half && q & 1 == 1) {
        q += 1;
    }
    if subnormal {
        return sign | q;
    }
    if q == 1u64 << (m_bits + 1) {
        q >>= 1;
        e += 1;
    }
    let biased = e + bias;
    if biased >= (1i64 << e_bits) - 1 {
        return sign | exp_all;
    }
    sign | ((biased as u64) << m_bits) | (q & ((1u64 << m_bits) - 1))
}

/// [`round_f64_to_bits`] to f32 (8, 23), the same bits: every number by Rust's `as` cast (IEEE
/// round to nearest, ties to even, overflow to ±inf, gradual underflow: the same rule); NaN by
/// the rule (its quiet NaN of the same sign; a cast keeps the payload).
#[inline]
pub fn round_f64_to_f32_bits(v: f64) -> u32 {
    if v.is_nan() {
        round_f64_to_bits(v, 8, 23) as u32
    } else {
        (v as f32).to_bits()
    }
}

/// [`round_f64_to_bits`] to bf16 (8, 7), the same bits: a number that an f32 holds exactly (the
/// usual case: small integers, f32 and bf16 values) rounds from that f32 by the ties-to-even carry
/// into bit 16 (bf16 has f32's exponent range, so subnormals and overflow follow); any other value
/// and NaN by the rule.
#[inline]
pub fn round_f64_to_bf16_bits(v: f64) -> u16 {
    let f = v as f32;
    if !v.is_nan() && f as f64 == v {
        let b = f.to_bits();
        (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
    } else {
        round_f64_to_bits(v, 8, 7) as u16
    }
}

/// The values every rounding shortcut is checked on against [`round_f64_to_bits`] (core's and
/// the oracle's tests): random f64 bit patterns, random f32 values (the bf16 shortcut's domain),
/// small integers, every bf16 boundary's f32 neighbours (below, at and above each tie), every f32
/// of one high half in 512, the f64 midpoints between bf16 values and their f64 neighbours, and
/// zeros, infinities, NaNs, subnormals and the overflow edge. Not for production paths.
#[doc(hidden)]
pub fn rounding_probes(mut check: impl FnMut(f64)) {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..200_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        check(f64::from_bits(x));
        check(f32::from_bits(x as u32) as f64);
        check(f32::from_bits((x >> 32) as u32) as f64);
        check((x % 2001) as f64 - 1000.0);
    }
    for b in 0u32..=0xffff {
        let f = f32::from_bits(b << 16);
        for low in [0u32, 1, 0x7fff, 0x8000, 0x8001, 0xffff] {
            check(f32::from_bits(b << 16 | low) as f64);
        }
        if b % 512 == 0 {
            for low in 0..=0xffffu32 {
                check(f32::from_bits(b << 16 | low) as f64);
            }
        }
        let next = f32::from_bits((b + 1) << 16);
        if next.is_finite() && f.is_finite() && b != 0x7fff {
            let mid = (f as f64 + next as f64) / 2.0;
            check(mid);
            check(f64::from_bits(mid.to_bits() + 1));
            check(f64::from_bits(mid.to_bits() - 1));
        }
    }
    for v in [
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        -f64::NAN,
        f64::from_bits(0x7ff0_0000_0000_0001),
        f64::MAX,
        f64::MIN_POSITIVE,
        1e-320,
        f32::MAX as f64,
        3.4e38,
        3.402_823_57e38,
        1e39,
        -1e39,
        f32::MIN_POSITIVE as f64 / 3.0,
    ] {
        check(v);
    }
}

#[cfg(test)]
mod rounding_tests {
    use super::*;

    /// The f32 and bf16 shortcuts give the rule's bits on every [`rounding_probes`] value.
    #[test]
    fn shortcuts_are_the_rounding_rule() {
        rounding_probes(|v| {
            assert_eq!(round_f64_to_f32_bits(v) as u64, round_f64_to_bits(v, 8, 23), "f32 {v:e} ({:#x})", v.to_bits());
            assert_eq!(round_f64_to_bf16_bits(v) as u64, round_f64_to_bits(v, 8, 7), "bf16 {v:e} ({:#x})", v.to_bits());
        });
    }
}
