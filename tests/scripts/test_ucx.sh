#!/usr/bin/env bash
# UCX (ucx_perftest) and Open MPI over pml ucx on uroce devices on loopback.
#
#   test_ucx.sh PATH_TO_UROCE
#
# ucx_perftest, over UCX's rc_verbs and ud_verbs transports:
#   - UCP tests between two devices (server on A, client on B: UCX_NET_DEVICES is read by
#     each side): tag_lat, ucp_put_bw, ucp_am_bw;
#   - both processes on one device: tag_lat (UCP), am_lat (UCT; ucx_perftest's server takes
#     the client's -d, so a UCT test always runs on one device).
# UCP over rc_verbs needs a transport for its wireup messages: ud_verbs as "aux", as UCX's
# own "rc_v" alias does. Every run has -n ITERS, both sides must exit 0, the client must
# print its "Final:" line with ITERS iterations, and the devices used must have received
# packets (uroce stats), so that the traffic is known to have gone through uroce.
# Then mpi_pingpong.c (compiled with mpicc), 2 ranks under mpirun with --mca pml ucx, one
# rank per device (and both on one device for ud_verbs): exit 0 and its "ok" line.
# Needs root (uroce add makes /dev/infiniband nodes; two contexts on one device need BPF);
# skips (exit 77) without ucx_perftest; the MPI part skips without mpirun or mpicc.
# UCX_TEST_ITERS overrides the iteration count (default 1000), MPI_ROUNDS the ping-pong
# rounds per message size (default 10).
# Each ucx_perftest side runs under `timeout 30`, each mpirun under `timeout 60` (a run takes a
# few seconds; UCX gives up on a silent UD peer after about 30 s), so that even a run where
# nothing gets through stays inside meson's 600 s.
# Last line: "N passed, M failed"; exit 1 if M > 0.
set -u
# shellcheck source=lib.sh
source "$(dirname "$(readlink -f "$0")")/lib.sh"
lib_init "$@"
HERE=$(dirname "$(readlink -f "$0")")

for tool in ucx_perftest ss timeout; do
    if ! command -v "$tool" >/dev/null; then
        skip "$tool is not installed (ucx-utils)"
        finish
    fi
done
require_root "UCX over uroce"

T0=$SECONDS
ITERS=${UCX_TEST_ITERS:-1000}
WARMUP=100
ROUNDS=${MPI_ROUNDS:-10}
OCT=$(pick_octet 62) || echo "# warning: every 127.0.62..81.* block has UDP sockets; using 127.0.$OCT"
A="ux$$a"
B="ux$$b"
IP_A="127.0.$OCT.1"
IP_B="127.0.$OCT.2"
add_device "$A" "$IP_A" || finish
add_device "$B" "$IP_B" || finish

# UCX_TLS for each transport under test.
declare -A TLS=([rc_verbs]="rc_verbs,ud_verbs:aux" [ud_verbs]="ud_verbs")
# Unset anything of the caller's that would change which transports or devices UCX takes.
unset UCX_TLS UCX_NET_DEVICES UCX_IB_GID_INDEX UCX_UD_ETH_DGID_CHECK

# rx_packets DEVICE: the device's received packets so far (every context, uroce stats).
rx_packets() {
    "$UROCE" stats "$1" 2>/dev/null | awk '$1 == "rx_packets" { print $2 }'
}

# expect_rx LABEL DEVICE BEFORE: DEVICE received packets since BEFORE.
expect_rx() {
    local now
    now=$(rx_packets "$2")
    if [[ -n $now && -n $3 && $now -gt $3 ]]; then
        ok "$1: $2 received $((now - $3)) packets"
    else
        not_ok "$1: $2 received packets" "rx_packets before: ${3:-?}, after: ${now:-?}"
    fi
}

# final_iters FILE: the iterations column of ucx_perftest's "Final:" line (empty if none).
final_iters() {
    awk '$1 == "Final:" { print $2; exit }' "$1"
}

