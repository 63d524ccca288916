#!/usr/bin/env bash
# uroce without root: an unprivileged user makes a registry of their own, adds devices and
# runs real traffic on them, `uroce run` giving each command the /dev/infiniband nodes in a
# private user and mount namespace (tools/rootless_namespace.h, tools/private_dev.h).
#
#   test_rootless.sh PATH_TO_UROCE PATH_TO_PINGPONG_VERIFY
#
# The user: uid/gid 65534 (nobody) through setpriv when the test runs as root, else the
# user running it. The build tree may be out of that user's reach (CI clones into a mktemp
# directory of mode 0700), so what it runs is copied into a fresh world-readable directory
# under /tmp first; if even that is out of reach, the test says so in a skip line.
#   1. uroce add, list, env as that user, UROCE_ROOT unset: the registry is
#      $XDG_RUNTIME_DIR/uroce, no node is made on the host, list warns of nothing, env
#      warns that its shell will not see the devices;
#   2. uroce run: ibv_devices lists both devices; the node inside is char 1:3; the command
#      runs as the user, without capabilities, and its /dev/null still works;
#   3. traffic: ibv_rc_pingpong against pingpong_verify (every byte checked), and
#      ibv_rc_pingpong -c on both sides; uroce stats counts it; uroce del;
#   4. (root) a host whose /dev has no infiniband/ (root makes one in a private mount
#      namespace, as on a host without RDMA): uroce run covers /dev with a copy of it plus
#      infiniband/ (/dev/pts, /dev/shm, /dev/stdin and /dev/null still there), ibv_devices
#      and ibv_rc_pingpong work;
#      there also, root's registry in /run/uroce: an unprivileged user's empty registry
#      points at it;
#   5. (root) a host that forbids user namespaces: user.max_user_namespaces=0 in a user
#      namespace root makes for it (mapping uids and gids 0..65535 to themselves): uroce run
#      exits 1 with one error line naming the setting, uroce add registers and warns.
# Last line: "N passed, M failed"; exit 1 if M > 0.
set -u
# shellcheck source=lib.sh
source "$(dirname "$(readlink -f "$0")")/lib.sh"
VERIFY=$(readlink -f "${2:-}")
lib_init "$1"
REAL_UROCE=$UROCE
BUILD=$(dirname "$(dirname "$REAL_UROCE")")

for tool in ibv_devices ibv_rc_pingpong ss timeout unshare; do
    if ! command -v "$tool" >/dev/null; then
        skip "rootless: $tool is not installed"
        finish
    fi
done
if [[ ! -x $VERIFY ]]; then
    not_ok "pingpong_verify is built" "not an executable: ${2:-(none given)}"
    finish
fi

# --------------------------------------------------------------- the user, the copy
USER_ID=$EUID
AS_USER=()
if [[ $EUID -eq 0 ]]; then
    if ! command -v setpriv >/dev/null; then
        skip "rootless: setpriv is not installed (util-linux), so nothing can run as uid 65534"
        finish
    fi
    USER_ID=65534
    AS_USER=(setpriv --reuid=65534 --regid=65534 --clear-groups)
fi
T=$(mktemp -d /tmp/uroce-rootless.XXXXXX)
remove_copy() { rm -rf "$T"; }
CLEANUP_FNS+=(remove_copy)
chmod 0755 "$T"
mkdir -p "$T/tools" "$T/provider" "$T/apps" "$T/xdg" "$T/home"
cp "$REAL_UROCE" "$BUILD/tools/liburoce-no-rdma-netlink.so" "$T/tools/"
cp "$BUILD"/provider/liburoce-rdmav*.so "$T/provider/"
cp "$VERIFY" "$T/apps/"
chmod 0700 "$T/xdg"
[[ $EUID -eq 0 ]] && chown 65534:65534 "$T/xdg" "$T/home"
echo "# the user: uid $USER_ID; what it runs, copied to $T"

