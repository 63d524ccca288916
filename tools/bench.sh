#!/usr/bin/env bash
# uroce against the kernel's own UDP (and TCP) on this machine, in one run:
#
#   tools/bench.sh [BUILD_DIR] [--quick]
#
# Measures the raw-UDP baseline (build/tools/bench/uroce-udp-baseline: GSO+GRO goodput, plain
# sendto, packets/s, busy-polled RTT, a 64 KiB GSO ping-pong; one TCP stream), then uroce with
# perftest and ibv_rc_pingpong between two loopback devices (and two network namespaces joined
# by a veth pair), and prints one table: figure, uroce, baseline, ratio, target.
# The table also goes to BUILD_DIR/bench/table.md (Markdown), with every raw log next to it;
# with matplotlib, PNG plots too (tools/bench/plot.py). docs/performance.md explains the rows.
#
# --quick: fewer iterations (well under 2 minutes); the default run takes a few minutes.
# Needs root (uroce add, network namespaces). A tool, not a test: timings on a shared machine
# are noise in absolute terms; only the ratios of one run mean something.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }
build=
quick=0
for arg in "$@"; do
  case $arg in
    --quick) quick=1 ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "bench: unknown option '$arg'" >&2; usage >&2; exit 2 ;;
    *)
      if [[ -n $build ]]; then echo "bench: more than one BUILD_DIR" >&2; exit 2; fi
      build=$arg
      ;;
  esac
done
build=$(readlink -f "${build:-$top/build}")
uroce=$build/tools/uroce
baseline=$build/tools/bench/uroce-udp-baseline
many_qps=$build/tools/bench/uroce-many-qps
for f in "$uroce" "$baseline" "$many_qps"; do
  if [[ ! -x $f ]]; then
    echo "bench: $f is missing: build first (meson setup $build && ninja -C $build)" >&2
    exit 1
  fi
done
if [[ $(id -u) -ne 0 ]]; then
  echo "bench: needs root (uroce add creates /dev nodes; network namespaces)" >&2
  exit 1
fi
for t in ib_write_bw ib_read_bw ib_send_bw ib_send_lat ib_write_lat ib_read_lat \
  ibv_rc_pingpong ip ss timeout; do
  if ! command -v "$t" >/dev/null; then
    echo "bench: $t not found (tools/setup.sh installs perftest, ibverbs-utils, iproute2)" >&2
    exit 1
  fi
done

# ---- parameters ----
if ((quick)); then
  secs=1          # each baseline throughput mode
  rtt_iters=5000  # baseline ping-pong (8 B)
  gpp_iters=1000  # baseline 64 KiB GSO ping-pong
  bw_n=2000       # perftest *_bw, 64 KiB
  lat_n=2000      # perftest *_lat, 8 B
  rate_n=20000    # ib_send_bw -q 4 -s 64, per QP
  rc_n=300        # ibv_rc_pingpong 64 KiB
  rc4k_n=1000     # ibv_rc_pingpong 4 KiB, lossless
  sweep_n=50      # perftest -a, per size (only when plotting)
else
  secs=3
  rtt_iters=20000
  gpp_iters=5000
  bw_n=10000
  lat_n=20000
  rate_n=100000
  rc_n=2000
  rc4k_n=5000
  sweep_n=1000    # perftest's own default; 200 showed mostly each size's start
fi
loss_rc_n=1000 # ibv_rc_pingpong 4 KiB under loss
loss_bw_n=2000 # ib_write_bw 64 KiB under loss (and its lossless reference; 300 was mostly set-up)
loss_rounds=3  # runs of each (lossless, 1%, 5%), interleaved; the rows take their medians
bw_rounds=3    # rounds of each 64 KiB bandwidth row with its UDP baselines; medians
lat_rounds=3   # rounds of the latency and 64 KiB ping-pong rows with their baselines; medians
tmo=120        # seconds: any single perftest / pingpong process
loss_tmo=60    # seconds: the same under loss

out=$build/bench
rm -rf "$out"
mkdir -p "$out"
results=$out/results.txt # key=value, every figure (plot.py reads it)
rows=$out/rows.tsv       # the table, one row per line
: >"$results"
: >"$rows"

# ---- set-up and cleanup ----
export UROCE_ROOT
UROCE_ROOT=$(mktemp -d "${TMPDIR:-/tmp}/uroce-bench.XXXXXX")
A=ubla$$ B=ublb$$   # loopback devices
NA=ubna$$ NB=ubnb$$ # devices in the namespaces
NSA=ubench-a$$ NSB=ubench-b$$ VA=ubva$$ VB=ubvb$$
ip_a=127.0.213.1 ip_b=127.0.213.2
ns_ip_a=10.213.77.1 ns_ip_b=10.213.77.2
srv_pid='' cli_pid='' # the running server and client or baseline (ended by cleanup)
netns_made=0

