//! The TCP store: a Rust server with Rust clients — every operation, deadlines, a dead server
//! named instead of a hang. (Compatibility with PyTorch's TCPStore: store/scripts/tcpstore_interop.py.)

use concord_store::{Store, StoreAddr, StoreError, TcpServer, TcpStore};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(5);

fn client(port: u16, prefix: &str) -> TcpStore {
    TcpStore::connect("127.0.0.1", port, prefix, T).unwrap()
}

#[test]
fn every_operation_matches_the_file_store_semantics() {
    let server = TcpServer::bind(0).unwrap();
    let s = client(server.port(), "");
    s.set("a", b"1").unwrap();
    assert_eq!(s.get("a").unwrap(), b"1");
    s.set("a", b"two").unwrap();
    assert_eq!(s.get("a").unwrap(), b"two");
    s.set("empty", b"").unwrap();
    assert_eq!(s.get("empty").unwrap(), b"");
    assert_eq!(s.add("c", 5).unwrap(), 5);
    assert_eq!(s.add("c", -7).unwrap(), -2);
    assert_eq!(s.get("c").unwrap(), b"-2");
    // compare_set: the four c10d cases.
    assert_eq!(s.compare_set("cs", b"", b"new").unwrap(), b"new");
    assert_eq!(s.compare_set("absent", b"x", b"new").unwrap(), b"x");
    assert!(!s.check(&["absent"]).unwrap());
    assert_eq!(s.compare_set("cs", b"new", b"newer").unwrap(), b"newer");
    assert_eq!(s.compare_set("cs", b"nope", b"z").unwrap(), b"newer");
    assert!(s.check(&["a", "c"]).unwrap());
    assert!(!s.check(&["a", "nope"]).unwrap());
    assert_eq!(s.num_keys().unwrap(), 4);
    assert!(s.delete_key("a").unwrap());
    assert!(!s.delete_key("a").unwrap());
    assert_eq!(s.num_keys().unwrap(), 3);
    s.append("ap", b"ab").unwrap();
    s.append("ap", b"cd").unwrap();
    assert_eq!(s.get("ap").unwrap(), b"abcd");
    s.multi_set(&[("m1", b"x"), ("m2", b"yy")]).unwrap();
    assert_eq!(s.multi_get(&["m2", "m1"]).unwrap(), vec![b"yy".to_vec(), b"x".to_vec()]);
    s.ping().unwrap();
    // Keys travel with c10d's `/` prefix, plus ours: a prefixed client sees only its own keys.
    let p = client(server.port(), "run7");
    p.set("a", b"mine").unwrap();
    // SET has no reply (as in c10d): one round trip on the same connection orders it before
    // what another connection asks next.
    p.ping().unwrap();
    assert!(!s.check(&["a"]).unwrap());
    assert!(s.check(&["run7/a"]).unwrap());
    assert_eq!(s.get("run7/a").unwrap(), b"mine");
    assert_eq!(server.num_keys(), 7);
}

#[test]
fn the_store_type_opens_either_kind_from_an_address() {
    let server = TcpServer::bind(0).unwrap();
    let addr = StoreAddr::parse(&format!("tcp://127.0.0.1:{}/w", server.port())).unwrap();
    let a = Store::open(&addr.to_path_buf(), 2, T).unwrap();
    let b = Store::open_addr(&addr, 2, T).unwrap();
    std::thread::scope(|sc| {
        sc.spawn(|| a.barrier("x", 2, T).unwrap());
        b.barrier("x", 2, T).unwrap();
    });
    assert_eq!(a.location(), format!("tcp://127.0.0.1:{}", server.port()));
    let dir = tempfile::tempdir().unwrap();
    let f = Store::open(&dir.path().join("store"), 1, T).unwrap();
    f.set("k", b"v").unwrap();
    assert_eq!(f.get("k").unwrap(), b"v");
}

