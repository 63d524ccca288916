#!/usr/bin/env bash
# What uroce puts on the wire, as Wireshark sees it.
#
#   test_tshark.sh PATH_TO_UROCE
#
# Captures UDP port 4791 on `lo` (only our 127.0.X.0/24 block, so that parallel
# tests do not mix in) with dumpcap while ibv_rc_pingpong (SEND), ib_write_bw /
# ib_write_lat (RDMA WRITE) and ib_read_bw / ib_read_lat (RDMA READ) run with
# small sizes and UROCE_GSO=off (loopback carries a GSO train whole, so a capture
# on lo shows it as one frame), then decodes the capture with tshark and checks that:
#   - every packet decodes as RoCEv2 (infiniband in frame.protocols) with
#     Wireshark's default port table, and the same with an explicit -d;
#   - the expected RC opcodes all appear;
#   - there is no malformed packet and no expert info of severity error;
#   - RETH DMA lengths are the message sizes;
#   - (python3) the ICRC of every packet is right and FIRST/MIDDLE packets carry
#     exactly one path MTU (1024) of payload. Wireshark 4.0 does not check the
#     ICRC (no status field; see `tshark -G fields | grep -i icrc`), so this
#     script computes it; the checker first proves itself on the Linux rxe
#     reference captures (tests/data), and on
#     a copy of our capture with one flipped bit.
# Then the same with GSO on, between two network namespaces joined by a veth pair
# whose ends take one segment per packet (gso_max_segs 1), so that the kernel cuts
# every train into datagrams as a NIC would: each must decode, and carry the ICRC
# for the IPv4 identification the kernel gave it (0, 1, 2, ... along a train).
# Capturing needs root: otherwise everything is skipped (exit 77).
# Last line: "N passed, M failed"; exit 1 if M > 0.
set -u
# shellcheck source=lib.sh
source "$(dirname "$(readlink -f "$0")")/lib.sh"
lib_init "$@"
SCRIPT_DIR=$(dirname "$(readlink -f "$0")")

for tool in tshark dumpcap ibv_rc_pingpong ib_write_bw ib_write_lat ib_read_bw ib_read_lat ss timeout; do
    if ! command -v "$tool" >/dev/null; then
        skip "$tool is not installed"
        finish
    fi
done
require_root "capturing on lo" "uroce add makes /dev/infiniband nodes; dumpcap captures"

T0=$SECONDS
OCT=$(pick_octet 43) || echo "# warning: every 127.0.43..62.* block has UDP sockets; using 127.0.$OCT"
A="ts$$a"
B="ts$$b"
IP_A="127.0.$OCT.1"
IP_B="127.0.$OCT.2"
PMTU=1024
add_device "$A" "$IP_A" || finish
add_device "$B" "$IP_B" || finish

PCAP="$WORK/uroce.pcap"
# tshark (and dumpcap) warn on stderr about running as root; keep that out.
tsh() { tshark "$@" 2>>"$WORK/tshark.err"; }

# ------------------------------------------------------------------ capture
dumpcap -i lo -f "udp port 4791 and net 127.0.$OCT.0/24" -B 64 -P -w "$PCAP" \
    >"$WORK/dumpcap.out" 2>"$WORK/dumpcap.err" &
DUMPCAP=$!
BG_PIDS+=("$DUMPCAP")
started=0
for ((i = 0; i < 300; i++)); do
    if grep -q "^Capturing on" "$WORK/dumpcap.err"; then started=1; break; fi
    kill -0 "$DUMPCAP" 2>/dev/null || break
    sleep 0.05
done
if [[ $started -ne 1 ]]; then
    not_ok "dumpcap starts capturing on lo" "$(cat "$WORK/dumpcap.err")"
    finish
fi
ok "dumpcap captures on lo"
sleep 0.3  # "Capturing on" comes just before the capture loop starts

