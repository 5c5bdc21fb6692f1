#!/usr/bin/env python3
"""Proves that Concord's Rust FileStore and PyTorch's c10d FileStore share one file.

Both directions, on real files:
  1. Rust writes (set, add, compare_set, delete) -> torch.distributed.FileStore reads them.
  2. torch writes (set, add, delete) -> Rust reads them; num_keys agrees on both sides.
  3. wait: a Rust waiter is woken by a torch write, and a torch waiter by a Rust write.
  4. refcount/cleanup: the last user removes the file, whichever side it is (both orders).
  5. The same operations produce byte-identical files from Rust and from torch.

Usage:
  python3 store/scripts/filestore_interop.py [--store-bin PATH]
Without --store-bin the script builds `concord-store` with cargo (release) and uses that.
Exits 0 with "PASS" only if every check passed; otherwise prints each failure and exits 1.

`--pure-python-standin` replaces torch with a small pure-Python re-implementation of c10d's
FileStore (for checking this script where PyTorch is not installed). It proves NOTHING about
PyTorch; the summary says so.
"""

import argparse
import datetime
import fcntl
import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = datetime.timedelta(seconds=20)

results = []  # (name, ok, detail)


def check(name, ok, detail=""):
    results.append((name, bool(ok), detail))
    print(("  ok   " if ok else "  FAIL ") + name + ("" if ok else f": {detail}"), flush=True)
    return ok


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


