#!/usr/bin/env bash
# The provider's own packet captures (UROCE_PCAP, `uroce run --pcap`), read by tshark.
#
#   test_pcap.sh PATH_TO_UROCE
#
# ib_write_bw, ib_read_bw and ibv_rc_pingpong run between two loopback devices with GSO
# trains and GRO reads on (the default), each process writing its own file ("%p"). No
# dumpcap, no capture privilege: the files are the processes' own. Checks:
#   - one file per process; each holds one frame per packet its process sent or received
#     (tx_packets + rx_packets of its counters), none longer than one packet;
#   - trains show as numbered packets (IPv4 ids > 0), and every frame's ICRC is right
#     for the identification it carries (tests/scripts/check_icrc.py, which first
#     proves itself on the Linux rxe reference captures);
#   - tshark decodes every frame as RoCEv2, with no malformed packet and no expert info
#     (not even a warning or a note);
#   - the server's and the client's files hold the same packets (addresses, id, opcode,
#     PSN, ICRC), so the receiver recovered the identification the sender used;
#   - with UROCE_FAULTS corrupt=, the frames with a wrong ICRC in each file are exactly the
#     packets both sides corrupted, and each receiver refused what its peer corrupted;
#   - `uroce run --pcap FILE` writes FILE; a file that cannot be written makes
#     ibv_open_device fail with a message naming it.
# Root is needed only for `uroce add` (the /dev/infiniband nodes); otherwise skip (77).
# Last line: "N passed, M failed"; exit 1 if M > 0.
set -u
# shellcheck source=lib.sh
source "$(dirname "$(readlink -f "$0")")/lib.sh"
lib_init "$@"
SCRIPT_DIR=$(dirname "$(readlink -f "$0")")
CHECK_ICRC="$SCRIPT_DIR/check_icrc.py"

for tool in tshark python3 ibv_rc_pingpong ib_write_bw ib_read_bw ibv_devinfo ss timeout; do
    if ! command -v "$tool" >/dev/null; then
        skip "$tool is not installed"
        finish
    fi
done
require_root "uroce add" "uroce add makes /dev/infiniband nodes"

OCT=$(pick_octet 63) || echo "# warning: every 127.0.63..82.* block has UDP sockets; using 127.0.$OCT"
A="pc$$a"
B="pc$$b"
IP_A="127.0.$OCT.1"
IP_B="127.0.$OCT.2"
PMTU=1024
add_device "$A" "$IP_A" || finish
add_device "$B" "$IP_B" || finish
tsh() { tshark "$@" 2>>"$WORK/tshark.err"; }

