#!/usr/bin/env bash
# Hosts in one box: two network namespaces joined by a veth pair, each a "host" with its own
# address and its own UTS hostname; runs a program on ranks spread over both with mpirun (Open
# MPI's TCP BTL between the namespaces; mpirun reaches the second "host" through a fake rsh agent
# that enters its namespace instead of ssh).
#
#   scripts/netns/two-hosts.sh [--ranks-per-host N] -- PROGRAM [ARGS...]
#
# Every rank's traffic goes over TCP (`--mca btl tcp,self`, the veth subnet only); ranks yield
# when idle (both "hosts" share this box's cores: busy-polling made the differential test 30x
# slower). PROGRAM runs as every rank, with every CONCORD_* variable of the caller and
# CONCORD_STORE_ADDR (a TCP store address on the first host, for
# the conformance binary's external-launch mode, unless the caller set one). Exit status: PROGRAM's under mpirun; 77 with "SKIP: <reason>" where the machine
# does not allow namespaces (not root, no `ip netns`, no `unshare --uts`). Nothing is left behind
# (namespaces, veths, processes, temp files), even on failure or Ctrl-C.
set -euo pipefail

per_host=2
while [[ $# -gt 0 ]]; do
    case "$1" in
        --ranks-per-host) per_host="$2"; shift 2 ;;
        --) shift; break ;;
        *) break ;;
    esac
done
[[ $# -gt 0 ]] || { echo "usage: $0 [--ranks-per-host N] -- PROGRAM [ARGS...]" >&2; exit 2; }

skip() { echo "SKIP: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "network namespaces need root (uid $(id -u))"
command -v ip >/dev/null || skip "no \`ip\` command (iproute2)"
command -v unshare >/dev/null || skip "no \`unshare\` command (util-linux)"
command -v mpirun >/dev/null || skip "no mpirun (Open MPI)"

tag="cc$$"
ns_a="${tag}a"; ns_b="${tag}b"
host_a="${tag}-hosta"; host_b="${tag}-hostb"
addr_a=10.231.$(( $$ % 250 )).1; addr_b=10.231.$(( $$ % 250 )).2
subnet=10.231.$(( $$ % 250 )).0/24
tmp=$(mktemp -d "/tmp/concord-${tag}-XXXX")

child=
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    # mpirun first (it forwards the signal to every rank and daemon), then whatever is left.
    if [[ -n "$child" ]] && kill -0 "$child" 2>/dev/null; then
        kill -TERM "$child" 2>/dev/null || true
        for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$child" 2>/dev/null || break; sleep 0.3; done
    fi
    for ns in "$ns_a" "$ns_b"; do
        if ip netns list 2>/dev/null | grep -qw "$ns"; then
            # Every process still in the namespace: TERM, a grace period, then KILL.
            local pids; pids=$(ip netns pids "$ns" 2>/dev/null || true)
            [[ -n "$pids" ]] && kill -TERM $pids 2>/dev/null || true
            for _ in 1 2 3 4 5 6 7 8 9 10; do
                [[ -z "$(ip netns pids "$ns" 2>/dev/null)" ]] && break
                sleep 0.2
            done
            pids=$(ip netns pids "$ns" 2>/dev/null || true)
            [[ -n "$pids" ]] && kill -KILL $pids 2>/dev/null || true
            ip netns del "$ns" 2>/dev/null || true # removes its end of the veth, and so the pair
        fi
    done
    rm -rf "$tmp"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ip netns add "$ns_a" 2>"$tmp/err" || skip "ip netns add failed: $(cat "$tmp/err")"
ip netns add "$ns_b"
ip link add "${tag}va" type veth peer name "${tag}vb"
ip link set "${tag}va" netns "$ns_a"
ip link set "${tag}vb" netns "$ns_b"
ip -n "$ns_a" addr add "$addr_a/24" dev "${tag}va"
ip -n "$ns_b" addr add "$addr_b/24" dev "${tag}vb"
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" link set "${tag}va" up
ip -n "$ns_b" link set "${tag}vb" up
unshare --uts true 2>"$tmp/err" || skip "unshare --uts failed: $(cat "$tmp/err")"

# Each "host" resolves both names (mpirun and its daemons look them up).
printf '127.0.0.1 localhost\n%s %s\n%s %s\n' "$addr_a" "$host_a" "$addr_b" "$host_b" >"$tmp/hosts"

# The rsh agent: `agent HOST CMD...` runs CMD in HOST's namespace, under HOST's hostname.
cat >"$tmp/agent" <<EOF
#!/usr/bin/env bash
host="\$1"; shift
case "\$host" in
    $host_a) ns=$ns_a ;;
    $host_b) ns=$ns_b ;;
    *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" unshare --uts --mount sh -c "hostname \$host; mount --bind $tmp/hosts /etc/hosts; \$*"
EOF
chmod +x "$tmp/agent"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The TCP store of an externally launched world (the conformance binary): on the first host,
# where rank 0 runs, reached by the second over the veth pair.
export CONCORD_STORE_ADDR="${CONCORD_STORE_ADDR:-$addr_a:$(( 20000 + $$ % 20000 ))}"
echo "two-hosts: $host_a ($addr_a, netns $ns_a) and $host_b ($addr_b, netns $ns_b), $per_host ranks each; store $CONCORD_STORE_ADDR"
xs=(-x PATH)
for v in $(compgen -e | grep '^CONCORD_' || true); do xs+=(-x "$v"); done
set +e
ip netns exec "$ns_a" unshare --uts --mount sh -c "hostname $host_a; mount --bind $tmp/hosts /etc/hosts; exec \"\$@\"" sh \
    timeout -k 10 300 mpirun --oversubscribe \
    --host "$host_a:$per_host,$host_b:$per_host" -np $(( 2 * per_host )) \
    --mca plm_rsh_agent "$tmp/agent" \
    --mca btl tcp,self --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet" \
    --mca mpi_yield_when_idle 1 \
    "${xs[@]}" \
    "$@" &
child=$!
# `wait` (not a foreground command) so that a TERM / INT reaches the trap at once.
wait "$child"
rc=$?
set -e
echo "two-hosts: mpirun exited $rc"
exit $rc
