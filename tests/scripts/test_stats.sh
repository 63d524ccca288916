#!/usr/bin/env bash
# `uroce stats` against known traffic: ibv_rc_pingpong between two loopback devices, then
# the device and QP figures it must show.
#
#   test_stats.sh PATH_TO_UROCE
#
# Checks:
#   - without NAME every device is listed ("device NAME" blocks; {"devices":[..]} in JSON);
#   - after a loss-free pingpong of N messages of S bytes each way, each device lists exactly
#     the QP the application printed (its QPN, "qp 0x..."), with N x S payload bytes sent and
#     received; the device's packets are the sum of its QPs'; --qp QPN and --json say the same
#     as the listing (every counter);
#   - --watch SECONDS --count N prints N reports; with no traffic every growth is +0; while a
#     pingpong runs the totals never go down, and the last report equals the final figures;
#     SIGINT and SIGTERM end it with status 0, so does a reader that goes away; no escape
#     sequence when stdout is not a terminal;
#   - with UROCE_FAULTS=drop on the client only: its QP's tx_faults equal what the device
#     and the process counted as dropped; every sequence NAK the server sent reached the
#     client (rx_seq_naks equal), and for each device the QPs' NAKs, duplicates, peers and
#     retransmissions add up to the device's;
#   - an unknown device or QP: exit 1 and a message; bad arguments: exit 2.
# Needs root (uroce add makes /dev/infiniband nodes); otherwise skips (exit 77).
# Last line: "N passed, M failed"; exit 1 if M > 0.
set -u
# shellcheck source=lib.sh
source "$(dirname "$(readlink -f "$0")")/lib.sh"
lib_init "$@"

for tool in ibv_rc_pingpong python3 ss timeout; do
    if ! command -v "$tool" >/dev/null; then
        skip "$tool is not installed"
        finish
    fi
done
require_root "uroce stats against ibv_rc_pingpong" "uroce add makes /dev/infiniband nodes"

OCT=$(pick_octet 151) || echo "# warning: every 127.0.151..170.* block has UDP sockets; using 127.0.$OCT"
A="st$$a"
B="st$$b"
IP_A="127.0.$OCT.1"
IP_B="127.0.$OCT.2"
ITERS=200
RUNS=0  # pingpongs run: QPs each device ever had
SIZE=4096
MTU=1024

# stats ARGS...: runs `uroce stats ARGS` (bounded), leaving RC, OUT, ERR.
stats() {
    OUT=$(timeout 20 "$UROCE" stats "$@" 2>"$WORK/stats.err")
    RC=$?
    ERR=$(cat "$WORK/stats.err")
}

# dev_value TEXT NAME: a device counter of `uroce stats NAME` text.
dev_value() { awk -v k="$2" '$1 == k { print $2 }' <<<"$1"; }

# qp_value TEXT QPN NAME: counter NAME of the line of QP QPN (0x hex) in the text.
qp_value() {
    awk -v q="$2" -v k="$3" '$1 == "qp" && $2 == q {
        for (i = 3; i <= NF; i++) { split($i, kv, "="); if (kv[1] == k) { sub(/\(.*/, "", kv[2]); print kv[2] } } }' <<<"$1"
}

# qpn_of FILE: the QPN ibv_rc_pingpong printed as its local address ("QPN 0x00abcd,"), as
# `uroce stats` prints it.
qpn_of() {
    local h
    h=$(awk '/local address:/ { for (i = 1; i < NF; i++) if ($i == "QPN") { sub(",", "", $(i + 1)); print $(i + 1) } }' "$1")
    [[ -n $h ]] && printf '0x%06x' "$((h))"
}