if out=$(python3 "$CHECK_ICRC" "$SCRIPT_DIR/../data"/*.pcap 2>&1); then
    ok "ICRC checker accepts the rxe reference captures ($out)"
else
    not_ok "ICRC checker accepts the rxe reference captures" "$out"
    finish
fi

# captured LABEL KIND PROGRAM ARGS...: server on A, client on B, each writing
# $WORK/LABEL.<pid>.pcap; then checks both files.
captured() {
    local label=$1 kind=$2 prog=$3 port
    shift 3
    port=$(free_tcp_port) || { not_ok "$label: no free TCP port"; return; }
    local gid=(-x 0)
    [[ $kind == pingpong ]] && gid=(-g 0)
    # Exact comparisons between the two files: only the 67 ms local ACK timeout may resend
    # (a tail probe that a loaded machine sends late could reach a peer that has exited).
    run_pair "$label" "$port" 60 UROCE_STATS=1 UROCE_RETRANSMIT=ack-timeout \
        "UROCE_PCAP=$WORK/$label.%p.pcap" \
        -- "$prog" -d "$A" "${gid[@]}" -p "$port" "$@" \
        -- "$prog" -d "$B" "${gid[@]}" -p "$port" "$@" "$IP_A"
    expect_pair_ok "$label" || return
    local files=("$WORK/$label".*.pcap)
    if [[ ${#files[@]} -ne 2 || ! -s ${files[0]} ]]; then
        not_ok "$label: one capture file per process" "${files[*]}"
        return
    fi
    ok "$label: one capture file per process (${files[*]##*/})"

    # Loopback loses nothing: what one side sent, the other received, except the last ACK a
    # QP sends again as it is destroyed (tx_last_ack_repeats, RcQp::send_last_ack): the peer
    # may have stopped reading by then, or read it after it printed its counters.
    local s_tx s_rx c_tx c_rx s_rep c_rep
    s_tx=$(counter_value "$SRV_ERR" "$A" tx_packets)
    s_rx=$(counter_value "$SRV_ERR" "$A" rx_packets)
    c_tx=$(counter_value "$CLI_ERR" "$B" tx_packets)
    c_rx=$(counter_value "$CLI_ERR" "$B" rx_packets)
    s_rep=$(counter_value "$SRV_ERR" "$A" tx_last_ack_repeats)
    c_rep=$(counter_value "$CLI_ERR" "$B" tx_last_ack_repeats)
    if [[ -n $s_tx && -n $s_rx && -n $c_tx && -n $c_rx && -n $s_rep && -n $c_rep ]] &&
        ((c_rx <= s_tx && c_rx >= s_tx - s_rep && s_rx <= c_tx && s_rx >= c_tx - c_rep)); then
        ok "$label: the client received what the server sent, and back (but for last ACKs sent again: $s_rep, $c_rep)"
    else
        not_ok "$label: the client received what the server sent, and back" \
            "server sent $s_tx (of which $s_rep last ACKs again), received $s_rx" \
            "client sent $c_tx (of which $c_rep last ACKs again), received $c_rx"
    fi
    # Each file holds what its process sent and received: its counters, plus at most the
    # peer's last ACKs that came after they were printed. One file is the server's, one the
    # client's.
    local f n counts=()
    for f in "${files[@]}"; do counts+=("$(tsh -r "$f" -T fields -e frame.number | wc -l)"); done
    local s_tot=$((s_tx + s_rx)) c_tot=$((c_tx + c_rx))
    if captures_fit "${counts[0]}" "${counts[1]}" $s_tot $c_tot "$s_rep" "$c_rep"; then
        ok "$label: one frame per packet sent and received in each file (${counts[*]}; server $s_tot, client $c_tot)"
    else
        not_ok "$label: one frame per packet sent and received in each file" \
            "frames: ${counts[*]}" "server sent+received $s_tot, client $c_tot"
    fi
    local gso
    gso=$(($(counter_value "$SRV_ERR" "$A" tx_gso_sends) + $(counter_value "$CLI_ERR" "$B" tx_gso_sends)))
    if [[ $gso -gt 0 ]]; then
        ok "$label: packets left in GSO trains ($gso)"
    else
        not_ok "$label: packets left in GSO trains" "tx_gso_sends 0 on both sides"
    fi
    local maxlen
    maxlen=$(tsh -r "${files[0]}" -T fields -e udp.length | sort -n | tail -n 1)
    if [[ -n $maxlen && $maxlen -le $((PMTU + 8 + 12 + 16 + 4)) ]]; then
        ok "$label: every frame is one packet (the longest UDP length $maxlen)"
    else
        not_ok "$label: every frame is one packet" "the longest UDP length ${maxlen:-none}"
    fi
    local nonzero
    nonzero=$(tsh -r "${files[0]}" -Y "ip.id != 0" -T fields -e frame.number | wc -l)
    if [[ $nonzero -gt 0 ]]; then
        ok "$label: packets of trains carry IPv4 ids 1, 2, ... ($nonzero frames with id > 0)"
    else
        not_ok "$label: packets of trains carry IPv4 ids 1, 2, ..." "every frame has id 0"
    fi
    for f in "${files[@]}"; do
        out=$(tsh -r "$f" -T fields -e frame.number -e frame.protocols | awk -F'\t' '$2 !~ /(^|:)infiniband(:|$)/')
        expect_eq "$label: ${f##*/}: every frame decodes as RoCEv2" "" "$(head -n 5 <<<"$out")"
        out=$(tsh -r "$f" -Y "_ws.malformed || _ws.expert")
        expect_eq "$label: ${f##*/}: no malformed packets, no expert info of any severity" "" "$(head -n 10 <<<"$out")"
        if out=$(python3 "$CHECK_ICRC" --pmtu "$PMTU" "$f" 2>&1); then
            ok "$label: ${f##*/}: every ICRC is right for its frame's IPv4 id ($(tail -n1 <<<"$out"))"
        else
            IFS=$'\n' read -r -d '' -a lines <<<"$out"
            not_ok "$label: ${f##*/}: every ICRC is right for its frame's IPv4 id" "${lines[@]}"
        fi
    done
    local fields=(-T fields -e ip.src -e ip.dst -e ip.id -e udp.srcport -e infiniband.bth.opcode
        -e infiniband.bth.psn -e infiniband.invariant.crc)
    tsh -r "${files[0]}" "${fields[@]}" | sort >"$WORK/$label.first"
    tsh -r "${files[1]}" "${fields[@]}" | sort >"$WORK/$label.second"
    # The same packets, with the same IPv4 ids; a frame only one file holds must be one of
    # the last ACKs sent again (opcode 17, RC Acknowledge), no more of them from each side
    # than it sent.
    local only from_a from_b others
    only=$(comm -3 "$WORK/$label.first" "$WORK/$label.second" | sed 's/^\t//')
    from_a=$(awk -F'\t' -v a="$IP_A" '$1 == a && $5 == 17' <<<"$only" | grep -c . || true)
    from_b=$(awk -F'\t' -v a="$IP_A" '$1 != a && $5 == 17' <<<"$only" | grep -c . || true)
    others=$(awk -F'\t' '$5 != 17' <<<"$only" | grep -c . || true)
    if [[ $others -eq 0 && $from_a -le ${s_rep:-0} && $from_b -le ${c_rep:-0} ]]; then
        ok "$label: both files hold the same packets, with the same IPv4 ids (but for $from_a + $from_b last ACKs sent again)"
    else
        not_ok "$label: both files hold the same packets, with the same IPv4 ids" \
            "$(diff "$WORK/$label.first" "$WORK/$label.second" | head -n 6)"
    fi
}

