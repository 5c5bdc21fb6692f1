#!/usr/bin/env bash
# Builds the x86-64 release binaries that must run on the GPU machine (which has no Rust
# toolchain) and copies them into dist/ with an entry script, dist/run-gpu.sh.
#
#   scripts/gpu/bundle.sh                 # (cargo xtask gpu-bundle) the conformance binary (every
#                                         # suite on every built-in backend, NCCL included), the NCCL
#                                         # benchmark, the store CLI + FileStore and TCPStore interop scripts
#   BUNDLE_TEST_PACKAGES="pkg ..." scripts/gpu/bundle.sh
#                                         # + the test executables (harness = false runners) of
#                                         #   those packages, copied under their target names
#
# Then, on the GPU machine:  dist/run-gpu.sh nccl [filter]   (the NCCL conformance suites, report
# in dist/report),  dist/run-gpu.sh bench [args]   (NCCL timings),  or  dist/run-gpu.sh <binary> [args...]
# dist/ is git-ignored; name it in the device tool's `carry`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dist=${DIST:-$root/dist}
target_dir=${CARGO_TARGET_DIR:-$root/target}
cd "$root"

if [ "$(uname -m)" != x86_64 ]; then
    echo "bundle.sh: this machine is $(uname -m); the GPU machine is x86-64. Build there or cross-compile." >&2
    exit 2
fi

cargo build --release -p concord-bench --bin concord-nccl-bench --bin concord-bench
cargo build --release -p concord-store --bin concord-store
cargo build --release -p concord-autotune --example tune
rm -rf "$dist/bin" "$dist/scripts"
mkdir -p "$dist/bin" "$dist/scripts"
cp "$target_dir/release/concord-nccl-bench" "$target_dir/release/concord-bench" "$target_dir/release/concord-store" "$dist/bin/"
cp "$target_dir/release/examples/tune" "$dist/bin/tune"
cp "$root/store/scripts/filestore_interop.py" "$root/store/scripts/tcpstore_interop.py" "$dist/scripts/"
BUNDLE_TEST_PACKAGES="concord-cli ${BUNDLE_TEST_PACKAGES:-}"

for pkg in ${BUNDLE_TEST_PACKAGES:-}; do
    # Each test executable's path comes from cargo's JSON messages (names carry a hash).
    cargo test --release -p "$pkg" --no-run --message-format=json \
        | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"].get("test"):
        print(m["target"]["name"] + " " + m["executable"])
' | while read -r name exe; do
        cp "$exe" "$dist/bin/$name"
        echo "bundled test executable $name"
    done
done

# The commit the binaries were built from (a `+dirty` mark when the tree had changes): the
# bench reports it (CONCORD_GIT_COMMIT, set by run-gpu.sh), not the GPU machine's `.git`.
commit=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
git -C "$root" diff --quiet HEAD 2>/dev/null || commit="$commit+dirty"
echo "$commit" > "$dist/COMMIT"
cp "$root/scripts/gpu/run-gpu.sh" "$dist/run-gpu.sh"
cp "$root/scripts/gpu/two-gpu.sh" "$dist/two-gpu.sh"
chmod +x "$dist/run-gpu.sh" "$dist/two-gpu.sh" "$dist"/bin/*
# Debug info is for this machine; what travels must stay well under 64 MiB.
strip "$dist"/bin/* 2>/dev/null || true

# The GPU machine's glibc may be older than this one's: say what the binaries need.
need=$(objdump -T "$dist"/bin/* 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -t. -k2,2n -k3,3n -u | tail -1 || true)
echo "bundled into $dist ($(du -sh "$dist" | cut -f1)); newest glibc symbol needed: ${need:-unknown}"
ls -l "$dist/bin"
