//! The mutation campaign's guard under `cargo xtask test`: every mutant of the catalogue must
//! be caught by the cases its catcher hints name (one test per mutant, `mutants::<name>_is_caught`,
//! running only those cases and stopping at the first that fails and also fails alone in a fresh
//! world: `campaign::catch_alone`, so a hint that catches only after the hints before it does not
//! count). A change to the suites that
//! lets a mutant through, or a hint that no longer names a catching case, fails CI, not only the
//! next `cargo xtask mutants` (which runs the whole catalogue against every mutant). A mutant
//! whose hinted cases mostly wait (stall-bound cases, or a deadline the bug makes them wait out)
//! is named `mutants::stall::<name>_is_caught` (nextest runs those beside the CPU-bound tests). A few mutants must moreover fail by a rank's own typed check
//! (`reported`), never a crash or a hang. Also the clause rules (`concord_mutants::coverage`).

use concord_harness::runner::Pool;
use concord_mutants::campaign::{self, run_mutant, run_mutant_in, CaseIds, Spec};
use concord_suites::case::Load;
use std::sync::OnceLock;

/// Mutants whose catching message is a snapshot (`tests/snapshots/<name>.snap`, insta), one per
/// kind of failure whose wording audit1 mended, so a change of what a failure says is reviewed:
/// its head (the case, the backend, the world size), the runner's where-line if any, the
/// culprit's line (the first failure: backend, op, variant, dtype, world size, rank, and for
/// values the first bad index with got / expected) and the rerun line. Run-to-run details
/// (pids, world ids, milliseconds) are redacted; the bystanders' lines and stderr tails are left
/// out (their order and timing vary).
const MESSAGES: &[&str] = &[
    // a value mismatch of an in-place op: `op=all_reduce variant=inplace`, not the method name
    "inplace_all_reduce_flushes_subnormals",
    // a value mismatch on a subgroup: the group's rank and size, then the world's
    "group_root_is_world_rank",
    // an ordering check on a subgroup (a barrier completed early)
    "subgroup_barrier_at_once",
    // a wrong error kind (bad input accepted) on a subgroup
    "review10_subgroup_rooted_ops_group_fallback",
    // a resource check (works left counted) on a bad-input row: the row's call, not its name
    "failed_works_stay_counted",
];

/// The lines of `message` a [`MESSAGES`] snapshot keeps, redacted.
fn snapshot_text(message: &str) -> String {
    let lines: Vec<&str> = message.lines().collect();
    let mut keep = Vec::new();
    keep.extend(lines.first().copied());
    keep.extend(lines.iter().copied().find(|l| l.starts_with("  backend=")));
    // The first rank that reported (a peer given no time to report reads "no outcome;
    // abandoned", which says nothing of the wording under review).
    keep.extend(lines.iter().copied().find(|l| l.starts_with("  rank ") && l.contains(": backend=")));
    keep.extend(lines.iter().copied().find(|l| l.trim_start().starts_with("rerun:")));
    let mut out = String::new();
    for l in keep {
        out.push_str(&redact(l));
        out.push('\n');
    }
    out
}

/// `pid N`, `(world ID)` and `after N ms` replaced by placeholders (as `harness/tests/runner.rs`
/// redacts its snapshots).
fn redact(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while !rest.is_empty() {
        let digits = |s: &str| s.bytes().take_while(u8::is_ascii_digit).count();
        let (take, with) = if let Some(r) = rest.strip_prefix("pid ").filter(|r| digits(r) > 0) {
            (4 + digits(r), "pid [PID]")
        } else if let Some(r) = rest.strip_prefix("after ").filter(|r| digits(r) > 0 && r[digits(r)..].starts_with(" ms")) {
            (6 + digits(r) + 3, "after [N] ms")
        } else if let Some(n) = rest.strip_prefix("(world p").and_then(|r| r.find(')')).filter(|_| rest.len() > 8) {
            (8 + n + 1, "(world [WORLD])")
        } else {
            let c = rest.chars().next().expect("not empty");
            out.push(c);
            rest = &rest[c.len_utf8()..];
            continue;
        };
        out.push_str(with);
        rest = &rest[take..];
    }
    out
}

/// Mutants whose catching failure must be a rank's typed check (`reported`).
const REPORTED: &[&str] = &[
    "sum_is_max_f32",
    "premul_sum_ignores_factor",
    "inplace_broadcast_returns_copy",
    "truncates_indivisible_reduce_scatter",
    "writes_past_reduce_scatter_out",
    "progress_ends_at_issue",
    // review: a false moves_data = false declaration is named by the caps::moves_data probe.
    "review_declares_no_data",
];

/// Mutants caught at the world's setup (a wrong rank, a refused world within the declared
/// maximum), before any case body: the catching failure must be `setup` on every rank it names,
/// and its message must name the clause.
const AT_SETUP: &[(&str, &str)] = &[
    ("review_ranks_reversed", "init.rank_is_the_launchers"),
    ("review_init_refuses_odd_ws", "init.declared_world_sizes"),
    ("left20_nan_policy_per_rank", "init.same_capabilities"),
];