captured ib_write_bw perftest ib_write_bw -s 16384 -n 20
captured ib_read_bw perftest ib_read_bw -s 16384 -n 20
captured pingpong pingpong ibv_rc_pingpong -s 4096 -n 20

# Corruption on the way (UROCE_FAULTS corrupt=): each side's file holds every corrupted
# packet, its own and its peer's, and those are exactly the frames whose ICRC is wrong; the
# receivers refused each of them, and the run still succeeds.
port=$(free_tcp_port)
run_pair corrupt "$port" 60 UROCE_STATS=1 "UROCE_FAULTS=corrupt=0.05,seed=5,until=150" \
    "UROCE_PCAP=$WORK/corrupt.%p.pcap" \
    -- ibv_rc_pingpong -d "$A" -g 0 -p "$port" -s 4096 -n 40 \
    -- ibv_rc_pingpong -d "$B" -g 0 -p "$port" -s 4096 -n 40 "$IP_A"
if expect_pair_ok corrupt; then
    s_bad=$(counter_value "$SRV_ERR" "$A" tx_corrupted_fault)
    c_bad=$(counter_value "$CLI_ERR" "$B" tx_corrupted_fault)
    s_ref=$(($(counter_value "$SRV_ERR" "$A" rx_bad_icrc) + $(counter_value "$SRV_ERR" "$A" rx_malformed)))
    c_ref=$(($(counter_value "$CLI_ERR" "$B" rx_bad_icrc) + $(counter_value "$CLI_ERR" "$B" rx_malformed)))
    if [[ $((s_bad + c_bad)) -gt 0 ]]; then
        ok "corrupt: packets left with a bit flipped (server $s_bad, client $c_bad)"
    else
        not_ok "corrupt: packets left with a bit flipped" "tx_corrupted_fault 0 on both sides"
    fi
    expect_eq "corrupt: each side refused what the other corrupted" "$c_bad/$s_bad" "$s_ref/$c_ref"
    for f in "$WORK"/corrupt.*.pcap; do
        out=$(python3 "$CHECK_ICRC" "$f" 2>&1)
        bad=$(sed -n 's/^icrc: [0-9]* packets, \([0-9]*\) bad$/\1/p' <<<"$out")
        expect_eq "corrupt: ${f##*/}: the frames with a wrong ICRC are the corrupted ones" \
            "$((s_bad + c_bad))" "$bad"
    done
fi

# ECN (docs/congestion.md): with UROCE_ECN=on every packet leaves ECT(0), and the client's
# UROCE_FAULTS ce= marks some of its SENDs CE on the way out. The server answers each marked
# one with a CNP (or paces it), both files show every packet's ECN field as it travelled,
# Wireshark decodes every frame, CNPs included, without complaint, and every ICRC holds (the
# ICRC masks the ECN field).
port=$(free_tcp_port)
run_pair ecn "$port" 60 UROCE_STATS=1 UROCE_ECN=on "UROCE_PCAP=$WORK/ecn.%p.pcap" \
    -- ibv_rc_pingpong -d "$A" -g 0 -p "$port" -s 4096 -n 40 \
    -- env "UROCE_FAULTS=ce=0.3,op=send,seed=7" \
    ibv_rc_pingpong -d "$B" -g 0 -p "$port" -s 4096 -n 40 "$IP_A"
