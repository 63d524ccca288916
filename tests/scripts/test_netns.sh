#!/usr/bin/env bash
# uroce across real (virtual) links: three network namespaces A, B and C, each pair joined by
# its own veth pair, one uroce device per address, verified traffic between all three.
#
#   test_netns.sh PATH_TO_UROCE PATH_TO_PINGPONG_VERIFY
#
# Topology (each link its own /24; the third octet names the pair, the last one the node):
#
#     A 10.81.12.1 --ab--(MTU 1500)--ba-- 10.81.12.2 B
#     B 10.81.23.2 --bc--(MTU 9000)--cb-- 10.81.23.3 C
#     C 10.81.13.3 --ca--(MTU 9000)--ac-- 10.81.13.1 A
#
# Each address has its device, registered (`uroce add`, run inside its namespace) with the
# port MTU its link can carry: 1024 on the 1500 link, 4096 on the 9000 links. A device can only
# be opened in the namespace that owns its address (the provider binds it). What runs:
#   - the unmodified ibv_rc_pingpong at both ends with -c, path MTU 1024 over the 1500 link,
#     4096 over the 9000 links;
#   - ibv_rc_pingpong as server against pingpong_verify (tests/apps) as client, which checks
#     every byte the server echoes, on every link, with and without loss and delay;
#   - path MTU 4096 over the 1500 link. uroce sends with DF set (IP_PMTUDISC_DO, as rxe does:
#     RoCE packets are not to be fragmented, RoCE NICs do not reassemble IP fragments), so the
#     kernel never fragments: a packet that does not fit the link is refused with EMSGSIZE,
#     and the provider fails that request at once with IBV_WC_LOC_QP_OP_ERR (its QP goes to
#     ERR) and counts it in tx_too_big. Path MTU is a segmentation limit, not a packet size:
#     messages whose packets all fit (a SEND of up to 1500 - 20 IPv4 - 8 UDP - 12 BTH - 4 ICRC
#     = 1456 bytes) go through. So the test asserts both: 1456-byte messages work, a 1457-byte
#     one fails cleanly (the error completion within seconds, no hang, no fragment on the
#     wire), and so does a 64 KiB one, whose GSO train the kernel refuses first (EINVAL,
#     tx_gso_fallbacks) before its packets are refused one by one;
#   - loss and delay on the links. Kernels need not have sch_netem (the test machines have
#     none), so the provider's own fault injector stands in for it: both ends of a link run
#     with UROCE_FAULTS='drop=0.02,seed=S;delay=300:100,seed=T' (2% of the packets each end
#     sends lost, every one 200-400 us late, which also reorders them), and the counters must
#     show that packets were dropped and delayed and that retransmission repaired the loss;
#   - the three links at once, A->B, B->C and C->A, under the same faults, with the injected
#     faults and the retransmissions read from `uroce stats --json` (the devices' counters
#     before and after);
#   - a routed path, A -1500- B -9000- C with B forwarding: verified traffic with path MTU
#     1024, and path MTU 4096 from C, which B cannot forward onto the 1500 link: C learns the
#     path MTU from B's ICMP "fragmentation needed" and its resend fails cleanly as above.
# Needs root (ip netns, uroce add makes /dev/infiniband nodes) and iproute2; otherwise skips
# (exit 77). Namespaces and links are removed on exit, also on failure.
# Last line: "N passed, M failed"; exit 1 if M > 0.
set -u
# shellcheck source=lib.sh
source "$(dirname "$(readlink -f "$0")")/lib.sh"
VERIFY=$(readlink -f "${2:-}")
lib_init "$1"

for tool in ip ibv_rc_pingpong ss timeout python3 qperf; do
    if ! command -v "$tool" >/dev/null; then
        skip "three network namespaces: $tool is not installed"
        finish
    fi
done
if [[ ! -x $VERIFY ]]; then
    not_ok "pingpong_verify is built" "not an executable: ${2:-(none given)}"
    finish
fi
require_root "three network namespaces" "ip netns; uroce add makes /dev/infiniband nodes"