# A sanitizer build's provider needs the ASan runtime preloaded into the plain programs.
ASAN_ENV=()
asan_rt=$(ldd "$BUILD/provider/liburoce-rdmav34.so" 2>/dev/null | awk '/libasan/ { print $3 }')
if [[ -n $asan_rt ]]; then
    ASAN_ENV=(LD_PRELOAD="$asan_rt"
        ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0:detect_leaks=0")
fi

# as_user CMD...: CMD as the user, in the copy, with the user's environment: the default
# registry (UROCE_ROOT unset; XDG_RUNTIME_DIR the user's own directory, or USER_XDG).
as_user() {
    cd "$T" && exec env -u UROCE_ROOT -u UROCE_PROVIDER_DIR XDG_RUNTIME_DIR="${USER_XDG:-$T/xdg}" \
        HOME="$T/home" "${ASAN_ENV[@]}" "${AS_USER[@]}" "$@"
}
# lib.sh's run_pair runs "$UROCE" (and stops it by its pid): the copy, as the user, exec'd
# all the way down.
UROCE=$T/uroce-as-user
{
    echo '#!/usr/bin/env bash'
    declare -p T AS_USER ASAN_ENV
    declare -f as_user
    echo 'as_user "$T/tools/uroce" "$@"'
} >"$UROCE"
chmod 0755 "$UROCE"

if ! (as_user test -x "$T/tools/uroce" -a -r "$T/provider/liburoce-rdmav34.so"); then
    skip "rootless: uid $USER_ID cannot reach the copy of the build in $T (a parent directory out of its reach?)"
    finish
fi

# user_uroce ARGS...: uroce as the user; leaves RC, OUT, ERR.
user_uroce() {
    "$UROCE" "$@" >"$WORK/out" 2>"$WORK/err"
    RC=$?
    OUT=$(cat "$WORK/out")
    ERR=$(cat "$WORK/err")
}

OCT=$(pick_octet 121) || echo "# warning: every 127.0.121..140.* block has UDP sockets; using 127.0.$OCT"
A="rl$$a"
B="rl$$b"
IP_A="127.0.$OCT.1"
IP_B="127.0.$OCT.2"
REG=$T/xdg/uroce

# ------------------------------------------------------------ 1. add, list, env
user_uroce add "$A" --ip "$IP_A" --mtu 4096
expect_eq "uroce add $A as uid $USER_ID: exit 0, prints nothing" "0|" "$RC|$OUT$ERR"
user_uroce add "$B" --ip "$IP_B" --mtu 4096
expect_eq "uroce add $B as uid $USER_ID: exit 0, prints nothing" "0|" "$RC|$OUT$ERR"
expect_eq "the registry is \$XDG_RUNTIME_DIR/uroce, the user's" "$USER_ID uverbs_uroce_$A uverbs_uroce_$B" \
    "$(stat -c %u "$REG/sys/class/infiniband/$A") $(cd "$REG/sys/class/infiniband_verbs" && echo uverbs_*)"
if [[ -e /dev/infiniband/uverbs_uroce_$A || -e /dev/infiniband/uverbs_uroce_$B ]]; then
    not_ok "uroce add as uid $USER_ID makes no node on the host" "$(ls -l /dev/infiniband/uverbs_uroce_rl$$*)"
else
    ok "uroce add as uid $USER_ID makes no node on the host"
fi
user_uroce list
expect_eq "uroce list: both devices, no warning" "$A $IP_A|$B $IP_B|" \
    "$(awk '{ printf "%s %s|", $1, $2 }' <<<"$OUT")$ERR"
user_uroce env
expect_eq "uroce env: exit 0, SYSFS_PATH is the user's registry" "0|export SYSFS_PATH='$REG/sys'" \
    "$RC|$(head -n 1 <<<"$OUT")"
expect_eq "uroce env: warns that its shell will not see the devices" \
    "uroce env: warning: devices $A and $B have no /dev/infiniband node (only root can make one), so programs started with these variables will not see them; run them with 'uroce run -- CMD', which gives them the nodes in a private namespace" \
    "$(grep "no /dev/infiniband node" <<<"$ERR")"
# What the warning says: a shell's programs list neither device.
seen=$( (as_user bash -c 'eval "$("$0" env 2>/dev/null)" && ibv_devices' "$T/tools/uroce") 2>&1)
if grep -q "$A\|$B" <<<"$seen"; then
    not_ok "ibv_devices under uroce env lists no node-less device" "$seen"
else
    ok "ibv_devices under uroce env lists no node-less device"
fi

# ------------------------------------------------------------------- 2. uroce run
user_uroce run -- ibv_devices
expect_eq "uroce run -- ibv_devices: exit 0" 0 "$RC"
expect_match "uroce run -- ibv_devices lists $A" "^[[:space:]]+${A}[[:space:]]" "$OUT"
expect_match "uroce run -- ibv_devices lists $B" "^[[:space:]]+${B}[[:space:]]" "$OUT"
expect_eq "uroce run -- ibv_devices: nothing on stderr" "" "$ERR"
TAB=$'\t'
user_uroce run -- sh -c "stat -c '%F %t:%T %a' /dev/infiniband/uverbs_uroce_$A; id -u; grep ^CapEff: /proc/self/status; echo x >/dev/null && echo null-ok"
expect_eq "uroce run: the node is char 1:3 mode 666; the command runs as uid $USER_ID without capabilities; /dev/null works" \
    "0|character special file 1:3 666|$USER_ID|CapEff:${TAB}0000000000000000|null-ok" "$RC|$(paste -sd'|' <<<"$OUT")"
user_uroce run -- ibv_devinfo -d "$A"
expect_match "uroce run -- ibv_devinfo -d $A: the port is active" "state:[[:space:]]+PORT_ACTIVE" "$OUT"

# ---------------------------------------------------------------------- 3. traffic
port=$(free_tcp_port)
run_pair verified "$port" 120 UROCE_STATS=1 \
    -- ibv_rc_pingpong -d "$A" -g 0 -p "$port" -n 300 -s 4097 -m 1024 \
    -- "$T/apps/pingpong_verify" -d "$B" -p "$port" -n 300 -s 4097 -m 1024 "$IP_A"
if expect_pair_ok "ibv_rc_pingpong against pingpong_verify as uid $USER_ID"; then
    expect_file_match "pingpong_verify: every reply equals its message" \
        "^pingpong_verify: 300 iterations of 4097 bytes: every reply equals its message" "$CLI_OUT"
    expect_file_match "ibv_rc_pingpong server: 300 iterations" "^300 iters in" "$SRV_OUT"
    expect_eq "server rx_bad_icrc=0" 0 "$(counter_value "$SRV_ERR" "$A" rx_bad_icrc)"
fi
port=$(free_tcp_port)
run_pair checked "$port" 120 \
    -- ibv_rc_pingpong -d "$A" -g 0 -p "$port" -n 500 -s 65536 -c \
    -- ibv_rc_pingpong -d "$B" -g 0 -p "$port" -n 500 -s 65536 -c "$IP_A"
if expect_pair_ok "ibv_rc_pingpong -c -s 65536 both sides as uid $USER_ID"; then
    expect_file_match "ibv_rc_pingpong -c client: 500 iterations" "^500 iters in" "$CLI_OUT"
fi
user_uroce stats "$A"
tx=$(awk '$1 == "tx_packets" { print $2 }' <<<"$OUT")
if [[ $RC -eq 0 && ${tx:-0} -gt 800 ]]; then
    ok "uroce stats $A as uid $USER_ID counts the traffic (tx_packets $tx)"
else
    not_ok "uroce stats $A as uid $USER_ID counts the traffic" "exit $RC" "$OUT" "$ERR"
fi

# ------------------------------------------------- 4. a host /dev without infiniband/
# as_root_without_ib_dir SCRIPT: runs bash SCRIPT (with T, WORK, UROCE, A, B, IP_A, IP_B,
# USER_ID in its environment) as root in a private mount namespace whose /dev is a tmpfs
# holding what the host's /dev holds but infiniband/, and whose /run is empty.
as_root_without_ib_dir() {
    T=$T WORK=$WORK UROCE=$UROCE A=$A B=$B IP_A=$IP_A IP_B=$IP_B USER_ID=$USER_ID \
        PORT=$(free_tcp_port) REAL_UROCE=$REAL_UROCE \
        timeout -k 5 120 unshare -m --propagation private bash -c '
        set -e
        old=$(mktemp -d "$WORK/olddev.XXXXXX")
        mount --rbind /dev "$old"
        mount -t tmpfs -o mode=0755 uroce-test /dev
        for e in "$old"/* "$old"/.[!.]*; do
            [[ -e $e || -L $e ]] || continue
            n=${e##*/}
            if [[ $n == infiniband ]]; then continue; fi
            if [[ -L $e ]]; then
                cp -P "$e" "/dev/$n"
            elif [[ -d $e ]]; then
                mkdir "/dev/$n" && mount --rbind "$e" "/dev/$n"
            else
                : >"/dev/$n" && mount --bind "$e" "/dev/$n"
            fi
        done
        umount -l "$old" && rmdir "$old"
        mount -t tmpfs -o mode=0755 uroce-test /run
        set +e
        source "$0"' "$1"
}
if [[ $EUID -ne 0 ]]; then
    skip "rootless: a host /dev without infiniband/ (making one in a mount namespace needs root)"
