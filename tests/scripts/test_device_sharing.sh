#!/usr/bin/env bash
# One device, many processes: rdma-core's unmodified ibv_rc_pingpong server and our verifying
# client (tests/apps/pingpong_verify) on the SAME device, every byte checked; ibv_devinfo while
# traffic runs; two pairs at once (four processes on one device), one server killed with
# SIGKILL mid-transfer: its client gets a retry-exceeded error (no hang), the other pair
# finishes byte-exact, and a new pair runs on the device afterwards.
#
#   test_device_sharing.sh PATH_TO_UROCE PATH_TO_PINGPONG_VERIFY
#
# Needs root (uroce add makes /dev/infiniband nodes; sharing a device needs CAP_BPF).
set -u
# shellcheck source=lib.sh
source "$(dirname "$(readlink -f "$0")")/lib.sh"
VERIFY=$(readlink -f "${2:-}")
lib_init "$1"

for tool in ibv_rc_pingpong ibv_devinfo ss timeout pgrep; do
    if ! command -v "$tool" >/dev/null; then
        skip "$tool is not installed"
        finish
    fi
done
if [[ ! -x $VERIFY ]]; then
    not_ok "pingpong_verify is built" "not an executable: ${2:-(none given)}"
    finish
fi
require_root "device sharing"

OCT=$(pick_octet 81) || echo "# warning: every 127.0.81..100.* block has UDP sockets; using 127.0.$OCT"
A="shr$$a"
IP_A="127.0.$OCT.1"
add_device "$A" "$IP_A" --mtu 4096 || finish

# 1. Server and client on one device.
port=$(free_tcp_port) || { not_ok "a free TCP port"; finish; }
run_pair "one device" "$port" 90 UROCE_STATS=1 \
    -- ibv_rc_pingpong -d "$A" -g 0 -p "$port" -n 300 -s 8192 -m 1024 \
    -- "$VERIFY" -d "$A" -p "$port" -n 300 -s 8192 -m 1024 "$IP_A"
if expect_pair_ok "one device: ibv_rc_pingpong server and verifying client"; then
    expect_file_match "one device: every reply equals its message" \
        "^pingpong_verify: 300 iterations of 8192 bytes: every reply equals its message" "$CLI_OUT"
fi
# The device's counters (uroce stats: every context of every process, closed ones too) are
# exactly what the two processes counted (UROCE_STATS, printed as each closed the device);
# received packets may be more by the last ACKs a QP sends again as it is destroyed
# (RcQp::send_last_ack), which can arrive after the other process printed its figures.
late=$(( $(counter_value "$SRV_ERR" "$A" tx_last_ack_repeats) + $(counter_value "$CLI_ERR" "$A" tx_last_ack_repeats) ))
for c in tx_packets rx_packets tx_acks; do
    want=$(( $(counter_value "$SRV_ERR" "$A" "$c") + $(counter_value "$CLI_ERR" "$A" "$c") ))
    got=$("$UROCE" stats "$A" | awk -v k="$c" '$1 == k { print $2 }')
    if [[ $c == rx_packets ]]; then
        if [[ -n $got ]] && ((got >= want && got <= want + late)); then
            ok "uroce stats $A: $c is the sum of both processes' ($want) + at most $late last ACKs sent again ($got)"
        else
            not_ok "uroce stats $A: $c is the sum of both processes' + at most $late last ACKs sent again" \
                "want: $want .. $((want + late))" "got:  ${got:-none}"
        fi
    else
        expect_eq "uroce stats $A: $c is the sum of both processes' ($want)" "$want" "$got"
    fi
done
# The server's one QP did all of its process's traffic: its counters (read after the process
# exited) equal the process's, less what came for no QP (the client's last ACK sent again
# after this QP was destroyed).
srv_qpn=$(awk '/local address:/ { for (i = 1; i < NF; i++) if ($i == "QPN") { sub(",", "", $(i + 1)); print $(i + 1) } }' "$SRV_OUT")
if [[ -n $srv_qpn ]]; then
    for c in tx_packets rx_packets; do
        want=$(counter_value "$SRV_ERR" "$A" "$c")
        [[ $c == rx_packets ]] && want=$((want - $(counter_value "$SRV_ERR" "$A" rx_unknown_qp)))
        got=$("$UROCE" stats "$A" --qp "$srv_qpn" | awk -v k="$c" '$1 == k { print $2 }')
        expect_eq "uroce stats $A --qp $srv_qpn (the server's QP, process gone): $c ($want)" "$want" "$got"
    done
    stats=$("$UROCE" stats "$A" --qp "$srv_qpn")
    got=$(awk '$1 == "tx_payload_bytes" { print $2 }' <<<"$stats")
    if [[ $(awk '$1 == "retransmitted_packets" { print $2 }' <<<"$stats") == 0 ]]; then
        expect_eq "the server's QP sent 300 replies of 8192 bytes" "$((300 * 8192))" "$got"
    else  # a stall on a loaded machine made it resend some: at least the replies
        expect_eq "the server's QP sent at least 300 replies of 8192 bytes" 1 "$((got >= 300 * 8192))"
    fi
