//! Host tensors: a dtype, a shape and contiguous, 8-byte-aligned element storage.

use crate::dispatch_dtype;
use crate::dtype::{DType, Element};
use std::fmt;

/// A contiguous host tensor. A 0-dim tensor has `shape == []` and one element; a tensor with a
/// zero in its shape is empty.
#[derive(Clone)]
pub struct Tensor {
    dtype: DType,
    shape: Vec<usize>,
    /// 8-byte words so that every element type can be viewed without misalignment.
    words: Vec<u64>,
    len_bytes: usize,
}

pub fn numel_of(shape: &[usize]) -> usize {
    shape.iter().product()
}

impl Tensor {
    /// A zero-filled tensor.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Tensor {
        let len_bytes = numel_of(shape) * dtype.size();
        Tensor { dtype, shape: shape.to_vec(), words: vec![0u64; len_bytes.div_ceil(8)], len_bytes }
    }

    /// A tensor whose every byte is `byte` (used for guard patterns and "uninitialised" outputs).
    pub fn filled_bytes(dtype: DType, shape: &[usize], byte: u8) -> Tensor {
        let mut t = Tensor::zeros(dtype, shape);
        t.bytes_mut().fill(byte);
        t
    }

    pub fn from_vec<T: Element>(shape: &[usize], data: Vec<T>) -> Tensor {
        assert_eq!(numel_of(shape), data.len(), "shape {shape:?} does not hold {} elements", data.len());
        let mut t = Tensor::zeros(T::DTYPE, shape);
        t.as_mut_slice::<T>().copy_from_slice(&data);
        t
    }

    /// Builds a tensor of `dtype` from f64 values (rounded / cast per [`Element::from_f64`]).
    pub fn from_f64(dtype: DType, shape: &[usize], values: &[f64]) -> Tensor {
        assert_eq!(numel_of(shape), values.len());
        let mut t = Tensor::zeros(dtype, shape);
        dispatch_dtype!(dtype, T => {
            for (d, v) in t.as_mut_slice::<T>().iter_mut().zip(values) {
                *d = <T as Element>::from_f64(*v);
            }
        });
        t
    }

    /// Builds a tensor from raw little-endian bytes.
    pub fn from_bytes(dtype: DType, shape: &[usize], bytes: &[u8]) -> Tensor {
        let mut t = Tensor::zeros(dtype, shape);
        assert_eq!(t.len_bytes, bytes.len(), "byte length does not match {dtype}{shape:?}");
        t.bytes_mut().copy_from_slice(bytes);
        t
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn numel(&self) -> usize {
        numel_of(&self.shape)
    }
    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }
    /// Elements in one index of dim 0 (1 for a 0-dim tensor).
    pub fn row_numel(&self) -> usize {
        self.shape.iter().skip(1).product()
    }

    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<u64, u8>(&self.words)[..self.len_bytes]
    }
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.len_bytes;
        &mut bytemuck::cast_slice_mut::<u64, u8>(&mut self.words)[..n]
    }

    pub fn as_slice<T: Element>(&self) -> &[T] {
        assert_eq!(T::DTYPE, self.dtype, "viewing a {} tensor as {}", self.dtype, T::DTYPE);
        bytemuck::cast_slice(self.bytes())
    }
    pub fn as_mut_slice<T: Element>(&mut self) -> &mut [T] {
        assert_eq!(T::DTYPE, self.dtype, "viewing a {} tensor as {}", self.dtype, T::DTYPE);
        bytemuck::cast_slice_mut(self.bytes_mut())
    }

    /// Same data, new shape with the same element count.
    pub fn reshaped(mut self, shape: &[usize]) -> Tensor {
        assert_eq!(numel_of(shape), self.numel(), "reshape {:?} -> {shape:?}", self.shape);
        self.shape = shape.to_vec();
        self
    }

    /// Element `i` (flat index) as f64 (lossy for 64-bit integers beyond 2^53).
    pub fn get_f64(&self, i: usize) -> f64 {
        dispatch_dtype!(self.dtype, T => self.as_slice::<T>()[i].to_f64())
    }

    /// Element `i` printed exactly (integers in full, floats with their bit pattern when NaN).
    pub fn fmt_element(&self, i: usize) -> String {
        dispatch_dtype!(self.dtype, T => format!("{:?}", self.as_slice::<T>()[i]))
    }

    /// Rows `[start, start + len)` of dim 0 as a new tensor.
    pub fn slice_rows(&self, start: usize, len: usize) -> Tensor {
        assert!(!self.shape.is_empty(), "slice_rows on a 0-dim tensor");
        let row_bytes = self.row_numel() * self.dtype.size();
        let mut shape = self.shape.clone();
        shape[0] = len;
        Tensor::from_bytes(self.dtype, &shape, &self.bytes()[start * row_bytes..(start + len) * row_bytes])
    }

    /// Concatenates tensors along dim 0 (0-dim parts count as one row each).
    pub fn cat_rows(dtype: DType, row_shape: &[usize], parts: &[Tensor]) -> Tensor {
        let rows: usize = parts.iter().map(|p| if p.shape.is_empty() { 1 } else { p.shape[0] }).sum();
        let mut shape = vec![rows];
        shape.extend_from_slice(row_shape);
        let mut t = Tensor::zeros(dtype, &shape);
        let mut off = 0;
        for p in parts {
            assert_eq!(p.dtype, dtype);
            let b = p.bytes();
            t.bytes_mut()[off..off + b.len()].copy_from_slice(b);
            off += b.len();
        }
        t
    }
}

impl PartialEq for Tensor {
    /// Bit-exact equality of dtype, shape and bytes.
    fn eq(&self, other: &Self) -> bool {
        self.dtype == other.dtype && self.shape == other.shape && self.bytes() == other.bytes()
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor<{}>{:?}[", self.dtype, self.shape)?;
        let n = self.numel().min(8);
        for i in 0..n {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{}", self.fmt_element(i))?;
        }
        if self.numel() > n {
            write!(f, ", …")?;
        }
        write!(f, "]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_dim_has_one_element_and_empty_has_none() {
        assert_eq!(Tensor::zeros(DType::F32, &[]).numel(), 1);
        assert_eq!(Tensor::zeros(DType::F32, &[0, 3]).numel(), 0);
        assert_eq!(Tensor::zeros(DType::F64, &[3]).len_bytes(), 24);
    }

    #[test]
    fn slice_and_cat_round_trip() {
        let t = Tensor::from_vec(&[4, 2], (0..8).map(|i| i as i16).collect());
        let a = t.slice_rows(0, 1);
        let b = t.slice_rows(1, 3);
        assert_eq!(b.as_slice::<i16>(), &[2, 3, 4, 5, 6, 7]);
        assert_eq!(Tensor::cat_rows(DType::I16, &[2], &[a, b]), t);
    }

    #[test]
    fn f16_round_trip_through_f64() {
        let t = Tensor::from_f64(DType::F16, &[2], &[1.5, -2.0]);
        assert_eq!(t.get_f64(0), 1.5);
        assert_eq!(t.get_f64(1), -2.0);
    }
}
