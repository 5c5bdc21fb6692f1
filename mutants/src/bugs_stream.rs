//! Mutants of the failure-path clauses (`faults.*`): the campaign's reference launch-based
//! backend ([`crate::stream`]) with one realistic bug each ([`StreamBug`]), run against the
//! cases that inject faults at its hooks (`device_faults::*`). Before these, the four clauses
//! were exempt: their hooks exist only on a launch-based backend, so every shm wrapper got
//! UNSUPPORTED there and the cases only ever ran on a GPU.
//!
//! The stream backend is another backend type than [`crate::Mutant`]: its catalogue is the
//! fault cases it exists for (`device_faults`), and under the `campaign` feature (the
//! `concord-mutants` binary) the whole catalogue, which the reference must pass
//! (`concord-mutants --stream-reference`).

use crate::campaign::Spec;
use crate::stream::{Stream, StreamBug, StreamLegal, BUG_OPTION, LEGAL_OPTION};
use crate::Bug;
use concord_core::Backend;
use concord_suites::{BackendEntry, Case};

/// The stream backend's cases: the fault cases in CI; every case under `campaign`.
pub fn cases<B: Backend>() -> Vec<Case<B>> {
    #[cfg(feature = "campaign")]
    {
        concord_suites::catalogue::<B>()
    }
    #[cfg(not(feature = "campaign"))]
    {
        concord_suites::suites::device_faults::cases::<B>()
    }
}

/// The correct stream backend (`stream::...` case ids).
pub fn reference_entry() -> BackendEntry {
    BackendEntry::new::<Stream>("stream", 0, cases::<Stream>).with_rerun("cargo xtask mutants --stream-reference --case")
}

/// Not a bug of the shm wrapper: the stream mutants are a backend of their own ([`Stream`]),
/// chosen by their entry's option; [`crate::Mutant`] never builds this.
#[derive(Default)]
struct OtherBackend;
impl Bug for OtherBackend {}

pub(crate) fn spec(bug: StreamBug, clause: &'static str, what: &'static str, catchers: &'static [&'static str]) -> Spec {
    let name = bug.name();
    let entry = BackendEntry::new::<Stream>(name, 0, cases::<Stream>)
        .with_option(BUG_OPTION, name)
        .with_rerun(format!("cargo xtask mutants --mutant {name} --case"));
    Spec { name, clause, what, catchers, entry, make: || Box::new(OtherBackend) }
}

/// A legal variant of the stream reference (run by `--legal`, like the shm wrappers of
/// [`crate::legal`]): the reference with one [`StreamLegal`] choice made otherwise.
pub(crate) fn legal_spec(
    name: &'static str,
    choice: StreamLegal,
    clause: &'static str,
    what: &'static str,
    catchers: &'static [&'static str],
) -> Spec {
    let entry = BackendEntry::new::<Stream>(name, 0, cases::<Stream>)
        .with_option(LEGAL_OPTION, choice.name())
        .with_rerun(format!("cargo xtask mutants --legal --mutant {name} --case"));
    Spec { name, clause, what, catchers, entry, make: || Box::new(OtherBackend) }
}

pub fn catalogue() -> Vec<Spec> {
    vec![
        spec(
            StreamBug::AbortReleasesOk,
            "faults.aborted_ops_fail",
            "stream: the abort opens the stalled stream's gate and the op behind it completes Ok (its event fired after the abort)",
            &["device_faults::abort_fails_ops_in_flight::"],
        ),
        spec(
            StreamBug::AbortWaitsForLaunch,
            "faults.aborted_ops_fail",
            "stream: the abort takes the library's lock first, so it waits for an enqueue in progress (a wait ends at the launching op's deadline)",
            &["device_faults::abort_not_behind_a_launch::"],
        ),
        spec(
            StreamBug::HeaderWaitUnbounded,
            "faults.absent_peer_bounded",
            "stream: the header exchange waits for the peers' headers until they come or an abort (the op deadline counts from the launch)",
            &["device_faults::stall_before_header::", "device_faults::stall_before_first_header::"],
        ),
        spec(
            StreamBug::AbortedKernelDone,
            "faults.absent_peer_bounded",
            "stream: a kernel waiting for an absent peer, ended by the abort, counts as done (the op reports Ok)",
            &["device_faults::no_launch::", "device_faults::stall_after_header::"],
        ),
        spec(
            StreamBug::CopiesOnTheStream,
            "faults.copies_not_behind_collectives",
            "stream: upload / download are queued on the collectives' stream: they wait for every op issued before them",
            &["device_faults::copies_not_behind_collectives::"],
        ),
        spec(
            StreamBug::LocalFailureUnsent,
            "faults.local_failure_named_everywhere",
            "stream: a local failure after begin returns its error without sending the op's header (the peers time out)",
            &["device_faults::local_failure_after_begin::ws2"],
        ),
        spec(
            StreamBug::LocalFailureAborts,
            "faults.local_failure_named_everywhere",
            "stream: a local failure after begin sends its failed header, then aborts the communicator (the next op fails)",
            &["device_faults::local_failure_after_begin::ws1"],
        ),
        spec(
            StreamBug::PeerFailureAsTimeout,
            "faults.local_failure_named_everywhere",
            "stream: a peer's failed header is reported as a timeout of the op (and aborts), not as the peer's named failure",
            &["device_faults::local_failure_after_begin::ws2", "device_faults::fail_before_header::"],
        ),
    ]
}
