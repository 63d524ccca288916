# shellcheck shell=bash disable=SC2154  # build, cache, test_name: set by the caller
# A QEMU guest on Debian 12's stock kernel, for checks that need a kernel with RDMA: sourced by
# tools/stock-kernel-test.sh and tools/rxe-interop-test.sh (bash, `set -euo pipefail`).
#
# The kernel (linux-image-amd64's, with ib_core, rdma_rxe and rdma_ucm as modules) and busybox
# come from Debian packages (apt-get download, cached); the programs and their libraries are
# this host's Debian 12 userland; uroce is copied from its build directory in its build-tree
# layout. The guest runs one /init script written by the caller, which reports "ok - " and
# "not ok - " lines on the console (the helpers of guest_checks_prelude) and a summary line.
#
# The caller sets `build` (uroce's build directory), `cache` (a directory of its own) and
# `test_name`, then calls, in order (the Debian packages are kept in $GUEST_DEBS,
# default BUILD_DIR/guest-debs, shared by both tests):
#   guest_host_tools                  missing host tools installed (root)
#   guest_kernel                      kernel and busybox unpacked; sets kver and moddir
#   guest_rootfs PROGRAM...           a fresh tree in $root: busybox, PROGRAMs (names on PATH
#                                     or paths), the rxe provider, uroce, their libraries
#   guest_modules MODULE...           the modules and what they depend on, and depmod
#   guest_boot_and_exit INIT_SCRIPT LIMIT
#                                     the image packed and booted; ok/not ok lines printed;
#                                     exits, 0 when the summary says 0 failed (`start`: the
#                                     caller's start time, for the last line)
# QEMU runs with TCG unless GUEST_ACCEL=kvm.

guest_log() { echo "# $test_name: $*"; }
guest_die() {
    echo "$test_name: $*" >&2
    exit 1
}