else
    cat >"$WORK/no-ib-dir.sh" <<'EOF'
[[ -e /dev/infiniband ]] && echo "setup: /dev/infiniband exists"
"$UROCE" run -- sh -c '
    stat -c "%F %t:%T" /dev/infiniband/uverbs_uroce_$0 /dev/infiniband/uverbs_uroce_$1
    [ -d /dev/pts ] && [ -d /dev/shm ] && [ -L /dev/stdin ] && [ -c /dev/null ] &&
        echo x >/dev/null && echo dev-ok
    ibv_devices | awk "\$1 == \"$0\" || \$1 == \"$1\" { print \$1 }" | sort
    ibv_rc_pingpong -d "$0" -g 0 -p "$2" -n 100 -s 1000 -c >/dev/null 2>&1 &
    i=0
    while [ $i -lt 200 ] && ! ss -Htln "( sport = :$2 )" | grep -q .; do sleep 0.05; i=$((i + 1)); done
    ibv_rc_pingpong -d "$1" -g 0 -p "$2" -n 100 -s 1000 -c "$3" | grep "^100 iters"
    wait $! && echo server-ok
' "$A" "$B" "$PORT" "$IP_A" 2>&1
echo "run-exit $?"
# Root's registry in /run/uroce (this namespace's /run), and a user whose own is empty.
UROCE_ROOT= "$REAL_UROCE" add rootdev --ip 127.0.0.1 --port 4999 >/dev/null 2>&1 || echo "setup: root's add failed"
USER_XDG=$T/xdg/empty "$UROCE" env 2>&1 >/dev/null | grep "no devices are registered" | sed "s/^/env: /"
EOF
    mkdir -p "$T/xdg/empty"
    [[ $EUID -eq 0 ]] && chown 65534:65534 "$T/xdg/empty"
    out=$(as_root_without_ib_dir "$WORK/no-ib-dir.sh" 2>&1)
    expect_eq "no /dev/infiniband on the host: the nodes inside are char 1:3, /dev/pts, /dev/shm, /dev/stdin and /dev/null are there, ibv_devices lists both, ibv_rc_pingpong -c runs" \
        "character special file 1:3|character special file 1:3|dev-ok|$A|$B|100 iters|server-ok|run-exit 0" \
        "$(grep -v '^env: ' <<<"$out" | sed 's/^\(100 iters\) in.*/\1/' | paste -sd'|')"
    expect_eq "an empty registry of the user's points at root's in /run/uroce" \
        "env: uroce env: warning: no devices are registered in $T/xdg/empty/uroce; add one with 'uroce add NAME --ip ADDR' (/run/uroce has devices: set UROCE_ROOT=/run/uroce to use them)" \
        "$(grep '^env: ' <<<"$out")"
