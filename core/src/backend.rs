//! The [`Backend`] trait: PyTorch's functional collectives, plus reduce / gather / scatter /
//! send / recv / barrier, over a backend-owned buffer type.
//!
//! # Contract (every backend MUST)
//! Each clause carries its id in the contract map (a `clause:` tag, `concord_suites::contract`),
//! which lists the cases that check it; a clause without a case fails the self-test.
//!
//! * Return from every collective at once with a [`Work`]; the result is final after `wait`.
//!   [clause: async.issue_returns] [clause: async.result_final_after_wait]
//! * Once `is_completed()` returns true the result is final too, exactly as after `wait`: a
//!   caller that polls `is_completed()` (PyTorch's `while not work.is_completed()`) may read the
//!   result without waiting; a completion flag MUST NOT be set before the result is in the
//!   buffer(s) the op returned (a copy out of a staging buffer done inside `wait` is too late).
//!   [clause: async.completed_means_final]
//! * Out-of-place ops (`all_reduce`, `all_gather_into_tensor`, ...) return a *new* buffer that
//!   never aliases the input, and leave the input unchanged. [clause: placement.out_of_place]
//! * In-place ops (`all_reduce_`, `broadcast_`, `*_coalesced_`) return the very buffer(s) given
//!   (same [`Backend::buffer_addr`]). [clause: placement.in_place]
//! * `_out` ops write only the caller's output buffer, never a byte outside it.
//!   [clause: placement.out_buffer]
//! * Catch bad input with a named [`crate::CollectiveError::BadInput`]: locally at issue time where the
//!   rank alone can tell, and across ranks (at issue or at wait) where only peers can tell, on
//!   *every* rank, never by hanging and never by silent truncation. A refusal names the refused
//!   call only: works issued before it and not yet waited MUST complete with their own results
//!   (one error flag per communicator that fails every pending work with it is a bug).
//!   [clause: bad_input.named_everywhere]
//!   A call refused with a bad-input error MUST leave its outputs (an `_out` buffer) and an
//!   in-place buffer untouched: validate (the cross-rank header exchange included) before moving
//!   data, as PyTorch's c10d checks and NCCL's header exchange do. [clause: bad_input.refused_untouched]
//! * Honour deadlines: no wait blocks longer than asked, and none gives up sooner: a `wait(t)`
//!   MUST return once the op completes or `t` has passed, never a timeout before `t` (a port that
//!   counts deadlines in whole seconds times a sub-second wait out at once); a dead peer is
//!   reported as such. An op deadline bounds the peers' *arrival*: an op that every rank entered
//!   within it MUST NOT fail for lateness (a rank timing out in the op's later steps after its
//!   peer arrived in time, while that peer returns `Ok` or is poisoned by it, is a bug). Once
//!   every rank has arrived, the op's remaining steps (a receiver's copy included) get a deadline
//!   of their own: for a collective, one op deadline counted from the last arrival (never ending
//!   before the op deadline); for a point-to-point op, its op deadline, counted from its post (a
//!   receiver's copy under way then is covered only as long as the sender's wait lasts). A
//!   timeout a wait returns past that deadline (or past the op deadline, for a peer that never
//!   arrived) is the op's failure: final on every rank, its buffers the caller's again (a send
//!   whose receiver is still copying when the sender's wait ends past it fails, and the receive
//!   never returns `Ok` with bytes read from the send buffer after that; the one exception is a
//!   transfer that had copied the whole message out of the send buffer before the sender's wait
//!   ended, as an MPI's matched transfer has, which no library can withdraw: its receive may
//!   still return `Ok`, with exactly the message); a wait that ends before it returns a timeout
//!   that leaves the op in flight (the same work then completes). [clause: async.deadline]
//! * Fail cleanly: once a wait returned an op's final failure (a timeout past the op's deadline
//!   above, a dead peer, an abort, a local error), the op's buffers are the caller's again — no
//!   peer reads or writes them any more, and memory the backend freed is not written either;
//!   every rank of the op ends in a named error, never `Ok` (but the receive of a message copied
//!   out whole before its send's wait ended: `async.deadline`); a panic inside the backend is a
//!   named error, not a wait that times out. [clause: failure.no_touch_after_failed_wait]
//! * After bad input every rank gets the same named error and the communicator MUST stay usable
//!   (a mismatched `new_group` included); a failed `new_group` leaves no file behind, and so
//!   does a group every rank made and dropped: no file in `/dev/shm`, and no descriptor a
//!   process keeps per group (making and dropping groups does not grow what a process holds;
//!   a socket or segment kept per group runs a long job out of descriptors or `/dev/shm`).
//!   What a process keeps once its groups are dropped MAY be keyed by peer (a connection per
//!   peer) or sized by the groups alive at once (a pool), and MUST NOT be filled per group made
//!   (a cache of dropped groups' resources, bounded or not, is kept per group); it MAY be
//!   released after the drop returns, on a thread of the backend's own, as long as the release
//!   keeps going. So MAY a communicator's files: a communicator every rank dropped (after a
//!   failed op or not) leaves no file named after its world once its release, which MAY run
//!   after the drop returns on a thread of the backend's own, has ended (a check reads
//!   `/dev/shm` again while the list keeps shrinking). [clause: failure.usable_after]
//! * Record every collective in [`crate::progress`] while it is in flight (a timeout names the
//!   collective and its sequence number). A collective the backend builds from another (a
//!   barrier run as a one-element all_reduce, a broadcast as an all_gather) MUST be recorded
//!   under the op the caller called (beside the op it runs, if it records that too): a rank
//!   hung in a barrier reports a barrier, one blocked in a fused op (an all_gather and matmuls)
//!   reports the fused op. [clause: progress.recorded]
//! * Be asynchronous on *every* op and *every* rank: issuing returns at once even when the peers
//!   have not issued yet; `is_completed()` is false and `wait` returns a named timeout (never
//!   `Ok`, never later than its deadline) for as long as any peer the op needs has not issued
//!   its side, also once an op issued after it has completed (a work's completion is its own
//!   op's: a check that reads the last posted request, or a wait that retires its neighbour in
//!   a request list, is a bug); the same work then completes once the peers arrive, whatever the
//!   caller issued after it: an op never waits for a later op (which a peer may issue only once
//!   it has seen the earlier one complete). [clause: async.every_op_every_rank]
//! * Communicators progress independently on the host: an op on one communicator (the world, a
//!   group) MUST NOT wait for an op of another in anything the backend adds, whatever order each
//!   rank issued them in (one serial engine, queue, lock or stream for every communicator of the
//!   process deadlocks a legal program whose ranks meet on two communicators in different
//!   orders), unless the backend declares `concurrent_communicators = false`
//!   ([`crate::Capabilities`]): then programs MUST issue the ops of different communicators in
//!   the same order on every rank (NCCL's own rule: "applications should ensure operations are
//!   submitted in the same order across ranks"), the backend may order the COLLECTIVES of
//!   different communicators (the Concord NCCL backend runs every collective communicator of a
//!   device on one stream: on 3 GPUs the two crossing cases deadlock there, docs/RESULTS.md),
//!   and the cases that cross two communicators' orders are UNSUPPORTED. A send / recv is never
//!   held back by another communicator's op, even then (a send completes only once its receiver
//!   has the message, so ordering point-to-point ops across communicators deadlocks programs
//!   issued in the same order on every rank: clause `p2p.no_deadlock`).
//!   [clause: async.communicators_independent]
//! * Quiescence: every [`Work`] counts in [`Backend::outstanding`] from issue until it is waited
//!   (successfully or with its failure) or dropped; once all are, `outstanding()` is 0 (the
//!   suites check it after every case, on the world and on every subgroup). [clause: quiescence]
//!
//! * A process that drops an un-waited collective or send still exits promptly (no hang in
//!   teardown, also while the send's receiver never posts its receive), and dropping a [`crate::Work`]
//!   never withdraws its op: a send whose work was dropped un-waited still reaches a receiver
//!   that posts its receive. [clause: async.unwaited_exit]
//! * The caller's threads: a backend is `Send + Sync`, and the caller MAY use it from any thread
//!   (a framework's autograd, pipeline or watchdog thread): use a communicator made on another
//!   thread, issue on one thread and wait, poll or drop the work on another, and wait or poll
//!   one work from several threads at once. A wait on any thread waits as one on the issuing
//!   thread does (a registry of works per thread, which finds nothing on another thread and
//!   returns at once, is a bug: pytorch/pytorch PR #171614); every waiter of one work gets its
//!   outcome (the same buffer) once the op completes, each within its own deadline (a wait that
//!   fails because another thread waits, or a wake-up that reaches one waiter only, is a bug);
//!   and a work is finalised once however many threads saw it complete (a request freed by each
//!   waiter is shared by two later ops). Ops of ONE communicator MUST NOT be issued from two
//!   threads at once (NCCL: "it is not allowed to issue NCCL operations to a single
//!   communicator in parallel with multiple threads"; MPI: one communicator is not used by two
//!   concurrent collective calls): the caller orders its issues, and the backend takes them in
//!   that order. [clause: async.caller_threads]
//!
//! # Init and declarations
//! * `init(world)` MUST return a communicator whose `rank()` and `world_size()` are the
//!   launcher's (`world.rank`, `world.world_size`), never ranks numbered by arrival order or any
//!   order of the backend's own; the harness fails the rank's setup otherwise.
//!   [clause: init.rank_is_the_launchers]
//! * Every rank of a world MUST declare the same [`Capabilities`]: the suites gate and check each
//!   rank by its own declaration, so a declaration read from the local device (a NaN rule, half
//!   types, a library version) that differs between ranks gives the ranks different gates or
//!   different results for one call. The harness compares each rank's declaration with rank 0's
//!   at every world's setup (`max_world_size` up to the world's size, the dtypes and the gaps as
//!   sets, a gap's reason not compared) and fails the setup of a rank that differs, naming the
//!   field and both values. [clause: init.same_capabilities]
//! * `init` MUST NOT refuse (`Unsupported`) a world whose size is within the declared
//!   [`Capabilities::max_world_size`], one rank included (there is no declared minimum): a
//!   refused world within it FAILS, naming the declaration. [clause: init.declared_world_sizes]
//! * A backend whose collectives move real values MUST declare [`Capabilities::moves_data`]
//!   `= true`. `false` (the fake's local stand-ins) skips every value, untouched-input and guard
//!   check, so a case that skipped one is UNSUPPORTED, never PASSED; the `caps::moves_data`
//!   probe fails a backend whose declaration its all_gather contradicts.
//!   [clause: caps.moves_data_declared]
//!
//! # Failure paths (checked under injected faults, [`crate::fault`], on backends declaring the hooks)
//! * An op whose communicator is aborted before its completion was observed fails with the
//!   abort, never `Ok` with what the aborted op left; a wait ends at its own deadline even while
//!   a later op is stuck being handed to the library. [clause: faults.aborted_ops_fail]
//! * An op whose peer never does its part (stalls before or after its header, never launches,
//!   or is absent at the communicator's very first op, where a lazily connecting library waits
//!   inside the launch) MUST end in a named error within its deadline plus the abort's bound,
//!   never `Ok`. This holds on a subgroup too, by the group's own deadline, whatever its parent
//!   did meanwhile: a group op in flight when an op of the world failed at its deadline neither
//!   completes `Ok` (a watchdog finishing the family's works) nor waits for an abort of the
//!   world to reach it. [clause: faults.absent_peer_bounded]
//! * `upload` / `download` synchronise with the device, not with queued collectives: with a
//!   collective stuck, they return at once and leave the communicator usable.
//!   [clause: faults.copies_not_behind_collectives]
//! * A local failure after an op was issued (an out-of-memory, a refused call) reaches every rank
//!   as one named error (never a timeout, and never a bad-input kind: every rank's call was
//!   right), and the world MUST stay usable: the next ops on the same communicator run and
//!   give their values (an abort of the communicator on a local failure, NCCL's own rule after
//!   an error, is a bug here; a backend that cannot keep this leaves the failure's `fail` hook
//!   undeclared: [`crate::fault`]). It names the failing op only: works issued before it
//!   and not yet waited MUST complete with their own results (one error flag per communicator
//!   that fails every pending work with it is a bug). Every rank of the op gets that error, not
//!   only the failing rank's peers in the algorithm (a ring neighbour), at any world size. A
//!   local failure on a subgroup leaves the subgroup, the communicator it was split from and its
//!   sibling groups usable (an abort flag a parent shares with its children, set by a child's
//!   failure, is a bug). An out-of-place op whose output cannot be allocated at issue on one rank
//!   (a full arena or `/dev/shm`, a device out of memory: the fault hook
//!   [`crate::fault::point::ALLOC_OUTPUT`]) is such a local failure: that rank's issue or wait
//!   returns a named error naming the allocation (its own `backend` error, or the op's error its
//!   peers get: the kind is the backend's), and the op still reaches its peers
//!   (numbered, marked failed), whose waits end in a named error within their deadline — a rank
//!   that returns before its op is numbered leaves its peers waiting to their deadline and pairs
//!   its next op with theirs. [clause: faults.local_failure_named_everywhere]
//!
//! # Fused communication + compute (module [`crate::fused`], seed 004)
//! * `fused_all_gather_matmul`, `fused_matmul_reduce_scatter`, their scaled variants and the
//!   low-contention all-gather / reduce-scatter return exactly what their unfused decomposition
//!   returns (the seed's fallbacks: [`crate::fused`] states it), on every rank, for every gather /
//!   scatter dim of `a`, every number of `b`s and f32 / bf16 / f16 / f64: each product block
//!   accumulated and rounded once to the output dtype, a reduce-scatter's sum rounded once; the
//!   all-gathered `a` bit for bit. [clause: fused.values]
//! * A native implementation gives the same values whatever the order in which peers' shards
//!   arrive (it consumes a shard only once it has landed, and puts it at its rank's place).
//!   [clause: fused.pipelined_order]
//! * Bad input to a fused op is one named error on every rank, with the seed's wording ("A_shard
//!   must be a matrix", "B must be a matrix", "Invalid gather_dim", "reduce_op must be sum or
//!   avg", an indivisible scattered dim): rules F1–F9 of [`crate::call`]. [clause: fused.bad_input]
//! * The fused ops leave their inputs unchanged and write only the buffers they return (new
//!   buffers: a later call never writes the buffers an earlier one returned); they may
//!   complete before returning (the seed's ops are stream-ordered, not pending works), and their
//!   [`Work`] counts in `outstanding()` until waited like any other. [clause: fused.buffers]
//!
//! # Values
//! * Reductions return what the oracle (`concord-oracle`) computes from every rank's input, for
//!   every dtype and every reduce op defined for it: bit-exact on exact-by-construction inputs,
//!   within the dtype's bound on random ones, NaN / ±inf / ±0 as declared. A float `sum`,
//!   `avg` or `premul_sum` result that IEEE 754 gives as `-0` (a sum of `-0` terms, folding
//!   from the first term) MAY be `+0` instead (a fold from a `+0` identity, as a BLAS dot or
//!   PyTorch's `sum`); where IEEE 754 gives `+0` (`x + -x`) it MUST be `+0`.
//!   [clause: values.reduce]
//! * An all_reduce leaves identical copies of one result on every rank, bit for bit, also on
//!   random inputs where the oracle allows a rounding bound: whatever order a backend reduces
//!   in, it is one order for all ranks (a data-parallel job's replicas must stay identical).
//!   Shipped both ways: each rank adding its peers round-robin from itself
//!   (pytorch/pytorch PR #129501), each rank adding its own input first in an
//!   allgather-then-reduce (open-mpi/ompi#12258). This holds on every communicator: a subgroup's
//!   members MUST hold identical copies too. [clause: values.identical_on_every_rank]
//! * Ops that move data (all_gather, all_to_all, broadcast, gather, scatter, permute, send/recv)
//!   deliver exactly the oracle's bytes, in rank order. [clause: values.move]
//! * Coalesced ops return one result per input, each as the single op would.
//!   [clause: values.coalesced]
//! * Values are right at every size (across any chunking or protocol switch, up to at least
//!   64 MiB) and at every world size up to the declared maximum, powers of two or not.
//!   [clause: values.sizes] [clause: values.world_sizes]
//! * One buffer reused by many collectives, and buffers freed and re-allocated between
//!   collectives (the same address with another size, shape or dtype), give the right result:
//!   nothing may be cached by address. After a successful wait on a rank, that rank's inputs
//!   and its result are the caller's again: no peer reads them any more (a rank's op does not
//!   complete before its peers are done reading its input, nor before a relay's forwarding from
//!   its result is done: a tree's inner node, a ring's next hop). An op keeps every buffer it was given until it
//!   completes: the caller may drop its handles right after issue (a call on a temporary).
//!   [clause: placement.reuse] [clause: placement.realloc]
//! * PyTorch's functional-collective semantics (`test_c10d_functional_native.py`, eager
//!   inductor collectives) hold. [clause: seeds.pytorch]
//!
//! # Subgroups
//! * `new_group(ranks)` gives each member a communicator whose rank is its position in `ranks`
//!   and non-members `None`; collectives on it involve its members only, and every reduce op
//!   works there (`avg` divides by the group's size). Called on a subgroup, `ranks` are that
//!   subgroup's ranks, not the world's. Every call makes a communicator of its own: two groups
//!   over the same list, both alive, are independent, and dropping one leaves the other working
//!   (equal member lists folded into one process set that any handle's drop removes is a bug:
//!   horovod/horovod PR #2839), and a group of every rank in world order is not the parent
//!   itself: dropping it leaves the parent working (mindspore-ai/hyper-parallel #516).
//!   [clause: subgroups]
//!   [clause: subgroups.reduce_ops]
//! * A backend that declares [`Capabilities::subgroups`] `= false` MUST refuse every
//!   `new_group` by name — `Unsupported`, or `BadInput` of kind `unsupported_op` — on every rank,
//!   and stay usable; it MUST NOT return a communicator (nor `Ok(None)`), since the suites,
//!   trusting the declaration, never run a collective on one (the `caps::subgroups` probe calls
//!   `new_group` itself). [clause: caps.subgroups_declared]
//!
//! # Roots
//! * `broadcast` `src` and the `root` of `reduce`, `gather` and `scatter` MUST be the same on
//!   every rank and `< world_size` — the communicator's size: on a subgroup, a group rank below
//!   the group's size, never checked against the world's; otherwise every rank gets `BadInput` of kind `bad_root`
//!   (the rule table in [`crate::call`]), never a hang and never a result from another root.
//!   [clause: bad_input.root_agreement]
//!
//! # Point to point
//! * `send(x, dst)` completes once `dst` has received the message (or failed); `x` is read, never
//!   written, and may be reused after the send's `wait`. `recv(out, src)` writes the message into
//!   `out` (exactly there, as for views below) and returns `out` itself.
//! * Matching: the `k`-th `send` from `a` to `b` is received by the `k`-th `recv` on `b` from
//!   `a`. A pair whose dtypes or element counts differ is `BadInput` on *both* ranks (the
//!   receiver's `recv` and the sender's `send`), never a truncated or padded copy. Matching is
//!   per communicator: a message is received only on the communicator it was sent on; one still
//!   unreceived when its communicator was dropped is gone, never the first message of a later
//!   communicator (a group made again over the same members included).
//!   [clause: p2p.matching]
//! * Per-pair order: two messages in flight from `a` to `b` are received in issue order, whatever
//!   their sizes, and traffic between other pairs never reorders them. [clause: p2p.order]
//! * No deadlock of legal programs: the backend MUST complete every program in which each rank
//!   issues its sends and receives in any order and only then waits, in particular
//!   `irecv(p); isend(p)` on both ranks of a pair, `isend(p); irecv(p)` on both, and any
//!   number of sends in flight to one peer (both ways at once) before that peer posts its
//!   receives. Issuing never blocks on the peer; a backend with bounded buffers queues. A
//!   collective still waiting for its peers MUST NOT hold back a send / recv issued after it
//!   (rank 0 `all_reduce; isend(1)` against rank 1 `irecv(0); wait; all_reduce` completes).
//!   A send / recv pair needs its two ranks only: it completes while the communicator's other
//!   members issue nothing, also as a new communicator's very first op (a communicator set up
//!   lazily by its first op cannot make that set-up a collective of every member).
//!   [clause: p2p.no_deadlock]
//!
//! # Barrier
//! * `barrier()` completes on a rank only after *every* rank has entered it: anything a rank did
//!   before entering (e.g. a store write) is visible to every rank whose barrier has completed.
//!   [clause: barrier]
//!
//! # Views
//! * A view at element offset `k` of a buffer reads and writes exactly elements `k..k + numel`
//!   of it: a collective given a view as input reads only those, as output writes only those.
//!   [clause: views]
//! * A buffer of zero elements overlaps no buffer, whatever its address: an empty `_out` buffer
//!   at an empty input's address (two empty views of one parent at one offset, as empty shards
//!   of one flat buffer are) is a valid call that completes, never `bad_input:aliasing` (MPICH
//!   refused it by comparing the pointers whatever the count: pmodels/mpich #2124).
//!   [clause: placement.empty_no_alias]
//!
//! # Rounding
//! * Integer reductions wrap in the dtype's width; float `min` / `max` order `-0 < +0` and treat
//!   NaN per [`crate::NanPolicy`]; subnormal inputs and results are kept (no flush to zero), in
//!   every reduce op (the scaled results of `avg` and `premul_sum` too) and through every
//!   reducing call (coalesced ones too). [clause: numerics.subnormal]
//! * f16 / bf16 `sum`, `avg` and `premul_sum` round as declared in
//!   [`Capabilities::rounding`]; a backend that declares [`crate::Rounding::ExactThenRound`]
//!   MUST produce the exact result rounded once to nearest-even, bit for bit.
//!   [clause: numerics.round_once]
//! * A backend that declares [`crate::Rounding::Accumulate`] `{ ulps }` MUST keep `ulps` within
//!   [`crate::Rounding::accumulate_ulps_allowed`] of the communicator's size `n` (`2n`: a
//!   reduction of `n` terms rounded at every step needs no more, whatever the order), on every
//!   communicator it runs, subgroups included; a larger declaration FAILS every value check that
//!   reads it, naming the declaration (a declared `ulps` of a million would otherwise pass
//!   anything). [clause: numerics.accumulate_bound]
//! * `premul_sum(s)` is `sum(s * x_r)` for any factor `s` (not only powers of two). `s` MUST
//!   be the same on every rank: differing factors are `BadInput` of kind `reduce_op_mismatch`
//!   on every rank, on every reducing call (reduce_scatter_tensor and its variants, reduce,
//!   all_reduce_coalesced, not only all_reduce) (rule 16 of [`crate::call`]; NCCL's per-rank `Σ s_r x_r` is not the
//!   contract). [clause: numerics.premul_sum]
//!
//! # Shapes
//! * `all_gather_into_tensor`: `[ws * d0, rest..]`; a 0-dim input gathers to `[ws]`.
//! * `reduce_scatter_tensor`: `d0 % ws == 0` required; result `[d0 / ws, rest..]`.
//! * `all_to_all_single`: dim 0 split by `input_splits` (equal split when `None`, which needs
//!   `d0 % ws == 0`); output rows by `output_splits` in source-rank order.
//! * `reduce` / `gather`: the result has the same shape on every rank; its contents are defined
//!   on the root only. `scatter`: every rank passes a same-shaped input; only the root's counts.
//! * `permute_tensor(x, src_dst)`: rank `r`'s data goes to rank `src_dst[r]`. [clause: shapes]
//!   [clause: shapes.equal_split_all_to_all]

