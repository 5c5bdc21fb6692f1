//! Misusing `harness!` is a compile error that says how to fix it: every `tests/ui/*.rs` must
//! fail to compile, and rustc's messages — normalised as trybuild writes them (paths relative to
//! this crate, line numbers of this crate's sources blanked) — must equal `tests/ui/*.stderr`
//! (`TRYBUILD=overwrite` rewrites those files instead).
//!
//! Not trybuild itself: trybuild type-checks every dependency of the crate again, in a debug
//! target dir of its own (a minute and more of a 2-core CI machine). Here each file is only
//! type-checked, by the rustc that built this test, against the `concord-suites` and
//! `concord-shm` libraries this test was linked with (in its own `deps` directory).
use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root and this crate's directory name in it (`suites`).
fn layout() -> (PathBuf, String) {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = manifest.parent().expect("the crate sits in the workspace").to_path_buf();
    (root, manifest.file_name().expect("a crate directory").to_string_lossy().into_owned())
}

/// Every `lib<name>-*.rlib` beside this test's executable, newest first.
fn rlibs(deps: &Path, name: &str) -> Vec<PathBuf> {
    let prefix = format!("lib{name}-");
    let mut found: Vec<(Option<std::time::SystemTime>, PathBuf)> = std::fs::read_dir(deps)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", deps.display()))
        .filter_map(|e| e.ok())
        .filter(|e| {
            let f = e.file_name().to_string_lossy().into_owned();
            f.starts_with(&prefix) && f.ends_with(".rlib")
        })
        .map(|e| (e.metadata().and_then(|m| m.modified()).ok(), e.path()))
        .collect();
    assert!(!found.is_empty(), "no lib{name}-*.rlib in {} (built with this test?)", deps.display());
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    found.into_iter().map(|(_, p)| p).collect()
}

/// The `concord-suites` and `concord-shm` libraries this test was linked with: the newest pair
/// that a crate using both together (`catalogue::<ShmBackend>`) type-checks against. A `deps` directory can hold several builds of
/// each (one crate built alone resolves other features, so another hash), and a stale one
/// fails with "found possibly newer version of crate", not with the errors under test.
fn linked_libs(deps: &Path, out_dir: &Path) -> (PathBuf, PathBuf) {
    let probe = out_dir.join("probe.rs");
    // Naming a type of one crate in a generic of the other makes rustc unify their dependencies
    // (a pair built against different `concord-core` builds fails here, not in the UI files).
    let src = "fn main() {\n    let _ = concord_suites::catalogue::<concord_shm::ShmBackend>;\n}\n";
    std::fs::write(&probe, src).expect("write the probe");
    let (suites, shm) = (rlibs(deps, "concord_suites"), rlibs(deps, "concord_shm"));
    let mut tried = Vec::new();
    for a in &suites {
        for b in &shm {
            let out = check_crate("probe", &probe, out_dir, deps, (a, b)).output().expect("rustc runs");
            if out.status.success() {
                return (a.clone(), b.clone());
            }
            tried.push(format!("{} + {}: {}", a.display(), b.display(), String::from_utf8_lossy(&out.stderr)));
        }
    }
    panic!("no pair of concord_suites / concord_shm libraries in {} type-checks together:\n{}", deps.display(), tried.join("\n"))
}

/// A rustc command that type-checks the binary crate `src` (named `name`) against the given
/// `concord-suites` and `concord-shm` libraries, its metadata written under `out_dir`.
fn check_crate(name: &str, src: &Path, out_dir: &Path, deps: &Path, (suites, shm): (&Path, &Path)) -> Command {
    let mut c = Command::new(rustc());
    c.args(["--edition", "2021", "--crate-type", "bin", "--crate-name", name, "--emit=metadata"])
        .arg("-o")
        .arg(out_dir.join(format!("{name}.rmeta")))
        .arg("-L")
        .arg(format!("dependency={}", deps.display()))
        .arg("--extern")
        .arg(format!("concord_suites={}", suites.display()))
        .arg("--extern")
        .arg(format!("concord_shm={}", shm.display()))
        .arg(src);
    c
}

/// The rustc of the toolchain that runs the tests (`RUSTC`, else the one beside `CARGO`).
fn rustc() -> PathBuf {
    if let Some(r) = std::env::var_os("RUSTC") {
        return r.into();
    }
    if let Some(cargo) = std::env::var_os("CARGO") {
        let beside = Path::new(&cargo).with_file_name("rustc");
        if beside.exists() {
            return beside;
        }
    }
    "rustc".into()
}

