#!/usr/bin/env bash
# Unmodified perftest (ib_{write,send,read}_{bw,lat}) over uroce devices on loopback.
#
#   test_perftest.sh PATH_TO_UROCE
#
# Each test runs as server + client with perftest's default options apart from
# -d DEV, -x 0 (GID index 0: RoCE needs a GID), -p PORT and -n ITERS, with
# UROCE_STATS=1 so that rx_bad_icrc=0 is checked on both sides. Both must exit
# 0 and the client must print its result line. The figures are printed in a
# summary block at the end (a baseline to compare later runs against).
# Needs root (uroce add makes /dev/infiniband nodes); otherwise skips (exit 77).
# PERFTEST_ITERS overrides the iteration count (default 1000).
# Last line: "N passed, M failed"; exit 1 if M > 0.
set -u
# shellcheck source=lib.sh
source "$(dirname "$(readlink -f "$0")")/lib.sh"
lib_init "$@"

TESTS=(ib_write_bw ib_write_lat ib_send_bw ib_send_lat ib_read_bw ib_read_lat ib_atomic_bw
    ib_atomic_lat)
# Each run: a tool and the options it gets beside the defaults (both sides).
RUNS=("${TESTS[@]}" "ib_send_bw --use-srq" "ib_send_lat --use-srq" "ib_send_bw --use-srq -q 4"
    ib_atomic_bw ib_atomic_lat "ib_atomic_bw -A CMP_AND_SWAP" "ib_atomic_bw -q 4"
    "ib_send_bw -c UD" "ib_send_lat -c UD" "ib_send_bw -c UD -q 4"
    "ib_send_bw -c UC" "ib_write_bw -c UC" "ib_send_lat -c UC" "ib_write_lat -c UC")
for tool in "${TESTS[@]}" ss timeout; do
    if ! command -v "$tool" >/dev/null; then
        skip "$tool is not installed (perftest)"
        finish
    fi
done
require_root "perftest over uroce"

T0=$SECONDS
LOAD0=$(cut -d' ' -f1 /proc/loadavg)
ITERS=${PERFTEST_ITERS:-1000}
OCT=$(pick_octet 42) || echo "# warning: every 127.0.42..61.* block has UDP sockets; using 127.0.$OCT"
A="pt$$a"
B="pt$$b"
IP_A="127.0.$OCT.1"
IP_B="127.0.$OCT.2"
add_device "$A" "$IP_A" || finish
add_device "$B" "$IP_B" || finish

# result_line FILE: the first data line after perftest's "#bytes" header.
result_line() {
    awk '/^[[:space:]]*#bytes/ { hdr = 1; next } hdr && $1 ~ /^[0-9]+$/ && NF >= 5 { print; exit }' "$1"
}

BW_ROWS=()
LAT_ROWS=()