# expect_delivered FROM_QPN FROM_TEXT TO_QPN TO_TEXT: what QP FROM_QPN sent (its device's
# `uroce stats` text), QP TO_QPN received: loopback loses nothing, but a resend can arrive
# after the receiving QP is gone. If its process is still there, the device counts it for no
# QP (rx_unknown_qp); if the process is gone too (the device had no other), nobody counts it.
# The last message's receiver holds its ACK (for an answer that never comes) until it
# destroys its QP, and the sender probes meanwhile: a probe may cross that exit. So the
# difference, if any, is whole packets (every message is SIZE bytes in MTU packets), no more
# than the sender resent, and the sender did probe.
expect_delivered() {
    local sent got resent probes missing
    sent=$(qp_value "$2" "$1" tx_payload_bytes)
    got=$(qp_value "$4" "$3" rx_payload_bytes)
    resent=$(qp_value "$2" "$1" retransmitted_packets)
    probes=$(qp_value "$2" "$1" tail_probes)
    if [[ $sent == "$got" ]]; then
        ok "what QP $1 sent, QP $3 received"
        return
    fi
    missing=$((sent - got))
    echo "# QP $1 sent $sent bytes, QP $3 received $got; $resent packets resent, $probes probes"
    expect_eq "what QP $1 sent, QP $3 received, but for resends after its end" 1 \
        "$((missing > 0 && missing % MTU == 0 && missing / MTU <= resent && probes > 0))"
}

# pingpong LABEL CLIENT_FAULTS [ITERS]: ibv_rc_pingpong server on A, client on B
# (UROCE_FAULTS=CLIENT_FAULTS on the client only, "-" for none); SRV_QPN, CLI_QPN.
pingpong() {
    local label=$1 faults=$2 iters=${3:-$ITERS} port cli=()
    port=$(free_tcp_port) || { not_ok "$label: a free TCP port"; return 1; }
    [[ $faults != - ]] && cli=(env "UROCE_FAULTS=$faults")
    RUNS=$((RUNS + 1))
    run_pair "$label" "$port" 120 UROCE_STATS=1 \
        -- ibv_rc_pingpong -d "$A" -g 0 -p "$port" -n "$iters" -s "$SIZE" -m "$MTU" \
        -- "${cli[@]}" ibv_rc_pingpong -d "$B" -g 0 -p "$port" -n "$iters" -s "$SIZE" -m "$MTU" "$IP_A"
    SRV_QPN=$(qpn_of "$SRV_OUT")
    CLI_QPN=$(qpn_of "$CLI_OUT")
    [[ $SRV_RC -eq 0 && $CLI_RC -eq 0 && -n $SRV_QPN && -n $CLI_QPN ]]
}

# PY_JSON_EQUALS_TEXT QPN, JSON on stdin, text on fd 3: "same" if `uroce stats DEV --json` says
# what `uroce stats DEV` says (every counter) and lists exactly QP QPN.
read -r -d '' PY_JSON_EQUALS_TEXT <<'EOF'
import json, os, sys
d = json.load(sys.stdin)
text = os.fdopen(3).read().splitlines()
dev = {l.split()[0]: int(l.split()[1]) for l in text if l and l.split()[0] != "qp"}
qps = {}
for l in text:
    f = l.split()
    if f and f[0] == "qp":
        qps[f[1]] = {k: int(v) for k, v in (x.split("=") for x in f[2:])}
bad = []
if d["counters"] != dev:
    bad.append("device counters differ")
jq = {q["qpn_hex"]: q["counters"] for q in d["qps"]}
if jq != qps:
    bad.append("QP counters differ: %s vs %s" % (jq, qps))
if [int(q["qpn_hex"], 16) for q in d["qps"]] != [q["qpn"] for q in d["qps"]]:
    bad.append("qpn and qpn_hex differ")
if [q["qpn_hex"] for q in d["qps"]] != [sys.argv[1]]:
    bad.append("QPs: %s" % [q["qpn_hex"] for q in d["qps"]])
print("; ".join(bad) or "same")
EOF