T0=$SECONDS
# Names unique per run: namespaces and /dev/infiniband nodes are host-wide. The veth ends are
# created inside the namespaces, so their names (ab, ba, ...) cannot collide with anything.
NS_A="uroce_a$$" NS_B="uroce_b$$" NS_C="uroce_c$$"
IP_AB=10.81.12.1 IP_BA=10.81.12.2   # link A-B, MTU 1500
IP_BC=10.81.23.2 IP_CB=10.81.23.3   # link B-C, MTU 9000
IP_CA=10.81.13.3 IP_AC=10.81.13.1   # link C-A, MTU 9000
# Device XY: node X's device on its link to Y.
D_AB="nn$$ab" D_BA="nn$$ba" D_BC="nn$$bc" D_CB="nn$$cb" D_CA="nn$$ca" D_AC="nn$$ac"

netns_down() {
    local ns
    for ns in "$NS_A" "$NS_B" "$NS_C"; do ip netns del "$ns" 2>/dev/null; done
}

# veth NS1 IF1 IP1 NS2 IF2 IP2 MTU: a veth pair from NS1 to NS2, both ends up with MTU and
# their address in a /24.
veth() {
    ip -n "$1" link add "$2" type veth peer name "$5" netns "$4" &&
        ip -n "$1" link set "$2" mtu "$7" up && ip -n "$4" link set "$5" mtu "$7" up &&
        ip -n "$1" addr add "$3/24" dev "$2" && ip -n "$4" addr add "$6/24" dev "$5"
}

netns_up() {
    local ns
    for ns in "$NS_A" "$NS_B" "$NS_C"; do
        ip netns add "$ns" && ip -n "$ns" link set lo up || return 1
    done
    veth "$NS_A" ab "$IP_AB" "$NS_B" ba "$IP_BA" 1500 &&
        veth "$NS_B" bc "$IP_BC" "$NS_C" cb "$IP_CB" 9000 &&
        veth "$NS_C" ca "$IP_CA" "$NS_A" ac "$IP_AC" 9000
}

CLEANUP_FNS+=(netns_down)
if ! netns_up 2>"$WORK/netns.err"; then
    not_ok "three namespaces joined by three veth pairs" "$(cat "$WORK/netns.err")"
    finish
fi
ok "three namespaces $NS_A, $NS_B, $NS_C joined by three veth pairs"

# link_mtu NS IF: the MTU of interface IF in NS.
link_mtu() {
    ip -n "$1" -o link show dev "$2" 2>/dev/null | grep -o ' mtu [0-9]*' | awk '{ print $2 }'
}
expect_eq "link A-B has MTU 1500 at both ends" 1500/1500 "$(link_mtu "$NS_A" ab)/$(link_mtu "$NS_B" ba)"
expect_eq "link B-C has MTU 9000 at both ends" 9000/9000 "$(link_mtu "$NS_B" bc)/$(link_mtu "$NS_C" cb)"
expect_eq "link C-A has MTU 9000 at both ends" 9000/9000 "$(link_mtu "$NS_C" ca)/$(link_mtu "$NS_A" ac)"

# ------------------------------------------------------------------- devices
# ns_add_device NS NAME IP MTU: `uroce add` inside NS, where IP is local: no warning.
ns_add_device() {
    local out
    if out=$(ip netns exec "$1" "$UROCE" add "$2" --ip "$3" --mtu "$4" 2>&1); then
        DEVICES+=("$2")
        expect_eq "uroce add $2 --ip $3 --mtu $4 in its namespace: no warning" "" "$out"
        return 0
    fi
    not_ok "uroce add $2 --ip $3 --mtu $4" "$out"
    return 1
}
ns_add_device "$NS_A" "$D_AB" "$IP_AB" 1024 || finish
ns_add_device "$NS_B" "$D_BA" "$IP_BA" 1024 || finish
ns_add_device "$NS_B" "$D_BC" "$IP_BC" 4096 || finish
ns_add_device "$NS_C" "$D_CB" "$IP_CB" 4096 || finish
ns_add_device "$NS_C" "$D_CA" "$IP_CA" 4096 || finish
ns_add_device "$NS_A" "$D_AC" "$IP_AC" 4096 || finish

# The registry is one for all three namespaces, but an address belongs to one: `uroce add`
# run elsewhere warns, and the device cannot be opened outside its namespace.
out=$(ip netns exec "$NS_A" "$UROCE" add "nn$$x" --ip "$IP_BA" --port 4792 2>&1)
DEVICES+=("nn$$x")
expect_match "uroce add in namespace A with B's address warns that it is not local" \
    "$IP_BA is not an address of this host" "$out"