guest_host_tools() {
    [[ $(id -u) -eq 0 ]] || guest_die "run as root (apt-get download, device nodes in the guest image)"
    local -A tool_pkg=([qemu-system-x86_64]=qemu-system-x86 [cpio]=cpio [depmod]=kmod
        [modinfo]=kmod [dpkg-deb]=dpkg [xz]=xz-utils [zstd]=zstd [ibv_rc_pingpong]=ibverbs-utils
        [rdma]=iproute2 [ip]=iproute2)
    local missing=() t
    for t in "${!tool_pkg[@]}"; do command -v "$t" >/dev/null || missing+=("${tool_pkg[$t]}"); done
    if ((${#missing[@]})); then
        guest_log "installing ${missing[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "${missing[@]}" >/dev/null
    fi
    [[ -f /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so ]] ||
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ibverbs-providers >/dev/null
}

guest_resolve_kernel() {
    apt-cache depends linux-image-amd64 2>/dev/null |
        awk '/Depends: linux-image-[0-9]/ { print $2; exit }'
}

debs=${GUEST_DEBS:-$build/guest-debs}

guest_deb_of() { find "$debs" -name "${1}_*.deb" | sort -V | tail -n1; }

guest_kernel() {
    mkdir -p "$debs" "$cache"
    local kpkg p
    kpkg=$(guest_resolve_kernel)
    if [[ -z $kpkg ]]; then  # a machine whose package lists were never fetched
        guest_log "apt-get update (package lists)"
        apt-get update -qq >/dev/null 2>&1 || true
        kpkg=$(guest_resolve_kernel)
    fi
    [[ -n $kpkg ]] || guest_die "cannot resolve linux-image-amd64 (no Debian package lists, even after apt-get update)"
    kver=${kpkg#linux-image-}
    for p in "$kpkg" busybox; do
        if ! compgen -G "$debs/${p}_*.deb" >/dev/null; then
            guest_log "downloading $p"
            (cd "$debs" && apt-get -qq -o APT::Sandbox::User=root download "$p")
        fi
    done
    if [[ ! -f $cache/kernel/boot/vmlinuz-$kver ]]; then
        rm -rf "$cache/kernel"
        dpkg-deb -x "$(guest_deb_of "$kpkg")" "$cache/kernel"
    fi
    rm -rf "$cache/busybox"
    dpkg-deb -x "$(guest_deb_of busybox)" "$cache/busybox"
    moddir="$cache/kernel/lib/modules/$kver"
    guest_log "kernel $kver ($(basename "$(guest_deb_of "$kpkg")"))"
}

guest_rootfs() {
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
    local applet prog path elf lib
    for applet in $("$root/usr/bin/busybox" --list); do ln -sf busybox "$root/usr/bin/$applet"; done
    for prog in "$@"; do
        path=$prog
        [[ $prog == */* ]] || path=$(command -v "$prog") || guest_die "$prog not found"
        rm -f "$root/usr/bin/$(basename "$prog")"
        cp -L "$path" "$root/usr/bin/"
    done
    # The rxe provider, so that libibverbs can use the kernel's rxe devices.
    cp -L /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so "$root/usr/lib/x86_64-linux-gnu/libibverbs/"
    cp /etc/libibverbs.d/rxe.driver "$root/etc/libibverbs.d/"
    # uroce in its build-tree layout: tools/uroce finds ../provider and its preload library.
    cp "$build/tools/uroce" "$build/tools/liburoce-no-rdma-netlink.so" "$root/opt/uroce/tools/"
    cp "$build/provider/liburoce-rdmav34.so" "$root/opt/uroce/provider/"

    # Every shared library those programs need, and the dynamic loader.
    for elf in "$root"/usr/bin/* "$root"/opt/uroce/*/* "$root"/usr/lib/x86_64-linux-gnu/libibverbs/*.so; do
        [[ -L $elf ]] && continue
        ldd "$elf" 2>/dev/null | awk '/=> \// { print $3 }' || true
    done | sort -u | while read -r lib; do cp -L "$lib" "$root/usr/lib/x86_64-linux-gnu/"; done
    # glibc dlopen()s libgcc_s for thread cancellation; ldd does not show it.
    cp -L /lib/x86_64-linux-gnu/libgcc_s.so.1 "$root/usr/lib/x86_64-linux-gnu/"
    cp -L /lib64/ld-linux-x86-64.so.2 "$root/usr/lib64/"
    echo /usr/lib/x86_64-linux-gnu >"$root/etc/ld.so.conf"
    ldconfig -r "$root" 2>/dev/null || true
    printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
    printf 'root:x:0:\n' >"$root/etc/group"
    guest_checks_prelude >"$root/etc/checks.sh"
}

# Kernel modules, uncompressed, with what they depend on; depmod writes modules.dep, where
# `uroce` looks for ib_core.
guest_modules() {
    local -A module_file=()
    local -A module_done=()
    local f n
    while IFS= read -r -d '' f; do
        n=$(basename "$f")
        n=${n%%.ko*}
        module_file[${n//-/_}]=$f
    done < <(find "$moddir/kernel" -name '*.ko*' -print0)
    guest_copy_module() {
        local name=${1//-/_} f rel dep
        [[ -n ${module_done[$name]:-} ]] && return 0
        module_done[$name]=1
        f=${module_file[$name]:-}
        if [[ -z $f ]]; then
            grep -q "/$name\.ko" "$moddir/modules.builtin" || guest_die "module $name not found"
            return 0
        fi
        for dep in $(modinfo -F depends "$f" | tr ',' ' '); do guest_copy_module "$dep"; done
        rel=${f#"$moddir"/}
        mkdir -p "$root/lib/modules/$kver/$(dirname "$rel")"
        case $f in
            *.ko.xz) xz -dc "$f" >"$root/lib/modules/$kver/${rel%.xz}" ;;
            *.ko.zst) zstd -qdc "$f" >"$root/lib/modules/$kver/${rel%.zst}" ;;
            *) cp "$f" "$root/lib/modules/$kver/$rel" ;;
        esac
    }
    local m
    for m in "$@"; do guest_copy_module "$m"; done
    cp "$moddir"/modules.builtin* "$moddir/modules.order" "$root/lib/modules/$kver/"
    depmod -b "$root" "$kver"
}

# What every guest /init starts with (sourced as /etc/checks.sh): the mounts, and the helpers
# that report checks.
guest_checks_prelude() {
    cat <<'PRELUDE'
export PATH=/usr/bin
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
# wait_listen PORT [PREFIX...]: until something listens on TCP PORT (30 s at most); PREFIX
# runs netstat elsewhere (ip netns exec NAME)
wait_listen() {
    port=$1
    shift
    i=0
    while [ $i -lt 300 ] && ! "$@" netstat -ltn 2>/dev/null | grep -q ":$port "; do
        sleep 0.1
        i=$((i + 1))
    done
}
# wait_gone PID SECONDS: until PID has exited, or SECONDS passed; then kill it
wait_gone() {
    i=0
    while [ $i -lt $(($2 * 10)) ] && kill -0 "$1" 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
    kill -9 "$1" 2>/dev/null
}
# summary: the line the host reads, then power off
summary() {
    echo "GUEST-SUMMARY: $passed passed, $failed failed"
    poweroff -f
}
PRELUDE
}

guest_boot() {
    local init=$1 limit=$2 out boot summary
    install -m 0755 "$init" "$root/init"
    (cd "$root" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0) |
        gzip -1 >"$cache/initramfs.cpio.gz"
    guest_log "image built ($(du -h "$cache/initramfs.cpio.gz" | cut -f1))"
    boot=$(date +%s)
    out="$cache/console.log"
    set +e
    timeout -k 10 "$limit" qemu-system-x86_64 -accel "${GUEST_ACCEL:-tcg}" -m 1024 -smp 2 \
        -nographic -no-reboot -nic none -kernel "$cache/kernel/boot/vmlinuz-$kver" \
        -initrd "$cache/initramfs.cpio.gz" -append "console=ttyS0 quiet panic=-1" </dev/null |
        tr -d '\r' | tee "$out" | grep -E '^(ok|not ok|    |#)'
    set -e
    guest_log "guest ran $(($(date +%s) - boot)) s (console: $out)"
    summary=$(grep -E '^GUEST-SUMMARY: ' "$out" | tail -n1)
    if [[ -z $summary ]]; then
        echo "0 passed, 1 failed (the guest did not finish; see $out)"
        return 1
    fi
    echo "${summary#GUEST-SUMMARY: }"
    [[ $summary == *" 0 failed" ]]
}

guest_boot_and_exit() {
    local status=0
    guest_boot "$1" "$2" || status=1
    guest_log "whole test $(($(date +%s) - start)) s"
    exit $status
}
