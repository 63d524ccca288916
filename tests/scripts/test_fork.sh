#!/usr/bin/env bash
# fork() with Debian's pyverbs and Python's multiprocessing (fork_pyverbs.py): children that
# close or try their inherited verbs objects, a child with a context of its own, the parent
# going on with verified traffic.
#
#   test_fork.sh PATH_TO_UROCE
#
# Needs root (uroce add makes /dev/infiniband nodes) and python3-pyverbs (tools/setup.sh
# installs it). Last line: "N passed, M failed"; exit 1 if M > 0.
set -u
# shellcheck source=lib.sh
source "$(dirname "$(readlink -f "$0")")/lib.sh"
lib_init "$1"
SCRIPT="$(dirname "$(readlink -f "$0")")/fork_pyverbs.py"
PYTHON=/usr/bin/python3  # Debian's, where python3-pyverbs lives

require_root "fork with pyverbs"
if ! "$PYTHON" -c "import pyverbs.device" 2>/dev/null; then
    not_ok "python3-pyverbs is installed" "run tools/setup.sh"
    finish
fi
OCT=$(pick_octet 91) || echo "# warning: every 127.0.91..110.* block has UDP sockets; using 127.0.$OCT"
DEV="frk$$"
add_device "$DEV" "127.0.$OCT.1" || finish

OUT="$WORK/fork.out"
timeout -k 5 240 "$UROCE" run -- "$PYTHON" "$SCRIPT" "$DEV" >"$OUT" 2>"$WORK/fork.err"
rc=$?
while IFS= read -r line; do
    case $line in
        "ok - "*) ok "${line#ok - }" ;;
        "not ok - "*) not_ok "${line#not ok - }" ;;
    esac
done <"$OUT"
expect_file_match "fork_pyverbs.py ran to its end" "^5 passed, 0 failed$" "$OUT"
expect_eq "fork_pyverbs.py exit status" 0 "$rc"
if [[ $rc -ne 0 ]]; then sed 's/^/#   /' "$WORK/fork.err" | tail -20; fi
finish