class RustStore:
    """One long-lived `concord-store FILE repl` process: one store user for its whole life."""

    def __init__(self, binary, path, workers):
        self.p = subprocess.Popen([binary, "--workers", str(workers), "--timeout-ms", "20000", path, "repl"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def __call__(self, *words):
        self.p.stdin.write(" ".join(str(w) for w in words) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"concord-store exited (rc={self.p.poll()}) on {words}")
        return line.rstrip("\n")

    def send_only(self, *words):
        self.p.stdin.write(" ".join(str(w) for w in words) + "\n")
        self.p.stdin.flush()

    def read_reply(self):
        return self.p.stdout.readline().rstrip("\n")

    def quit(self):
        self.p.stdin.write("quit\n")
        self.p.stdin.flush()
        rc = self.p.wait(timeout=20)
        if rc != 0:
            raise RuntimeError(f"concord-store exited with {rc}")


# --------------------------------------------------------------------------------------------
# Pure-Python stand-in for torch.distributed.FileStore (c10d's algorithm), for script self-tests.

class StandInFileStore:
    def __init__(self, path, world_size=-1):
        self.path, self.num_workers, self.pos, self.cache = path, world_size, 0, {}
        self.timeout = TIMEOUT
        self._add(b"refcount/", 1)

    def set_timeout(self, t):
        self.timeout = t

    def _locked(self, exclusive, fn, create=True):
        fd = os.open(self.path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            size = os.fstat(fd).st_size
            if size > self.pos:
                os.lseek(fd, self.pos, os.SEEK_SET)
                buf = os.read(fd, size - self.pos)
                i = 0
                while i < len(buf):
                    (n,) = struct.unpack_from("=I", buf, i); k = buf[i + 4:i + 4 + n]; i += 4 + n
                    (n,) = struct.unpack_from("=I", buf, i); v = buf[i + 4:i + 4 + n]; i += 4 + n
                    if k.startswith(b"-"):
                        self.cache.pop(k[1:], None)
                    else:
                        self.cache[k] = v
                self.pos = size
            return fn(fd)
        finally:
            os.close(fd)

    @staticmethod
    def _append(fd, k, v):
        os.lseek(fd, 0, os.SEEK_END)
        os.write(fd, struct.pack("=I", len(k)) + k + struct.pack("=I", len(v)) + v)

    def _add(self, k, d):
        def f(fd):
            new = int(self.cache.get(k, b"0") or b"0") + d
            self._append(fd, k, str(new).encode())
            return new
        return self._locked(True, f)

    def set(self, key, value):
        value = value.encode() if isinstance(value, str) else value
        self._locked(True, lambda fd: self._append(fd, b"/" + key.encode(), value))

    def get(self, key):
        deadline = time.time() + self.timeout.total_seconds()
        while True:
            v = self._locked(False, lambda fd: self.cache.get(b"/" + key.encode()))
            if v is not None:
                return v
            if time.time() > deadline:
                raise RuntimeError(f"timeout waiting for {key}")
            time.sleep(0.01)

    def add(self, key, d):
        return self._add(b"/" + key.encode(), d)

    def compare_set(self, key, expected, desired):
        k = b"/" + key.encode()
        expected = expected.encode() if isinstance(expected, str) else expected
        desired = desired.encode() if isinstance(desired, str) else desired

        def f(fd):
            cur = self.cache.get(k)
            if (cur is None and expected == b"") or (cur is not None and cur == expected):
                self._append(fd, k, desired)
                return desired
            return expected if cur is None else cur
        return self._locked(True, f)

    def check(self, keys):
        return self._locked(False, lambda fd: all(b"/" + k.encode() in self.cache for k in keys))

    def wait(self, keys, timeout=None):
        deadline = time.time() + (timeout or self.timeout).total_seconds()
        while not self.check(keys):
            if time.time() > deadline:
                raise RuntimeError("Wait timeout")
            time.sleep(0.01)

    def num_keys(self):
        return self._locked(False, lambda fd: len(self.cache))

    def delete_key(self, key):
        self._locked(True, lambda fd: self._append(fd, b"-/" + key.encode(), b""))
        return True

    def __del__(self):
        if not os.path.exists(self.path):
            return
        finished = self._add(b"cleanup/", 1)
        refs = self._add(b"refcount/", -1)
        if refs == 0 and self.num_workers >= 0 and finished >= self.num_workers:
            os.remove(self.path)


# --------------------------------------------------------------------------------------------

def py_store(FileStore, path, world_size):
    s = FileStore(path, world_size)
    s.set_timeout(TIMEOUT)
    return s


def run_checks(FileStore, binary, tmp):
    # 1 + 2: both directions on one file, one user on each side (world_size 2).
    f1 = os.path.join(tmp, "shared")
    rust = RustStore(binary, f1, 2)
    print("Rust writes -> torch reads")
    check("rust set", rust("set", "a", "hello") == "ok")
    check("rust add", rust("add", "n", 5) == "5" and rust("add", "n", 2) == "7")
    check("rust delete", rust("set", "gone", "x") == "ok" and rust("delete", "gone") == "true")
    check("rust compare_set (absent key, non-empty expected)", rust("compare-set", "cs", "nope", "v0") == "nope")
    rust("set", "cs", "v1")
    check("rust compare_set (match)", rust("compare-set", "cs", "v1", "v2") == "v2")
    py = py_store(FileStore, f1, 2)
    check("torch get of a Rust set", py.get("a") == b"hello", repr(py.get("a")))
    check("torch add on a Rust counter", py.add("n", 0) == 7)
    check("torch sees the Rust delete", py.check(["gone"]) is False)
    check("torch sees the Rust compare_set", py.get("cs") == b"v2", repr(py.get("cs")))
    check("torch compare_set mismatch returns current", py.compare_set("cs", "zzz", "v3") == b"v2")

    print("torch writes -> Rust reads")
    check("torch add", py.add("n", 10) == 17)
    py.set("b", "world")
    check("torch delete", py.delete_key("a") is True)
    check("Rust get of a torch set", rust("get", "b") == "world")
    check("Rust add on a torch counter", rust("add", "n", 0) == "17")
    check("Rust sees the torch delete", rust("check", "a") == "false")
    check("Rust check of present keys", rust("check", "b", "n") == "true")
    rn, pn = rust("num-keys"), py.num_keys()
    check("num_keys agrees", rn == str(pn), f"rust {rn} vs torch {pn}")

    print("wait in both directions")
    rust.send_only("wait", "late1")
    time.sleep(0.2)
    py.set("late1", "x")
    check("Rust wait woken by torch set", rust.read_reply() == "ok")
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("r", py.wait(["late2"], TIMEOUT) or "ok"))
    t.start()
    time.sleep(0.2)
    rust("set", "late2", "y")
    t.join(30)
    check("torch wait woken by Rust set", box.get("r") == "ok", repr(box))

    print("refcount/cleanup: the last user removes the file")
    del py
    check("file stays while Rust still uses it", os.path.exists(f1))
    rust.quit()
    check("Rust, the last user, removed the file", not os.path.exists(f1))

    f2 = os.path.join(tmp, "shared2")
    rust = RustStore(binary, f2, 2)
    rust("set", "k", "v")
    py = py_store(FileStore, f2, 2)
    check("torch reads from the second file", py.get("k") == b"v")
    rust.quit()
    check("file stays while torch still uses it", os.path.exists(f2))
    del py
    check("torch, the last user, removed the file", not os.path.exists(f2))

    print("byte-identical files")
    fa, fb = os.path.join(tmp, "by_torch"), os.path.join(tmp, "by_rust")
    py = py_store(FileStore, fa, 1)
    py.set("k", "v")
    py.add("c", 3)
    py.add("c", -1)
    py.compare_set("k", "v", "w")
    py.delete_key("k")
    py.delete_key("never-set")
    py.set("z", "last")
    rust = RustStore(binary, fb, 1)
    for cmd in (("set", "k", "v"), ("add", "c", 3), ("add", "c", -1), ("compare-set", "k", "v", "w"),
                ("delete", "k"), ("delete", "never-set"), ("set", "z", "last")):
        rust(*cmd)
    with open(fa, "rb") as a, open(fb, "rb") as b:
        ba, bb = a.read(), b.read()
    check("same ops -> same bytes", ba == bb, f"\n    torch: {ba!r}\n    rust:  {bb!r}")
    del py
    rust.quit()
    check("both single-user files removed on close", not os.path.exists(fa) and not os.path.exists(fb))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store-bin", help="path to the concord-store binary (default: build it with cargo)")
    ap.add_argument("--pure-python-standin", action="store_true",
                    help="use a pure-Python c10d re-implementation instead of torch (script self-test only)")
    a = ap.parse_args()
    if a.pure_python_standin:
        FileStore, what = StandInFileStore, "PURE-PYTHON STAND-IN (not PyTorch: proves nothing about torch)"
    else:
        try:
            import torch
            import torch.distributed as dist
        except ImportError as e:
            print(f"FAIL: PyTorch is not importable ({e}); run where torch is installed")
            return 1
        FileStore, what = dist.FileStore, f"torch {torch.__version__}"
    binary = find_store_bin(a.store_bin)
    print(f"FileStore interop: Rust {binary} <-> {what}")
    with tempfile.TemporaryDirectory(prefix="concord-interop-") as tmp:
        try:
            run_checks(FileStore, binary, tmp)
        except Exception as e:  # a crash is a failure, reported like one
            check("script ran to completion", False, f"{type(e).__name__}: {e}")
    failed = [r for r in results if not r[1]]
    print()
    if failed:
        print(f"FAIL: {len(failed)} of {len(results)} checks failed ({what})")
        for name, _, detail in failed:
            print(f"  - {name}: {detail}")
        return 1
    print(f"PASS: {len(results)} of {len(results)} checks passed ({what})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