/// Mutants whose hinted cases are light but wait out a deadline under the bug (seconds of wall
/// time, little CPU): scheduling only, like a stall-bound case.
const CAUGHT_AT_A_DEADLINE: &[&str] = &[
    // alloc1: the failing rank's op never reaches its peers: they wait out the fault case's 1 s
    // op deadline.
    "alloc1_alloc_before_issue",
    "a2a_splits_exchanged_at_issue",
    "completes_only_in_wait",
    "drop_drains_unwaited",
    "drop_finishes_pending_ops",
    "drop_waits_inplace_unpinned",
    "failed_work_never_completed",
    "first_call_tuning_ignores_deadline",
    "group_first_op_connects_at_issue",
    "issue_blocks_all_reduce",
    "issue_blocks_all_to_all",
    "large_all_reduce_rendezvous_at_issue",
    "large_send_blocks_at_issue",
    "recv_blocks_at_issue",
    "recv_queued_behind_collectives",
    "send_queued_behind_collectives",
    "send_window_blocks_at_issue",
    "wait_ignores_deadline",
    // hunt18: a zero-element recv enqueued as a send hangs both ranks until the case deadline.
    "wild_zero_byte_recv_as_send",
    // hunt24: an all_reduce of 1..ws-1 elements never completes; its wait ends at the deadline.
    "wild_accl_short_allreduce_freezes",
    // hunt22: a one-shot all_reduce whose peer's input holds a zero spins until the deadline.
    "wild_flashinfer_neg_zero_float_compare",
    // hunt29: after a subgroup's all_reduce the world's rendezvous never meets (keys differ).
    "wild_store_exchange_global_seq",
    // hunt31: a group construction that never completes (names salted apart, a reused name's
    // contributions discarded) and a lazy init waiting for a member that issues nothing end at
    // the bug's own 15 s deadline.
    "wild_group_name_salt_registered",
    "wild_reused_group_id_memo",
    "wild_lazy_init_first_op",
    // hunt32: the sixth group made from one parent takes a parent's tag that its edge exchange
    // holds; every rank's new_group ends at the bug's own 2 s wait.
    "wild_nbc_tag_into_reserved",
    // review-c: the first op whose work never completes without a wait is polled for up to 5 s.
    "review3_completes_only_in_wait_but_all_reduce",
    // hunt27: a wait that ignores its deadline (send / recv, coalesced ops) is caught when the
    // peer's op deadline ends it; a peer's failure hidden as pending sleeps out the wait's.
    "wild_p2p_unwatched",
    "wild_coalesced_unwatched",
    "wild_error_on_failing_rank_only",
    // review5: an earlier op that completes only with the next one is caught once it stays
    // pending 4 s after its peer finished it.
    "review5_completion_waits_for_next_op",
    // review8: the same on the sharded ops (caught 4 s after the peer finished), and a group's
    // waits held to 10 s whatever the caller asked (each round waits it out).
    "review8_sharded_ops_wait_for_next",
    "review8_group_waits_own_default",
    // p2pfail: a drop held by a send its receiver never takes (the child's rank 0 drops after
    // the bug's 15 s); a withdrawn send's receive waits out 5 s; a ring of large messages
    // deadlocks until the case's wait ends.
    "p2pfail_drop_flushes_unwaited_sends",
    "p2pfail_dropped_send_withdrawn",
    "p2pfail_ungrouped_ring_deadlocks",
    // review14: one engine for every communicator deadlocks until the bug's 15 s queue wait
    // ends (the p2p case, the collectives' case); a serialised second waiter waits out the
    // helper's 5 s wait.
    "review14_process_wide_engine",
    "review14_process_wide_collective_engine",
    "review14_waiters_serialised",
    // hunt33: a first send that leaves only at its sender's wait, and send / recv works marked
    // complete only in wait: the pair is polled for up to 5 s, then waited.
    "wild_first_send_at_wait",
    "wild_gloo_p2p_completed_only_in_wait",
    // hunt34: a world whose last node of 8 is short never completes its init (the bootstrap
    // deadlock ends at the bug's own 2 s wait); its only catcher is a 33-rank world.
    "wild_nccl_uneven_nodes_bootstrap",
    // hunt39: a second waiter that sleeps on an event only the progressing thread gets wakes at
    // its own 5 s deadline.
    "wild_worker_wait_wakes_one",
];

/// Mutants whose bug is itself a race: it shows only when a peer is still busy (reading an input,
/// forwarding a chunk) at the moment the caller's early completion lets it move on, so a real
/// backend with the bug also fails only most of the time. Their hints are tried up to
/// [`RACE_TRIES`] times, each in a fresh world, and the test passes at the first catch; each
/// entry says the catch rate of one run, measured under load (a rate that falls is a suite
/// change that weakened the case: fix the case, never raise the tries).
const RACY: &[(&str, &str)] = &[
    // The root returns once its peers announced the call; its peers read its 4 MiB input after
    // (39 / 40 single runs caught at load 12).
    ("review13_root_completes_on_arrival", "39/40 at load 12, 26/30 at load 31"),
    // A broadcast tree's relay forwards from its result 20 ms after its own op completed; its
    // caller rewrites the result right after its wait (29/30 single runs caught at load 31).
    ("wild_superlu_tree_forward_tested", "29/30 at load 31"),
    // A received message rewritten by the backend's own thread after the wait returned: the
    // case looks once after a settle (flake1: 87/90 single runs caught under load).
    ("review3_recv_rewritten_late", "87/90 under load (flake1)"),
    // A send retried after 500 ms overtakes a later one: the mutant's own retry races a machine
    // stall the case cannot see (flake1: 39/40 single runs caught after the store handshake).
    ("send_retry_overtaken", "39/40 under load (flake1)"),
];

/// How often a [`RACY`] mutant's hints run before its test fails.
const RACE_TRIES: usize = 3;

/// The random programs' power, pinned: each mutant with the program that catches it (the
/// programs were written without these bugs in mind; the first five survived the whole
/// hand-written catalogue when their hunts wrote them). A generator change that loses one fails
/// here; point it at another program only if `cargo xtask mutants --mutant NAME --case ...`
/// shows one still catches it.
const PROGRAMS_CATCH: &[(&str, &str)] = &[
    ("eight_byte_view_read_at_base", "programs::p3::ws2"),
    ("in_flight_all_gathers_merged", "programs::p1::ws2"),
    ("coalesced_fusion_buffer_1mib", "programs::p1::ws2"),
    ("large_min_max_as_sum", "programs::p2::ws3"),
    ("recv_matches_any_peer", "programs::p2::ws7"),
    ("reduce_mid_root_drops_upper", "programs::p3::ws4"),
    ("p2p_swapped_in_flight", "programs::p3::ws3"),
    ("subgroup_peer_as_world_rank", "programs::p0::ws2"),
    ("group_root_is_world_rank", "programs::p0::ws4"),
    ("byte_gather_view_offset_dropped", "programs::p2::ws2"),
    ("minmax_view_reads_parent_start", "programs::p0::ws1"),
    ("coalesced_minmax_drops_nan", "programs::p3::ws2"),
    // hunt7: caught by these programs before any case of their own (a 65537-element 1-byte
    // all_reduce; NaN through a 3-rank reduce_scatter or reduce).
    ("narrow_int_pass_counted_as_i32", "programs::p0::ws3"),
    ("ring_min_max_drops_nan", "programs::p1::ws3"),
    // review20: premul_sum past 1,031 elements runs only in the random programs.
    ("review20_avg_tail_unscaled", "programs::p1::ws7"),
];

/// The worlds of the mutants that only need a verdict (`campaign::verdict_pool`): a caught
/// mutant's test ended on the default second of settling (27 of 176 tests). The `REPORTED`
/// mutants keep the default: every rank's own check must have reported, so their peers get the
/// full settle time.
fn verdict_pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(campaign::verdict_pool)
}