fi

# ---------------------------------------------- 5. a host that forbids user namespaces
# without_userns CMD...: CMD as root of a new user namespace (uids and gids 0..65535 mapped
# to themselves) in which user.max_user_namespaces is 0: nothing in it can make a user
# namespace, as on a host with that sysctl at 0.
without_userns() {
    local go=$WORK/userns.go pid i
    rm -f "$go"
    mkfifo "$go"
    # unshare(1) execs its command before the maps exist, and an exec by an unmapped uid drops
    # every capability; the command waits (30 s at most) for the maps and execs again to have
    # them. The fifo is opened read-write so that opening it waits for nobody.
    unshare -U bash -c 'exec 3<>"$0" && read -r -t 30 _ <&3 && exec 3<&- &&
        exec timeout -k 5 60 bash -c "echo 0 >/proc/sys/user/max_user_namespaces && exec \"\$@\"" bash "$@"' \
        "$go" "$@" &
    pid=$!
    for ((i = 0; i < 100; i++)); do
        [[ $(readlink "/proc/$pid/ns/user") != "$(readlink /proc/self/ns/user)" ]] && break
        sleep 0.05
    done
    echo "0 0 65536" >"/proc/$pid/uid_map" && echo "0 0 65536" >"/proc/$pid/gid_map"
    timeout 10 bash -c 'echo >"$0"' "$go"
    wait "$pid"
}
if [[ $EUID -ne 0 ]]; then
    skip "rootless: a host that forbids user namespaces (a user namespace with two users needs root)"
