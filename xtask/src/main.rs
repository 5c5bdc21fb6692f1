//! # xtask
//!
//! **One job:** the project's entry points, so that a fresh clone needs nothing but cargo.
//!
//! * `cargo xtask test` — `cargo fmt --check`, `cargo clippy -D warnings`, then every test of the
//!   workspace through nextest (installed with `cargo install --locked cargo-nextest` when
//!   missing; the conformance matrix as one test per backend × suite × world size), after saying
//!   what is gated and why.
//! * `cargo xtask conformance --backend shm` — the conformance suites with a report.
//! * `cargo xtask mutants` — the mutation campaign: the suites against the shm backend with one
//!   bug each (`concord-mutants`); catch rate, survivors; exits non-zero if any survives.
//! * `cargo xtask bench-harness` — per-case overhead and store-barrier latency.
//! * `cargo xtask bench --backend shm [--op all] -b 8 -e 64M -f 2 -n 20 -w 5 [--ranks N] [--mpi]` —
//!   nccl-tests' table with every timed iteration checked (`concord-bench`, built in release);
//!   also `--plot a.jsonl b.jsonl -o out.svg` and `--compare a.jsonl b.jsonl [--threshold 0.9]`.
//! * `cargo xtask gpu-bundle` — release binaries + run script for a GPU machine with no Rust.
//! * `cargo xtask autotune --backend shm|nccl [--ranks N]` — tune the built-in collective choice sets.
//! * `cargo xtask mpi-diff [--ranks 4] [--seed 1] [--trials 300]` — the differential test: shm,
//!   MPI and the oracle on random inputs, under `mpirun`.
//! * `cargo xtask two-hosts` — ranks in two network namespaces ("hosts") joined by a veth pair:
//!   the mpi matrix and the differential test across them, shm refusing the world
//!   (`scripts/netns/two-hosts.sh`; needs root; skipped with the reason otherwise).
//!
//! Commands that use MPI (`--backend mpi`, `mpi-diff`, `two-hosts`) build with the `mpi` feature
//! and install Debian's `openmpi-bin libopenmpi-dev libclang-dev` with apt-get when missing.
// The one unsafe module is `forward` (signal forwarding to the children the xtask waits for).
#![deny(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

mod args;
mod forward;
mod json;

use args::Cmd;

/// The xtask's errors: one line that says what failed (printed as `Error: ...`, exit 1).
type Result<T> = std::result::Result<T, String>;

macro_rules! bail {
    ($($t:tt)*) => { return Err(format!($($t)*)) };
}

/// `.context(..)` for any displayable error.
trait Context<T> {
    fn context(self, what: &str) -> Result<T>;
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T>;
}
impl<T, E: std::fmt::Display> Context<T> for std::result::Result<T, E> {
    fn context(self, what: &str) -> Result<T> {
        self.map_err(|e| format!("{what}: {e}"))
    }
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| format!("{}: {e}", what()))
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask sits in the workspace").to_path_buf()
}

/// Cargo's target directory (`CARGO_TARGET_DIR`, else `target/` in the workspace), absolute.
fn target_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("target"));
    if target.is_absolute() {
        target
    } else {
        root().join(target)
    }
}

fn run(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    let status = forward::status(cmd.current_dir(root())).with_context(|| format!("could not start {shown}"))?;
    if !status.success() {
        bail!("{shown} failed: {status}");
    }
    Ok(())
}