for run in "${RUNS[@]}"; do
    read -r -a words <<<"$run"
    tool=${words[0]}
    extra=("${words[@]:1}")
    t=$run  # the label
    # With -q N the bandwidth tests count the iterations of all N QPs.
    expect_iters=$ITERS
    for ((i = 0; i + 1 < ${#extra[@]}; i++)); do
        [[ ${extra[i]} == -q ]] && expect_iters=$((ITERS * extra[i + 1]))
    done
    port=$(free_tcp_port) || { not_ok "$t: no free TCP port"; continue; }
    run_pair "$t" "$port" 120 UROCE_STATS=1 \
        -- "$tool" -d "$A" -x 0 -p "$port" -n "$ITERS" "${extra[@]}" \
        -- "$tool" -d "$B" -x 0 -p "$port" -n "$ITERS" "${extra[@]}" "$IP_A"
    expect_pair_ok "$t" || continue
    line=$(result_line "$CLI_OUT")
    if [[ -z $line ]]; then
        not_ok "$t: client prints the result table line" "$(tail -n 12 "$CLI_OUT")"
    else
        ok "$t: client prints the result table line"
        echo "#   $line"
        read -r -a f <<<"$line"
        if [[ $tool == *_bw ]]; then
            expect_eq "$t: iterations column" "$expect_iters" "${f[1]}"
            BW_ROWS+=("$(printf '%-26s %7s %6s %14s %14s %12s' "$t" "${f[0]}" "${f[1]}" "${f[3]}" "${f[2]}" "${f[4]}")")
        else
            expect_eq "$t: iterations column" "$ITERS" "${f[1]}"
            LAT_ROWS+=("$(printf '%-26s %7s %6s %10s %10s %10s %10s %10s %10s' "$t" "${f[0]}" "${f[1]}" "${f[4]}" "${f[5]}" "${f[2]}" "${f[3]}" "${f[6]}" "${f[7]}")")
        fi
    fi
    # The server prints the table too for these; ib_read_lat's and ib_atomic_lat's do not.
    if [[ $tool != ib_read_lat && $tool != ib_atomic_lat ]]; then
        if [[ -n $(result_line "$SRV_OUT") ]]; then
            ok "$t: server prints the result table line"
        else
            not_ok "$t: server prints the result table line" "$(tail -n 12 "$SRV_OUT")"
        fi
    fi
    # ib_atomic_lat's server returns from main without closing its device, so it never
    # prints the counters (UROCE_STATS prints them when the context closes).
    sides=(server client)
    [[ $tool == ib_atomic_lat ]] && sides=(client)
    for side in "${sides[@]}"; do
        if [[ $side == server ]]; then file=$SRV_ERR dev=$A; else file=$CLI_ERR dev=$B; fi
        v=$(counter_value "$file" "$dev" rx_bad_icrc)
        if [[ -z $v ]]; then
            not_ok "$t: $side prints the UROCE_STATS counters of $dev" "$(tail -n 5 "$file")"
            continue
        fi
        expect_eq "$t: $side rx_bad_icrc=0" 0 "$v"
        expect_eq "$t: $side rx_malformed=0" 0 "$(counter_value "$file" "$dev" rx_malformed)"
        v=$(counter_value "$file" "$dev" retransmitted_packets)
        if [[ ${v:-0} -ne 0 ]]; then
            echo "# note: $t: $side retransmitted $v packets ($(counter_value "$file" "$dev" retransmit_timeouts) timeouts, $(counter_value "$file" "$dev" early_retransmits) early resends, $(counter_value "$file" "$dev" tail_probes) tail probes, $(counter_value "$file" "$dev" rx_naks) NAKs received)"
        fi
    done
done

rev=$(git -C "$(dirname "$(readlink -f "$0")")" describe --always --dirty 2>/dev/null || echo unknown)
echo "# ------------------------------------------------------------------ perftest summary"
echo "# $UROCE (scripts at $rev), $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, load $LOAD0 before, $(cut -d' ' -f1 /proc/loadavg) after"
if awk -v l="$LOAD0" -v n="$(nproc)" 'BEGIN { exit !(l > n / 2) }'; then
    echo "# warning: the machine was busy before the test: busy-polling peers starve the"
    echo "#          engine threads and latencies round up to scheduler ticks (4 ms); these"
    echo "#          figures are not a baseline"
fi
echo "# defaults except -d -x 0 -p -n $ITERS; client side figures; MTU 1024"
printf '# %-26s %7s %6s %14s %14s %12s\n' test bytes iters "BW avg[MB/s]" "BW peak[MB/s]" "rate[Mpps]"
for r in "${BW_ROWS[@]}"; do echo "# $r"; done
printf '# %-26s %7s %6s %10s %10s %10s %10s %10s %10s\n' test bytes iters "typ[usec]" "avg[usec]" "min[usec]" "max[usec]" "stdev" "99%[usec]"
for r in "${LAT_ROWS[@]}"; do echo "# $r"; done
echo "# total time $((SECONDS - T0)) s"
finish