#[test]
fn waiters_are_woken_by_writes_from_other_clients() {
    let server = TcpServer::bind(0).unwrap();
    let port = server.port();
    let w = client(port, "");
    let t0 = Instant::now();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let c = client(port, "");
            std::thread::sleep(Duration::from_millis(50));
            c.set("k1", b"").unwrap();
            std::thread::sleep(Duration::from_millis(20));
            c.add("k2", 1).unwrap();
        });
        w.wait(&["k1", "k2"], T).unwrap();
    });
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(70) && took < Duration::from_secs(2), "{took:?}");
    // Every other write kind wakes a waiter too (review14 finding 9: `autotune::exchange`
    // publishes its decision with compare_set, and its peers wait for that key): compare_set on
    // an absent key, append, multi_set.
    type Write = fn(&TcpStore, &str);
    let writes: [(&str, Write); 3] = [
        ("compare_set", |c, k| {
            c.compare_set(k, b"", b"decided").unwrap();
        }),
        ("append", |c, k| c.append(k, b"x").unwrap()),
        ("multi_set", |c, k| c.multi_set(&[("other", b"1"), (k, b"v")]).unwrap()),
    ];
    for (kind, write) in writes {
        let key = format!("woken_by_{kind}");
        let t0 = Instant::now();
        std::thread::scope(|sc| {
            sc.spawn(|| {
                let c = client(port, "");
                std::thread::sleep(Duration::from_millis(50));
                write(&c, &key);
            });
            w.wait(&[key.as_str()], T).unwrap_or_else(|e| panic!("a waiter on a key written by {kind}: {e}"));
        });
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(50) && took < Duration::from_secs(2),
            "a waiter on a key written by {kind} woke after {took:?}"
        );
    }
    // get waits as well.
    std::thread::scope(|sc| {
        sc.spawn(|| {
            std::thread::sleep(Duration::from_millis(30));
            client(port, "").set("late", b"v").unwrap();
        });
        assert_eq!(w.get("late").unwrap(), b"v");
    });
    // A barrier of 4 clients, reused with new names.
    std::thread::scope(|sc| {
        for _ in 0..4 {
            sc.spawn(|| {
                let c = client(port, "");
                for i in 0..10 {
                    c.barrier(&format!("b{i}"), 4, T).unwrap();
                }
            });
        }
    });
}

#[test]
fn a_wait_past_its_deadline_is_a_named_timeout_and_the_connection_stays_usable() {
    let server = TcpServer::bind(0).unwrap();
    let s = client(server.port(), "");
    let t0 = Instant::now();
    let e = s.wait(&["never", "nor"], Duration::from_millis(100)).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(2));
    match &e {
        StoreError::Timeout { keys, waited_ms, path } => {
            assert_eq!(keys, &["never".to_string(), "nor".to_string()]);
            assert!(*waited_ms >= 100);
            assert!(path.starts_with("tcp://127.0.0.1:"), "{path}");
        }
        other => panic!("{other:?}"),
    }
    // The cancelled wait left the protocol in step: the next request gets its own reply.
    s.set("after", b"ok").unwrap();
    assert_eq!(s.get("after").unwrap(), b"ok");
    let short = TcpStore::connect("127.0.0.1", server.port(), "", Duration::from_millis(500)).unwrap();
    assert!(matches!(short.get("missing"), Err(StoreError::Timeout { .. })));
}

