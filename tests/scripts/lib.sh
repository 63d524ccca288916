# Shared helpers for the application-level test scripts (test_pingpong.sh,
# test_perftest.sh, test_tshark.sh). Source it, then call lib_init:
#
#   source "$(dirname "$0")/lib.sh"
#   lib_init "$@"            # $1 = path to the uroce executable
#
# What it gives:
#   - a fresh UROCE_ROOT under a private work directory ($WORK), removed on exit;
#   - add_device / devices removed on exit (and their /dev/infiniband nodes);
#   - pick_octet: a 127.0.X.0/24 block whose addresses no UDP socket uses yet;
#   - free_tcp_port: a TCP port from a range derived from $$ that nothing uses;
#   - wait_listen: bounded wait until a TCP port listens;
#   - run_pair: server + client of an out-of-band-exchanging verbs program, each
#     under `timeout`, the client started once the server listens;
#   - ok / not_ok / skip / expect_* accounting and `finish`, whose last line is
#     "N passed, M failed" (exit 1 if M > 0, 77 = meson's "skipped" if nothing
#     ran at all because everything was skipped).
# Every wait is bounded; servers still running are killed on exit.

# shellcheck shell=bash

PASSED=0
FAILED=0
SKIPPED=0
DEVICES=()       # registered by add_device, deleted on exit
BG_PIDS=()       # background processes to kill on exit
CLEANUP_FNS=()   # functions to call on exit (after the processes have ended)
USED_PORTS=" "   # TCP ports handed out by free_tcp_port in this run
NEXT_PORT=0
LIB_CLEANED=0