"$UROCE" del "nn$$x" >/dev/null 2>&1
out=$(ip netns exec "$NS_A" timeout -k 5 30 "$UROCE" run -- ibv_devinfo -d "$D_BA" 2>&1)
expect_match "B's device cannot be opened in namespace A" "$D_BA: cannot bind UDP" "$out"
out=$(ip netns exec "$NS_B" timeout -k 5 30 "$UROCE" run -- ibv_devinfo -d "$D_BA" 2>&1)
expect_match "B's device opens in namespace B (ibv_devinfo: PORT_ACTIVE, active_mtu 1024)" \
    "active_mtu:[[:space:]]+1024" "$out"

# ------------------------------------------------------------ pairs of apps
declare -A P_SPID P_CPID

# pair_start LABEL SECS SERVER_NS CLIENT_NS PORT [VAR=VALUE...] -- SERVER... -- CLIENT...
# Starts `uroce run -- SERVER...` in SERVER_NS (environment VAR=VALUE added to both sides),
# waits (10 s at most) until it listens on TCP PORT there, then starts the client in
# CLIENT_NS. Each side under `timeout SECS`. Output in $WORK/LABEL.{server,client}.{out,err}.
pair_start() {
    local label=$1 secs=$2 sns=$3 cns=$4 port=$5
    shift 5
    local envs=() srv=() cli=() i
    while [[ $# -gt 0 && $1 != -- ]]; do envs+=("$1"); shift; done
    shift
    while [[ $# -gt 0 && $1 != -- ]]; do srv+=("$1"); shift; done
    shift
    cli=("$@")
    local f="$WORK/$label"
    ip netns exec "$sns" env "${envs[@]}" timeout -k 5 "$secs" "$UROCE" run -- "${srv[@]}" \
        >"$f.server.out" 2>"$f.server.err" &
    P_SPID[$label]=$!
    BG_PIDS+=("${P_SPID[$label]}")
    for ((i = 0; i < 200; i++)); do
        [[ -n $(ip netns exec "$sns" ss -Htln "( sport = :$port )" 2>/dev/null) ]] && break
        kill -0 "${P_SPID[$label]}" 2>/dev/null || break
        sleep 0.05
    done
    ip netns exec "$cns" env "${envs[@]}" timeout -k 5 "$secs" "$UROCE" run -- "${cli[@]}" \
        >"$f.client.out" 2>"$f.client.err" &
    P_CPID[$label]=$!
    BG_PIDS+=("${P_CPID[$label]}")
}

# pair_wait LABEL [STOP_SERVER]: waits for the client, then for the server (or, with
# STOP_SERVER=stop, stops it: a server whose client failed waits for ever). Leaves SRV_RC,
# CLI_RC, SRV_OUT, SRV_ERR, CLI_OUT, CLI_ERR (for lib.sh's expect_pair_ok) and PAIR_SECS.
pair_wait() {
    local label=$1 stop=${2:-} start=$SECONDS spid=${P_SPID[$1]:-} cpid=${P_CPID[$1]:-}
    if [[ -z $spid || -z $cpid ]]; then
        not_ok "$label: was not started"
        return 1
    fi
    wait "$cpid"
    CLI_RC=$?
    forget_pid "$cpid"
    [[ $stop == stop ]] && stop_timed "$spid"
    wait "$spid"  # bounded by its own timeout
    SRV_RC=$?
    forget_pid "$spid"
    SRV_OUT="$WORK/$label.server.out" SRV_ERR="$WORK/$label.server.err"
    CLI_OUT="$WORK/$label.client.out" CLI_ERR="$WORK/$label.client.err"
    PAIR_SECS=$((SECONDS - start))
    echo "# $label: done at $((SECONDS - T0)) s"
}

# counter NAME FILE DEVICE: counter NAME of DEVICE's UROCE_STATS line in FILE (0 if none).
counter() {
    local v
    v=$(counter_value "$2" "$3" "$1")
    echo "${v:-0}"
}

# pingpong LABEL SNS SDEV SIP CNS CDEV ITERS SIZE MTU: ibv_rc_pingpong -c at both ends.
pingpong() {
    local label=$1 sns=$2 sdev=$3 sip=$4 cns=$5 cdev=$6 iters=$7 size=$8 mtu=$9 port side f
    port=$(free_tcp_port) || { not_ok "$label: no free TCP port"; return; }
    pair_start "$label" 60 "$sns" "$cns" "$port" UROCE_STATS=1 \
        -- ibv_rc_pingpong -d "$sdev" -g 0 -p "$port" -n "$iters" -s "$size" -m "$mtu" -c \
        -- ibv_rc_pingpong -d "$cdev" -g 0 -p "$port" -n "$iters" -s "$size" -m "$mtu" -c "$sip"
    pair_wait "$label" || return
    expect_pair_ok "$label" || return
    for side in server client; do
        f="$WORK/$label.$side"
        expect_file_match "$label: $side: $iters iters" "^$iters iters in [0-9.]+ seconds" "$f.out"
        if grep -qi "invalid data" "$f.out" "$f.err"; then
            not_ok "$label: $side: -c found invalid data" "$(grep -hi "invalid data" "$f.out" "$f.err" | head -n 3)"
        fi
    done
    expect_eq "$label: rx_bad_icrc=0 at both ends" 0/0 \
        "$(counter rx_bad_icrc "$SRV_ERR" "$sdev")/$(counter rx_bad_icrc "$CLI_ERR" "$cdev")"
}

# verified_start LABEL SNS SDEV SIP CNS CDEV FAULTS ITERS SIZE MTU: ibv_rc_pingpong -e server
# in SNS, pingpong_verify client in CNS, FAULTS (a UROCE_FAULTS value or -) at both ends.
verified_start() {
    local label=$1 sns=$2 sdev=$3 sip=$4 cns=$5 cdev=$6 faults=$7 iters=$8 size=$9 mtu=${10}
    local port envs=(UROCE_STATS=1) linger=0
    port=$(free_tcp_port) || { not_ok "$label: no free TCP port"; return 1; }
    if [[ $faults != - ]]; then
        envs+=("UROCE_FAULTS=$faults")
        # The client stays 1 s after the last reply, so that under loss the server's last
        # message can still be acknowledged.
        linger=1000
    fi
    pair_start "$label" 90 "$sns" "$cns" "$port" "${envs[@]}" \
        -- ibv_rc_pingpong -d "$sdev" -g 0 -p "$port" -n "$iters" -s "$size" -m "$mtu" -e \
        -- "$VERIFY" -d "$cdev" -p "$port" -n "$iters" -s "$size" -m "$mtu" -l "$linger" "$sip"
}

# verified_check LABEL SDEV CDEV FAULTS ITERS SIZE: the checks of a verified_start run.
verified_check() {
    local label=$1 sdev=$2 cdev=$3 faults=$4 iters=$5 size=$6
    pair_wait "$label" || return
    expect_pair_ok "$label" || return
    expect_file_match "$label: every reply equals its message" \
        "^pingpong_verify: $iters iterations of $size bytes: every reply equals its message" "$CLI_OUT"
    expect_file_match "$label: the server completed $iters iterations" "^$iters iters in" "$SRV_OUT"
    expect_eq "$label: rx_bad_icrc=0 at both ends" 0/0 \
        "$(counter rx_bad_icrc "$SRV_ERR" "$sdev")/$(counter rx_bad_icrc "$CLI_ERR" "$cdev")"
    [[ $faults == - ]] && return
    local c drops delays recov=0
    drops=$(($(counter tx_dropped_fault "$SRV_ERR" "$sdev") + $(counter tx_dropped_fault "$CLI_ERR" "$cdev")))
    delays=$(($(counter tx_delayed_fault "$SRV_ERR" "$sdev") + $(counter tx_delayed_fault "$CLI_ERR" "$cdev")))
    for c in retransmitted_packets tail_probes early_retransmits retransmit_timeouts; do
        recov=$((recov + $(counter $c "$SRV_ERR" "$sdev") + $(counter $c "$CLI_ERR" "$cdev")))
    done
    if [[ $drops -gt 0 && $delays -gt 0 && $recov -gt 0 ]]; then
        ok "$label: faults injected and repaired (tx_dropped_fault $drops, tx_delayed_fault $delays, retransmissions $recov)"
    else
        not_ok "$label: faults injected and repaired (tx_dropped_fault, tx_delayed_fault, retransmissions > 0)" \
            "dropped $drops, delayed $delays, retransmissions $recov" \
            "$(counters_line "$SRV_ERR" "$sdev")" "$(counters_line "$CLI_ERR" "$cdev")"
    fi
}

verified() {
    verified_start "$@" || return
    verified_check "$1" "$3" "$6" "$7" "$8" "$9"
}

# ------------------------------------------------------- clean links, all pairs
# ibv_rc_pingpong at both ends, path MTU 1024 over the 1500 link, 4096 over the 9000 links.
pingpong "A-B ibv_rc_pingpong -m 1024 -s 4096" "$NS_B" "$D_BA" "$IP_BA" "$NS_A" "$D_AB" 200 4096 1024
pingpong "B-C ibv_rc_pingpong -m 4096 -s 65536" "$NS_C" "$D_CB" "$IP_CB" "$NS_B" "$D_BC" 100 65536 4096
pingpong "C-A ibv_rc_pingpong -m 4096 -s 16384" "$NS_A" "$D_AC" "$IP_AC" "$NS_C" "$D_CA" 100 16384 4096
# Every byte checked, in both directions of each link.
verified "A-B verified -m 1024 -s 10000" "$NS_B" "$D_BA" "$IP_BA" "$NS_A" "$D_AB" - 200 10000 1024
verified "B-A verified -m 1024 -s 1456" "$NS_A" "$D_AB" "$IP_AB" "$NS_B" "$D_BA" - 200 1456 1024
verified "B-C verified -m 4096 -s 65536" "$NS_C" "$D_CB" "$IP_CB" "$NS_B" "$D_BC" - 100 65536 4096
verified "C-A verified -m 4096 -s 9000" "$NS_A" "$D_AC" "$IP_AC" "$NS_C" "$D_CA" - 200 9000 4096

# --------------------------------------------- path MTU 4096 over the 1500 link
# stats_json FILE: every device's counters (`uroce stats --json`) into FILE.
stats_json() { "$UROCE" stats --json >"$1" 2>>"$WORK/stats.err"; }

# PY_DELTA BEFORE AFTER: "DEVICE NAME GROWTH" lines, every counter of every device between
# two snapshots (one python3 start for all of them).
read -r -d '' PY_DELTA <<'EOF'
import json, sys
def load(path):
    return {d["device"]: d["counters"] for d in json.load(open(path))["devices"]}
before, after = load(sys.argv[1]), load(sys.argv[2])
for dev, counters in sorted(after.items()):
    for name, value in counters.items():
        print(dev, name, value - before.get(dev, {}).get(name, 0))
EOF
# deltas PREFIX: PREFIX.before.json and PREFIX.after.json into PREFIX.delta.
deltas() { python3 -c "$PY_DELTA" "$1.before.json" "$1.after.json" >"$1.delta" 2>>"$WORK/stats.err"; }
# delta PREFIX DEVICE NAME: the growth of DEVICE's counter NAME in PREFIX.delta (empty if none).
delta() { awk -v d="$2" -v n="$3" '$1 == d && $2 == n { print $3 }' "$1.delta"; }

# Every packet of a 1456-byte SEND fits a 1500-byte link, path MTU 4096 or not.
verified "A-B verified -m 4096 -s 1456 (each packet fits 1500)" \
    "$NS_B" "$D_BA" "$IP_BA" "$NS_A" "$D_AB" - 100 1456 4096

# too_big LABEL SIZE: pingpong_verify in A sends SIZE bytes with path MTU 4096 over the 1500
# link: its first send must fail with a local QP operation error, quickly, with tx_too_big.
too_big() {
    local label=$1 size=$2 port
    port=$(free_tcp_port) || { not_ok "$label: no free TCP port"; return; }
    stats_json "$WORK/$label.before.json"
    pair_start "$label" 30 "$NS_B" "$NS_A" "$port" \
        -- ibv_rc_pingpong -d "$D_BA" -g 0 -p "$port" -n 10 -s "$size" -m 4096 \
        -- "$VERIFY" -d "$D_AB" -p "$port" -n 10 -s "$size" -m 4096 "$IP_BA"
    pair_wait "$label" stop || return
    stats_json "$WORK/$label.after.json"
    deltas "$WORK/$label"
    if [[ $CLI_RC -eq 1 && $PAIR_SECS -lt 20 ]] &&
        grep -q "iteration 0: completion status local QP operation error" "$CLI_ERR"; then
        ok "$label: the first send fails at once with a local QP operation error"
    else
        not_ok "$label: the first send fails at once with a local QP operation error" \
            "client exit $CLI_RC after ${PAIR_SECS}s" "$(tail -n 3 "$CLI_OUT" "$CLI_ERR")"
    fi
    local big rx
    big=$(delta "$WORK/$label" "$D_AB" tx_too_big)
    rx=$(delta "$WORK/$label" "$D_BA" rx_packets)
    if [[ ${big:-0} -ge 1 ]]; then
        ok "$label: $D_AB counted the refused packet (tx_too_big +$big)"
    else
        not_ok "$label: $D_AB counted the refused packet (tx_too_big > 0)" "tx_too_big +${big:-?}" \
            "$(tail -n 3 "$WORK/stats.err")"
    fi
    expect_eq "$label: nothing reached B (its rx_packets did not grow)" 0 "${rx:-?}"
    if [[ $size -gt 4096 ]]; then
        big=$(delta "$WORK/$label" "$D_AB" tx_gso_fallbacks)
        if [[ ${big:-0} -ge 1 ]]; then
            ok "$label: the kernel refused the GSO train first (tx_gso_fallbacks +$big)"
        else
            not_ok "$label: the kernel refused the GSO train first (tx_gso_fallbacks > 0)" "+${big:-?}"
        fi
    fi
}
too_big "A-B -m 4096 -s 1457" 1457
too_big "A-B -m 4096 -s 65536" 65536

# ------------------------------------------------------------ loss and delay
# Both ends of each link lose 2% of what they send and send it 200-400 us late.
FAULTS_AB="drop=0.02,seed=7;delay=300:100,seed=3"
FAULTS_BC="drop=0.02,seed=11;delay=300:100,seed=5"
FAULTS_CA="drop=0.02,seed=13;delay=300:100,seed=9"
verified "A-B lossy -m 1024 -s 10000" "$NS_B" "$D_BA" "$IP_BA" "$NS_A" "$D_AB" "$FAULTS_AB" 60 10000 1024
verified "B-C lossy -m 4096 -s 65536" "$NS_C" "$D_CB" "$IP_CB" "$NS_B" "$D_BC" "$FAULTS_BC" 30 65536 4096
verified "C-A lossy -m 4096 -s 9000" "$NS_A" "$D_AC" "$IP_AC" "$NS_C" "$D_CA" "$FAULTS_CA" 100 9000 4096

# ---------------------------------------------------- all three links at once
stats_json "$WORK/all.before.json"
verified_start "all: A-B" "$NS_B" "$D_BA" "$IP_BA" "$NS_A" "$D_AB" "$FAULTS_AB" 60 10000 1024
verified_start "all: B-C" "$NS_C" "$D_CB" "$IP_CB" "$NS_B" "$D_BC" "$FAULTS_BC" 30 32768 4096
verified_start "all: C-A" "$NS_A" "$D_AC" "$IP_AC" "$NS_C" "$D_CA" "$FAULTS_CA" 100 9000 4096
verified_check "all: A-B" "$D_BA" "$D_AB" "$FAULTS_AB" 60 10000
verified_check "all: B-C" "$D_CB" "$D_BC" "$FAULTS_BC" 30 32768
verified_check "all: C-A" "$D_AC" "$D_CA" "$FAULTS_CA" 100 9000
stats_json "$WORK/all.after.json"
deltas "$WORK/all"
# The devices' own counters (every context of each, `uroce stats --json`) tell the same.
for link in "A-B $D_BA $D_AB" "B-C $D_CB $D_BC" "C-A $D_AC $D_CA"; do
    read -r name d1 d2 <<<"$link"
    sums=""
    for c in tx_dropped_fault tx_delayed_fault retransmitted_packets tx_packets; do
        v1=$(delta "$WORK/all" "$d1" "$c")
        v2=$(delta "$WORK/all" "$d2" "$c")
        sums+=" $c=$((${v1:-0} + ${v2:-0}))"
    done
    if [[ $sums =~ tx_dropped_fault=[1-9].*tx_delayed_fault=[1-9].*retransmitted_packets=[1-9] ]]; then
        ok "all: $name: uroce stats --json shows faults and retransmissions ($sums )"
    else
        not_ok "all: $name: uroce stats --json shows faults and retransmissions" "$sums" \
            "$(tail -n 3 "$WORK/stats.err" 2>/dev/null)"
    fi
done

# ------------------------------------------------ RDMA CM between namespaces
# The registry is the host's, so every namespace lists all six devices; the client names no
# source address. Its RDMA CM must pick the device whose address A's routing sends from to B
# (ab), not ba, the device registered with the destination address (B's: it cannot be opened
# in A). qperf -cm1 runs two tests: its server's child crashes after each one (qperf 0.4.11),
# once it has seen the client's DREQ, which uroce answers as it arrives (docs/rdma-cm.md).
label="A-B qperf -cm1, no source address"
port=$(free_tcp_port)
pair_start "$label" 60 "$NS_B" "$NS_A" "$port" \
    -- qperf -lp "$port" \
    -- qperf -lp "$port" "$IP_BA" -cm1 -m 4k -t 1 rc_bw rc_lat quit
pair_wait "$label"
if expect_pair_ok "$label"; then
    expect_eq "$label: a bandwidth" 1 "$(grep -c "bw  = " "$CLI_OUT")"
    expect_eq "$label: a latency" 1 "$(grep -c "latency  = " "$CLI_OUT")"
    expect_eq "$label: nothing printed on stderr" "" "$(cat "$CLI_ERR")"
fi

# ------------------------------------------------ a routed path: A -1500- B -9000- C
# B forwards between its two links; A reaches C's B-C address through B, and C reaches A's A-B
# address through B. uroce sends unicast RC packets with the kernel's default TTL (not the
# GRH hop limit of 1 the pingpongs set), so they cross the router.
routed_up() {
    ip netns exec "$NS_B" sysctl -qw net.ipv4.ip_forward=1 &&
        ip -n "$NS_A" route add 10.81.23.0/24 via "$IP_BA" &&
        ip -n "$NS_C" route add 10.81.12.0/24 via "$IP_BC"
}
if ! routed_up 2>"$WORK/routed.err"; then
    not_ok "B routes between A and C" "$(cat "$WORK/routed.err")"
else
    ok "B routes between A's A-B address and C's B-C address"
    verified "A-C via B verified -m 1024 -s 10000" "$NS_C" "$D_CB" "$IP_CB" "$NS_A" "$D_AB" - 100 10000 1024
    # Path MTU 4096 from C: its own link (9000) takes the packets, but B cannot forward them
    # onto the 1500 link (DF): B drops them and tells C (ICMP fragmentation needed), C's kernel
    # lowers its path MTU to A to 1500, the resend is refused with EMSGSIZE, and the request
    # fails as on a local link that is too small (later than there: after one retransmission
    # timeout).
    label="C-A via B -m 4096 -s 65536"
    port=$(free_tcp_port)
    stats_json "$WORK/routed.before.json"
    pair_start "$label" 30 "$NS_A" "$NS_C" "$port" \
        -- ibv_rc_pingpong -d "$D_AB" -g 0 -p "$port" -n 10 -s 65536 -m 4096 \
        -- "$VERIFY" -d "$D_CB" -p "$port" -n 10 -s 65536 -m 4096 "$IP_AB"
    pair_wait "$label" stop
    stats_json "$WORK/routed.after.json"
    deltas "$WORK/routed"
    if [[ $CLI_RC -eq 1 && $PAIR_SECS -lt 20 ]] &&
        grep -q "iteration 0: completion status local QP operation error" "$CLI_ERR"; then
        ok "$label: the first send fails with a local QP operation error, without hanging"
    else
        not_ok "$label: the first send fails with a local QP operation error, without hanging" \
            "client exit $CLI_RC after ${PAIR_SECS}s" "$(tail -n 3 "$CLI_OUT" "$CLI_ERR")"
    fi
    expect_match "$label: C learnt the path MTU 1500 to A from B (ip route get)" " mtu 1500" \
        "$(ip -n "$NS_C" route get "$IP_AB" 2>&1)"
    big=$(delta "$WORK/routed" "$D_CB" tx_too_big)
    if [[ ${big:-0} -ge 1 ]]; then
        ok "$label: $D_CB counted the refused packets (tx_too_big +$big)"
    else
        not_ok "$label: $D_CB counted the refused packets (tx_too_big > 0)" "tx_too_big +${big:-?}"
    fi
    expect_eq "$label: nothing reached A (its rx_packets did not grow)" 0 "$(delta "$WORK/routed" "$D_AB" rx_packets)"
fi

netns_down
echo "# total time $((SECONDS - T0)) s"
finish