/// Replaces the xtask with `c` (Unix `exec`; `cargo run` has already replaced cargo with the
/// xtask): the program gets this process id, so a SIGTERM or SIGINT sent to `cargo xtask ...`
/// reaches it and its own cleanup runs (ranks ended, files removed), and its exit status is the
/// command's. A child started with `status()` instead was left running when the xtask was
/// terminated. Returns only if the program could not be started.
fn exec<T>(mut c: Command) -> Result<T> {
    use std::os::unix::process::CommandExt;
    let shown = format!("{c:?}");
    forward::before_exec();
    let e = c.exec();
    bail!("could not start {shown}: {e}")
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn ensure_nextest() -> Result<()> {
    let ok = cargo().args(["nextest", "--version"]).output().map(|o| o.status.success()).unwrap_or(false);
    if !ok {
        eprintln!("xtask: cargo-nextest is missing; installing it with `cargo install --locked cargo-nextest`");
        run(cargo().args(["install", "--locked", "cargo-nextest"]))?;
    }
    Ok(())
}

/// Open MPI (`mpirun`, `mpicc`, headers) and libclang (rsmpi's bindgen) for the `mpi` feature,
/// installed with apt-get when missing (needs root).
fn ensure_mpi() -> Result<()> {
    let sh = |c: &str| Command::new("sh").args(["-c", c]).output().map(|o| o.status.success()).unwrap_or(false);
    // libclang itself (`libclang.so*`, `libclang-<version>.so*`), not `libclang-cpp.so*`, which
    // other packages bring and bindgen cannot load.
    let libclang = "ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/llvm-*/lib/libclang-[0-9]*.so* /usr/lib/*/libclang.so* \
                    /usr/lib/*/libclang-[0-9]*.so* /usr/lib64/libclang.so* /usr/lib64/libclang-[0-9]*.so* 2>/dev/null | grep -q .";
    if sh("command -v mpicc && command -v mpirun") && sh(libclang) {
        return Ok(());
    }
    eprintln!("xtask: the mpi feature needs Open MPI and libclang: installing openmpi-bin libopenmpi-dev libclang-dev with apt-get");
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    run(Command::new("apt-get").args(["install", "-y", "-qq", "openmpi-bin", "libopenmpi-dev", "libclang-dev"]))
        .context("installing Open MPI failed (run as root, or install openmpi-bin libopenmpi-dev libclang-dev)")
}

/// Runs the conformance binary under mpirun, passing its stdout through, and returns the exit
/// code: mpirun's when non-zero, else 1 unless rank 0's closing line says nothing failed (with
/// `--enable-recovery`, Open MPI 4.1's mpirun exits 0 even when every rank exited non-zero).
fn run_mpirun_conformance(mut c: Command) -> Result<i32> {
    use std::io::{BufRead, BufReader, Write};
    let mut child = forward::spawn(c.current_dir(root()).stdout(std::process::Stdio::piped())).context("could not start mpirun")?;
    let mut clean = false;
    let mut aborted = false;
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line.unwrap_or_default();
        let _ = writeln!(std::io::stdout(), "{line}");
        aborted |= line.starts_with("ABORTED:");
        // rank 0's closing line: `N passed, M failed, K skipped`.
        if let Some(rest) = line.split_once(" passed, ").map(|(_, r)| r) {
            clean = rest.starts_with("0 failed");
        }
    }
    let status = forward::wait(&mut child).context("waiting for mpirun")?;
    Ok(match status.code() {
        Some(0) if clean && !aborted => 0,
        Some(0) | None => 1,
        Some(c) => c,
    })
}

/// Builds test target `target` of `package` in release and returns the executable's path (from
/// cargo's JSON messages), so the caller runs it directly.
fn build_test_binary(package: &str, target: &str) -> Result<PathBuf> {
    build_test_binary_with(package, target, &["--release"])
}

/// [`build_test_binary`] with other cargo flags (a profile, features) instead of `--release`.
fn build_test_binary_with(package: &str, target: &str, flags: &[&str]) -> Result<PathBuf> {
    let out = cargo()
        .args(["test", "--no-run", "--quiet", "--message-format=json-render-diagnostics", "-p", package, "--test", target])
        .args(flags)
        .current_dir(root())
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("could not start cargo")?;
    if !out.status.success() {
        bail!("building {package}'s `{target}` test binary failed");
    }
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = json::parse(line) else { continue };
        if msg.get("reason").as_str() == Some("compiler-artifact") && msg.get("target").get("name").as_str() == Some(target) {
            if let Some(exe) = msg.get("executable").as_str() {
                return Ok(PathBuf::from(exe));
            }
        }
    }
    bail!("cargo built no `{target}` executable for {package}")
}

