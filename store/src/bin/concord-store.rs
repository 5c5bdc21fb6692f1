//! `concord-store`: drive a c10d-compatible FileStore or TCPStore from the command line (used by
//! `store/scripts/filestore_interop.py` and `store/scripts/tcpstore_interop.py` to prove
//! compatibility with PyTorch).
//!
//! ```text
//! concord-store [--workers N] [--timeout-ms MS] (FILE | tcp://HOST:PORT[/PREFIX]) COMMAND [ARGS...]
//!   set KEY VALUE | get KEY | add KEY DELTA | compare-set KEY EXPECTED DESIRED
//!   wait KEY... | check KEY... | num-keys | delete KEY | repl
//!   TCP only: append KEY VALUE | multi-get KEY... | multi-set K V [K V...] | ping
//!             wait-ms MS KEY... (a wait with its own deadline)
//! concord-store serve PORT      # a TCPStore server on 0.0.0.0:PORT (0: any); prints
//!                               # `listening PORT`, serves until stdin closes
//! ```
//! (`-` as a VALUE means the empty value.)
//! Each command opens the store (refcount +1), runs, and drops it (c10d cleanup). `repl` keeps
//! one store open and reads commands (same syntax, one per line) from stdin, answering one line
//! each (`ok`, a value, `true`/`false`, or `error: ...`), until `quit` or EOF.
//! Values are printed as UTF-8 (lossy); `get-hex` prints hex.

use concord_store::{Store, TcpServer};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Duration;

fn usage() -> ! {
    eprintln!("usage: concord-store [--workers N] [--timeout-ms MS] (FILE|tcp://HOST:PORT[/PREFIX]) (set K V|get K|get-hex K|add K D|compare-set K E D|wait K..|wait-ms MS K..|check K..|num-keys|delete K|append K V|multi-get K..|multi-set K V..|ping|repl) | concord-store serve PORT");
    std::process::exit(2);
}

fn run(store: &Store, words: &[String]) -> Result<String, String> {
    let e = |x: concord_store::StoreError| x.to_string();
    let arg = |i: usize| words.get(i).cloned().ok_or_else(|| format!("{}: missing argument {i}", words[0]));
    let val = |i: usize| arg(i).map(|v| if v == "-" { String::new() } else { v });
    let tcp = || match store {
        Store::Tcp(t) => Ok(t),
        Store::File(_) => Err(format!("{} needs a tcp:// store", words[0])),
    };
    let lossy = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
    match words.first().map(String::as_str) {
        Some("append") => tcp()?.append(&arg(1)?, val(2)?.as_bytes()).map(|_| "ok".into()).map_err(e),
        Some("multi-get") => {
            let keys: Vec<&str> = words[1..].iter().map(String::as_str).collect();
            tcp()?.multi_get(&keys).map(|vs| vs.iter().map(|v| lossy(v)).collect::<Vec<_>>().join(" ")).map_err(e)
        }
        Some("multi-set") => {
            if words.len() < 3 || !(words.len() - 1).is_multiple_of(2) {
                return Err(format!(
                    "multi-set takes KEY VALUE pairs (VALUE `-` for empty); got {} word(s) after it, an odd count or none",
                    words.len() - 1
                ));
            }
            let vals: Vec<String> = words[1..].iter().map(|v| if v == "-" { String::new() } else { v.clone() }).collect();
            let pairs: Vec<(&str, &[u8])> = words[1..]
                .chunks(2)
                .zip(vals.chunks(2))
                .map(|(k, v)| (k[0].as_str(), v.get(1).map(|x| x.as_bytes()).unwrap_or(b"")))
                .collect();
            tcp()?.multi_set(&pairs).map(|_| "ok".into()).map_err(e)
        }
        Some("ping") => tcp()?.ping().map(|_| "ok".into()).map_err(e),
        Some("wait-ms") => {
            let ms: u64 = arg(1)?.parse().map_err(|_| "wait-ms: MS must be a number".to_string())?;
            let keys: Vec<&str> = words[2..].iter().map(String::as_str).collect();
            store.wait(&keys, Duration::from_millis(ms)).map(|_| "ok".into()).map_err(e)
        }
        Some("set") => store.set(&arg(1)?, val(2)?.as_bytes()).map(|_| "ok".into()).map_err(e),
        Some("get") => store.get(&arg(1)?).map(|v| String::from_utf8_lossy(&v).into_owned()).map_err(e),
        Some("get-hex") => store.get(&arg(1)?).map(|v| v.iter().map(|b| format!("{b:02x}")).collect()).map_err(e),
        Some("add") => {
            let d: i64 = arg(2)?.parse().map_err(|_| "add: DELTA must be an integer".to_string())?;
            store.add(&arg(1)?, d).map(|v| v.to_string()).map_err(e)
        }
        Some("compare-set") => {
            store.compare_set(&arg(1)?, val(2)?.as_bytes(), val(3)?.as_bytes()).map(|v| String::from_utf8_lossy(&v).into_owned()).map_err(e)
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
    if args[0] == "serve" {
        let port: u16 = args[1].parse().unwrap_or_else(|_| usage());
        let server = match TcpServer::bind(port) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("concord-store: {e}");
                std::process::exit(1);
            }
        };
        println!("listening {}", server.port());
        let _ = std::io::stdout().flush();
        // Serve until stdin closes (the driving script ended or closed it).
        let mut sink = String::new();
        while std::io::stdin().read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {
            sink.clear();
        }
        drop(server);
        return;
    }
    let path = PathBuf::from(&args[0]);
    let store = match Store::open(&path, workers, timeout) {
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
