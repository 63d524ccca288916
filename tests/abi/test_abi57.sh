#!/usr/bin/env bash
# The two builds against the two private ABIs:
#   test_abi57.sh PROVIDER34.so PROVIDER57.so DLOPEN_MODULE ABI57_CHECK STUB57_DIR
# liburoce-rdmav57.so must import only IBVERBS_PRIVATE_57 and work against a v57-style
# libibverbs (abi57_check); each build must be refused by the other ABI's libibverbs.
set -uo pipefail
p34=$(readlink -f "$1") p57=$(readlink -f "$2") dlopen_module=$3 check57=$4 stub57_dir=$5
passed=0 failed=0
ok() { echo "ok - $1"; passed=$((passed + 1)); }
not_ok() { echo "not ok - $1"; shift; for l in "$@"; do echo "    $l"; done; failed=$((failed + 1)); }
# The libibverbs imports of a provider, as name@version.
imports() { nm -D --undefined-only "$1" | awk '{print $2}' | grep -E '@IBVERBS_' | sort; }

i34=$(imports "$p34") i57=$(imports "$p57")
if [[ -n $i57 && $(sed 's/_34\b/_57/g; s/PRIVATE_34$/PRIVATE_57/' <<<"$i34") == "$i57" ]]; then
    ok "the v57 build imports what the v34 build does, under IBVERBS_PRIVATE_57 ($(wc -l <<<"$i57") symbols)"
else
    not_ok "the v57 build imports what the v34 build does, under IBVERBS_PRIVATE_57" "v34: $(tr '\n' ' ' <<<"$i34")" "v57: $(tr '\n' ' ' <<<"$i57")"
fi
if grep -q 'PRIVATE_34' <<<"$i57"; then
    not_ok "the v57 build imports nothing from IBVERBS_PRIVATE_34" "$(grep PRIVATE_34 <<<"$i57")"
else
    ok "the v57 build imports nothing from IBVERBS_PRIVATE_34"
fi

# Against a libibverbs exporting IBVERBS_PRIVATE_57: registers, and the layout holds.
out=$(LD_LIBRARY_PATH=$stub57_dir "$check57" "$p57" 2>&1)
rc=$?
if [[ $rc -eq 0 ]]; then
    ok "the v57 build against a v57-style libibverbs: $(grep -c '^ok' <<<"$out") checks of registration, layout and ops"
else
    not_ok "the v57 build against a v57-style libibverbs (abi57_check, exit $rc)" "${out//$'\n'/$'\n    '}"
fi

# Each build, the other ABI's libibverbs: refused by the loader, naming the missing version.
refused() {  # refused WHAT MODULE LD_LIBRARY_PATH VERSION
    local out rc
    if [[ -n $3 ]]; then out=$(LD_LIBRARY_PATH=$3 "$dlopen_module" "$2" 2>&1); else out=$(env -u LD_LIBRARY_PATH "$dlopen_module" "$2" 2>&1); fi
    rc=$?
    if [[ $rc -eq 1 && $out == *"$4"*"not found"* ]]; then
        ok "$1: $out"
    else
        not_ok "$1 (exit 1, message naming $4)" "exit $rc: $out"
    fi
}
refused "a v57-style libibverbs refuses the v34 build" "$p34" "$stub57_dir" IBVERBS_PRIVATE_34
refused "the system's libibverbs (ABI 34) refuses the v57 build" "$p57" "" IBVERBS_PRIVATE_57
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
