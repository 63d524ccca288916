#!/usr/bin/env bash
# Runs rdma-core's own conformance suite (the tests/ folder of rdma-core v44.0, as Debian 12's
# python3-pyverbs ships it under /usr/share/doc/rdma-core/tests) unmodified against a uroce
# device, and prints its verdict: passed, failed, errors, skipped, and every test that did not
# pass with its first line of reason.
#
#   tools/rdma-core-tests.sh [BUILD_DIR] [-- extra run_tests.py arguments, e.g. -k test_qp]
#
# Needs root (uroce add; apt-get for python3-pyverbs if missing). Not part of CI: the figures
# go into the notes of the device-sharing and verbs-completeness issues.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=$(readlink -f "${1:-$top/build}")
[[ $# -gt 0 ]] && shift
[[ ${1:-} == -- ]] && shift
uroce=$build/tools/uroce
[[ -x $uroce ]] || { echo "rdma-core-tests: build first ($uroce missing)" >&2; exit 2; }

want=44.0-2
have=$(dpkg-query -W -f='${Version}' python3-pyverbs 2>/dev/null || true)
if [[ $have != "$want" ]]; then
  echo "rdma-core-tests: installing python3-pyverbs $want (have: ${have:-none})"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "python3-pyverbs=$want" >/dev/null
fi
src=/usr/share/doc/rdma-core/tests
[[ -f $src/run_tests.py ]] || { echo "rdma-core-tests: $src/run_tests.py missing" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/uroce-rdma-core-tests.XXXXXX")
export UROCE_ROOT=$work/root
dev=rct$$
# Three tests (ODP and parent domain traffic on huge pages) need 2 MiB huge pages and skip
# without them: reserve a few for the run if none are, and give them back after.
hugepages=/proc/sys/vm/nr_hugepages
huge_before=$(cat "$hugepages" 2>/dev/null || echo)
cleanup() {
  "$uroce" del "$dev" >/dev/null 2>&1 || true
  rm -rf "$work"
  if [[ $huge_before == 0 ]]; then echo 0 >"$hugepages" 2>/dev/null || true; fi
}
trap cleanup EXIT
if [[ $huge_before == 0 ]]; then
  echo 64 >"$hugepages" 2>/dev/null || true
  echo "rdma-core-tests: reserved $(cat "$hugepages") huge pages of 2 MiB for the run (back to 0 after)"
fi
# Debian compresses the larger modules; the suite wants them as plain .py files.
cp -r "$src" "$work/tests"
find "$work/tests" -name '*.gz' -exec gunzip -f {} +
"$uroce" add "$dev" --ip 127.0.99.1 --mtu 1024 >/dev/null

cd "$work/tests"
set +e
timeout -k 10 1800 "$uroce" run -- /usr/bin/python3 run_tests.py --dev "$dev" --gid 0 -v "$@" \
  >"$work/out.txt" 2>&1 </dev/null
rc=$?
set -e
/usr/bin/python3 - "$work/out.txt" <<'PY'
import collections, re, sys
text = open(sys.argv[1], errors="replace").read()
# unittest -v ends each result line with "... ok", "... skipped 'why'", "... ERROR", "... FAIL".
verdicts = re.findall(r"\.\.\. (ok|ERROR|FAIL|skipped '(.*)'|expected failure|unexpected success)$",
                      text, re.M)
skips = collections.Counter(why for v, why in verdicts if v.startswith("skipped"))
print("== skipped, by reason")
for why, n in skips.most_common():
    print(f"{n:5d}  {why}")
print("== errors and failures, with the last line of each traceback")
for block in re.split(r"^={50,}$", text, flags=re.M)[1:]:
    lines = [l for l in block.strip().splitlines() if l.strip() and not l.startswith("---")]
    if lines and re.match(r"(ERROR|FAIL):", lines[0]):
        print(lines[0] + "\n      " + lines[-1].strip())
ran = re.search(r"^Ran (\d+) tests?", text, re.M)
summary = re.search(r"^(OK|FAILED)(?: \((.*)\))?$", text, re.M)
counts = dict(kv.split("=") for kv in (summary.group(2) or "").split(", ") if "=" in kv) if summary else {}
total = int(ran.group(1)) if ran else 0
errors, failures, skipped = (int(counts.get(k, 0)) for k in ("errors", "failures", "skipped"))
passed = total - errors - failures - skipped - int(counts.get("expected_failures", 0))
print(f"== rdma-core v44 tests on uroce: {passed} passed, {failures} failed, {errors} errors, "
      f"{skipped} skipped (of {total})")
PY
tail -3 "$work/out.txt"
cp "$work/out.txt" "$build/rdma-core-tests.log"
echo "rdma-core-tests: full output in $build/rdma-core-tests.log"
echo "rdma-core-tests: exit $rc"
