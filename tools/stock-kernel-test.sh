#!/usr/bin/env bash
# uroce on Debian 12's stock kernel, whose RDMA stack answers netlink: a QEMU guest check.
#
#   tools/stock-kernel-test.sh [BUILD_DIR]        (default: build; run as root)
#
# This machine's kernel has no RDMA, so libibverbs falls back to SYSFS_PATH here whatever
# uroce does. The guest boots the kernel of Debian's linux-image-amd64 (ib_core, ib_uverbs,
# rdma_rxe as modules), loads rdma_rxe, makes a kernel rxe device, and checks that:
#   - the kernel's RDMA netlink answers, and `uroce add/list` warn about it;
#   - with SYSFS_PATH and RDMAV_DRIVERS alone (what `uroce run` did before it refused RDMA
#     netlink) libibverbs sees only the kernel device, not uroce's;
#   - `uroce run -- ibv_devices` and `eval "$(uroce env)"; ibv_devices` list the uroce
#     devices and hide the kernel's;
#   - ibv_rc_pingpong runs between two uroce devices, through `uroce run` and through
#     `uroce env`.
# The guest (tools/guest-image.sh): Debian's kernel and busybox, this host's Debian 12
# userland (ibverbs-utils, iproute2's rdma) and uroce's build. Cache: $STOCK_VM_CACHE
# (default BUILD_DIR/stock-vm). QEMU runs with TCG unless GUEST_ACCEL=kvm. Output: "ok -
# ..."/"not ok - ..." lines from the guest, then "N passed, M failed"; exit 1 on any
# failure or if the guest did not finish (bounded by STOCK_VM_TIMEOUT seconds, default 900).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
cache=${STOCK_VM_CACHE:-$build/stock-vm}
limit=${STOCK_VM_TIMEOUT:-900}
test_name=stock-kernel-test
start=$(date +%s)
# shellcheck source=tools/guest-image.sh
. "$top/tools/guest-image.sh"

for f in tools/uroce tools/liburoce-no-rdma-netlink.so provider/liburoce-rdmav34.so; do
    [[ -f $build/$f ]] || guest_die "$build/$f is missing: build uroce first (meson setup build && ninja -C build)"
done
guest_host_tools
guest_kernel
guest_rootfs ibv_devices ibv_devinfo ibv_rc_pingpong rdma
# rxe asks the crypto API for "crc32" when a device is made.
guest_modules rdma_rxe ib_uverbs dummy crc32_generic

init=$(mktemp)
trap 'rm -f "$init"' EXIT
cat >"$init" <<'GUEST'
#!/bin/sh
# The guest's /init: the checks, one "ok - " or "not ok - " line each on the console.
. /etc/checks.sh
export UROCE_ROOT=/run/uroce

echo "# guest kernel $(uname -r)"
$UROCE list >/tmp/out 2>&1
expect "uroce list: ib_core can be loaded" "warning: this kernel has RDMA support \(ib_core can be loaded" /tmp/out

for m in crc32_generic rdma_rxe ib_uverbs dummy; do
    [ -d /sys/module/$m ] || modprobe $m || not_ok "modprobe $m"
done
[ -e /sys/class/net/dummy0 ] || ip link add dummy0 type dummy
ip link set dummy0 up
rdma link add krxe0 type rxe netdev dummy0 >/tmp/rdma.out 2>&1 ||
    not_ok "rdma link add krxe0" "$(cat /tmp/rdma.out)" "$(ls /sys/class/net /sys/module | tr '\n' ' ')"
if [ -d /sys/module/ib_core ]; then ok "ib_core is loaded"; else not_ok "ib_core is loaded"; fi
ibv_devices >/tmp/out 2>&1
expect "plain ibv_devices lists the kernel's rxe device" "^[[:space:]]+krxe0[[:space:]]" /tmp/out

# The kernel's rxe holds UDP port 4791 on every address, so the uroce devices use another.
$UROCE add u0 --ip 127.0.0.1 --port 4792 >/tmp/out 2>&1 || not_ok "uroce add u0" "$(cat /tmp/out)"
expect "uroce add: ib_core is loaded" "^uroce add: warning: this kernel has RDMA support \(ib_core is loaded\)" /tmp/out
$UROCE add u1 --ip 127.0.0.2 --port 4792 >/dev/null 2>&1 || not_ok "uroce add u1"
$UROCE list >/tmp/out 2>&1
expect "uroce list: ib_core is loaded" "^uroce list: warning: this kernel has RDMA support \(ib_core is loaded\)" /tmp/out
expect "uroce list: lists u0" "^u0 " /tmp/out

# What `uroce run` did before it refused RDMA netlink: the two variables alone.
SYSFS_PATH=/run/uroce/sys RDMAV_DRIVERS=/opt/uroce/provider/liburoce ibv_devices >/tmp/out 2>&1
expect_no "SYSFS_PATH alone: libibverbs does not see u0 (netlink answered)" "^[[:space:]]+u0[[:space:]]" /tmp/out

$UROCE run -- ibv_devices >/tmp/out 2>&1
expect "uroce run -- ibv_devices lists u0" "^[[:space:]]+u0[[:space:]]" /tmp/out
expect "uroce run -- ibv_devices lists u1" "^[[:space:]]+u1[[:space:]]" /tmp/out
expect_no "uroce run -- ibv_devices hides the kernel's krxe0" "krxe0" /tmp/out
(eval "$($UROCE env 2>/dev/null)" && ibv_devices) >/tmp/out 2>&1
expect "uroce env + ibv_devices lists u0" "^[[:space:]]+u0[[:space:]]" /tmp/out
expect_no "uroce env + ibv_devices hides the kernel's krxe0" "krxe0" /tmp/out

# pingpong SERVER_PREFIX CLIENT_PREFIX LABEL PORT: ibv_rc_pingpong between u0 and u1.
pingpong() {
    $1 ibv_rc_pingpong -d u0 -g 0 -p "$4" -n 200 >/tmp/srv 2>&1 &
    spid=$!
    wait_listen "$4"
    timeout 120 $2 ibv_rc_pingpong -d u1 -g 0 -p "$4" -n 200 127.0.0.1 >/tmp/cli 2>&1
    crc=$?
    wait_gone $spid 30
    wait $spid
    src=$?
    if [ $crc -eq 0 ] && [ $src -eq 0 ] && grep -q "200 iters" /tmp/cli && grep -q "200 iters" /tmp/srv; then
        ok "ibv_rc_pingpong u0 <-> u1 through $3: $(grep 'iters' /tmp/cli)"
    else
        not_ok "ibv_rc_pingpong u0 <-> u1 through $3: server $src, client $crc" \
            "$(tail -n 5 /tmp/srv)" "$(tail -n 5 /tmp/cli)"
    fi
}
pingpong "$UROCE run --" "$UROCE run --" "uroce run" 18515
eval "$($UROCE env 2>/dev/null)"
pingpong "" "" "uroce env" 18516

summary
GUEST

guest_boot_and_exit "$init" "$limit"
