//! Optional capabilities a backend's [`crate::Hooks`] may add to the generic benchmark; CPU
//! backends have neither and keep wall-clock timing.
//!
//! * [`Clock`]: a device-side clock (CUDA events on the backend's stream for NCCL). With one,
//!   a timed window's time is the device time between a mark recorded before the window's
//!   first issue and one recorded after its last issue (nccl-tests' method: back-to-back
//!   launches, no per-op host synchronisation); the waits and the checks come after the end
//!   mark, outside the timed region. The host wall-clock of the same windows is still recorded
//!   (`wall_time_us` in the JSON lines).
//! * [`Reference`]: a yardstick timed in the same rank processes right after each step of the
//!   backend, with the same iterations and window (for NCCL: the collective called directly
//!   through NCCL in a tight loop on preallocated buffers). It is printed next to the backend's
//!   row, written as its own series in the JSON lines and the plot, and summarised against the
//!   goals at the end of the run.
//! * [`DeviceData`]: per-iteration inputs made on the device from a base input uploaded once
//!   (rotated copies) and outputs read through the backend's own staging, so that checking every
//!   timed iteration stays cheap at 1 GiB (NCCL: device-to-device copies, pinned host memory).
//!   The inputs and the comparison are the same as without it.

use crate::spec::{BenchOp, Placement};
use concord_core::{Backend, DType, ReduceOp};
use std::any::Any;
use std::time::Duration;

/// An opaque clock mark (the backend's own type, boxed).
pub type Mark = Box<dyn Any>;

/// Turns a backend's per-op profile on or off and returns its sections since the last call
/// (name, mean per op): see [`Clock::profile`].
pub type ProfileFn<B> = fn(&B, bool) -> Vec<(&'static str, f64)>;

/// A backend's device-side clock (see the module docs).
pub struct Clock<B> {
    /// Records a mark ordered after every op issued before the call and before every op
    /// issued after it returns.
    pub mark: fn(&B) -> concord_core::Result<Mark>,
    /// The device time from the first mark to the second, waiting at most the given time.
    pub elapsed: fn(&B, &Mark, &Mark, Duration) -> concord_core::Result<Duration>,
    /// How the time is taken, for the table's header and the JSON lines.
    pub describe: &'static str,
    /// Whether marks also order the backend's send / recv. `false` (e.g. NCCL, whose send /
    /// recv run on per-direction streams the marks are not recorded on): `sendrecv` is timed by
    /// the host clock around the window's issues and waits instead, never by marks that would
    /// not cover it.
    pub covers_p2p: bool,
    /// Optional: turns the backend's own per-op profile on (`true`) or off and returns what it
    /// measured since the last call (name, mean per op; NCCL: the progress thread's sections,
    /// `NcclBackend::profile_progress`). Used only when `CONCORD_BENCH_PROBE=1`: each timed
    /// window is then profiled and one `# probe` line per step and rank goes to stderr.
    pub profile: Option<ProfileFn<B>>,
}

/// One step as a reference times it: the backend's step, placement, iterations and window.
#[derive(Clone, Debug)]
pub struct RefStep {
    pub op: BenchOp,
    /// Elements per rank chunk (the table's `count` column).
    pub count: usize,
    pub dtype: DType,
    pub redop: ReduceOp,
    pub root: usize,
    pub placement: Placement,
    pub warmup: usize,
    pub iters: usize,
    pub window: usize,
}

/// A reference timed next to the backend (see the module docs). Every rank makes the same
/// calls in the same order.
pub trait Reference {
    /// Its series name in the table, JSON lines and plot (e.g. `nccl-raw`).
    fn label(&self) -> String;
    /// One line for the table's header: what it runs and how it is timed.
    fn describe(&self) -> String;
    /// Time per op in microseconds (the median over its windows of each window's mean, as the
    /// backend's side), `Ok(None)` when it has no such op (or dtype, reduce
    /// op, placement), `Err` when it failed (the rank then stops using it).
    fn time_us(&mut self, step: &RefStep) -> Result<Option<f64>, String>;
    /// The fastest and slowest window's time per op (µs) of the last [`Reference::time_us`]
    /// that returned a time, when it timed several windows and keeps them (default: none).
    fn last_spread_us(&self) -> Option<(f64, f64)> {
        None
    }
}

/// Builds a rank's reference after the backend's init (collective: every rank calls it).
pub type MakeReference<B> = fn(&B, &concord_core::WorldInfo) -> Result<Box<dyn Reference>, String>;

/// `dst` = `src` with every chunk of `l` elements rotated right by `s` elements.
pub type CopyRotated<B> = fn(&B, &<B as Backend>::Buffer, &<B as Backend>::Buffer, usize, usize) -> concord_core::Result<()>;
/// Calls the closure with a buffer's bytes.
pub type ReadWith<B> = fn(&B, &<B as Backend>::Buffer, &mut dyn FnMut(&[u8])) -> concord_core::Result<()>;

/// A backend's device-side data movement for the bench (see the module docs).
pub struct DeviceData<B: Backend> {
    /// `(b, dst, src, l, s)`: `dst` = `src` with every chunk of `l` elements rotated right by `s`
    /// elements, ordered after every op issued before the call and finished before it returns
    /// (as `write`).
    pub copy_rotated: CopyRotated<B>,
    /// Calls the closure with the buffer's bytes, read after every op issued before the call.
    pub read: ReadWith<B>,
}
