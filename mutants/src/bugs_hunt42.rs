//! The forty-second hunt: bugs whose trigger is a conjunction of a size and a world size. Each
//! ports a bug that shipped in a collective library (MPICH, Open MPI), found in the project's
//! pull-request thread named on its type, whose faulty path a library takes only where a message
//! size and a rank count both cross its thresholds: MPICH's scatter + ring-allgather broadcast
//! (at least `MPIR_CVAR_BCAST_MIN_PROCS` ranks and a long message), Open MPI coll/spacc's
//! all_reduce fallback for vectors shorter than the communicator. Below either threshold the
//! library takes another path, which is right; the trigger is kept as far as a wrapper over shm
//! can reproduce it.

use crate::campaign::{spec, Spec};
use crate::{Buf, Bug, Shm};
use concord_core::{Backend, CollectiveError, ReduceOp, Result, Work};

// ---------------------------------------------------------------- pmodels/mpich PR #2696

/// MPICH's default `MPIR_CVAR_BCAST_MIN_PROCS`: below it every broadcast is a binomial tree.
const BCAST_MIN_PROCS: usize = 8;
/// MPICH's default `MPIR_CVAR_BCAST_SHORT_MSG_SIZE` (bytes): below it, a binomial tree.
const BCAST_SHORT_MSG_SIZE: usize = 12288;
/// MPICH's default `MPIR_CVAR_BCAST_LONG_MSG_SIZE` (bytes): from it, scatter + ring allgather.
const BCAST_LONG_MSG_SIZE: usize = 524288;

/// The Iscatter + Iallgather broadcast whose length check leaves out the block the scatter left
/// in place (pmodels/mpich PR #2696 "Fixed Ibcast result size checks": "After scatter phase each
/// rank has `curr_size->bytes` block, meanwhile `status->curr_bytes` is still remains equal to 0.
/// After that, during allgather phase, each scheduled Recv operation increases
/// `status->curr_bytes` by size of data received using `sched_add_length` callback. This way
/// final value of `status->curr_bytes` is `curr_size` less than real results (because of block
/// already in place wasn't take into account). This leads to failure in `sched_test_curr_length`
/// callback"; reproduced with `MPIR_CVAR_BCAST_MIN_PROCS=2 mpirun -np 3` and a 32,000-byte
/// message). MPICH's ibcast takes the scatter + ring-allgather schedule only where its CVARs send
/// it: at least `MPIR_CVAR_BCAST_MIN_PROCS` (8) ranks and a message of at least 12 KiB that is
/// long (512 KiB and more) or on a world size that is not a power of two; everywhere else it is
/// a binomial tree, which is right. Here a broadcast (both variants) on that path moves the data,
/// then its wait fails with the length check's error on every rank whose scatter block was not
/// empty (the scatter cuts `nbytes` in `ceil(nbytes / ws)`-byte blocks by relative rank).
#[derive(Default)]
pub struct IbcastScatterBlockUncounted;

impl IbcastScatterBlockUncounted {
    /// The bytes the allgather phase counts on this rank when the schedule is taken, with the
    /// message's size, or `None` when MPICH broadcasts by binomial tree or the rank's scatter
    /// block is empty (nothing left uncounted).
    fn short_count(s: &Shm, x: &Buf, src: usize) -> Option<(usize, usize)> {
        let (ws, me) = (s.ws(), s.rank());
        let nbytes = s.numel(x) * s.inner.buffer_dtype(x).size();
        let scatter_ring =
            ws >= BCAST_MIN_PROCS && nbytes >= BCAST_SHORT_MSG_SIZE && (nbytes >= BCAST_LONG_MSG_SIZE || !ws.is_power_of_two());
        if !scatter_ring || src >= ws {
            return None;
        }
        let scatter_size = nbytes.div_ceil(ws);
        let relative = (me + ws - src) % ws;
        let own = nbytes.saturating_sub(relative * scatter_size).min(scatter_size);
        (own > 0).then_some((nbytes - own, nbytes))
    }
    fn checked(s: &Shm, w: Work<Buf>, x: &Buf, src: usize) -> Work<Buf> {
        match Self::short_count(s, x, src) {
            None => w,
            Some((curr, n)) => s.then(w, move |_, _| {
                Err(CollectiveError::Backend(format!(
                    "MPII_sched_test_curr_length: Other MPI error, collective size mismatch: curr_bytes {curr} != n_bytes {n} \
                     (ibcast scatter + ring allgather)"
                )))
            }),
        }
    }
}

