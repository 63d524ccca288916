#!/usr/bin/env bash
# Runs a libFuzzer harness over the committed seeds and prints the run's figures.
# usage: run.sh HARNESS SEED_DIR WORK_DIR [libFuzzer options...]
# New inputs go to WORK_DIR (never into the source tree); a crash leaves its input in
# WORK_DIR/crash-* and makes this script fail.
set -euo pipefail
harness=$1 seeds=$2 work=$3
shift 3
mkdir -p "$work/corpus" "$work/artifacts"
log="$work/fuzz.log"
status=0
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1} \
  "$harness" -max_len=8192 -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
    "$@" "$work/corpus" "$seeds" >"$log" 2>&1 || status=$?
# The figures: the last status line (execs, coverage, features, corpus) and the final stats.
grep -E '^#[0-9]+' "$log" | tail -n 1 || true
grep -E '^stat::' "$log" || true
if ((status != 0)); then
  echo "fuzz: the harness failed (exit $status); log: $log" >&2
  grep -E -A40 'ERROR|invariant violated|runtime error' "$log" | head -n 80 >&2 || true
  ls "$work/artifacts" >&2
fi
exit $status
