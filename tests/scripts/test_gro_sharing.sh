#!/usr/bin/env bash
# Device sharing behind a receive path that merges datagrams (GRO), as a NIC's does: two
# network namespaces S and R joined by a veth pair, R's end set up to merge what arrives back
# to back (NAPI GRO: `ethtool -K gro on rx-udp-gro-forwarding on`, and threaded NAPI, so that
# datagrams queue up while the NAPI thread is not yet running and one poll finds several).
#
#   test_gro_sharing.sh PATH_TO_UROCE PATH_TO_UD_SHARING_CHECK
#
# A UD QP of S's device sends post lists alternately to the QPs of two contexts of R's device
# (tests/apps/ud_sharing_check.cpp). The datagrams leave from one UDP source port, the
# sending QP's: one UDP flow. R's kernel merges a datagram for context 1 and the next one, for
# context 2, into one buffer before its socket lookup, and the device's steering program hands
# the buffer to the context of the first datagram (docs/device-sharing.md, "GRO"). Every
# datagram must still reach its own context intact, none counted rx_unknown_qp, and the
# contexts must have read merged buffers (rx_gro_datagrams), or the test proved nothing.
# Needs root (ip netns, BPF for the sharing, uroce add makes /dev/infiniband nodes), iproute2
# and ethtool; otherwise skips (exit 77). Last line: "N passed, M failed".
set -u
# shellcheck source=lib.sh
source "$(dirname "$(readlink -f "$0")")/lib.sh"
CHECK=$(readlink -f "${2:-}")
lib_init "$1"

for tool in ip ethtool timeout; do
    if ! command -v "$tool" >/dev/null; then
        skip "GRO before steering: $tool is not installed"
        finish
    fi
done
if [[ ! -x $CHECK ]]; then
    not_ok "ud_sharing_check is built" "not an executable: ${2:-(none given)}"
    finish
fi
require_root "GRO before steering" "ip netns, BPF steering, /dev/infiniband nodes"

NS_S="uroce_gs$$" NS_R="uroce_gr$$"
IP_S=10.81.45.1 IP_R=10.81.45.2
D_S="gs$$" D_R="gr$$"

netns_down() { ip netns del "$NS_S" 2>/dev/null; ip netns del "$NS_R" 2>/dev/null; }
netns_up() {
    ip netns add "$NS_S" && ip netns add "$NS_R" &&
        ip -n "$NS_S" link set lo up && ip -n "$NS_R" link set lo up &&
        ip -n "$NS_S" link add vs type veth peer name vr netns "$NS_R" &&
        ip -n "$NS_S" link set vs up && ip -n "$NS_R" link set vr up &&
        ip -n "$NS_S" addr add "$IP_S/24" dev vs && ip -n "$NS_R" addr add "$IP_R/24" dev vr &&
        # NAPI and GRO on R's end. veth hands a sender's datagrams to NAPI only when the
        # receiving end takes them for GRO (rx-udp-gro-forwarding, as the sending end has
        # TSO); threaded NAPI lets datagrams pile up for one poll.
        ip netns exec "$NS_R" ethtool -K vr gro on rx-udp-gro-forwarding on &&
        ip netns exec "$NS_R" sh -c 'echo 1 > /sys/class/net/vr/threaded'
}
CLEANUP_FNS+=(netns_down)
if ! netns_up 2>"$WORK/netns.err"; then
    not_ok "two namespaces joined by a veth pair merging at R's end" "$(cat "$WORK/netns.err")"
    finish
fi
ok "two namespaces joined by a veth pair, GRO and threaded NAPI at R's end"

for dev in "$NS_S $D_S $IP_S" "$NS_R $D_R $IP_R"; do
    read -r ns name ip <<<"$dev"
    if out=$(ip netns exec "$ns" "$UROCE" add "$name" --ip "$ip" 2>&1); then
        DEVICES+=("$name")
    else
        not_ok "uroce add $name --ip $ip" "$out"
        finish
    fi
done
ok "a device in each namespace"

# A few hundred lists: enough for GRO to merge across the contexts many times over, most
# runs (3-400 merged datagrams in 300 lists). Whether it merges depends on when R's NAPI
# thread runs, so a run that saw none goes on, up to 3,000 lists, until a context has read a
# merged buffer.
out=$(timeout -k 5 120 "$UROCE" run -- "$CHECK" "/run/netns/$NS_S" "$D_S" "/run/netns/$NS_R" \
    "$D_R" 300 3000 2>&1)
rc=$?
if [[ $rc -eq 0 ]]; then
    ok "every datagram reached its own context intact, none unknown"
else
    not_ok "every datagram reached its own context intact, none unknown (exit $rc)" "$out"
fi
gro=$(grep -o 'rx_gro_datagrams [0-9]*' <<<"$out" | awk '{ s += $2 } END { print s + 0 }')
if [[ $gro -gt 0 ]]; then
    ok "the contexts read merged buffers (rx_gro_datagrams $gro)"
else
    not_ok "the contexts read merged buffers (rx_gro_datagrams > 0)" "$out"
fi
finish