use crate::caps::Capabilities;
use crate::dtype::DType;
use crate::error::Result;
use crate::fused::{Gathered, Scaling};
use crate::op::ReduceOp;
use crate::tensor::Tensor;
use crate::work::Work;
use std::path::PathBuf;
use std::time::Duration;

/// The prefix every shared-memory object and temp file of world `world_id` MUST start with:
/// `concord-<world_id>-` (the trailing `-` keeps world `w1` from matching world `w10`), so the
/// runner can sweep whatever a world left behind.
pub fn world_prefix(world_id: &str) -> String {
    format!("concord-{world_id}-")
}

/// How long an op may stay queued behind earlier ops of its communicator (issued, not yet taken
/// by the backend's progress engine) with the queue ahead of it not moving, before a wait still
/// waiting ends it: three op timeouts. The op deadline ([`WorldInfo::op_timeout`]) counts from
/// when an op starts, so time spent behind healthy earlier ops does not count; but behind an op
/// stuck for good (a dead peer the library never reports) a queued op would never start, and its
/// wait would last as long as its caller's timeout. Three op timeouts leave room for the op ahead
/// to take its own deadline and the rest of its steps. Backends with a progress queue end a queued
/// op's wait there with a named timeout and mark it abandoned: NCCL (its backstop, from the issue:
/// its progress thread only launches), MPI (from when its progress thread last took or finished
/// a job, its issue at the earliest: it runs each op to its end, so a long healthy queue moves).
pub fn queued_op_backstop(op_timeout: Duration) -> Duration {
    op_timeout * 3
}

