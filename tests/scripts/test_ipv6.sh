#!/usr/bin/env bash
# RoCEv2 over IPv6 through real applications: devices on IPv6 addresses (`uroce add --ip`),
# their GID, rdma-core's ibv_rc_pingpong and ibv_ud_pingpong over them, every byte checked by
# pingpong_verify (tests/apps), two processes on one device, the provider's capture read by
# tshark and by an independent ICRC check (check_icrc.py), addresses refused with a clear
# message, and a connection between an IPv4 and an IPv6 device refused when the QP is
# connected.
#
#   test_ipv6.sh PATH_TO_UROCE PATH_TO_PINGPONG_VERIFY PATH_TO_CHECK_ICRC
#
# Runs in a network namespace of its own (unshare -n), where lo holds two unique-local IPv6
# addresses next to ::1 and 127.0.0.1. Needs root (namespace, /dev nodes); else skips (77).
# Last line: "N passed, M failed"; exit 1 if M > 0.
set -u
if [[ ${UROCE_IPV6_NETNS:-} != 1 && $EUID -eq 0 ]] && command -v unshare >/dev/null; then
    exec unshare -n env UROCE_IPV6_NETNS=1 bash "$0" "$@"
fi
# shellcheck source=lib.sh
source "$(dirname "$(readlink -f "$0")")/lib.sh"
VERIFY=$(readlink -f "${2:-}")
CHECK_ICRC=$(readlink -f "${3:-}")
lib_init "$1"

for tool in ibv_rc_pingpong ibv_ud_pingpong ibv_devinfo tshark python3 ip ss timeout; do
    if ! command -v "$tool" >/dev/null; then
        skip "$tool is not installed"
        finish
    fi
done
if [[ ! -x $VERIFY || ! -f $CHECK_ICRC ]]; then
    not_ok "pingpong_verify and check_icrc.py are given" "got: ${2:-(none)} ${3:-(none)}"
    finish
fi
require_root "RoCEv2 over IPv6" "a network namespace and /dev/infiniband nodes"
if [[ ${UROCE_IPV6_NETNS:-} != 1 ]]; then
    not_ok "a network namespace of the test's own (unshare -n)" "unshare is missing or failed"
    finish
fi

IP6_A=fd00:7572:6::1
IP6_B=fd00:7572:6::2
if out=$(ip link set lo up 2>&1 && ip -6 addr add "$IP6_A/128" dev lo nodad 2>&1 &&
    ip -6 addr add "$IP6_B/128" dev lo nodad 2>&1); then
    ok "the namespace's lo holds $IP6_A and $IP6_B"
else
    not_ok "the namespace's lo holds $IP6_A and $IP6_B" "$out"
    finish
fi

# ------------------------------------------------------------- addresses refused
# refused LABEL IP PATTERN: `uroce add` exits 2 with a message matching PATTERN.
refused() {
    local out rc
    out=$("$UROCE" add "v6bad$$" --ip "$2" 2>&1)
    rc=$?
    if [[ $rc -eq 2 ]] && grep -qE "$3" <<<"$out"; then
        ok "uroce add --ip $2 is refused: $1"
    else
        not_ok "uroce add --ip $2 is refused: $1" "exit $rc" "$out"
        [[ $rc -eq 0 ]] && "$UROCE" del "v6bad$$" >/dev/null 2>&1
    fi
}
refused "link-local" fe80::1 "link-local IPv6 address"
refused "multicast" ff02::1 "multicast address"
refused "unspecified" :: "cannot be a device address"
refused "not an address" fd00::1::2 "not a valid IP address"

# ------------------------------------------------------------- devices and GIDs
A="v6$$a"
B="v6$$b"
C="v4$$c"
add_device "$A" "$IP6_A" --mtu 4096 || finish
add_device "$B" "$IP6_B" --mtu 4096 || finish
add_device "$C" 127.0.0.1 || finish
expect_file_match "uroce list: $A has its IPv6 address as its GID" \
    "^$A +$IP6_A +4791 +4096 +$IP6_A " <("$UROCE" list)
