#!/usr/bin/env python3
"""Sums up meson's test logs for tools/test.sh: every skip listed, the closing line counted.

    results.py ALLOWED_SKIPS TESTLOG.json...

A skip is a test meson reports as SKIP (exit 77) or a "skip - WHAT" line in the output of a
test (part of it not run: meson still says OK). With CI=true, a skip that no line of
ALLOWED_SKIPS (TEST | WHAT-glob | REASON) allows counts as a failure. The last line is
"N passed, N failed, N skipped": passed and failed count tests, skipped counts skips (whole
tests and skipped parts). Exit 1 if anything failed.
"""
import fnmatch
import json
import os
import sys

SKIP_PREFIX = "skip - "
FAILING = {"FAIL", "ERROR", "TIMEOUT", "UNEXPECTEDPASS", "INTERRUPT"}


def read_allowed(path):
    allowed, problems = [], []
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError as e:
        return [], [f"cannot read {path}: {e.strerror}"]
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = [p.strip() for p in line.split("|")]
        if len(parts) != 3 or not all(parts):
            problems.append(f"{path}:{n}: want 'TEST | WHAT | REASON', got: {line}")
            continue
        allowed.append(tuple(parts))
    return allowed, problems


def skips_of(result):
    """The skips one test reported: its "skip - " lines; a whole-test skip has at least one."""
    out = result.get("stdout") or ""
    whats = [l[len(SKIP_PREFIX):].strip() for l in out.splitlines() if l.startswith(SKIP_PREFIX)]
    if result.get("result") == "SKIP" and not whats:
        whats = ["(whole test, no reason given)"]
    return whats


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    in_ci = os.environ.get("CI", "").lower() == "true"
    allowed, problems = read_allowed(argv[1])
    passed = failed = skipped = 0
    refused = []
    for path in argv[2:]:
        try:
            lines = open(path, encoding="utf-8").read().splitlines()
        except OSError:
            continue
        for line in lines:
            r = json.loads(line)
            name, result = r.get("name", "?"), r.get("result", "")
            if result == "OK" or result == "EXPECTEDFAIL":
                passed += 1
            elif result != "SKIP":
                failed += 1
            for what in skips_of(r):
                reason = next((why for test, glob, why in allowed
                               if test == name and fnmatch.fnmatchcase(what, glob)), None)
                if reason is not None:
                    print(f"skip: {name}: {what} (allowed: {reason})")
                    skipped += 1
                elif in_ci:
                    print(f"skip not allowed in CI: {name}: {what}")
                    refused.append(name)
                else:
                    print(f"skip: {name}: {what}")
                    skipped += 1
    for p in problems:
        print(f"bad allowed-skips entry: {p}")
    if refused:
        print(f"CI=true: {len(refused)} skip(s) not in {argv[1]} count as failures")
    failed += len(refused) + len(problems)
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
