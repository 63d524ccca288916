#!/usr/bin/env bash
# Unmodified RDMA CM applications (librdmacm 44: rdmacm-utils, perftest -R, qperf -cm1) over
# uroce devices on loopback, between two devices and within one, RC, UD (udaddy) and
# multicast (mckey), with the data they check themselves (rping -V, ucmatose, udaddy, mckey,
# rstream/riostream) and a connect nobody listens for.
#
#   test_rdma_cm.sh PATH_TO_UROCE
#
# RDMA CM servers have no TCP port to wait for: a server counts as ready once its RDMA CM
# port is marked listening in the registry's port tables, and a client that still finds no
# listener (REJECTED, invalid service ID) is run again, at most three times.
# Needs root (uroce add makes /dev/infiniband nodes); otherwise skips (exit 77).
# Last line: "N passed, M failed"; exit 1 if M > 0.
set -u
# shellcheck source=lib.sh
source "$(dirname "$(readlink -f "$0")")/lib.sh"
lib_init "$1"

for tool in rping ucmatose udaddy mckey cmtime rstream riostream rdma_server rdma_client ib_write_bw \
    ib_read_lat ib_send_bw qperf python3 timeout ss; do
    if ! command -v "$tool" >/dev/null; then
        skip "$tool is not installed (tools/setup.sh installs rdmacm-utils, perftest, qperf)"
        finish
    fi
done
require_root "RDMA CM applications over uroce"

OCT=$(pick_octet 61) || echo "# warning: every 127.0.61..80.* block has UDP sockets; using 127.0.$OCT"
A="cm$$a"
B="cm$$b"
IP_A="127.0.$OCT.1"
IP_B="127.0.$OCT.2"
add_device "$A" "$IP_A" || finish
add_device "$B" "$IP_B" --mtu 4096 || finish

# next_port: sets PORT to a port no TCP socket uses, another one on each call. (Not
# free_tcp_port in $(...): its bookkeeping would stay in the subshell, and RDMA CM ports are
# no TCP ports that it could see in use.)
CM_PORT=$((20000 + ($$ * 211) % 40000))
next_port() {
    local i
    for ((i = 0; i < 2000; i++)); do
        CM_PORT=$((20000 + (CM_PORT + 1 - 20000) % 40000))
        if ! port_in_use "$CM_PORT"; then
            PORT=$CM_PORT
            return 0
        fi
    done
    return 1
}

# cm_port_held PORT: some process listens on RDMA CM port PORT (TCP or UDP port space), on
# any address or on one of ours: a listener holds an OFD lock on the port's byte in the
# space's ".listening" table (docs/rdma-cm.md), which a POSIX lock test sees.
cm_port_held() {
    python3 - "$UROCE_ROOT/rdma_cm" "$1" "$IP_A" "$IP_B" <<'EOF'
import fcntl, os, sys
d, port = sys.argv[1], int(sys.argv[2])
names = [s + ".listening" + suffix for s in ("ports-tcp", "ports-udp")
         for suffix in [""] + ["." + ip for ip in sys.argv[3:]]]
for name in names:
    try:
        fd = os.open(os.path.join(d, name), os.O_RDWR)
    except OSError:
        continue
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port, 0)
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, port, 0)
    except OSError:
        sys.exit(0)
    finally:
        os.close(fd)
sys.exit(1)
EOF
}

# wait_cm_ready PORT PID [tcp]: until RDMA CM port PORT listens (or, with "tcp", TCP port
# PORT listens: qperf's control port), PID exits, or 10 s pass.
wait_cm_ready() {
    local port=$1 pid=$2 how=${3:-cm} i
    for ((i = 0; i < 200; i++)); do
        if [[ $how == tcp ]]; then
            [[ -n $(ss -Htln "( sport = :$port )" 2>/dev/null) ]] && break
        else
            cm_port_held "$port" && break
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    sleep 0.2
}

