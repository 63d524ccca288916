#!/usr/bin/env bash
# uroce against the Linux kernel's rxe, on the wire: a QEMU guest check.
#
#   tools/rxe-interop-test.sh [BUILD_DIR]        (default: build; run as root)
#
# The guest (tools/guest-image.sh) boots Debian 12's stock kernel and makes an rxe device on
# one end of a veth pair; a uroce device sits on the other end, in a network namespace of
# its own (rxe holds UDP port 4791 on every address of its namespace). Each check runs a
# real program on both sides, with its own data checks:
#   - ibv_rc_pingpong -s 65536 -c (every received buffer checked), rxe the server and uroce
#     the client, then the other way round; without loss (over IPv4 and over IPv6: the
#     ICRC masks other header fields there), and with 3% of uroce's packets
#     dropped each way (UROCE_FAULTS; what it receives only until near the end, below): RC
#     segmentation, ACK coalescing, NAKs and resends,
#     uroce keeping rxe's packets after a loss and running them when the gap fills
#     (rx_early_run must not be 0; docs/selective-recovery.md) and the ACKs rxe takes while
#     it goes back N;
#   - rc_verify (tools/interop) with 5% of uroce's packets dropped: WRITEs and READs back,
#     every byte and the guards around the buffers checked, both sides' PSNs starting just
#     before the 24-bit wrap, uroce the requester (keeping READ responses after a loss and
#     asking rxe for the gap alone: rx_read_kept must not be 0), then rxe;
#   - ibv_uc_pingpong and ibv_srq_pingpong -c, ibv_ud_pingpong (UD with GRH, addressed by
#     GID), ib_atomic_bw (both atomics) and ib_read_bw -s 65536 (READs in flight), each way;
#   - rping -V, uroce's RDMA CM (user space) against the kernel's, both ways;
#   - no WARNING from the kernel's RDMA stack in dmesg.
# Every run is bounded by `timeout`; the whole guest by RXE_INTEROP_TIMEOUT seconds (default
# 900). Cache: $RXE_INTEROP_CACHE (default BUILD_DIR/rxe-interop-vm). Output: "ok - ..." and
# "not ok - ..." lines, then "N passed, M failed"; exit 1 on any failure or if the guest did
# not finish.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
cache=${RXE_INTEROP_CACHE:-$build/rxe-interop-vm}
limit=${RXE_INTEROP_TIMEOUT:-900}
test_name=rxe-interop-test
start=$(date +%s)
# shellcheck source=tools/guest-image.sh
. "$top/tools/guest-image.sh"

for f in tools/uroce tools/liburoce-no-rdma-netlink.so provider/liburoce-rdmav34.so \
    tools/interop/rc_verify; do
    [[ -f $build/$f ]] || guest_die "$build/$f is missing: build uroce first (meson setup build && ninja -C build)"
done
guest_host_tools
for pkg in rdmacm-utils:rping perftest:ib_read_bw; do
    command -v "${pkg#*:}" >/dev/null || DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${pkg%%:*}" >/dev/null
done
guest_kernel
guest_rootfs ibv_devices ibv_devinfo ibv_rc_pingpong ibv_uc_pingpong ibv_srq_pingpong \
    ibv_ud_pingpong ib_atomic_bw ib_read_bw rdma ip rping "$build/tools/interop/rc_verify"
guest_modules rdma_rxe ib_uverbs rdma_ucm veth crc32_generic

init=$(mktemp)
trap 'rm -f "$init"' EXIT
cat >"$init" <<'GUEST'
#!/bin/sh
# The guest's /init: the checks, one "ok - " or "not ok - " line each on the console.
. /etc/checks.sh
export UROCE_ROOT=/run/uroce
echo "# guest kernel $(uname -r), up $(cut -d" " -f1 /proc/uptime) s"

for m in crc32_generic rdma_rxe ib_uverbs rdma_ucm veth; do
    [ -d /sys/module/$m ] || modprobe $m || not_ok "modprobe $m"