#[test]
fn a_dead_server_is_a_named_error_not_a_hang() {
    // Nothing listens: connecting retries until the deadline, then names the address.
    let free = TcpServer::bind(0).unwrap();
    let port = free.port();
    drop(free);
    let t0 = Instant::now();
    let e = TcpStore::connect("127.0.0.1", port, "", Duration::from_millis(300)).err().expect("no server");
    assert!(t0.elapsed() >= Duration::from_millis(300) && t0.elapsed() < Duration::from_secs(3));
    assert!(matches!(&e, StoreError::Unreachable { addr, .. } if addr == &format!("127.0.0.1:{port}")), "{e:?}");

    // The server goes away while a client waits: the wait ends at once with a named I/O error.
    let mut server = TcpServer::bind(0).unwrap();
    let s = client(server.port(), "");
    let t0 = Instant::now();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            server.stop();
        });
        let e = s.wait(&["k"], Duration::from_secs(20)).unwrap_err();
        assert!(matches!(&e, StoreError::Io { msg, .. } if msg.contains("closed")), "{e:?}");
        assert!(e.to_string().contains("tcp://127.0.0.1:"), "{e}");
    });
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(s.set("x", b"y").and_then(|_| s.get("x")).is_err());

    // A "server" that accepts but never answers: the reply deadline names it.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let h = std::thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        let mut sink = [0u8; 64];
        let _ = c.read(&mut sink);
        std::thread::sleep(Duration::from_millis(700));
        let _ = c.write_all(b"");
    });
    let t0 = Instant::now();
    let e = TcpStore::connect("127.0.0.1", port, "", Duration::from_millis(300)).err().expect("mute server");
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert!(e.to_string().contains(&format!("127.0.0.1:{port}")) && e.to_string().contains("no reply"), "{e}");
    h.join().unwrap();
}

#[test]
fn the_server_speaks_c10d_bytes() {
    // A hand-written client: VALIDATE + magic, PING, SET, ADD, CHECK, GETNUMKEYS, as PyTorch sends them.
    let server = TcpServer::bind(0).unwrap();
    let mut c = std::net::TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    let mut m = vec![0u8];
    m.extend_from_slice(&0x3C85F7CEu32.to_le_bytes());
    m.push(13);
    m.extend_from_slice(&77u32.to_le_bytes());
    let key = |m: &mut Vec<u8>, k: &[u8]| {
        m.extend_from_slice(&(k.len() as u64).to_le_bytes());
        m.extend_from_slice(k);
    };
    m.push(1);
    key(&mut m, b"/k");
    key(&mut m, b"v");
    m.push(4);
    key(&mut m, b"/n");
    m.extend_from_slice(&41i64.to_le_bytes());
    m.push(5);
    m.extend_from_slice(&2u64.to_le_bytes());
    key(&mut m, b"/k");
    key(&mut m, b"/n");
    m.push(7);
    c.write_all(&m).unwrap();
    let mut got = [0u8; 4 + 8 + 1 + 8];
    c.read_exact(&mut got).unwrap();
    assert_eq!(&got[..4], &77u32.to_le_bytes());
    assert_eq!(&got[4..12], &41i64.to_le_bytes());
    assert_eq!(got[12], 0, "READY");
    assert_eq!(&got[13..], &2i64.to_le_bytes());
    // A Rust client reads what the raw one wrote, under c10d's `/` prefix.
    assert_eq!(client(server.port(), "").get("k").unwrap(), b"v");
    assert_eq!(client(server.port(), "").get("n").unwrap(), b"41");
    // A connection that does not validate is dropped.
    let mut bad = std::net::TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    bad.write_all(&[7]).unwrap();
    bad.set_read_timeout(Some(T)).unwrap();
    let mut b = [0u8; 8];
    assert_eq!(bad.read(&mut b).unwrap_or(0), 0);
}

/// A hand-written "server": answers the client's handshake (VALIDATE + PING), then runs `then`
/// on the connection. Returns the port and the thread.
fn fake_server(then: impl FnOnce(std::net::TcpStream) + Send + 'static) -> (u16, std::thread::JoinHandle<()>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let h = std::thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        let mut hello = [0u8; 10];
        c.read_exact(&mut hello).unwrap();
        c.write_all(&hello[6..10]).unwrap();
        then(c);
    });
    (port, h)
}

