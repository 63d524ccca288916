#!/usr/bin/env bash
# Hunts intermittent hangs of perftest over uroce on loopback: runs server + client pairs
# many times and counts passes, failures and hangs. A pair still running after TIMEOUT
# seconds is a hang: before it is killed, the thread stacks of both processes (gdb), their
# /proc wait channels and the counters of both devices (uroce stats) go into the log.
#
#   tools/hang-hunt.sh [-n RUNS] [-t TIMEOUT] [-c CPUS] [-l LOG] [-u UROCE] [TEST...]
#
#   -n RUNS     pairs per test (default 50)
#   -t TIMEOUT  seconds a pair may take (default 60)
#   -c CPUS     run both sides under `taskset -c CPUS` (e.g. 0: both on one core)
#   -l LOG      log file (default /tmp/hang-hunt.<pid>.log)
#   -u UROCE    the uroce command (default build/tools/uroce of this checkout)
#   TEST        a perftest command line without -d/-x/-p and the server address, e.g.
#               "ib_write_bw -q 16 -b". Default: the five below.
#
# Devices: $HUNT_DEV_A/$HUNT_DEV_B (default hg0, hg1) on $HUNT_IP_A/$HUNT_IP_B (default
# 127.0.77.1, .2) in $UROCE_ROOT (default /tmp/hang-root), added if missing, deleted at the
# end unless HUNT_KEEP_DEVICES=1. TCP ports from $HUNT_PORT (default 19000) up, 100 of them.
# Needs root (uroce add) and gdb for the stacks. Last line: "TOTAL: P passed, F failed,
# H hung"; exit 1 if anything failed or hung.
set -u

RUNS=50
TIMEOUT=60
CPUS=""
LOG=/tmp/hang-hunt.$$.log
TOP=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
UROCE=$TOP/build/tools/uroce
while getopts "n:t:c:l:u:" opt; do
    case $opt in
        n) RUNS=$OPTARG ;;
        t) TIMEOUT=$OPTARG ;;
        c) CPUS=$OPTARG ;;
        l) LOG=$OPTARG ;;
        u) UROCE=$OPTARG ;;
        *) sed -n '2,22p' "$0" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