done
# kx0 (10.77.0.1, rxe's) <-> ux0 (10.77.0.2, uroce's, in namespace ur)
ip netns add ur
ip link add kx0 type veth peer name ux0
ip link set ux0 netns ur
ip addr add 10.77.0.1/24 dev kx0
ip link set kx0 up
ip netns exec ur ip link set lo up
ip netns exec ur ip addr add 10.77.0.2/24 dev ux0
ip netns exec ur ip link set ux0 up
rdma link add krxe type rxe netdev kx0 >/tmp/out 2>&1 || not_ok "rdma link add krxe" "$(cat /tmp/out)"
UR="ip netns exec ur"
$UR $UROCE add ur0 --ip 10.77.0.2 >/tmp/out 2>&1 || not_ok "uroce add ur0" "$(cat /tmp/out)"
# The same pair over IPv6: fd00:77::1 (rxe's) and fd00:77::2 (a second uroce device's).
ip -6 addr add fd00:77::1/64 dev kx0 nodad
$UR ip -6 addr add fd00:77::2/64 dev ux0 nodad
$UR $UROCE add ur6 --ip fd00:77::2 >/tmp/out 2>&1 || not_ok "uroce add ur6" "$(cat /tmp/out)"

# rxe_gid GID ADDRESS: in `found`, the index of rxe's RoCE v2 GID whose value is GID (the
# table fills once the link is up and the address is there); 1 if none comes within 10 s.
rxe_gid() {
    k=0
    while [ $k -lt 100 ]; do
        for f in /sys/class/infiniband/krxe/ports/1/gids/*; do
            n=${f##*/}
            if [ "$(cat "$f" 2>/dev/null)" = "$1" ] &&
                [ "$(cat /sys/class/infiniband/krxe/ports/1/gid_attrs/types/$n 2>/dev/null)" = "RoCE v2" ]; then
                ok "rxe's RoCE v2 GID for $2 is index $n"
                found=$n
                return
            fi
        done
        sleep 0.1
        k=$((k + 1))
    done
    not_ok "rxe's RoCE v2 GID for $2" "$(cat /sys/class/infiniband/krxe/ports/1/gids/* 2>&1 | sort -u)"
    found=1
}
rxe_gid 0000:0000:0000:0000:0000:ffff:0a4d:0001 10.77.0.1
G=$found
rxe_gid fd00:0077:0000:0000:0000:0000:0000:0001 fd00:77::1
G6=$found
$UR ping -c 1 -W 5 10.77.0.1 >/tmp/out 2>&1 || not_ok "ping over the veth pair" "$(cat /tmp/out)"

# exchange PORT SERVER_SIDE(rxe|uroce) SERVER_COMMAND CLIENT_COMMAND: the server in the
# background, the client once it listens on TCP PORT (the out-of-band exchange of the verbs
# programs); their exit statuses in src and crc, their outputs in /tmp/srv and /tmp/cli.
# With CONNECT_RETRY set, the server listens through RDMA CM instead, which no tool here
# shows: the client is run again (a second apart, 20 times at most) while it exits non-zero
# having printed nothing that matches CONNECT_RETRY's ERE (a REJ: no listener yet).
exchange() {
    t0=$(date +%s)
    sh -c "$3" >/tmp/srv 2>&1 &
    spid=$!
    if [ -z "${CONNECT_RETRY:-}" ]; then
        if [ "$2" = uroce ]; then wait_listen "$1" $UR; else wait_listen "$1"; fi
    fi
    j=0
    while :; do
        timeout 180 sh -c "$4" >/tmp/cli 2>&1
        crc=$?
        j=$((j + 1))
        [ -n "${CONNECT_RETRY:-}" ] && [ $crc -ne 0 ] && [ $j -lt 20 ] &&
            ! grep -Eq "$CONNECT_RETRY" /tmp/cli && kill -0 $spid 2>/dev/null || break
        sleep 1
    done
    wait_gone $spid 60
    wait $spid
    src=$?
    echo "# port $1: $(($(date +%s) - t0)) s, $j client run(s)"
}
# run LABEL PORT SERVER_SIDE EXPECT SERVER_COMMAND CLIENT_COMMAND: an exchange in which both
# sides exit 0 and print a line matching the ERE EXPECT.
run() {
    exchange "$2" "$3" "$5" "$6"
    if [ $crc -eq 0 ] && [ $src -eq 0 ] && grep -Eq "$4" /tmp/cli && grep -Eq "$4" /tmp/srv; then
        ok "$1: $(grep -E "$4" /tmp/cli | head -n 1)"
    else
        not_ok "$1: server exit $src, client exit $crc" "server: $(tail -n 6 /tmp/srv)" \
            "client: $(tail -n 6 /tmp/cli)"
    fi
}
# counter NAME FILE: the value of uroce's counter NAME in FILE (UROCE_STATS's line), or 0
counter() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" "$2" | head -n 1 | grep . || echo 0; }
# lossy LABEL FILE [COUNTER]: uroce's injected loss happened both ways in the run just ended
# (FILE: the output of whichever side ran uroce), otherwise the run proves nothing of it; and
# uroce's COUNTER, if named, is not 0.
lossy() {
    tx=$(counter tx_dropped_fault "$2")
    rx=$(counter rx_dropped_fault "$2")
    if [ "$tx" -gt 0 ] && [ "$rx" -gt 0 ]; then ok "$1: uroce dropped $tx sent, $rx received"
    else not_ok "$1: uroce dropped nothing" "$(grep counters "$2" | head -c 600)"; fi
    [ -n "${3:-}" ] || return 0
    if [ "$(counter "$3" "$2")" -gt 0 ]; then ok "$1: uroce's $3 $(counter "$3" "$2")"
    else not_ok "$1: uroce's $3 is 0" "$(grep counters "$2" | head -c 600)"; fi
}

