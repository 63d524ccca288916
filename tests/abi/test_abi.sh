#!/usr/bin/env bash
# The provider's libibverbs requirements, read from the binary and tried on the loader:
#   test_abi.sh PROVIDER.so DLOPEN_MODULE STUB_LIBIBVERBS_DIR
# A libibverbs older than v36 has the same private ABI name but a shorter ops table; the
# provider must be refused there rather than have its ops called through the wrong slots.
set -uo pipefail
provider=$(readlink -f "$1") dlopen_module=$2 stub_dir=$3
passed=0 failed=0
ok() { echo "ok - $1"; passed=$((passed + 1)); }
not_ok() { echo "not ok - $1"; shift; for l in "$@"; do echo "    $l"; done; failed=$((failed + 1)); }

needs=$(readelf -V "$provider" | awk '/File: libibverbs.so.1/ {f = 1; next} /File:/ {f = 0} f && /Name:/ {print $3}' | sort | tr '\n' ' ')
for v in IBVERBS_PRIVATE_34 IBVERBS_1.14; do
    if [[ " $needs" == *" $v "* ]]; then
        ok "the provider requires $v of libibverbs.so.1"
    else
        not_ok "the provider requires $v of libibverbs.so.1" "needs: $needs"
    fi
done
undefined=$(nm -D --undefined-only "$provider" | awk '{print $2}')
if grep -qx 'verbs_register_driver_34@IBVERBS_PRIVATE_34' <<<"$undefined"; then
    ok "the provider registers through verbs_register_driver_34 (ABI 57 and later lack it)"
else
    not_ok "the provider registers through verbs_register_driver_34" "$(grep -i register <<<"$undefined")"
fi

# The system's libibverbs (v44): loads. (meson puts the stub's folder on LD_LIBRARY_PATH
# because the test depends on it: take it away here.)
out=$(env -u LD_LIBRARY_PATH "$dlopen_module" "$provider" 2>&1)
if [[ $? -eq 0 && $out == loaded ]]; then
    ok "the system's libibverbs: the provider loads"
else
    not_ok "the system's libibverbs: the provider loads" "$out"
fi
# A libibverbs with v35's symbol versions: refused, and the message names the missing version.
out=$(LD_LIBRARY_PATH=$stub_dir "$dlopen_module" "$provider" 2>&1)
rc=$?
if [[ $rc -eq 1 && $out == *"IBVERBS_1.14"*"not found"* || $rc -eq 1 && $out == *"version"*"IBVERBS_1.14"* ]]; then
    ok "a v35-style libibverbs refuses the provider: $out"
else
    not_ok "a v35-style libibverbs refuses the provider (exit 1, message naming IBVERBS_1.14)" "exit $rc: $out"
fi
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