/// Installs MPI if missing, builds the conformance binary with the `mpi` feature (ci profile)
/// and returns its path (for mpirun, which starts it once per rank).
fn build_mpi_conformance() -> Result<PathBuf> {
    ensure_mpi()?;
    run(cargo().args(["build", "--profile", "ci", "--quiet", "-p", "concord-cli", "--features", "mpi", "--bin", "concord-conformance"]))?;
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("target"));
    Ok(if target.is_absolute() { target } else { root().join(target) }.join("ci/concord-conformance"))
}

fn main() {
    if let Err(e) = real_main() {
        eprintln!("Error: {e}");
        std::process::exit(1);
    }
}

/// A directory under the system temp dir, removed when dropped.
struct TempDir(PathBuf);
impl TempDir {
    fn new(prefix: &str) -> std::io::Result<TempDir> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let dir = std::env::temp_dir().join(format!("{prefix}-{}-{nanos:x}", std::process::id()));
        std::fs::create_dir(&dir)?;
        Ok(TempDir(dir))
    }
    fn path(&self) -> &Path {
        &self.0
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn real_main() -> Result<()> {
    match args::parse(std::env::args().skip(1).collect())? {
        Cmd::Test { args, no_lint } => {
            ensure_nextest()?;
            if !no_lint {
                // Style and lints first: they are the cheapest to fail.
                run(cargo().args(["fmt", "--all", "--check"]))?;
                run(cargo().args(["clippy", "--workspace", "--all-targets", "--profile", "ci", "--quiet", "--", "-D", "warnings"]))?;
            }
            // The `ci` cargo profile (optimised): conformance cases run a world of processes each,
            // one nextest test per (backend, suite, world size); JUnit in target/nextest/ci/.
            // `--tests`: the default targets but the examples (which have no tests; clippy
            // --all-targets above still checks that they compile).
            let nextest = ["nextest", "run", "--workspace", "--tests", "--cargo-profile", "ci", "--profile", "ci"];
            // Build first, so the GPU line (from `concord-gpus`, built with the tests) comes before
            // the tests run without the xtask itself depending on a workspace crate.
            run(cargo().args(nextest).arg("--no-run").args(&args))?;
            // Run from the target dir: `cargo run -p concord-harness` would resolve features for
            // that package alone and rebuild it and its dependencies (20 s on the 2-core machine).
            let gpus = target_dir().join("ci").join("concord-gpus");
            if !gpus.exists() {
                run(cargo().args(["build", "--profile", "ci", "--quiet", "-p", "concord-harness", "--bin", "concord-gpus"]))?;
            }
            run(&mut Command::new(&gpus))?;
            run(cargo().args(nextest).arg("--no-fail-fast").args(&args))?;
            run(cargo().args(["test", "--workspace", "--doc", "--quiet", "--profile", "ci"]))
        }
        Cmd::Conformance { backend, ranks, report, exact, jobs, contract, list, filters } => {
            // Build, then run the binary itself: its exit code and its own lines are the answer,
            // without `cargo test`'s "test failed, to rerun pass ..." around them.
            let exact_given = !exact.is_empty();
            if exact_given && !filters.is_empty() {
                bail!("give either --exact case ids or substring filters, not both");
            }
            let mpi = backend.iter().any(|b| b == "mpi");
            if mpi && backend.len() > 1 {
                bail!("--backend mpi runs alone (its ranks are started by mpirun)");
            }
            let mut c = if mpi && !contract {
                let conf = build_mpi_conformance()?;
                // --enable-recovery: a rank that dies does not take the others down with it, so
                // rank 0 names it (its heartbeat stops) and every rank exits non-zero itself.
                let mut c = Command::new("mpirun");
                c.args(["--allow-run-as-root", "--oversubscribe", "--enable-recovery", "-np", &ranks.to_string()]);
                c.arg(conf);
                c
            } else if mpi {
                // The contract map only lists cases: no mpirun, but the registry needs the feature.
                ensure_mpi()?;
                Command::new(build_test_binary_with("concord-cli", "conformance", &["--profile", "ci", "--features", "mpi"])?)
            } else {
                Command::new(build_test_binary("concord-cli", "conformance")?)
            };
            for b in &backend {
                c.args(["--backend", b]);
            }
            if list {
                // The case ids (`--list` alone would list the groups, one per suite × world size).
                c.env("CONCORD_LIST", "cases").arg("--list");
                if let Some(f) = filters.first() {
                    c.arg(f);
                }
                c.current_dir(root());
                return exec(c);
            }
            if contract {
                c.arg("--contract").current_dir(root());
                return exec(c);
            }
            let report = if report.is_absolute() { report } else { root().join(report) };
            c.arg("--report").arg(&report);
            if let Some(j) = jobs {
                c.args(["--jobs", &j.to_string()]);
            }
            // The binary takes one name as libtest does, and any more after `--`.
            let names = if exact.is_empty() { filters } else { exact };
            if !names.is_empty() && !exact_given {
                c.args(&names[..1]);
            }
            if exact_given {
                c.arg("--exact").args(&names[..1]);
            }
            if names.len() > 1 {
                c.arg("--").args(&names[1..]);
            }
            if mpi {
                std::process::exit(run_mpirun_conformance(c)?);
            }
            c.current_dir(root());
            exec(c)
        }
        Cmd::Mutants { mutant, case, jobs, list, sweep, hook, ws, shape, dtype, order, bad_input, skip, legal } => {
            // The `ci` profile (optimised, the target dir CI warms), then the binary itself.
            run(cargo().args([
                "build",
                "--profile",
                "ci",
                "--quiet",
                "-p",
                "concord-mutants",
                "--features",
                "campaign",
                "--bin",
                "concord-mutants",
            ]))?;
            let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("target"));
            let mut c = Command::new(target.join("ci/concord-mutants"));
            for m in &mutant {
                c.args(["--mutant", m]);
            }
            if !case.is_empty() {
                c.arg("--case").args(&case);
            }
            if let Some(j) = jobs {
                c.args(["--jobs", &j.to_string()]);
            }
            if list {
                c.arg("--list");
            }
            match sweep.as_deref() {
                Some("") => {
                    c.arg("--sweep");
                }
                Some(t) => {
                    c.arg(format!("--sweep={t}"));
                }
                None => {}
            }
            for h in &hook {
                c.args(["--hook", h]);
            }
            for n in &ws {
                c.args(["--ws", &n.to_string()]);
            }
            for g in &shape {
                c.args(["--shape", g]);
            }
            for d in &dtype {
                c.args(["--dtype", d]);
            }
            if order {
                c.arg("--order");
            }
            for k in &bad_input {
                c.args(["--bad-input", k]);
            }
            for k in &skip {
                c.args(["--skip", k]);
            }
            if legal {
                c.arg("--legal");
            }
            // The whole campaign (nothing named, no grid) goes on with the legal variants: the
            // catalogue must also pass every backend that is right.
            let whole = mutant.is_empty() && case.is_empty() && sweep.is_none() && hook.is_empty() && ws.is_empty();
            let whole =
                whole && shape.is_empty() && dtype.is_empty() && !order && bad_input.is_empty() && skip.is_empty() && !list && !legal;
            c.current_dir(root());
            if !whole {
                return exec(c);
            }
            // Waited for, so a SIGTERM / SIGINT / SIGHUP to the xtask is forwarded to it (and the
            // legal stage does not start): `status()` left it running, an orphan.
            let status = forward::status(&mut c).context("could not start concord-mutants")?;
            if !status.success() {
                std::process::exit(status.code().unwrap_or(1));
            }
            let mut l = Command::new(target.join("ci/concord-mutants"));
            l.arg("--legal");
            if let Some(j) = jobs {
                l.args(["--jobs", &j.to_string()]);
            }
            l.current_dir(root());
            exec(l)
        }
        Cmd::Forward { argv } => {
            let Some((prog, rest)) = argv.split_first() else { bail!("forward: a program is needed") };
            let st = forward::status(Command::new(prog).args(rest)).with_context(|| format!("could not start {prog}"))?;
            // A child ended by a signal exits as a shell reports it: 128 + the signal.
            std::process::exit(st.code().unwrap_or_else(|| 128 + std::os::unix::process::ExitStatusExt::signal(&st).unwrap_or(0)))
        }
        Cmd::BenchHarness => run(cargo().args(["run", "--release", "--quiet", "-p", "concord-harness", "--bin", "concord-harness-bench"])),
        Cmd::Bench { args } => {
            run(cargo().args(["build", "--release", "--quiet", "-p", "concord-bench", "--bin", "concord-bench"]))?;
            let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("target"));
            let target = if target.is_absolute() { target } else { root().join(target) };
            // Run in the caller's directory, so relative --json / --plot paths mean what they say.
            let mut c = Command::new(target.join("release").join("concord-bench"));
            c.args(&args);
            exec(c)
        }
        Cmd::GpuBundle => run(Command::new("bash").arg("scripts/gpu/bundle.sh")),
        Cmd::MpiDiff { ranks, seed, trials } => {
            ensure_mpi()?;
            let exe = build_test_binary_with("concord-mpi", "differential", &["--profile", "ci", "--features", "mpi"])?;
            // The binary starts itself under mpirun (with a fresh store for shm) and cleans up.
            let status = forward::status(Command::new(exe).args([
                "--ranks",
                &ranks.to_string(),
                "--seed",
                &seed.to_string(),
                "--trials",
                &trials.to_string(),
            ]))
            .context("could not start the differential test")?;
            std::process::exit(status.code().unwrap_or(1));
        }
        Cmd::TwoHosts { ranks_per_host, trials } => {
            let conf = build_mpi_conformance()?;
            let diff = build_test_binary_with("concord-mpi", "differential", &["--profile", "ci", "--features", "mpi"])?;
            let dir = TempDir::new("concord-two-hosts").context("a temp dir")?;
            let script = |args: &[&std::ffi::OsStr]| {
                let mut c = Command::new("bash");
                c.arg(root().join("scripts/netns/two-hosts.sh")).args(["--ranks-per-host", &ranks_per_host.to_string(), "--"]).args(args);
                c
            };
            // 1. The MPI backend's matrix across the hosts (rendezvous on the TCP store on host A).
            println!("xtask two-hosts: 1/3 the mpi conformance matrix across the two hosts");
            let mpi_report = dir.path().join("mpi");
            let code = run_mpirun_conformance(script(&[
                "--enable-recovery".as_ref(),
                conf.as_os_str(),
                "--backend".as_ref(),
                "mpi".as_ref(),
                "--report".as_ref(),
                mpi_report.as_os_str(),
            ]))?;
            if code == 77 {
                println!("xtask two-hosts: skipped (the reason is above)");
                return Ok(());
            }
            if code != 0 {
                bail!("two-hosts: the mpi matrix across hosts failed (exit {code})");
            }
            // 2. shm across the hosts: every case UNSUPPORTED by the named refusal, at once.
            println!("xtask two-hosts: 2/3 shm across the two hosts must refuse the world");
            let shm_report = dir.path().join("shm");
            let st = forward::status(&mut script(&[
                conf.as_os_str(),
                "--backend".as_ref(),
                "shm".as_ref(),
                "--report".as_ref(),
                shm_report.as_os_str(),
            ]))
            .context("could not start scripts/netns/two-hosts.sh")?;
            let json = json::parse(&std::fs::read_to_string(shm_report.join("conformance.json")).unwrap_or_default())
                .context("two-hosts: shm wrote no report")?;
            let cases = json.get("cases").as_array().to_vec();
            let refused = cases
                .iter()
                .filter(|c| {
                    c.get("status").as_str() == Some("unsupported")
                        && c.get("detail").as_str().is_some_and(|d| d.contains("the world spans hosts"))
                })
                .count();
            if !st.success() || cases.is_empty() || refused != cases.len() {
                bail!("two-hosts: shm did not refuse the world on every case ({refused} of {} refused by name; exit {st})", cases.len());
            }
            println!("xtask two-hosts: shm refused all {refused} cases: the world spans hosts");
            // 3. The differential test across the hosts: MPI against the oracle, shm refusing.
            println!("xtask two-hosts: 3/3 the differential test across the two hosts");
            let st = forward::status(
                script(&[diff.as_os_str(), "--hosts".as_ref(), "--trials".as_ref(), trials.to_string().as_ref()])
                    .env("CONCORD_DIFF_STORE", dir.path().join("store"))
                    .env("CONCORD_DIFF_WORLD", format!("hosts{}", std::process::id())),
            )
            .context("could not start scripts/netns/two-hosts.sh")?;
            if !st.success() {
                bail!("two-hosts: the differential test across hosts failed ({st})");
            }
            Ok(())
        }
        Cmd::Autotune { backend, ranks, args } => {
            if backend != "shm" && backend != "nccl" {
                bail!("cargo xtask autotune: the built-in backends that can be tuned are `shm` and `nccl` (got `{backend}`)");
            }
            let r = ranks.to_string();
            let example = ["run", "--profile", "ci", "--quiet", "-p", "concord-autotune", "--example", "tune", "--"];
            run(cargo().args(example).args(["--backend", &backend, "--ranks", &r]).args(&args))
        }
    }
}

