#!/usr/bin/env python3
"""Sums up meson's test logs for tools/test.sh: every skip listed, the closing line counted.

    results.py ALLOWED_SKIPS TESTLOG.json...

A skip is a test meson reports as SKIP (exit 77) or a "skip - WHAT" line in the output of a
test (part of it not run: meson still says OK). With CI=true, a skip that no line of
ALLOWED_SKIPS (TEST | WHAT-glob | REASON) allows counts as a failure. The last line is
"N passed, N failed, N skipped": passed and failed count tests, skipped counts skips (whole
tests and skipped parts). Exit 1 if anything failed.

Before that line, each failed test gets a short digest: its "not ok" lines with the indented
detail under them, or the tail of its output. CI shows only part of a long log; the digest
keeps what failed next to the verdict.
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


def digest(result, max_lines=40):
    """What to show of a failed test: its "not ok" blocks, else its last lines."""
    out = ((result.get("stdout") or "") + "\n" + (result.get("stderr") or "")).splitlines()
    shown, in_block = [], False
    for line in out:
        if line.startswith("not ok"):
            in_block = True
            shown.append(line)
        elif in_block and line.startswith((" ", "\t")):
            shown.append(line)
        else:
            in_block = False
    if not shown:
        shown = [l for l in out if l.strip()][-15:]
    if len(shown) > max_lines:
        shown = shown[:max_lines] + [f"... ({len(shown) - max_lines} more lines)"]
    return shown


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    in_ci = os.environ.get("CI", "").lower() == "true"
    allowed, problems = read_allowed(argv[1])
    passed = failed = skipped = 0
    refused, failures = [], []
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
                failures.append((name, result, digest(r)))
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
    for name, result, lines in failures:
        print(f"== {result}: {name}")
        for line in lines:
            print(f"  {line}")
    for p in problems:
        print(f"bad allowed-skips entry: {p}")
    if refused:
        print(f"CI=true: {len(refused)} skip(s) not in {argv[1]} count as failures")
    failed += len(refused) + len(problems)
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