info=$("$UROCE" run -- ibv_devinfo -d "$A" -v 2>&1)
if grep -qE "GID\[ *0\]:[[:space:]]+$IP6_A, RoCE v2" <<<"$info"; then
    ok "ibv_devinfo: GID[0] of $A is $IP6_A, RoCE v2"
else
    not_ok "ibv_devinfo: GID[0] of $A is $IP6_A, RoCE v2" "$(grep -i gid <<<"$info")"
fi

# ------------------------------------------------------------- RC, every byte checked
# verified LABEL FAULTS ITERS SIZE MTU: ibv_rc_pingpong server on A, pingpong_verify on B.
verified() {
    local label=$1 faults=$2 iters=$3 size=$4 mtu=$5 port envs=(UROCE_STATS=1) linger=0
    port=$(free_tcp_port) || { not_ok "$label: no free TCP port"; return; }
    if [[ $faults != - ]]; then
        envs+=("UROCE_FAULTS=$faults")
        linger=2000
    fi
    run_pair "$label" "$port" 90 "${envs[@]}" \
        -- ibv_rc_pingpong -d "$A" -g 0 -p "$port" -n "$iters" -s "$size" -m "$mtu" \
        -- "$VERIFY" -d "$B" -p "$port" -n "$iters" -s "$size" -m "$mtu" -l "$linger" 127.0.0.1
    expect_pair_ok "$label" || return
    expect_file_match "$label: every reply equals its message" \
        "^pingpong_verify: $iters iterations of $size bytes: every reply equals its message" "$CLI_OUT"
    expect_file_match "$label: the server saw the client's IPv6 GID" "remote address: .*GID $IP6_B" "$SRV_OUT"
    expect_eq "$label: rx_bad_icrc=0 on both sides" "0/0" \
        "$(counter_value "$SRV_ERR" "$A" rx_bad_icrc)/$(counter_value "$CLI_ERR" "$B" rx_bad_icrc)"
    if [[ $faults != - ]]; then
        local drops
        drops=$(( $(counter_value "$SRV_ERR" "$A" tx_dropped_fault) + $(counter_value "$CLI_ERR" "$B" tx_dropped_fault) ))
        if [[ $drops -gt 0 ]]; then
            ok "$label: packets were lost and recovered ($drops dropped)"
        else
            not_ok "$label: packets were lost" "$(counters_line "$SRV_ERR" "$A")"
        fi
    fi
}
verified "rc -s 1" - 300 1 1024
verified "rc -s 65536" - 100 65536 1024
verified "rc -m 4096 -s 65535" - 100 65535 4096
verified "rc drop3% -s 10000" drop=0.03,seed=11 60 10000 1024

# Two processes on one IPv6 device (its contexts share the address and port).
port=$(free_tcp_port)
run_pair "shared device" "$port" 90 \
    -- ibv_rc_pingpong -d "$A" -g 0 -p "$port" -n 100 -s 20000 \
    -- "$VERIFY" -d "$A" -p "$port" -n 100 -s 20000 127.0.0.1
if expect_pair_ok "shared device"; then
    expect_file_match "shared device: every reply equals its message" \
        "^pingpong_verify: 100 iterations of 20000 bytes: every reply equals its message" "$CLI_OUT"
fi

# ------------------------------------------------------------- capture
port=$(free_tcp_port)
run_pair "capture" "$port" 60 UROCE_STATS=1 UROCE_RETRANSMIT=ack-timeout "UROCE_PCAP=$WORK/cap.%p.pcap" \
    -- ibv_rc_pingpong -d "$A" -g 0 -p "$port" -n 20 -s 10000 -c \
    -- ibv_rc_pingpong -d "$B" -g 0 -p "$port" -n 20 -s 10000 -c 127.0.0.1