#[cfg(test)]
mod manifest_rules {
    use std::path::{Path, PathBuf};

    /// The workspace members, from the root manifest's `members = [...]`.
    fn members() -> Vec<PathBuf> {
        let text = std::fs::read_to_string(super::root().join("Cargo.toml")).unwrap();
        let list = text.split("members = [").nth(1).and_then(|s| s.split(']').next()).expect("members list");
        list.split(',').map(|m| m.trim().trim_matches('"')).filter(|m| !m.is_empty()).map(|m| super::root().join(m)).collect()
    }

    /// Whether the manifest's `[lib]` section has the line `key = false` (spaces ignored).
    fn lib_says_false(manifest: &str, key: &str) -> bool {
        let Some(lib) = manifest.split("\n[lib]").nth(1) else { return false };
        let section = lib.split("\n[").next().unwrap_or("");
        section.lines().any(|l| l.replace(' ', "") == format!("{key}=false"))
    }

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                rust_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    /// A lib with `test = false` (no unit-test binary: nextest builds and lists none) must hold
    /// no unit test: one there is never run (two were, unseen, until helper ci9 moved them into
    /// integration tests). The `[lib]` sections also say `bench = false`, so that clippy's
    /// `--all-targets` does not check the lib a second time in test mode for nothing.
    #[test]
    fn a_lib_without_unit_tests_has_no_test_code() {
        let mut bad = Vec::new();
        let mut untested = 0;
        for m in members() {
            let manifest = std::fs::read_to_string(m.join("Cargo.toml")).unwrap();
            if !lib_says_false(&manifest, "test") {
                continue;
            }
            untested += 1;
            if !lib_says_false(&manifest, "bench") {
                bad.push(format!("{}: [lib] has test = false but not bench = false", m.display()));
            }
            let mut files = Vec::new();
            rust_files(&m.join("src"), &mut files);
            for f in files {
                let text = std::fs::read_to_string(&f).unwrap();
                if text.contains("#[cfg(test)]") || text.contains("#[test]") {
                    bad.push(format!("{}: unit test code in a lib with test = false (never run): move it to tests/", f.display()));
                }
            }
        }
        assert!(untested >= 4, "only {untested} libs with test = false found: the manifest parsing is broken");
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }
}
