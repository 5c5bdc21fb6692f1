//! The contract map: every clause a backend MUST keep (the MUST lists of
//! `core/src/backend.rs`, `core/src/caps.rs` and `core/src/call.rs`), each with the cases that
//! check it. A clause is checked by the cases whose name (without the backend prefix) contains
//! one of its patterns; a clause whose patterns match no case of the catalogue is a hole, and
//! the self-test (`contract::*` in `cli/tests/faulty_backends.rs`) fails on it.
//!
//! `conformance --contract` prints the map for a binary's backends; conformance mode writes it,
//! with every clause's passed / failed counts, as `contract.md` beside the report.

use crate::report::CaseRecord;
use concord_harness::verdict::Status;

/// One MUST of the contract.
#[derive(Clone, Copy, Debug)]
pub struct Clause {
    /// Stable id (`async.issue_returns`, `values.reduce`, ...).
    pub id: &'static str,
    /// Where the clause is written.
    pub source: &'static str,
    /// The clause, in one sentence.
    pub text: &'static str,
    /// Case-name substrings; EVERY pattern must match at least one case (a clause listing two
    /// patterns needs both kinds of case).
    pub cases: &'static [&'static str],
}

const BACKEND: &str = "core/src/backend.rs";
const CAPS: &str = "core/src/caps.rs";
const CALL: &str = "core/src/call.rs";
const WORK: &str = "core/src/work.rs";

