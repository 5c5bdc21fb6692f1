//! The realistic bugs this backend can be built with (option `p2pcoll_bug=<name>`, read at
//! init): each is a one-place change an author of a p2p collective library plausibly makes.
//! `None` is the correct backend.

/// One bug (or none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    None,
    /// Ring chunks of `count / ws` elements: the `count % ws` trailing elements are dropped.
    RingDropsRemainder,
    /// reduce_scatter reuses all_reduce's ring schedule: rank r ends owning chunk r + 1.
    ReduceScatterOwnerShift,
    /// The call-description exchange sends only its fixed 256-word header: a description longer
    /// than that (a coalesced list of ~60 tensors or more) arrives cut, and the call fails.
    DescCutAtHeader,
    /// reduce's tree sends each partial in the tensor's own dtype (half the bytes of f16 / bf16
    /// on the wire): a partial of several ranks is rounded at every tree level.
    ReduceTreePartialsInDtype,
    /// Tree virtual rank `(rank - root) % ws` in unsigned arithmetic (`wrapping_sub`): right
    /// only when ws is a power of two or rank >= root.
    TreeVrankUnsigned,
    /// Subgroups send their internal messages over the *world's* internal channel (peers
    /// translated to world ranks), untagged: a subgroup's op and an op of the world (or of an
    /// overlapping group) in flight at once can take each other's messages.
    GroupsShareWorldChannel,
    /// scatter: the root sends chunk `(dst - root) mod ws` (the virtual rank) to rank `dst`.
    ScatterChunkByVrank,
    /// all_to_all: output offsets computed from the *input* splits.
    AllToAllOutOffsetsFromInput,
    /// permute_tensor sends to the rank whose `src_dst` entry is this rank (the inverse).
    PermuteInverse,
    /// avg as `premul_sum(1 / ws)`: each contribution scaled (integers divided) before the sum.
    AvgAsPremulReciprocal,
    /// f16 / bf16 partial sums rounded to the dtype at every ring hop.
    HalfSumRoundedPerStep,
    /// Float min / max by plain `<` / `>`: `min(+0, -0)` is whichever came first, and a NaN
    /// arriving from a peer is dropped.
    MinMaxIgnoresZeroSign,
    /// Integer avg divides the wide (i64) sum, not the sum wrapped to the dtype.
    IntAvgOfUnwrappedSum,
    /// u64 min / max compared as the wide i64 bits (signed): values >= 2^63 are "negative".
    U64MinMaxSigned,
    /// Internal collective messages on the user's point-to-point channel (no separate group).
    SharedP2pChannel,
    /// The gather root receives rank r's part at slot `(r - root) mod ws` (its virtual rank).
    GatherSlotByVrank,
    /// broadcast pipelines segments of `SEGMENT` elements, counted as `count / SEGMENT` (at
    /// least one): the tail past the last whole segment is never sent.
    BcastSegmentsDropTail,
}

impl Bug {
    pub const ALL: [(&'static str, Bug); 17] = [
        ("ring_drops_remainder", Bug::RingDropsRemainder),
        ("reduce_scatter_owner_shift", Bug::ReduceScatterOwnerShift),
        ("reduce_tree_partials_in_dtype", Bug::ReduceTreePartialsInDtype),
        ("desc_cut_at_header", Bug::DescCutAtHeader),
        ("tree_vrank_unsigned", Bug::TreeVrankUnsigned),
        ("groups_share_world_channel", Bug::GroupsShareWorldChannel),
        ("scatter_chunk_by_vrank", Bug::ScatterChunkByVrank),
        ("a2a_out_offsets_from_input", Bug::AllToAllOutOffsetsFromInput),
        ("permute_inverse", Bug::PermuteInverse),
        ("avg_as_premul_reciprocal", Bug::AvgAsPremulReciprocal),
        ("half_sum_rounded_per_step", Bug::HalfSumRoundedPerStep),
        ("minmax_ignores_zero_sign", Bug::MinMaxIgnoresZeroSign),
        ("int_avg_of_unwrapped_sum", Bug::IntAvgOfUnwrappedSum),
        ("u64_minmax_signed", Bug::U64MinMaxSigned),
        ("shared_p2p_channel", Bug::SharedP2pChannel),
        ("gather_slot_by_vrank", Bug::GatherSlotByVrank),
        ("bcast_segments_drop_tail", Bug::BcastSegmentsDropTail),
    ];

    /// The bug named by the option's value (`None` when absent); an unknown name is an error.
    pub fn parse(v: Option<&str>) -> Result<Bug, String> {
        match v {
            None | Some("") | Some("none") => Ok(Bug::None),
            Some(name) => Bug::ALL.iter().find(|(n, _)| *n == name).map(|(_, b)| *b).ok_or_else(|| {
                format!("option p2pcoll_bug={name}: not a bug of this backend (known: {})", Bug::ALL.map(|(n, _)| n).join(", "))
            }),
        }
    }
}

/// The start of a failure's rerun line for the backend built with `bug` (empty: the correct
/// one), the whole catalogue if `full` (`P2PCOLL_FULL=1`), or CI's slice: the environment that
/// rebuilds the same backend and catalogue, then the conformance test binary's one-case rerun
/// (`{profile}`: the cargo profile flag, filled in by the harness). The case id is appended.
pub fn rerun_prefix(bug: &str, full: bool) -> String {
    let mut env = Vec::new();
    if !bug.is_empty() {
        env.push(format!("P2PCOLL_BUG={bug}"));
    }
    if full {
        env.push("P2PCOLL_FULL=1".to_string());
    }
    env.push("cargo test{profile} -p concord-example-p2pcoll --test conformance -- --exact".to_string());
    env.join(" ")
}