if expect_pair_ok "capture"; then
    files=("$WORK"/cap.*.pcap)
    expect_eq "capture: one file per process" 2 "${#files[@]}"
    want=$(($(counter_value "$SRV_ERR" "$A" tx_packets) + $(counter_value "$SRV_ERR" "$A" rx_packets)))
    for f in "${files[@]}"; do
        protos=$(tshark -r "$f" -T fields -e frame.protocols 2>/dev/null | sort | uniq -c)
        bad=$(tshark -r "$f" -T fields -e frame.number -e frame.protocols 2>/dev/null |
            awk -F'\t' '$2 !~ /^eth:ethertype:ipv6:udp:infiniband(:|$)/')
        expect_eq "capture: ${f##*/}: every frame is RoCEv2 over IPv6" "" "$(head -n 5 <<<"$bad")"
        expect_eq "capture: ${f##*/}: no malformed packets, no expert info" "" \
            "$(tshark -r "$f" -Y "_ws.malformed || _ws.expert" 2>/dev/null | head -n 10)"
        echo "# ${f##*/}: $(tr -s ' \n' ' ' <<<"$protos")"
        if out=$(python3 "$CHECK_ICRC" --pmtu 1024 "$f" 2>&1); then
            ok "capture: ${f##*/}: every ICRC right over IPv6 ($(tail -n 1 <<<"$out"))"
        else
            not_ok "capture: ${f##*/}: every ICRC right over IPv6" "$out"
        fi
        if ! python3 "$CHECK_ICRC" --flip "$f" >/dev/null 2>&1; then
            ok "capture: ${f##*/}: the checker notices a flipped bit"
        else
            not_ok "capture: ${f##*/}: the checker notices a flipped bit"
        fi
    done
    # One frame per packet: the two files hold the server's and the client's packets, each
    # its process's counters plus at most the peer's last ACKs sent again (RcQp::send_last_ack)
    # that came after those were printed.
    want_c=$(($(counter_value "$CLI_ERR" "$B" tx_packets) + $(counter_value "$CLI_ERR" "$B" rx_packets)))
    s_rep=$(counter_value "$SRV_ERR" "$A" tx_last_ack_repeats)
    c_rep=$(counter_value "$CLI_ERR" "$B" tx_last_ack_repeats)
    got=()
    for f in "${files[@]}"; do got+=("$(tshark -r "$f" -T fields -e frame.number 2>/dev/null | wc -l)"); done
    if [[ ${#got[@]} -eq 2 && -n $s_rep && -n $c_rep ]] &&
        captures_fit "${got[0]}" "${got[1]}" "$want" "$want_c" "$s_rep" "$c_rep"; then
        ok "capture: one frame per packet sent and received (${got[*]}; server $want, client $want_c)"
    else
        not_ok "capture: one frame per packet sent and received" "frames: ${got[*]}" \
            "server sent+received $want, client $want_c; last ACKs sent again: ${s_rep:-?}, ${c_rep:-?}"
    fi
fi

# ------------------------------------------------------------- UD with a GRH
port=$(free_tcp_port)
run_pair "ud" "$port" 60 \
    -- ibv_ud_pingpong -d "$A" -g 0 -p "$port" -n 200 -s 2048 -c \
    -- ibv_ud_pingpong -d "$B" -g 0 -p "$port" -n 200 -s 2048 -c 127.0.0.1
if expect_pair_ok "ud -s 2048"; then
    expect_file_match "ud -s 2048: 200 iterations" "^200 iters in" "$CLI_OUT"
    expect_file_match "ud -s 2048: the client saw the server's IPv6 GID" "remote address: .*GID $IP6_A" "$CLI_OUT"
fi

# ------------------------------------------------------------- families do not mix
port=$(free_tcp_port)
run_pair "mixed" "$port" 30 \
    -- ibv_rc_pingpong -d "$A" -g 0 -p "$port" -n 5 \
    -- ibv_rc_pingpong -d "$C" -g 0 -p "$port" -n 5 127.0.0.1
if [[ $SRV_RC -ne 0 && $CLI_RC -ne 0 && $SRV_RC -ne 124 && $CLI_RC -ne 124 ]] &&
    grep -q "Failed to modify QP to RTR" "$SRV_OUT" "$SRV_ERR" "$CLI_OUT" "$CLI_ERR"; then
    ok "an IPv6 device and an IPv4 device: connecting the QP is refused (modify to RTR fails)"
else
    mapfile -t detail < <(pair_detail)
    not_ok "an IPv6 device and an IPv4 device: connecting the QP is refused" "${detail[@]}"
fi
finish