# cm_pair LABEL PORT SECONDS -- SERVER... -- CLIENT...: as run_pair (lib.sh), but with the
# readiness above (PORT 0: the server has no port; it is ready once it printed "joined").
cm_pair() {
    local label=$1 port=$2 secs=$3
    shift 4
    local srv=() cli=()
    while [[ $# -gt 0 && $1 != -- ]]; do srv+=("$1"); shift; done
    shift
    cli=("$@")
    SRV_OUT="$WORK/$label.server.out"
    SRV_ERR="$WORK/$label.server.err"
    CLI_OUT="$WORK/$label.client.out"
    CLI_ERR="$WORK/$label.client.err"
    local start_ns i attempt how=cm
    [[ ${srv[0]} == qperf ]] && how=tcp
    start_ns=$(date +%s%N)
    timeout -k 5 "$secs" "$UROCE" run -- "${srv[@]}" >"$SRV_OUT" 2>"$SRV_ERR" &
    local spid=$!
    BG_PIDS+=("$spid")
    if [[ $port == 0 ]]; then
        # No port (mckey's receiver): ready once it says it joined its group.
        for ((i = 0; i < 200; i++)); do
            grep -q "joined" "$SRV_OUT" 2>/dev/null && break
            kill -0 "$spid" 2>/dev/null || break
            sleep 0.05
        done
    else
        wait_cm_ready "$port" "$spid" "$how"
    fi
    local attempts=3
    [[ ${CM_CLIENT_RETRY:-1} == 0 ]] && attempts=1
    for ((attempt = 1; attempt <= attempts; attempt++)); do
        timeout -k 5 "$secs" "$UROCE" run -- "${cli[@]}" >"$CLI_OUT" 2>"$CLI_ERR" &
        local cpid=$!
        BG_PIDS+=("$cpid")
        wait "$cpid"
        CLI_RC=$?
        forget_pid "$cpid"
        if [[ $CLI_RC -ne 0 && $attempt -lt $attempts ]] && grep -qi "rejected" "$CLI_OUT" "$CLI_ERR" &&
            kill -0 "$spid" 2>/dev/null; then
            echo "# $label: no listener yet (attempt $attempt), retrying" >&2
            sleep 0.5
            continue
        fi
        break
    done
    # A server whose client failed may wait forever for it: give it 5 s, not the whole time.
    local server_wait=$((secs + 10))
    [[ $CLI_RC -ne 0 ]] && server_wait=5
    for ((i = 0; i < server_wait * 10; i++)); do
        kill -0 "$spid" 2>/dev/null || break
        sleep 0.1
    done
    stop_timed "$spid"
    wait "$spid"
    SRV_RC=$?
    forget_pid "$spid"
    PAIR_SECS=$(awk -v a="$start_ns" -v b="$(date +%s%N)" 'BEGIN { printf "%.2f", (b - a) / 1e9 }')
}

# no_errors LABEL FILE...: none of the files reports an error.
no_errors() {
    local label=$1
    shift
    if grep -qiE "error|mismatch|fail" "$@"; then
        not_ok "$label: no errors reported" "$(grep -hiE "error|mismatch|fail" "$@" | head -n 3)"
    else
        ok "$label: no errors reported"
    fi
}

# ------------------------------------------------------------------------------- rping
# rping_teardown_race: the client failed only in rping 44's own teardown race, after its
# test was done. Its main thread closes the event channel (rdma_destroy_event_channel) as soon
# as rdma_destroy_id returns, which is as soon as the event thread acknowledged DISCONNECTED;
# that thread then asks for the next event on the closed descriptor, gets EBADF and exits
# 255. A kernel's rdma_cm file answers the same (later rping stops its event thread first).
# Seen once in dozens of runs, on 2 CPUs beside another test. Only that exit, with those two
# last lines, after a server that exited 0.
rping_teardown_race() {
    [[ $SRV_RC -eq 0 && $CLI_RC -eq 255 ]] || return 1
    [[ "$(tail -n 2 "$CLI_ERR")" == $'client DISCONNECT EVENT...\nrdma_get_cm_event: Bad file descriptor' ]]
}

# -V: each side checks the data it received against what the peer was to send.
rping_pair() {
    local label=$1 srv_ip=$2 cli_ip=$3 port
    next_port || return
    port=$PORT
    cm_pair "$label" "$port" 60 -- rping -s -a "$srv_ip" -p "$port" -v -V -C 100 \
        -- rping -c -a "$srv_ip" -I "$cli_ip" -p "$port" -v -V -C 100
    if rping_teardown_race; then
        ok "$label: server exit 0, client exit 255 in rping's teardown race (EBADF after DISCONNECTED, see rping_teardown_race) (${PAIR_SECS}s)"
        echo "# $label: client stderr: $(tr '\n' '|' <"$CLI_ERR")" >&2
    else
        expect_pair_ok "$label" || return
    fi
    expect_eq "$label: the server got 100 pings" 100 "$(grep -c '^server ping data: rdma-ping-' "$SRV_OUT")"
    expect_eq "$label: the client got 100 pings" 100 "$(grep -c '^ping data: rdma-ping-' "$CLI_OUT")"
    expect_file_match "$label: the last ping's data" "rdma-ping-99: " "$CLI_OUT"
    no_errors "$label" "$SRV_OUT" "$SRV_ERR" "$CLI_OUT" "$CLI_ERR"
}
rping_pair "rping A<-B" "$IP_A" "$IP_B"
rping_pair "rping within A" "$IP_A" "$IP_A"

# ---------------------------------------------------------------------------- ucmatose
next_port
port=$PORT
cm_pair "ucmatose" "$port" 60 -- ucmatose -b "$IP_A" -p "$port" -c 10 -C 10 \
    -- ucmatose -s "$IP_A" -b "$IP_B" -p "$port" -c 10 -C 10
if expect_pair_ok "ucmatose"; then
    expect_file_match "ucmatose: the server's transfers completed" "data transfers complete" "$SRV_OUT"
    expect_file_match "ucmatose: the client's test completed" "^test complete" "$CLI_OUT"
    expect_file_match "ucmatose: the client reports status 0" "return status 0" "$CLI_OUT"
fi

# ----------------------------------------------------------------------------- udaddy
# UD over RDMA CM: SIDR REQ/REP gives the client the server's QPN and Q_Key; 10 identifiers
# each way exchange 10 datagrams (udaddy's default port; it has no option for another).
cm_pair "udaddy" 7174 60 -- udaddy -b "$IP_A" -c 10 -C 10 -- udaddy -s "$IP_A" -b "$IP_B" -c 10 -C 10
if expect_pair_ok "udaddy"; then
    expect_file_match "udaddy: the server's transfers completed" "data transfers complete" "$SRV_OUT"
    expect_file_match "udaddy: the client reports status 0" "return status 0" "$CLI_OUT"
    no_errors "udaddy" "$SRV_ERR" "$CLI_ERR"
fi

# ------------------------------------------------------------------------------ mckey
# Multicast over RDMA CM: both join 239.x.y.1 (granted at once on RoCE, MGID
# ::ffff:239.x.y.1); the receiver on A counts the 10 datagrams the sender on B sends to it.
group="239.$((OCT % 200)).$((($$ / 7) % 250)).1"
cm_pair "mckey" 0 60 -- mckey -m "$group" -b "$IP_A" -C 10 -- mckey -m "$group" -s -b "$IP_B" -C 10
if expect_pair_ok "mckey"; then
    expect_file_match "mckey: the receiver joined ::ffff:$group" "joined dgid: ::ffff:$group" "$SRV_OUT"
    expect_file_match "mckey: the receiver got every datagram" "data transfers complete" "$SRV_OUT"
    expect_file_match "mckey: the sender reports status 0" "return status 0" "$CLI_OUT"
fi

# ------------------------------------------------------------------------------ cmtime
# The server runs until killed.
next_port
port=$PORT
timeout -k 5 60 "$UROCE" run -- cmtime -b "$IP_A" -p "$port" >"$WORK/cmtime.server.out" 2>&1 &
CMT=$!
BG_PIDS+=("$CMT")
wait_cm_ready "$port" "$CMT"
timeout -k 5 60 "$UROCE" run -- cmtime -s "$IP_A" -b "$IP_B" -p "$port" -c 20 >"$WORK/cmtime.client.out" 2>&1
rc=$?
kill "$CMT" 2>/dev/null
wait "$CMT" 2>/dev/null
forget_pid "$CMT"
expect_eq "cmtime -c 20: client exit" 0 "$rc"
for step in "resolve addr" "resolve route" "create qp" "connect" "disconnect" "destroy"; do
    expect_file_match "cmtime: '$step' timed" "^$step *:" "$WORK/cmtime.client.out"
done
no_errors "cmtime" "$WORK/cmtime.client.out"

# ------------------------------------------------------------------- rstream, riostream
# rsockets over RDMA CM and RC; the programs fail on a short transfer.
for prog in rstream riostream; do
    next_port
    port=$PORT
    cm_pair "$prog" "$port" 60 -- "$prog" -b "$IP_A" -p "$port" -S 65536 -C 200 \
        -- "$prog" -s "$IP_A" -b "$IP_B" -p "$port" -S 65536 -C 200
    if expect_pair_ok "$prog"; then
        expect_file_match "$prog: the client transferred 200 x 64k" "^custom +64k +200 " "$CLI_OUT"
    fi
done

# --------------------------------------------------------------- rdma_server, rdma_client
# librdmacm's synchronous API (rdma_getaddrinfo, rdma_create_ep, rdma_get_request); the
# server binds every address.
next_port
port=$PORT
cm_pair "rdma_server-client" "$port" 60 -- rdma_server -p "$port" -- rdma_client -s "$IP_A" -p "$port"
if expect_pair_ok "rdma_server/client"; then
    expect_file_match "rdma_server ends with 0" "rdma_server: end 0" "$SRV_OUT"
    expect_file_match "rdma_client ends with 0" "rdma_client: end 0" "$CLI_OUT"
fi

# ------------------------------------------------------------------------- perftest -R
# With -R perftest makes two RDMA CM connections on one port: a control connection, then,
# after a handshake over it, the test's. The server listens again for the second only after
# the handshake, and on a loaded machine the client's REQ can come first (timed on a capture
# at a load of 6: the server saw the handshake's last ACK 8 ms after it was sent, the client
# sent its REQ 3.7 ms after the handshake). A kernel's CM answers such a REQ with REJ 8, and
# perftest's client then retries on identifiers it has already destroyed and crashes
# (perftest 4.5-0.17); uroce's CM holds a REQ for a port nobody listens on for a moment
# (docs/rdma-cm.md), so the pair must pass the first time: no rerun. (By hand on 2026-11-30,
# ib_read_lat -R lost the race in 13 of 21 pairs without the hold, 0 of 30 with it.)
perf_pair() {
    local label=$1 prog=$2
    shift 2
    next_port || return
    CM_CLIENT_RETRY=0 cm_pair "$label" "$PORT" 90 -- "$prog" -R -d "$A" -p "$PORT" "$@" \
        -- "$prog" -R -d "$B" -p "$PORT" "$@" "$IP_A"
    expect_pair_ok "$label" || return
    # The results line: message size, iterations, figures.
    expect_file_match "$label: client results" "^ +[0-9]+ +[0-9]+ +[0-9.]+" "$CLI_OUT"
}
perf_pair "ib_write_bw -R" ib_write_bw -n 200 -s 65536
perf_pair "ib_read_lat -R" ib_read_lat -n 200
perf_pair "ib_send_bw -R" ib_send_bw -n 200 -s 65536

# ------------------------------------------------------------------------- qperf -cm1
# Four tests in one run, as users run qperf. The server runs until the client's quit, in a
# child process per test. qperf 0.4.11 has two faults of its own that a CM must absorb:
# - its server tells the client the test's port before it listens on it ("Fix rdmacm race"
#   upstream, after that release): the REQ waits for the listener (unmatched_hold);
# - its server's child crashes (SIGSEGV, rdma_destroy_qp on the listening identifier) right
#   after it saw the client's DREQ: a kernel answers for a dead process (DREP); uroce
#   answers a DREQ as it arrives. Without that, each test's disconnect waits out the DREQ's
#   15 resends (16 s) and the run takes over a minute: hence 45 s, not more (7-8 s are
#   needed).
next_port
cm_pair "qperf -cm1" "$PORT" 45 -- qperf -lp "$PORT" -- qperf -lp "$PORT" "$IP_A" -cm1 -m 16k -t 1 \
    rc_bw rc_lat rc_rdma_write_bw rc_rdma_read_lat quit
if expect_pair_ok "qperf -cm1"; then
    for t in rc_bw rc_lat rc_rdma_write_bw rc_rdma_read_lat; do
        expect_file_match "qperf: $t ran" "^$t:" "$CLI_OUT"
    done
    expect_eq "qperf: two bandwidths" 2 "$(grep -c "bw  = " "$CLI_OUT")"
    expect_eq "qperf: two latencies" 2 "$(grep -c "latency  = " "$CLI_OUT")"
fi

# --------------------------------------------------------------------- nobody listening
# A REQ for a port nobody listens on is answered with a REJ (invalid service ID): REJECTED
# with reason 8, not UNREACHABLE after the CM's retries (which a REQ ending up in a context
# without QP1 would get). Some process must run a CM on the device to answer (here a
# listener on another port): with no process on it at all, nothing answers for a device
# (docs/rdma-cm.md).
next_port
other=$PORT
next_port
port=$PORT
timeout -k 5 60 "$UROCE" run -- rping -s -a "$IP_A" -p "$other" -C 1 >"$WORK/other.out" 2>&1 &
OTHER=$!
BG_PIDS+=("$OTHER")
wait_cm_ready "$other" "$OTHER"
timeout -k 5 30 "$UROCE" run -- rping -c -a "$IP_A" -I "$IP_B" -p "$port" -C 1 >"$WORK/refused.out" 2>&1
rc=$?
kill "$OTHER" 2>/dev/null
wait "$OTHER" 2>/dev/null
forget_pid "$OTHER"
if [[ $rc -ne 0 && $rc -ne 124 && $rc -ne 137 ]]; then
    ok "rping to a port nobody listens on fails (exit $rc)"
else
    not_ok "rping to a port nobody listens on fails" "exit $rc"
fi
expect_file_match "the client saw a REJ (invalid service ID, 8)" "REJECTED.*error 8" "$WORK/refused.out"

finish