/// rustc's messages as trybuild writes them: the closing `aborting due to` / `For more
/// information` lines dropped; `--> ` paths relative to this crate (`tests/ui/x.rs:4:26`); for
/// any other file (this crate's sources, whose line numbers change with every edit) no line and
/// column, and no line numbers in its snippet's gutter; the gutter then as wide as the line
/// numbers left in the diagnostic need.
fn normalize(raw: &str, krate: &str) -> String {
    let mut blocks: Vec<String> = Vec::new();
    for block in raw.split("\n\n") {
        let lines: Vec<&str> = block.lines().collect();
        if lines.is_empty()
            || lines.iter().all(|l| l.trim().is_empty())
            || lines[0].starts_with("error: aborting due to")
            || lines[0].starts_with("For more information about this error")
        {
            continue;
        }
        // The gutter width: the spaces before the first `--> `.
        let width = lines.iter().find_map(|l| l.find("--> ").filter(|&i| l[..i].trim().is_empty())).unwrap_or(0);
        // (line, Some(number field) for gutter lines, whether this line's number is kept)
        let mut out: Vec<(String, Option<String>)> = Vec::new();
        let mut blank_numbers = false;
        for l in &lines {
            let gutter = width > 0 && l.len() > width && l[..width].trim().chars().all(|c| c.is_ascii_digit());
            if gutter && l[width..].starts_with("--> ") {
                let path = &l[width + 4..];
                let rel = path.strip_prefix(&format!("{krate}/")).map(str::to_string).unwrap_or_else(|| format!("$WORKSPACE/{path}"));
                if rel.starts_with("tests/") {
                    blank_numbers = false;
                    out.push((format!("--> {rel}"), Some(String::new())));
                } else {
                    blank_numbers = true;
                    let file = rel.split(':').next().unwrap_or(&rel).to_string();
                    out.push((format!("--> {file}"), Some(String::new())));
                }
            } else if gutter && (l[width..].starts_with(" |") || l[width..].starts_with(" =")) {
                let num = l[..width].trim();
                let num = if blank_numbers { "" } else { num };
                out.push((l[width..].to_string(), Some(num.to_string())));
            } else {
                blank_numbers = false;
                out.push((l.to_string(), None));
            }
        }
        let new_width = out.iter().filter_map(|(_, n)| n.as_ref().map(|n| n.len())).max().unwrap_or(0).max(1);
        let text: Vec<String> = out
            .into_iter()
            .map(|(rest, num)| match num {
                Some(_) if rest.starts_with("-->") => format!("{:w$}{rest}", "", w = new_width),
                Some(n) => format!("{n:>new_width$}{rest}"),
                None => rest,
            })
            .collect();
        blocks.push(text.join("\n"));
    }
    let mut s = blocks.join("\n\n");
    s.push('\n');
    s
}

#[test]
fn harness_macro_misuse_explains_the_fix() {
    let (root, krate) = layout();
    let exe = std::env::current_exe().expect("the test's own path");
    let deps = exe.parent().expect("the test sits in a deps directory").to_path_buf();
    let out_dir = deps.parent().unwrap_or(&deps).join("concord-ui-tests");
    std::fs::create_dir_all(&out_dir).expect("an output directory in the target dir");
    let (suites, shm) = linked_libs(&deps, &out_dir);
    let overwrite = std::env::var("TRYBUILD").is_ok_and(|v| v == "overwrite");
    let ui = root.join(&krate).join("tests/ui");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&ui)
        .expect("tests/ui")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no tests/ui/*.rs");
    let mut failures = Vec::new();
    for file in &files {
        let stem = file.file_stem().expect("a file name").to_string_lossy().into_owned();
        let rel = format!("{krate}/tests/ui/{stem}.rs");
        let output = check_crate(&stem, Path::new(&rel), &out_dir, &deps, (&suites, &shm))
            .current_dir(&root)
            .env("CARGO_PKG_NAME", "concord-suites-tests")
            .env("CARGO_CRATE_NAME", &stem)
            .args(["--color", "never", "--diagnostic-width=140"])
            .output()
            .expect("rustc runs");
        let got = normalize(&String::from_utf8_lossy(&output.stderr), &krate);
        if output.status.success() {
            failures.push(format!("{rel}: compiled, but misusing harness! must be a compile error"));
            continue;
        }
        let expected_path = ui.join(format!("{stem}.stderr"));
        if overwrite {
            std::fs::write(&expected_path, &got).expect("write the .stderr file");
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if got.trim_end() != expected.trim_end() {
            failures.push(format!(
                "{rel}: the compiler's messages differ from {stem}.stderr (TRYBUILD=overwrite rewrites it)\n--- expected\n{expected}\n--- got\n{got}"
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&out_dir);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn normalize_writes_what_trybuild_writes() {
    let raw = "error[E0277]: x\n  --> suites/tests/ui/a.rs:4:26\n   |\n 4 | foo!();\n   | ^^^ here\n   |\nnote: bound\n  --> suites/src/lib.rs:64:32\n   |\n64 | pub fn f() {}\n   |        ^ this\n\nerror: aborting due to 1 previous error\n\nFor more information about this error, try `rustc --explain E0277`.\n";
    let want = "error[E0277]: x\n --> tests/ui/a.rs:4:26\n  |\n4 | foo!();\n  | ^^^ here\n  |\nnote: bound\n --> src/lib.rs\n  |\n  | pub fn f() {}\n  |        ^ this\n";
    assert_eq!(normalize(raw, "suites"), want);
}
