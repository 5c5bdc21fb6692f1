//! The conformance binary's command line as a newcomer meets it (the built-in registry's
//! `concord-conformance`, the same `main` as `tests/conformance.rs`):
//!
//! * `--list` piped into a reader that leaves early (`| head`) ends quietly with exit 141, not
//!   with libtest-mimic's panic and a backtrace;
//! * a name that matches no case says how to list the case ids, with a command that does list
//!   them (`--list` alone lists the groups, `shm::suite::matrix::ws4`);
//! * a failure under a setting (`CONCORD_CASE_TIMEOUT_MS`) prints a rerun line that carries the
//!   setting, and the line's settings and case, run, fail again.
//! * a worker's catalogue built for one world size holds exactly that size's cases.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_concord-conformance");

/// The binary with none of the settings or launcher variables of the test's own environment.
fn bin() -> Command {
    bin_at(BIN)
}

fn bin_at(exe: &str) -> Command {
    let mut c = Command::new(exe);
    for (k, _) in std::env::vars() {
        if k.starts_with("CONCORD_") || matches!(k.as_str(), "RANK" | "WORLD_SIZE" | "OMPI_COMM_WORLD_RANK" | "SLURM_PROCID") {
            c.env_remove(k);
        }
    }
    c.env("CONCORD_LAUNCHER", "off");
    c
}

#[test]
fn list_into_a_reader_that_leaves_early_is_quiet() {
    // 16 k case ids (~900 KB): more than a pipe holds, so the binary writes after the reader left.
    let mut child = bin().env("CONCORD_LIST", "cases").arg("--list").stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert!(first.starts_with("shm::"), "first listed: {first}");
    // The reader is dropped here: the pipe is closed.
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let status = child.wait().unwrap();
    assert!(!err.contains("panicked") && !err.contains("backtrace"), "stderr:\n{err}");
    assert_eq!(status.code(), Some(141), "{status}; stderr:\n{err}");
}

#[test]
fn a_name_that_matches_nothing_says_how_to_list_the_case_ids() {
    let report = tempfile::tempdir().unwrap();
    let out = bin().arg("--report").arg(report.path()).args(["--exact", "shm::nope"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{err}");
    // The hint is a command: `CONCORD_LIST=cases <binary> --list`.
    let hint =
        err.split("list the case ids with `").nth(1).and_then(|s| s.split('`').next()).unwrap_or_else(|| panic!("no hint in: {err}"));
    let mut words = hint.split_whitespace();
    let (var, exe, flag) = (words.next().unwrap(), words.next().unwrap(), words.next().unwrap());
    assert_eq!((var, flag), ("CONCORD_LIST=cases", "--list"), "{hint}");
    assert!(std::path::Path::new(exe).ends_with("concord-conformance"), "{exe}");
    let listed = bin_at(exe).env("CONCORD_LIST", "cases").arg("--list").output().unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.lines().any(|l| l == "shm::all_reduce::out::f32::sum::ws4: test"), "the hint's command lists no case id");
    // The same for a filter.
    let out = bin().arg("--report").arg(report.path()).arg("shm::nope").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("list the case ids with `CONCORD_LIST=cases "), "{err}");
}

#[test]
fn a_rerun_line_carries_the_settings_and_reproduces_the_failure() {
    // 64 MiB moved in the ladder: never done within 1 ms.
    let id = "shm::sizes::all_gather_into_tensor::out::f32::matrix::ws3";
    let report = tempfile::tempdir().unwrap();
    let out = bin().env("CONCORD_CASE_TIMEOUT_MS", "1").arg("--report").arg(report.path()).args(["--exact", id]).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{text}");
    let rerun = text.lines().find_map(|l| l.trim().strip_prefix("rerun: ")).unwrap_or_else(|| panic!("no rerun line in:\n{text}"));
    assert_eq!(rerun, format!("CONCORD_CASE_TIMEOUT_MS=1 cargo xtask conformance --backend shm --exact {id}"));
    // The line's settings and case, run: the same failure (the xtask would build and run this binary).
    let mut again = bin();
    for kv in rerun.split_whitespace().take_while(|w| w.contains('=')) {
        let (k, v) = kv.split_once('=').unwrap();
        again.env(k, v);
    }
    let out = again.arg("--report").arg(report.path()).args(["--exact", id]).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "the rerun line did not reproduce the failure:\n{text}");
    assert!(text.contains(&format!("FAIL {id}")), "{text}");
}

/// The built-in entries carry their backend's `/dev/shm` prefixes to the runner (NCCL's
/// `nccl-`; none for the CPU backends, whose files carry the world's own prefix). (A unit test of
/// the lib until ci9; the lib has `test = false`, so it never ran.)
#[test]
fn entries_carry_the_backends_shm_prefixes() {
    let e = concord_cli::builtin_entries();
    let of = |n: &str| e.iter().find(|b| b.name == n).map(|b| b.foreign_shm.clone()).unwrap_or_else(|| panic!("no entry {n}"));
    assert_eq!(of("nccl"), vec!["nccl-".to_string()]);
    assert!(of("shm").is_empty());
    assert!(of("fake").is_empty());
}

/// A worker builds its catalogue with its world size as a hint
/// (`concord_suites::case::building_for_world_size`, helper main15): the cases of that size are
/// exactly the whole catalogue's, at every world size it has (a generator that drops a size it
/// should keep would lose those cases from every world of that size).
#[test]
fn a_world_size_hint_builds_every_case_of_that_size() {
    use concord_suites::case::building_for_world_size;
    use concord_suites::{catalogue, shape_catalogue, Case};
    fn ids_of<B: concord_core::Backend>(cases: Vec<Case<B>>, ws: usize) -> Vec<String> {
        let mut v: Vec<String> = cases.into_iter().filter(|c| c.world_size == ws).map(|c| c.name).collect();
        v.sort();
        v
    }
    type S = concord_shm::ShmBackend;
    let all = catalogue::<S>();
    let mut sizes: Vec<usize> = all.iter().map(|c| c.world_size).collect();
    sizes.sort();
    sizes.dedup();
    assert!(sizes.len() >= 10, "{sizes:?}");
    for &ws in &sizes {
        let hinted = building_for_world_size(ws, catalogue::<S>);
        assert_eq!(ids_of(hinted, ws), ids_of(all.clone(), ws), "world size {ws}");
    }
    // The hint is gone after the build.
    assert_eq!(catalogue::<S>().len(), all.len());
    let shapes = shape_catalogue::<concord_fake::FakeBackend>();
    for ws in [1, 2, 3, 16] {
        let hinted = building_for_world_size(ws, shape_catalogue::<concord_fake::FakeBackend>);
        assert_eq!(ids_of(hinted, ws), ids_of(shapes.clone(), ws), "fake, world size {ws}");
    }
}