# traffic LABEL KIND PROGRAM ARGS...: server on A, client on B.
traffic() {
    local label=$1 kind=$2 prog=$3 port
    shift 3
    port=$(free_tcp_port) || { not_ok "$label: no free TCP port"; return; }
    if [[ $kind == pingpong ]]; then
        run_pair "$label" "$port" 60 UROCE_STATS=1 UROCE_GSO=off \
            -- "$prog" -d "$A" -g 0 -p "$port" "$@" \
            -- "$prog" -d "$B" -g 0 -p "$port" "$@" "$IP_A"
    else
        run_pair "$label" "$port" 60 UROCE_STATS=1 UROCE_GSO=off \
            -- "$prog" -d "$A" -x 0 -p "$port" "$@" \
            -- "$prog" -d "$B" -x 0 -p "$port" "$@" "$IP_A"
    fi
    expect_pair_ok "$label"
    local v
    v=$(counter_value "$SRV_ERR" "$A" rx_bad_icrc)/$(counter_value "$CLI_ERR" "$B" rx_bad_icrc)
    expect_eq "$label: rx_bad_icrc=0 on both sides" "0/0" "$v"
}

traffic "pingpong -s 64" pingpong ibv_rc_pingpong -s 64 -n 10         # SEND Only
traffic "pingpong -s 4096" pingpong ibv_rc_pingpong -s 4096 -n 10     # SEND First/Middle/Last
traffic "ib_write_bw -s 8192" perftest ib_write_bw -s 8192 -n 20      # WRITE First/Middle/Last
traffic "ib_write_lat -s 64" perftest ib_write_lat -s 64 -n 20        # WRITE Only
traffic "ib_read_bw -s 8192" perftest ib_read_bw -s 8192 -n 20        # READ Request, Response First/Middle/Last
traffic "ib_read_lat -s 64" perftest ib_read_lat -s 64 -n 20          # READ Response Only

# stop_capture PID: lets dumpcap write out what it has (INT), at most 10 s.
stop_capture() {
    local i
    sleep 0.3
    kill -INT "$1" 2>/dev/null
    for ((i = 0; i < 100; i++)); do
        kill -0 "$1" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$1" 2>/dev/null
    wait "$1"
    forget_pid "$1"
}
stop_capture "$DUMPCAP"
echo "# $(grep -i "received/dropped" "$WORK/dumpcap.err")"
if grep -Eq "received/dropped on interface .*: [0-9]+/0 " "$WORK/dumpcap.err"; then
    ok "dumpcap dropped no packets"
else
    not_ok "dumpcap dropped no packets" "$(cat "$WORK/dumpcap.err")"
fi

# ------------------------------------------------------------------- decode
TOTAL=$(tsh -r "$PCAP" -T fields -e frame.number | wc -l)
echo "# $TOTAL packets captured"
if [[ $TOTAL -lt 100 ]]; then
    not_ok "the capture holds the traffic (>= 100 packets)" "got $TOTAL" "$(cat "$WORK/dumpcap.err" "$WORK/tshark.err")"
    finish
fi
ok "the capture holds the traffic ($TOTAL packets)"

if tsh -G decodes | grep -Pq '^udp\.port\t4791\tinfiniband$'; then
    ok "Wireshark decodes UDP port 4791 as InfiniBand (RoCEv2) by default"
else
    not_ok "Wireshark decodes UDP port 4791 as InfiniBand (RoCEv2) by default" "$(tsh -G decodes | grep 4791)"
fi

# not_ib [TSHARK ARGS...]: frames whose protocols lack infiniband.
not_ib() {
    tsh -r "$PCAP" "$@" -T fields -e frame.number -e frame.protocols | awk -F'\t' '$2 !~ /(^|:)infiniband(:|$)/'
}
out=$(not_ib)
expect_eq "every packet decodes as RoCEv2 (infiniband in frame.protocols)" "" "$(head -n 5 <<<"$out")"
out=$(not_ib -d udp.port==4791,infiniband)
expect_eq "every packet decodes as RoCEv2 with -d udp.port==4791,infiniband" "" "$(head -n 5 <<<"$out")"
out=$(tsh -r "$PCAP" -T fields -e frame.number -e ip.proto -e udp.dstport | awk -F'\t' '$2 != 17 || $3 != 4791')
expect_eq "every packet is UDP to port 4791" "" "$(head -n 5 <<<"$out")"

