//! Per-rank arenas: each rank owns one large sparse shared-memory segment that every peer maps
//! once at init. Buffers are blocks carved from the owner's arena, so a peer addresses any
//! buffer (or view) of rank `r` by `(r, byte offset)` with no per-buffer mapping.
//!
//! Freed blocks go back to a first-fit free list and are reused (pages stay resident, so a
//! buffer of the same size allocated again costs no page faults); memory returns to the system
//! when the world ends.
//!
//! **Quarantine** (issue 15 item 7): a block of an op that failed after it was posted, while a
//! peer may still touch it (see `ctl`'s claims), is marked [`Block::quarantine`]: when its last
//! handle goes, its bytes are *not* returned to the free list (never handed out again) until the
//! world — the arena — is torn down.
//!
//! **Canary** (option `shm_canary=1`, for the fault campaign): every freed block is filled with
//! [`CANARY`], every block handed out again from the free list is checked to still hold it, and
//! so is every free block when the world is torn down. A byte that changed is a write into
//! memory after its owner let it go: the process prints `shm canary violation` and exits with
//! [`CANARY_EXIT_CODE`].

use crate::sys::{Mapping, Region};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

/// The byte freed blocks hold in canary mode.
pub const CANARY: u8 = 0xA5;
/// Exit status of a process that found a canary violation.
pub const CANARY_EXIT_CODE: i32 = 87;

/// The process-side view of one world: its own arena (allocator) and every rank's arena mapping.
pub struct World {
    pub world_id: String,
    pub global_rank: usize,
    /// Every rank's arena, indexed by global rank (own included).
    pub arenas: Vec<Mapping>,
    alloc: Mutex<FreeList>,
    /// Canary mode (option `shm_canary=1`).
    canary: bool,
    /// Bytes quarantined so far (never reused).
    pub quarantined: AtomicUsize,
    /// Per arena: bytes `[0, mapped[r])` are mapped into this process (page tables filled).
    mapped: Mutex<Vec<usize>>,
}

struct FreeList {
    /// Free blocks below `top`: offset -> length.
    free: BTreeMap<usize, usize>,
    /// Everything at and above `top` has never been handed out.
    top: usize,
    /// Bytes `[0, reserved)` are backed (`top` drops when the last block is freed; growing it
    /// again must not `fallocate` again: 3.5 ms per 64 MiB even when the pages are there).
    reserved: usize,
    cap: usize,
}

/// A block of the own arena; freed when the last handle is dropped.
pub struct Block {
    pub world: Arc<World>,
    pub off: usize,
    pub len: usize,
    quarantined: AtomicBool,
}

impl Block {
    /// A block over the same bytes that never returns them to the free list (the campaign's
    /// non-owning handle, [`crate::ShmBuffer::unowned`]).
    #[cfg(feature = "campaign")]
    pub fn unowned(&self) -> Block {
        Block { world: self.world.clone(), off: self.off, len: self.len, quarantined: AtomicBool::new(true) }
    }
    /// Never return this block's bytes to the free list (see the module docs).
    pub fn quarantine(&self) {
        if !self.quarantined.swap(true, SeqCst) {
            self.world.quarantined.fetch_add(self.len, SeqCst);
        }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if !self.quarantined.load(SeqCst) {
            self.world.free(self.off, self.len);
        }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if self.canary {
            let fl = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
            for (&off, &len) in fl.free.iter() {
                self.check_canary(off, len, "at teardown");
            }
        }
    }
}

impl World {
    pub fn new(world_id: String, global_rank: usize, arenas: Vec<Mapping>, canary: bool) -> World {
        let cap = arenas[global_rank].len();
        let mapped = Mutex::new(vec![0; arenas.len()]);
        World {
            world_id,
            global_rank,
            arenas,
            alloc: Mutex::new(FreeList { free: BTreeMap::new(), top: 0, reserved: 0, cap }),
            canary,
            quarantined: AtomicUsize::new(0),
            mapped,
        }
    }

    /// Canary mode: `[off, off + len)` of the own arena must still hold [`CANARY`].
    fn check_canary(&self, off: usize, len: usize, when: &str) {
        if let Some(i) = self.region(self.global_rank, off, len).find_not(CANARY) {
            eprintln!(
                "shm canary violation: rank {} (world {}): byte {} of the free block [{off:#x}, +{len}) was written after the block was freed ({when})",
                self.global_rank,
                self.world_id,
                off + i
            );
            crate::sys::die_now(CANARY_EXIT_CODE);
        }
    }

    /// A block of at least `bytes` bytes (at least 64, so every buffer has its own address),
    /// 64-byte aligned (4096 from 64 KiB on).
    pub fn alloc(self: &Arc<World>, bytes: usize) -> Result<Block, String> {
        self.alloc_in(bytes, false)
    }