if expect_pair_ok ecn; then
    marked=$(counter_value "$CLI_ERR" "$B" tx_ce_fault)
    seen=$(counter_value "$SRV_ERR" "$A" rx_ce_marked)
    cnps=$(counter_value "$SRV_ERR" "$A" tx_cnps)
    paced=$(counter_value "$SRV_ERR" "$A" cnps_paced)
    got=$(counter_value "$CLI_ERR" "$B" rx_cnp)
    if [[ ${marked:-0} -gt 0 && ${cnps:-0} -gt 0 ]]; then
        ok "ecn: the client marked SENDs CE ($marked), the server sent CNPs ($cnps, $paced paced)"
    else
        not_ok "ecn: the client marked SENDs CE, the server sent CNPs" \
            "tx_ce_fault ${marked:-none}, tx_cnps ${cnps:-none}"
    fi
    expect_eq "ecn: the server saw every mark, answered or paced each, the client got each CNP" \
        "$marked/$marked/$cnps" "$seen/$((cnps + paced))/$got"
    for f in "$WORK"/ecn.*.pcap; do
        n_ce=$(tsh -r "$f" -Y "ip.dsfield.ecn == 3 && infiniband.bth.opcode > 5" -T fields \
            -e frame.number | wc -l)
        expect_eq "ecn: ${f##*/}: the CE-marked frames are SENDs (RC opcodes 0-5)" 0 "$n_ce"
        n_ce=$(tsh -r "$f" -Y "ip.dsfield.ecn == 3" -T fields -e frame.number | wc -l)
        expect_eq "ecn: ${f##*/}: as many CE-marked frames as the client marked" "$marked" "$n_ce"
        other=$(tsh -r "$f" -Y "ip.dsfield.ecn != 2 && ip.dsfield.ecn != 3" -T fields -e frame.number | wc -l)
        expect_eq "ecn: ${f##*/}: every other frame is ECT(0)" 0 "$other"
        # Wireshark 4.0 names opcode 129 Unknown and shows the CNP's BTH byte 4 (BECN) as
        # reserved: the byte is checked as such.
        n_cnp=$(tsh -r "$f" -Y "infiniband.bth.opcode == 129 && udp.payload[4] == 40" \
            -T fields -e frame.number | wc -l)
        expect_eq "ecn: ${f##*/}: the server's CNPs, BECN set" "$cnps" "$n_cnp"
        out=$(tsh -r "$f" -Y "_ws.malformed || _ws.expert")
        expect_eq "ecn: ${f##*/}: no malformed packets, no expert info of any severity" "" \
            "$(head -n 10 <<<"$out")"
        if out=$(python3 "$CHECK_ICRC" "$f" 2>&1); then
            ok "ecn: ${f##*/}: every ICRC is right ($(tail -n1 <<<"$out"))"
        else
            IFS=$'\n' read -r -d '' -a lines <<<"$out"
            not_ok "ecn: ${f##*/}: every ICRC is right" "${lines[@]}"
        fi
    done
fi

# uroce run --pcap FILE: the file, with the packets of that process.
port=$(free_tcp_port)
timeout -k 5 60 "$UROCE" run -- ibv_rc_pingpong -d "$A" -g 0 -p "$port" -s 64 -n 5 \
    >"$WORK/flag.server.out" 2>&1 &
spid=$!
BG_PIDS+=("$spid")
wait_listen "$port" 10 "$spid"
timeout -k 5 60 "$UROCE" run --pcap "$WORK/flag.pcap" -- ibv_rc_pingpong -d "$B" -g 0 \
    -p "$port" -s 64 -n 5 "$IP_A" >"$WORK/flag.client.out" 2>&1
crc=$?
stop_timed "$spid"
wait "$spid"
forget_pid "$spid"
expect_eq "uroce run --pcap: the client succeeds" 0 "$crc"
n=$(tsh -r "$WORK/flag.pcap" -Y "infiniband.bth.opcode == 4" -T fields -e ip.src \
    -e infiniband.bth.psn | sort -u | wc -l)
# Five SENDs each way, each seen by the client: sent or received (a resend on a loaded
# machine is the same packet again).
expect_eq "uroce run --pcap FILE: FILE holds the client's 10 SEND Only packets" 10 "$n"

# A capture that cannot be written: the context is refused, saying why.
out=$(UROCE_PCAP=/nonexistent-uroce-dir/x.pcap timeout 30 "$UROCE" run -- ibv_devinfo -d "$A" 2>&1)
rc=$?
if [[ $rc -ne 0 && $out == *"cannot write the capture /nonexistent-uroce-dir/x.pcap"* ]]; then
    ok "an unwritable UROCE_PCAP makes ibv_open_device fail with a message (exit $rc)"
else
    not_ok "an unwritable UROCE_PCAP makes ibv_open_device fail with a message" "exit $rc" "$out"
fi
finish