# PY_WATCH_SERIES QPN, `--watch --json` reports on stdin, the final `--qp QPN --json` on fd 3:
# "ok N" if QP QPN is in N >= 2 reports, its counters never go down and the last equal the final.
read -r -d '' PY_WATCH_SERIES <<'EOF'
import json, os, sys
final = json.loads(os.fdopen(3).read())["counters"]
reports = [json.loads(l) for l in sys.stdin.read().splitlines()]
series = []
for r in reports:
    q = [x["counters"] for x in r["qps"] if x["qpn_hex"] == sys.argv[1]]
    series.append(q[0] if q else None)
bad = []
seen = [s for s in series if s is not None]
if len(seen) < 2:
    bad.append("the QP is in %d of %d reports" % (len(seen), len(series)))
for before, after in zip(seen, seen[1:]):
    for k in after:
        if after[k] < before[k]:
            bad.append("%s went down: %d -> %d" % (k, before[k], after[k]))
if seen and seen[-1] != final:
    bad.append("last report %s != final %s" % (seen[-1], final))
print("; ".join(bad) or "ok %d" % len(seen))
EOF

# ------------------------------------------------------------------ no device, two devices
stats
expect_eq "stats with no device: exit 0, nothing listed" "0:" "$RC:$OUT"
stats --json
expect_eq "stats --json with no device: an empty list" '{"devices":[]}' "$OUT"

add_device "$A" "$IP_A" || finish
add_device "$B" "$IP_B" || finish

