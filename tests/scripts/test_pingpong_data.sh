#!/usr/bin/env bash
# The bytes of a real application's traffic, checked: rdma-core's unmodified ibv_rc_pingpong
# server against pingpong_verify (tests/apps), a client of our own that speaks the same
# out-of-band exchange and checks every byte the server echoes back (the server receives into
# one buffer and sends that buffer back, so each reply must equal the message it answers).
# ibv_rc_pingpong -c alone checks one byte per page on the client only.
#
#   test_pingpong_data.sh PATH_TO_UROCE PATH_TO_PINGPONG_VERIFY
#
# Needs root (uroce add makes /dev/infiniband nodes); otherwise skips (exit 77).
# Last line: "N passed, M failed"; exit 1 if M > 0.
set -u
# shellcheck source=lib.sh
source "$(dirname "$(readlink -f "$0")")/lib.sh"
VERIFY=$(readlink -f "${2:-}")
lib_init "$1"

for tool in ibv_rc_pingpong ss timeout; do
    if ! command -v "$tool" >/dev/null; then
        skip "$tool is not installed"
        finish
    fi
done
if [[ ! -x $VERIFY ]]; then
    not_ok "pingpong_verify is built" "not an executable: ${2:-(none given)}"
    finish
fi
require_root "ibv_rc_pingpong data check over uroce"

OCT=$(pick_octet 61) || echo "# warning: every 127.0.61..80.* block has UDP sockets; using 127.0.$OCT"
A="ppd$$a"
B="ppd$$b"
IP_A="127.0.$OCT.1"
IP_B="127.0.$OCT.2"
add_device "$A" "$IP_A" --mtu 4096 || finish
add_device "$B" "$IP_B" --mtu 4096 || finish

# verified LABEL FAULTS ITERS SIZE MTU [SERVER_ARGS...]: ibv_rc_pingpong server on A, the
# verifying client on B. FAULTS is a UROCE_FAULTS value or "-".
verified() {
    local label=$1 faults=$2 iters=$3 size=$4 mtu=$5
    shift 5
    local port envs=(UROCE_STATS=1) linger=0
    port=$(free_tcp_port) || { not_ok "$label: no free TCP port"; return; }
    if [[ $faults != - ]]; then
        envs+=("UROCE_FAULTS=$faults")
        linger=2000  # let the server's last message be acknowledged despite the loss
    fi
    run_pair "$label" "$port" $((90 + iters / 50)) "${envs[@]}" \
        -- ibv_rc_pingpong -d "$A" -g 0 -p "$port" -n "$iters" -s "$size" -m "$mtu" "$@" \
        -- "$VERIFY" -d "$B" -p "$port" -n "$iters" -s "$size" -m "$mtu" -l "$linger" "$IP_A"
    expect_pair_ok "$label" || return
    expect_file_match "$label: every reply equals its message" \
        "^pingpong_verify: $iters iterations of $size bytes: every reply equals its message" "$CLI_OUT"
    expect_file_match "$label: the server completed $iters iterations" "^$iters iters in" "$SRV_OUT"
    expect_eq "$label: server rx_bad_icrc=0" 0 "$(counter_value "$SRV_ERR" "$A" rx_bad_icrc)"
    expect_eq "$label: client rx_bad_icrc=0" 0 "$(counter_value "$CLI_ERR" "$B" rx_bad_icrc)"
    if [[ $faults != - ]]; then
        local drops
        drops=$(( $(counter_value "$SRV_ERR" "$A" tx_dropped_fault) + $(counter_value "$CLI_ERR" "$B" tx_dropped_fault) ))
        if [[ $drops -gt 0 ]]; then
            ok "$label: packets were lost and recovered ($drops dropped)"
        else
            not_ok "$label: packets were lost (tx_dropped_fault > 0)" "$(counters_line "$SRV_ERR" "$A")" "$(counters_line "$CLI_ERR" "$B")"
        fi
    fi
}

# Sizes around the inline limit (256), the path MTU and its multiples, odd tails.
verified "poll -s 1" - 500 1 1024
verified "poll -s 255" - 500 255 1024
verified "poll -s 257" - 500 257 1024
verified "poll -s 1023" - 500 1023 1024
verified "poll -s 4097" - 300 4097 1024
verified "poll -s 65536" - 200 65536 1024
verified "poll -m 4096 -s 65535" - 200 65535 4096
verified "event -m 256 -s 3000" - 200 3000 256 -e
# Loss in both directions: go-back-N must still deliver the exact bytes.
verified "drop5% -s 10000" drop=0.05,seed=3 100 10000 1024
finish