KPP="ibv_rc_pingpong -d krxe -g $G -s 65536 -m 1024 -n 40 -c"
UPP="$UROCE run -- ibv_rc_pingpong -d ur0 -g 0 -s 65536 -m 1024 -n 40 -c"
# What uroce receives is lost only in its first 2,000 packets (of some 4,000): rxe's last ACK
# goes once, and if it is lost after rxe's side has exited, uroce's last SEND fails with
# retry exceeded (5 runs of 233 without the bound, 2026-12-05). uroce's own last ACK goes
# twice when its QP stops (RcQp::send_last_ack), so what it sends is lost to the end.
LOSS="UROCE_STATS=1 UROCE_FAULTS='drop=0.03,seed=11;dir=rx,drop=0.03,seed=12,until=2000'"
run "RC 64 KiB ping-pong, rxe server, uroce client" 18701 rxe "40 iters in" \
    "$KPP -p 18701" "$UR $UPP -p 18701 10.77.0.1"
run "RC 64 KiB ping-pong, uroce server, rxe client" 18702 uroce "40 iters in" \
    "$UR $UPP -p 18702" "$KPP -p 18702 10.77.0.2"
run "RC 64 KiB ping-pong over IPv6, rxe server, uroce client" 18715 rxe "40 iters in" \
    "ibv_rc_pingpong -d krxe -g $G6 -s 65536 -m 1024 -n 40 -c -p 18715" \
    "$UR $UROCE run -- ibv_rc_pingpong -d ur6 -g 0 -s 65536 -m 1024 -n 40 -c -p 18715 10.77.0.1"
run "RC 64 KiB ping-pong over IPv6, uroce server, rxe client" 18716 uroce "40 iters in" \
    "$UR $UROCE run -- ibv_rc_pingpong -d ur6 -g 0 -s 65536 -m 1024 -n 40 -c -p 18716" \
    "ibv_rc_pingpong -d krxe -g $G6 -s 65536 -m 1024 -n 40 -c -p 18716 10.77.0.2"
run "RC 64 KiB ping-pong, 3% loss each way at uroce, rxe server, uroce client" 18703 rxe \
    "40 iters in" "$KPP -p 18703" "$UR env $LOSS $UPP -p 18703 10.77.0.1"
lossy "  that run's loss" /tmp/cli rx_early_run
run "RC 64 KiB ping-pong, 3% loss each way at uroce, uroce server, rxe client" 18704 uroce \
    "40 iters in" "$UR env $LOSS $UPP -p 18704" "$KPP -p 18704 10.77.0.2"
lossy "  that run's loss" /tmp/srv rx_early_run

KV="rc_verify -d krxe -g $G -s 4096 -q 4 --stall 60 --psn 16777000"
UV="$UROCE run -- rc_verify -d ur0 -g 0 -s 4096 -q 4 --stall 60 --psn 16777100"
VLOSS="UROCE_STATS=1 UROCE_FAULTS='drop=0.05,seed=21;dir=rx,drop=0.05,seed=22'"
run "rc_verify WRITE+READ 4 KiB across the PSN wrap, 5% loss each way at uroce, uroce the requester" 18705 rxe \
    "^RESULT" "$KV -p 18705" "$UR env $VLOSS $UV -n 200 -p 18705 10.77.0.1"
