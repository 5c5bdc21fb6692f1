//! The command line, parsed by hand (no clap: the xtask is the first thing a fresh clone
//! compiles, before anything else can start, so it depends on nothing but std).

use std::path::PathBuf;

pub const USAGE: &str = "\
Concord's project automation

Usage: cargo xtask <COMMAND> [OPTIONS]

Commands:
  test [--no-lint] [NEXTEST ARGS...]
        fmt check, clippy -D warnings, then every test of the workspace through cargo-nextest
        (--no-lint skips fmt and clippy; the rest goes to `cargo nextest run`, e.g. a filter)
  conformance [--backend NAME]... [--ranks N] [--report DIR] [--exact ID]... [--jobs N] [--contract] [--list] [FILTER]...
        the conformance suites on a backend (shm by default; fake, nccl, mpi) with a report
        (default target/concord-report); --ranks: the ranks mpirun starts for --backend mpi
        (default 4); --jobs: worlds side by side (default: what the machine can run);
        --contract prints the contract map instead of running; --list lists the case ids
        (those a FILTER matches) instead of running
  mutants [--mutant NAME]... [--case ID...] [--jobs N] [--list]
          [--sweep [HOOK:POSITION:CLASS[:SHAPE][@DTYPE]]] [--hook HOOK]... [--ws N]... [--shape SHAPE]...
          [--dtype DTYPE|all]... [--order] [--bad-input KIND|all]... [--skip PATTERN]... [--legal]
        the mutation campaign: every mutant of concord-mutants against the catalogue,
        then (with no mutant or case named) every legal variant, which must pass it;
        --legal: only the legal variants (--mutant NAME: those named);
        --sweep: the corruption grid (hook x rank position x size class x world size);
        --shape strided|no_zero|singleton|unsorted: its subgroup cells instead;
        --dtype: its dtype grid instead (hook x dtype x world size, every rank, every size);
        --order: its order grid instead (an all_reduce reduced in another order on one rank);
        --bad-input: its bad-input grid instead (a hook's refusals of one kind misreported);
        --skip: leave out the cases whose id contains PATTERN (a hunt's before-run)
  bench-harness
        per-case overhead (4 ranks) and store barrier (8 ranks)
  bench [ARGS...]
        the benchmark (concord-bench, release build); `bench -- --help` for its flags
  gpu-bundle
        build the GPU bundle (dist/) for a machine with no Rust toolchain
  mpi-diff [--ranks N] [--seed N] [--trials N]
        the differential test under mpirun (defaults 4, 1, 300)
  two-hosts [--ranks-per-host N] [--trials N]
        ranks in two network namespaces joined by a veth pair (root only; defaults 2, 200)
  autotune [--backend shm] [--ranks N] [ARGS...]
        tune the built-in collective choice sets and print the tables and winners
  help  this text
";

/// One command of the xtask (see [`USAGE`]).
pub enum Cmd {
    /// `__forward PROGRAM [ARGS...]` (hidden): runs PROGRAM as the xtask runs the children it
    /// waits for, SIGTERM / SIGINT / SIGHUP forwarded.
    Forward {
        argv: Vec<String>,
    },
    Test {
        no_lint: bool,
        args: Vec<String>,
    },
    Conformance {
        backend: Vec<String>,
        ranks: usize,
        report: PathBuf,
        exact: Vec<String>,
        jobs: Option<usize>,
        contract: bool,
        /// `--list`: list the case ids instead of running.
        list: bool,
        filters: Vec<String>,
    },
    Mutants {
        mutant: Vec<String>,
        case: Vec<String>,
        jobs: Option<usize>,
        list: bool,
        /// `--sweep [TARGET]`: `Some("")` for the whole grid.
        sweep: Option<String>,
        hook: Vec<String>,
        ws: Vec<usize>,
        /// `--shape`: the sweep's subgroup shapes.
        shape: Vec<String>,
        /// `--dtype`: the sweep's dtype grid (a dtype name or `all`).
        dtype: Vec<String>,
        /// `--order`: the sweep's order grid.
        order: bool,
        /// `--bad-input`: the sweep's bad-input grid (kinds, or `all`).
        bad_input: Vec<String>,
        /// `--skip`: case-id substrings left out.
        skip: Vec<String>,
        /// `--legal`: the legal variants only.
        legal: bool,
    },
    BenchHarness,
    Bench {
        args: Vec<String>,
    },
    GpuBundle,
    MpiDiff {
        ranks: usize,
        seed: u64,
        trials: u64,
    },
    TwoHosts {
        ranks_per_host: usize,
        trials: u64,
    },
    Autotune {
        backend: String,
        ranks: usize,
        args: Vec<String>,
    },
}

/// The arguments after the command name, one at a time; `--flag=value` and `--flag value` both.
struct Tokens {
    v: Vec<String>,
    i: usize,
    /// The value of the `--flag=value` just taken, if it had one.
    inline: Option<String>,
}

impl Tokens {
    /// The next token, split at `=` when it is a `--flag=value`.
    fn next(&mut self) -> Option<String> {
        let t = self.v.get(self.i)?.clone();
        self.i += 1;
        self.inline = None;
        if let Some((flag, value)) = t.split_once('=').filter(|(f, _)| f.starts_with("--")) {
            self.inline = Some(value.to_string());
            return Some(flag.to_string());
        }
        Some(t)
    }
    /// Everything from the token just taken on (a trailing argument list; a first `--` is
    /// only the separator, as clap reads it).
    fn rest_from_last(&mut self) -> Vec<String> {
        let from = if self.v[self.i - 1] == "--" { self.i } else { self.i - 1 };
        let r = self.v[from..].to_vec();
        self.i = self.v.len();
        r
    }
    fn value(&mut self, flag: &str) -> Result<String, String> {
        if let Some(v) = self.inline.take() {
            return Ok(v);
        }
        let v = self.v.get(self.i).cloned().ok_or_else(|| format!("{flag} needs a value\n\n{USAGE}"))?;
        self.i += 1;
        Ok(v)
    }
    fn number<T: std::str::FromStr>(&mut self, flag: &str) -> Result<T, String> {
        let v = self.value(flag)?;
        v.parse().map_err(|_| format!("{flag}: `{v}` is not a number"))
    }
}

fn unknown(cmd: &str, t: &str) -> String {
    format!("unexpected argument `{t}` for `cargo xtask {cmd}`\n\n{USAGE}")
}

/// Parses `cargo xtask`'s arguments (without the program name). `help` / `--help` print
/// [`USAGE`] and exit 0.
pub fn parse(argv: Vec<String>) -> Result<Cmd, String> {
    let Some(cmd) = argv.first().cloned() else { return Err(format!("a command is needed\n\n{USAGE}")) };
    let mut t = Tokens { v: argv[1..].to_vec(), i: 0, inline: None };
    let help = |t: &Tokens| t.v.iter().any(|a| a == "--help" || a == "-h");
    if matches!(cmd.as_str(), "help" | "--help" | "-h") || (!matches!(cmd.as_str(), "bench" | "test" | "autotune") && help(&t)) {
        print!("{USAGE}");
        std::process::exit(0);
    }
    Ok(match cmd.as_str() {
        "test" => {
            let mut no_lint = false;
            let mut args = Vec::new();
            while let Some(a) = t.next() {
                if a == "--no-lint" && args.is_empty() {
                    no_lint = true;
                } else {
                    args = t.rest_from_last();
                }
            }
            Cmd::Test { no_lint, args }
        }
        "conformance" => {
            let (mut backend, mut ranks, mut report, mut exact, mut jobs, mut contract, mut filters) =
                (Vec::new(), 4, PathBuf::from("target/concord-report"), Vec::new(), None, false, Vec::new());
            let mut list = false;
            while let Some(a) = t.next() {
                match a.as_str() {
                    "--backend" => backend.push(t.value(&a)?),
                    "--ranks" => ranks = t.number(&a)?,
                    "--report" => report = t.value(&a)?.into(),
                    "--exact" => exact.push(t.value(&a)?),
                    "--jobs" => jobs = Some(t.number(&a)?),
                    "--contract" => contract = true,
                    "--list" => list = true,
                    f if f.starts_with('-') => return Err(unknown(&cmd, f)),
                    f => filters.push(f.to_string()),
                }
            }
            if backend.is_empty() {
                backend.push("shm".into());
            }
            Cmd::Conformance { backend, ranks, report, exact, jobs, contract, list, filters }
        }
        "mutants" => {
            let (mut mutant, mut case, mut jobs, mut list) = (Vec::new(), Vec::new(), None, false);
            let (mut sweep, mut hook, mut ws, mut shape, mut skip) = (None, Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let (mut dtype, mut order, mut legal, mut bad_input) = (Vec::new(), false, false, Vec::new());
            while let Some(a) = t.next() {
                match a.as_str() {
                    "--mutant" => mutant.push(t.value(&a)?),
                    "--case" => {
                        case.push(t.value(&a)?);
                        while t.v.get(t.i).is_some_and(|n| !n.starts_with('-')) {
                            case.push(t.v[t.i].clone());
                            t.i += 1;
                        }
                    }
                    "--jobs" => jobs = Some(t.number(&a)?),
                    "--list" => list = true,
                    "--sweep" => {
                        // An optional target: the next argument unless it is a flag.
                        let target = t.v.get(t.i).filter(|n| !n.starts_with('-')).cloned();
                        if target.is_some() {
                            t.i += 1;
                        }
                        sweep = Some(target.unwrap_or_default());
                    }
                    "--hook" => hook.push(t.value(&a)?),
                    "--ws" => ws.push(t.number(&a)?),
                    "--shape" => shape.push(t.value(&a)?),
                    "--dtype" => dtype.push(t.value(&a)?),
                    "--order" => order = true,
                    "--bad-input" => bad_input.push(t.value(&a)?),
                    "--legal" => legal = true,
                    "--skip" => skip.push(t.value(&a)?),
                    f => return Err(unknown(&cmd, f)),
                }
            }
            Cmd::Mutants { mutant, case, jobs, list, sweep, hook, ws, shape, dtype, order, bad_input, skip, legal }
        }
        "bench-harness" | "gpu-bundle" => {
            if let Some(a) = t.next() {
                return Err(unknown(&cmd, &a));
            }
            if cmd == "gpu-bundle" {
                Cmd::GpuBundle
            } else {
                Cmd::BenchHarness
            }
        }
        // Not in the usage text: runs one program the way the xtask waits for its children
        // (signals forwarded), for xtask/tests/forward.rs.
        "__forward" => Cmd::Forward { argv: t.v.clone() },
        "bench" => Cmd::Bench { args: if t.v.first().is_some_and(|a| a == "--") { t.v[1..].to_vec() } else { t.v.clone() } },
        "mpi-diff" => {
            let (mut ranks, mut seed, mut trials) = (4, 1, 300);
            while let Some(a) = t.next() {
                match a.as_str() {
                    "--ranks" => ranks = t.number(&a)?,
                    "--seed" => seed = t.number(&a)?,
                    "--trials" => trials = t.number(&a)?,
                    f => return Err(unknown(&cmd, f)),
                }
            }
            Cmd::MpiDiff { ranks, seed, trials }
        }
        "two-hosts" => {
            let (mut ranks_per_host, mut trials) = (2, 200);
            while let Some(a) = t.next() {
                match a.as_str() {
                    "--ranks-per-host" => ranks_per_host = t.number(&a)?,
                    "--trials" => trials = t.number(&a)?,
                    f => return Err(unknown(&cmd, f)),
                }
            }
            Cmd::TwoHosts { ranks_per_host, trials }
        }
        "autotune" => {
            let (mut backend, mut ranks, mut args) = (String::from("shm"), 4, Vec::new());
            while let Some(a) = t.next() {
                match a.as_str() {
                    "--backend" => backend = t.value(&a)?,
                    "--ranks" => ranks = t.number(&a)?,
                    _ => args = t.rest_from_last(),
                }
            }
            Cmd::Autotune { backend, ranks, args }
        }
        other => return Err(format!("unknown command `{other}`\n\n{USAGE}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn mutants_takes_the_bad_input_grid_the_readme_shows() {
        // README: `--bad-input KIND|all` is the bad-input grid; it was "unexpected argument".
        match parse(argv(&["mutants", "--sweep", "--bad-input", "all"])) {
            Ok(Cmd::Mutants { bad_input, sweep, .. }) => {
                assert_eq!(bad_input, ["all"]);
                assert_eq!(sweep.as_deref(), Some(""));
            }
            Ok(_) => panic!("not the mutants command"),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn conformance_lists_case_ids() {
        match parse(argv(&["conformance", "--list", "all_reduce::out"])) {
            Ok(Cmd::Conformance { list, filters, backend, .. }) => {
                assert!(list);
                assert_eq!(filters, ["all_reduce::out"]);
                assert_eq!(backend, ["shm"]);
            }
            Ok(_) => panic!("not the conformance command"),
            Err(e) => panic!("{e}"),
        }
    }
}
