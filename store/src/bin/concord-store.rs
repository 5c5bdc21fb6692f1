//! `concord-store`: drive a c10d-compatible FileStore from the command line (used by
//! `store/scripts/filestore_interop.py` to prove byte compatibility with PyTorch).
//!
//! ```text
//! concord-store [--workers N] [--timeout-ms MS] FILE COMMAND [ARGS...]
//!   set KEY VALUE | get KEY | add KEY DELTA | compare-set KEY EXPECTED DESIRED
//!   wait KEY... | check KEY... | num-keys | delete KEY | repl
//! ```
//! Each command opens the store (refcount +1), runs, and drops it (c10d cleanup). `repl` keeps
//! one store open and reads commands (same syntax, one per line) from stdin, answering one line
//! each (`ok`, a value, `true`/`false`, or `error: ...`), until `quit` or EOF.
//! Values are printed as UTF-8 (lossy); `get-hex` prints hex.

use concord_store::FileStore;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Duration;

fn usage() -> ! {
    eprintln!("usage: concord-store [--workers N] [--timeout-ms MS] FILE (set K V|get K|get-hex K|add K D|compare-set K E D|wait K..|check K..|num-keys|delete K|repl)");
    std::process::exit(2);
}

fn run(store: &FileStore, words: &[String]) -> Result<String, String> {
    let e = |x: concord_store::StoreError| x.to_string();
    let arg = |i: usize| words.get(i).cloned().ok_or_else(|| format!("{}: missing argument {i}", words[0]));
    match words.first().map(String::as_str) {
        Some("set") => store.set(&arg(1)?, arg(2)?.as_bytes()).map(|_| "ok".into()).map_err(e),
        Some("get") => store.get(&arg(1)?).map(|v| String::from_utf8_lossy(&v).into_owned()).map_err(e),
        Some("get-hex") => store.get(&arg(1)?).map(|v| v.iter().map(|b| format!("{b:02x}")).collect()).map_err(e),
        Some("add") => {
            let d: i64 = arg(2)?.parse().map_err(|_| "add: DELTA must be an integer".to_string())?;
            store.add(&arg(1)?, d).map(|v| v.to_string()).map_err(e)
        }
        Some("compare-set") => {
            store.compare_set(&arg(1)?, arg(2)?.as_bytes(), arg(3)?.as_bytes()).map(|v| String::from_utf8_lossy(&v).into_owned()).map_err(e)
        }
        Some("wait") => {
            let keys: Vec<&str> = words[1..].iter().map(String::as_str).collect();
            store.wait(&keys, store.timeout()).map(|_| "ok".into()).map_err(e)
        }
        Some("check") => {
            let keys: Vec<&str> = words[1..].iter().map(String::as_str).collect();
            store.check(&keys).map(|b| b.to_string()).map_err(e)
        }
        Some("num-keys") => store.num_keys().map(|n| n.to_string()).map_err(e),
        Some("delete") => store.delete_key(&arg(1)?).map(|b| b.to_string()).map_err(e),
        Some(other) => Err(format!("unknown command {other:?}")),
        None => Err("empty command".into()),
    }
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut workers = 1usize;
    let mut timeout = Duration::from_secs(30);
    loop {
        match args.first().map(String::as_str) {
            Some("--workers") if args.len() > 1 => {
                workers = args[1].parse().unwrap_or_else(|_| usage());
                args.drain(..2);
            }
            Some("--timeout-ms") if args.len() > 1 => {
                timeout = Duration::from_millis(args[1].parse().unwrap_or_else(|_| usage()));
                args.drain(..2);
            }
            _ => break,
        }
    }
    if args.len() < 2 {
        usage();
    }
    let path = PathBuf::from(&args[0]);
    let store = match FileStore::open(&path, workers, timeout) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("concord-store: {e}");
            std::process::exit(1);
        }
    };
    let words = &args[1..];
    if words[0] == "repl" {
        let stdin = std::io::stdin();
        let mut out = std::io::stdout();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { break };
            let w: Vec<String> = line.split_whitespace().map(String::from).collect();
            if w.is_empty() {
                continue;
            }
            if w[0] == "quit" {
                break;
            }
            let reply = run(&store, &w).unwrap_or_else(|m| format!("error: {m}"));
            let _ = writeln!(out, "{reply}");
            let _ = out.flush();
        }
        drop(store);
        return;
    }
    let r = run(&store, words);
    drop(store);
    match r {
        Ok(v) => println!("{v}"),
        Err(m) => {
            eprintln!("concord-store: {m}");
            std::process::exit(1);
        }
    }
}
