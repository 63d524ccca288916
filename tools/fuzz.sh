#!/usr/bin/env bash
# The long fuzzing run: builds the libFuzzer harness with clang, ASan and UBSan in build-fuzz/
# and feeds it 10 million inputs (or RUNS), starting from the committed seeds. Prints the figures
# (executions per second, coverage, corpus size, crashes). New inputs and crashes stay in
# build-fuzz/fuzz-long/.
# usage: tools/fuzz.sh [RUNS] [more libFuzzer options...]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-10000000}
shift || true
build="$top/build-fuzz"
[[ -f "$build/build.ninja" ]] ||
  CXX=clang++ meson setup "$build" "$top" -Dfuzz=true -Db_sanitize=address,undefined \
    -Db_lundef=false >/dev/null
ninja -C "$build" tools/fuzz/fuzz_receive >/dev/null
work="$build/fuzz-long"
start=$(date +%s)
status=0
"$top/tools/fuzz/run.sh" "$build/tools/fuzz/fuzz_receive" "$top/tools/fuzz/corpus" "$work" \
  -runs="$runs" "$@" || status=$?
echo "fuzz: $(($(date +%s) - start)) s, corpus $(ls "$work/corpus" | wc -l) new inputs," \
  "$(ls "$work/artifacts" | wc -l) crash/leak/timeout artifacts in $work/artifacts"
exit $status