# lib_init PATH_TO_UROCE
lib_init() {
    if [[ $# -ne 1 ]]; then
        echo "usage: $0 PATH_TO_UROCE" >&2
        exit 2
    fi
    UROCE=$(readlink -f "$1")
    if [[ ! -x $UROCE ]]; then
        echo "$0: $1 is not an executable" >&2
        exit 2
    fi
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/uroce-test.XXXXXX")
    export UROCE_ROOT="$WORK/root"
    unset UROCE_FAULTS UROCE_STATS
    trap lib_cleanup EXIT
    trap 'echo "# interrupted"; exit 130' INT TERM
    echo "# uroce: $UROCE"
    echo "# UROCE_ROOT: $UROCE_ROOT"
}

# forget_pid PID: PID has been waited for (reaped); never signal it again, as
# the number may now belong to an unrelated process.
forget_pid() {
    local keep=() p
    for p in "${BG_PIDS[@]}"; do [[ $p != "$1" ]] && keep+=("$p"); done
    BG_PIDS=("${keep[@]}")
}

# stop_timed PID: stops a `timeout -k 5 ...` started in the background. TERM to timeout is
# passed on to its program (and KILL follows 5 s later if that does not end it); a KILL to
# timeout itself would leave the program running, orphaned.
stop_timed() {
    local i
    kill -TERM "$1" 2>/dev/null || return 0
    for ((i = 0; i < 70; i++)); do
        kill -0 "$1" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "$1" 2>/dev/null
}

lib_cleanup() {
    [[ $LIB_CLEANED -eq 1 ]] && return
    LIB_CLEANED=1
    local pid i
    for pid in "${BG_PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null
    done
    # Mostly `timeout -k 5` processes: they pass TERM on and KILL their program 5 s later.
    for pid in "${BG_PIDS[@]}"; do
        for ((i = 0; i < 70; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null
    done
    for fn in "${CLEANUP_FNS[@]}"; do "$fn"; done
    for n in "${DEVICES[@]}"; do
        "$UROCE" del "$n" >/dev/null 2>&1
        if [[ $EUID -eq 0 && -e /dev/infiniband/uverbs_uroce_$n ]]; then
            rm -f "/dev/infiniband/uverbs_uroce_$n"
        fi
    done
    if [[ -n ${KEEP_WORK:-} ]]; then
        echo "# work directory kept: $WORK"
    else
        rm -rf "$WORK"
    fi
}

# ------------------------------------------------------------------ accounting
ok() {
    PASSED=$((PASSED + 1))
    echo "ok - $1"
}

# not_ok DESCRIPTION [DETAIL_LINE...]
not_ok() {
    FAILED=$((FAILED + 1))
    echo "not ok - $1"
    shift
    local line
    for line in "$@"; do printf '    %s\n' "$line"; done
}

# skip WHAT: checks not run. tools/test.sh lists every "skip - " line (and fails CI on
# one not in tests/allowed-skips.txt), so say plainly what was not run and why.
skip() {
    SKIPPED=$((SKIPPED + 1))
    echo "skip - $1"
}

# check DESCRIPTION COMMAND...: ok if the command succeeds.
check() {
    local desc=$1
    shift
    if "$@"; then ok "$desc"; else not_ok "$desc" "command: $*"; fi
}

expect_eq() {
    local desc=$1 want=$2 got=$3
    if [[ $got == "$want" ]]; then
        ok "$desc"
    else
        not_ok "$desc" "want: $want" "got:  $got"
    fi
}

# expect_match DESCRIPTION ERE TEXT
expect_match() {
    local desc=$1 re=$2 text=$3
    if grep -Eq -- "$re" <<<"$text"; then
        ok "$desc"
    else
        not_ok "$desc" "no line matches /$re/ in:" "$(head -c 3000 <<<"$text")"
    fi
}

# expect_file_match DESCRIPTION ERE FILE...
expect_file_match() {
    local desc=$1 re=$2
    shift 2
    if grep -Eqs -- "$re" "$@"; then
        ok "$desc"
    else
        not_ok "$desc" "no line matches /$re/ in $*:" "$(tail -n 15 "$@" 2>&1)"
    fi
}

# finish: prints the totals and exits.
finish() {
    [[ $SKIPPED -gt 0 ]] && echo "# $SKIPPED skipped"
    echo "$PASSED passed, $FAILED failed"
    if [[ $FAILED -gt 0 ]]; then exit 1; fi
    if [[ $PASSED -eq 0 && $SKIPPED -gt 0 ]]; then exit 77; fi
    exit 0
}

# require_root WHAT [WHY]: if not root, counts WHAT as skipped and finishes.
require_root() {
    if [[ $EUID -ne 0 ]]; then
        skip "$1: needs root (${2:-uroce add makes /dev/infiniband nodes})"
        finish
    fi
}

# ------------------------------------------------------------------- devices

# pick_octet BASE: prints a third octet X >= BASE (stepping by 1, at most 20
# tries) such that no UDP socket is bound to any 127.0.X.* address, so that
# devices of a parallel test (or of another user) do not collide with ours.
pick_octet() {
    local x=$1 i
    for ((i = 0; i < 20; i++, x++)); do
        ((x > 254)) && x=2
        if ! ss -Hunl 2>/dev/null | awk '{print $4}' | grep -q "^127\.0\.$x\."; then
            echo "$x"
            return 0
        fi
    done
    echo "$1"
    return 1
}

# add_device NAME IP [uroce add options...]: registers a device (deleted on exit).
add_device() {
    local name=$1 ip=$2
    shift 2
    local out
    if out=$("$UROCE" add "$name" --ip "$ip" "$@" 2>&1); then
        DEVICES+=("$name")
        ok "uroce add $name --ip $ip $*"
        return 0
    fi
    not_ok "uroce add $name --ip $ip $*" "$out"
    return 1
}

# ---------------------------------------------------------------- TCP ports

port_in_use() {
    [[ -n $(ss -Htan "( sport = :$1 )" 2>/dev/null) ]]
}

# free_tcp_port: prints a TCP port no socket uses (any state), never the same
# one twice in a run. The search starts at a point of 20000..59999 derived from
# the PID and goes up from the last port handed out (2000 tries at most).
free_tcp_port() {
    local i p
    [[ $NEXT_PORT -eq 0 ]] && NEXT_PORT=$((20000 + ($$ * 211) % 40000))
    for ((i = 0; i < 2000; i++)); do
        p=$((20000 + (NEXT_PORT - 20000 + i) % 40000))
        [[ $USED_PORTS == *" $p "* ]] && continue
        if ! port_in_use "$p"; then
            USED_PORTS+="$p "
            NEXT_PORT=$((p + 1))
            echo "$p"
            return 0
        fi
    done
    echo "free_tcp_port: no free port" >&2
    return 1
}

# wait_listen PORT SECONDS [PID]: waits until something listens on TCP PORT.
# Gives up early (status 2) if PID is given and has exited; 1 on timeout.
wait_listen() {
    local port=$1 secs=$2 pid=${3:-} i
    for ((i = 0; i < secs * 20; i++)); do
        if [[ -n $(ss -Htln "( sport = :$port )" 2>/dev/null) ]]; then return 0; fi
        if [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null; then return 2; fi
        sleep 0.05
    done
    return 1
}

# ------------------------------------------------------------- server/client

# run_pair LABEL PORT SECONDS [VAR=VALUE...] -- SERVER ARGS... -- CLIENT ARGS...
#
# Runs `uroce run -- SERVER...` in the background (environment VAR=VALUE added
# to both sides), waits (10 s at most) until PORT listens, runs
# `uroce run -- CLIENT...` and waits for both. Each side is under
# `timeout SECONDS` (then KILL 5 s later). The client is retried (3 times at
# most) if it could not connect and the server is still listening.
# Leaves: SRV_RC, CLI_RC (124/137 = timed out), SRV_OUT, SRV_ERR, CLI_OUT,
# CLI_ERR (file names under $WORK/LABEL.*), PAIR_SECS (wall time).
run_pair() {
    local label=$1 port=$2 secs=$3
    shift 3
    local envs=() srv=() cli=()
    while [[ $# -gt 0 && $1 != -- ]]; do envs+=("$1"); shift; done
    shift
    while [[ $# -gt 0 && $1 != -- ]]; do srv+=("$1"); shift; done
    shift
    cli=("$@")
    SRV_OUT="$WORK/$label.server.out"
    SRV_ERR="$WORK/$label.server.err"
    CLI_OUT="$WORK/$label.client.out"
    CLI_ERR="$WORK/$label.client.err"
    SRV_RC=-1
    CLI_RC=-1
    local start_ns
    start_ns=$(date +%s%N)
    env "${envs[@]}" timeout -k 5 "$secs" "$UROCE" run -- "${srv[@]}" >"$SRV_OUT" 2>"$SRV_ERR" &
    local spid=$!
    BG_PIDS+=("$spid")
    wait_listen "$port" 10 "$spid"
    local lrc=$?
    if [[ $lrc -ne 0 ]]; then
        echo "# $label: server did not listen on TCP port $port (wait status $lrc)" >&2
    fi
    local attempt
    for ((attempt = 1; attempt <= 3; attempt++)); do
        # In the background so that a signal to this script is handled at once.
        env "${envs[@]}" timeout -k 5 "$secs" "$UROCE" run -- "${cli[@]}" >"$CLI_OUT" 2>"$CLI_ERR" &
        local cpid=$!
        BG_PIDS+=("$cpid")
        wait "$cpid"
        CLI_RC=$?
        forget_pid "$cpid"
        # Retry only a failed connect (nothing exchanged yet) while the server waits.
        if [[ $CLI_RC -ne 0 ]] && grep -qiE "couldn't connect|unable to connect|connection refused" "$CLI_OUT" "$CLI_ERR" \
            && kill -0 "$spid" 2>/dev/null && wait_listen "$port" 5 "$spid"; then
            echo "# $label: client could not connect (attempt $attempt), retrying" >&2
            sleep 0.5
            continue
        fi
        break
    done
    # The server has its own timeout; this only bounds the wait a second time.
    local i
    for ((i = 0; i < (secs + 10) * 10; i++)); do
        kill -0 "$spid" 2>/dev/null || break
        sleep 0.1
    done
    stop_timed "$spid"
    wait "$spid"
    SRV_RC=$?
    forget_pid "$spid"
    PAIR_SECS=$(awk -v a="$start_ns" -v b="$(date +%s%N)" 'BEGIN { printf "%.2f", (b - a) / 1e9 }')
}

# pair_detail: lines describing the last run_pair, for not_ok.
pair_detail() {
    echo "server exit $SRV_RC, client exit $CLI_RC"
    echo "--- server stdout (tail):"
    tail -n 8 "$SRV_OUT" 2>/dev/null
    echo "--- server stderr (tail):"
    tail -n 8 "$SRV_ERR" 2>/dev/null
    echo "--- client stdout (tail):"
    tail -n 8 "$CLI_OUT" 2>/dev/null
    echo "--- client stderr (tail):"
    tail -n 8 "$CLI_ERR" 2>/dev/null
}

# expect_pair_ok LABEL: both sides exited 0.
expect_pair_ok() {
    if [[ $SRV_RC -eq 0 && $CLI_RC -eq 0 ]]; then
        ok "$1: server and client exit 0 (${PAIR_SECS}s)"
        return 0
    fi
    local why=""
    [[ $SRV_RC -eq 124 || $SRV_RC -eq 137 || $CLI_RC -eq 124 || $CLI_RC -eq 137 ]] && why=" (timed out)"
    # One detail line per output line; mapfile, not an unquoted $(...): a "*" in a program's
    # output must not expand to file names.
    local detail
    mapfile -t detail < <(pair_detail)
    not_ok "$1: server exit $SRV_RC, client exit $CLI_RC$why" "${detail[@]}"
    return 1
}

# counter_value FILE DEVICE NAME: the value of counter NAME in the last
# "uroce DEVICE counters:" line of FILE (empty if there is none).
counter_value() {
    grep -ao "uroce $2 counters:.*" "$1" 2>/dev/null | tail -n 1 | tr ' ' '\n' | awk -F= -v k="$3" '$1 == k { print $2 }'
}

# captures_fit N1 N2 S_TOTAL C_TOTAL S_REPEATS C_REPEATS: true if the two capture files'
# frame counts N1 and N2 are, in some order, the server's and the client's: each the packets
# its process counted sent and received (S_TOTAL, C_TOTAL), plus at most the peer's last ACKs
# sent again as its QP was destroyed (tx_last_ack_repeats), which can arrive after a process
# printed its counters.
captures_fit() {
    local n1=$1 n2=$2 s=$3 c=$4 s_rep=$5 c_rep=$6
    { ((n1 >= s && n1 <= s + c_rep && n2 >= c && n2 <= c + s_rep)); } ||
        { ((n2 >= s && n2 <= s + c_rep && n1 >= c && n1 <= c + s_rep)); }
}

# counters_line FILE DEVICE: the whole last counters line of DEVICE in FILE.
counters_line() {
    grep -ao "uroce $2 counters:.*" "$1" 2>/dev/null | tail -n 1
}