out=$(tsh -r "$PCAP" -Y "_ws.malformed || _ws.expert.severity >= error")
expect_eq "no malformed packets, no expert errors" "" "$(head -n 10 <<<"$out")"
out=$(tsh -r "$PCAP" -Y "_ws.expert" -T fields -e _ws.expert.message | sort | uniq -c)
if [[ -n $out ]]; then
    echo "# expert infos (below error):"
    while IFS= read -r l; do echo "#   $l"; done <<<"$out"
fi

declare -A OPNAME=(
    [0]="RC SEND First" [1]="RC SEND Middle" [2]="RC SEND Last" [4]="RC SEND Only"
    [6]="RC RDMA WRITE First" [7]="RC RDMA WRITE Middle" [8]="RC RDMA WRITE Last" [10]="RC RDMA WRITE Only"
    [12]="RC RDMA READ Request" [13]="RC RDMA READ Response First" [14]="RC RDMA READ Response Middle"
    [15]="RC RDMA READ Response Last" [16]="RC RDMA READ Response Only" [17]="RC Acknowledge"
)
tsh -r "$PCAP" -T fields -e infiniband.bth.opcode | sort -n | uniq -c >"$WORK/opcodes"
echo "# opcodes (count opcode):"
sed 's/^/#   /' "$WORK/opcodes"
for op in 0 1 2 4 6 7 8 10 12 13 14 15 16 17; do
    n=$(awk -v o="$op" '$2 == o { print $1 }' "$WORK/opcodes")
    if [[ ${n:-0} -gt 0 ]]; then
        ok "opcode $op (${OPNAME[$op]}) appears ($n packets)"
    else
        not_ok "opcode $op (${OPNAME[$op]}) appears"
    fi
done
out=$(awk '$2 !~ /^(0|1|2|4|6|7|8|10|12|13|14|15|16|17)$/' "$WORK/opcodes")
expect_eq "no opcode other than the expected RC ones" "" "$out"

# RETH DMA lengths: WRITE First/Only and READ Request carry the message size.
out=$(tsh -r "$PCAP" -Y "infiniband.bth.opcode == 6" -T fields -e infiniband.reth.dmalen | sort -u | paste -sd' ')
expect_eq "RETH DMA length of WRITE First is 8192" 8192 "$out"
# A READ asked for again after a lost (or late) response asks only for the rest (IBA
# 9.7.4.1.6): 8192 less whole packets, a multiple of 256 bytes whatever the MTU.
out=$(tsh -r "$PCAP" -Y "infiniband.bth.opcode == 12" -T fields -e infiniband.reth.dmalen | sort -nu | paste -sd' ')
rest=""
for len in $out; do
    case $len in
    64 | 8192) ;;
    *) [[ $len =~ ^[0-9]+$ ]] && ((len < 8192 && (8192 - len) % 256 == 0)) || rest+=" $len" ;;
    esac
done
expect_eq "RETH DMA lengths of READ Requests are 64 (ib_read_lat) and 8192 (ib_read_bw), or what a retried READ still lacks" \
    "64 8192:" "$(tr ' ' '\n' <<<"$out" | grep -xE '64|8192' | paste -sd' '):$rest"
out=$(tsh -r "$PCAP" -Y "infiniband.bth.opcode == 10" -T fields -e infiniband.reth.dmalen | sort -u | paste -sd' ')
expect_eq "RETH DMA length of WRITE Only is 64" 64 "$out"
out=$(tsh -r "$PCAP" -Y "infiniband.bth.opcode == 17" -T fields -e infiniband.aeth.syndrome.opcode | sort -u | paste -sd' ')
expect_eq "every Acknowledge is a positive ACK (AETH opcode 0)" 0 "$out"
out=$(tsh -r "$PCAP" -T fields -e infiniband.bth.p_key -e infiniband.bth.tver | sort -u | paste -sd' ')
expect_eq "P_Key 0xffff and transport version 0 everywhere" "65535	0" "$out"

# -------------------------------------------------------------------- ICRC
if ! command -v python3 >/dev/null; then
    skip "ICRC and payload-size check: python3 is not installed"