TESTS=("$@")
if [[ ${#TESTS[@]} -eq 0 ]]; then
    TESTS=("ib_write_bw -q 16 -b" "ib_send_lat -e" "ib_write_bw -b" "ib_send_bw -e" "ib_read_bw -q 8")
fi

export UROCE_ROOT=${UROCE_ROOT:-/tmp/hang-root}
DEV_A=${HUNT_DEV_A:-hg0}
DEV_B=${HUNT_DEV_B:-hg1}
IP_A=${HUNT_IP_A:-127.0.77.1}
IP_B=${HUNT_IP_B:-127.0.77.2}
PORT0=${HUNT_PORT:-19000}
WORK=$(mktemp -d /tmp/hang-hunt.XXXXXX)
unset UROCE_FAULTS
export UROCE_STATS=1
PINNED=()
[[ -n $CPUS ]] && PINNED=(taskset -c "$CPUS")

log() { echo "$*" | tee -a "$LOG"; }

cleanup() {
    if [[ ${HUNT_KEEP_DEVICES:-0} != 1 ]]; then
        "$UROCE" del "$DEV_A" >/dev/null 2>&1
        "$UROCE" del "$DEV_B" >/dev/null 2>&1
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'log "# interrupted"; exit 130' INT TERM

for d in "$DEV_A:$IP_A" "$DEV_B:$IP_B"; do
    if ! "$UROCE" list 2>/dev/null | grep -q "^${d%%:*} "; then
        "$UROCE" add "${d%%:*}" --ip "${d#*:}" >/dev/null || { echo "cannot add ${d%%:*}" >&2; exit 2; }
    fi
done

# wait_listen PORT PID: until PORT listens (bounded), or PID is gone.
wait_listen() {
    local i
    for ((i = 0; i < 200; i++)); do
        ss -Htln "sport = :$1" 2>/dev/null | grep -q . && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

# dump_hang LABEL PID: what a hung process is doing, into the log.
dump_hang() {
    local label=$1 pid=$2 t
    kill -0 "$pid" 2>/dev/null || { log "## $label (pid $pid): already exited"; return; }
    log "## $label (pid $pid): $(tr '\0' ' ' <"/proc/$pid/cmdline")"
    for t in /proc/"$pid"/task/*; do
        echo "#   task ${t##*/} $(cat "$t/comm") state=$(awk '{print $3}' "$t/stat") wchan=$(cat "$t/wchan")" >>"$LOG"
    done
    if command -v gdb >/dev/null; then
        timeout 60 gdb -p "$pid" -batch -ex 'thread apply all bt' >>"$LOG" 2>&1
    fi
}

# The device counters cover every context since `uroce add`: each pair's are the
# difference from a snapshot taken before it starts.
stats_snapshot() {
    local d
    for d in "$DEV_A" "$DEV_B"; do "$UROCE" stats "$d" >"$WORK/stats.$d" 2>/dev/null; done
}
stats_delta() {
    "$UROCE" stats "$1" 2>&1 | awk 'NR == FNR { before[$1] = $2; next }
        $2 - before[$1] != 0 { print "   ", $1, $2 - before[$1] }' "$WORK/stats.$1" -
}

# run_pair TEST_INDEX RUN: 0 passed, 1 failed, 2 hung.
run_pair() {
    local t=$1 run=$2
    local port=$((PORT0 + (run % 100)))
    read -r -a args <<<"${TESTS[$t]}"
    local srv_out=$WORK/srv.out cli_out=$WORK/cli.out
    stats_snapshot
    # The backstop: timeout kills whatever the watchdog below did not.
    "${PINNED[@]}" timeout -s KILL $((TIMEOUT + 120)) "$UROCE" run -- \
        "${args[@]}" -d "$DEV_A" -x 0 -p "$port" >"$srv_out" 2>&1 &
    local srv=$!
    if ! wait_listen "$port" "$srv"; then
        sleep 1
    fi
    "${PINNED[@]}" timeout -s KILL $((TIMEOUT + 120)) "$UROCE" run -- \
        "${args[@]}" -d "$DEV_B" -x 0 -p "$port" "$IP_A" >"$cli_out" 2>&1 &
    local cli=$!
    local deadline=$((SECONDS + TIMEOUT)) hung=0
    while kill -0 "$srv" 2>/dev/null || kill -0 "$cli" 2>/dev/null; do
        if ((SECONDS >= deadline)); then
            hung=1
            break
        fi
        sleep 0.2
    done
    if ((hung)); then
        log "# HANG: ${TESTS[$t]} run $run (port $port) after ${TIMEOUT}s"
        local side pid
        for side in server:$srv client:$cli; do
            # uroce run execs the command: timeout's child is perftest itself.
            pid=$(pgrep -P "${side#*:}" | head -1)
            [[ -n $pid ]] && dump_hang "${side%%:*}" "$pid"
        done
        for d in "$DEV_A" "$DEV_B"; do
            log "## uroce stats $d: what this pair counted (non-zero)"
            stats_delta "$d" >>"$LOG"
        done
        for side in server:$srv_out client:$cli_out; do
            log "## ${side%%:*} output (tail)"
            tail -n 25 "${side#*:}" >>"$LOG"
        done
        for pid in "$srv" "$cli"; do
            pkill -KILL -P "$pid" 2>/dev/null
            kill -KILL "$pid" 2>/dev/null
        done
        wait "$srv" "$cli" 2>/dev/null
        return 2
    fi
    local rs=0 rc=0
    wait "$srv" || rs=$?
    wait "$cli" || rc=$?
    if ((rs != 0 || rc != 0)); then
        log "# FAIL: ${TESTS[$t]} run $run: server exit $rs, client exit $rc"
        for d in "$DEV_A" "$DEV_B"; do
            log "## uroce stats $d: what this pair counted (non-zero)"
            stats_delta "$d" >>"$LOG"
        done
        for side in server:$srv_out client:$cli_out; do
            log "## ${side%%:*} output: error lines and tail"
            grep -Eai 'fail|error|couldn|scnt=' "${side#*:}" | head -n 10 >>"$LOG"
            tail -n 15 "${side#*:}" >>"$LOG"
        done
        return 1
    fi
    return 0
}

log "# hang-hunt $(date -u +%FT%TZ) $(git -C "$TOP" describe --always --dirty 2>/dev/null)"
log "# $RUNS runs per test, timeout ${TIMEOUT}s${CPUS:+, taskset -c $CPUS}, log $LOG"
TP=0 TF=0 TH=0
for t in "${!TESTS[@]}"; do
    p=0 f=0 h=0
    for ((r = 1; r <= RUNS; r++)); do
        run_pair "$t" "$r"
        case $? in
            0) p=$((p + 1)) ;;
            1) f=$((f + 1)) ;;
            *) h=$((h + 1)) ;;
        esac
    done
    log "RESULT: ${TESTS[$t]}: $p passed, $f failed, $h hung (of $RUNS)"
    TP=$((TP + p)) TF=$((TF + f)) TH=$((TH + h))
done
log "TOTAL: $TP passed, $TF failed, $TH hung"
((TF + TH == 0))