# Ends PID and everything it started (children first), by process id.
kill_tree() {
  local p=$1 c
  for c in $(pgrep -P "$p" 2>/dev/null || true); do kill_tree "$c"; done
  kill "$p" 2>/dev/null || true
}
cleanup() {
  [[ -z $cli_pid ]] || kill_tree "$cli_pid"
  [[ -z $srv_pid ]] || kill_tree "$srv_pid"
  for d in "$A" "$B" "$NA" "$NB"; do timeout 10 "$uroce" del "$d" >/dev/null 2>&1 || true; done
  if ((netns_made)); then
    timeout 10 ip netns del "$NSA" 2>/dev/null || true
    timeout 10 ip netns del "$NSB" 2>/dev/null || true
    timeout 10 ip link del "$VA" 2>/dev/null || true
  fi
  rm -rf "$UROCE_ROOT"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

timeout 10 "$uroce" add "$A" --ip "$ip_a" --mtu 4096 >/dev/null
timeout 10 "$uroce" add "$B" --ip "$ip_b" --mtu 4096 >/dev/null

# Two namespaces joined by a veth pair (MTU 9000: uroce's 4096-byte packets need 4160).
netns_reason=
setup_netns() {
  netns_made=1
  timeout 10 ip netns add "$NSA" &&
    timeout 10 ip netns add "$NSB" &&
    timeout 10 ip link add "$VA" type veth peer name "$VB" &&
    timeout 10 ip link set "$VA" netns "$NSA" &&
    timeout 10 ip link set "$VB" netns "$NSB" &&
    timeout 10 ip -n "$NSA" addr add "$ns_ip_a/24" dev "$VA" &&
    timeout 10 ip -n "$NSB" addr add "$ns_ip_b/24" dev "$VB" &&
    timeout 10 ip -n "$NSA" link set "$VA" mtu 9000 up &&
    timeout 10 ip -n "$NSB" link set "$VB" mtu 9000 up &&
    timeout 10 ip -n "$NSA" link set lo up &&
    timeout 10 ip -n "$NSB" link set lo up &&
    # The addresses live only in the namespaces: uroce add warns that the host lacks them.
    timeout 10 "$uroce" add "$NA" --ip "$ns_ip_a" --mtu 4096 >/dev/null &&
    timeout 10 "$uroce" add "$NB" --ip "$ns_ip_b" --mtu 4096 >/dev/null
}
if ! setup_netns 2>"$out/netns-setup.log"; then
  netns_reason="namespace set-up failed, see bench/netns-setup.log"
fi

# ---- helpers ----
note() { printf '%s\n' "$*" >&2; }
put() { printf '%s=%s\n' "$1" "$2" >>"$results"; }
# kv FILE KEY: the value of KEY in a `key=value ...` line.
kv() { [[ -s $1 ]] || return 0; tr ' ' '\n' <"$1" | awk -F= -v k="$2" '$1 == k {print $2; exit}'; }

# cpu_run CPUFILE CMD...: runs CMD; CPUFILE gets the user+system seconds CMD and every process
# it waited for used (bash's `times` in a subshell counts just that subshell's children).
cpu_run() {
  local f=$1
  shift
  (
    rc=0
    "$@" || rc=$?
    times >"$f"
    exit "$rc"
  )
}
cpu_of() { # CPUFILE: seconds (children's user + system: the second line of `times`)
  [[ -s $1 ]] || { echo ""; return; }
  sed -n 2p "$1" | awk '{
    t = 0
    for (i = 1; i <= 2; i++) { split($i, p, "m"); sub("s", "", p[2]); t += p[1] * 60 + p[2] }
    printf "%.3f", t }'
}