else
    C="rl$$c"
    out=$(without_userns "$UROCE" run -- true 2>&1)
    rc=$?
    expect_eq "user namespaces forbidden: uroce run exits 1" 1 "$rc"
    expect_eq "user namespaces forbidden: one error line naming user.max_user_namespaces" \
        "uroce run: error: devices $A and $B have no /dev/infiniband node and only root can make one, so 'uroce run' makes them in a private user and mount namespace, but this host allows no more user namespaces (unshare: No space left on device; user.max_user_namespaces is 0 or reached); run as root, or raise it with 'sysctl -w user.max_user_namespaces=10000'" \
        "$out"
    out=$(without_userns "$UROCE" add "$C" --ip "$IP_A" --port 4999 2>&1)
    rc=$?
    expect_eq "user namespaces forbidden: uroce add registers (exit 0) and warns in one line" \
        "0|uroce add: warning: device '$C' has no /dev/infiniband node (only root can make one) and 'uroce run' cannot give its commands one in a private namespace: this host allows no more user namespaces (unshare: No space left on device; user.max_user_namespaces is 0 or reached); run as root, or raise it with 'sysctl -w user.max_user_namespaces=10000'" \
        "$rc|$out"
    user_uroce del "$C"
fi

# ------------------------------------------------------------------------- del
user_uroce del "$A"
expect_eq "uroce del $A as uid $USER_ID: exit 0, prints nothing" "0|" "$RC|$OUT$ERR"
if [[ -e $REG/sys/class/infiniband/$A || -e $REG/sys/class/infiniband_verbs/uverbs_uroce_$A ]]; then
    not_ok "uroce del removes the device's directories" "$(ls "$REG/sys/class/infiniband" "$REG/sys/class/infiniband_verbs")"
else
    ok "uroce del removes the device's directories"
fi
user_uroce list
expect_eq "uroce list after del" "$B" "$(awk '{ print $1 }' <<<"$OUT")"
finish