impl Bug for IbcastScatterBlockUncounted {
    fn broadcast(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.broadcast(x, src)?;
        Ok(Self::checked(s, w, x, src))
    }
    fn broadcast_(&self, s: &Shm, x: &Buf, src: usize) -> Result<Work<Buf>> {
        let w = s.inner.broadcast_(x, src)?;
        Ok(Self::checked(s, w, x, src))
    }
}

// ---------------------------------------------------------------- open-mpi/ompi PR #5984

/// coll/spacc's all_reduce falling back, for vectors shorter than the communicator, into a base
/// algorithm whose module was never prepared (open-mpi/ompi PR #5984 "coll/spacc: fix module
/// initialization in v3.1.x": "The call of coll/spacc/MPI_Allreduce with `count < comm_size` or
/// with non-commutative binary operation produces the segmentation fault (only in v3.1.x). The
/// problem is that spacc/MPI_Allreduce in this case switched to the
/// `ompi_coll_base_allreduce_intra_basic_linear`. But a lot of base collective operations
/// require prepared placeholder for the array of requests."). The basic linear all_reduce is a
/// linear reduce to rank 0, then a linear broadcast from it: rank 0, the broadcast's root, posts
/// one send per peer into the request array the module never allocated and dies. Here an
/// all_reduce (both variants) of 1 to `ws - 1` elements kills rank 0 (SIGABRT where Open MPI
/// took a SIGSEGV); its peers wait for a root that is gone. Every reduce op of the trait is
/// commutative, so only the count takes the fallback; from `ws` elements up spacc's own
/// Rabenseifner all_reduce runs, and it is right.
#[derive(Default)]
pub struct SpaccShortVectorFallbackCrash;

impl SpaccShortVectorFallbackCrash {
    fn crashes(s: &Shm, x: &Buf) -> bool {
        let n = s.numel(x);
        s.rank() == 0 && n > 0 && n < s.ws()
    }
    fn die(s: &Shm, x: &Buf) -> ! {
        eprintln!(
            "coll/spacc: MPI_Allreduce count {} < comm_size {}: ompi_coll_base_allreduce_intra_basic_linear on an \
             uninitialised module (no request array): segmentation fault",
            s.numel(x),
            s.ws()
        );
        std::process::abort();
    }
}

impl Bug for SpaccShortVectorFallbackCrash {
    fn all_reduce(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if Self::crashes(s, x) {
            Self::die(s, x);
        }
        s.inner.all_reduce(x, op)
    }
    fn all_reduce_(&self, s: &Shm, x: &Buf, op: ReduceOp) -> Result<Work<Buf>> {
        if Self::crashes(s, x) {
            Self::die(s, x);
        }
        s.inner.all_reduce_(x, op)
    }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec::<IbcastScatterBlockUncounted>(
            "wild_mpich_ibcast_scatter_block_uncounted",
            "values.sizes",
            "pmodels/mpich PR #2696: the scatter + ring-allgather ibcast (8+ ranks, 512 KiB+, or 12 KiB+ at a non-power-of-two size) counts only the bytes its allgather received, and its length check fails the broadcast",
            &["sizes::broadcast::inplace::f32::grid::ws8"],
        ),
        spec::<SpaccShortVectorFallbackCrash>(
            "wild_spacc_short_vector_fallback_crash",
            "values.reduce",
            "open-mpi/ompi PR #5984: coll/spacc's all_reduce of fewer elements than ranks falls back to the basic linear algorithm on an unprepared module: rank 0 dies",
            &["all_reduce::out::f32::sum::ws2"],
        ),
    ]
}
