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
# The kernel and busybox come from Debian packages (apt-get download, cached); the rest of
# the guest is this host's Debian 12 userland (ibverbs-utils, iproute2's rdma, the libraries
# ldd names) and uroce's build. Cache: $STOCK_VM_CACHE (default BUILD_DIR/stock-vm).
# QEMU runs with TCG unless STOCK_VM_ACCEL=kvm. Output: "ok - ..."/"not ok - ..." lines
# from the guest, then "N passed, M failed"; exit 1 on any failure or if the guest did not
# finish (bounded by STOCK_VM_TIMEOUT seconds, default 900).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
cache=${STOCK_VM_CACHE:-$build/stock-vm}
accel=${STOCK_VM_ACCEL:-tcg}
limit=${STOCK_VM_TIMEOUT:-900}
start=$(date +%s)

log() { echo "# stock-kernel-test: $*"; }
die() {
    echo "stock-kernel-test: $*" >&2
    exit 1
}

[[ $(id -u) -eq 0 ]] || die "run as root (apt-get download, device nodes in the guest image)"
for f in tools/uroce tools/liburoce-no-rdma-netlink.so provider/liburoce-rdmav34.so; do
    [[ -f $build/$f ]] || die "$build/$f is missing: build uroce first (meson setup build && ninja -C build)"
done

# ------------------------------------------------------------------ host tools
declare -A tool_pkg=([qemu-system-x86_64]=qemu-system-x86 [cpio]=cpio [depmod]=kmod
    [modinfo]=kmod [dpkg-deb]=dpkg [xz]=xz-utils [zstd]=zstd [ibv_rc_pingpong]=ibverbs-utils
    [rdma]=iproute2)
missing=()
for t in "${!tool_pkg[@]}"; do command -v "$t" >/dev/null || missing+=("${tool_pkg[$t]}"); done
if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi
[[ -f /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so ]] ||
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ibverbs-providers >/dev/null

# ------------------------------------------------------ Debian packages (cached)
mkdir -p "$cache/debs"
resolve_kernel() {
    apt-cache depends linux-image-amd64 2>/dev/null |
        awk '/Depends: linux-image-[0-9]/ { print $2; exit }'
}
kpkg=$(resolve_kernel)
if [[ -z $kpkg ]]; then  # a machine whose package lists were never fetched
    log "apt-get update (package lists)"
    apt-get update -qq >/dev/null 2>&1 || true
    kpkg=$(resolve_kernel)
