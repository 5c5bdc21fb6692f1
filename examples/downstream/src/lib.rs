//! # concord-example-downstream
//!
//! **One job:** show a backend crate that is not part of Concord running the Concord suites through
//! one `harness!` line. `MyBackend` is a thin newtype over the CPU backend (a real crate would talk
//! to its own transport here); `tests/conformance.rs` is that line, with a slice of the catalogue
//! (`catalogue = slice`: the built-in binary already runs the whole of it on shm) and a backend
//! option (`options = [...]`). A crate of its own would write
//! `concord_suites::harness!(MyBackend, name = "mine");` for every case.
#![forbid(unsafe_code)]

use concord_core::{Backend, Result, WorldInfo};
use concord_shm::ShmBackend;

/// A downstream backend. Every method forwards to the CPU backend.
pub struct MyBackend(ShmBackend);

type Buf = <ShmBackend as Backend>::Buffer;

impl Backend for MyBackend {
    type Buffer = Buf;
    fn init(world: &WorldInfo) -> Result<Self> {
        // An option of this backend's own, set through `harness!(…, options = [...])`: its
        // absence means the options did not reach the ranks.
        if world.option("example_greeting") != Some("hello") {
            return Err(concord_core::CollectiveError::Unsupported(
                "MyBackend needs the option example_greeting=hello (tests/conformance.rs sets it)".into(),
            ));
        }
        ShmBackend::init(world).map(MyBackend)
    }
    fn name(&self) -> &str {
        "mine"
    }
    // Everything else goes to the CPU backend unchanged (the fused ops keep the trait's
    // unfused defaults, run over these collectives).
    concord_core::forward!(0 => rank, world_size, capabilities, outstanding, buffers, collectives, p2p);
    fn new_group(&self, ranks: &[usize]) -> Result<Option<Self>> {
        Ok(self.0.new_group(ranks)?.map(MyBackend))
    }
}
