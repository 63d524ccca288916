#!/usr/bin/env bash
# `meson install` installs uroce like a libibverbs provider, and libibverbs loads it from
# there by its .driver file, without RDMAV_DRIVERS.
#
#   test_install.sh BUILD_ROOT
#
# Installs into a temporary DESTDIR, then, in a private mount namespace (unshare -m; the
# host's /etc and /usr are never written), bind-mounts the DESTDIR's provider directory
# and libibverbs.d over the system ones and runs the system's ibv_devices, ibv_devinfo and
# ibv_rc_pingpong with SYSFS_PATH alone (this kernel has no RDMA netlink; the host's
# /sys/class cannot hold the registry: docs/configuration.md#installing). Needs root.
# shellcheck shell=bash
set -u

if [[ $# -ne 1 ]]; then
    echo "usage: $0 BUILD_ROOT" >&2
    exit 2
fi
BUILD=$(readlink -f "$1")
source "$(dirname "$0")/lib.sh"
lib_init "$BUILD/tools/uroce"

require_root "install test" "unshare -m, bind mounts and /dev/infiniband nodes"
for tool in unshare ibv_devices ibv_devinfo ibv_rc_pingpong; do
    if ! command -v "$tool" >/dev/null; then
        skip "install test: $tool is not installed"
        finish
    fi
done
if ! timeout 10 unshare -m --propagation private true 2>/dev/null; then
    skip "install test: unshare -m fails here (no CAP_SYS_ADMIN in this container?)"
    finish
fi

# ------------------------------------------------------------- meson install
DEST=$WORK/dest
if ! out=$(timeout 300 meson install -C "$BUILD" --no-rebuild --destdir "$DEST" 2>&1); then
    not_ok "meson install --destdir runs" "$out"
    finish
fi
ok "meson install --destdir runs"

# Where the build put the provider and the .driver file (the Meson options), as installed.
INSTALLED=$(meson introspect "$BUILD" --installed)
dest_of() { # dest_of SOURCE_SUFFIX: the install path of the build output ending in it
    python3 -c 'import json,sys
for src, dst in json.load(sys.stdin).items():
    if src.endswith(sys.argv[1]): print(dst)' "$1" <<<"$INSTALLED"
}
PROVIDER=$(dest_of /liburoce-rdmav34.so)
DRIVER=$(dest_of /uroce.driver)
UROCE_BIN=$(dest_of /tools/uroce)
SYS_PROVIDER_DIR=$(pkg-config --variable=libdir libibverbs)/libibverbs
expect_eq "the provider goes to libibverbs' provider directory" \
    "$SYS_PROVIDER_DIR/liburoce-rdmav34.so" "$PROVIDER"
expect_eq "uroce.driver goes to /etc/libibverbs.d" "/etc/libibverbs.d/uroce.driver" "$DRIVER"
expect_eq "uroce.driver says 'driver uroce'" "driver uroce" "$(cat "$DEST$DRIVER" 2>&1)"
check "the installed provider is a regular file" test -f "$DEST$PROVIDER"

# libibverbs has the directory and the name pattern compiled in: check both.
LIBIBVERBS=$(ldconfig -p | awk '/libibverbs\.so\.1 .*x86-64/ {print $NF; exit}')
if grep -aq "$SYS_PROVIDER_DIR/lib%s-rdmav34.so" "$(readlink -f "$LIBIBVERBS")"; then
    ok "libibverbs looks for providers in $SYS_PROVIDER_DIR/lib<name>-rdmav34.so"
else
    not_ok "libibverbs looks for providers in $SYS_PROVIDER_DIR/lib<name>-rdmav34.so" \
        "not found in $LIBIBVERBS"
fi

# The installed uroce finds the installed provider (relative to itself, as in DESTDIR).
env_out=$(env -u UROCE_PROVIDER_DIR "$DEST$UROCE_BIN" env 2>/dev/null)
expect_match "the installed uroce finds the installed provider" \
    "^export RDMAV_DRIVERS='$DEST$SYS_PROVIDER_DIR/liburoce'\$" "$env_out"

# ------------------------------------------------------------------ devices
OCT=$(pick_octet 171) || echo "# warning: every 127.0.171..190.* block has UDP sockets; using 127.0.$OCT"
D0="ins$$a"
D1="ins$$b"
add_device "$D0" "127.0.$OCT.1" || finish
add_device "$D1" "127.0.$OCT.2" || finish
GUID0=$("$UROCE" list | awk -v n="$D0" '$1 == n {print $6}')

# in_ns SCRIPT: runs SCRIPT (bash) in a private mount namespace where the DESTDIR's provider
# directory and libibverbs.d are bind-mounted over the system's, with SYSFS_PATH set and
# nothing else of uroce's in the environment.
# A sanitizer build's provider needs the ASan runtime preloaded into the plain programs: the
# only preload the namespace gets.
ASAN_RT=$(ldd "$DEST$PROVIDER" 2>/dev/null | awk '/libasan/ { print $3 }')
NS_ENV=()
if [[ -n $ASAN_RT ]]; then
    echo "# sanitizer build: LD_PRELOAD=$ASAN_RT for the libibverbs programs"
    NS_ENV=(LD_PRELOAD="$ASAN_RT"
        ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0:detect_leaks=0")
fi
in_ns() {
    timeout -k 5 60 unshare -m --propagation private env -u RDMAV_DRIVERS -u LD_PRELOAD \
        -u UROCE_PROVIDER_DIR "${NS_ENV[@]}" SYSFS_PATH="$UROCE_ROOT/sys" \
        NS_PROVIDER_DIR="$SYS_PROVIDER_DIR" NS_DEST="$DEST" bash -c '
        set -e
        mount --bind "$NS_DEST$NS_PROVIDER_DIR" "$NS_PROVIDER_DIR"
        mount --bind "$NS_DEST/etc/libibverbs.d" /etc/libibverbs.d
        set +e
        '"$1"
}

out=$(in_ns 'ls /etc/libibverbs.d; ls "$NS_PROVIDER_DIR"; ibv_devices' 2>&1)
if grep -qx 'uroce.driver' <<<"$out" && ! grep -q 'rxe.driver' <<<"$out"; then
    ok "the namespace sees only the installed libibverbs.d"
else
    not_ok "the namespace sees only the installed libibverbs.d" "$out"
fi
expect_match "ibv_devices lists $D0 with its GUID through the installed provider" \
    "^[[:space:]]+$D0[[:space:]]+${GUID0//:/}\$" "$out"
expect_match "ibv_devices lists $D1 through the installed provider" "^[[:space:]]+$D1[[:space:]]" "$out"

out=$(in_ns "ibv_devinfo -d $D0" 2>&1)
expect_match "ibv_devinfo opens $D0 (board_id uroce, port active)" "board_id:[[:space:]]+uroce" "$out"
expect_match "ibv_devinfo shows $D0's node GUID" "node_guid:[[:space:]]+$GUID0" "$out"
expect_match "ibv_devinfo shows port 1 active" "state:[[:space:]]+PORT_ACTIVE" "$out"

# Without the installed .driver file the same command finds no provider for the devices.
out=$(in_ns 'mount -t tmpfs tmpfs /etc/libibverbs.d; ibv_devices' 2>&1)
if grep -q "$D0" <<<"$out"; then
    not_ok "without uroce.driver libibverbs does not list $D0 (the .driver file is what loads it)" "$out"
else
    ok "without uroce.driver libibverbs does not list $D0 (the .driver file is what loads it)"
fi

# ibv_rc_pingpong between the two devices, server and client each in such a namespace.
PORT=$(free_tcp_port)
in_ns "exec ibv_rc_pingpong -d $D0 -g 0 -p $PORT -n 100" >"$WORK/server.out" 2>&1 &
SERVER=$!
BG_PIDS+=("$SERVER")
if wait_listen "$PORT" 20; then
    in_ns "exec ibv_rc_pingpong -d $D1 -g 0 -p $PORT -n 100 127.0.0.1" >"$WORK/client.out" 2>&1
    CLIENT_RC=$?
else
    CLIENT_RC=255
    echo "server never listened" >"$WORK/client.out"
fi
wait "$SERVER"
SERVER_RC=$?
forget_pid "$SERVER"
if [[ $CLIENT_RC -eq 0 && $SERVER_RC -eq 0 ]] &&
    grep -q '100 iters' "$WORK/client.out" && grep -q '100 iters' "$WORK/server.out"; then
    ok "ibv_rc_pingpong runs between $D0 and $D1 through the installed provider"
else
    not_ok "ibv_rc_pingpong runs between $D0 and $D1 through the installed provider" \
        "server (rc $SERVER_RC): $(tail -n 5 "$WORK/server.out")" \
        "client (rc $CLIENT_RC): $(tail -n 5 "$WORK/client.out")"
fi

finish