/// Every clause, in the order of the contract's text.
pub const CLAUSES: &[Clause] = &[
    Clause {
        id: "async.issue_returns",
        source: BACKEND,
        text: "Every collective returns at once with a Work; it is not complete before every peer has issued it.",
        cases: &[
            "async::pending_until_peers_arrive",
            "seed::c10d::test_unwaited",
            "async::issue_returns_at_once::fresh_group",
            "async::issue_returns_at_once::all_to_all_splits",
            "async::issue_returns_at_once::large_all_reduce",
        ],
    },
    Clause {
        id: "async.result_final_after_wait",
        source: BACKEND,
        text: "The result is final once wait returns, and stays so (no late write into a waited buffer).",
        cases: &["async::lag_read_right_after_wait", "reuse::no_late_write::", "async::completes_without_wait"],
    },
    Clause {
        id: "async.completed_means_final",
        source: BACKEND,
        text: "Once is_completed() is true the result is final, as after wait: a polling caller may read it without waiting.",
        cases: &["async::completes_without_wait::every_op"],
    },
    Clause {
        id: "async.wait_semantics",
        source: WORK,
        text: "wait is idempotent, may come from another thread and in any order, and outstanding() counts issued-but-unwaited works.",
        cases: &[
            "async::wait_twice",
            "async::wait_from_another_thread",
            "async::many_outstanding_waited_out_of_order",
            "reuse::outputs_in_flight::",
            "async::registry_counts_unwaited_work",
            "seed::eager::work_registry_zero_after_wait",
            // One work held un-waited while 300 others run: still counted.
            "state::outstanding_across_300_ops",
        ],
    },
    Clause {
        id: "async.deadline",
        source: BACKEND,
        text: "No wait blocks longer than asked, nor times out before it; a peer that never comes is a named timeout, and the world is usable after; an op every rank entered within its deadline does not fail for lateness; once every rank arrived, a collective's remaining steps get one op deadline from the last arrival, a point-to-point op's its op deadline from its post; a timeout past that deadline is final on every rank (buffers the caller's again), one before it leaves the op in flight.",
        cases: &[
            "async::peer_never_joins_then_recovers",
            "async::peer_dies_mid_collective",
            "async::wait_zero_polls",
            "async::sub_second_wait_waits_its_deadline",
            // A peer late inside the op deadline: the op completes on every rank.
            "faults::late_inside_deadline::",
            // A send's wait past its op deadline is final for its buffer even while the receiver
            // copies: nothing read from it after that is delivered.
            "faults::late_receiver::slow_copy",
        ],
    },
    Clause {
        id: "async.every_op_every_rank",
        source: BACKEND,
        text: "Every op, with each rank in turn the late one, is pending (and its wait a named timeout) until every peer has issued, also once an op issued after it has completed, then completes right, whatever the caller issued after it.",
        cases: &[
            "async::pending_until_peers_arrive::all_reduce::",
            "async::pending_until_peers_arrive::reduce::",
            "async::pending_until_peers_arrive::broadcast::",
            "async::pending_until_peers_arrive::send_recv::",
            "async::pending_until_peers_arrive::barrier::",
            "p2p::send_buffer_reused_once_completed",
            // Every op's work completes on its own once its peers have issued (no wait).
            "async::completes_without_wait::every_op",
            // ... and not with the ops issued after it (which a peer may issue only later).
            "async::earlier_op_completes_before_a_later_one_is_issued",
            // ... nor when an op issued after it completed (its completion is its own op's).
            "p2p::send_behind_pending_collective::",
            "p2p::recv_behind_pending_collective::",
        ],
    },
    Clause {
        id: "async.communicators_independent",
        source: BACKEND,
        text: "Communicators progress independently on the host: an op on one communicator never waits for an op of another in anything the backend adds (one engine, queue, lock or stream for every communicator), whatever order each rank issued them in; unless it declares concurrent_communicators = false (it orders them, or its library documents same-order submission, as NCCL does): programs then issue them in the same order on every rank, and the crossing cases are UNSUPPORTED there.",
        cases: &["async::communicators_progress_apart", "p2p::group_and_world_messages_apart", "reuse::world_and_group_crossed"],
    },
    Clause {
        id: "failure.no_touch_after_failed_wait",
        source: BACKEND,
        text: "Once a wait returned an op's final failure (a timeout past the op's deadline of async.deadline, a dead peer, an abort, a local error), no peer reads or writes that rank's buffers any more; every rank ends in a named error (a panic inside the backend too), never Ok, never a hang.",
        cases: &[
            "faults::late_peer::",
            "faults::stall_between_barriers",
            "faults::fail_after_post::",
            "faults::panic_in_progress_thread",
            "faults::drop_during_recv",
            "faults::late_sender::",
            "faults::late_receiver::",
        ],
    },
    Clause {
        id: "failure.usable_after",
        source: BACKEND,
        text: "After bad input (a mismatched new_group, splits whose sum overflows) every rank gets a named bad_input and the communicator stays usable; a failed new_group leaves no file behind, nor does a group every rank made and dropped (no file in /dev/shm, no descriptor kept per group), nor a communicator every rank dropped after a failed op; what a process keeps MAY be released after the drop returns, on a thread of the backend's own, as long as the release keeps going.",
        // Every bad_input case ends with an all_reduce that must work (the world stays usable).
        cases: &[
            "faults::split_sum_overflow",
            "faults::new_group_after_mismatch",
            "faults::new_group_failure_leaves_no_file",
            // Their file part: no file named after the world once its release has settled.
            "faults::alloc_fails_at_issue",
            // Twelve groups made and dropped: the process's descriptors do not grow per group.
            "state::groups_each_without_a_rank",
            "bad_input::send_to_self",
            "bad_input::send_recv_dtype_mismatch",
            // A hundred refused ops in one case: usable after their sum, not only after one.
            "state::bad_input_100_then_usable",
        ],
    },
    Clause {
        id: "progress.recorded",
        source: BACKEND,
        text: "A collective in flight is recorded (concord_core::progress lists it while it waits for its peers), so a timeout names the collective; one built from another op (a barrier as an all_reduce) is recorded under the op the caller called.",
        cases: &[
            "async::peer_never_joins_then_recovers",
            "async::peer_never_joins_op_recorded_in_flight",
            "async::peer_never_joins_op_recorded_in_flight::all_reduce_coalesced",
            "faults::absent_peer::fused_all_gather_matmul",
        ],
    },
    Clause {
        id: "quiescence",
        source: BACKEND,
        text: "After every case, outstanding() is 0 on the world and every subgroup (checked by the runner after each case body).",
        // `state::dropped_works_100_then_usable`: a hundred works dropped un-waited, then 0 and a
        // working communicator.
        cases: &["::ws", "state::dropped_works_100_then_usable"],
    },
    Clause {
        id: "async.unwaited_exit",
        source: BACKEND,
        text: "A process that drops an un-waited collective or send still exits promptly, and dropping a work never withdraws its op (a dropped send still reaches its receiver).",
        cases: &["async::unwaited_collective_exits_within_1s", "async::unwaited_send_exits_within_3s", "async::dropped_send_still_delivered"],
    },
    Clause {
        id: "async.caller_threads",
        source: BACKEND,
        text: "The caller may use a backend from any thread: a communicator made on another thread, a work issued on one thread and waited, polled or dropped on another, one work waited by several threads at once; a wait on any thread waits as on the issuing thread, every waiter gets the outcome within its own deadline, a work is finalised once; ops of one communicator are never issued from two threads at once (the caller orders them).",
        cases: &[
            "async::issue_on_one_thread_run_on_another",
            "seed::c10d::test_threading",
            "async::wait_from_another_thread",
            "async::two_threads_wait_one_work",
        ],
    },
    Clause {
        id: "faults.aborted_ops_fail",
        source: BACKEND,
        text: "An op whose communicator is aborted before its completion was observed fails with the abort; a wait ends at its own deadline even behind a stuck launch.",
        cases: &["device_faults::abort_fails_ops_in_flight", "device_faults::abort_not_behind_a_launch"],
    },
    Clause {
        id: "faults.absent_peer_bounded",
        source: BACKEND,
        text: "An op whose peer never does its part (stalls before or after its header, never launches, or is absent at the communicator's very first op) ends in a named error within its deadline plus the abort's bound, never Ok; on a subgroup by the group's own deadline, whatever its parent's failure did.",
        cases: &[
            "device_faults::stall_before_first_header",
            "device_faults::stall_before_header",
            "device_faults::stall_after_header",
            "device_faults::no_launch",
            "faults::late_sender::",
            "faults::late_receiver::",
            "faults::absent_peer::fused_all_gather_matmul",
            "faults::absent_peer::low_contention_all_gather",
            "faults::world_timeout_with_group_op_in_flight",
        ],
    },
    Clause {
        id: "faults.copies_not_behind_collectives",
        source: BACKEND,
        text: "upload / download synchronise with the device, not with queued collectives, and leave the communicator usable.",
        cases: &["device_faults::copies_not_behind_collectives"],
    },
    Clause {
        id: "faults.local_failure_named_everywhere",
        source: BACKEND,
        text: "A local failure after an op was issued reaches every rank of the op (not only the failing rank's neighbours) as one named error, never a timeout and never a bad-input kind; the world stays usable (after a failure on a subgroup: the group, its parent and its siblings), and works issued before the failing op complete with their own results.",
        cases: &[
            "device_faults::local_failure_after_begin",
            "device_faults::fail_before_header",
            "faults::fail_after_post",
            "faults::alloc_fails_at_issue",
            "faults::fail_in_new_group",
            "faults::fail_p2p",
            "faults::fail_on_group",
            "device_faults::local_failure_on_group",
        ],
    },
    Clause {
        id: "values.reduce",
        source: BACKEND,
        text: "Reductions return the oracle's value for every dtype and reduce op defined for it (exact inputs bit-exact; random inputs within the bound).",
        cases: &["all_reduce::out::", "reduce_scatter_tensor::out::", "reduce::out::", "::random", "::special", "programs::"],
    },
    Clause {
        id: "values.identical_on_every_rank",
        source: BACKEND,
        text: "An all_reduce leaves identical copies of one result on every rank, bit for bit, also on random inputs (one order of reduction for all ranks), on every communicator (a subgroup's members too).",
        cases: &["identical::all_reduce::", "identical::subgroup::"],
    },
    Clause {
        id: "values.move",
        source: BACKEND,
        text: "Data-moving ops (all_gather, all_to_all, broadcast, gather, scatter, permute, send/recv) deliver exactly the oracle's bytes, in rank order.",
        cases: &[
            "all_gather_into_tensor::out::",
            "all_to_all_single::out::",
            "broadcast::out::",
            "gather::out::",
            "scatter::out::",
            "permute_tensor::out::",
            "send_recv::outbuf::",
            "::perm_",
            "::bits",
            "reuse::outputs_in_flight::all_gather_into_tensor",
            "programs::",
        ],
    },
    Clause {
        id: "values.coalesced",
        source: BACKEND,
        text: "Coalesced ops return one result per input, each as the single op would.",
        cases: &[
            "all_reduce::coalesced::",
            "all_gather_into_tensor::coalesced::",
            "reduce_scatter_tensor::coalesced::",
            "all_reduce::coalesced::mixed_dtypes",
            "all_gather_into_tensor::coalesced::mixed_dtypes",
            "reduce_scatter_tensor::coalesced::mixed_dtypes",
            "programs::",
        ],
    },
    Clause {
        id: "placement.out_of_place",
        source: BACKEND,
        text: "Out-of-place ops return a new buffer that never aliases the input, and leave the input unchanged.",
        cases: &["all_reduce::out::", "reuse::persistent_input_100_iterations", "reuse::outputs_kept::", "programs::", "state::results_kept_100_calls"],
    },
    Clause {
        id: "placement.in_place",
        source: BACKEND,
        text: "In-place ops return the very buffer(s) given (same address).",
        cases: &["all_reduce::inplace::", "broadcast::inplace::", "all_reduce::coalesced_inplace::", "programs::"],
    },
    Clause {
        id: "placement.out_buffer",
        source: BACKEND,
        text: "_out ops write only the caller's output buffer, never a byte outside it.",
        cases: &["all_gather_into_tensor::outbuf::", "reduce_scatter_tensor::outbuf::", "programs::"],
    },
    Clause {
        id: "placement.aliasing",
        source: CAPS,
        text: "Inputs and outputs that overlap are handled as the declared aliasing policy says.",
        cases: &["reuse::aliasing::", "caps::aliasing"],
    },
    Clause {
        id: "placement.reuse",
        source: BACKEND,
        text: "One buffer reused across many collectives gives the right result every time; after a successful wait a rank's inputs and its result are the caller's again (no peer reads them any more, a relay forwarding from its result included); an op keeps every buffer it was given until it completes (the caller may drop its handles after issue).",
        cases: &[
            "reuse::persistent_buffer_100_iterations",
            "reuse::ops_300_world_and_group",
            "wild_custom::all_reduce::replayed_buffer::",
            "reuse::inputs_rewritten_after_wait",
            "reuse::outputs_in_flight::",
        ],
    },
    Clause {
        id: "shapes",
        source: BACKEND,
        text: "Output shapes follow the documented rules (all_gather [ws*d0,..], 0-dim gathers to [ws], reduce_scatter [d0/ws,..], all_to_all splits, rooted ops same shape everywhere).",
        cases: &[
            "seed::eager::all_gather_0dim",
            "seed::eager::all_to_all_equal_split_default",
            "all_gather_into_tensor::out::",
            "sizes::all_gather_into_tensor::out::f32::matrix",
            "wild_state::all_gather_rank_padded_shapes::",
        ],
    },
    Clause {
        id: "bad_input.named_everywhere",
        source: CALL,
        text: "Bad input is one named BadInputKind on every rank (local rules at issue, cross-rank rules on every rank), never a hang or a silent truncation; the world stays usable; works issued before a refused call complete with their own results.",
        cases: &["bad_input::", "bad_input::broadcast_dtype_mismatch", "bad_input::shape_mismatch_behind_pending::"],
    },
    Clause {
        id: "bad_input.refused_untouched",
        source: BACKEND,
        text: "A call refused with a bad-input error MUST leave its outputs (an _out buffer) and an in-place buffer untouched: validation comes before any data moves.",
        cases: &["bad_input::grid::all_gather_into_tensor_out::", "bad_input::grid::all_reduce_::"],
    },
    Clause {
        id: "bad_input.root_agreement",
        source: CALL,
        text: "A root / src out of range (of the communicator: a subgroup's size, not the world's) or not equal on every rank is BadRoot (broadcast, reduce, gather, scatter).",
        cases: &[
            "bad_input::broadcast_src_differs_across_ranks",
            "bad_input::reduce_root_differs_across_ranks",
            "bad_input::gather_root_differs_across_ranks",
            "bad_input::scatter_root_differs_across_ranks",
            "bad_input::scatter_root_differs_on_one_rank",
            "bad_input::broadcast_inplace_src_differs_on_one_rank",
            "bad_input::subgroup::rooted::",
        ],
    },
    Clause {
        id: "bad_input.indivisible",
        source: CALL,
        text: "reduce_scatter / scatter / equal-split all_to_all on a dim 0 the world size does not divide is Indivisible, never truncated.",
        cases: &[
            "bad_input::reduce_scatter_indivisible",
            "bad_input::scatter_indivisible",
            "bad_input::all_to_all_equal_split_indivisible",
            "bad_input::all_to_all_equal_split_indivisible_rows",
        ],
    },
    Clause {
        id: "bad_input.peer_and_group",
        source: CALL,
        text: "send/recv peers and new_group member lists are checked (BadPeer, BadGroup); a recv buffer smaller than the message is OutBufferSize.",
        cases: &["bad_input::send_to_self", "bad_input::new_group_", "bad_input::recv_buffer_smaller_than_message"],
    },
    Clause {
        id: "values.sizes",
        source: BACKEND,
        text: "Values are right at every size, across chunk and protocol boundaries (±1 element around powers of two, 64 K elements, up to 64 MiB), every element checked.",
        cases: &[
            "sizes::all_reduce::",
            "sizes::broadcast::",
            "sizes::all_gather_into_tensor::",
            "sizes::send_recv::",
            "::long",
            "wild::one_rank_block_tails",
            "wild_custom::all_reduce::tail_past_16ws::",
            "wild_custom::all_reduce::back_to_back_large::",
        ],
    },
    Clause {
        id: "values.world_sizes",
        source: BACKEND,
        text: "Values are right at every world size the backend declares (1–8 and a larger one), not only powers of two.",
        cases: &["::ws6", "::ws7", "::ws16", "wild::one_rank_block_tails"],
    },
    Clause {
        id: "views",
        source: BACKEND,
        text: "A view at a non-zero offset is read and written exactly there; the parent outside the view is untouched.",
        cases: &[
            "views::",
            "programs::",
            "state::views_of_one_parent",
            "wild_layout::inplace_all_reduce_view_in_window::",
            "wild_layout::empty_p2p_at_parent_end::",
            // Views of 64 KiB and more, not 16-byte aligned (review13's finding 5).
            "sizes::",
            // The autotuner's `chunked` choice: in-place all_reduces on views of one buffer in
            // flight together (review13's finding 7; `state::views_of_one_parent` checks the
            // same, naming the op, since fixes18).
            "autotune::builtin::",
        ],
    },
    Clause {
        id: "placement.empty_no_alias",
        source: BACKEND,
        text: "A buffer of zero elements overlaps no buffer: an empty `_out` buffer at an empty input's address is a valid call, never refused as aliasing.",
        cases: &["wild_layout::empty_out_at_input_address::"],
    },
    Clause {
        id: "placement.realloc",
        source: BACKEND,
        text: "Buffers freed and re-allocated between collectives (the same address with another size, shape or dtype) give the right result: nothing is cached by address.",
        cases: &["realloc::"],
    },
    Clause {
        id: "shapes.equal_split_all_to_all",
        source: BACKEND,
        text: "all_to_all_single with no splits splits dim 0 (rows, not elements) equally, on tensors of any rank.",
        cases: &["all_to_all_equal::"],
    },
    Clause {
        id: "subgroups.reduce_ops",
        source: BACKEND,
        text: "Every reduce op works in a subgroup; avg divides by the group's size.",
        cases: &[
            "subgroup::halves::all_reduce::out::f32::avg",
            "subgroup::partial::all_reduce::out::i32::",
            "subgroup::halves::all_reduce::inplace::f32::avg",
        ],
    },
    Clause {
        id: "subgroups",
        source: BACKEND,
        text: "new_group gives members a communicator (rank = position in the list) and non-members none; collectives on it involve its members only; called on a subgroup, the ranks are that subgroup's; every call makes a communicator of its own (two groups over one list are independent, and dropping one, or a group of the whole parent, leaves the others and the parent working).",
        cases: &["subgroup::", "programs::", "state::group_recreated_same_members", "state::groups_each_without_a_rank", "wild_groups::nested::"],
    },
    Clause {
        id: "caps.subgroups_declared",
        source: BACKEND,
        text: "A backend declaring subgroups = false refuses every new_group by name (unsupported | bad_input:unsupported_op) on every rank, never returns a communicator, and stays usable.",
        cases: &["caps::subgroups::"],
    },
    Clause {
        id: "init.rank_is_the_launchers",
        source: BACKEND,
        text: "After init, the communicator's rank and world size are the launcher's (checked at every world's setup, on every rank).",
        // Checked at setup, before any case: every case of every world size checks it; these
        // are the cheapest.
        cases: &["barrier::out::u8::ws2", "barrier::out::u8::ws16", "caps::init_arrival_order::ws3"],
    },
    Clause {
        id: "init.same_capabilities",
        source: BACKEND,
        text: "Every rank of a world declares the same capabilities (checked at every world's setup: each rank's against rank 0's).",
        // Checked at setup, before any case: every case of every world size of two or more
        // ranks checks it; these are the cheapest.
        cases: &["barrier::out::u8::ws2", "barrier::out::u8::ws16"],
    },
    Clause {
        id: "init.declared_world_sizes",
        source: BACKEND,
        text: "init does not refuse (Unsupported) a world within the declared max_world_size: such a refusal fails the world's setup.",
        cases: &["barrier::out::u8::ws3", "barrier::out::u8::ws7", "barrier::out::u8::ws16", "caps::init_one_rank_world::ws2"],
    },
    Clause {
        id: "caps.moves_data_declared",
        source: BACKEND,
        text: "A backend that moves real values declares moves_data = true; a case whose value checks were skipped for moves_data = false is UNSUPPORTED, never PASSED.",
        cases: &["caps::moves_data"],
    },
    Clause {
        id: "caps.declared_semantics",
        source: CAPS,
        text: "What a backend declares (NaN policy of min/max, NaN through sum, signed zeros, integer avg rounding) is what it does.",
        cases: &["caps::nan_minmax", "caps::nan_sum", "caps::signed_zero_minmax", "caps::int_avg"],
    },
    Clause {
        id: "caps.gaps_refused",
        source: CAPS,
        text: "Every declared gap is refused with a named error on every rank, and the world stays usable.",
        cases: &["caps::gaps_refused"],
    },
    Clause {
        id: "barrier",
        source: BACKEND,
        text: "No rank's barrier completes before every rank has entered it.",
        cases: &["async::barrier_synchronises", "async::barrier_synchronises::subgroup", "barrier::"],
    },
    Clause {
        id: "p2p.matching",
        source: BACKEND,
        text: "The k-th send from a to b is the k-th recv on b from a, written exactly into the recv buffer; size or dtype mismatches are BadInput on both ranks; matching is per communicator (a message left unreceived on a dropped group never reaches the next group of the same members).",
        cases: &[
            "send_recv::outbuf::",
            "p2p::recvs_from_every_peer",
            "p2p::group_and_world_messages_apart",
            "bad_input::recv_buffer_smaller_than_message",
            "bad_input::recv_buffer_larger_than_",
            "bad_input::send_recv_dtype_mismatch",
            "programs::",
            // 300 messages between one pair: a narrow tag that wraps.
            "state::recv_300_from_one_peer",
            // A message left unreceived on a dropped group, then the group made again.
            "state::group_recreated_unreceived_send",
        ],
    },
    Clause {
        id: "p2p.order",
        source: BACKEND,
        text: "Messages in flight from one rank to another are received in issue order, whatever their sizes.",
        cases: &["p2p::in_flight_in_order::sizes", "p2p::in_flight_in_order::same_size", "p2p::in_flight_in_order::mixed_protocols", "p2p::in_order_across_other_traffic"],
    },
    Clause {
        id: "p2p.no_deadlock",
        source: BACKEND,
        text: "Legal point-to-point programs complete: irecv before isend on both ranks, many sends in flight before the receives, a send or a receive issued behind a collective that waits for its peer, a pair's exchange as a new communicator's first op while its other members issue nothing.",
        cases: &[
            "p2p::recv_first_both",
            "p2p::recv_first_one_side",
            "p2p::many_sends_one_way",
            "p2p::ring_exchange::large",
            "p2p::recv_before_barrier",
            "p2p::send_behind_pending_collective",
            "p2p::recv_behind_pending_collective",
            "p2p::in_flight_in_order::same_size::n80",
            // A new group's first op is a pair's exchange while its third member issues nothing.
            "p2p::pair_first_on_new_group",
        ],
    },
    Clause {
        id: "numerics.subnormal",
        source: BACKEND,
        text: "Subnormal inputs and results are kept (no flush to zero), in sums, min, max, avg and premul_sum, through every reducing call (coalesced ones too); min / max treat NaN as declared on every reducing call.",
        cases: &["numerics::subnormal::all_reduce_coalesced::", "numerics::subnormal::f16", "numerics::subnormal::f32", "numerics::subnormal::reduce_scatter::", "numerics::subnormal::all_reduce_inplace::", "numerics::subnormal::reduce::", "numerics::nan_minmax::"],
    },
    Clause {
        id: "numerics.accumulate_bound",
        source: BACKEND,
        text: "A backend declaring Rounding::Accumulate { ulps } keeps ulps within 2n on a communicator of n ranks (the bound of a reduction rounded at every step); a larger declaration fails every value check that reads it.",
        cases: &["all_reduce::out::f16::sum::", "reduce_scatter_tensor::out::bf16::avg::"],
    },
    Clause {
        id: "numerics.round_once",
        source: BACKEND,
        text: "f16 / bf16 sums of a backend declaring ExactThenRound are the exact result rounded once to nearest-even (ties to even).",
        cases: &["numerics::round_once::f16", "numerics::round_once::bf16", "numerics::round_once::reduce_scatter::", "numerics::round_once::all_reduce_inplace::", "numerics::round_once::reduce::", "numerics::round_once::large::"],
    },
    Clause {
        id: "numerics.premul_sum",
        source: BACKEND,
        text: "premul_sum(s) is sum(s * x) for any factor, not only 2.0; the factor is the same on every rank (differing factors: bad_input:reduce_op_mismatch, on every reducing call).",
        cases: &["numerics::premul_sum::", "bad_input::all_reduce_premul_sum_factor_mismatch", "bad_input::reduce_scatter_premul_sum_factor_mismatch"],
    },
    Clause {
        id: "seeds.pytorch",
        source: BACKEND,
        text: "PyTorch's functional-collective tests (test_c10d_functional_native.py) and eager inductor semantics hold.",
        cases: &["seed::c10d::", "seed::eager::"],
    },
    Clause {
        id: "fused.values",
        source: BACKEND,
        text: "The fused ops return their unfused decomposition's values on every rank: every gather / scatter dim, several b, f32 / bf16 / f16, scaled, the all-gathered a bit for bit.",
        cases: &["fused::all_gather_matmul::dim2::", "fused::matmul_reduce_scatter::dim1::", "fused::all_gather_scaled_matmul::", "fused::low_contention_reduce_scatter::"],
    },
    Clause {
        id: "fused.pipelined_order",
        source: BACKEND,
        text: "A pipelined fused op consumes a peer's shard only once it has landed, and puts it at its rank's place.",
        cases: &[
            "fused::all_gather_matmul::dim2::f32::large::ws8",
            "fused::matmul_reduce_scatter::dim0::f32::sum::large::ws3",
            "fused::all_gather_matmul::dim0::f32::late_peer::ws3",
            "fused::low_contention_all_gather::dim0::f32::late_peer::ws3",
        ],
    },
    Clause {
        id: "fused.bad_input",
        source: BACKEND,
        text: "Bad input to a fused op (the seed's errors, rules F1-F9) is one named error on every rank.",
        cases: &[
            "fused::bad_input::a_not_matrix",
            "fused::bad_input::reduce_op_not_sum_or_avg",
            "fused::bad_input::gather_dim_differs",
            "fused::bad_input::scaled_invalid_gather_dim",
            "fused::bad_input::scatter_dim_differs",
            "fused::bad_input::b_dtype_differs",
            "fused::bad_input::b_scales_count",
            "fused::bad_input::no_b",
        ],
    },
    Clause {
        id: "fused.buffers",
        source: BACKEND,
        text: "The fused ops leave their inputs (and guard bytes around them) unchanged, return buffers that alias no input, and are waited like any work; a later call never writes the buffers an earlier one returned.",
        cases: &[
            "fused::matmul_reduce_scatter::dim0::bf16::sum::exact::ws3",
            "fused::all_gather_matmul::dim0::f32::outputs_kept::ws2",
            "fused::low_contention_all_gather::dim0::f32::outputs_kept::ws2",
            "fused::low_contention_reduce_scatter::dim0::f32::sum::in_flight_twice::ws2",
        ],
    },
];