port=$((20000 + RANDOM % 20000))
# wait_listen NS PORT PID: until a TCP listener on PORT exists in namespace NS ("" = this
# one), at most 10 s, or the process PID has died.
wait_listen() {
  local ns=$1 p=$2 pid=$3 i
  local pre=()
  [[ -n $ns ]] && pre=(ip netns exec "$ns")
  for ((i = 0; i < 100; i++)); do
    if [[ -n $(timeout 5 "${pre[@]}" ss -Hltn "sport = :$p" 2>/dev/null) ]]; then return 0; fi
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# pair LABEL TIMEOUT FAULTS SDEV CDEV SADDR SNS CNS TOOL ARGS...: the server (TOOL ARGS -d SDEV)
# in namespace SNS, then, once it listens, the client on CDEV in CNS, connecting to SADDR.
# Both run under `uroce run`, time-limited, with UROCE_FAULTS=FAULTS. Logs:
# $out/LABEL.log (client), LABEL.srv.log; CPU seconds in LABEL.cli.cpu / LABEL.srv.cpu.
# Sets pair_ok=1 when the client succeeded (its report is then in LABEL.log), and pair_rc:
# 0 (both sides succeeded), "timeout" (either side), or "failed (rc=N)" / "failed (server rc=N)".
pair_rc=
pair_ok=0
pair() {
  local label=$1 t=$2 faults=$3 sdev=$4 cdev=$5 saddr=$6 sns=$7 cns=$8
  shift 8
  port=$((port + 1))
  local spre=() cpre=()
  [[ -n $sns ]] && spre=(ip netns exec "$sns")
  [[ -n $cns ]] && cpre=(ip netns exec "$cns")
  local s src=0 crc=0
  cpu_run "$out/$label.srv.cpu" timeout "$t" "${spre[@]}" env UROCE_FAULTS="$faults" \
    "$uroce" run -- "$@" -d "$sdev" -p "$port" >"$out/$label.srv.log" 2>&1 &
  s=$!
  srv_pid=$s
  if ! wait_listen "$sns" "$port" "$s"; then
    note "bench: $label: the server did not start listening (see bench/$label.srv.log)"
  fi
  # In the background too, so that a signal to this script is handled at once (in `wait`).
  cpu_run "$out/$label.cli.cpu" timeout "$t" "${cpre[@]}" env UROCE_FAULTS="$faults" \
    "$uroce" run -- "$@" -d "$cdev" -p "$port" "$saddr" >"$out/$label.log" 2>&1 &
  cli_pid=$!
  wait "$cli_pid" || crc=$?
  cli_pid=''
  wait "$s" || src=$?
  srv_pid=''
  pair_ok=$((crc == 0))
  if ((crc == 124 || src == 124)); then
    pair_rc=timeout
  elif ((crc != 0)); then
    pair_rc="failed (rc=$crc)"
  elif ((src != 0)); then
    pair_rc="failed (server rc=$src)"
  else
    pair_rc=0
  fi
  echo "$label: $pair_rc" >>"$out/status.txt"
}
lo_pair() { pair "$1" "$2" "$3" "$A" "$B" "$ip_a" "" "" "${@:4}"; }

# perf_col FILE COLUMN: COLUMN of the last result row of a perftest report. The header's
# names are joined where perftest splits them ("BW average[MB/sec]", "99% percentile[usec]")
# and lose their unit: "#bytes", "#iterations", "BW peak", "BW average", "MsgRate",
# "t_min", "t_max", "t_typical", "t_avg", "t_stdev", "99% percentile", "99.9% percentile".
perf_col() {
  [[ -s $1 ]] || return 0
  awk -v want="$2" '
    /#bytes/ {
      n = 0; pend = ""
      for (i = 1; i <= NF; i++) {
        w = (pend == "" ? $i : pend " " $i)
        if ($i !~ /^#/ && $i !~ /\[/ && i < NF) { pend = w; continue }
        pend = ""; sub(/\[.*$/, "", w); name[++n] = w
      }
      col = 0
      for (i = 1; i <= n; i++) if (name[i] == want) col = i
      next
    }
    col && /^ *[0-9]+ +[0-9]+ / { v = $col }
    END { print v }' "$1"
}
# rc_usec FILE: ibv_rc_pingpong's "N iters in S seconds = U usec/iter".
rc_usec() { [[ -s $1 ]] || return 0; awk '/iters in .* usec\/iter/ {v = $(NF - 1)} END {print v}' "$1"; }

# Arithmetic with awk: calc EXPR prints its value; fmt FORMAT EXPR prints it formatted.
calc() { awk "BEGIN {print ($1)}" </dev/null; }
fmt() { # fmt PRINTF_FORMAT EXPR (awk)
  awk "BEGIN {printf \"$1\", $2}" </dev/null
}
num() { [[ $1 =~ ^[0-9]+([.][0-9]+)?([eE][-+]?[0-9]+)?$ ]]; }
# median_of VALUE...: the median of the numeric values (the middle one of an odd count), or
# the first value when none is numeric (a run's status, such as "timeout").
median_of() {
  local v nums=()
  for v in "$@"; do num "$v" && nums+=("$v"); done
  if ((${#nums[@]} == 0)); then
    echo "$1"
    return
  fi
  printf '%s\n' "${nums[@]}" | sort -g |
    awk '{a[NR] = $1} END {if (NR % 2) print a[(NR + 1) / 2]; else printf "%.3f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2}'
}

# row FIGURE UROCE BASELINE_NAME BASELINE RATIO_DIR TARGET_OP TARGET: one table row. UROCE and
# BASELINE are numbers (or a text such as "timeout"); the ratio is UROCE/BASELINE
# (RATIO_DIR "/") or BASELINE/UROCE ("inv"). TARGET_OP ">=" or "<=" (or "" for none).
row() {
  local fig=$1 u=$2 bname=$3 b=$4 dir=$5 op=$6 tgt=$7 ratio="" met=""
  if num "$u" && num "$b" && [[ $(calc "($b != 0)") == 1 ]]; then
    if [[ $dir == inv ]]; then
      ratio=$(fmt "%.3f" "$b / $u")
    else
      ratio=$(fmt "%.3f" "$u / $b")
    fi
    if [[ -n $op ]]; then
      met=$(awk -v r="$ratio" -v t="$tgt" -v op="$op" 'BEGIN {
        ok = (op == ">=" ? r >= t : r <= t); print (ok ? "yes" : "NO") }')
    fi
  else
    ratio="-"
    met="-"
  fi
  local target="-"
  [[ -n $op ]] && target="$op $tgt"
  [[ -n $met ]] || met="-"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$fig" "$u" "$bname" "$b" "$ratio" "$target" "$met" \
    >>"$rows"
}
text_row() { printf '%s\t%s\t%s\t%s\t-\t-\t-\n' "$1" "$2" "$3" "$4" >>"$rows"; }

# perftest's MB/sec is MiB/s (2^20 bytes); the table shows GB/s (10^9 bytes/s).
gbs_of_mib() { num "$1" && fmt "%.3f" "$1 * 1048576 / 1e9" || echo "$1"; }
gbs_of_bytes() { num "$1" && fmt "%.3f" "$1 / 1e9" || echo "$1"; }

start_date=$(date -u '+%Y-%m-%d %H:%M UTC')
# idle_pct: how idle (%) all CPUs were over the next second (others' load: the figures of a
# busy machine, busy-polling ones above all, are unreliable).
idle_pct() {
  local a b
  a=$(awk '/^cpu / {print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat)
  sleep 1
  b=$(awk '/^cpu / {print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat)
  awk -v a="$a" -v b="$b" 'BEGIN {split(a, x, " "); split(b, y, " ");
    t = y[2] - x[2]; printf "%d", (t > 0 ? 100 * (y[1] - x[1]) / t : 0)}'
}
idle_start=$(idle_pct)
# steal_mark: the CPUs' time the hypervisor gave to others (steal) and all time, in ticks. A VM
# whose host is busy loses CPU to it unseen by the idle figures above; the header says how
# much of the run went that way.
steal_mark() { awk '/^cpu / {print $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat; }
steal_start=$(steal_mark)
commit=$(timeout 10 git -C "$top" rev-parse --short HEAD 2>/dev/null || echo unknown)
if ! timeout 10 git -C "$top" diff --quiet HEAD 2>/dev/null; then commit="$commit (modified)"; fi
note "bench: $( ((quick)) && echo quick || echo full) run, logs in $out"

# ---- 1. the baseline: raw UDP and TCP over loopback ----
base() { # base NAME TIMEOUT ARGS...: one baseline mode into $out/base-NAME.log
  local name=$1 t=$2
  shift 2
  note "bench: baseline $name"
  local rc=0
  timeout "$t" "$baseline" "$@" >"$out/base-$name.log" 2>"$out/base-$name.err" &
  cli_pid=$!
  wait "$cli_pid" || rc=$?
  cli_pid=''
  ((rc == 0)) || note "bench: baseline $name failed (rc=$rc, see bench/base-$name.err)"
  [[ -s $out/base-$name.err ]] || rm -f "$out/base-$name.err"
}
base gso 30 gso --seconds "$secs"
base gso-write 30 gso-write --seconds "$secs"
base gso-write-rc 30 gso-write-rc --seconds "$secs"
base gso-rc 30 gso-rc --seconds "$secs"
base sendto 30 sendto --seconds "$secs"
base pps 30 pps --seconds "$secs"
base tcp 30 tcp --seconds "$secs"
# The round-trip and ping-pong baselines run in section 2, each round right before the uroce
# runs they are compared with.

b_gso=$(kv "$out/base-gso.log" goodput_Bps)
b_gso_cpu=$(kv "$out/base-gso.log" cpu_s_per_gb)
b_gsow=$(kv "$out/base-gso-write.log" goodput_Bps)
b_gsowrc=$(kv "$out/base-gso-write-rc.log" goodput_Bps)
b_gsorc=$(kv "$out/base-gso-rc.log" goodput_Bps)
b_tcp=$(kv "$out/base-tcp.log" goodput_Bps)
b_pps=$(kv "$out/base-pps.log" rx_dgrams_per_s)
for k in goodput_Bps loss_pct cpu_s_per_gb rx_dgrams_per_s; do
  put "base_gso_$k" "$(kv "$out/base-gso.log" "$k")"
  put "base_sendto_$k" "$(kv "$out/base-sendto.log" "$k")"
done
put base_gso_write_goodput_Bps "$b_gsow"
put base_gso_write_rc_goodput_Bps "$b_gsowrc"
put base_gso_rc_goodput_Bps "$b_gsorc"
put base_pps "$b_pps"
put base_tcp_goodput_Bps "$b_tcp"
put base_tcp_cpu_s_per_gb "$(kv "$out/base-tcp.log" cpu_s_per_gb)"

# ---- 2. uroce: perftest and ibv_rc_pingpong between the loopback devices ----
bw_rows() { # bw_rows TOOL: ib_*_bw 64 KiB: bandwidth against GSO+GRO and TCP, CPU per GB
  local tool=$1 label=${1#ib_}
  # This VM's speed changes within minutes (GSO+GRO 1.7 and 5.1 GB/s three minutes apart), and
  # one perftest run of a build moved between 0.7 and 2.6 GB/s within an hour (2026-12-03): each
  # of $bw_rounds rounds measures the row's UDP figures again right before its uroce run, and
  # the row takes the medians (every run in results.txt as KEY_runs); its ratios use those.
  local r rl gso_runs=() gsow_runs=() rc_runs=() gbs_runs=() cpu_runs=() v mib s c
  local rc_mode=gso-write-rc rc_label="UDP GSO, WRITE's trains, copies, CRC" rc_first=$b_gsowrc
  if [[ $tool == ib_send_bw ]]; then
    rc_mode=gso-rc rc_label="UDP GSO, copies, CRC" rc_first=$b_gsorc
  fi
  # What a run costs whatever it moves: perftest's own start (it calibrates its clock in a
  # busy loop, about 0.22 CPU s of the client here) and uroce's set-up; the CPU row subtracts
  # it. -N (no peak figure) in both: perftest's peak computation grows with -n (0.5 CPU s of
  # 0.8 at -n 20000) and is not the transfer's either.
  local setup_cpu=""
  lo_pair "$label.setup" "$tmo" "" "$tool" -x 0 -s 65536 -n 5 -N
  if ((pair_ok)); then
    s=$(cpu_of "$out/$label.setup.srv.cpu")
    c=$(cpu_of "$out/$label.setup.cli.cpu")
    if num "$s" && num "$c"; then setup_cpu=$(fmt "%.3f" "$s + $c"); fi
  fi
  put "${label}_setup_cpu_s" "$setup_cpu"
  for ((r = 1; r <= bw_rounds; r++)); do
    rl=$label.r$r
    base "gso-$rl" 30 gso --seconds "$secs"
    v=$(kv "$out/base-gso-$rl.log" goodput_Bps)
    if num "$v"; then gso_runs+=("$v"); fi
    if [[ $tool != ib_send_bw ]]; then
      base "gso-write-$rl" 30 gso-write --seconds "$secs"
      v=$(kv "$out/base-gso-write-$rl.log" goodput_Bps)
      if num "$v"; then gsow_runs+=("$v"); fi
    fi
    # The ceiling of RoCE in user space: the row's trains with only a copy and a CRC at each end.
    base "$rc_mode-$rl" 30 "$rc_mode" --seconds "$secs"
    v=$(kv "$out/base-$rc_mode-$rl.log" goodput_Bps)
    if num "$v"; then rc_runs+=("$v"); fi
    note "bench: $tool -s 65536 -n $bw_n (round $r of $bw_rounds)"
    lo_pair "$rl" "$tmo" "" "$tool" -x 0 -s 65536 -n "$bw_n" -N
    if ((pair_ok)); then
      mib=$(perf_col "$out/$rl.log" "BW average")
      gbs_runs+=("$(gbs_of_mib "$mib")")
      s=$(cpu_of "$out/$rl.srv.cpu")
      c=$(cpu_of "$out/$rl.cli.cpu")
      if num "$s" && num "$c" && num "$setup_cpu"; then
        cpu_runs+=("$(fmt "%.4f" "($s + $c - $setup_cpu) / (($bw_n - 5) * 65536 / 1e9)")")
      fi
    else
      gbs_runs+=("$pair_rc")
    fi
  done
  local row_gso=$b_gso row_gsow=$b_gsow row_rc=$rc_first gbs cpu=""
  if ((${#gso_runs[@]})); then row_gso=$(median_of "${gso_runs[@]}"); fi
  if ((${#gsow_runs[@]})); then row_gsow=$(median_of "${gsow_runs[@]}"); fi
  if ((${#rc_runs[@]})); then row_rc=$(median_of "${rc_runs[@]}"); fi
  gbs=$(median_of "${gbs_runs[@]}")
  if ((${#cpu_runs[@]})); then cpu=$(median_of "${cpu_runs[@]}"); fi
  put "${label}_base_gso_goodput_Bps" "$row_gso"
  put "${label}_base_gso_goodput_Bps_runs" "$(IFS=,; echo "${gso_runs[*]}")"
  put "${label}_GBps" "$gbs"
  put "${label}_GBps_runs" "$(IFS=,; echo "${gbs_runs[*]}")"
  put "${label}_cpu_s_per_gb" "$cpu"
  row_baselines+="${row_baselines:+, }$tool $(gbs_of_bytes "$row_gso")"
  row "$tool -s 65536 (GB/s)" "$gbs" "UDP GSO+GRO" "$(gbs_of_bytes "$row_gso")" / ">=" 0.85
  row "$tool -s 65536 (GB/s)" "$gbs" "TCP, 1 stream" "$(gbs_of_bytes "$b_tcp")" / ">=" 1.5
  # No target: how close uroce comes to UDP carrying the same trains (a WRITE's FIRST and a
  # READ's first and last responses are larger than the rest, so each message takes two sends).
  [[ $tool == ib_send_bw ]] ||
    row "$tool -s 65536 (GB/s)" "$gbs" "UDP GSO, WRITE's trains" "$(gbs_of_bytes "$row_gsow")" / "" ""
  # No target either: the same trains with only the per-byte work any RoCE in user space does
  # (a copy and a CRC at each end, no protocol): the ceiling such a provider has here.
  put "${label}_base_rc_goodput_Bps_runs" "$(IFS=,; echo "${rc_runs[*]}")"
  row "$tool -s 65536 (GB/s)" "$gbs" "$rc_label" "$(gbs_of_bytes "$row_rc")" / "" ""
  row "$tool -s 65536: CPU s per GB" "${cpu:-n/a}" "UDP GSO+GRO" "$b_gso_cpu" / "" ""
}
row_baselines=""
bw_rows ib_write_bw
bw_rows ib_read_bw
bw_rows ib_send_bw

# Eight QPs of one process streaming at once (-q 8, each QP -n / 8): what a poll that reads
# for many QPs costs (docs/performance-log.md, 2026-12-06 16:06). No target: against the
# GSO+GRO baseline of the WRITE row and the one-QP WRITE row, medians of $bw_rounds runs.
q8_n=$((bw_n / 8))
q8_runs=()
for ((r = 1; r <= bw_rounds; r++)); do
  note "bench: ib_write_bw -q 8 -s 65536 -n $q8_n (round $r of $bw_rounds)"
  lo_pair "write_q8.r$r" "$tmo" "" ib_write_bw -x 0 -q 8 -s 65536 -n "$q8_n" -N
  if ((pair_ok)); then
    q8_runs+=("$(gbs_of_mib "$(perf_col "$out/write_q8.r$r.log" "BW average")")")
  else
    q8_runs+=("$pair_rc")
  fi
done
q8=$(median_of "${q8_runs[@]}")
put write_bw_q8_GBps "$q8"
put write_bw_q8_GBps_runs "$(IFS=,; echo "${q8_runs[*]}")"
w_gso=$(kv "$results" write_bw_base_gso_goodput_Bps)
row "ib_write_bw -q 8 -s 65536 (GB/s)" "$q8" "UDP GSO+GRO" "$(gbs_of_bytes "$w_gso")" / "" ""
row "ib_write_bw -q 8 -s 65536 (GB/s)" "$q8" "ib_write_bw, one QP" \
  "$(kv "$results" write_bw_GBps)" / "" ""

# The latency rows and the 64 KiB ping-pong rows: $lat_rounds rounds, each the UDP baselines
# then the uroce runs compared with them, so that the VM's drift reaches both alike; every
# figure is the median over the rounds (its runs in results.txt as KEY_runs). One run of each
# moved the rows across their targets from one bench to the next (ib_write_lat 1.70-2.33 of
# UDP's half round trip, the 64 KiB ping-pong 2.15-2.48, three benches of one commit within
# 20 minutes, 2026-12-02).
declare -A runs=() # KEY -> " value value ..." (a value may be a status such as "timeout")
keep() { # keep KEY VALUE: one run's figure (a status's spaces become "_": one word each)
  local v=${2:-failed}
  runs[$1]+=" ${v// /_}"
}
med() { median_of ${runs[$1]:-failed}; } # med KEY: the median of KEY's runs
put_runs() { put "$1" "$(med "$1")"; put "$1_runs" "$(echo ${runs[$1]:-} | tr ' ' ',')"; }
lat_keys=(t_min t_typical t_avg "99% percentile" "99.9% percentile")

# ibv_rc_pingpong: -m 4096 so that its packets match the baseline's 4112-byte segments.
rc_pair() { # rc_pair LABEL TIMEOUT FAULTS SIZE N [pair's device args...]: sets rc_us
  local label=$1 t=$2 faults=$3 size=$4 n=$5
  shift 5
  if [[ $# -gt 0 ]]; then
    pair "$label" "$t" "$faults" "$@" ibv_rc_pingpong -g 0 -m 4096 -s "$size" -n "$n"
  else
    lo_pair "$label" "$t" "$faults" ibv_rc_pingpong -g 0 -m 4096 -s "$size" -n "$n"
  fi
  if [[ $pair_rc != timeout && -n $(rc_usec "$out/$label.log") ]]; then
    # A lossy run whose teardown fails (a last ACK lost: docs/configuration.md) has still
    # measured its loop; status.txt keeps the failure.
    rc_us=$(rc_usec "$out/$label.log")
  else
    rc_us=$pair_rc
  fi
  [[ -n $rc_us ]] || rc_us="failed"
}

for ((r = 1; r <= lat_rounds; r++)); do
  note "bench: round $r of $lat_rounds: UDP round trips, ib_*_lat -s 8 -n $lat_n," \
    "UDP and ibv_rc_pingpong 64 KiB ping-pongs"
  base "rtt.r$r" 90 rtt --iters "$rtt_iters" --timeout 60
  for k in rtt_min_us rtt_p50_us rtt_p99_us rtt_p999_us half_rtt_p50_us; do
    keep "base_$k" "$(kv "$out/base-rtt.r$r.log" "$k")"
  done
  # 24 bytes: an 8-byte SEND on the wire (BTH 12, payload 8, ICRC 4).
  base "rtt-train.r$r" 90 rtt-train --size 24 --iters "$rtt_iters" --timeout 60
  keep base_rtt_train_half_p50_us "$(kv "$out/base-rtt-train.r$r.log" half_rtt_p50_us)"
  base "rtt-wake.r$r" 90 rtt-wake --iters "$rtt_iters" --timeout 60
  keep base_rtt_wake_half_p50_us "$(kv "$out/base-rtt-wake.r$r.log" half_rtt_p50_us)"
  for tool in ib_send_lat ib_write_lat ib_read_lat; do
    label=${tool#ib_}
    lo_pair "$label.r$r" "$tmo" "" "$tool" -x 0 -s 8 -n "$lat_n"
    for k in "${lat_keys[@]}"; do
      key=${k//% percentile/}
      if ((pair_ok)); then
        keep "${label}_${key//./}" "$(perf_col "$out/$label.r$r.log" "$k")"
      else
        keep "${label}_${key//./}" "$pair_rc"
      fi
    done
  done

  base "gso-pingpong.r$r" 90 gso-pingpong --iters "$gpp_iters" --timeout 60
  keep base_gso_pingpong_p50_us "$(kv "$out/base-gso-pingpong.r$r.log" iter_p50_us)"
  keep base_gso_pingpong_mean_us "$(kv "$out/base-gso-pingpong.r$r.log" iter_mean_us)"
  base "gso-pingpong-rc.r$r" 90 gso-pingpong-rc --iters "$gpp_iters" --timeout 60
  keep base_gso_pingpong_rc_p50_us "$(kv "$out/base-gso-pingpong-rc.r$r.log" iter_p50_us)"
  rc_pair "rc64k.r$r" "$tmo" "" 65536 "$rc_n"
  keep rc64k_usec_per_iter "$rc_us"
  if [[ -z $netns_reason ]]; then
    base "ns-gso-pingpong.r$r" 90 gso-pingpong --iters "$gpp_iters" --timeout 60 \
      --netns-a "$NSA" --netns-b "$NSB" --addr-a "$ns_ip_a" --addr-b "$ns_ip_b"
    keep base_ns_gso_pingpong_p50_us "$(kv "$out/base-ns-gso-pingpong.r$r.log" iter_p50_us)"
    rc_pair "rc64k-netns.r$r" "$tmo" "" 65536 "$rc_n" "$NA" "$NB" "$ns_ip_a" "$NSA" "$NSB"
    keep rc64k_netns_usec_per_iter "$rc_us"
  fi
done
for k in base_rtt_min_us base_rtt_p50_us base_rtt_p99_us base_rtt_p999_us \
  base_half_rtt_p50_us base_rtt_train_half_p50_us base_rtt_wake_half_p50_us \
  base_gso_pingpong_p50_us base_gso_pingpong_mean_us base_gso_pingpong_rc_p50_us \
  rc64k_usec_per_iter; do
  put_runs "$k"
done
if [[ -z $netns_reason ]]; then
  put_runs base_ns_gso_pingpong_p50_us
  put_runs rc64k_netns_usec_per_iter
fi
b_half=$(med base_half_rtt_p50_us)
b_rtt=$(med base_rtt_p50_us)
b_half_train=$(med base_rtt_train_half_p50_us)
b_half_wake=$(med base_rtt_wake_half_p50_us)

lat_rows() { # lat_rows TOOL TARGET: ib_*_lat 8 B: median against the half RTT, p99/median
  local tool=$1 tgt=$2 label=${1#ib_} k key med p99
  for k in "${lat_keys[@]}"; do
    key=${k//% percentile/}
    put_runs "${label}_${key//./}"
  done
  med=$(med "${label}_t_typical")
  p99=$(med "${label}_99")
  row "$tool -s 8 median (us)" "$med" "UDP half RTT p50" "$b_half" / "<=" "$tgt"
  # No target: against UDP sending what uroce sends each way between devices of one host,
  # the answer with the ACK behind it in one GSO train (a READ's response is its own
  # acknowledgement).
  [[ $tool == ib_read_lat ]] ||
    row "$tool -s 8 median (us)" "$med" "UDP half RTT, answer+ACK train" "$b_half_train" / "" ""
  # No target: perftest reports a READ's whole round trip (the others' half of one), and UDP
  # carries a request and its answer in one round trip too: the like-for-like figure.
  [[ $tool != ib_read_lat ]] ||
    row "$tool -s 8 median (us)" "$med" "UDP RTT p50" "$b_rtt" / "" ""
  # No target: against UDP whose receiving thread sleeps in recv while the application spins
  # on memory, as ib_write_lat's applications wait for the peer's WRITE: the wake-up a
  # provider outside the kernel cannot avoid there.
  [[ $tool != ib_write_lat ]] ||
    row "$tool -s 8 median (us)" "$med" "UDP half RTT, woken receiver" "$b_half_wake" / "" ""
  if [[ $tool != ib_send_lat ]]; then
    row "$tool -s 8 p99 (us)" "$p99" "its own median" "$med" / "<=" 5
  fi
}
lat_rows ib_send_lat 1.3
lat_rows ib_write_lat 2
lat_rows ib_read_lat 2

note "bench: ib_send_bw -q 4 -s 64 -n $rate_n"
lo_pair msgrate "$tmo" "" ib_send_bw -x 0 -q 4 -s 64 -n "$rate_n"
if ((pair_ok)); then mpps=$(perf_col "$out/msgrate.log" MsgRate); else mpps=$pair_rc; fi
put msgrate_Mpps "$mpps"
row "ib_send_bw -q 4 -s 64 (Mpps)" "$mpps" "UDP 64 B sendto pps" \
  "$(num "$b_pps" && fmt "%.4f" "$b_pps / 1e6")" / ">=" 0.7

rc_us=$(med rc64k_usec_per_iter)
row "ibv_rc_pingpong -s 65536, loopback (us/iter)" "$rc_us" "UDP GSO ping-pong p50" \
  "$(med base_gso_pingpong_p50_us)" / "<=" 2
# No target: ibv_rc_pingpong reports a mean (every iteration, the first ones included), the
# row above compares it with UDP's median; here with UDP's mean, outliers counted alike.
row "ibv_rc_pingpong -s 65536, loopback (us/iter)" "$rc_us" "UDP GSO ping-pong mean" \
  "$(med base_gso_pingpong_mean_us)" / "" ""
# No target: how much of the gap above is the per-byte work an RC SEND does in user space (a
# staging copy, the ICRC on both sides, the copy out) and its ACK, done by UDP itself.
row "ibv_rc_pingpong -s 65536, loopback (us/iter)" "$rc_us" "UDP GSO, copies, CRC, ACK" \
  "$(med base_gso_pingpong_rc_p50_us)" / "" ""
if [[ -z $netns_reason ]]; then
  row "ibv_rc_pingpong -s 65536, netns+veth (us/iter)" "$(med rc64k_netns_usec_per_iter)" \
    "UDP GSO ping-pong p50" "$(med base_ns_gso_pingpong_p50_us)" / "<=" 2
else
  text_row "ibv_rc_pingpong -s 65536, netns+veth (us/iter)" "n/a ($netns_reason)" \
    "UDP GSO ping-pong p50" "n/a"
fi

# ---- 3. under loss (UROCE_FAULTS on both sides) ----
note "bench: ibv_rc_pingpong -s 4096: lossless -n $rc4k_n, 1% and 5% loss -n $loss_rc_n"
rc_pair rc4k "$tmo" "" 4096 "$rc4k_n"
rc4k=$rc_us
put rc4k_usec_per_iter "$rc4k"
for pct in 1 5; do
  rc_pair "rc4k-drop$pct" "$loss_tmo" "drop=0.0$pct" 4096 "$loss_rc_n"
  put "rc4k_drop${pct}_usec_per_iter" "$rc_us"
  # Iterations per second lossy / lossless = lossless us per iteration / lossy us per iteration.
  row "ibv_rc_pingpong -s 4096, $pct% loss (us/iter)" "$rc_us" "lossless" "$rc4k" inv ">=" \
    "$([[ $pct == 1 ]] && echo 0.5 || echo 0.25)"
done

# ib_write_bw has the issue's targets; ib_read_bw's rows show how READ responses recover
# (no target of their own: the same ratios as a guide).
loss_bw() { # loss_bw TOOL LABEL FAULTS: sets lbw (GB/s or a status)
  lo_pair "$2" "$loss_tmo" "$3" "$1" -x 0 -s 65536 -n "$loss_bw_n"
  if ((pair_ok)); then
    lbw=$(gbs_of_mib "$(perf_col "$out/$2.log" "BW average")")
  else
    lbw=$pair_rc
  fi
}
for tool in ib_write_bw ib_read_bw; do
  label=${tool#ib_}
  note "bench: $tool -s 65536 -n $loss_bw_n: lossless, 1% and 5% loss, $loss_rounds rounds"
  # Each figure is the median of $loss_rounds runs, the three kinds interleaved so that the
  # VM's drift reaches all of them: one short lossless run alone moved between 1.9 and 3.9
  # GB/s from one bench to the next (2026-12-02), and the ratios with it.
  declare -A loss_runs=()
  for ((r = 1; r <= loss_rounds; r++)); do
    for kind in lossless drop1 drop5; do
      case $kind in
        lossless) faults="" ;;
        drop1) faults="drop=0.01" ;;
        drop5) faults="drop=0.05" ;;
      esac
      loss_bw "$tool" "$label-$kind.r$r" "$faults"
      loss_runs[$kind]+=" $lbw"
    done
  done
  for kind in lossless drop1 drop5; do
    put "${label}_${kind}_n${loss_bw_n}_runs_GBps" "$(echo ${loss_runs[$kind]} | tr ' ' ',')"
  done
  bw_lossless=$(median_of ${loss_runs[lossless]})
  put ${label}_lossless_n${loss_bw_n}_GBps "$bw_lossless"
  for pct in 1 5; do
    lbw=$(median_of ${loss_runs[drop$pct]})
    put "${label}_drop${pct}_GBps" "$lbw"
    op=">="
    [[ $tool == ib_write_bw ]] || op=""
    row "$tool -s 65536 -n $loss_bw_n, $pct% loss (GB/s)" "$lbw" "lossless, same -n" \
      "$bw_lossless" / "$op" "$([[ $pct == 1 ]] && echo 0.5 || echo 0.2)"
  done
  unset loss_runs
done
# ---- 4. many QPs in one process (tools/bench/many_qps.cpp) ----
mq_n=10000
note "bench: uroce-many-qps: $mq_n RC QPs on each of two contexts, a WRITE and a SEND on each"
mq_log=$out/many-qps.log
if timeout 300 "$uroce" run -- "$many_qps" --dev-a "$A" --dev-b "$B" --qps "$mq_n" --size 4096 \
  >"$mq_log" 2>"$out/many-qps.err"; then
  echo "many-qps: 0" >>"$out/status.txt"
else
  echo "many-qps: failed (rc=$?)" >>"$out/status.txt"
fi
mq_ok=$(kv "$mq_log" verified)
for k in verified heap_per_qp rss_per_qp heap_per_qp_after_traffic create_s connect_s write_s \
  send_s; do
  put "many_qps_$k" "$(kv "$mq_log" "$k")"
done
row "$((2 * mq_n)) RC QPs in one process: QPs whose data arrived intact" "${mq_ok:-failed}" \
  "QPs per context" "$mq_n" / ">=" 1
text_row "$((2 * mq_n)) RC QPs: heap / RSS bytes per QP (after traffic: heap)" \
  "$(kv "$mq_log" heap_per_qp) / $(kv "$mq_log" rss_per_qp) ($(kv "$mq_log" heap_per_qp_after_traffic))" \
  "-" "-"
text_row "$((2 * mq_n)) RC QPs: s to create / connect / WRITE all / SEND all" \
  "$(kv "$mq_log" create_s) / $(kv "$mq_log" connect_s) / $(kv "$mq_log" write_s) / $(kv "$mq_log" send_s)" \
  "-" "-"

# ---- 5. bandwidth against message size (plots only) ----
py=
for p in "${BENCH_PYTHON:-}" python3 /usr/bin/python3; do
  if [[ -n $p ]] && timeout 60 "$p" -c 'import matplotlib' >/dev/null 2>&1; then
    py=$p
    break
  fi
done
if [[ -n $py ]]; then
  for tool in ib_write_bw ib_read_bw ib_send_bw; do
    note "bench: $tool -a -n $sweep_n (2 B to 8 MiB, for the plot)"
    lo_pair "sweep-${tool#ib_}" 300 "" "$tool" -x 0 -a -n "$sweep_n"
  done
fi
idle_end=$(idle_pct)
steal_pct=$(awk -v a="$steal_start" -v b="$(steal_mark)" 'BEGIN {split(a, x, " "); split(b, y, " ");
  t = y[2] - x[2]; printf "%.1f", (t > 0 ? 100 * (y[1] - x[1]) / t : 0)}')

# ---- the table ----
header="uroce bench, $start_date, commit $commit, $( ((quick)) && echo quick || echo full) run; CPU idle in the second before: $idle_start%, after: $idle_end% ($(nproc) CPUs); CPU time taken by the host during the run (steal): $steal_pct%"
if ((idle_start < 80 || idle_end < 80)); then
  header="$header"$'\n'"WARNING: the machine was busy during this run (other processes): busy-polling figures suffer most; rerun on a quiet machine"
fi
if awk -v s="$steal_pct" 'BEGIN {exit !(s >= 5)}'; then
  header="$header"$'\n'"WARNING: the host took $steal_pct% of this VM's CPU time during the run (steal): uroce and its baselines lost CPU at different moments; rerun"
fi
cols=$'figure\turoce\tbaseline\tbaseline value\tratio\ttarget\tmet'
{
  echo "$header"
  echo
  { echo "$cols"; cat "$rows"; } | awk -F'\t' '
    { for (i = 1; i <= NF; i++) { c[NR, i] = $i; if (length($i) > w[i]) w[i] = length($i) } }
    END {
      for (r = 1; r <= NR; r++) {
        line = ""
        for (i = 1; i <= 7; i++) {
          f = (i == 1 || i == 3) ? "%-" w[i] "s" : "%" w[i] "s"
          line = line (i > 1 ? "  " : "") sprintf(f, c[r, i])
        }
        print line
        if (r == 1) { s = ""; for (i = 1; i <= 7; i++) s = s (i > 1 ? "  " : "") sprintf("%" w[i] "s", ""); gsub(/ /, "-", s); print s }
      }
    }'
  echo
  printf 'baseline: UDP GSO+GRO %s GB/s (loss %s%%, %s CPU s/GB; in WRITE'"'"'s trains %s GB/s, with copies and CRC %s; GSO+GRO with copies and CRC %s); ' \
    "$(gbs_of_bytes "$b_gso")" "$(kv "$out/base-gso.log" loss_pct)" "$b_gso_cpu" \
    "$(gbs_of_bytes "$b_gsow")" "$(gbs_of_bytes "$b_gsowrc")" "$(gbs_of_bytes "$b_gsorc")"
  printf 'again before each bandwidth row (its ratios use it): %s GB/s; ' "$row_baselines"
  printf 'UDP sendto 4096 B %s GB/s; ' "$(gbs_of_bytes "$(kv "$out/base-sendto.log" goodput_Bps)")"
  printf 'UDP 64 B %s pps; TCP %s GB/s (%s CPU s/GB); UDP RTT 8 B p50 %s us, p99 %s us\n' \
    "$b_pps" "$(gbs_of_bytes "$b_tcp")" "$(kv "$out/base-tcp.log" cpu_s_per_gb)" \
    "$b_rtt" "$(med base_rtt_p99_us)"
  echo "GB = 10^9 bytes (perftest's MB/sec are MiB/s and are converted). Ratios compare figures of this run only."
} >"$out/table.txt"
cat "$out/table.txt"

{
  echo "$header"
  echo
  echo "| figure | uroce | baseline | baseline value | ratio | target | met |"
  echo "|---|---:|---|---:|---:|---:|---|"
  awk -F'\t' '{printf "| %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7}' "$rows"
  echo
  tail -n 2 "$out/table.txt"
} >"$out/table.md"

if [[ -n $py ]]; then
  if timeout 120 "$py" "$top/tools/bench/plot.py" "$out"; then
    pngs=("$out"/*.png)
    echo "plots: ${pngs[*]##*/} (in $out)"
  else
    echo "plots: tools/bench/plot.py failed"
  fi
else
  echo "plots skipped: python3 has no matplotlib (apt-get install python3-matplotlib, then rerun)"
fi
echo "table: $out/table.md; raw logs: $out/"