else
    not_ok "the server printed its QPN" "$(cat "$SRV_OUT")"
fi

# start_pair LABEL ITERS: an ibv_rc_pingpong server and a verifying client on device A, in the
# background. Sets P_SRV, P_CLI (pids of their `timeout` wrappers), P_PORT, P_OUT (prefix).
start_pair() {
    local label=$1 iters=$2
    P_PORT=$(free_tcp_port) || return 1
    P_OUT="$WORK/$label"
    timeout -k 5 120 "$UROCE" run -- ibv_rc_pingpong -d "$A" -g 0 -p "$P_PORT" -n "$iters" \
        -s 4096 -m 1024 >"$P_OUT.server.out" 2>"$P_OUT.server.err" &
    P_SRV=$!
    BG_PIDS+=("$P_SRV")
    wait_listen "$P_PORT" 10 "$P_SRV" || return 1
    timeout -k 5 120 "$UROCE" run -- "$VERIFY" -d "$A" -p "$P_PORT" -n "$iters" -s 4096 -m 1024 \
        "$IP_A" >"$P_OUT.client.out" 2>"$P_OUT.client.err" &
    P_CLI=$!
    BG_PIDS+=("$P_CLI")
}

# wait_rc PID: its exit status (bounded by the `timeout` it runs under).
wait_rc() {
    wait "$1"
    local rc=$?
    forget_pid "$1"
    return $rc
}

# expect_pair_done LABEL ITERS: waits for the pair start_pair started last; both exit 0 and
# every reply was checked.
expect_pair_done() {
    local crc src
    wait_rc "$P_CLI"; crc=$?
    wait_rc "$P_SRV"; src=$?
    expect_eq "$1: the pair finished (server, client exit status)" "0 0" "$src $crc"
    expect_file_match "$1: every reply equals its message" \
        "^pingpong_verify: $2 iterations of 4096 bytes: every reply equals its message" \
        "$P_OUT.client.out"
}

# 2. ibv_devinfo while a pair runs on the device.
if start_pair devinfo 20000; then
    sleep 0.5
    out=$(timeout 20 "$UROCE" run -- ibv_devinfo -d "$A" 2>&1)
    rc=$?
    if [[ $rc -eq 0 && $out == *"hca_id:"*"$A"* ]]; then
        ok "ibv_devinfo -d $A while traffic runs"
    else
        not_ok "ibv_devinfo -d $A while traffic runs" "exit $rc" "$out"
    fi
    expect_pair_done devinfo 20000
else
    not_ok "devinfo: the pair started"
fi

# 3. Two pairs at once; the first pair's server is killed with SIGKILL mid-transfer.
if start_pair killed 200000; then
    K_SRV=$P_SRV K_CLI=$P_CLI K_PORT=$P_PORT K_OUT=$P_OUT
    if start_pair survivor 20000; then
        sleep 0.5
        victim=$(pgrep -f "^ibv_rc_pingpong -d $A -g 0 -p $K_PORT " | head -1)
        if [[ -n $victim ]] && kill -KILL "$victim"; then
            ok "ibv_rc_pingpong server (pid $victim) killed with SIGKILL mid-transfer"
        else
            not_ok "found the first pair's server to kill" "$(pgrep -af ibv_rc_pingpong)"
        fi
        wait_rc "$K_CLI"; crc=$?
        wait_rc "$K_SRV"
        if [[ $crc -ne 0 && $crc -ne 124 && $crc -ne 137 ]] &&
            grep -q "retry counter exceeded\|no reply" "$K_OUT.client.err"; then
            ok "the killed server's client ends with an error, not a hang: $(tail -1 "$K_OUT.client.err")"
        else
            not_ok "the killed server's client ends with an error, not a hang" "exit $crc" \
                "$(tail -3 "$K_OUT.client.err")"
        fi
        expect_pair_done survivor 20000
    else
        not_ok "survivor: the pair started"
    fi
else
    not_ok "killed: the pair started"
fi

# 4. The device goes on after the kill.
port=$(free_tcp_port) || { not_ok "a free TCP port"; finish; }
run_pair "after" "$port" 90 \
    -- ibv_rc_pingpong -d "$A" -g 0 -p "$port" -n 200 -s 1024 -m 1024 \
    -- "$VERIFY" -d "$A" -p "$port" -n 200 -s 1024 -m 1024 "$IP_A"
if expect_pair_ok "after the kill: a new pair on the device"; then
    expect_file_match "after the kill: every reply equals its message" \
        "^pingpong_verify: 200 iterations of 1024 bytes: every reply equals its message" "$CLI_OUT"
fi
finish
