#!/usr/bin/env bash
# Tests for the `uroce` command and the device registry it writes.
#
#   test_registry.sh PATH_TO_UROCE
#
# Uses a fresh UROCE_ROOT and a dummy provider file; device names carry the PID
# so that parallel runs do not collide on /dev/infiniband. As root the whole
# add/list/del cycle is checked (plus root's error without CAP_MKNOD, and an unprivileged
# user's registry without nodes through setpriv); as a normal user that registry and
# everything that needs no /dev node, and the add/list/del cycle is reported as skipped
# ("skip - ..." lines, which tools/test.sh counts and refuses in CI).
# Last line: "N passed, M failed"; exit 1 if M > 0.
set -u

if [[ $# -ne 1 ]]; then
    echo "usage: $0 PATH_TO_UROCE" >&2
    exit 2
fi
UROCE=$(readlink -f "$1")
if [[ ! -x $UROCE ]]; then
    echo "$0: $1 is not an executable" >&2
    exit 2
fi

PASSED=0
FAILED=0
SKIPPED=0
WORK=$(mktemp -d)
export UROCE_ROOT="$WORK/root"
PROVIDER_DIR="$WORK/provider dir"  # a space, to check the shell quoting
mkdir -p "$PROVIDER_DIR"
: >"$PROVIDER_DIR/liburoce-rdmav34.so"
export UROCE_PROVIDER_DIR="$PROVIDER_DIR"
A="rt$$a"
B="rt$$b"
C="rt$$c"
D="rt$$d"
E="rt$$e"
F="rt$$f"
NAMES=("$A" "$B" "$C" "$D" "$E" "$F")
DEVDIR=/dev/infiniband

cleanup() {
    for n in "${NAMES[@]}"; do
        "$UROCE" del "$n" >/dev/null 2>&1
        # Nodes this script made or left behind (del only removes char 1:3 nodes).
        if [[ $EUID -eq 0 && -e $DEVDIR/uverbs_uroce_$n ]]; then rm -f "$DEVDIR/uverbs_uroce_$n"; fi
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

ok() {
    PASSED=$((PASSED + 1))
    echo "ok - $1"
}

not_ok() {
    FAILED=$((FAILED + 1))
    echo "not ok - $1"
    shift
    for line in "$@"; do echo "    $line"; done
}

# skip WHAT: checks not run; the "skip - " line is what tools/test.sh counts.
skip() {
    SKIPPED=$((SKIPPED + 1))
    echo "skip - $1"
}

# run_uroce ARGS...: runs uroce, leaving $RC, $OUT and $ERR.
run_uroce() {
    "$UROCE" "$@" >"$WORK/out" 2>"$WORK/err"
    RC=$?
    OUT=$(cat "$WORK/out")
    ERR=$(cat "$WORK/err")
}

# expect_rc WANT DESCRIPTION ARGS...: runs uroce and checks the exit status.
expect_rc() {
    local want=$1 desc=$2
    shift 2
    run_uroce "$@"
    if [[ $RC -eq $want ]]; then
        ok "$desc (exit $want)"
    else
        not_ok "$desc: exit $RC, want $want" "args: $*" "stdout: $OUT" "stderr: $ERR"
    fi
}

# expect_err PATTERN DESCRIPTION: the last stderr matches the glob PATTERN and
# is one line.
expect_err() {
    local pattern=$1 desc=$2
    if [[ $ERR == $pattern && $(printf '%s\n' "$ERR" | wc -l) -eq 1 ]]; then
        ok "$desc"
    else
        not_ok "$desc: stderr does not match '$pattern' in one line" "stderr: $ERR"
    fi
}

expect_eq() {
    local desc=$1 want=$2 got=$3
    if [[ $got == "$want" ]]; then
        ok "$desc"
    else
        not_ok "$desc" "want: $want" "got:  $got"
    fi
}

# expect_file PATH CONTENT: the file holds exactly CONTENT plus one "\n".
expect_file() {
    local path=$1 want=$2 got
    if [[ ! -f $path ]]; then
        not_ok "file ${path#"$UROCE_ROOT"/} exists"
        return
    fi
    got=$(cat "$path"; printf x)
    if [[ $got == "$want"$'\n'x ]]; then
        ok "file ${path#"$UROCE_ROOT"/} = '$want'"
    else
        not_ok "file ${path#"$UROCE_ROOT"/} content" "want: '$want\\n'" "got:  '${got%x}'"
    fi
}

expect_absent() {
    if [[ -e $1 || -L $1 ]]; then
        not_ok "$2: $1 still exists"
    else
        ok "$2"
    fi
}

# The list line of a device with blanks squeezed.
list_line() {
    "$UROCE" list 2>/dev/null | awk -v n="$1" '$1 == n { $1 = $1; print }'
}

# No half-built ".NAME.new" / ".NAME.del.PID" entries are left.
expect_no_staging() {
    local leftovers
    leftovers=$(find "$UROCE_ROOT/sys" -name '.*' 2>/dev/null)
    expect_eq "no staging entries left ($1)" "" "$leftovers"
}

SYS="$UROCE_ROOT/sys/class"

check_device_tree() {
    local name=$1 ip=$2 port=$3 mtu=$4 gid=$5 guid=$6
    local ib="$SYS/infiniband/$name" uv="$SYS/infiniband_verbs/uverbs_uroce_$name"
    expect_file "$SYS/infiniband_verbs/abi_version" 6
    expect_file "$uv/ibdev" "$name"
    expect_file "$uv/dev" 1:3
    expect_file "$uv/abi_version" 1
    expect_file "$ib/node_type" "1: CA"
    expect_file "$ib/node_guid" "$guid"
    expect_file "$ib/sys_image_guid" "$guid"
    expect_file "$ib/fw_ver" 0.1.0
    expect_file "$ib/board_id" uroce
    expect_file "$ib/hca_type" uroce
    expect_file "$ib/ports/1/gids/0" "$gid"
    expect_file "$ib/ports/1/gid_attrs/types/0" "RoCE v2"
    expect_file "$ib/ports/1/pkeys/0" 0xffff
    if [[ $ip == *:* ]]; then
        expect_file "$ib/uroce/ipv6" "$ip"
        expect_absent "$ib/uroce/ipv4" "an IPv6 device has no uroce/ipv4 ($name)"
    else
        expect_file "$ib/uroce/ipv4" "$ip"
        expect_absent "$ib/uroce/ipv6" "an IPv4 device has no uroce/ipv6 ($name)"
    fi
    expect_file "$ib/uroce/udp_port" "$port"
    expect_file "$ib/uroce/mtu" "$mtu"
    expect_absent "$ib/ports/1/gids/1" "GID table has one entry ($name)"
    expect_absent "$ib/ports/1/gid_attrs/ndevs" "no gid_attrs/ndevs ($name)"
    expect_eq "dev node of $name is char 1:3 mode 666" "character special file 1:3 666" \
        "$(stat -c '%F %t:%T %a' "$DEVDIR/uverbs_uroce_$name" 2>&1)"
}

echo "# uroce: $UROCE"
echo "# UROCE_ROOT: $UROCE_ROOT"

# ---------------------------------------------------------------- help, usage
for sub in "" add del list env run; do
    expect_rc 0 "uroce $sub --help" $sub --help
    if [[ $OUT == *"Usage: "*"uroce"* ]]; then ok "uroce $sub --help prints usage"; else not_ok "uroce $sub --help prints usage" "$OUT"; fi
done
expect_rc 2 "no command"
expect_err "uroce: error: *" "no command: one error line"
expect_rc 2 "unknown command" frobnicate
expect_err "*unknown command 'frobnicate'*uroce --help*" "unknown command: says so"
expect_rc 2 "unknown option" list --bogus
expect_rc 2 "extra argument to list" list extra

# ------------------------------------------------------- argument validation
expect_rc 2 "name with '-'" add "bad-name" --ip 127.0.0.1
expect_err "*letters, digits and '_'*" "name with '-': explains the rule"
expect_rc 2 "name with '/'" add "a/b" --ip 127.0.0.1
expect_rc 2 "name with '.'" add "a.b" --ip 127.0.0.1
expect_rc 2 "empty name" add "" --ip 127.0.0.1
expect_rc 2 "32-character name" add abcdefghijabcdefghijabcdefghij12 --ip 127.0.0.1
expect_err "*longer than 31*" "long name: explains the limit"
expect_rc 2 "missing --ip" add "$A"
expect_err "*--ip is required*" "missing --ip: says so"
# Names other providers claim (rxe and siw match by name prefix in libibverbs).
for claimed in rxe0 siw_a mlx5_0 efa0 irdma1; do
    expect_rc 2 "name '$claimed' another provider claims" add "$claimed" --ip 127.0.0.1
    expect_err "*another RDMA provider*" "name '$claimed': says why"
done
expect_rc 2 "missing NAME" add --ip 127.0.0.1
expect_rc 2 "bad IPv4 300.1.1.1" add "$A" --ip 300.1.1.1
expect_err "*not a valid IP address*" "bad IPv4: says so"
expect_rc 2 "bad IPv4 1.2.3" add "$A" --ip 1.2.3
expect_rc 2 "bad IPv4 hostname" add "$A" --ip localhost
expect_rc 2 "IPv6 fe80::1" add "$A" --ip fe80::1
expect_err "*link-local IPv6 address*" "IPv6 link-local: says why"
expect_rc 2 "IPv6 multicast ff02::1" add "$A" --ip ff02::1
expect_rc 2 "IPv6 ::" add "$A" --ip ::
expect_rc 2 "IPv4-mapped IPv6" add "$A" --ip ::ffff:127.0.0.1
expect_err "*IPv4-mapped IPv6 address; give the IPv4 address itself, such as 127.0.0.1*" \
    "IPv4-mapped IPv6: names the IPv4 address to give"
expect_rc 2 "0.0.0.0" add "$A" --ip 0.0.0.0
expect_rc 2 "multicast 239.1.1.1" add "$A" --ip 239.1.1.1
expect_rc 2 "broadcast" add "$A" --ip 255.255.255.255
expect_rc 2 "MTU 1500" add "$A" --ip 127.0.0.1 --mtu 1500
expect_err "*256, 512, 1024, 2048, 4096*" "bad MTU: lists the valid ones"
expect_rc 2 "MTU abc" add "$A" --ip 127.0.0.1 --mtu abc
expect_rc 2 "MTU 0" add "$A" --ip 127.0.0.1 --mtu 0
expect_rc 2 "port 0" add "$A" --ip 127.0.0.1 --port 0
expect_err "*1..65535*" "bad port: gives the range"
expect_rc 2 "port 65536" add "$A" --ip 127.0.0.1 --port 65536
expect_rc 2 "port abc" add "$A" --ip 127.0.0.1 --port abc
expect_rc 2 "port -1" add "$A" --ip 127.0.0.1 --port -1
expect_rc 2 "port 49152 (a QP source port)" add "$A" --ip 127.0.0.1 --port 49152
expect_err "*source ports*49152..49215*" "a source port as device port: says which ports"
expect_rc 2 "port 49215 (a QP source port)" add "$A" --ip 127.0.0.1 --port 49215
expect_rc 2 "del without name" del
expect_rc 2 "del with bad name" del "../etc"
expect_absent "$UROCE_ROOT/sys/class/infiniband/$A" "usage errors register nothing"

# ------------------------------------------------------------- empty registry
expect_rc 0 "list on a missing registry" list
expect_eq "list on a missing registry prints nothing" "" "$OUT"
expect_rc 1 "del of a missing device (no registry)" del "$A"
expect_err "*no device '$A'*uroce list*" "del of a missing device: says so"

# -------------------------------------------------------------- env and run
expect_rc 0 "env" env
expect_eq "env output" "export SYSFS_PATH='$UROCE_ROOT/sys'
export RDMAV_DRIVERS='$PROVIDER_DIR/liburoce'
export LD_PRELOAD='$(dirname "$UROCE")/liburoce-no-rdma-netlink.so'" "$OUT"
if [[ $ERR == *"no devices are registered"* ]]; then ok "env warns about an empty registry"; else not_ok "env warns about an empty registry" "$ERR"; fi
env_out=$(env -u SYSFS_PATH -u RDMAV_DRIVERS sh -c 'eval "$("$0" env 2>/dev/null)"; printf "%s|%s" "$SYSFS_PATH" "$RDMAV_DRIVERS"' "$UROCE")
expect_eq "env output evaluates in sh" "$UROCE_ROOT/sys|$PROVIDER_DIR/liburoce" "$env_out"
expect_eq "env: RDMAV_DRIVERS + -rdmav34.so names the provider" yes \
    "$(eval "$("$UROCE" env 2>/dev/null)"; [[ -f "$RDMAV_DRIVERS-rdmav34.so" ]] && echo yes)"
expect_rc 0 "run -- sh -c 'echo \$SYSFS_PATH'" run -- sh -c 'echo $SYSFS_PATH'
expect_eq "run sets SYSFS_PATH" "$UROCE_ROOT/sys" "$OUT"
expect_rc 0 "run -- sh -c 'echo \$RDMAV_DRIVERS'" run -- sh -c 'echo "$RDMAV_DRIVERS"'
expect_eq "run sets RDMAV_DRIVERS" "$PROVIDER_DIR/liburoce" "$OUT"
export UROCE_TEST_KEEP=kept
expect_rc 0 "run keeps the environment" run -- sh -c 'echo "$UROCE_TEST_KEEP"'
expect_eq "run keeps the environment: value" kept "$OUT"
expect_rc 7 "run returns the command's status" run -- sh -c 'exit 7'
expect_rc 127 "run of a missing command" run -- /nonexistent/uroce-test-cmd
expect_eq "run of a missing command: says so" "uroce run: error: cannot execute '/nonexistent/uroce-test-cmd': No such file or directory" \
    "$(printf '%s\n' "$ERR" | tail -n1)"
expect_rc 2 "run without a command" run
expect_rc 2 "run without '--' before options" run sh -c true
expect_err "*put '--' before the command*" "run without '--': says what to do"
(
    cd "$WORK" || exit 1
    UROCE_ROOT=relroot/ "$UROCE" env 2>/dev/null
) >"$WORK/out"
expect_eq "env makes a relative UROCE_ROOT absolute" "export SYSFS_PATH='$WORK/relroot/sys'" \
    "$(head -n1 "$WORK/out")"
UROCE_PROVIDER_DIR="$WORK/nowhere" run_uroce env
expect_eq "env without a provider exits 1" 1 "$RC"
expect_err "*liburoce-rdmav34.so was not found*UROCE_PROVIDER_DIR*" "env without a provider: says so"
UROCE_PROVIDER_DIR="$WORK/nowhere" run_uroce run -- true
expect_eq "run without a provider exits 1" 1 "$RC"
(
    unset UROCE_PROVIDER_DIR
    mkdir -p "$WORK/fake/tools" "$WORK/fake/provider"
    cp "$UROCE" "$WORK/fake/tools/uroce"
    : >"$WORK/fake/provider/liburoce-rdmav34.so"
    "$WORK/fake/tools/uroce" env 2>/dev/null | tail -n1
) >"$WORK/out"
expect_eq "provider found in the build-tree layout" "export RDMAV_DRIVERS='$WORK/fake/provider/liburoce'" \
    "$(cat "$WORK/out")"

# ------------------------------------------------------ without CAP_MKNOD
# Root without CAP_MKNOD (in a container, say): add must fail with a clear message and leave
# nothing behind.
check_needs_root() {
    local how=$1
    shift
    "$@" "$UROCE" add "$D" --ip 127.0.0.1 --port 4999 >"$WORK/out" 2>"$WORK/err"
    RC=$?
    ERR=$(cat "$WORK/err")
    expect_eq "add without CAP_MKNOD exits 1 ($how)" 1 "$RC"
    expect_err "*/dev/infiniband/uverbs_uroce_$D needs root (CAP_MKNOD)*" \
        "add without CAP_MKNOD: says root is needed ($how)"
    expect_absent "$SYS/infiniband/$D" "add without CAP_MKNOD rolls back the device tree ($how)"
    expect_absent "$SYS/infiniband_verbs/uverbs_uroce_$D" \
        "add without CAP_MKNOD rolls back the verbs entry ($how)"
    expect_no_staging "after a failed add ($how)"
}
# A user other than root: add registers the device without a node ('uroce run' makes it in a
# private namespace, test_rootless.sh); list and del do not ask for one.
check_nodeless() {
    local how=$1 user_uroce=$2
    shift 2
    "$@" "$user_uroce" add "$D" --ip 127.0.0.1 --port 4999 >"$WORK/out" 2>"$WORK/err"
    RC=$?
    ERR=$(cat "$WORK/err")
    expect_eq "add by a user other than root exits 0 ($how)" 0 "$RC"
    # Where the host forbids user namespaces, add says that uroce run cannot help.
    if [[ -z $ERR || $ERR == *"'uroce run' cannot give its commands one in a private namespace"* ]]; then
        ok "add by a user other than root: no warning but the namespace one ($how)"
    else
        not_ok "add by a user other than root: no warning but the namespace one ($how)" "$ERR"
    fi
    expect_file "$SYS/infiniband/$D/uroce/udp_port" 4999
    expect_file "$SYS/infiniband_verbs/uverbs_uroce_$D/dev" 1:3
    expect_absent "$DEVDIR/uverbs_uroce_$D" "add by a user other than root makes no node ($how)"
    "$@" "$user_uroce" list >"$WORK/out" 2>"$WORK/err"
    expect_eq "list by a user other than root: the device, no warning about its node ($how)" \
        "$D|" "$(awk '{ print $1 }' "$WORK/out")|$(cat "$WORK/err")"
    "$@" "$user_uroce" del "$D" >"$WORK/out" 2>"$WORK/err"
    expect_eq "del by a user other than root exits 0 and prints nothing ($how)" "0|" "$?|$(cat "$WORK/out" "$WORK/err")"
    expect_absent "$SYS/infiniband/$D" "del by a user other than root removes the tree ($how)"
}
if [[ -e $DEVDIR/uverbs_uroce_$D ]]; then
    skip "paths without CAP_MKNOD: $DEVDIR/uverbs_uroce_$D exists"
elif [[ $EUID -ne 0 ]]; then
    check_nodeless "as uid $EUID" "$UROCE"
else
    if command -v setpriv >/dev/null && setpriv --bounding-set=-mknod true; then
        check_needs_root "as root without CAP_MKNOD" setpriv --bounding-set=-mknod
    else
        skip "add without CAP_MKNOD: setpriv cannot drop it (util-linux)"
    fi
    # A copy of uroce the unprivileged user can reach: the build tree may be in a directory
    # of mode 0700 (a CI checkout in a mktemp directory).
    mkdir -p "$WORK/bin" "$UROCE_ROOT"
    cp "$UROCE" "$WORK/bin/uroce"
    chmod 0755 "$WORK" "$WORK/bin"
    chown -R 65534:65534 "$UROCE_ROOT"
    if command -v setpriv >/dev/null &&
        setpriv --reuid=65534 --regid=65534 --clear-groups test -x "$WORK/bin/uroce"; then
        check_nodeless "as uid 65534 via setpriv" "$WORK/bin/uroce" \
            setpriv --reuid=65534 --regid=65534 --clear-groups
    else
        skip "add by a user other than root: uid 65534 cannot run $WORK/bin/uroce (setpriv missing, or $WORK out of its reach)"
    fi
    chown -R 0:0 "$UROCE_ROOT"
fi

if [[ $EUID -ne 0 ]]; then
    skip "add/list/del cycle: needs root (uroce add makes /dev/infiniband nodes)"
    echo "# $SKIPPED skipped"
    echo "$PASSED passed, $FAILED failed"
    [[ $FAILED -eq 0 ]]
    exit
fi

# ----------------------------------------------------------- add/list/del
mkdir -p "$DEVDIR"
for n in "${NAMES[@]}"; do rm -f "$DEVDIR/uverbs_uroce_$n"; done

expect_rc 0 "add $A with defaults" add "$A" --ip 127.0.0.1
expect_eq "add $A prints nothing" "" "$OUT$ERR"
check_device_tree "$A" 127.0.0.1 4791 1024 0000:0000:0000:0000:0000:ffff:7f00:0001 0200:7f00:0001:12b7

(umask 077 && "$UROCE" add "$B" --ip 127.0.0.1 --port 5000 --mtu 4096 >"$WORK/out" 2>"$WORK/err")
expect_eq "add $B with --port/--mtu under umask 077 exits 0" 0 "$?"
check_device_tree "$B" 127.0.0.1 5000 4096 0000:0000:0000:0000:0000:ffff:7f00:0001 0200:7f00:0001:1388
expect_eq "files are world-readable under umask 077" "644 755 755" \
    "$(stat -c %a "$SYS/infiniband/$B/node_guid" "$SYS/infiniband/$B/ports/1/gids" \
        "$SYS/infiniband_verbs/uverbs_uroce_$B" | paste -sd' ')"

# 192.0.2.0/24 (TEST-NET-1) is not configured here: registered with a warning.
expect_rc 0 "add $C with a non-local address" add "$C" --ip 192.0.2.7 --port 65535 --mtu 256
if [[ $ERR == *"warning: 192.0.2.7 is not an address of this host"* ]]; then
    ok "non-local address: warns"
else
    not_ok "non-local address: warns" "$ERR"
fi
check_device_tree "$C" 192.0.2.7 65535 256 0000:0000:0000:0000:0000:ffff:c000:0207 0200:c000:0207:ffff
expect_no_staging "after adds"

expect_rc 0 "list" list
expect_eq "list prints one line per device, sorted" "3" "$(printf '%s\n' "$OUT" | grep -c "^rt$$")"
expect_eq "list line of $A" "$A 127.0.0.1 4791 1024 ::ffff:127.0.0.1 0200:7f00:0001:12b7" "$(list_line "$A")"
expect_eq "list line of $B" "$B 127.0.0.1 5000 4096 ::ffff:127.0.0.1 0200:7f00:0001:1388" "$(list_line "$B")"
expect_eq "list line of $C" "$C 192.0.2.7 65535 256 ::ffff:192.0.2.7 0200:c000:0207:ffff" "$(list_line "$C")"
expect_eq "list order" "$A $B $C" "$(printf '%s\n' "$OUT" | awk '{print $1}' | paste -sd' ')"
expect_eq "list prints no warnings" "" "$ERR"

# An IPv6 device: its GID is the address itself, its node GUID starts with 06.
expect_rc 0 "add $F --ip ::1" add "$F" --ip ::1 --port 4800
check_device_tree "$F" ::1 4800 1024 0000:0000:0000:0000:0000:0000:0000:0001 0600:0000:0001:12c0
expect_rc 0 "list with an IPv6 device" list
expect_eq "list line of $F" "$F ::1 4800 1024 ::1 0600:0000:0001:12c0" "$(list_line "$F")"
expect_rc 1 "duplicate [::1]:4800" add "$E" --ip 0:0:0:0:0:0:0:1 --port 4800
expect_err "*'$F' already uses \[::1\]:4800*" "duplicate IPv6 address and port: names the other device"
expect_rc 0 "del $F" del "$F"

expect_rc 1 "duplicate name" add "$A" --ip 127.0.0.2
expect_err "*'$A' already exists*uroce del $A*" "duplicate name: says so"
expect_rc 1 "duplicate ip:port" add "$D" --ip 127.0.0.1 --port 5000
expect_err "*'$B' already uses 127.0.0.1:5000*" "duplicate ip:port: names the other device"
expect_absent "$SYS/infiniband/$D" "duplicate ip:port registers nothing"
expect_absent "$DEVDIR/uverbs_uroce_$D" "duplicate ip:port creates no node"

# A node left behind as char 1:3 is reused (and made 0666); anything else is refused.
mknod -m 0600 "$DEVDIR/uverbs_uroce_$D" c 1 3
expect_rc 0 "add reuses an existing char 1:3 node" add "$D" --ip 127.0.0.3
check_device_tree "$D" 127.0.0.3 4791 1024 0000:0000:0000:0000:0000:ffff:7f00:0003 0200:7f00:0003:12b7
: >"$DEVDIR/uverbs_uroce_$E"
expect_rc 1 "add refuses a node that is not char 1:3" add "$E" --ip 127.0.0.4
expect_err "*uverbs_uroce_$E exists but is not char device 1:3*" "wrong node: says so"
expect_absent "$SYS/infiniband/$E" "wrong node: rolls back the device tree"
expect_absent "$SYS/infiniband_verbs/uverbs_uroce_$E" "wrong node: rolls back the verbs entry"
expect_eq "wrong node is left alone" "regular empty file" "$(stat -c %F "$DEVDIR/uverbs_uroce_$E")"
rm -f "$DEVDIR/uverbs_uroce_$E"

expect_rc 0 "del $A" del "$A"
expect_absent "$SYS/infiniband/$A" "del removes the device tree"
expect_absent "$SYS/infiniband_verbs/uverbs_uroce_$A" "del removes the verbs entry"
expect_absent "$DEVDIR/uverbs_uroce_$A" "del removes the /dev node"
expect_eq "list after del" "$B $C $D" "$("$UROCE" list | awk '{print $1}' | paste -sd' ')"
expect_rc 1 "del of a deleted device" del "$A"
expect_err "*no device '$A'*" "del of a deleted device: says so"
expect_rc 0 "re-add $A with the address of the deleted device" add "$A" --ip 127.0.0.1

rm -f "$DEVDIR/uverbs_uroce_$C"
expect_rc 0 "list with a missing /dev node" list
expect_err "*warning: device '$C'*uverbs_uroce_$C is missing*mknod*" "list warns about a missing node"
expect_rc 0 "del with a missing /dev node" del "$C"
expect_absent "$SYS/infiniband/$C" "del with a missing node removes the tree"

# stats: a device no context has opened has counted nothing; an unknown one is an error.
expect_rc 0 "stats of a device never opened" stats "$A"
expect_eq "stats: every counter of a device never opened is 0" "" "$(awk '$2 != 0' <<<"$OUT")"
expect_eq "stats: tx_packets listed" "tx_packets 0" "$(grep '^tx_packets ' <<<"$OUT")"
expect_rc 1 "stats of an unknown device" stats nosuchdev
expect_err "uroce stats: error: *no device 'nosuchdev'*" "stats names the unknown device"
printf 'garbage' >"$SYS/infiniband/$A/uroce/counters"
expect_rc 1 "stats of a damaged counters file" stats "$A"
expect_err "uroce stats: error: *is not a counters file*" "stats says the file is not a counters file"
rm -f "$SYS/infiniband/$A/uroce/counters"
expect_rc 1 "stats --qp of a QP never created" stats "$A" --qp 0x1234
expect_err "uroce stats: error: *no QP 0x001234 was ever created*" "stats --qp says no such QP was created"

for n in "$A" "$B" "$D"; do expect_rc 0 "del $n" del "$n"; done
expect_rc 0 "list after deleting everything" list
expect_eq "list is empty" "" "$OUT"
expect_no_staging "after dels"
expect_eq "abi_version stays" "6" "$(cat "$SYS/infiniband_verbs/abi_version")"

[[ $SKIPPED -gt 0 ]] && echo "# $SKIPPED skipped"
echo "$PASSED passed, $FAILED failed"
[[ $FAILED -eq 0 ]]
