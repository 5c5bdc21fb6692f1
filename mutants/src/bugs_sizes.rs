//! Bugs at the contract's size floor (`values.sizes`: every op "up to at least 64 MiB"), each
//! past every size switch of the shm backend (its largest is 1 MiB), so nothing but a 64 MiB
//! step of the op itself catches it: the catalogue must not reason from shm's own boundaries
//! (a backend's staging buffers, eager / rendezvous switches and chunk loops are its own).

use crate::campaign::{spec, Spec};
use crate::{Buf, Bug, Shm};
use concord_core::{Backend, Result, Work};

/// The size of the fixed staging ("bounce") buffer of [`AllGatherBounce32Mib`].
pub const BOUNCE: usize = 32 << 20;

/// all_gather_into_tensor through one fixed 32 MiB staging buffer, written without the chunk
/// loop (every test of its author fitted: a 2-rank gather of 8 MiB per rank is 16 MiB): an
/// output past 32 MiB gets its first 32 MiB, the rest is left as it was (zeros in a fresh
/// output), on every rank. The 8 MiB (`n` = 1048575 at 2 ranks) rung passes; only a gather
/// whose output passes 32 MiB shows it.
#[derive(Default)]
pub struct AllGatherBounce32Mib;

impl Bug for AllGatherBounce32Mib {
    fn all_gather_into_tensor(&self, s: &Shm, x: &Buf) -> Result<Work<Buf>> {
        let bytes = s.numel(x) * s.inner.buffer_dtype(x).size() * s.ws();
        let w = s.inner.all_gather_into_tensor(x)?;
        if bytes <= BOUNCE {
            return Ok(w);
        }
        Ok(s.then(w, move |be, out| crate::edit(be, out, |t| t.bytes_mut()[BOUNCE..].fill(0))))
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![spec::<AllGatherBounce32Mib>(
        "sizes_all_gather_bounce_32mib",
        "values.sizes",
        "all_gather_into_tensor through a fixed 32 MiB staging buffer without a chunk loop: an output past 32 MiB keeps only its first 32 MiB",
        &["sizes::all_gather_into_tensor::f32::n8388609::ws2"],
    )]
}