else
    CHECK_ICRC="$SCRIPT_DIR/check_icrc.py"
    REFS="$SCRIPT_DIR/../data"
    checker_ok=1
    if compgen -G "$REFS/*.pcap" >/dev/null; then
        if out=$(python3 "$CHECK_ICRC" "$REFS"/*.pcap 2>&1); then
            ok "ICRC checker accepts the rxe reference captures ($out)"
        else
            checker_ok=0
            not_ok "ICRC checker accepts the rxe reference captures" "$out"
        fi
    else
        checker_ok=0
        not_ok "ICRC checker accepts the rxe reference captures" "no captures at $REFS"
    fi
    if python3 "$CHECK_ICRC" --flip "$PCAP" >/dev/null 2>&1; then
        checker_ok=0
        not_ok "ICRC checker rejects a flipped payload bit"
    else
        ok "ICRC checker rejects a flipped payload bit"
    fi
    if [[ $checker_ok -eq 1 ]]; then
        if out=$(python3 "$CHECK_ICRC" --pmtu "$PMTU" "$PCAP" 2>&1); then
            ok "every packet has a correct ICRC and FIRST/MIDDLE carry $PMTU bytes ($(tail -n1 <<<"$out"))"
        else
            IFS=$'\n' read -r -d '' -a lines <<<"$out"
            not_ok "every packet has a correct ICRC and FIRST/MIDDLE carry $PMTU bytes" "${lines[@]}"
        fi
    else
        skip "ICRC of our capture: the checker failed its own checks"
    fi
fi

# ------------------------------------------- GSO trains cut by the kernel (veth)
NSA="tsa$$" NSB="tsb$$" VA="tsva$$" VB="tsvb$$"
NET_A=10.$((OCT + 150)).43.1 NET_B=10.$((OCT + 150)).43.2
NA="ts$$na" NB="ts$$nb"
netns_up() {
    ip netns add "$NSA" && ip netns add "$NSB" &&
        ip link add "$VA" type veth peer name "$VB" &&
        ip link set "$VA" netns "$NSA" && ip link set "$VB" netns "$NSB" &&
        ip -n "$NSA" addr add "$NET_A/24" dev "$VA" && ip -n "$NSB" addr add "$NET_B/24" dev "$VB" &&
        ip -n "$NSA" link set "$VA" gso_max_segs 1 up && ip -n "$NSB" link set "$VB" gso_max_segs 1 up &&
        ip -n "$NSA" link set lo up && ip -n "$NSB" link set lo up
}
netns_down() {
    ip netns del "$NSA" 2>/dev/null
    ip netns del "$NSB" 2>/dev/null
}
# ns_pair LABEL PROGRAM ARGS...: server in NSA on NA, client in NSB on NB, both with GSO
# on (the default) and UROCE_STATS=1.
ns_pair() {
    local label=$1 prog=$2 port i
    shift 2
    port=$(free_tcp_port) || { not_ok "$label: no free TCP port"; return; }
    ip netns exec "$NSA" env UROCE_STATS=1 timeout -k 5 60 "$UROCE" run -- \
        "$prog" -d "$NA" -x 0 -p "$port" "$@" >"$WORK/$label.server.out" 2>"$WORK/$label.server.err" &
    local spid=$!
    BG_PIDS+=("$spid")
    for ((i = 0; i < 200; i++)); do
        [[ -n $(ip netns exec "$NSA" ss -Htln "( sport = :$port )" 2>/dev/null) ]] && break
        kill -0 "$spid" 2>/dev/null || break
        sleep 0.05
    done
    ip netns exec "$NSB" env UROCE_STATS=1 timeout -k 5 60 "$UROCE" run -- \
        "$prog" -d "$NB" -x 0 -p "$port" "$@" "$NET_A" >"$WORK/$label.client.out" 2>"$WORK/$label.client.err"
    local crc=$?
    stop_timed "$spid"
    wait "$spid"
    local src=$?
    forget_pid "$spid"
    expect_eq "veth: $label: both sides succeed" "0/0" "$src/$crc"
    local sends
    sends=$(counter_value "$WORK/$label.server.err" "$NA" tx_gso_sends)/$(counter_value "$WORK/$label.client.err" "$NB" tx_gso_sends)
    if [[ $sends =~ ^[0-9]+/[0-9]+$ && $sends != 0/0 ]]; then
        ok "veth: $label: packets left in GSO trains (tx_gso_sends server/client $sends)"
    else
        not_ok "veth: $label: packets left in GSO trains" "tx_gso_sends server/client: $sends"
    fi
}
if ! command -v ip >/dev/null; then
    skip "GSO on a veth link: ip (iproute2) is not installed"
elif ! netns_up 2>"$WORK/netns.err"; then
    not_ok "two namespaces joined by a veth pair with gso_max_segs 1" "$(cat "$WORK/netns.err")"
    netns_down
else
    CLEANUP_FNS+=(netns_down)
    ok "two namespaces joined by a veth pair with gso_max_segs 1"
    add_device "$NA" "$NET_A" >/dev/null 2>&1
    add_device "$NB" "$NET_B" >/dev/null 2>&1
    VPCAP="$WORK/veth.pcap"
    ip netns exec "$NSA" dumpcap -i "$VA" -f "udp port 4791" -B 64 -P -w "$VPCAP" \
        >"$WORK/vdumpcap.out" 2>"$WORK/vdumpcap.err" &
    VDUMPCAP=$!
    BG_PIDS+=("$VDUMPCAP")
    for ((i = 0; i < 300; i++)); do
        grep -q "^Capturing on" "$WORK/vdumpcap.err" && break
        kill -0 "$VDUMPCAP" 2>/dev/null || break
        sleep 0.05
    done
    sleep 0.3
    ns_pair "ib_write_bw -s 16384" ib_write_bw -s 16384 -n 20
    ns_pair "ib_read_bw -s 16384" ib_read_bw -s 16384 -n 20
    stop_capture "$VDUMPCAP"
    netns_down
    VTOTAL=$(tsh -r "$VPCAP" -T fields -e frame.number | wc -l)
    MAXLEN=$(tsh -r "$VPCAP" -T fields -e udp.length | sort -n | tail -n 1)
    # A datagram of more than one packet would be a train the kernel did not cut.
    if [[ $VTOTAL -ge 100 && ${MAXLEN:-99999} -le $((PMTU + 8 + 12 + 16 + 4)) ]]; then
        ok "veth: the capture holds single packets, cut from trains ($VTOTAL, the longest UDP length $MAXLEN)"
    else
        not_ok "veth: the capture holds single packets, cut from trains" "$VTOTAL packets, the longest UDP length ${MAXLEN:-none}"
    fi
    out=$(tsh -r "$VPCAP" -T fields -e frame.number -e frame.protocols | awk -F'\t' '$2 !~ /(^|:)infiniband(:|$)/')
    expect_eq "veth: every packet decodes as RoCEv2" "" "$(head -n 5 <<<"$out")"
    out=$(tsh -r "$VPCAP" -Y "_ws.malformed || _ws.expert.severity >= error")
    expect_eq "veth: no malformed packets, no expert errors" "" "$(head -n 10 <<<"$out")"
    NONZERO=$(tsh -r "$VPCAP" -Y "ip.id != 0" -T fields -e frame.number | wc -l)
    if [[ $NONZERO -gt 0 ]]; then
        ok "veth: the kernel numbered the segments of trains ($NONZERO packets with IPv4 id > 0)"
    else
        not_ok "veth: the kernel numbered the segments of trains" "every packet has IPv4 id 0: no train was cut"
    fi
    if ! command -v python3 >/dev/null; then
        skip "veth: ICRC check: python3 is not installed"
    elif out=$(python3 "$CHECK_ICRC" --pmtu "$PMTU" "$VPCAP" 2>&1); then
        ok "veth: every packet's ICRC is right for its IPv4 identification ($(tail -n1 <<<"$out"))"
    else
        IFS=$'\n' read -r -d '' -a lines <<<"$out"
        not_ok "veth: every packet's ICRC is right for its IPv4 identification" "${lines[@]}"
    fi
fi

if [[ -n ${TSHARK_KEEP_PCAP:-} ]]; then
    cp "$PCAP" "$TSHARK_KEEP_PCAP" && echo "# capture copied to $TSHARK_KEEP_PCAP"
fi
echo "# total time $((SECONDS - T0)) s"
finish