/// What a worker process knows about the world it is part of.
#[derive(Clone, Debug)]
pub struct WorldInfo {
    pub rank: usize,
    pub world_size: usize,
    /// The world's store address: a file path (a c10d-compatible FileStore file) or
    /// `tcp://HOST:PORT[/PREFIX]` (a c10d-compatible TCPStore); open it with
    /// `concord_store::Store::open`, whatever its kind.
    pub store_path: PathBuf,
    /// Unique per world: prefix for shared-memory names and store keys.
    pub world_id: String,
    /// Default deadline for one collective.
    pub op_timeout: Duration,
    /// Extra backend options (`CONCORD_BACKEND_OPTS`, e.g. `fail_all=1`).
    pub options: Vec<(String, String)>,
}

/// The backend option that carries a rank's index among the ranks of its host, set when ranks
/// are started by an external launcher (torchrun, mpirun, srun).
pub const LOCAL_RANK_OPTION: &str = "local_rank";

impl WorldInfo {
    pub fn option(&self, key: &str) -> Option<&str> {
        self.options.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// A yes/no backend option: `1` / `true` / `yes` / `on` or `0` / `false` / `no` / `off`;
    /// `default` when it is absent. Any other value is an error naming the option (a typo
    /// such as `validate=flase` must not silently pick one side).
    pub fn flag(&self, key: &str, default: bool) -> std::result::Result<bool, String> {
        match self.option(key) {
            None => Ok(default),
            Some("1" | "true" | "yes" | "on") => Ok(true),
            Some("0" | "false" | "no" | "off") => Ok(false),
            Some(v) => Err(format!("backend option {key}={v}: expected 1/0, true/false, yes/no or on/off")),
        }
    }

    /// This rank's index among the ranks of its host: the [`LOCAL_RANK_OPTION`] when a launcher
    /// gave one, else the rank (a world Concord launched itself lives on one host). GPU
    /// backends pick their device from it.
    pub fn local_rank(&self) -> usize {
        self.option(LOCAL_RANK_OPTION).and_then(|v| v.parse().ok()).unwrap_or(self.rank)
    }
}

/// A collective-communication backend. One instance per rank (and per subgroup).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a Concord backend",
    label = "this type must implement `concord_core::Backend`",
    note = "implement `concord_core::Backend` for `{Self}` (see the README's \"Test your own backend\" section), or wrap a built-in backend such as `concord_shm::ShmBackend`"
)]
pub trait Backend: Sized + Send + Sync + 'static {
    /// A buffer on the backend's device. Cloning clones the *handle*, not the data.
    type Buffer: Clone + Send + Sync + 'static;

    /// Name prefixes of the files the backend's own libraries make in `/dev/shm` under names
    /// the backend does not choose (NCCL: `nccl-`, from `mkstemp`), which a killed rank leaves
    /// behind. Every launcher of Concord (the conformance runner, the bench, `harness::launch`)
    /// sweeps, after a world's processes are gone, the files with these prefixes that are new
    /// since the world started, this user's, and neither open nor mapped by a live process
    /// (`harness::platform::ForeignShm`). A file of such a prefix MUST stay open or mapped by a
    /// process for as long as it is in use. Default: none.
    const SHM_PREFIXES: &'static [&'static str] = &[];

    /// Joins the world (collective: every rank calls it).
    fn init(world: &WorldInfo) -> Result<Self>;
    /// Short name used in case names and messages (`shm`, `nccl`, ...).
    fn name(&self) -> &str;
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    fn capabilities(&self) -> Capabilities;
    /// Issued collectives not yet waited (PyTorch's work registry).
    fn outstanding(&self) -> usize;
    /// A communicator over `ranks` of this one (collective over *all* ranks of `self`, which
    /// pass the same list). Members get `Some`, with rank = position in `ranks`.
    fn new_group(&self, ranks: &[usize]) -> Result<Option<Self>>;
    /// The fault-injection hooks this backend honours, as `(point, action)` pairs (see
    /// [`crate::fault`]; requested through the `fault` backend option at `init`). Default: none
    /// (the fault suite's cases are then UNSUPPORTED with the reason).
    fn fault_hooks(&self) -> Vec<(String, crate::fault::Action)> {
        Vec::new()
    }

    // ---- buffers ----
    fn upload(&self, t: &Tensor) -> Result<Self::Buffer>;
    /// The buffer's current contents (synchronises with the device, not with collectives).
    fn download(&self, b: &Self::Buffer) -> Result<Tensor>;
    /// A new buffer; contents unspecified.
    fn alloc(&self, dtype: DType, shape: &[usize]) -> Result<Self::Buffer>;
    /// Overwrites `b` with `t` (same dtype and element count).
    fn write(&self, b: &Self::Buffer, t: &Tensor) -> Result<()>;
    /// A buffer aliasing `numel(shape)` elements of `b` from element `offset` on.
    fn view(&self, b: &Self::Buffer, offset: usize, shape: &[usize]) -> Result<Self::Buffer>;
    /// Address of the first element (identity: equal addresses are the same storage).
    fn buffer_addr(&self, b: &Self::Buffer) -> usize;
    fn buffer_dtype(&self, b: &Self::Buffer) -> DType;
    fn buffer_shape(&self, b: &Self::Buffer) -> Vec<usize>;

    // ---- collectives ----
    fn all_reduce(&self, x: &Self::Buffer, op: ReduceOp) -> Result<Work<Self::Buffer>>;
    fn all_reduce_(&self, x: &Self::Buffer, op: ReduceOp) -> Result<Work<Self::Buffer>>;
    fn all_reduce_coalesced(&self, xs: &[Self::Buffer], op: ReduceOp) -> Result<Work<Vec<Self::Buffer>>>;
    fn all_reduce_coalesced_(&self, xs: &[Self::Buffer], op: ReduceOp) -> Result<Work<Vec<Self::Buffer>>>;
    fn all_gather_into_tensor(&self, x: &Self::Buffer) -> Result<Work<Self::Buffer>>;
    fn all_gather_into_tensor_out(&self, x: &Self::Buffer, out: &Self::Buffer) -> Result<Work<Self::Buffer>>;
    fn all_gather_into_tensor_coalesced(&self, xs: &[Self::Buffer]) -> Result<Work<Vec<Self::Buffer>>>;
    fn reduce_scatter_tensor(&self, x: &Self::Buffer, op: ReduceOp) -> Result<Work<Self::Buffer>>;
    fn reduce_scatter_tensor_out(&self, x: &Self::Buffer, op: ReduceOp, out: &Self::Buffer) -> Result<Work<Self::Buffer>>;
    fn reduce_scatter_tensor_coalesced(&self, xs: &[Self::Buffer], op: ReduceOp) -> Result<Work<Vec<Self::Buffer>>>;
    fn all_to_all_single(
        &self,
        x: &Self::Buffer,
        output_splits: Option<&[usize]>,
        input_splits: Option<&[usize]>,
    ) -> Result<Work<Self::Buffer>>;
    fn broadcast(&self, x: &Self::Buffer, src: usize) -> Result<Work<Self::Buffer>>;
    fn broadcast_(&self, x: &Self::Buffer, src: usize) -> Result<Work<Self::Buffer>>;
    fn permute_tensor(&self, x: &Self::Buffer, src_dst: &[usize]) -> Result<Work<Self::Buffer>>;
    fn reduce(&self, x: &Self::Buffer, op: ReduceOp, root: usize) -> Result<Work<Self::Buffer>>;
    fn gather(&self, x: &Self::Buffer, root: usize) -> Result<Work<Self::Buffer>>;
    fn scatter(&self, x: &Self::Buffer, root: usize) -> Result<Work<Self::Buffer>>;
    fn send(&self, x: &Self::Buffer, dst: usize) -> Result<Work<()>>;
    fn recv(&self, out: &Self::Buffer, src: usize) -> Result<Work<Self::Buffer>>;
    fn barrier(&self) -> Result<Work<()>>;

    // ---- fused communication + compute (optional: the defaults are the seed's unfused
    // decompositions, module `crate::fused`; a backend with its own declares
    // `Capabilities::fused = FusedImpl::Pipelined`) ----

    /// `(all_gather(a_shard, gather_dim), [movedim(ag, g, 0) @ b_i moved back])`.
    fn fused_all_gather_matmul(
        &self,
        a_shard: &Self::Buffer,
        bs: &[Self::Buffer],
        gather_dim: usize,
    ) -> Result<Work<Gathered<Self::Buffer>>> {
        crate::fused::decomposed_all_gather_matmul(self, a_shard, bs, gather_dim, None)
    }
    /// The scaled variant: `diag(sa) A B_i diag(sb_i)` in `scaling.out_dtype`.
    fn fused_all_gather_scaled_matmul(
        &self,
        a_shard: &Self::Buffer,
        bs: &[Self::Buffer],
        gather_dim: usize,
        scaling: &Scaling,
    ) -> Result<Work<Gathered<Self::Buffer>>> {
        crate::fused::decomposed_all_gather_matmul(self, a_shard, bs, gather_dim, Some(scaling))
    }
    /// `reduce_scatter(a @ b, op, scatter_dim)`, `op` sum or avg.
    fn fused_matmul_reduce_scatter(
        &self,
        a: &Self::Buffer,
        b: &Self::Buffer,
        op: ReduceOp,
        scatter_dim: usize,
    ) -> Result<Work<Self::Buffer>> {
        crate::fused::decomposed_matmul_reduce_scatter(self, a, b, op, scatter_dim, None)
    }
    /// The scaled variant (`scaling.b` has one scale).
    fn fused_scaled_matmul_reduce_scatter(
        &self,
        a: &Self::Buffer,
        b: &Self::Buffer,
        op: ReduceOp,
        scatter_dim: usize,
        scaling: &Scaling,
    ) -> Result<Work<Self::Buffer>> {
        crate::fused::decomposed_matmul_reduce_scatter(self, a, b, op, scatter_dim, Some(scaling))
    }
    /// `all_gather_into_tensor(x)`, pulling each peer's part in turn.
    fn low_contention_all_gather(&self, x: &Self::Buffer) -> Result<Work<Self::Buffer>> {
        crate::fused::decomposed_low_contention(self, x, None)
    }
    /// `reduce_scatter_tensor(x, op)`, `op` sum or avg, as an all-to-all then a local reduction.
    fn low_contention_reduce_scatter(&self, x: &Self::Buffer, op: ReduceOp) -> Result<Work<Self::Buffer>> {
        crate::fused::decomposed_low_contention(self, x, Some(op))
    }
}

#[cfg(test)]
mod tests {
    use super::WorldInfo;

    fn with(options: &[(&str, &str)]) -> WorldInfo {
        WorldInfo {
            rank: 0,
            world_size: 1,
            store_path: "unused".into(),
            world_id: "w".into(),
            op_timeout: std::time::Duration::from_secs(1),
            options: options.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        }
    }

    #[test]
    fn flag_reads_yes_and_no_spellings_and_names_anything_else() {
        for v in ["1", "true", "yes", "on"] {
            assert_eq!(with(&[("x", v)]).flag("x", false), Ok(true), "{v}");
        }
        for v in ["0", "false", "no", "off"] {
            assert_eq!(with(&[("x", v)]).flag("x", true), Ok(false), "{v}");
        }
        assert_eq!(with(&[]).flag("x", true), Ok(true));
        assert_eq!(with(&[("y", "1")]).flag("x", false), Ok(false));
        let e = with(&[("x", "True ")]).flag("x", false).unwrap_err();
        assert!(e.contains("x=True ") && e.contains("on/off"), "{e}");
    }
}
