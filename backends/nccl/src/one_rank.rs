//! NCCL before 2.29.7 drops the tail of a one-rank reduction that needs its kernel
//! (NVIDIA/nccl#1950, pytorch/pytorch#168092; Concord's `wild::one_rank_block_tails::ws1` found
//! it in the system's NCCL 2.28.3 on 2 x H200: f16 `avg` of 8,193 elements, the last one never
//! written).
//!
//! With one rank, `sum` / `min` / `max` / `prod` are a copy, but `avg` and `premul_sum` scale, so
//! NCCL runs its `oneRankReduce` kernel on `bn = min(32, ⌈bytes / 16 KiB⌉)` blocks, block `b`
//! taking elements `[b·s, (b+1)·s)` with `s = alignUp(⌊n / bn⌋, 16 bytes)`: when `bn · s < n`
//! the last `n − bn · s` elements are never written (the fix divides rounding up).
//!
//! The backend's way round it, on a communicator of one rank with such an NCCL:
//! * `avg` of one rank is the input itself (`x / 1`, exact in every dtype): it is launched as
//!   `sum`, NCCL's copy;
//! * `premul_sum` is launched in [`segments`], each of which the kernel covers whole.
//!
//! Pure (no CUDA, no NCCL): unit-tested against a model of the kernel's coverage.

/// The first NCCL version with the fix (2.29.7, as NCCL encodes versions: 22907).
pub const FIXED_IN: i32 = 22907;

/// Bytes per block the kernel's grid is sized by.
const BLOCK_BYTES: usize = 16 << 10;
/// Its largest grid.
const MAX_BLOCKS: usize = 32;
/// Bytes of the pack each block's share is rounded to.
#[cfg(test)]
const PACK_BYTES: usize = 16;

/// Whether a reduction on a communicator of `ws` ranks with NCCL `version` needs the way round.
pub fn affected(ws: usize, version: i32) -> bool {
    ws == 1 && version < FIXED_IN
}

/// How many of `n` elements of `es` bytes the buggy kernel writes (the model of NCCL < 2.29.7).
#[cfg(test)]
pub fn covered(n: usize, es: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let bn = n.saturating_mul(es).div_ceil(BLOCK_BYTES).clamp(1, MAX_BLOCKS);
    let pack = (PACK_BYTES / es).max(1);
    (bn * (n / bn).div_ceil(pack) * pack).min(n)
}

/// `(offset, count)` launches that tile `n` elements of `es` bytes, each covered whole by the
/// kernel: the largest run of whole 512 KiB grids (32 blocks, each a whole number of packs),
/// then whole 16 KiB blocks (one block each), then the rest (under 16 KiB: one block).
pub fn segments(n: usize, es: usize) -> Vec<(usize, usize)> {
    let per_block = BLOCK_BYTES / es;
    let per_grid = per_block * MAX_BLOCKS;
    let mut v = Vec::new();
    let mut at = 0;
    for step in [per_grid, per_block] {
        let take = (n - at) / step * step;
        if take > 0 {
            v.push((at, take));
            at += take;
        }
    }
    if at < n {
        v.push((at, n - at));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wild case's lengths, and lengths around every block count, for every element size.
    fn lengths(es: usize) -> Vec<usize> {
        let mut v = vec![1, 2, 7, 8, 9, 15, 16, 17, 1023, 1025];
        for blocks in 1..=40 {
            let n = blocks * BLOCK_BYTES / es;
            v.extend([n - 1, n, n + 1, n + PACK_BYTES / es - 1]);
        }
        v.extend([64 << 20 >> es.trailing_zeros(), (64 << 20) / es + 3]);
        v
    }

    #[test]
    fn the_model_drops_the_tails_the_wild_case_found() {
        // f16 avg of 8,193 elements (16 KiB + 1): two blocks of 4,096, element 8,192 unwritten.
        assert_eq!(covered(8193, 2), 8192);
        // The largest grid's bytes plus a pack less one element.
        assert!(covered(32 * BLOCK_BYTES / 4 + 3, 4) < 32 * BLOCK_BYTES / 4 + 3);
        assert_eq!(covered(1000, 4), 1000);
    }

    #[test]
    fn segments_tile_the_range_and_each_is_covered_whole() {
        for es in [1, 2, 4, 8] {
            for n in lengths(es) {
                let s = segments(n, es);
                let mut at = 0;
                for &(off, cnt) in &s {
                    assert_eq!(off, at, "n={n} es={es}: {s:?}");
                    assert!(cnt > 0);
                    assert_eq!(covered(cnt, es), cnt, "n={n} es={es}: segment ({off}, {cnt}) is not covered whole");
                    at += cnt;
                }
                assert_eq!(at, n, "n={n} es={es}: {s:?}");
                assert!(s.len() <= 3);
            }
        }
    }

    #[test]
    fn only_one_rank_before_the_fix() {
        assert!(affected(1, 22803));
        assert!(affected(1, 22809));
        assert!(!affected(1, FIXED_IN));
        assert!(!affected(2, 22803));
    }
}