/// The corruption sweep's grid, pinned where it had holes (`cargo xtask mutants --sweep`): each
/// sweep target with a world size's case that catches it. Before the size ladder's grid slice
/// (`sizes::grid_calls`), no case of that world size checked that op's output of that size class
/// on that rank (for reduce / gather: rooted there); before the group grid (`sizes::group_grid_case`,
/// the fused one), no case checked it on a group of that shape.
const SWEEP_CATCH: &[(&str, &str)] = &[
    ("all_reduce:middle:large", "sizes::all_reduce::out::f32::grid::ws8"),
    ("all_reduce_:first:large", "sizes::all_reduce::inplace::f32::grid::ws4"),
    ("all_reduce_coalesced:first:large", "sizes::all_reduce::coalesced::f32::grid::ws16"),
    ("all_gather_into_tensor_out:last:large", "sizes::all_gather_into_tensor::outbuf::f32::grid::ws8"),
    ("reduce_scatter_tensor_coalesced:middle:medium", "sizes::reduce_scatter_tensor::coalesced::f32::grid::ws6"),
    ("broadcast:last:large", "sizes::broadcast::out::f32::grid::ws3"),
    ("scatter:middle:large", "sizes::scatter::out::f32::grid::ws7"),
    ("reduce:middle:tiny", "sizes::reduce::out::f32::grid::ws6"),
    ("reduce:first:medium", "sizes::reduce::out::f32::grid::ws2"),
    ("gather:first:tiny", "sizes::gather::out::f32::grid::ws4"),
    // The last three holes of the world grid (outputs below 16 at 16 ranks need uneven splits).
    ("all_to_all_single:first:tiny", "sizes::all_to_all_single::uneven::f32::grid::ws16"),
    ("all_to_all_single:middle:tiny", "sizes::all_to_all_single::uneven::f32::grid::ws16"),
    ("all_to_all_single:last:tiny", "sizes::all_to_all_single::uneven::f32::grid::ws16"),
    // Subgroup cells (`HOOK:POSITION:CLASS:SHAPE`, `--shape`), holes before the group grid.
    ("all_reduce:first:small:strided", "sizes::all_reduce::out::f32::group_grid::ws7"),
    ("all_reduce:middle:large:no_zero", "sizes::all_reduce::out::f32::group_grid::ws7"),
    ("all_reduce:first:small:singleton", "sizes::all_reduce::out::f32::group_grid::ws7"),
    ("fused_all_gather_matmul:middle:large:unsorted", "fused::all_gather_matmul::dim0::f32::group_grid::ws7"),
    ("fused_matmul_reduce_scatter:first:tiny:singleton", "fused::matmul_reduce_scatter::dim0::f32::sum::group_grid::ws7"),
    // Dtype-grid cells (`--dtype`, `HOOK:every:any@DTYPE`), holes before the f64 fused cases and
    // the matrix's dtype grid at 6, 7 and 16 ranks.
    ("fused_all_gather_matmul:every:any@f64", "fused::all_gather_matmul::dim0::f64::exact::ws2"),
    ("fused_matmul_reduce_scatter:every:any@f64", "fused::matmul_reduce_scatter::dim1::f64::sum::exact::ws5"),
    ("all_reduce:every:any@u16", "all_reduce::out::dtypes::ws6"),
    ("broadcast:every:any@i64", "broadcast::out::dtypes::ws7"),
    ("permute_tensor:every:any@u8", "permute_tensor::out::dtypes::ws16"),
    ("recv:every:any@f16", "send_recv::outbuf::dtypes::ws16"),
    ("fused_matmul_reduce_scatter:every:any@bf16", "fused::matmul_reduce_scatter::dim0::bf16::sum::exact::ws16"),
    // Order-grid cells (`--order`, `HOOK:POSITION:CLASS+order`: a float all_reduce reduced in
    // another rank order on one rank). Before the identical grid (`identical::`), only two narrow
    // cases compared the ranks' results (f32 / f64 sum, plain variants, 3 to 5 ranks, up to
    // 4,099 elements): 27 of 96 cells at 3 and 8 ranks were caught.
    ("all_reduce_coalesced_:middle:large+order", "identical::all_reduce::ws8"),
    ("all_reduce:last:tiny+order", "identical::all_reduce::ws6"),
    ("all_reduce_coalesced:first:medium+order", "identical::all_reduce::ws3"),
];

/// The bad-input grid (`cargo xtask mutants --bad-input all`, `sweep_bad`), pinned where it had
/// holes: each target with a world size's grid case (`bad_input_grid`) that catches it. Before
/// the grid cases, no case gave the op that kind at one rank or sixteen, with the bad argument on
/// the root or a middle rank alone, or called the same op again after the refusal.
const BAD_INPUT_CATCH: &[(&str, &str)] = &[
    ("all_reduce:first:missed!unsupported_dtype", "bad_input::grid::all_reduce::ws1"),
    ("broadcast:any:poisoned!bad_root", "bad_input::grid::broadcast::ws2"),
    ("gather:middle:missed!dtype_mismatch", "bad_input::grid::gather::ws3"),
    ("reduce_scatter_tensor_out:middle:missed!zero_dim", "bad_input::grid::reduce_scatter_tensor_out::ws3"),
    ("scatter:root:missed!shape_mismatch", "bad_input::grid::scatter::ws16"),
];