/// The contract's text: `core/src/backend.rs`, whose `[clause: id]` tags name its clauses.
pub const CONTRACT_TEXT: &str = include_str!("../../core/src/backend.rs");

/// The clause ids tagged `[clause: id]` in `text`, in order of first appearance, each once (the
/// one parser of the tags: the map's self-test and the mutation campaign both use it).
pub fn tagged_clauses(text: &str) -> Vec<&str> {
    let mut ids: Vec<&str> = Vec::new();
    for id in text.split("[clause: ").skip(1).filter_map(|t| t.split(']').next()) {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

/// The clause ids of the contract ([`CONTRACT_TEXT`]'s tags).
pub fn contract_clause_ids() -> Vec<&'static str> {
    tagged_clauses(CONTRACT_TEXT)
}

/// For each clause: the case ids (among `ids`, names with or without a backend prefix) that
/// check it, and the patterns that match none.
pub fn coverage(ids: &[String]) -> Vec<(&'static Clause, Vec<&str>, Vec<&'static str>)> {
    coverage_at(ids).into_iter().map(|(c, hits, holes)| (c, hits.into_iter().map(|i| ids[i].as_str()).collect(), holes)).collect()
}

/// [`coverage`] with the hits as indices into `ids`. Each distinct pattern is looked for once in
/// every id, with one searcher built per pattern: `str::contains` builds its searcher on every
/// call, and the clauses' patterns against the 8,000-odd ids of the main job (hits, then a
/// second full pass for holes) took about half a second after the last case had run.
fn coverage_at(ids: &[String]) -> Vec<(&'static Clause, Vec<usize>, Vec<&'static str>)> {
    let mut found: std::collections::HashMap<&'static str, Vec<bool>> = std::collections::HashMap::new();
    for &p in CLAUSES.iter().flat_map(|c| c.cases) {
        found.entry(p).or_insert_with(|| {
            let finder = memchr::memmem::Finder::new(p);
            ids.iter().map(|id| finder.find(id.as_bytes()).is_some()).collect()
        });
    }
    CLAUSES
        .iter()
        .map(|c| {
            let per: Vec<&Vec<bool>> = c.cases.iter().map(|p| &found[p]).collect();
            let hits: Vec<usize> = (0..ids.len()).filter(|&i| per.iter().any(|f| f[i])).collect();
            let holes: Vec<&str> = c.cases.iter().zip(&per).filter(|(_, f)| !f.contains(&true)).map(|(p, _)| *p).collect();
            (c, hits, holes)
        })
        .collect()
}

/// The map as text: one block per clause with its case count (and holes).
pub fn render(ids: &[String]) -> String {
    let mut s = String::from("Concord contract map: clause -> the cases that check it\n\n");
    for (c, hits, holes) in coverage(ids) {
        s.push_str(&format!("{:<30} {:>5} cases  [{}]\n    {}\n", c.id, hits.len(), c.source, c.text));
        s.push_str(&format!("    patterns: {}\n", c.cases.join(", ")));
        if !holes.is_empty() {
            s.push_str(&format!("    HOLE: no case matches {}\n", holes.join(", ")));
        }
    }
    s
}

/// The map with each clause's verdicts in a run, as Markdown (`contract.md` of the report).
pub fn markdown(records: &[CaseRecord]) -> String {
    let ids: Vec<String> = records.iter().map(|r| r.id.clone()).collect();
    let mut md = String::from(
        "# Contract map\n\n| clause | cases | passed | failed | unsupported | skipped | holes |\n|---|---|---|---|---|---|---|\n",
    );
    for (c, hits, holes) in coverage_at(&ids) {
        // Statuses counted over the clause's hits (indices into `records`) only.
        let count = |st: Status| hits.iter().filter(|&&i| records[i].status == st).count();
        md.push_str(&format!(
            "| `{}` — {} | {} | {} | {} | {} | {} | {} |\n",
            c.id,
            c.text,
            hits.len(),
            count(Status::Passed),
            count(Status::Failed),
            count(Status::Unsupported),
            count(Status::Skipped),
            if holes.is_empty() { String::new() } else { holes.join(", ") }
        ));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clause_ids_are_unique_and_every_clause_has_patterns() {
        let mut ids: Vec<&str> = CLAUSES.iter().map(|c| c.id).collect();
        ids.sort_unstable();
        let n = ids.len();
        ids.dedup();
        assert_eq!(ids.len(), n, "duplicate clause id");
        assert!(CLAUSES.iter().all(|c| !c.cases.is_empty()));
    }

    #[test]
    fn the_tags_parse_once_each_in_order() {
        let text = "a [clause: x.y] b [clause: p2p.order]\n c [clause: x.y] [clause: shapes]";
        assert_eq!(tagged_clauses(text), vec!["x.y", "p2p.order", "shapes"]);
        let ids = contract_clause_ids();
        assert!(ids.contains(&"async.issue_returns") && ids.contains(&"shapes.equal_split_all_to_all"), "{ids:?}");
    }

    /// The one-searcher-per-pattern coverage is the plain definition: an id hits a clause when
    /// it contains one of the clause's patterns; a pattern no id contains is a hole.
    #[test]
    fn coverage_is_the_plain_substring_rule() {
        let mut ids: Vec<String> = Vec::new();
        for (i, p) in CLAUSES.iter().flat_map(|c| c.cases).enumerate() {
            // Every third pattern is left without a case (a hole); the others get a case or two.
            match i % 3 {
                0 => {}
                1 => ids.push(format!("shm::{p}::ws2")),
                _ => ids.extend([format!("x::{p}"), format!("{p}y")]),
            }
        }
        ids.extend(["shm::unrelated::ws3".to_string(), String::new(), "::".to_string()]);
        for (c, hits, holes) in coverage(&ids) {
            let plain: Vec<&str> = ids.iter().map(String::as_str).filter(|id| c.cases.iter().any(|p| id.contains(p))).collect();
            let plain_holes: Vec<&str> = c.cases.iter().copied().filter(|p| !ids.iter().any(|id| id.contains(p))).collect();
            assert_eq!(hits, plain, "hits of {}", c.id);
            assert_eq!(holes, plain_holes, "holes of {}", c.id);
        }
    }

    #[test]
    fn a_pattern_without_a_case_is_a_hole() {
        let ids = vec!["shm::async::wait_twice::ws2".to_string()];
        let cov = coverage(&ids);
        let wait = cov.iter().find(|(c, _, _)| c.id == "async.wait_semantics").unwrap();
        assert_eq!(wait.1, vec!["shm::async::wait_twice::ws2"]);
        assert!(wait.2.contains(&"async::wait_from_another_thread"));
        assert!(render(&ids).contains("HOLE: no case matches"));
    }
}