#[test]
fn a_reply_cut_short_breaks_the_connection_instead_of_feeding_the_next_request() {
    // ADD gets 4 of its 8 reply bytes; the rest (and a whole reply for the next request) come
    // late. Without the broken mark, the next request would read those stale bytes as its reply.
    let (port, h) = fake_server(|mut c| {
        let mut q = [0u8; 64];
        let _ = c.read(&mut q);
        c.write_all(&7i64.to_le_bytes()[..4]).unwrap();
        std::thread::sleep(Duration::from_millis(400));
        let _ = c.write_all(&[0u8; 4]);
        let _ = c.write_all(&99i64.to_le_bytes());
        std::thread::sleep(Duration::from_millis(300));
    });
    let s = TcpStore::connect("127.0.0.1", port, "", Duration::from_millis(200)).unwrap();
    let e = s.add("n", 1).unwrap_err();
    assert!(matches!(&e, StoreError::Io { msg, .. } if msg.contains("mid-reply")), "{e:?}");
    std::thread::sleep(Duration::from_millis(300));
    let e2 = s.num_keys().unwrap_err();
    assert!(
        matches!(&e2, StoreError::Io { msg, .. } if msg.contains("num_keys") && msg.contains("out of step") && msg.contains("mid-reply")),
        "{e2:?}"
    );
    h.join().unwrap();
}

#[test]
fn a_timed_out_wait_whose_cancel_is_never_answered_ends_near_its_own_deadline() {
    // The store timeout is long (5 s); the wait's is 100 ms: the cancel's answer gets at most
    // max(100 ms, 250 ms), not two store timeouts (10 s).
    let (port, h) = fake_server(|mut c| {
        let mut q = [0u8; 256];
        let _ = c.read(&mut q);
        std::thread::sleep(Duration::from_millis(800));
    });
    let s = TcpStore::connect("127.0.0.1", port, "", T).unwrap();
    let t0 = Instant::now();
    let e = s.wait(&["never"], Duration::from_millis(100)).unwrap_err();
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(100) && took < Duration::from_millis(750), "{took:?}");
    assert!(matches!(&e, StoreError::Io { msg, .. } if msg.contains("cancel") && msg.contains("never")), "{e:?}");
    // Out of step now: named at once.
    let t0 = Instant::now();
    assert!(matches!(s.check(&["never"]), Err(StoreError::Io { msg, .. }) if msg.contains("out of step")));
    assert!(t0.elapsed() < Duration::from_millis(100));
    h.join().unwrap();
}

#[test]
fn a_value_over_the_servers_limit_is_refused_not_dropped() {
    let server = TcpServer::bind(0).unwrap();
    let s = client(server.port(), "");
    // Zeroed and never written: the pages are not touched.
    let big = vec![0u8; (1 << 30) + 1];
    for e in [s.set("big", &big).unwrap_err(), s.append("big", &big).unwrap_err(), s.multi_set(&[("a", b"1"), ("big", &big)]).unwrap_err()]
    {
        assert!(matches!(&e, StoreError::Io { msg, .. } if msg.contains("1073741825 bytes") && msg.contains("1 GiB")), "{e:?}");
    }
    drop(big);
    // Nothing was sent: the connection is in step, and nothing was half-set.
    s.set("small", b"ok").unwrap();
    assert_eq!(s.get("small").unwrap(), b"ok");
    assert!(!s.check(&["a"]).unwrap());
}

#[test]
fn the_cli_refuses_a_multi_set_with_an_odd_word_count() {
    let server = TcpServer::bind(0).unwrap();
    let addr = format!("tcp://127.0.0.1:{}", server.port());
    let run = |args: &[&str]| std::process::Command::new(env!("CARGO_BIN_EXE_concord-store")).arg(&addr).args(args).output().unwrap();
    let bad = run(&["multi-set", "a", "1", "b"]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("multi-set takes KEY VALUE pairs") && err.contains("3 word(s)"), "{err}");
    let s = client(server.port(), "");
    assert!(!s.check(&["a"]).unwrap() && !s.check(&["b"]).unwrap(), "nothing was set");
    let ok = run(&["multi-set", "a", "1", "b", "-"]);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    assert_eq!((s.get("a").unwrap(), s.get("b").unwrap()), (b"1".to_vec(), Vec::new()));
}
