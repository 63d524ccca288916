#!/usr/bin/env bash
# The whole test suite: install, build (normal, ASan+UBSan, ThreadSanitizer for the tests with
# threads, and clang and -O3 as compile checks), run every test.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/tools/setup.sh"
jobs=$(nproc)

echo "== build"
[[ -f "$top/build/build.ninja" ]] || meson setup "$top/build" "$top" >/dev/null
ninja -C "$top/build" >/dev/null
echo "== build with AddressSanitizer and UndefinedBehaviorSanitizer"
[[ -f "$top/build-asan/build.ninja" ]] ||
  meson setup "$top/build-asan" "$top" -Db_sanitize=address,undefined -Db_lundef=false \
    -Dbuildtype=debug >/dev/null
ninja -C "$top/build-asan" >/dev/null
# A second compiler, build only: clang's warnings (errors here too) catch what g++ lets pass.
echo "== build with clang (compile check)"
[[ -f "$top/build-clang/build.ninja" ]] || CXX=clang++ meson setup "$top/build-clang" "$top" >/dev/null
ninja -C "$top/build-clang" >/dev/null
# ThreadSanitizer, for the tests whose code runs threads (the engine with its pollers, posts
# and timers; completion channels; the provider's contexts, shared devices and RDMA CM in the
# integration tests): ordering bugs rarely show in a run, races do. Only those targets are
# built. tests/tsan.supp lists what is shared on purpose, and why.
echo "== build with ThreadSanitizer (tests with threads)"
[[ -f "$top/build-tsan/build.ninja" ]] ||
  meson setup "$top/build-tsan" "$top" -Db_sanitize=thread -Db_lundef=false >/dev/null
tsan_tests=(transport transport-scheduling comp_channel comp_channel_unhooked integration)
ninja -C "$top/build-tsan" tests/unit/transport/test_transport \
  tests/unit/comp_channel/test_comp_channel tests/unit/comp_channel/test_comp_channel_unhooked \
  tests/integration/test_integration tools/uroce provider/liburoce-rdmav34.so >/dev/null
# GCC at -O3 (buildtype release): some warnings come only from its optimizer's flow
# analysis (-Wstringop-overflow, -Wmaybe-uninitialized), and a user's release build must
# compile too.
echo "== build with -O3 (compile check)"
[[ -f "$top/build-release/build.ninja" ]] ||
  meson setup "$top/build-release" "$top" --buildtype=release >/dev/null
ninja -C "$top/build-release" >/dev/null

status=0
echo "== tests"
meson test -C "$top/build" --num-processes "$jobs" --print-errorlogs || status=1
echo "== tests under ASan/UBSan (unit, cli, integration)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  meson test -C "$top/build-asan" --suite unit --suite cli --suite integration \
    --num-processes "$jobs" --print-errorlogs || status=1

echo "== tests under ThreadSanitizer (${tsan_tests[*]})"
# history_size=7: both stacks of a race restored, which the suppressions match against.
TSAN_OPTIONS="suppressions=$top/tests/tsan.supp history_size=7 second_deadlock_stack=1" \
  meson test -C "$top/build-tsan" --no-rebuild "${tsan_tests[@]}" --timeout-multiplier 2 \
    --num-processes "$jobs" --print-errorlogs || status=1

# A 60 s libFuzzer run of the receive path (clang, ASan+UBSan; tools/fuzz/).
echo "== fuzz (receive path, 60 s)"
[[ -f "$top/build-fuzz/build.ninja" ]] ||
  CXX=clang++ meson setup "$top/build-fuzz" "$top" -Dfuzz=true \
    -Db_sanitize=address,undefined -Db_lundef=false >/dev/null
ninja -C "$top/build-fuzz" tools/fuzz/fuzz_receive >/dev/null
meson test -C "$top/build-fuzz" --suite fuzz --no-rebuild --print-errorlogs || status=1

# Every skip listed; in CI (CI=true) a skip not in tests/allowed-skips.txt is a failure.
# The closing line "N passed, N failed, N skipped" counts every test log.
python3 "$top/tests/results.py" "$top/tests/allowed-skips.txt" \
  "$top/build/meson-logs/testlog.json" "$top/build-asan/meson-logs/testlog.json" \
  "$top/build-tsan/meson-logs/testlog.json" "$top/build-fuzz/meson-logs/testlog.json" || status=1
exit $status