    /// [`World::alloc`]; `full`: this one allocation finds the arena full (the fault
    /// `alloc_output:fail`, `concord_core::fault::point::ALLOC_OUTPUT`): no free block fits and
    /// nothing is left above the blocks handed out, so the allocator refuses it on its own path,
    /// with its own error, as it does when the arena really is full.
    pub fn alloc_in(self: &Arc<World>, bytes: usize, full: bool) -> Result<Block, String> {
        let mut fl = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        let cap = if full { fl.top } else { fl.cap };
        if bytes > cap {
            return Err(self.full(fl.cap, bytes));
        }
        let len = bytes.max(64).next_multiple_of(64);
        let align = if len >= 65536 { 4096 } else { 64 };
        let mut hit = None;
        for (&off, &flen) in fl.free.iter().filter(|_| !full) {
            let start = off.next_multiple_of(align);
            if start + len <= off + flen {
                hit = Some((off, flen, start));
                break;
            }
        }
        let off = if let Some((off, flen, start)) = hit {
            if self.canary {
                self.check_canary(start, len, "when handed out again");
            }
            fl.free.remove(&off);
            if start > off {
                fl.free.insert(off, start - off);
            }
            if start + len < off + flen {
                fl.free.insert(start + len, off + flen - start - len);
            }
            start
        } else {
            let start = fl.top.next_multiple_of(align);
            if start + len > cap {
                return Err(self.full(fl.cap, bytes));
            }
            if start + len > fl.reserved {
                self.arenas[self.global_rank]
                    .reserve(fl.reserved, start + len - fl.reserved)
                    .map_err(|e| format!("cannot back {bytes} bytes of shared memory in /dev/shm: {e}"))?;
                fl.reserved = start + len;
            }
            if start > fl.top {
                let t = fl.top;
                if self.canary {
                    self.region(self.global_rank, t, start - t).fill(CANARY);
                }
                fl.free.insert(t, start - t);
            }
            fl.top = start + len;
            drop(fl);
            self.map_in(self.global_rank, start, len);
            start
        };
        Ok(Block { world: self.clone(), off, len, quarantined: AtomicBool::new(false) })
    }

    fn full(&self, cap: usize, bytes: usize) -> String {
        format!(
            "shared-memory arena of rank {} is full ({} MiB): cannot allocate {bytes} bytes (raise the `shm_arena_gib` option)",
            self.global_rank,
            cap >> 20
        )
    }

    fn free(&self, off: usize, len: usize) {
        if self.canary {
            self.region(self.global_rank, off, len).fill(CANARY);
        }
        let mut fl = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        let (mut off, mut len) = (off, len);
        if let Some((&poff, &plen)) = fl.free.range(..off).next_back() {
            if poff + plen == off {
                fl.free.remove(&poff);
                off = poff;
                len += plen;
            }
        }
        if let Some(&nlen) = fl.free.get(&(off + len)) {
            fl.free.remove(&(off + len));
            len += nlen;
        }
        // (In canary mode the top never comes down: reused bytes always come from the free list,
        // where they are checked.)
        if off + len == fl.top && !self.canary {
            fl.top = off;
        } else {
            fl.free.insert(off, len);
        }
    }

    /// Bytes `[off, off + len)` of rank `global`'s arena.
    pub fn region(&self, global: usize, off: usize, len: usize) -> Region {
        self.arenas[global].region(off, len)
    }

    /// Like [`World::region`], for bytes the owner has allocated (a posted buffer), first
    /// mapping them into this process in one call if they are new to it: a fresh 64 MiB block
    /// costs 16384 page faults (about 50 ms on the loaded 2-core VM) when its pages are first
    /// touched one by one, and a third of that mapped at once. Blocks are only ever handed out
    /// below the owner's top, which is backed, and stay mapped until the world ends, so one
    /// high-water mark per arena says what is mapped.
    pub fn mapped_region(&self, global: usize, off: usize, len: usize) -> Region {
        let r = self.region(global, off, len);
        self.map_in(global, off, len);
        r
    }

    fn map_in(&self, global: usize, off: usize, len: usize) {
        let mut m = self.mapped.lock().unwrap_or_else(|e| e.into_inner());
        let end = off + len;
        if len > 0 && end > m[global] {
            self.arenas[global].populate(m[global], end - m[global]);
            m[global] = end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_reused_and_coalesced() {
        let name = format!("concord-unit-arena-{}", std::process::id());
        let m = Mapping::create(&name, 1 << 20, true).unwrap();
        crate::sys::unlink(&name).unwrap();
        let w = Arc::new(World::new("unit".into(), 0, vec![m], false));
        let a = w.alloc(100).unwrap();
        let b = w.alloc(100).unwrap();
        assert_eq!((a.off, a.len, b.off), (0, 128, 128));
        let a_off = a.off;
        drop(a);
        let c = w.alloc(64).unwrap();
        assert_eq!(c.off, a_off, "freed block reused");
        drop(c);
        drop(b);
        let big = w.alloc(70000).unwrap();
        assert_eq!(big.off, 0, "everything coalesced back to the start");
        drop(big);
        let fl = w.alloc.lock().unwrap();
        assert_eq!((fl.top, fl.reserved), (0, 70016), "the top drops, what is backed stays backed");
        drop(fl);
        assert!(w.alloc(2 << 20).err().unwrap().contains("arena of rank 0 is full"));
        // The fault `alloc_output:fail`: the allocator's own refusal, even with a free block
        // that fits and room above the top; the next allocation is served as before.
        let keep = w.alloc(64).unwrap();
        let freed = w.alloc(256).unwrap();
        let freed_off = freed.off;
        drop(freed);
        assert!(w.alloc_in(64, true).err().unwrap().contains("arena of rank 0 is full"));
        assert!(w.alloc_in(0, true).is_err());
        assert_eq!(w.alloc(64).unwrap().off, freed_off, "the free block is still there");
        drop(keep);
    }

    #[test]
    fn quarantined_blocks_are_never_handed_out_again() {
        let name = format!("concord-unit-arena-q-{}", std::process::id());
        let m = Mapping::create(&name, 1 << 20, true).unwrap();
        crate::sys::unlink(&name).unwrap();
        let w = Arc::new(World::new("unit".into(), 0, vec![m], true));
        let a = w.alloc(4096).unwrap();
        let _b = w.alloc(64).unwrap();
        let a_off = a.off;
        a.quarantine();
        drop(a);
        let c = w.alloc(4096).unwrap();
        assert_ne!(c.off, a_off, "a quarantined block was reused");
        assert_eq!(w.quarantined.load(SeqCst), 4096);
        drop(c);
        let d = w.alloc(4096).unwrap(); // from the free list: canary checked (intact)
        drop(d);
    }
}