# uroce kept READ responses that followed a lost one and asked rxe for the gap alone.
lossy "  that run's loss" /tmp/cli rx_read_kept
run "rc_verify WRITE+READ 4 KiB across the PSN wrap, 5% loss each way at uroce, rxe the requester" 18706 uroce \
    "^RESULT" "$UR env $VLOSS $UV -p 18706" "$KV -n 200 -p 18706 10.77.0.2"
lossy "  that run's loss" /tmp/srv rx_early_run

for kind in uc srq; do
    KX="ibv_${kind}_pingpong -d krxe -g $G -s 4096 -m 1024 -n 100 -c"
    UX="$UROCE run -- ibv_${kind}_pingpong -d ur0 -g 0 -s 4096 -m 1024 -n 100 -c"
    run "$kind ping-pong 4 KiB, rxe server, uroce client" 18711 rxe "100 iters in" \
        "$KX -p 18711" "$UR $UX -p 18711 10.77.0.1"
    run "$kind ping-pong 4 KiB, uroce server, rxe client" 18712 uroce "100 iters in" \
        "$UR $UX -p 18712" "$KX -p 18712 10.77.0.2"
done

# perftest: no data check, but a packet either side misreads ends in an error completion.
for t in "ib_atomic_bw -A FETCH_AND_ADD" "ib_atomic_bw -A CMP_AND_SWAP" "ib_read_bw -s 65536"; do
    KX="$t -d krxe -x $G -n 200 -F"
    UX="$UROCE run -- $t -d ur0 -x 0 -n 200 -F"
    run "$t, uroce the requester" 18713 rxe "^ *[0-9]+ +200 " "$KX -p 18713" \
        "$UR $UX -p 18713 10.77.0.1"
    run "$t, rxe the requester" 18714 uroce "^ *[0-9]+ +200 " "$UR $UX -p 18714" \
        "$KX -p 18714 10.77.0.2"
done

KUD="ibv_ud_pingpong -d krxe -g $G -s 1024 -n 100"
UUD="$UROCE run -- ibv_ud_pingpong -d ur0 -g 0 -s 1024 -n 100"
run "UD ping-pong, rxe server, uroce client" 18707 rxe "100 iters in" \
    "$KUD -p 18707" "$UR $UUD -p 18707 10.77.0.1"
run "UD ping-pong, uroce server, rxe client" 18708 uroce "100 iters in" \
    "$UR $UUD -p 18708" "$KUD -p 18708 10.77.0.2"

# rping_pair LABEL PORT SERVER_SIDE SERVER_IP SERVER_PREFIX CLIENT_PREFIX: 20 pings, each
# side checking what it received (-V). rping 44's client may exit 255 after its test is done,
# in its own teardown race (tests/scripts/test_rdma_cm.sh): taken only with those last lines.
rping_pair() {
    CONNECT_RETRY="ping data" exchange "$2" "$3" "$5 rping -s -v -V -C 20 -S 4096 -a $4 -p $2" \
        "$6 rping -c -v -V -C 20 -S 4096 -a $4 -p $2"
    if [ $crc -eq 255 ] && [ "$(tail -n 1 /tmp/cli)" = "rdma_get_cm_event: Bad file descriptor" ]; then
        crc=0
    fi
    if [ $crc -eq 0 ] && [ $src -eq 0 ] &&
        [ "$(grep -c '^server ping data: rdma-ping-' /tmp/srv)" = 20 ] &&
        [ "$(grep -c '^ping data: rdma-ping-' /tmp/cli)" = 20 ]; then
        ok "$1: 20 pings, each checked on both sides"
    else
        not_ok "$1: server exit $src, client exit $crc" "server: $(tail -n 6 /tmp/srv)" \
            "client: $(tail -n 6 /tmp/cli)"
    fi
}
rping_pair "rping -V (RDMA CM), rxe server, uroce client" 18709 rxe 10.77.0.1 "" \
    "$UR $UROCE run --"
rping_pair "rping -V (RDMA CM), uroce server, rxe client" 18710 uroce 10.77.0.2 \
    "$UR $UROCE run --" ""

dmesg >/tmp/dmesg
expect_no "no WARNING from the kernel" "WARNING" /tmp/dmesg
summary
GUEST

guest_boot_and_exit "$init" "$limit"
