#!/usr/bin/env bash
# Applies named source mutations one at a time to a scratch copy and checks that the test
# suite catches each one (see tools/mutants.py). Slow (a rebuild and a test run per mutant):
# not part of CI. Prints one line per mutant and "N killed, M survived".
set -euo pipefail
exec python3 "$(dirname "$0")/mutants.py" "$@"