/// The legal variants (`concord_mutants::legal`, `cargo xtask mutants --legal`), each pinned on
/// the cases that read its declaration: every case MUST pass (a failure is a suite failing a
/// backend that is right), at least `passed` of them must PASS (the pin cannot hold by skipping)
/// and exactly `unsupported` must be UNSUPPORTED (declared gaps and world sizes, no more).
const LEGAL_PINS: &[(&str, usize, usize, &[&str])] = &[
    (
        "legal_nan_ignore",
        4,
        0,
        &[
            "caps::nan_minmax::f32::ws3",
            "caps::nan_minmax::bf16::ws3",
            "all_reduce::out::f32::max::ws3::special",
            "reduce_scatter_tensor::out::f16::min::ws3",
        ],
    ),
    (
        "legal_int_avg_floor",
        4,
        0,
        &["caps::int_avg::i8::ws3", "caps::int_avg::i64::ws3", "all_reduce::out::i32::avg::ws3", "reduce::out::i16::avg::ws3"],
    ),
    ("legal_round_every_step", 2, 0, &["all_reduce::out::f16::sum::ws8::random", "reduce_scatter_tensor::out::bf16::avg::ws3::random"]),
    (
        "legal_alias_correct",
        6,
        0,
        &[
            "caps::aliasing::f32::ws3",
            "reuse::aliasing::all_gather_out_contains_input::ws2",
            "reuse::aliasing::reduce_scatter_out_inside_input::ws2",
            "reuse::aliasing::all_gather_out_overlaps_input_misaligned::ws2",
            "bad_input::grid::all_gather_into_tensor_out::ws3",
            "bad_input::grid::reduce_scatter_tensor_out::ws3",
        ],
    ),
    (
        "legal_gaps",
        5,
        3,
        &[
            "caps::gaps_refused::u16::ws2",
            "caps::gaps_refused::f32::ws2",
            "permute_tensor::out::f32::ws2",
            // Declared gaps read by the case runner (the meta's call), a bad-input row, the
            // grid's rows, a case mixing dtypes and a refusal of a declared-gap call.
            "bad_input::grid::permute_tensor::ws2",
            "bad_input::permute_wrong_length::ws2",
            "bad_input::grid::all_reduce::ws2",
            "p2p::in_order_mixed_dtypes::ws2",
            "bad_input::refused_buffer_reused_in_place::ws2",
        ],
    ),
    (
        "legal_no_cross_rank",
        2,
        1,
        &["bad_input::all_reduce_shape_mismatch::ws2", "bad_input::grid::all_reduce::ws2", "bad_input::all_reduce_bitwise_on_float::ws2"],
    ),
    (
        "legal_no_subgroups",
        2,
        3,
        &[
            // risks: `new_group` itself, refused by name (clause caps.subgroups_declared).
            "caps::subgroups::ws2",
            "programs::p0::ws2",
            "bad_input::new_group_empty::ws2",
            "p2p::group_and_world_messages_apart::ws2",
            "subgroup::halves::all_reduce::out::f32::sum::ws2",
        ],
    ),
    (
        "legal_nccl_like",
        4,
        2,
        &[
            "caps::nan_minmax::f32::ws3",
            "caps::int_avg::i32::ws3",
            "all_reduce::out::f16::sum::ws8::random",
            "all_reduce::out::i32::avg::ws3",
            // concurrent_communicators = false: the two crossing cases are UNSUPPORTED.
            "async::communicators_progress_apart::ws3",
            "reuse::world_and_group_crossed::all_reduce::out::ws3",
        ],
    ),
    (
        "legal_no_half",
        2,
        1,
        &[
            "caps::gaps_refused::f16::ws2",
            "fused::scaled_matmul_reduce_scatter::dim0::f32::tensor::exact::ws2",
            "all_reduce::out::f16::sum::ws2",
        ],
    ),
    (
        "legal_fused_pipelined",
        4,
        0,
        &[
            "fused::all_gather_matmul::dim0::f32::exact::ws3",
            "fused::all_gather_matmul::dim1::bf16::exact::ws3",
            "fused::all_gather_matmul::dim0::f32::in_flight_twice::ws3",
            "fused::all_gather_matmul::dim0::f32::odd_rows::ws3",
        ],
    ),
    ("legal_max_ws_8", 1, 1, &["all_reduce::out::f32::sum::ws8", "all_reduce::out::f32::sum::ws16"]),
    (
        "legal_slow",
        4,
        0,
        &[
            "async::pending_until_peers_arrive::ws4",
            "async::many_outstanding_waited_out_of_order::ws2",
            "async::completes_without_wait::ws2",
            "async::registry_counts_unwaited_work::ws2",
        ],
    ),
    // helper gapgate: one narrow declared gap each. Passed: cases that carried a check on the
    // gapped call incidentally and now take a supported one (the bad-input table's usability
    // check, state, p2p, async, the grid); unsupported: cases that need exactly the gapped call
    // (the runner's gate on the meta, the autotuner's tuned instance, a fused op's decomposition).
    (
        "legal_gap_fault_vehicle",
        6,
        3,
        &[
            "async::wait_twice::ws2",
            "bad_input::gather_root_out_of_range::ws2",
            "bad_input::op_mismatch_all_reduce_vs_broadcast::ws2",
            "state::results_kept_100_calls::ws2",
            "p2p::send_behind_pending_collective::ws2",
            "async::dropped_work_still_runs_for_its_peers::ws2",
            "all_reduce::out::f32::sum::ws2",
            "reuse::outputs_kept::all_reduce::out::ws2",
            "autotune::seed::one_op::ws2",
        ],
    ),
    (
        "legal_gap_all_gather_f64",
        2,
        2,
        &[
            "bad_input::grid::all_gather_into_tensor_out::ws2",
            "all_gather_into_tensor::out::f32::ws2",
            "all_gather_into_tensor::out::f64::ws2",
            "fused::all_gather_matmul::dim0::f64::exact::ws2",
        ],
    ),
    // The built-in autotuner set skips its gather+broadcast choice on this gap (the tuner reads
    // the declared gaps): autotune::builtin passes.
    (
        "legal_gap_broadcast_in_place",
        3,
        1,
        &[
            "bad_input::broadcast_src_differs_on_one_rank::ws3",
            "broadcast::out::f32::ws2",
            "bad_input::broadcast_inplace_src_differs_on_one_rank::ws3",
            "autotune::builtin::ws2",
        ],
    ),
    // docs/review-e.md: each pinned on the cases it failed before its check was fixed (the
    // nonroot one passed from the start: its pins are the rooted ops' value cases).
    (
        "legal_review_zero_sum_plus",
        4,
        0,
        &[
            "all_reduce::out::f32::sum::ws2::special",
            "all_reduce::out::f16::sum::ws3::special",
            "all_reduce::out::bf16::avg::ws2::special",
            "programs::p5::ws2",
        ],
    ),
    ("legal_review_nonroot_garbage", 2, 0, &["reduce::out::f32::sum::ws3", "gather::out::f32::ws3"]),
    ("legal_review_empty_at_input", 2, 0, &["all_to_all_single::out::f32::ws2", "views::all_to_all_single::out::f64::ws2"]),
    // review21 (mutants/src/legal_review.rs): a cross-rank mismatch ends in a timeout, declared.
    ("legal_review21_no_cross_rank_late", 1, 1, &["state::bad_input_100_then_usable::ws2", "state::dropped_works_100_then_usable::ws2"]),
    // review23: dropped groups' descriptors closed 700 ms per group on a teardown thread.
    ("legal_review23_slow_teardown", 1, 0, &["state::groups_each_without_a_rank::ws3"]),
    // review24: a world-prefixed status page unlinked 500 ms after the drop, on a thread of its own.
    (
        "legal_review24_deferred_release",
        2,
        0,
        &["faults::alloc_fails_at_issue::all_reduce::ws2", "faults::new_group_failure_leaves_no_file::ws2"],
    ),
    // review24: the failing rank's out-of-memory at issue reported as the op's `aborted` error.
    (
        "legal_review24_oom_one_error",
        2,
        0,
        &["faults::alloc_fails_at_issue::all_reduce::ws2", "faults::alloc_fails_at_issue::broadcast::ws2"],
    ),
    // review21: the stream reference whose peers of a local failure get `aborted`.
    (
        "legal_review21_stream_peer_aborted",
        5,
        0,
        &[
            "device_faults::local_failure_after_begin::ws1",
            "device_faults::local_failure_after_begin::ws2",
            "device_faults::local_failure_after_begin::bystander::ws4",
            "device_faults::fail_before_header::ws2",
            "device_faults::local_failure_on_group::ws3",
        ],
    ),
    // helper legal3: freedoms the contract leaves (mutants/src/legal3.rs).
    (
        "legal3_sum_order",
        4,
        0,
        &[
            "all_reduce::out::f32::sum::ws5::random",
            "all_reduce::out::f32::sum::ws5::special",
            "reduce_scatter_tensor::out::f64::avg::ws3::random",
            "identical::all_reduce::ws5",
        ],
    ),
    (
        "legal3_late_flag",
        3,
        0,
        &["async::completes_without_wait::every_op::ws2", "async::wait_zero_polls::ws2", "async::failed_work_reports_completed::ws2"],
    ),
    (
        "legal3_out_of_order",
        3,
        0,
        &[
            "async::many_outstanding_waited_out_of_order::ws4",
            "async::sub_second_wait_waits_its_deadline::ws2",
            "p2p::in_flight_in_order::sizes::n4::ws2",
        ],
    ),
    (
        "legal3_terse_errors",
        3,
        0,
        &["bad_input::all_reduce_shape_mismatch::ws2", "bad_input::broadcast_src_out_of_range::ws2", "bad_input::grid::all_reduce::ws2"],
    ),
    (
        "legal3_composed",
        5,
        0,
        &[
            // The false failure the variant found: a barrier built from an all_reduce must be
            // recorded in flight as a barrier (clause progress.recorded).
            "async::peer_never_joins_op_recorded_in_flight::barrier::ws2",
            "async::barrier_synchronises::ws3",
            "broadcast::out::f32::ws3",
            "reduce::out::f32::sum::ws3",
            "gather::out::f32::ws3",
            "bad_input::broadcast_src_out_of_range::ws2",
        ],
    ),
    ("legal3_rounding_unspecified", 1, 1, &["all_reduce::out::f16::sum::ws8::random", "numerics::round_once::f16::ws3"]),
    ("legal3_two_passes", 2, 0, &["all_reduce::inplace::f32::sum::ws3", "reduce_scatter_tensor::out::bf16::sum::ws4::random"]),
];

