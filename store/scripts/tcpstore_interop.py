#!/usr/bin/env python3
"""Proves that Concord's Rust TCP store and PyTorch's c10d TCPStore speak one protocol.

Both directions, both sides as server, on real sockets:
  A. a torch.distributed.TCPStore server (libuv backend and the classic one, where the installed
     torch has both) with a Rust client (`concord-store tcp://... repl`) and torch clients;
  B. a Rust server (`concord-store serve 0`) with torch clients and a Rust client.
In each: set/get, add, compare_set (all four cases), check, delete_key, num_keys, append,
multi_get/multi_set, a Rust waiter woken by a torch write and a torch waiter woken by a Rust
write, get blocking until the key appears, a wait that times out (the connection stays usable
after the cancelled wait), ping.

Usage:
  python3 store/scripts/tcpstore_interop.py [--store-bin PATH]
  (GPU bundle: python3 dist/scripts/tcpstore_interop.py --store-bin dist/bin/concord-store)
Without --store-bin the script builds `concord-store` with cargo (release) and uses that.
Exits 0 with "PASS" only if every check passed; otherwise prints each failure and exits 1.

`--pure-python-standin` replaces torch with a small pure-Python re-implementation of the c10d
TCPStore protocol (for checking this script where PyTorch is not installed). It proves NOTHING
about PyTorch; the summary says so.
"""

import argparse
import datetime
import json
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = datetime.timedelta(seconds=20)

results = []  # (name, ok, detail)


def check(name, ok, detail=""):
    results.append((name, bool(ok), detail))
    print(("  ok   " if ok else "  FAIL ") + name + ("" if ok else f": {detail}"), flush=True)
    return ok