stats
expect_eq "stats lists both devices" "device $A,device $B" "$(grep '^device ' <<<"$OUT" | sort | paste -sd,)"
expect_eq "stats: nothing counted yet, no QP" "" "$(awk '$1 != "device" && $1 != "" && $2 != 0' <<<"$OUT")"
stats --json
got=$(python3 -c 'import json, sys
d = json.load(sys.stdin)
print(",".join(sorted(x["device"] for x in d["devices"])), sum(len(x["qps"]) for x in d["devices"]),
      sum(sum(x["counters"].values()) for x in d["devices"]))' <<<"$OUT" 2>&1)
expect_eq "stats --json: both devices, no QP, all zero" "$A,$B 0 0" "$got"

# ------------------------------------------------------------------ known traffic
if ! pingpong "plain" -; then
    expect_pair_ok "plain pingpong" || true
    not_ok "both sides printed their QPN" "server: $SRV_QPN client: $CLI_QPN"
    finish
fi
ok "ibv_rc_pingpong -n $ITERS -s $SIZE between $A and $B (QPNs $SRV_QPN, $CLI_QPN)"

for side in A B; do
    if [[ $side == A ]]; then dev=$A qpn=$SRV_QPN err=$SRV_ERR peer=$B peer_err=$CLI_ERR
    else dev=$B qpn=$CLI_QPN err=$CLI_ERR peer=$A peer_err=$SRV_ERR; fi
    stats "$dev"
    text=$OUT
    expect_eq "stats $dev: one QP line, the application's ($qpn)" "qp $qpn" \
        "$(awk '$1 == "qp" { print $1, $2 }' <<<"$text" | paste -sd,)"
    # Sent: the messages, plus whole packets resent (a loaded machine can make a side resend
    # before the ACK comes; SIZE is a multiple of MTU, so every request packet is full).
    resent=$(($(qp_value "$text" "$qpn" retransmitted_packets) + $(qp_value "$text" "$qpn" tail_probes)))
    extra=$(($(qp_value "$text" "$qpn" tx_payload_bytes) - ITERS * SIZE))
    if [[ $resent -eq 0 ]]; then
        expect_eq "stats $dev: QP $qpn tx_payload_bytes = $ITERS x $SIZE" 0 "$extra"
    else
        expect_eq "stats $dev: QP $qpn tx_payload_bytes = $ITERS x $SIZE + whole packets resent (at most $resent)" \
            "1 0" "$((extra >= 0 && extra <= resent * MTU)) $((extra % MTU))"
    fi
    # Received: each message once, plus the request packets the QP did not execute (duplicates,
    # ahead of sequence, before RTR); the device's counts are this process's (its first).
    skipped=$(($(qp_value "$text" "$qpn" rx_duplicate) + $(dev_value "$text" rx_out_of_sequence) + $(dev_value "$text" rx_wrong_state)))
    expect_eq "stats $dev: QP $qpn rx_payload_bytes = $ITERS x $SIZE + $skipped packets not executed" \
        "$((ITERS * SIZE + skipped * MTU))" "$(qp_value "$text" "$qpn" rx_payload_bytes)"
    # Every packet of the process went through its one QP. The peer's QP sends its last ACK
    # again as it is destroyed (tx_last_ack_repeats): that copy can arrive after this process
    # printed its figures, before its device stopped reading.
    expect_eq "stats $dev: device tx_packets = the process's (UROCE_STATS)" \
        "$(counter_value "$err" "$dev" tx_packets)" "$(dev_value "$text" tx_packets)"
    late=$(counter_value "$peer_err" "$peer" tx_last_ack_repeats)
    proc=$(counter_value "$err" "$dev" rx_packets)
    dev_rx=$(dev_value "$text" rx_packets)
    label="stats $dev: device rx_packets = the process's (UROCE_STATS) + at most the peer's $late last ACK(s) sent again"
    if [[ -n $proc && -n $late && -n $dev_rx ]] && ((dev_rx >= proc && dev_rx <= proc + late)); then
        ok "$label ($dev_rx)"
    else
        not_ok "$label" "want: ${proc:-?} .. $((${proc:-0} + ${late:-0}))" "got:  ${dev_rx:-none}"
    fi
    expect_eq "stats $dev: device tx_packets = its QP's" "$(dev_value "$text" tx_packets)" \
        "$(qp_value "$text" "$qpn" tx_packets)"
    expect_eq "stats $dev: device rx_packets = its QP's + those for no QP" \
        "$(dev_value "$text" rx_packets)" \
        "$(($(qp_value "$text" "$qpn" rx_packets) + $(dev_value "$text" rx_unknown_qp)))"
    # --qp QPN: the same figures, one per line.
    stats "$dev" --qp "$qpn"
    expect_eq "stats $dev --qp $qpn: exit 0" 0 "$RC"
    want=$(awk '$1 == "qp" { for (i = 3; i <= NF; i++) { sub("=", " ", $i); print $i } }' <<<"$text")
    expect_eq "stats $dev --qp $qpn = its line of the listing" "$want" "$OUT"
    # --json: the same figures as the text, every one.
    stats "$dev" --json
    json=$OUT
    got=$(python3 -c "$PY_JSON_EQUALS_TEXT" "$qpn" 3<<<"$text" <<<"$json" 2>&1)
    expect_eq "stats $dev --json parses and equals the text" "same" "$got"
done
stats "$A"
a_text=$OUT
stats "$B"
b_text=$OUT
# Loopback loses nothing: what one QP sent, the other received, unless a resend arrived after
# the receiver's QP was gone (counted for no QP).
expect_delivered "$SRV_QPN" "$a_text" "$CLI_QPN" "$b_text"
expect_delivered "$CLI_QPN" "$b_text" "$SRV_QPN" "$a_text"
stats --json
got=$(python3 -c 'import json, sys
d = json.load(sys.stdin)
print(" ".join("%s:%s" % (x["device"], ",".join(q["qpn_hex"] for q in x["qps"])) for x in sorted(d["devices"], key=lambda x: x["device"])))' <<<"$OUT" 2>&1)
expect_eq "stats --json (every device): each device with its QP" "$A:$SRV_QPN $B:$CLI_QPN" "$got"
stats --qp "$SRV_QPN" --json
expect_eq "stats --json --qp QPN of a device: one object" "$SRV_QPN $(qp_value "$a_text" "$SRV_QPN" tx_packets)" \
    "$(timeout 20 "$UROCE" stats "$A" --qp "$SRV_QPN" --json | python3 -c 'import json, sys
d = json.load(sys.stdin); print(d["qpn_hex"], d["counters"]["tx_packets"])' 2>&1)"

# ------------------------------------------------------------------ --watch
OUT=$(timeout 20 "$UROCE" stats "$A" --watch 0.2 --count 2 2>&1)
RC=$?
expect_eq "stats --watch 0.2 --count 2: exit 0" 0 "$RC"
expect_eq "stats --watch 0.2 --count 2: two reports" 2 "$(grep -c '^# report ' <<<"$OUT")"
expect_eq "stats --watch: no escape sequence when stdout is not a terminal" 0 "$(grep -c $'\033' <<<"$OUT")"
second=$(awk '/^# report 2/ { on = 1; next } on' <<<"$OUT")
expect_eq "stats --watch: no traffic, every device counter grew +0" "" \
    "$(awk 'NF == 3 && $3 != "+0"' <<<"$second")"
expect_eq "stats --watch: no traffic, every QP counter grew +0" "" \
    "$(awk '$1 == "qp" { for (i = 3; i <= NF; i++) if ($i !~ /\(\+0\)$/) print $i }' <<<"$second")"
expect_eq "stats --watch: the second report has the same totals" "$a_text" \
    "$(awk 'NF >= 2 { if ($1 == "qp") { line = $1 " " $2; for (i = 3; i <= NF; i++) { sub(/\(.*/, "", $i); line = line " " $i } print line } else print $1, $2 }' <<<"$second")"
OUT=$(timeout 20 "$UROCE" stats --watch 0.1 --count 3 --json 2>&1)
got=$(python3 -c 'import json, sys
docs = [json.loads(l) for l in sys.stdin.read().splitlines()]
print(len(docs), len(docs[-1]["devices"]))' <<<"$OUT" 2>&1)
expect_eq "stats --watch --count 3 --json: three JSON documents, one per line" "3 2" "$got"

# A watch in the background while a second pingpong runs.
timeout 60 "$UROCE" stats "$B" --watch 0.1 --json >"$WORK/watch.json" 2>"$WORK/watch.err" &
watch_pid=$!
BG_PIDS+=("$watch_pid")
if pingpong "watched" -; then
    ok "a second pingpong while stats --watch runs (QPNs $SRV_QPN, $CLI_QPN)"
else
    expect_pair_ok "watched pingpong" || true
fi
# One more report after the end, then SIGINT.
n=$(wc -l <"$WORK/watch.json")
for ((i = 0; i < 100 && $(wc -l <"$WORK/watch.json") < n + 2; i++)); do sleep 0.1; done
kill -INT "$watch_pid"
wait "$watch_pid"
RC=$?
forget_pid "$watch_pid"
expect_eq "stats --watch ends with status 0 on SIGINT" 0 "$RC"
stats "$B" --qp "$CLI_QPN" --json
final=$OUT
got=$(python3 -c "$PY_WATCH_SERIES" "$CLI_QPN" 3<<<"$final" <"$WORK/watch.json" 2>&1)
expect_match "stats --watch during a pingpong: totals never go down, the last report is final" "^ok [0-9]+$" "$got"
echo "# the watched QP in $(cut -d' ' -f2 <<<"$got") reports"

timeout 60 "$UROCE" stats "$A" --watch 0.1 >"$WORK/watch.txt" 2>&1 &
watch_pid=$!
BG_PIDS+=("$watch_pid")
for ((i = 0; i < 100 && $(grep -c '^# report' "$WORK/watch.txt") < 2; i++)); do sleep 0.1; done
watch_prog=$(pgrep -P "$watch_pid" | head -n 1)
kill -TERM "$watch_pid"
# Once (CI, a loaded machine) the program outlived the signal until the timeout: if it runs
# 20 s after it, say where it is, for the next to see it.
for ((i = 0; i < 200; i++)); do kill -0 "$watch_pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$watch_pid" 2>/dev/null && [[ -n $watch_prog ]]; then
    echo "# stats --watch still runs 20 s after SIGTERM: $(grep -c '^# report' "$WORK/watch.txt") reports"
    grep -E '^(State|Threads|SigQ|SigPnd|ShdPnd|SigBlk|SigIgn|SigCgt):' "/proc/$watch_prog/status" | sed 's/^/#   /'
    for t in "/proc/$watch_prog/task/"*; do echo "#   thread ${t##*/}: $(cat "$t/wchan" 2>/dev/null) $(tr -d '\0' <"$t/syscall" 2>/dev/null)"; done
fi
wait "$watch_pid"
RC=$?
forget_pid "$watch_pid"
expect_eq "stats --watch ends with status 0 on SIGTERM" 0 "$RC"
timeout 20 "$UROCE" stats "$A" --watch 0.05 2>"$WORK/pipe.err" | head -n 3 >/dev/null
RC=${PIPESTATUS[0]}
expect_eq "stats --watch ends with status 0 when its reader goes away" "0:" "$RC:$(cat "$WORK/pipe.err")"

# ------------------------------------------------------------------ faults
# The client drops 5% of the first 400 packets it sends; a side left without the ACK of its
# last message by the other's exit (ibv_rc_pingpong's teardown race) is run again.
for seed in 7 17 27; do
    pingpong "faults-$seed" "drop=0.05,seed=$seed,until=400" && break
    echo "# note: faults-$seed: server exit $SRV_RC, client exit $CLI_RC; running again with another seed"
done
if expect_pair_ok "pingpong with drop=0.05 on the client"; then
    stats "$A"
    a_text=$OUT
    stats "$B"
    b_text=$OUT
    faults=$(qp_value "$b_text" "$CLI_QPN" tx_faults)
    expect_eq "client QP tx_faults = the process's tx_dropped_fault (UROCE_STATS)" \
        "$(counter_value "$CLI_ERR" "$B" tx_dropped_fault)" "$faults"
    expect_eq "client QP tx_faults = device $B's dropped + corrupted + duplicated" \
        "$(($(dev_value "$b_text" tx_dropped_fault) + $(dev_value "$b_text" tx_corrupted_fault) + $(dev_value "$b_text" tx_duplicated_fault)))" "$faults"
    expect_eq "client QP tx_faults > 0" 1 "$((faults > 0))"
    expect_eq "server QP tx_faults = 0" 0 "$(qp_value "$a_text" "$SRV_QPN" tx_faults)"
    naks=$(qp_value "$a_text" "$SRV_QPN" tx_seq_naks)
    expect_eq "server QP sent sequence NAKs" 1 "$((naks > 0))"
    expect_eq "every sequence NAK the server sent reached the client ($naks)" "$naks" \
        "$(qp_value "$b_text" "$CLI_QPN" rx_seq_naks)"
    expect_eq "the server's NAKs = its process's tx_seq_naks (UROCE_STATS)" \
        "$(counter_value "$SRV_ERR" "$A" tx_seq_naks)" "$naks"
    expect_eq "the client's seq NAKs sent >= those the server received" 1 \
        "$(($(qp_value "$b_text" "$CLI_QPN" tx_seq_naks) >= $(qp_value "$a_text" "$SRV_QPN" rx_seq_naks)))"
    echo "# server QP: $(grep "^qp $SRV_QPN" <<<"$a_text")"
    echo "# client QP: $(grep "^qp $CLI_QPN" <<<"$b_text")"
fi
# Over every QP the devices ever had (three pingpongs each), the QPs' figures add up to the
# device's.
for dev in "$A" "$B"; do
    stats "$dev" --json
    got=$(python3 -c 'import json, sys
d = json.load(sys.stdin)
c = d["counters"]
s = lambda k: sum(q["counters"][k] for q in d["qps"])
pairs = {
    "tx_packets": c["tx_packets"],
    "tx_seq_naks": c["tx_seq_naks"],
    "tx_rnr_naks": c["tx_rnr_naks"],
    "tx_other_naks": c["tx_access_naks"] + c["tx_invalid_naks"],
    "tx_naks": c["tx_seq_naks"] + c["tx_rnr_naks"] + c["tx_access_naks"] + c["tx_invalid_naks"],
    "rx_naks": c["rx_naks"],
    "rx_duplicate": c["rx_duplicate"],
    "rx_wrong_peer": c["rx_wrong_peer"],
    "retransmit_timeouts": c["retransmit_timeouts"],
    "retransmitted_packets": c["retransmitted_packets"],
    "early_retransmits": c["early_retransmits"],
    "tail_probes": c["tail_probes"],
    "tx_faults": c["tx_dropped_fault"] + c["tx_corrupted_fault"] + c["tx_duplicated_fault"],
}
bad = ["%s: QPs %d, device %d" % (k, s(k), v) for k, v in pairs.items() if s(k) != v]
if s("rx_naks") != s("rx_seq_naks") + s("rx_rnr_naks") + s("rx_other_naks"):
    bad.append("rx_naks is not the sum of its kinds")
print(len(d["qps"]), "; ".join(bad) or "same")' <<<"$OUT" 2>&1)
    expect_eq "stats $dev: its $RUNS QPs' counters add up to the device's" "$RUNS same" "$got"
done

# ------------------------------------------------------------------ errors
stats nosuchdev
expect_eq "stats of an unknown device: exit 1" 1 "$RC"
expect_match "stats of an unknown device: says so" "^uroce stats: error: no device 'nosuchdev'" "$ERR"
stats "$A" --qp 0x123456
expect_eq "stats --qp of a QP never created: exit 1" 1 "$RC"
expect_match "stats --qp of a QP never created: says so" "no QP 0x123456 was ever created on '$A'" "$ERR"
# Another index of the server's slot: the table exists, no QP ever took that block.
stats "$A"
for ((k = 1; k < 10; k++)); do
    other=$(printf '0x%06x' $(((SRV_QPN & 0xfff000) | ((SRV_QPN + k) & 0xfff))))
    [[ $OUT != *"qp $other "* ]] && break
done
stats "$A" --qp "$other"
expect_eq "stats --qp of a QP never created in a used slot ($other): exit 1" 1 "$RC"
expect_match "stats --qp of a QP never created in a used slot: says so" "no QP $other was ever created" "$ERR"
for args in "--watch abc" "--watch 0" "--watch nan" "--count 2" "$A --watch 1 --count 0" "--qp 5" "--bogus" "$A extra"; do
    # shellcheck disable=SC2086
    stats $args
    expect_eq "stats $args: usage error, exit 2" 2 "$RC"
done

# ------------------------------------------------------------------ a counters file of another build
# Last: the device totals start again from zero here. The layout hash (the file's second
# word) as a build with another counter list leaves it (an upgrade of uroce).
counters_a="$UROCE_ROOT/sys/class/infiniband/$A/uroce/counters"
python3 -c 'import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(8); f.write((0x1234).to_bytes(8, "little"))' "$counters_a"
stats "$A"
expect_eq "stats of a device whose counters another build wrote: exit 1" 1 "$RC"
expect_match "stats of a device whose counters another build wrote: says so" "other counters" "$ERR"
if pingpong "after another build" - 20; then
    ok "a pingpong on that device"
    stats "$A" --json
    got=$(python3 -c 'import json, sys
c = json.load(sys.stdin)["counters"]
print("counts again" if c["rx_packets"] > 0 and c["tx_packets"] > 0 else c)' <<<"$OUT" 2>&1)
    expect_eq "its context was alone on the device: the file started afresh, stats reads it" \
        "0:counts again" "$RC:$got"
else
    expect_pair_ok "pingpong after another build" || true
fi

finish