/// The op deadline of the stream backend's worlds (`concord_mutants::stream`): its mutants are
/// caught by fault cases that wait out op deadlines, so they run with a short one.
const STREAM_OP_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(1500);

/// The worlds of the stream backend and its mutants (short op deadline, verdict only).
fn stream_pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        use concord_harness::runner::PoolConfig;
        Pool::new(PoolConfig { op_timeout: STREAM_OP_TIMEOUT, settle: campaign::VERDICT_SETTLE, ..PoolConfig::from_env() })
    })
}

fn is_stream(name: &str) -> bool {
    concord_mutants::stream::StreamBug::parse(name).is_some()
}

fn spec(name: &str) -> Spec {
    concord_mutants::catalogue().into_iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no mutant {name}"))
}

fn main() {
    let specs = concord_mutants::catalogue();
    let mut entries: Vec<_> = specs.iter().map(|s| s.entry.clone()).collect();
    entries.push(concord_mutants::sweep::worker_entry());
    entries.push(concord_mutants::sweep_bad::worker_entry());
    entries.extend(concord_mutants::legal::catalogue().into_iter().map(|s| s.entry));
    entries.push(concord_mutants::bugs_stream::reference_entry());
    concord_suites::run::dispatch_child(&entries);

    let args = libtest_mimic::Arguments::from_args();
    let mut trials = Vec::new();
    // Every mutant is the same backend type, so one listing of the catalogue serves them all
    // (ids without the `<mutant>::` prefix).
    let cases = specs[0].entry.cases();
    let prefix = format!("{}::", specs[0].name);
    let ids: Vec<&str> = cases.iter().map(|c| c.id.strip_prefix(&prefix).unwrap_or(&c.id)).collect();
    let index = CaseIds::new(&ids);
    // nextest runs one test per process (`--exact NAME`): a `*_is_caught` test needs the hints of
    // its own mutant only, not the hint search of all ~500 (about 15 ms of CPU per process, 535
    // processes in CI). Any other run (a listing, a filter, `--exact` of another trial) builds
    // every trial as before.
    let exact_mutant: Option<&str> = match (&args.filter, args.exact) {
        (Some(f), true) => {
            f.strip_prefix("mutants::").map(|r| r.strip_prefix("stall::").unwrap_or(r)).and_then(|r| r.strip_suffix("_is_caught"))
        }
        _ => None,
    };
    for s in &specs {
        if exact_mutant.is_some_and(|m| m != s.name) {
            continue;
        }
        let idx = index.hinted(s.catchers);
        let stall = CAUGHT_AT_A_DEADLINE.contains(&s.name) || is_stream(s.name) || idx.iter().any(|&i| cases[i].load == Load::Stall);
        let only: Vec<String> = idx.iter().map(|&i| format!("{}::{}", s.name, ids[i])).collect();
        let name = s.name;
        let test = if stall { format!("mutants::stall::{name}_is_caught") } else { format!("mutants::{name}_is_caught") };
        trials.push(libtest_mimic::Trial::test(test, move || {
            if only.is_empty() {
                return Err(format!("{name}: no case id contains one of its catcher hints {:?}", spec(name).catchers).into());
            }
            let once = || {
                // A snapshot's rank line needs every failing rank's report: the default settle.
                if REPORTED.contains(&name) || MESSAGES.contains(&name) {
                    run_mutant(&spec(name), &only)
                } else if is_stream(name) {
                    run_mutant_in(stream_pool(), &spec(name), &only)
                } else {
                    run_mutant_in(verdict_pool(), &spec(name), &only)
                }
            };
            let tries = if RACY.iter().any(|(m, _)| *m == name) { RACE_TRIES } else { 1 };
            let mut found = once();
            for _ in 1..tries {
                if found.caught.is_some() {
                    break;
                }
                found = once();
            }
            let Some(catch) = found.caught else {
                let aside: String = found.set_aside.iter().map(|(case, why)| format!("\n  {case}: {}", why.says())).collect();
                return Err(format!(
                    "{name} survived the {} cases its catcher hints name{} (a suite change let it through, or the hints are stale: \
                     `cargo xtask mutants --mutant {name}` runs the whole catalogue against it){aside}",
                    only.len(),
                    if tries > 1 { format!(" in {tries} runs") } else { String::new() }
                )
                .into());
            };
            if let Some((_, clause)) = AT_SETUP.iter().find(|(m, _)| *m == name) {
                if catch.kinds.is_empty() || catch.kinds.iter().any(|k| *k != "setup") || !catch.message.contains(clause) {
                    return Err(format!(
                        "{name}: {} failed, but not at setup naming {clause}: {:?}\n{}",
                        catch.case, catch.kinds, catch.message
                    )
                    .into());
                }
            }
            if REPORTED.contains(&name) && (catch.kinds.is_empty() || catch.kinds.iter().any(|k| *k != "reported")) {
                return Err(
                    format!("{name}: {} failed, but not by a reported check: {:?}\n{}", catch.case, catch.kinds, catch.message).into()
                );
            }
            if MESSAGES.contains(&name) {
                let mut settings = insta::Settings::clone_current();
                settings.set_prepend_module_to_snapshot(false);
                settings.set_snapshot_path("snapshots");
                settings.bind(|| insta::assert_snapshot!(name, snapshot_text(&catch.message)));
            }
            Ok(())
        }));
    }
    // A race's extra tries are named per mutant: a name that is no longer in the catalogue (a
    // renamed mutant) would leave its successor with one try and this list with a dead entry.
    let known: Vec<&'static str> = specs.iter().map(|s| s.name).collect();
    trials.push(libtest_mimic::Trial::test("mutants::racy_names_are_mutants", move || {
        let stale: Vec<&str> = RACY.iter().map(|(m, _)| *m).filter(|m| !known.contains(m)).collect();
        if stale.is_empty() {
            Ok(())
        } else {
            Err(format!("RACY names no mutant of the catalogue: {stale:?}").into())
        }
    }));
    // The control of the stream mutants: the reference stream backend passes every fault case
    // (a case that failed it too would catch nothing).
    trials.push(libtest_mimic::Trial::test("mutants::stall::stream_reference_passes_device_faults", || {
        use concord_harness::verdict::Verdict;
        let entry = concord_mutants::bugs_stream::reference_entry();
        let mut bad = Vec::new();
        let cases: Vec<_> = entry.cases().into_iter().filter(|c| c.id.starts_with("stream::device_faults::")).collect();
        if cases.len() < 9 {
            return Err(format!("the stream backend lists {} device_faults cases, expected 9 or more", cases.len()).into());
        }
        // Four worlds side by side: the cases mostly wait out op deadlines.
        let run = |c: &concord_suites::run::CaseInfo| {
            let (verdict, message, _, _) = concord_suites::run::run_case_fresh_in(stream_pool(), &entry, c);
            (!matches!(verdict, Verdict::Passed)).then(|| format!("{}: {verdict:?}\n{message}", c.id))
        };
        for failed in campaign::side_by_side(cases.iter().collect(), 4, run, |_| {}).into_iter().flatten() {
            bad.push(failed);
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(bad.join("\n").into())
        }
    }));
    for &(name, case) in PROGRAMS_CATCH {
        trials.push(libtest_mimic::Trial::test(format!("mutants::programs_catch::{name}"), move || {
            let found = run_mutant_in(verdict_pool(), &spec(name), &[format!("{name}::{case}")]);
            if found.cases_run != 1 {
                return Err(format!("{name}: the catalogue has no case {case}").into());
            }
            match found.caught {
                Some(_) => Ok(()),
                None => Err(format!("{name} survived {case}: the random programs lost the power this test pins").into()),
            }
        }));
    }
    for &(target, case) in SWEEP_CATCH {
        trials.push(libtest_mimic::Trial::test(format!("mutants::sweep::{target}::{case}"), move || {
            let t = concord_mutants::sweep::Target::parse(target).ok_or_else(|| format!("bad sweep target {target}"))?;
            let found = run_mutant_in(verdict_pool(), &concord_mutants::sweep::spec(&t), &[format!("sweep::{case}")]);
            if found.cases_run != 1 {
                return Err(format!("the catalogue has no case {case}").into());
            }
            if found.caught.is_none() {
                return Err(format!(
                    "sweep cell {target} survived {case}: the size grid lost the power this test pins\n  rerun: cargo xtask mutants --sweep {target} --case sweep::{case}"
                )
                .into());
            }
            // The control: the same path with the value left right must pass, so the catch is
            // the wrong element's.
            match run_mutant_in(verdict_pool(), &concord_mutants::sweep::control(&t), &[format!("sweep::{case}")]).caught {
                None => Ok(()),
                Some(c) => Err(format!("sweep cell {target}: {case} fails its control too (not the wrong element):\n{}", c.message).into()),
            }
        }));
    }
    for &(target, case) in BAD_INPUT_CATCH {
        trials.push(libtest_mimic::Trial::test(format!("mutants::bad_input_grid::{target}::{case}"), move || {
            use concord_mutants::sweep_bad;
            let t = sweep_bad::Target::parse(target).ok_or_else(|| format!("bad bad-input target {target}"))?;
            let id = format!("{}::{case}", sweep_bad::NAME);
            let found = run_mutant_in(verdict_pool(), &sweep_bad::spec(&t), std::slice::from_ref(&id));
            if found.cases_run != 1 {
                return Err(format!("the catalogue has no case {case}").into());
            }
            if found.caught.is_none() {
                return Err(format!(
                    "bad-input cell {target} survived {case}: the bad-input grid lost the power this test pins\n  rerun: cargo xtask mutants --sweep '{target}' --case {id}"
                )
                .into());
            }
            match run_mutant_in(verdict_pool(), &sweep_bad::control(&t), &[id]).caught {
                None => Ok(()),
                Some(c) => Err(format!("bad-input cell {target}: {case} fails its control too:\n{}", c.message).into()),
            }
        }));
    }
    trials.push(libtest_mimic::Trial::test("mutants::sweep_rules::bad_input_offender_is_the_rule_tables", || {
        // The grid places a verdict by the rank the core rule table names: pinned against the
        // table itself, so a change of its wording cannot move every cell silently.
        use concord_core::{validate_all, CallDesc, CallOp, Capabilities, DType, TensorDesc, Variant};
        use concord_mutants::sweep_bad::{offender, Target};
        let caps = Capabilities::full(64);
        let call = |r: usize, root: usize, cols: usize| {
            let mut d = CallDesc::new(CallOp::Broadcast, Variant::Out, r);
            d.inputs.push(TensorDesc::new(DType::F32, &[6, cols]));
            d.root = Some(root);
            d
        };
        let detail = |calls: Vec<CallDesc>| validate_all(&calls, &caps).map(|_| String::new()).unwrap_or_else(|e| e.detail);
        let checks = [
            // Every rank's root out of range: the first rank that breaks it.
            offender(&detail((0..3).map(|r| call(r, 3, 1)).collect()), 2) == 0,
            // The middle rank's own root out of range.
            offender(&detail((0..3).map(|r| call(r, if r == 1 { 3 } else { 0 }, 1)).collect()), 0) == 1,
            // The last rank's shape differs (a cross-rank rule): the rank that differs from rank 0.
            offender(&detail((0..3).map(|r| call(r, 0, 1 + usize::from(r == 2))).collect()), 0) == 2,
            // Rank 0 alone differs: the table names rank 1.
            offender(&detail((0..3).map(|r| call(r, 0, 1 + usize::from(r == 0))).collect()), 2) == 1,
            offender("send peer 1 of rank 1 is not another rank of 0..2", 1) == 1,
            offender("no rank named", 5) == 5,
            Target::parse("broadcast:root:missed!bad_root").is_some_and(|t| t.label() == "broadcast:root:missed!bad_root"),
            Target::parse("all_reduce:root:missed!bad_root").is_none(), // all_reduce has no root
            Target::parse("all_reduce:root:missed!shape_mismatch").is_none(),
            Target::parse("all_reduce:any:missed!shape_mismatch").is_none(), // `any` is `poisoned`'s
            Target::parse("broadcast:root:missed!bad_rot").is_none(),
        ];
        match checks.iter().position(|ok| !ok) {
            None => Ok(()),
            Some(i) => Err(format!("bad-input grid rule #{i} does not hold").into()),
        }
    }));
    for &(name, passed, unsupported, pinned) in LEGAL_PINS {
        trials.push(libtest_mimic::Trial::test(format!("mutants::legal::{name}_passes"), move || {
            let legal = concord_mutants::legal::catalogue();
            let s = legal.iter().find(|s| s.name == name).ok_or_else(|| format!("no legal variant {name}"))?;
            let only: Vec<String> = pinned.iter().map(|c| format!("{name}::{c}")).collect();
            let r = campaign::run_legal(s, &only, 2);
            let ran = r.passed + r.unsupported + r.failed.len();
            if ran != pinned.len() {
                return Err(format!("{name}: {ran} of its {} pinned cases exist in the catalogue", pinned.len()).into());
            }
            if let Some((_, _, msg)) = r.failed.first() {
                return Err(format!("{name} is a correct backend, but the catalogue fails it (a false failure):\n{msg}").into());
            }
            if r.passed < passed || r.unsupported != unsupported {
                return Err(format!(
                    "{name}: {} passed and {} unsupported, expected at least {passed} passed and exactly {unsupported} unsupported",
                    r.passed, r.unsupported
                )
                .into());
            }
            Ok(())
        }));
    }
    trials.push(libtest_mimic::Trial::test("mutants::hunt26::ported_rules_match_their_sources", || {
        // hunt26's two ported rules, against the examples their threads give: openxla/xla PR
        // #46248 (the pass's own test, two 4-cycles: device 0 zeroed) and meta-pytorch/torchcomms
        // PR #3213 (at 6 ranks, ranks 2 and 3 never synchronise with 4 and 5).
        use concord_mutants::bugs_hunt26::{NcclxNvlBarrierSkipsPeers, XlaPermuteCycleLastBackEdge};
        let two_cycles = XlaPermuteCycleLastBackEdge::zeroed(&[2, 3, 4, 5, 6, 7, 0, 1]);
        let one_cycle = XlaPermuteCycleLastBackEdge::zeroed(&[1, 2, 3, 0]);
        let known = NcclxNvlBarrierSkipsPeers::known(6);
        let unknown: Vec<(usize, usize)> = (0..6).flat_map(|r| (0..6).map(move |q| (r, q))).filter(|&(r, q)| !known[r][q]).collect();
        let pow2 = NcclxNvlBarrierSkipsPeers::known(8).iter().all(|row| row.iter().all(|&k| k));
        match (two_cycles == [0], one_cycle.is_empty(), unknown == [(2, 4), (2, 5), (3, 4), (3, 5)], pow2) {
            (true, true, true, true) => Ok(()),
            got => {
                Err(format!("two cycles {two_cycles:?}, one cycle {one_cycle:?}, unsynchronised {unknown:?}, 8 ranks all known: {got:?}")
                    .into())
            }
        }
    }));
    sweep_trials(&mut trials);
    // The hint index finds what a plain substring search finds, in the same order.
    let plain_ids: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    trials.push(libtest_mimic::Trial::test("mutants::hint_index_matches_a_plain_search", move || {
        let ids: Vec<&str> = plain_ids.iter().map(String::as_str).collect();
        let index = CaseIds::new(&ids);
        for s in concord_mutants::catalogue().iter().map(|s| s.catchers).chain([&[""][..], &["::ws2", "ws3"][..], &["no such case"][..]]) {
            let mut taken = vec![false; ids.len()];
            let mut plain = Vec::new();
            for pat in s {
                for (i, id) in ids.iter().enumerate() {
                    if !taken[i] && id.contains(pat) {
                        taken[i] = true;
                        plain.push(i);
                    }
                }
            }
            if index.hinted(s) != plain {
                return Err(format!("hints {s:?}: the index and a plain search disagree").into());
            }
        }
        Ok(())
    }));
    // Every mutant names a clause id of the contract (core/src/backend.rs), and every clause id
    // has a mutant or a reasoned exemption (`concord_mutants::coverage`).
    trials.push(libtest_mimic::Trial::test("mutants::cli::a_case_id_that_names_no_case_is_an_error", || {
        // `--case` with a typo (here the conformance binary's `shm::` prefix) ran 0 cases and
        // printed the mutant as SURVIVED; it is an error naming the id and the right form.
        let specs = vec![spec("sum_is_max_f32")];
        let ok = vec!["sum_is_max_f32::all_reduce::out::f32::sum::ws2".to_string()];
        if let Some(e) = campaign::unknown_case(&specs, &ok) {
            return Err(format!("a real case id refused: {e}").into());
        }
        let typo = vec!["sum_is_max_f32::shm::all_reduce::out::f32::sum::ws2".to_string()];
        match campaign::unknown_case(&specs, &typo) {
            Some(e)
                if e.contains("no case of mutant `sum_is_max_f32`") && e.contains("`sum_is_max_f32::all_reduce::out::f32::sum::ws2`") =>
            {
                Ok(())
            }
            other => Err(format!("typo not refused with the right form: {other:?}").into()),
        }
    }));
    trials.push(libtest_mimic::Trial::test("mutants::every_clause_has_a_mutant_or_an_exemption", || {
        let problems = concord_mutants::coverage::problems(&concord_mutants::catalogue());
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("\n").into())
        }
    }));
    trials.push(libtest_mimic::Trial::test("mutants::a_label_outside_the_contract_is_a_problem", || {
        // The rule itself: a free-text label, and a clause with neither mutant nor exemption.
        let mut specs = concord_mutants::catalogue();
        specs[0].clause = "values";
        let p = concord_mutants::coverage::problems(&specs);
        if !p.iter().any(|m| m.contains("names `values`")) {
            return Err(format!("a free-text clause label was not reported: {p:?}").into());
        }
        let only: Vec<_> = concord_mutants::catalogue().into_iter().filter(|s| s.clause != "barrier").collect();
        let p = concord_mutants::coverage::problems(&only);
        if !p.iter().any(|m| m.contains("clause barrier has no mutant and no exemption")) {
            return Err(format!("a clause without mutant or exemption was not reported: {p:?}").into());
        }
        Ok(())
    }));
    let code = if libtest_mimic::run(&args, trials).has_failed() { 101 } else { 0 };
    Pool::global().shutdown();
    verdict_pool().shutdown();
    stream_pool().shutdown();
    std::process::exit(code);
}