fi
[[ -n $kpkg ]] || die "cannot resolve linux-image-amd64 (no Debian package lists, even after apt-get update)"
kver=${kpkg#linux-image-}
for p in "$kpkg" busybox; do
    if ! compgen -G "$cache/debs/${p}_*.deb" >/dev/null; then
        log "downloading $p"
        (cd "$cache/debs" && apt-get -qq -o APT::Sandbox::User=root download "$p")
    fi
done
deb_of() { find "$cache/debs" -name "${1}_*.deb" | sort -V | tail -n1; }
if [[ ! -f $cache/kernel/boot/vmlinuz-$kver ]]; then
    rm -rf "$cache/kernel"
    dpkg-deb -x "$(deb_of "$kpkg")" "$cache/kernel"
fi
rm -rf "$cache/busybox"
dpkg-deb -x "$(deb_of busybox)" "$cache/busybox"
log "kernel $kver ($(basename "$(deb_of "$kpkg")"))"

# ------------------------------------------------------------------ the image
root="$cache/rootfs"
rm -rf "$root"
mkdir -p "$root"/{usr/bin,usr/lib/x86_64-linux-gnu/libibverbs,usr/lib64,etc/libibverbs.d}
mkdir -p "$root"/{proc,sys,dev,run,tmp,root,opt/uroce/tools,opt/uroce/provider}
ln -s usr/bin "$root/bin"
ln -s usr/bin "$root/sbin"
ln -s usr/lib "$root/lib"
ln -s usr/lib64 "$root/lib64"

# busybox first, so that the real programs copied after it replace its applets.
cp "$cache/busybox/bin/busybox" "$root/usr/bin/busybox"
for applet in $("$root/usr/bin/busybox" --list); do ln -sf busybox "$root/usr/bin/$applet"; done
for prog in ibv_devices ibv_devinfo ibv_rc_pingpong rdma; do
    rm -f "$root/usr/bin/$prog"
    cp -L "$(command -v "$prog")" "$root/usr/bin/$prog"
done
# The rxe provider, so that libibverbs can list the kernel's rxe device.
cp -L /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so "$root/usr/lib/x86_64-linux-gnu/libibverbs/"
cp /etc/libibverbs.d/rxe.driver "$root/etc/libibverbs.d/"
# uroce in its build-tree layout: tools/uroce finds ../provider and its preload library.
cp "$build/tools/uroce" "$build/tools/liburoce-no-rdma-netlink.so" "$root/opt/uroce/tools/"
cp "$build/provider/liburoce-rdmav34.so" "$root/opt/uroce/provider/"

# Every shared library those programs need, and the dynamic loader.
elves=("$root"/usr/bin/busybox "$root"/usr/bin/ibv_* "$root"/usr/bin/rdma "$root"/opt/uroce/*/*
    "$root"/usr/lib/x86_64-linux-gnu/libibverbs/*.so)
for elf in "${elves[@]}"; do
    ldd "$elf" | awk '/=> \// { print $3 }'
done | sort -u | while read -r lib; do cp -L "$lib" "$root/usr/lib/x86_64-linux-gnu/"; done
# glibc dlopen()s libgcc_s for thread cancellation; ldd does not show it.
cp -L /lib/x86_64-linux-gnu/libgcc_s.so.1 "$root/usr/lib/x86_64-linux-gnu/"
cp -L /lib64/ld-linux-x86-64.so.2 "$root/usr/lib64/"
echo /usr/lib/x86_64-linux-gnu >"$root/etc/ld.so.conf"
ldconfig -r "$root" 2>/dev/null || true
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"

# Kernel modules: rdma_rxe (which pulls ib_core and ib_uverbs), dummy, and what they need,
# uncompressed; depmod writes modules.dep, where `uroce` looks for ib_core.
moddir="$cache/kernel/lib/modules/$kver"
declare -A module_file=() module_done=()
while IFS= read -r -d '' f; do
    n=$(basename "$f")
    n=${n%%.ko*}
    module_file[${n//-/_}]=$f
done < <(find "$moddir/kernel" -name '*.ko*' -print0)
copy_module() {
    local name=${1//-/_} f rel dep
    [[ -n ${module_done[$name]:-} ]] && return 0
    module_done[$name]=1
    f=${module_file[$name]:-}
    if [[ -z $f ]]; then
        grep -q "/$name\.ko" "$moddir/modules.builtin" || die "module $name not found"
        return 0
    fi
    for dep in $(modinfo -F depends "$f" | tr ',' ' '); do copy_module "$dep"; done
    rel=${f#"$moddir"/}
    mkdir -p "$root/lib/modules/$kver/$(dirname "$rel")"
    case $f in
        *.ko.xz) xz -dc "$f" >"$root/lib/modules/$kver/${rel%.xz}" ;;
        *.ko.zst) zstd -qdc "$f" >"$root/lib/modules/$kver/${rel%.zst}" ;;
        *) cp "$f" "$root/lib/modules/$kver/$rel" ;;
    esac
}
# rxe asks the crypto API for "crc32" when a device is made.
for m in rdma_rxe ib_uverbs dummy crc32_generic; do copy_module "$m"; done
cp "$moddir"/modules.builtin* "$moddir/modules.order" "$root/lib/modules/$kver/"
depmod -b "$root" "$kver"

install -m 0755 /dev/stdin "$root/init" <<'GUEST'
#!/bin/sh
# The guest's /init: the checks, one "ok - " or "not ok - " line each on the console.
export PATH=/usr/bin UROCE_ROOT=/run/uroce
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
echo /usr/bin/modprobe >/proc/sys/kernel/modprobe
exec >/dev/console 2>&1
dmesg -n 1
ip link set lo up
UROCE=/opt/uroce/tools/uroce
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok - $1"; }
not_ok() { failed=$((failed + 1)); echo "not ok - $1"; shift; for l in "$@"; do echo "    $l"; done; }
# expect DESCRIPTION ERE FILE: a line of FILE matches
expect() { if grep -Eq "$2" "$3"; then ok "$1"; else not_ok "$1" "$(head -c 1500 "$3")"; fi; }
# expect_no DESCRIPTION ERE FILE: no line of FILE matches
expect_no() { if grep -Eq "$2" "$3"; then not_ok "$1" "$(head -c 1500 "$3")"; else ok "$1"; fi; }

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
    i=0
    while [ $i -lt 300 ] && ! netstat -ltn 2>/dev/null | grep -q ":$4 "; do sleep 0.1; i=$((i + 1)); done
    timeout 120 $2 ibv_rc_pingpong -d u1 -g 0 -p "$4" -n 200 127.0.0.1 >/tmp/cli 2>&1
    crc=$?
    i=0
    while [ $i -lt 300 ] && kill -0 $spid 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
    kill -9 $spid 2>/dev/null
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

echo "STOCK-KERNEL-TEST: $passed passed, $failed failed"
poweroff -f
GUEST

(cd "$root" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0) |
    gzip -1 >"$cache/initramfs.cpio.gz"
log "image built in $(($(date +%s) - start)) s ($(du -h "$cache/initramfs.cpio.gz" | cut -f1))"

# ------------------------------------------------------------------ the guest
boot=$(date +%s)
out="$cache/console.log"
set +e
timeout -k 10 "$limit" qemu-system-x86_64 -accel "$accel" -m 1024 -smp 2 -nographic \
    -no-reboot -nic none -kernel "$cache/kernel/boot/vmlinuz-$kver" \
    -initrd "$cache/initramfs.cpio.gz" -append "console=ttyS0 quiet panic=-1" </dev/null |
    tr -d '\r' | tee "$out" | grep -E '^(ok|not ok|    |#)'
set -e
log "guest ran $(($(date +%s) - boot)) s, whole test $(($(date +%s) - start)) s (console: $out)"
summary=$(grep -E '^STOCK-KERNEL-TEST: ' "$out" | tail -n1)
if [[ -z $summary ]]; then
    echo "0 passed, 1 failed (the guest did not finish; see $out)"
    exit 1
fi
echo "${summary#STOCK-KERNEL-TEST: }"
[[ $summary == *" 0 failed" ]]
