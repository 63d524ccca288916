#!/usr/bin/env python3
"""Mutation check: does the test suite notice when a safety check is removed?

Each mutant below names one source change that breaks a behaviour users rely on (a key
check, a bounds check, a PSN rule, a timer). The script copies the repository to a scratch
directory, builds it once, then for each mutant: applies the change, rebuilds, runs the
tests that should catch it, and restores the file. A mutant is *killed* when a test fails
(or times out), *survived* when every test passes, *stale* when its source text is no longer
found (the list must follow the code), and *unbuildable* when the mutated tree does not
compile (the mutant is then useless and must be rewritten).

Usage: tools/mutants.sh [NAME_SUBSTRING ...]   (run as root: the integration tests need it)
Exit status: 0 only if every selected mutant was killed.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Mutant:
    name: str
    file: str
    find: str  # exact text, must occur exactly once
    replace: str
    tests: tuple  # keys of TESTS


# Test commands, run from the scratch build directory.
TESTS = {
    "transport": ["tests/unit/transport/test_transport"],
    "wire": ["tests/unit/wire/test_wire"],
    "integration": ["meson", "test", "--no-rebuild", "--suite", "integration"],
}

MUTANTS = [
    # --- memory keys and bounds (transport/memory_table.cpp) ---
    Mutant("memory: no protection-domain check", "transport/memory_table.cpp",
           "if (r->pd != pd) return KeyCheck::WrongPd;",
           "if (r->pd != pd && false) return KeyCheck::WrongPd;", ("transport",)),
    Mutant("memory: no upper bounds check", "transport/memory_table.cpp",
           "length > r->length || addr - base > r->length - length", "false",
           ("transport",)),
    Mutant("memory: no lower bounds check", "transport/memory_table.cpp",
           "if (addr < base ||", "if (", ("transport",)),
    Mutant("memory: no access-rights check", "transport/memory_table.cpp",
           "if ((r->access & access) != access) return KeyCheck::NoAccess;",
           "if ((r->access & access) != access && false) return KeyCheck::NoAccess;",
           ("transport",)),
    # --- receive filters (transport/engine.cpp, rc_qp.cpp) ---
    Mutant("filter: bad ICRC accepted", "transport/engine.cpp",
           "bump(counters_.rx_bad_icrc);\n            return nullptr;",
           "bump(counters_.rx_bad_icrc);\n            break;", ("transport",)),
    Mutant("filter: ICRC with unseen IP fields refused", "transport/engine.cpp",
           "bump(counters_.rx_icrc_unseen_fields);\n            break;",
           "bump(counters_.rx_icrc_unseen_fields);\n            return nullptr;",
           ("transport",)),
    Mutant("filter: P_Key not checked", "transport/engine.cpp",
           "if ((pkt.h.bth.pkey & 0x7fff) != 0x7fff) {", "if (false) {", ("transport",)),
    Mutant("filter: peer address not checked", "transport/rc_qp.cpp",
           "if (src_ip != attrs_.dst_ip) {", "if (false) {", ("transport",)),
    # --- responder (transport/rc_responder.cpp) ---
    Mutant("responder: duplicate requests executed again", "transport/rc_responder.cpp",
           "if (d < 0) {", "if (d < -1000000) {", ("transport",)),
    Mutant("responder: out-of-sequence requests executed", "transport/rc_responder.cpp",
           "if (d > 0) {", "if (d > 1000000) {", ("transport",)),
    Mutant("responder: WRITE without QP remote-write right", "transport/rc_responder.cpp",
           "if (!(attrs_.access & kRemoteWrite)) {", "if (false) {", ("transport",)),
    Mutant("responder: READ without QP remote-read right", "transport/rc_responder.cpp",
           "    if (!(attrs_.access & kRemoteRead)) {\n        responder_error",
           "    if (false) {\n        responder_error", ("transport",)),
    Mutant("responder: READ whole-range check removed", "transport/rc_responder.cpp",
           "if (engine_.memory().check_remote(reth.rkey, pd_, reth.va, reth.dma_len, kRemoteRead,",
           "if (false && engine_.memory().check_remote(reth.rkey, pd_, reth.va, reth.dma_len, kRemoteRead,",
           ("transport",)),
    Mutant("responder: WRITE whole-range check removed", "transport/rc_responder.cpp",
           "if (engine_.memory().check_remote(reth.rkey, pd_, reth.va, reth.dma_len,\n                                                  kRemoteWrite",
           "if (false && engine_.memory().check_remote(reth.rkey, pd_, reth.va, reth.dma_len,\n                                                  kRemoteWrite",
           ("transport",)),
    Mutant("responder: pad count not checked", "transport/rc_responder.cpp",
           "if ((len + pkt.h.bth.pad) % 4 != 0) return false;", "", ("transport",)),
    Mutant("responder: First/Middle length not checked", "transport/rc_responder.cpp",
           "if (!ends) return len == mtu;", "if (!ends) return true;", ("transport",)),
    Mutant("responder: Only/Last longer than the MTU accepted", "transport/rc_responder.cpp",
           "if (len > mtu) return false;", "", ("transport",)),
    Mutant("responder: READ RETH length above 2^31 accepted", "transport/rc_responder.cpp",
           "    const uint32_t psn = pkt.h.bth.psn;\n    if (reth.dma_len > kMaxMessageBytes) {",
           "    const uint32_t psn = pkt.h.bth.psn;\n    if (false) {", ("transport",)),
    Mutant("responder: WRITE RETH length above 2^31 accepted", "transport/rc_responder.cpp",
           "            if (reth.dma_len > kMaxMessageBytes) {", "            if (false) {",
           ("transport",)),
    Mutant("responder: coalesced ACK names epsn-1 (inside a READ range)",
           "transport/rc_responder.cpp", "h.bth.psn = ack_psn_;",
           "h.bth.psn = psn_add(epsn_, kPsnMask);", ("transport",)),
    # --- data-safety fixes of the requester (transport/rc_completer.cpp) ---
    Mutant("completer: responses outside the PSN window accepted", "transport/rc_completer.cpp",
           "if (!response_in_window(pkt.h.bth.psn)) {", "if (false) {", ("transport",)),
    Mutant("completer: READ response for a non-READ PSN accepted", "transport/rc_completer.cpp",
           "if (!answered || answered->wqe.opcode != SendOpcode::RdmaRead) {", "if (!answered) {",
           ("transport",)),
    Mutant("completer: sequence NAK does not restart the timer", "transport/rc_completer.cpp",
           "rewind_to(psn);\n                    // The peer is alive and waiting for the resent packets: give them a\n                    // whole timeout from now.\n                    restart_timer();",
           "rewind_to(psn);", ("transport",)),
    Mutant("completer: fatal NAK charged to the head request", "transport/rc_completer.cpp",
           "SqEntry* failed = entry_for_psn(psn);", "SqEntry* failed = &sq_.front();",
           ("transport",)),
    # --- object lifetime (transport/rc_qp.cpp, provider/qp.cpp) ---
    Mutant("lifetime: close does not wait for the timer callback", "transport/rc_qp.cpp",
           "    if (timer_) event_del_block(timer_);\n", "", ("transport",)),
    Mutant("lifetime: destroy_qp does not take back unread events", "provider/qp.cpp",
           "st->async_events.retract(reinterpret_cast<uint64_t>(ibqp), &qp->events);", "",
           ("integration",)),
    # --- requester / completer (transport/rc_completer.cpp, rc_requester.cpp) ---
    Mutant("completer: retry count never exhausted", "transport/rc_completer.cpp",
           "if (retries_left_-- <= 0) {", "if (false) {", ("transport",)),
    Mutant("completer: RNR retry count never exhausted", "transport/rc_completer.cpp",
           "rnr_retries_left_-- <= 0", "false", ("transport",)),
    Mutant("completer: ACK timeout 16x shorter", "transport/rc_completer.cpp",
           "start_timer((4096ull << attrs_.timeout) / 1000);",
           "start_timer((256ull << attrs_.timeout) / 1000);", ("transport",)),
    Mutant("completer: READ response length not checked", "transport/rc_completer.cpp",
           "if (!sequence_ok || !length_ok) {", "if (!sequence_ok) {", ("transport",)),
    Mutant("completer: READ response opcode sequence not checked", "transport/rc_completer.cpp",
           "if (!sequence_ok || !length_ok) {", "if (!length_ok) {", ("transport",)),
    Mutant("requester: local key not checked before sending", "transport/rc_requester.cpp",
           "if (mem.check_local(s.lkey, pd_, s.addr + skip, take, 0) != KeyCheck::Ok) return false;",
           "", ("transport",)),
    Mutant("requester: READ target not checked for local write", "transport/rc_requester.cpp",
           "KeyCheck::Ok)\n                return false;", "KeyCheck::Ok) {}",
           ("transport",)),
    # --- PSN arithmetic (transport/psn.h) ---
    Mutant("psn: no wrap at 2^24", "transport/psn.h",
           "return (psn + n) & kPsnMask;", "return psn + n;", ("transport",)),
]


def run(cmd, cwd, timeout):
    try:
        r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=timeout)
        return r.returncode
    except subprocess.TimeoutExpired:
        return "timeout"


def main():
    wanted = sys.argv[1:]
    selected = [m for m in MUTANTS if not wanted or any(w in m.name for w in wanted)]
    scratch = tempfile.mkdtemp(prefix="uroce-mutants-")
    src = os.path.join(scratch, "src")
    build = os.path.join(scratch, "build")
    shutil.copytree(TOP, src, ignore=shutil.ignore_patterns(".git", "build*"))
    print(f"scratch copy: {src}", flush=True)
    if run(["meson", "setup", build, src], scratch, 600) != 0 or run(["ninja", "-C", build], scratch, 1800) != 0:
        print("mutants: the unmutated tree does not build", file=sys.stderr)
        return 2
    # The unmutated tree must pass, or every "kill" means nothing.
    for key in sorted({t for m in selected for t in m.tests}):
        if run(TESTS[key], build, 1200) != 0:
            print(f"mutants: the unmutated tree fails '{key}'", file=sys.stderr)
            return 2
    killed = survived = other = 0
    for m in selected:
        path = os.path.join(src, m.file)
        original = open(path).read()
        if original.count(m.find) != 1:
            print(f"STALE      {m.name} ({m.file}: text found {original.count(m.find)} times)", flush=True)
            other += 1
            continue
        open(path, "w").write(original.replace(m.find, m.replace))
        start = time.monotonic()
        try:
            if run(["ninja", "-C", build], scratch, 1800) != 0:
                print(f"UNBUILDABLE {m.name}", flush=True)
                other += 1
                continue
            caught = None
            for key in m.tests:
                rc = run(TESTS[key], build, 900)
                if rc != 0:
                    caught = f"{key}: {'timed out' if rc == 'timeout' else 'failed'}"
                    break
            secs = time.monotonic() - start
            if caught:
                killed += 1
                print(f"killed     {m.name}  [{caught}, {secs:.0f} s]", flush=True)
            else:
                survived += 1
                print(f"SURVIVED   {m.name}  [{', '.join(m.tests)} passed, {secs:.0f} s]", flush=True)
        finally:
            open(path, "w").write(original)
    run(["ninja", "-C", build], scratch, 1800)
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"{killed} killed, {survived} survived" + (f", {other} stale or unbuildable" if other else ""))
    return 0 if survived == 0 and other == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
