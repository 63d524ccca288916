#!/usr/bin/env bash
# uroce on kernels with RDMA support: RDMA netlink is refused to programs that use
# uroce devices, so libibverbs reads the registry (docs/architecture.md, "How
# libibverbs finds the provider without a kernel").
#
#   test_rdma_netlink.sh PATH_TO_UROCE PATH_TO_PROBE
#
# PATH_TO_PROBE is rdma_netlink_probe.py. Its SOCK_STREAM probe tells uroce's
# refusal (EPROTONOSUPPORT for NETLINK_RDMA of any type) from the kernel's
# (ESOCKTNOSUPPORT, since the kernel checks a netlink socket's type first), so
# the checks hold on any kernel, this machine's (no RDMA) included:
#   - `uroce run`: the seccomp filter refuses NETLINK_RDMA, raw syscalls too, and
#     in children; NETLINK_ROUTE, NETLINK_GENERIC, UDP and AF_UNIX still work;
#   - `eval "$(uroce env)"`: the LD_PRELOAD library refuses it through libc;
#   - as root: ibv_devices lists a uroce device both ways, libibverbs' own
#     NETLINK_RDMA socket call is refused (strace), and `uroce add/list/env`
#     warn when ib_core is loaded (a tmpfs over /sys/module in a private mount
#     namespace) and stay quiet on a host without it.
# Last line: "N passed, M failed".
set -u
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
if [[ $# -ne 2 ]]; then
    echo "usage: $0 PATH_TO_UROCE PATH_TO_PROBE" >&2
    exit 2
fi
PROBE=$(readlink -f "$2")
lib_init "$1"
unset LD_PRELOAD SYSFS_PATH RDMAV_DRIVERS

PY=$(command -v python3) || {
    skip "all checks: python3 not found"
    finish
}

# probe_value OUTPUT KEY
probe_value() {
    awk -F= -v k="$2" '$1 == k { print $2 }' <<<"$1"
}

# expect_probe LABEL OUTPUT KEY WANT
expect_probe() {
    expect_eq "$1: $3 = $4" "$4" "$(probe_value "$2" "$3")"
}

# The probe's socket checks that must pass wherever it runs.
expect_other_sockets_work() {
    local label=$1 out=$2 key
    for key in route_dump generic_bind udp_echo unix_pair; do
        expect_probe "$label" "$out" "$key" ok
    done
}

# ------------------------------------------------------------ without uroce
plain=$("$PY" "$PROBE" 2>&1)
echo "# plain probe: $(tr '\n' ' ' <<<"$plain")"
# The control: the kernel's own answer differs from uroce's refusal.
expect_probe "plain (kernel answers)" "$plain" rdma_stream ESOCKTNOSUPPORT
expect_probe "plain (kernel answers)" "$plain" syscall_rdma_stream ESOCKTNOSUPPORT
expect_probe "plain" "$plain" no_new_privs 0
expect_other_sockets_work "plain" "$plain"

# ---------------------------------------------------------------- uroce run
run_out=$("$UROCE" run -- "$PY" "$PROBE" 2>"$WORK/run.err")
run_rc=$?
expect_eq "uroce run -- probe exits 0" 0 "$run_rc"
for key in rdma_raw rdma_dgram rdma_stream syscall_rdma_stream syscall_rdma_stream_high; do
    expect_probe "uroce run" "$run_out" "$key" EPROTONOSUPPORT
done
expect_other_sockets_work "uroce run" "$run_out"
expect_probe "uroce run" "$run_out" no_new_privs 1
expect_probe "uroce run" "$run_out" seccomp 2
expect_eq "uroce run: no warning about the filter" "" \
    "$(grep -v 'no devices are registered' "$WORK/run.err")"

# shellcheck disable=SC2016
child_out=$("$UROCE" run -- sh -c '"$0" "$1"' "$PY" "$PROBE" 2>/dev/null)
expect_probe "child of uroce run" "$child_out" rdma_stream EPROTONOSUPPORT
expect_probe "child of uroce run" "$child_out" route_dump ok

# ---------------------------------------------------------------- uroce env
env_out=$("$UROCE" env 2>/dev/null)
preload=$(sed -n "s/^export LD_PRELOAD='\(.*\)'$/\1/p" <<<"$env_out")
expect_match "uroce env prints an LD_PRELOAD line" "^export LD_PRELOAD='/[^' :]*/liburoce-no-rdma-netlink\.so'$" "$env_out"
check "the LD_PRELOAD library exists" test -f "$preload"
# shellcheck disable=SC2016
env_probe=$(bash -c 'eval "$("$0" env 2>/dev/null)" && exec "$1" "$2"' "$UROCE" "$PY" "$PROBE" 2>&1)
for key in rdma_raw rdma_dgram rdma_stream; do
    expect_probe "uroce env + LD_PRELOAD" "$env_probe" "$key" EPROTONOSUPPORT
done
# What the preload cannot see (a raw syscall) reaches the kernel: documented limit.
expect_probe "uroce env + LD_PRELOAD (raw syscall passes)" "$env_probe" syscall_rdma_stream ESOCKTNOSUPPORT
expect_other_sockets_work "uroce env + LD_PRELOAD" "$env_probe"
# An inherited LD_PRELOAD is kept, and evaluating twice does not repeat the library.
# (ld.so complains on stderr about the missing library; only the variable matters.)
# shellcheck disable=SC2016
twice=$(bash -c 'export LD_PRELOAD="$1"; eval "$("$0" env 2>/dev/null)"; eval "$("$0" env 2>/dev/null)"; printf "%s" "$LD_PRELOAD"' \
    "$UROCE" "/nonexistent/a.so:/nonexistent/b.so" 2>/dev/null)
expect_eq "uroce env twice: LD_PRELOAD keeps what it had and holds the library once" \
    "$preload /nonexistent/a.so /nonexistent/b.so" "$twice"

# ------------------------------------------- warnings about kernel RDMA
host_rdma=""
if [[ -e /sys/module/ib_core ]]; then
    host_rdma=loaded
else
    for d in /lib/modules /usr/lib/modules; do
        if grep -qsE '(^|/)ib_core\.ko' "$d/$(uname -r)/modules.builtin" "$d/$(uname -r)/modules.dep"; then
            host_rdma=module
        fi
    done
fi
list_err=$("$UROCE" list 2>&1 >/dev/null)
if [[ -z $host_rdma ]]; then
    expect_eq "uroce list on a host without ib_core: no warning" "" "$list_err"
    expect_eq "uroce env on a host without ib_core: no kernel warning" "" \
        "$("$UROCE" env 2>&1 >/dev/null | grep 'RDMA support')"
else
    expect_match "uroce list on a host with ib_core ($host_rdma): warns" "RDMA support" "$list_err"
fi

if [[ $EUID -ne 0 ]]; then
    skip "ibv_devices through uroce run and uroce env, kernel-RDMA warnings with a simulated ib_core: need root"
    finish
fi

# A tmpfs over /sys/module with an ib_core entry, in a private mount namespace.
# shellcheck disable=SC2016
in_fake_ib_core() {
    unshare -m --propagation private sh -c \
        'mount -t tmpfs uroce-test /sys/module && mkdir /sys/module/ib_core && exec "$@"' sh "$@"
}
if ! in_fake_ib_core true 2>"$WORK/unshare.err"; then
    skip "kernel-RDMA warnings with a simulated ib_core: cannot mount over /sys/module ($(head -n1 "$WORK/unshare.err"))"
else
    octet=$(pick_octet 231)
    dev="nl$$"
    for cmd in list env add; do
        args=("$cmd")
        [[ $cmd == add ]] && args+=("$dev" --ip "127.0.$octet.9")
        in_fake_ib_core "$UROCE" "${args[@]}" >/dev/null 2>"$WORK/warn.err"
        [[ $cmd == add ]] && DEVICES+=("$dev")
        warn=$(grep "RDMA support" "$WORK/warn.err")
        expect_eq "uroce $cmd with ib_core loaded: one warning line" 1 "$(grep -c . <<<"$warn")"
        expect_match "uroce $cmd with ib_core loaded: says so" \
            "^uroce $cmd: warning: this kernel has RDMA support \(ib_core is loaded\)" "$warn"
        expect_match "uroce $cmd with ib_core loaded: says what to do" \
            "'uroce run' does that for its command.*LD_PRELOAD line 'uroce env' prints" "$warn"
    done
    "$UROCE" del "$dev" >/dev/null 2>&1
fi

# ------------------------------------------- the real path: libibverbs
if ! command -v ibv_devices >/dev/null; then
    skip "ibv_devices through uroce run and uroce env: ibv_devices not installed"
    finish
fi
# A sanitizer build's provider needs the ASan runtime preloaded into ibv_devices (the
# LD_PRELOAD of `uroce env` puts its library before it, hence the link-order option).
asan_rt=$(ldd "$(dirname "$UROCE")/../provider/liburoce-rdmav34.so" 2>/dev/null | awk '/libasan/ { print $3 }')
if [[ -n $asan_rt ]]; then
    echo "# sanitizer build: LD_PRELOAD=$asan_rt for ibv_devices"
    export LD_PRELOAD=$asan_rt
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0:detect_leaks=0"
fi
octet=$(pick_octet 232)
name="nlv$$"
if add_device "$name" "127.0.$octet.1"; then
    out=$(timeout 30 "$UROCE" run -- ibv_devices 2>&1)
    expect_match "uroce run -- ibv_devices lists $name" "^[[:space:]]*${name}[[:space:]]" "$out"
    # shellcheck disable=SC2016
    out=$(timeout 30 bash -c 'eval "$("$0" env 2>/dev/null)" && exec ibv_devices' "$UROCE" 2>&1)
    expect_match "ibv_devices after eval \"\$(uroce env)\" lists $name" "^[[:space:]]*${name}[[:space:]]" "$out"
    if command -v strace >/dev/null; then
        # libibverbs asks netlink first (through libnl's socket()); the filter refuses
        # it, and libibverbs reads the registry (the openat of its infiniband_verbs class).
        verbs_dir="$UROCE_ROOT/sys/class/infiniband_verbs"
        timeout 30 "$UROCE" run -- strace -f -qq -e trace=socket,openat -o "$WORK/run.strace" \
            ibv_devices >/dev/null 2>&1
        expect_file_match "uroce run: libibverbs' NETLINK_RDMA socket is refused" \
            'socket\(AF_NETLINK, [^,]*, NETLINK_RDMA\) += -1 EPROTONOSUPPORT' "$WORK/run.strace"
        expect_file_match "uroce run: libibverbs then reads the registry" \
            "openat\(.*\"$verbs_dir\"" "$WORK/run.strace"
        # With the preload the call never reaches the kernel, and the registry is read.
        # shellcheck disable=SC2016
        timeout 30 bash -c 'eval "$("$0" env 2>/dev/null)" && exec strace -f -qq -e trace=socket,openat -o "$1" ibv_devices' \
            "$UROCE" "$WORK/env.strace" >/dev/null 2>&1
        expect_file_match "uroce env + LD_PRELOAD: libibverbs reads the registry" \
            "openat\(.*\"$verbs_dir\"" "$WORK/env.strace"
        if ! grep -q NETLINK_RDMA "$WORK/env.strace"; then
            ok "uroce env + LD_PRELOAD: libibverbs' NETLINK_RDMA socket never reaches the kernel"
        else
            not_ok "uroce env + LD_PRELOAD: libibverbs' NETLINK_RDMA socket never reaches the kernel" \
                "$(grep NETLINK_RDMA "$WORK/env.strace")"
        fi
    else
        skip "libibverbs' own NETLINK_RDMA call (strace): strace not installed"
    fi
fi
finish