/// The sweep's own rules: shapes, targets, and when a failing case counts as a cell's catch
/// (`sweep::catch_in`: alone in a fresh world, and its control passes).
fn sweep_trials(trials: &mut Vec<libtest_mimic::Trial>) {
    use concord_mutants::sweep::{self, attribute, catch_in, control, has_shape, impossible_in_groups, targets_of, SetAside, Target};
    trials.push(libtest_mimic::Trial::test("mutants::sweep_rules::shapes_of_the_group_layouts", || {
        // The world, and a group as large as it in its order, are `world` only.
        let checks = [
            has_shape("world", &[0, 1, 2], 3),
            !sweep::SHAPES[1..].iter().any(|g| has_shape(g, &[0, 1, 2], 3)),
            has_shape("strided", &[0, 2, 4, 6], 7) && !has_shape("no_zero", &[0, 2, 4, 6], 7),
            has_shape("strided", &[1, 3, 5], 7) && has_shape("no_zero", &[1, 3, 5], 7),
            has_shape("unsorted", &[6, 1, 4], 7) && has_shape("no_zero", &[6, 1, 4], 7) && !has_shape("strided", &[6, 1, 4], 7),
            has_shape("unsorted", &[2, 1, 0], 3), // a reversed world is unsorted
            has_shape("singleton", &[3], 7) && !has_shape("singleton", &[0], 1),
            !has_shape("no_zero", &[4], 7), // a singleton is its own shape
            !has_shape("strided", &[0, 1, 2], 7) && !has_shape("unsorted", &[0, 1, 2], 7),
        ];
        match checks.iter().position(|ok| !ok) {
            None => Ok(()),
            Some(i) => Err(format!("shape check #{i} does not hold").into()),
        }
    }));
    trials.push(libtest_mimic::Trial::test("mutants::sweep_rules::dtype_targets", || {
        use concord_core::DType;
        let t = Target::parse("broadcast:every:any@i64").ok_or("dtype target")?;
        let fused_int = Target::parse("fused_all_gather_matmul:every:any@i32").ok_or("fused target")?;
        let grid = sweep::dtype_targets(&DType::ALL);
        let checks = [
            t.dtype == Some(DType::I64) && t.label() == "broadcast:every:any@i64" && t.class == sweep::ANY_SIZE,
            Target::parse("broadcast:every:any@i65").is_none(),
            Target::parse("all_reduce:first:tiny:strided@bf16").is_some_and(|g| g.in_groups() && g.dtype == Some(DType::BF16)),
            sweep::refused_dtype(&fused_int) && sweep::impossible(&fused_int, 2),
            !sweep::refused_dtype(&Target::parse("fused_all_gather_matmul:every:any@f64").ok_or("f64")?),
            grid.len() == sweep::HOOKS.len() * DType::ALL.len() && grid.iter().all(|g| g.pos == sweep::EVERY && g.shape == "world"),
            grid.iter().all(|g| Target::parse(&g.label()).as_ref() == Some(g)),
        ];
        match checks.iter().position(|ok| !ok) {
            None => Ok(()),
            Some(i) => Err(format!("dtype target check #{i} does not hold").into()),
        }
    }));
    trials.push(libtest_mimic::Trial::test("mutants::sweep_rules::targets_parse_with_and_without_a_shape", || {
        let t = Target::parse("all_reduce:middle:small").ok_or("world target")?;
        let g = Target::parse("gather:first:tiny:unsorted").ok_or("group target")?;
        let singleton = |s: &str| Target::parse(s).is_some_and(|t| impossible_in_groups(&t));
        let checks = [
            (t.shape, t.label().as_str()) == ("world", "all_reduce:middle:small"),
            g.in_groups() && g.label() == "gather:first:tiny:unsorted",
            Target::parse("gather:first:tiny:ring").is_none(),
            Target::parse("gather:first:tiny:unsorted:x").is_none(),
            targets_of("strided").len() == sweep::HOOKS.len() * sweep::POSITIONS.len() * sweep::CLASSES.len(),
            singleton("all_reduce:middle:tiny:singleton") && singleton("recv:first:tiny:singleton"),
            !singleton("recv:first:tiny:strided"),
        ];
        match checks.iter().position(|ok| !ok) {
            None => Ok(()),
            Some(i) => Err(format!("target check #{i} does not hold").into()),
        }
    }));
    trials.push(libtest_mimic::Trial::test("mutants::sweep_rules::order_targets", || {
        let t = Target::parse("all_reduce_coalesced:middle:large+order").ok_or("order target")?;
        let grid = sweep::order_targets();
        let checks = [
            t.effect == "order" && t.label() == "all_reduce_coalesced:middle:large+order",
            Target::parse("all_reduce:middle:large").is_some_and(|v| v.effect == "value"),
            Target::parse("all_reduce:middle:large+reorder").is_none(),
            // Two operands add alike in either order; only the all_reduce family returns one
            // result on every rank.
            sweep::impossible(&t, 2) && !sweep::impossible(&t, 3),
            Target::parse("broadcast:first:tiny+order").is_some_and(|b| sweep::impossible(&b, 8)),
            grid.len() == sweep::ORDER_HOOKS.len() * sweep::POSITIONS.len() * sweep::CLASSES.len(),
            grid.iter().all(|g| Target::parse(&g.label()).as_ref() == Some(g) && g.effect == "order"),
            sweep::spec(&t).clause == "values.identical_on_every_rank",
        ];
        match checks.iter().position(|ok| !ok) {
            None => Ok(()),
            Some(i) => Err(format!("order target check #{i} does not hold").into()),
        }
    }));
    // A cell's case list by exact ids (without the `sweep::` prefix).
    fn cases_of(t: &Target, ids: &[&str]) -> Result<Vec<concord_suites::run::CaseInfo>, String> {
        let all = sweep::spec(t).entry.cases();
        ids.iter()
            .map(|id| all.iter().find(|c| c.id == format!("sweep::{id}")).cloned().ok_or_else(|| format!("the catalogue has no case {id}")))
            .collect()
    }
    const F32: &str = "all_reduce::out::f32::sum::ws2";
    const BF16_MAX: &str = "all_reduce::out::bf16::max::ws2";
    trials.push(libtest_mimic::Trial::test("mutants::sweep_control::a_catch_passes_its_control", || {
        let t = Target::parse("all_reduce:first:tiny").ok_or("target")?;
        let got = catch_in(verdict_pool(), &sweep::spec(&t), &control(&t), cases_of(&t, &[F32])?);
        if got != (Some(F32.to_string()), 1, vec![]) {
            return Err(format!("{F32} against all_reduce:first:tiny: {got:?}, not caught at once with its control passing").into());
        }
        Ok(())
    }));
    trials.push(libtest_mimic::Trial::test("mutants::sweep_control::a_case_failing_without_the_corruption_is_set_aside", || {
        // The control here is a mutant that fails the bf16 max case by itself (bf16 max computes
        // min): that case must be set aside and the next case become the catch.
        let t = Target::parse("all_reduce:first:tiny").ok_or("target")?;
        let got = catch_in(verdict_pool(), &sweep::spec(&t), &spec("max_is_min_bf16"), cases_of(&t, &[BF16_MAX, F32])?);
        let want = (Some(F32.to_string()), 2, vec![(BF16_MAX.to_string(), SetAside::FailsWithoutCorruption)]);
        if got != want {
            return Err(format!("got {got:?}, want {want:?}").into());
        }
        Ok(())
    }));
    trials.push(libtest_mimic::Trial::test("mutants::sweep_control::a_case_passing_alone_is_set_aside", || {
        // As the `real` side, the control itself: the case passes when rerun alone.
        let t = Target::parse("all_reduce:first:tiny").ok_or("target")?;
        let case = cases_of(&t, &[F32])?.remove(0);
        match attribute(verdict_pool(), &control(&t), &control(&t), &case, false) {
            Err(SetAside::OnlyAfterEarlierCases) => Ok(()),
            other => Err(format!("got {other:?}, want OnlyAfterEarlierCases").into()),
        }
    }));
}