# perf LABEL SERVER_DEV CLIENT_DEV TLS -- CLIENT_ARGS...: one ucx_perftest pair.
perf() {
    local label=$1 sdev=$2 cdev=$3 tls=$4
    shift 5
    local port rx_s rx_c
    port=$(free_tcp_port) || { not_ok "$label: no free TCP port"; return; }
    rx_s=$(rx_packets "$sdev")
    rx_c=$(rx_packets "$cdev")
    # The server takes the test's parameters from the client, but UCX reads UCX_TLS and
    # UCX_NET_DEVICES from each side's own environment.
    run_pair "$label" "$port" 30 \
        -- env UCX_TLS="$tls" UCX_NET_DEVICES="$sdev:1" ucx_perftest -p "$port" \
        -- env UCX_TLS="$tls" UCX_NET_DEVICES="$cdev:1" \
        ucx_perftest "$IP_A" -p "$port" -n "$ITERS" -w "$WARMUP" "$@"
    expect_pair_ok "$label" || return
    local iters
    iters=$(final_iters "$CLI_OUT")
    if [[ -z $iters ]]; then
        not_ok "$label: client prints the Final: line" "$(tail -n 12 "$CLI_OUT")"
    else
        ok "$label: client prints the Final: line"
        echo "#   $(awk '$1 == "Final:"' "$CLI_OUT" | head -n 1)"
        expect_eq "$label: iterations" "$ITERS" "$iters"
    fi
    expect_rx "$label" "$sdev" "$rx_s"
    [[ $cdev != "$sdev" ]] && expect_rx "$label" "$cdev" "$rx_c"
    return 0
}

for tl in rc_verbs ud_verbs; do
    for t in tag_lat ucp_put_bw ucp_am_bw; do
        perf "$tl $t, two devices" "$A" "$B" "${TLS[$tl]}" -- -t "$t"
    done
    perf "$tl tag_lat, one device" "$A" "$A" "${TLS[$tl]}" -- -t tag_lat
    perf "$tl am_lat (UCT), one device" "$A" "$A" "${TLS[$tl]}" -- -t am_lat -x "$tl" -d "$A:1"
done

# ------------------------------------------------------------------ Open MPI
if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null; then
    skip "Open MPI ping-pong: mpirun or mpicc is not installed (openmpi-bin, libopenmpi-dev)"
    finish
fi
PP="$WORK/mpi_pingpong"
if out=$(timeout -k 5 120 mpicc -O2 -Wall -Wextra -Werror -o "$PP" "$HERE/mpi_pingpong.c" 2>&1); then
    ok "mpicc mpi_pingpong.c"
else
    not_ok "mpicc mpi_pingpong.c" "$out"
    finish
fi

# mpi LABEL TLS DEV_RANK0 DEV_RANK1: mpi_pingpong on 2 ranks over pml ucx, each rank on its
# device (mpirun -x gives every rank the same environment, so a shell picks the device by
# the rank Open MPI gives it).
mpi() {
    local label=$1 tls=$2 d0=$3 d1=$4
    local out="$WORK/mpi.$RANDOM.out" rc rx0 rx1
    rx0=$(rx_packets "$d0")
    rx1=$(rx_packets "$d1")
    # btl self only: pml ucx carries every message; no shared memory or TCP path beside it.
    # "self" in UCX_TLS for a rank's messages to itself.
    # shellcheck disable=SC2016  # the rank's shell expands them
    timeout -k 5 60 "$UROCE" run -- mpirun --allow-run-as-root --oversubscribe -np 2 \
        --mca pml ucx --mca btl self -x UCX_TLS="$tls,self" \
        bash -c 'if [[ $OMPI_COMM_WORLD_RANK == 0 ]]; then d=$0; else d=$1; fi
                 UCX_NET_DEVICES=$d:1 exec "$2" "$3"' "$d0" "$d1" "$PP" "$ROUNDS" \
        >"$out" 2>&1 </dev/null &
    local pid=$!
    BG_PIDS+=("$pid")
    wait "$pid"
    rc=$?
    forget_pid "$pid"
    if [[ $rc -eq 0 ]] && grep -q "^mpi_pingpong ok:" "$out"; then
        ok "$label: exit 0, $(grep -o "^mpi_pingpong ok:.*" "$out" | head -n 1)"
    else
        local why=""
        [[ $rc -eq 124 || $rc -eq 137 ]] && why=" (timed out)"
        # UCX's own error lines come before the backtraces that fill the tail.
        not_ok "$label: exit $rc$why" "$(grep -m 8 -E "UCX +(ERROR|FATAL)|^mpi_pingpong" "$out")" \
            "--- output (tail):" "$(tail -n 12 "$out")"
    fi
    expect_rx "$label" "$d0" "$rx0"
    [[ $d1 != "$d0" ]] && expect_rx "$label" "$d1" "$rx1"
    return 0
}

mpi "MPI ping-pong rc_verbs, two devices" "${TLS[rc_verbs]}" "$A" "$B"
mpi "MPI ping-pong ud_verbs, two devices" "${TLS[ud_verbs]}" "$A" "$B"
mpi "MPI ping-pong ud_verbs, one device" "${TLS[ud_verbs]}" "$A" "$A"

echo "# total time $((SECONDS - T0)) s"
finish