def guarded(name, fn):
    """Runs one check body; an exception is a failed check, not the end of the script."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - every failure is reported by name
        check(name, False, f"{type(e).__name__}: {e}")


def find_store_bin(explicit):
    if explicit:
        return explicit
    cmd = ["cargo", "build", "--release", "-p", "concord-store", "--bin", "concord-store",
           "--message-format=json"]
    out = subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.PIPE, text=True).stdout
    for line in out.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") and \
                msg["target"]["name"] == "concord-store":
            return msg["executable"]
    sys.exit("FAIL: cargo did not report a concord-store executable")


class RustRepl:
    """A Rust TCPStore client: `concord-store tcp://HOST:PORT repl`, one command per line."""

    def __init__(self, store_bin, port):
        self.p = subprocess.Popen([store_bin, "--timeout-ms", "20000", f"tcp://127.0.0.1:{port}", "repl"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def send(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def reply(self, within=10.0):
        r, _, _ = select.select([self.p.stdout], [], [], within)
        if not r:
            return None
        return self.p.stdout.readline().rstrip("\n")

    def cmd(self, line, within=10.0):
        self.send(line)
        got = self.reply(within)
        if got is None:
            raise TimeoutError(f"no reply from the Rust client to {line!r} within {within} s")
        return got

    def close(self):
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def b(x):
    return x if isinstance(x, bytes) else x.encode()


def run_checks(tag, store_bin, port, py, py_client_factory):
    """Every operation across the two languages, with `py` a torch store on the same server."""
    rust = RustRepl(store_bin, port)
    t = lambda name: f"[{tag}] {name}"  # noqa: E731
    try:
        guarded(t("rust set -> torch get"), lambda: (
            check(t("rust set -> torch get"), rust.cmd("set r/a hello") == "ok" and py.get("r/a") == b"hello",
                  py.get("r/a"))))

        def torch_set():
            py.set("p/a", "world")
            got = rust.cmd("get p/a")
            check(t("torch set -> rust get"), got == "world", got)
        guarded(t("torch set -> rust get"), torch_set)

        def adds():
            a = rust.cmd("add r/n 5")
            c = py.add("r/n", 3)
            d = rust.cmd("get r/n")
            check(t("add: rust 5, torch +3 = 8, stored as text"), (a, c, d) == ("5", 8, "8"), (a, c, d))
            e = py.add("p/n", -2)
            f = rust.cmd("add p/n 10")
            check(t("add: torch -2, rust +10 = 8"), (e, f) == (-2, "8"), (e, f))
        guarded(t("add"), adds)

        def cas():
            r1 = rust.cmd("compare-set r/cs - v1")
            r2 = py.compare_set("r/cs", "v1", "v2")
            r3 = rust.cmd("compare-set r/cs nope x")
            r4 = py.compare_set("r/absent", "x", "y")
            r5 = rust.cmd("check r/absent")
            r6 = rust.cmd("compare-set r/absent2 x y")
            r7 = py.check(["r/absent2"])
            check(t("compare_set: absent+empty sets, match sets, mismatch returns current, absent returns expected"),
                  (r1, r2, r3, r4, r5, r6, r7) == ("v1", b"v2", "v2", b"x", "false", "x", False),
                  (r1, r2, r3, r4, r5, r6, r7))
        guarded(t("compare_set"), cas)

        def checks():
            a = py.check(["r/a", "p/a"])
            c = rust.cmd("check r/a p/a")
            d = rust.cmd("check r/a missing")
            e = py.check(["p/a", "missing"])
            check(t("check both ways"), (a, c, d, e) == (True, "true", "false", False), (a, c, d, e))
        guarded(t("check"), checks)

        def counts():
            n_py = py.num_keys()
            n_rs = int(rust.cmd("num-keys"))
            check(t("num_keys agrees"), n_py == n_rs and n_py >= 5, (n_py, n_rs))
        guarded(t("num_keys"), counts)

        def deletes():
            a = py.delete_key("r/a")
            c = rust.cmd("check r/a")
            d = rust.cmd("delete p/a")
            e = py.check(["p/a"])
            f = rust.cmd("delete p/a")
            check(t("delete_key both ways (second delete: false)"), (a, c, d, e, f) == (True, "false", "true", False, "false"),
                  (a, c, d, e, f))
        guarded(t("delete_key"), deletes)

        def appends():
            rust.cmd("append r/ap ab")
            py.append("r/ap", "cd")
            got_rs = rust.cmd("get r/ap")
            got_py = py.get("r/ap")
            check(t("append: rust then torch"), (got_rs, got_py) == ("abcd", b"abcd"), (got_rs, got_py))
        guarded(t("append"), appends)

        def multi():
            rust.cmd("multi-set r/m1 x r/m2 yy")
            got = py.multi_get(["r/m1", "r/m2"])
            check(t("rust multi_set -> torch multi_get"), [b(x) for x in got] == [b"x", b"yy"], got)
            py.multi_set(["p/m1", "p/m2"], ["1", "22"])
            got2 = rust.cmd("multi-get p/m2 p/m1")
            check(t("torch multi_set -> rust multi_get"), got2 == "22 1", got2)
        guarded(t("multi_get/multi_set"), multi)

        def rust_waits():
            rust.send("wait r/late1 r/late2")
            early = rust.reply(0.3)
            py.set("r/late1", "1")
            mid = rust.reply(0.3)
            t0 = time.monotonic()
            py.add("r/late2", 1)
            got = rust.reply(10)
            dt = time.monotonic() - t0
            check(t("rust wait is woken by torch writes (only once every key exists)"),
                  early is None and mid is None and got == "ok" and dt < 2, (early, mid, got, dt))
        guarded(t("rust wait"), rust_waits)

        def rust_get_blocks():
            rust.send("get r/later")
            early = rust.reply(0.3)
            py.set("r/later", "v")
            got = rust.reply(10)
            check(t("rust get blocks until torch sets the key"), early is None and got == "v", (early, got))
        guarded(t("rust get blocks"), rust_get_blocks)

        def torch_waits():
            other = py_client_factory()
            done = {}

            def waiter():
                t0 = time.monotonic()
                other.wait(["p/late"])
                done["dt"] = time.monotonic() - t0
            th = threading.Thread(target=waiter, daemon=True)
            th.start()
            time.sleep(0.3)
            early = "dt" in done
            rust.cmd("set p/late 1")
            th.join(10)
            check(t("torch wait is woken by a rust write"), not early and "dt" in done and done["dt"] < 5, (early, done))
        guarded(t("torch wait"), torch_waits)

        def rust_timeout():
            t0 = time.monotonic()
            got = rust.cmd("wait-ms 200 r/never")
            dt = time.monotonic() - t0
            after = rust.cmd("ping")
            again = rust.cmd("get r/cs")
            check(t("rust wait times out by name (CANCEL_WAIT), the connection stays usable"),
                  got.startswith("error: store timeout") and "r/never" in got and 0.15 < dt < 5 and after == "ok" and again == "v2",
                  (got, dt, after, again))
        guarded(t("rust wait timeout"), rust_timeout)

        def torch_timeout():
            other = py_client_factory()
            t0 = time.monotonic()
            try:
                other.wait(["p/never"], datetime.timedelta(milliseconds=200))
                raised = None
            except Exception as e:  # noqa: BLE001 - torch raises DistStoreError (a RuntimeError)
                raised = e
            dt = time.monotonic() - t0
            other.set("p/after", "ok")
            got = other.get("p/after")
            check(t("torch wait times out, its connection stays usable"),
                  raised is not None and 0.15 < dt < 5 and got == b"ok", (repr(raised), dt, got))
        guarded(t("torch wait timeout"), torch_timeout)

        def binary_values():
            raw = bytes(range(256))
            py.set("p/bin", raw)
            hexed = rust.cmd("get-hex p/bin")
            check(t("binary values travel unchanged (256 byte values)"), hexed == raw.hex(), hexed[:40])
        guarded(t("binary"), binary_values)
    finally:
        rust.close()


def scenario_python_server(store_bin, TCPStore, libuv):
    kw = {} if libuv is None else {"use_libuv": libuv}
    tag = "torch server" + ("" if libuv is None else f", use_libuv={libuv}")
    print(f"{tag} + rust client", flush=True)
    try:
        srv = TCPStore("127.0.0.1", 0, None, True, TIMEOUT, wait_for_workers=False, **kw)
    except Exception as e:  # noqa: BLE001
        if libuv is not None and "libuv" in str(e):
            print(f"  (skipped: this torch has no libuv backend: {e})")
            return
        raise
    port = srv.port

    def client():
        return TCPStore("127.0.0.1", port, None, False, TIMEOUT, wait_for_workers=False)
    run_checks(tag, store_bin, port, srv, client)


def scenario_rust_server(store_bin, TCPStore):
    print("rust server + torch clients + rust client", flush=True)
    p = subprocess.Popen([store_bin, "serve", "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline().strip()
        if not line.startswith("listening "):
            check("rust server starts", False, line)
            return
        port = int(line.split()[1])

        def client():
            return TCPStore("127.0.0.1", port, None, False, TIMEOUT, wait_for_workers=False)
        py = client()
        run_checks("rust server", store_bin, port, py, client)

        def torch_world_size_clients():
            # A torch client given world_size (and wait_for_workers) counts itself in `init/`
            # with ADD, as torch's rendezvous does; our server serves it like any key.
            a = TCPStore("127.0.0.1", port, 2, False, TIMEOUT, wait_for_workers=True)
            c = TCPStore("127.0.0.1", port, 2, False, TIMEOUT, wait_for_workers=True)
            a.set("w/x", "1")
            check("[rust server] torch clients with world_size join and share keys", c.get("w/x") == b"1")
        guarded("[rust server] world_size clients", torch_world_size_clients)

        def server_goes_away():
            other = client()
            p.stdin.close()
            p.wait(timeout=10)
            t0 = time.monotonic()
            try:
                other.get("never-set")
                raised = None
            except Exception as e:  # noqa: BLE001
                raised = e
            dt = time.monotonic() - t0
            check("[rust server] a stopped server is an error for torch clients, not a hang",
                  raised is not None and dt < 10, (repr(raised), dt))
        guarded("[rust server] server goes away", server_goes_away)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


# ---------------------------------------------------------------------------------------------
# A pure-Python stand-in for torch's TCPStore (client and server), to check this script.

class _Standin:
    VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, APPEND, MULTI_GET, \
        MULTI_SET, CANCEL_WAIT, PING = range(14)

    def __init__(self, host, port, world_size=None, is_master=False, timeout=TIMEOUT, wait_for_workers=True, use_libuv=None):
        self.timeout = timeout.total_seconds()
        if is_master:
            self._serve(port)
            port = self.port
        self.port = port
        self.s = socket.create_connection((host, port), timeout=self.timeout)
        self.s.sendall(struct.pack("<BI", self.VALIDATE, 0x3C85F7CE))
        if world_size is not None and wait_for_workers:
            self._add("init/", 1)

    # server
    def _serve(self, port):
        lsock = socket.socket()
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind(("0.0.0.0", port))
        lsock.listen(64)
        self.port = lsock.getsockname()[1]
        self.map = {}
        self.cv = threading.Condition()
        threading.Thread(target=self._accept, args=(lsock,), daemon=True).start()

    def _accept(self, lsock):
        while True:
            c, _ = lsock.accept()
            threading.Thread(target=self._conn, args=(c,), daemon=True).start()

    @staticmethod
    def _read(c, n):
        buf = b""
        while len(buf) < n:
            chunk = c.recv(n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf

    def _rvec(self, c):
        (n,) = struct.unpack("<Q", self._read(c, 8))
        return self._read(c, n)

    def _conn(self, c):
        vec = lambda v: struct.pack("<Q", len(v)) + v  # noqa: E731
        try:
            while True:
                (q,) = self._read(c, 1)
                with self.cv:
                    pass
                if q == self.VALIDATE:
                    self._read(c, 4)
                elif q == self.PING:
                    c.sendall(self._read(c, 4))
                elif q in (self.SET, self.APPEND):
                    k, v = self._rvec(c), self._rvec(c)
                    with self.cv:
                        self.map[k] = (self.map.get(k, b"") + v) if q == self.APPEND else v
                        self.cv.notify_all()
                elif q == self.MULTI_SET:
                    (n,) = struct.unpack("<Q", self._read(c, 8))
                    for _ in range(n):
                        k, v = self._rvec(c), self._rvec(c)
                        with self.cv:
                            self.map[k] = v
                            self.cv.notify_all()
                elif q == self.COMPARE_SET:
                    k, exp, des = self._rvec(c), self._rvec(c), self._rvec(c)
                    with self.cv:
                        cur = self.map.get(k)
                        if (cur is None and exp == b"") or cur == exp:
                            self.map[k] = des
                            self.cv.notify_all()
                            out = des
                        else:
                            out = exp if cur is None else cur
                    c.sendall(vec(out))
                elif q == self.GET:
                    k = self._rvec(c)
                    with self.cv:
                        c.sendall(vec(self.map.get(k, b"")))
                elif q == self.MULTI_GET:
                    (n,) = struct.unpack("<Q", self._read(c, 8))
                    ks = [self._rvec(c) for _ in range(n)]
                    with self.cv:
                        c.sendall(b"".join(vec(self.map.get(k, b"")) for k in ks))
                elif q == self.ADD:
                    k = self._rvec(c)
                    (d,) = struct.unpack("<q", self._read(c, 8))
                    with self.cv:
                        v = int(self.map.get(k, b"0")) + d
                        self.map[k] = str(v).encode()
                        self.cv.notify_all()
                    c.sendall(struct.pack("<q", v))
                elif q in (self.CHECK, self.WAIT):
                    (n,) = struct.unpack("<Q", self._read(c, 8))
                    ks = [self._rvec(c) for _ in range(n)]
                    if q == self.CHECK:
                        with self.cv:
                            c.sendall(bytes([0 if all(k in self.map for k in ks) else 1]))
                        continue
                    while True:
                        with self.cv:
                            if all(k in self.map for k in ks):
                                c.sendall(b"\x00")
                                break
                            self.cv.wait(0.02)
                        r, _, _ = select.select([c], [], [], 0)
                        if r:
                            self._read(c, 1)  # CANCEL_WAIT
                            c.sendall(b"\x01")
                            break
                elif q == self.CANCEL_WAIT:
                    c.sendall(b"\x01")
                elif q == self.GETNUMKEYS:
                    with self.cv:
                        c.sendall(struct.pack("<q", len(self.map)))
                elif q == self.DELETE_KEY:
                    k = self._rvec(c)
                    with self.cv:
                        n = 1 if self.map.pop(k, None) is not None else 0
                    c.sendall(struct.pack("<q", n))
                else:
                    return
        except (EOFError, OSError):
            return

    # client
    @staticmethod
    def _key(k):
        return b("/" + k)

    def _send(self, q, *parts):
        self.s.sendall(bytes([q]) + b"".join(parts))

    @staticmethod
    def _vec(v):
        v = b(v)
        return struct.pack("<Q", len(v)) + v

    def _recv(self, n):
        return self._read(self.s, n)

    def _add(self, raw_key, d):
        self._send(self.ADD, self._vec(raw_key), struct.pack("<q", d))
        return struct.unpack("<q", self._recv(8))[0]

    def _wait(self, keys, timeout):
        self._send(self.WAIT, struct.pack("<Q", len(keys)), *[self._vec(self._key(k)) for k in keys])
        r, _, _ = select.select([self.s], [], [], timeout)
        if r:
            self._recv(1)
            return
        self._send(self.CANCEL_WAIT)
        if self._recv(1) == b"\x00":
            self._recv(1)
        raise RuntimeError("Socket Timeout")

    def set(self, k, v):
        self._send(self.SET, self._vec(self._key(k)), self._vec(v))

    def get(self, k):
        self._wait([k], self.timeout)
        self._send(self.GET, self._vec(self._key(k)))
        (n,) = struct.unpack("<Q", self._recv(8))
        return self._recv(n)

    def add(self, k, d):
        return self._add(self._key(k), d)

    def compare_set(self, k, e, d):
        self._send(self.COMPARE_SET, self._vec(self._key(k)), self._vec(e), self._vec(d))
        (n,) = struct.unpack("<Q", self._recv(8))
        return self._recv(n)

    def check(self, keys):
        self._send(self.CHECK, struct.pack("<Q", len(keys)), *[self._vec(self._key(k)) for k in keys])
        return self._recv(1) == b"\x00"

    def wait(self, keys, timeout=None):
        self._wait(keys, self.timeout if timeout is None else timeout.total_seconds())

    def delete_key(self, k):
        self._send(self.DELETE_KEY, self._vec(self._key(k)))
        return struct.unpack("<q", self._recv(8))[0] == 1

    def num_keys(self):
        self._send(self.GETNUMKEYS)
        return struct.unpack("<q", self._recv(8))[0]

    def append(self, k, v):
        self._send(self.APPEND, self._vec(self._key(k)), self._vec(v))

    def multi_get(self, keys):
        self._wait(keys, self.timeout)
        self._send(self.MULTI_GET, struct.pack("<Q", len(keys)), *[self._vec(self._key(k)) for k in keys])
        out = []
        for _ in keys:
            (n,) = struct.unpack("<Q", self._recv(8))
            out.append(self._recv(n))
        return out

    def multi_set(self, keys, values):
        self._send(self.MULTI_SET, struct.pack("<Q", len(keys)),
                   *[self._vec(self._key(k)) + self._vec(v) for k, v in zip(keys, values)])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store-bin", help="path to a built concord-store (default: cargo build --release)")
    ap.add_argument("--pure-python-standin", action="store_true",
                    help="use a pure-Python TCPStore stand-in instead of torch (checks the script only)")
    a = ap.parse_args()
    store_bin = find_store_bin(a.store_bin)
    if a.pure_python_standin:
        TCPStore, version, libuv_modes = _Standin, "pure-Python stand-in (NOT PyTorch)", [None]
    else:
        try:
            import torch
            from torch.distributed import TCPStore
        except ImportError as e:
            sys.exit(f"FAIL: PyTorch is not importable ({e}); run on the GPU machine or pass --pure-python-standin")
        version = f"torch {torch.__version__}"
        libuv_modes = [True, False]
    print(f"tcpstore interop: {version}; concord-store at {store_bin}", flush=True)
    for libuv in libuv_modes:
        guarded(f"torch server use_libuv={libuv}", lambda: scenario_python_server(store_bin, TCPStore, libuv))
    guarded("rust server", lambda: scenario_rust_server(store_bin, TCPStore))
    failed = [r for r in results if not r[1]]
    print(f"\n{len(results) - len(failed)} of {len(results)} checks passed against {version}")
    if a.pure_python_standin:
        print("NOTE: stand-in run: this checks the script, it proves nothing about PyTorch's TCPStore")
    if failed:
        for name, _, detail in failed:
            print(f"FAIL {name}: {detail}")
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
