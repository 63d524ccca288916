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
       tools/mutants.py --check                 (the list follows the code; no build)
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
    also: tuple = ()  # further (find, replace) pairs in the same file, for a check made twice


# Build configurations (meson options) of the scratch copy; each is set up only when a
# selected mutant needs it.
BUILDS = {
    "release": [],
    # Use-after-free and friends only show under AddressSanitizer.
    "asan": ["-Db_sanitize=address,undefined", "-Db_lundef=false", "-Dbuildtype=debug"],
}

# Test commands: (build, ninja target or None for everything, command run in that build dir).
# Catch2 binaries write a JUnit report to REPORT, so that a kill names the test cases that
# failed: a kill by a test that has nothing to do with the mutant (a flaky one on a loaded
# machine) is then visible as such.
REPORT = "mutant-report.xml"
JUNIT = ["-r", "junit", "-o"]
TESTS = {
    "transport": ("release", None, ["tests/unit/transport/test_transport"] + JUNIT),
    "srq": ("release", "tests/unit/transport/test_transport",
            ["tests/unit/transport/test_transport", "[srq]"] + JUNIT),
    "atomic": ("release", "tests/unit/transport/test_transport",
               ["tests/unit/transport/test_transport", "[atomic]"] + JUNIT),
    "atomic-integration": ("release", None, ["meson", "test", "--no-rebuild", "integration",
                                             "--test-args", " ".join(["[atomic]"] + JUNIT)]),
    "ud": ("release", "tests/unit/transport/test_transport",
           ["tests/unit/transport/test_transport", "[ud]"] + JUNIT),
    "uc": ("release", "tests/unit/transport/test_transport",
           ["tests/unit/transport/test_transport", "[uc]"] + JUNIT),
    "cq": ("release", "tests/unit/transport/test_transport",
           ["tests/unit/transport/test_transport", "[cq]"] + JUNIT),
    "rereg-integration": ("release", None, ["meson", "test", "--no-rebuild", "integration",
                                            "--test-args", " ".join(["[rereg],[qp]"] + JUNIT)]),
    "mw-integration": ("release", None, ["meson", "test", "--no-rebuild", "integration",
                                         "--test-args", " ".join(["[mw]"] + JUNIT)]),
    "ud-integration": ("release", None, ["meson", "test", "--no-rebuild", "integration",
                                         "--test-args", " ".join(["[ud]"] + JUNIT)]),
    "srq-integration": ("release", None, ["meson", "test", "--no-rebuild", "integration",
                                          "--test-args", " ".join(["[srq]"] + JUNIT)]),
    "xrc": ("release", "tests/unit/transport/test_transport",
            ["tests/unit/transport/test_transport", "[xrc]"] + JUNIT),
    "xrc-integration": ("release", None, ["meson", "test", "--no-rebuild", "integration",
                                          "--test-args", " ".join(["[xrc]"] + JUNIT)]),
    "odp-integration": ("release", None, ["meson", "test", "--no-rebuild", "integration",
                                          "--test-args", " ".join(["[odp]"] + JUNIT)]),
    "async-integration": ("release", None, ["meson", "test", "--no-rebuild", "integration",
                                            "--test-args", " ".join(["[async]"] + JUNIT)]),
    "wire": ("release", None, ["tests/unit/wire/test_wire"] + JUNIT),
    "rtt": ("release", "tests/unit/transport/test_transport",
            ["tests/unit/transport/test_transport", "[rtt]"] + JUNIT),
    "probe": ("release", "tests/unit/transport/test_transport",
              ["tests/unit/transport/test_transport", "[retransmit],[rtt]"] + JUNIT),
    "capture": ("release", "tests/unit/transport/test_transport",
                ["tests/unit/transport/test_transport", "[capture]"] + JUNIT),
    "pcap-app": ("release", None, ["meson", "test", "--no-rebuild", "pcap"]),
    "ipv6-app": ("release", None, ["meson", "test", "--no-rebuild", "ipv6"]),
    "retransmit-integration": ("release", None, ["meson", "test", "--no-rebuild", "integration",
                                                 "--test-args", " ".join(["[retransmit]"] + JUNIT)]),
    "slots": ("release", "tests/unit/transport/test_transport",
              ["tests/unit/transport/test_transport", "[device_slots]"] + JUNIT),
    "stats-app": ("release", None, ["meson", "test", "--no-rebuild", "stats"]),
    "batch": ("release", "tests/unit/transport/test_transport",
              ["tests/unit/transport/test_transport", "[transmit_batch],[send_failures]"] + JUNIT),
    "sharing-integration": ("release", None, ["meson", "test", "--no-rebuild", "integration",
                                              "--test-args", " ".join(["[sharing]"] + JUNIT)]),
    "tshark-app": ("release", None, ["meson", "test", "--no-rebuild", "tshark"]),
    "handoff": ("release", "tests/unit/transport/test_transport",
                ["tests/unit/transport/test_transport", "[poll_handoff]"] + JUNIT),
    "held-posts": ("release", "tests/unit/transport/test_transport",
                   ["tests/unit/transport/test_transport", "[held_posts]"] + JUNIT),
    "held-acks": ("release", "tests/unit/transport/test_transport",
                  ["tests/unit/transport/test_transport", "[held_acks]"] + JUNIT),
    "fast-paths-integration": ("release", None, ["meson", "test", "--no-rebuild", "integration",
                                                 "--test-args", " ".join(["[fast_paths]"] + JUNIT)]),
    "faults": ("release", "tests/unit/transport/test_transport",
               ["tests/unit/transport/test_transport", "[faults]"] + JUNIT),
    "rdma_cm-app": ("release", None, ["meson", "test", "--no-rebuild", "rdma_cm"]),
    "cm": ("release", "tests/unit/transport/test_transport",
           ["tests/unit/transport/test_transport", "[cm]"] + JUNIT),
    "comp_channel": ("release", None, ["tests/unit/comp_channel/test_comp_channel"] + JUNIT),
    "receive-batch": ("release", "tests/unit/transport/test_transport",
                      ["tests/unit/transport/test_transport", "[receive_batch]"] + JUNIT),
    "app-memory": ("release", "tests/unit/transport/test_transport",
                   ["tests/unit/transport/test_transport", "[app_memory]"] + JUNIT),
    "vanished-integration": ("release", None, ["meson", "test", "--no-rebuild", "integration",
                                               "--test-args", " ".join(["[vanished]"] + JUNIT)]),
    "integration": ("release", None, ["meson", "test", "--no-rebuild", "--suite", "integration",
                                      "--test-args", " ".join(JUNIT)]),
    "abi": ("release", None, ["meson", "test", "--no-rebuild", "abi"]),
    "integration-asan": ("asan", None, ["meson", "test", "--no-rebuild", "--suite", "integration",
                                        "--test-args", " ".join(JUNIT)]),
    "transport-asan": ("asan", "tests/unit/transport/test_transport",
                       ["tests/unit/transport/test_transport", "[lifetime]"] + JUNIT),
}

MUTANTS = [
    # --- shared receive queue (transport/shared_receive_queue.cpp) ---
    Mutant("srq: too many SGEs accepted", "transport/shared_receive_queue.cpp",
           "if (wqe.sgl.count > max_sge_) return EINVAL;", "", ("srq",)),
    Mutant("srq: posting past capacity accepted", "transport/shared_receive_queue.cpp",
           "if (queue_.size() >= capacity_) return ENOMEM;", "", ("srq",)),
    Mutant("srq: limit event never fires", "transport/shared_receive_queue.cpp",
           "        if (!callbacks_off_) on_limit_();", "        (void)callbacks_off_;", ("srq",)),
    Mutant("srq: limit event not one-shot", "transport/shared_receive_queue.cpp",
           "            limit_ = 0;\n            fire = true;", "            fire = true;", ("srq",)),
    Mutant("srq: limit above capacity accepted", "transport/shared_receive_queue.cpp",
           "if (limit > capacity_) return EINVAL;", "", ("srq",)),
    Mutant("srq: take without the lock", "transport/shared_receive_queue.cpp",
           "        std::lock_guard lock(mutex_);\n        if (closed_ || queue_.empty()) return std::nullopt;",
           "        if (closed_ || queue_.empty()) return std::nullopt;", ("srq",)),
    # --- RC QPs on an SRQ (transport/rc_responder.cpp, rc_qp.cpp; provider/srq.cpp) ---
    Mutant("srq: QP ignores its SRQ", "transport/rc_responder.cpp",
           "        recv_ = srq->take();\n        return recv_.has_value();",
           "        (void)srq;\n        return false;", ("srq",)),
    Mutant("srq: WQE of a cut-short message not flushed", "transport/rc_qp.cpp",
           "        if (CompletionQueue* cq = recv_cq()) push_completion(*cq, c);\n    }\n    while (!rq_.empty()) {",
           "        (void)c;\n    }\n    while (!rq_.empty()) {", ("srq",)),
    Mutant("srq: no Last WQE Reached", "transport/rc_qp.cpp",
           "    if (srq_) post_async(AsyncEventType::LastWqeReached);", "", ("srq",)),
    Mutant("srq: post_recv accepted on a QP with an SRQ", "transport/rc_qp.cpp",
           "if (state_ == QpState::Reset || srq_ || xrc_role_ != XrcRole::None) return EINVAL;",
           "if (state_ == QpState::Reset || xrc_role_ != XrcRole::None) return EINVAL;", ("srq",)),
    Mutant("srq: lkeys checked against the QP's PD", "transport/rc_responder.cpp",
           "const uint32_t pd = srq ? srq->pd() : pd_;", "const uint32_t pd = ((void)srq, pd_);",
           ("srq",)),
    Mutant("srq: shrinking below the queued WQEs accepted", "transport/shared_receive_queue.cpp",
           "capacity < queue_.size() || ", "", ("srq-integration",)),
    Mutant("srq: destroy with QPs attached", "provider/srq.cpp",
           "    if (srq->qp_refs.load() > 0) return EBUSY;", "", ("srq-integration",)),
    # --- atomics (transport/rc_atomics.cpp, rc_responder.cpp; provider/qp.cpp) ---
    Mutant("atomic: a duplicate is executed again", "transport/rc_responder.cpp",
           "        on_duplicate_atomic(pkt);\n        return;",
           "        execute_atomic(pkt);\n        return;", ("atomic",)),
    Mutant("atomic: replay ignores the operands", "transport/rc_atomics.cpp",
           "r->swap_add != a.swap_add || ", "", ("atomic",)),
    Mutant("atomic: misaligned target accepted", "transport/rc_atomics.cpp",
           "if (a.va % kAtomicBytes != 0) {", "if (false) {", ("atomic",)),
    Mutant("atomic: QP access not checked", "transport/rc_atomics.cpp",
           "    if (!(attrs_.access & kRemoteAtomic)) {\n        responder_error(",
           "    if (false) {\n        responder_error(", ("atomic",)),
    Mutant("atomic: region access not checked", "transport/rc_atomics.cpp",
           "kAtomicBytes, kRemoteAtomic, local,", "kAtomicBytes, 0, local,", ("atomic",)),
    Mutant("atomic: any response PSN taken for an atomic's", "transport/rc_atomics.cpp",
           "if (!answered || !is_atomic(answered->wqe.opcode)) {", "if (!answered) {",
           ("atomic",)),
    Mutant("atomic: misaligned target posted", "provider/qp.cpp",
           " || wr->wr.atomic.remote_addr % 8 != 0", "", ("atomic-integration",)),
    # --- UD QPs (transport/ud_qp.cpp, engine.cpp) ---
    Mutant("ud: Q_Key not checked", "transport/ud_qp.cpp",
           "if (pkt.h.deth.qkey != attrs_.qkey) {", "if (false) {", ("ud",)),
    Mutant("ud: privileged Q_Key bit ignored", "transport/ud_qp.cpp",
           "h.deth.qkey = (dest.qkey & kPrivilegedQkeyBit) ? attrs_.qkey : dest.qkey;",
           "h.deth.qkey = dest.qkey;", ("ud",)),
    Mutant("ud: receive buffer too small written anyway", "transport/ud_qp.cpp",
           "if (uint64_t{kGrhBytes} + len > wqe->sgl.total_length()) {", "if (false) {", ("ud",)),
    Mutant("ud: no GRH area", "transport/ud_qp.cpp",
           "const std::span<const uint8_t> pieces[] = {{grh, kGrhBytes}, pkt.payload};",
           "const std::span<const uint8_t> pieces[] = {pkt.payload};", ("ud",)),
    Mutant("ud: messages above the MTU posted", "transport/ud_qp.cpp",
           "    if (wqe.length > attrs_.mtu) return EINVAL;", "", ("ud",)),
    Mutant("ud: receive completions report sl 0 (UCX ud_verbs drops every datagram)",
           "provider/cq.cpp", "    if (!c.with_grh) return 0;\n    return ipv6 ? kRoceL3HeaderIpv6 : kRoceL3HeaderIpv4;",
           "    return 0;", ("ud-integration",)),
    Mutant("engine: packets of another transport reach a QP", "transport/engine.cpp",
           "(qp && (pkt.h.bth.opcode >> 5) != static_cast<uint8_t>(qp->transport()))",
           "false", ("ud",)),
    # --- UD multicast (transport/engine.cpp, ud_qp.cpp, multicast_groups.cpp, udp_socket.cpp) ---
    Mutant("mcast: a group's datagram for a QP's own number delivered", "transport/engine.cpp",
           "if (pkt.h.bth.dest_qp != kMulticastQpn) {", "if (false) {", ("ud",)),
    Mutant("mcast: a unicast datagram for QP 0xFFFFFF not told apart", "transport/engine.cpp",
           "if (pkt.h.bth.dest_qp == kMulticastQpn) {", "if (false) {", ("ud",)),
    Mutant("mcast: ICRC of a group's datagram checked over the device address",
           "transport/engine.cpp",
           "if (!accept(datagram, src_ip, group, src_port, pkt)) return;",
           "if (!accept(datagram, src_ip, config_.ip, src_port, pkt)) return;", ("ud",)),
    Mutant("mcast: a destroyed QP stays in its groups", "transport/engine.cpp",
           "if (keep && keep->transport() == wire::Transport::Ud) multicast_.detach_all(qpn);",
           "", ("ud",)),
    Mutant("mcast: any address attached as a group", "transport/engine.cpp",
           "if (!group.is_v4() || !group.is_multicast()) return EINVAL;", "",
           ("ud", "ud-integration")),
    Mutant("mcast: sent to the WR's QPN instead of 0xFFFFFF", "transport/ud_qp.cpp",
           "h.bth.dest_qp = multicast ? kMulticastQpn : dest.qpn & kPsnMask;",
           "h.bth.dest_qp = dest.qpn & kPsnMask;", ("ud",)),
    Mutant("mcast: the GRH area names the device, not the group", "transport/ud_qp.cpp",
           "    receive(pkt, src_ip, group);",
           "    (void)group;\n    receive(pkt, src_ip, engine_.config().ip);",
           ("ud", "ud-integration")),
    Mutant("mcast: the hop limit is not the TTL", "transport/ud_qp.cpp",
           "const uint8_t ttl = multicast ? std::max<uint8_t>(dest.hop_limit, 1) : 0;",
           "const uint8_t ttl = 0;", ("ud",)),
    Mutant("mcast: detaching a QP not attached succeeds", "transport/multicast_groups.cpp",
           "if (m == members.end()) return EINVAL;", "if (m == members.end()) return 0;",
           ("ud", "ud-integration")),
    Mutant("mcast: group sockets bound with SO_REUSEPORT (other programs' member sockets keep us out)",
           "transport/udp_socket.cpp",
           "if (::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||",
           "if (::setsockopt(fd_, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0 ||", ("ud",)),
    Mutant("mcast: group sockets also hear the group on other interfaces (IP_MULTICAST_ALL on)",
           "transport/udp_socket.cpp",
           "::setsockopt(fd_, IPPROTO_IP, IP_MULTICAST_ALL, &zero, sizeof zero) != 0) {",
           "zero != 0) {", ("ud",)),
    Mutant("mcast: non-UD QPs attached", "provider/ud_qp.cpp",
           "if (!qp->ud || !gid || !gid_to_ip(*gid, AF_INET, group)) return EINVAL;\n    try {",
           "if (!gid || !gid_to_ip(*gid, AF_INET, group)) return EINVAL;\n    try {",
           ("ud-integration",)),
    # --- UC QPs (transport/uc_qp.cpp) ---
    Mutant("uc: a PSN gap does not drop the message", "transport/uc_qp.cpp",
           "        bump(engine_.counters().rx_out_of_sequence);\n        drop_message();",
           "        bump(engine_.counters().rx_out_of_sequence);", ("uc",)),
    Mutant("uc: continuation of a dropped message taken", "transport/uc_qp.cpp",
           "    if (in_message_ == InMessage::None && !starts) {", "    if (false) {", ("uc",)),
    Mutant("uc: WRITE rkey not checked on the first packet", "transport/uc_qp.cpp",
           "            (reth.dma_len > 0 &&\n", "            (false &&\n",
           ("uc",)),
    Mutant("uc: SEND longer than the buffer written", "transport/uc_qp.cpp",
           "if (uint64_t{recv_offset_} + len > recv_->sgl.total_length()) {", "if (false) {",
           ("uc",)),
    # --- changes in place: rereg_mr, resize_cq, RESET (memory_table, completion_queue, qp.cpp) ---
    Mutant("rereg: new access not applied", "transport/memory_table.cpp",
           "    if (change.access) r.access = *change.access;", "", ("rereg-integration",)),
    Mutant("rereg: new translation not applied", "transport/memory_table.cpp",
           "    if (change.translation) {", "    if (false) {", ("rereg-integration",)),
    Mutant("rereg: new PD not applied", "transport/memory_table.cpp",
           "    if (change.pd) r.pd = *change.pd;", "", ("rereg-integration",)),
    Mutant("cq: held-back event fires although the poller took everything",
           "transport/completion_queue.cpp", "if (!queue_.empty() && arm_ != Arm::None) {",
           "if (arm_ != Arm::None) {", ("cq",)),
    Mutant("cq: held-back event lost although a completion is left",
           "transport/completion_queue.cpp", "        if (holders_ == 0 && held_event_) {",
           "        if (false) {", ("cq",)),
    Mutant("cq: resize below the waiting completions", "transport/completion_queue.cpp",
           "capacity < queue_.size()", "false", ("cq",)),
    Mutant("qp: RESET leaves stale completions in the CQs", "provider/qp.cpp",
           "        if (qp->send_cq) qp->send_cq->queue->remove_qp(ibqp->qp_num);\n        if (qp->recv_cq) qp->recv_cq->queue->remove_qp(ibqp->qp_num);",
           "", ("rereg-integration",)),
    # --- memory windows (transport/memory_table.cpp, rc_responder.cpp) ---
    Mutant("mw: window range not checked", "transport/memory_table.cpp",
           "        const KeyCheck c = check(&w, pd, w.addr, va, length, access);\n        if (c != KeyCheck::Ok) return c;",
           "", ("mw-integration",)),
    Mutant("mw: unbound window still grants access", "transport/memory_table.cpp",
           "        if (!w.bound) return KeyCheck::BadKey;", "", ("mw-integration",)),
    Mutant("mw: bind ignores the region's MW_BIND right", "transport/memory_table.cpp",
           "if (!(mr.access & kMwBind) ||", "if (false ||", ("mw-integration",)),
    Mutant("mw: SEND with invalidate does not invalidate", "transport/memory_table.cpp",
           "    w.bound = false;\n    return KeyCheck::Ok;", "    return KeyCheck::Ok;",
           ("mw-integration",)),
    # --- memory keys and bounds (transport/memory_table.cpp) ---
    Mutant("memory: no protection-domain check", "transport/memory_table.cpp",
           "if (r->pd != pd) return KeyCheck::WrongPd;",
           "if (r->pd != pd && false) return KeyCheck::WrongPd;", ("transport",)),
    Mutant("memory: no upper bounds check", "transport/memory_table.cpp",
           "length > r->length || addr - base > r->length - length",
           "length == 0xdeadbeefdeadbeefull",
           ("transport",)),
    Mutant("memory: addresses below the region accepted", "transport/memory_table.cpp",
           "if (addr < base || length > r->length || addr - base > r->length - length)",
           "if (addr >= base && (length > r->length || addr - base > r->length - length))",
           ("transport",)),
    Mutant("memory: no access-rights check", "transport/memory_table.cpp",
           "if ((r->access & access) != access) return KeyCheck::NoAccess;",
           "if ((r->access & access) != access && false) return KeyCheck::NoAccess;",
           ("transport",)),
    # --- receive filters (transport/engine.cpp, rc_qp.cpp) ---
    Mutant("filter: bad ICRC accepted", "transport/engine.cpp",
           "bump(counters_->rx_bad_icrc);\n            return false;",
           "bump(counters_->rx_bad_icrc);\n            break;", ("transport",)),
    Mutant("filter: ICRC with unseen IP fields refused", "transport/engine.cpp",
           "bump(counters_->rx_icrc_unseen_fields);\n            break;",
           "bump(counters_->rx_icrc_unseen_fields);\n            return nullptr;",
           ("transport",)),
    Mutant("filter: P_Key not checked", "transport/engine.cpp",
           "if ((pkt.h.bth.pkey & 0x7fff) != 0x7fff) {", "if (false) {", ("transport",)),
    Mutant("filter: peer address not checked", "transport/rc_qp.cpp",
           "if (src_ip != attrs_.dst_ip) {", "if (src_ip != attrs_.dst_ip && false) {",
           ("transport",)),
    # --- responder (transport/rc_responder.cpp) ---
    Mutant("responder: duplicate requests executed again", "transport/rc_responder.cpp",
           "if (d < 0) {", "if (d < -1000000) {", ("transport",)),
    Mutant("responder: out-of-sequence requests executed", "transport/rc_responder.cpp",
           "if (d > 0) {", "if (d > 1000000) {", ("transport",)),
    Mutant("responder: WRITE without QP remote-write right", "transport/rc_responder.cpp",
           "if (!(attrs_.access & kRemoteWrite)) {", "if (false) {", ("transport",)),
    Mutant("responder: READ without QP remote-read right", "transport/rc_responder.cpp",
           "    if (!(attrs_.access & kRemoteRead)) {\n        responder_error",
           "    if (false) {\n        responder_error", ("transport",),
           also=(("bool refused = !(attrs_.access & kRemoteRead) ||", "bool refused = false ||"),)),
    Mutant("responder: READ whole-range check removed", "transport/rc_responder.cpp",
           "if (engine_.memory().check_remote(reth.rkey, responder_pd(), reth.va, reth.dma_len,\n                                          kRemoteRead",
           "if (false && engine_.memory().check_remote(reth.rkey, responder_pd(), reth.va, reth.dma_len,\n                                          kRemoteRead",
           ("transport",)),
    Mutant("responder: WRITE whole-range check removed", "transport/rc_responder.cpp",
           "if (engine_.memory().check_remote(reth.rkey, responder_pd(), reth.va, reth.dma_len,\n                                                  kRemoteWrite",
           "if (false && engine_.memory().check_remote(reth.rkey, responder_pd(), reth.va, reth.dma_len,\n                                                  kRemoteWrite",
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
    Mutant("responder: a replay refused by a deregistration puts the QP in ERR",
           "transport/rc_responder.cpp",
           "                if (i < r->sent_once) {", "                if (false) {",
           ("transport",)),
    Mutant("responder: a replay refused by a deregistration sends no NAK",
           "transport/rc_responder.cpp",
           "                    send_error_nak(wire::NakCode::RemoteAccessError, psn_add(r->psn, i));\n",
           "", ("transport",)),
    Mutant("responder: a replay refused by a deregistration NAKs the READ's first PSN",
           "transport/rc_responder.cpp",
           "send_error_nak(wire::NakCode::RemoteAccessError, psn_add(r->psn, i));",
           "send_error_nak(wire::NakCode::RemoteAccessError, r->psn);", ("transport",)),
    # --- data-safety fixes of the requester (transport/rc_completer.cpp) ---
    Mutant("completer: responses outside the PSN window accepted", "transport/rc_completer.cpp",
           "if (!response_in_window(pkt.h.bth.psn)) {", "if (false) {", ("transport",)),
    Mutant("completer: READ response for a non-READ PSN accepted", "transport/rc_completer.cpp",
           "if (!answered || answered->wqe.opcode != SendOpcode::RdmaRead) {", "if (!answered) {",
           ("transport",)),
    Mutant("completer: sequence NAK does not restart the timer", "transport/rc_completer.cpp",
           "                    nak_resent_ = true;\n                    restart_timer();",
           "                    nak_resent_ = true;", ("transport",)),
    Mutant("completer: fatal NAK charged to the head request", "transport/rc_completer.cpp",
           "SqEntry* failed = entry_for_psn(psn);", "SqEntry* failed = &sq_.front();",
           ("transport",)),
    # --- object lifetime (transport/rc_qp.cpp, provider/qp.cpp) ---
    Mutant("lifetime: close does not wait for the timer callback", "transport/rc_qp.cpp",
           "    if (timer_) event_del_block(timer_);\n", "", ("transport-asan",)),
    Mutant("lifetime: destroy_qp does not take back unread events", "provider/qp.cpp",
           "st->async_events.retract(reinterpret_cast<uint64_t>(ibqp), &qp->events);", "",
           ("integration",)),
    # --- requester / completer (transport/rc_completer.cpp, rc_requester.cpp) ---
    Mutant("completer: retry count never exhausted", "transport/rc_completer.cpp",
           "if (retries_left_-- <= 0) {", "if (false) {", ("transport",)),
    Mutant("completer: RNR retry count never exhausted", "transport/rc_completer.cpp",
           "rnr_retries_left_-- <= 0", "false", ("transport",)),
    Mutant("completer: ACK timeout 16x shorter", "transport/rc_qp.h",
           "return (4096ull << attrs_.timeout) / 1000; }",
           "return (256ull << attrs_.timeout) / 1000; }", ("transport",)),
    Mutant("completer: READ response length not checked", "transport/rc_completer.cpp",
           "if (!sequence_ok || !length_ok) {", "if (!sequence_ok || (!length_ok && false)) {",
           ("transport",)),
    Mutant("completer: READ response opcode sequence not checked", "transport/rc_completer.cpp",
           "if (!sequence_ok || !length_ok) {", "if ((!sequence_ok && false) || !length_ok) {",
           ("transport",)),
    Mutant("requester: local key not checked before sending", "transport/scatter.cpp",
           "if (memory.check_local(s.lkey, pd, s.addr + skip, take, 0) != KeyCheck::Ok) return false;",
           "if (memory.check_local(s.lkey, pd, s.addr + skip, take, 0) != KeyCheck::Ok && false) return false;",
           ("transport",)),
    Mutant("responder: receive buffer written before every piece is checked", "transport/scatter.cpp",
           "                    if (k != KeyCheck::Ok) return k;", "                    (void)k;",
           ("transport",)),
    Mutant("requester: READ target not checked for local write", "transport/rc_requester.cpp",
           "if (!local_buffer_writable(e)) return WcStatus::LocProtErr;", "", ("transport",)),
    # --- PSN arithmetic (transport/psn.h) ---
    # (PSN arithmetic itself is pinned by static_asserts in transport/psn.h.)
    Mutant("completer: responses behind the oldest unacknowledged PSN accepted",
           "transport/rc_completer.cpp", "!psn_before(psn, oldest_unacked()) &&", "",
           ("transport",)),
    Mutant("completer: responses beyond the highest PSN sent accepted",
           "transport/rc_completer.cpp", "&& psn_before(psn, sent_high_);", ";",
           ("transport",)),
    Mutant("requester: READ does not claim its response PSNs", "transport/rc_requester.cpp",
           "e.wqe.opcode == SendOpcode::RdmaRead ? psn_add(e.psn, e.npkts)",
           "e.wqe.opcode == SendOpcode::RdmaRead ? psn_add(psn, 1)", ("transport",)),
    Mutant("lifetime: closed QP still takes packets", "transport/qp_common.cpp",
           "    if (closed_) {\n        bump(engine_.counters().rx_unknown_qp);",
           "    if (closed_ && false) {\n        bump(engine_.counters().rx_unknown_qp);",
           ("transport-asan",)),
    Mutant("lifetime: a QP closed mid-batch drops the ACK it owes", "transport/rc_qp.cpp",
           "        send_pending_ack();\n        closed_ = true;", "        closed_ = true;",
           ("transport",)),
    Mutant("odp: ibv_advise_mr takes any key and range", "provider/memory.cpp",
           "            if (mem.check_local(s.lkey, pd, s.addr, s.length, need) != transport::KeyCheck::Ok)",
           "            if (mem.check_local(s.lkey, pd, s.addr, s.length, need) != transport::KeyCheck::Ok && false)",
           ("odp-integration",)),
    Mutant("odp: a QP takes undefined access flags", "provider/qp_modify.cpp",
           "           IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB)))", "           ~0)))",
           ("odp-integration",)),
    Mutant("events: SQD notification sticks to later moves to SQD", "provider/qp_modify.cpp",
           "    stored.en_sqd_async_notify = (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) ? a.en_sqd_async_notify : 0;",
           "    if (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) stored.en_sqd_async_notify = a.en_sqd_async_notify;",
           ("async-integration",)),
    Mutant("xrc: a target holds the last SRQ it used (its CQ cannot be destroyed)",
           "transport/rc_responder.cpp",
           "    if (in_message_ == InMessage::None && !recv_) xrc_srq_.reset();", "",
           ("xrc-integration",)),
    Mutant("qp: a connection may name a multicast group as its peer", "provider/qp_modify.cpp",
           "!gid_to_ip(attr.ah_attr.grh.dgid, family, ip) || ip.is_multicast())",
           "!gid_to_ip(attr.ah_attr.grh.dgid, family, ip))", ("rereg-integration",)),
    # --- IPv6 (transport/wire/icrc.cpp, packet_capture.cpp, ud_qp.cpp, provider) ---
    Mutant("ipv6: the ICRC over IPv6 uses the IPv4 pseudo-header", "transport/wire/icrc.cpp",
           "    if (flow.dst_ip.is_v4()) {\n        fill_pseudo_header(", "    if (true) {\n        fill_pseudo_header(",
           ("wire", "ipv6-app")),
    Mutant("ipv6: the IPv6 pseudo-header leaves the flow label unmasked", "transport/wire/icrc.cpp",
           "    ip[1] = ip[2] = ip[3] = 0xff;", "    ip[1] = 0xf0;\n    ip[2] = ip[3] = 0;",
           ("wire", "ipv6-app")),
    Mutant("ipv6: verification accepts an ICRC some identification explains", "transport/wire/icrc.cpp",
           "    if (!flow.dst_ip.is_v4()) return IcrcCheck::Mismatch;  // IPv6: nothing unseen\n", "",
           ("wire",)),
    Mutant("ipv6: captured IPv6 frames carry no UDP checksum", "transport/packet_capture.cpp",
           "        if (checksum == 0) checksum = 0xffff;\n        put16(udp + 6, checksum);",
           "        static_cast<void>(checksum);", ("capture", "ipv6-app")),
    Mutant("ipv6: the UD GRH area holds an IPv4 header for an IPv6 packet", "transport/ud_qp.cpp",
           "    if (dst_ip.is_v4()) {\n        build_ipv4_grh(", "    if (true) {\n        build_ipv4_grh(",
           ("ud",)),
    Mutant("ipv6: datagrams with UDP checksum 0 (the kernel's rxe) are dropped",
           "transport/udp_socket.cpp",
           "        ::setsockopt(fd_, IPPROTO_UDP, UDP_NO_CHECK6_RX, &one, sizeof one);", "",
           ("transport",)),
    Mutant("fork: an engine timer callback runs without its fork gate (a fork copies its locks held)",
           "transport/rc_completer.cpp", "    const auto pass = qp->engine_.fork_gate().pass();\n",
           "", ("transport",)),
    Mutant("probe: one tail-loss probe per stall (a lost probe waits for the adaptive timeout)",
           "transport/rc_qp.h", "    static constexpr unsigned kMaxTailProbes = 2;",
           "    static constexpr unsigned kMaxTailProbes = 1;", ("transport",)),
    Mutant("handoff: a busy poller leaves the QPs' timers to the engine thread",
           "transport/engine.cpp", "    if (handoff_->parked()) run_due_timers();\n", "",
           ("transport",)),
    Mutant("qpn space: a context's further slot is not routed to its socket (its QPs' packets go astray)",
           "transport/engine.cpp",
           "    h.route_slot = [this](uint16_t number) { return steering_ ? steering_->route(number) : 0; };",
           "    h.route_slot = [](uint16_t) { return 0; };", ("sharing-integration",)),
    Mutant("qpn space: a slot's new first holder keeps the stale route of a context gone by",
           "transport/qpn_steering.cpp",
           "    if (bpf_map_update_elem(routes_fd_, &slot_, &own, BPF_ANY) != 0 ||",
           "    if (own != 0 ||", ("transport",)),
    Mutant("qpn space: a context stops at one slot's 4096 QPs",
           "transport/qpn_space.cpp", "    if (i == held && !add_slot()) throw std::bad_alloc();",
           "    if (i == held) throw std::bad_alloc();", ("sharing-integration",)),
    Mutant("gso: a packet too big for one QP's path turns GSO off for the whole engine",
           "transport/engine_transmit.cpp",
           "            if (sent_alone > 0) gso_.store(false, std::memory_order_relaxed);",
           "            static_cast<void>(sent_alone);\n            gso_.store(false, std::memory_order_relaxed);",
           ("transport",)),
    Mutant("abi: comp_mask only where the headers put it (v44's libibverbs finds no ibv_wr_* API)",
           "provider/qp_ex_layout.cpp", "    if (at == kBuilt || at + sizeof(void*) > kBuilt) return;",
           "    return;", ("comp_channel", "integration")),
    Mutant("ipv6: a QP may connect to a GID of the other family", "provider/qp_modify.cpp",
           "    if (a.family() != family || a.is_unspecified()) return false;",
           "    static_cast<void>(family);\n    if (a.is_unspecified()) return false;", ("ipv6-app",)),
    Mutant("xrc: a request may name an SRQ of another XRC domain", "transport/rc_responder.cpp",
           "    if (!srq || srq->xrc().xrcd != xrcd_) return false;", "    if (!srq) return false;",
           ("xrc", "xrc-integration")),
    Mutant("xrc: a request naming no SRQ is executed anyway", "transport/rc_responder.cpp",
           "    if (!select_xrc_srq(pkt)) {", "    if (!select_xrc_srq(pkt) && false) {",
           ("xrc",)),
    Mutant("xrc: a target checks rkeys in its own (empty) PD, not the named SRQ's",
           "transport/rc_qp.h",
           "    uint32_t responder_pd() const { return xrc_srq_ ? xrc_srq_->pd() : pd_; }",
           "    uint32_t responder_pd() const { return pd_; }", ("xrc", "xrc-integration")),
    Mutant("xrc: an initiator accepts requests, a target responses", "transport/rc_qp.cpp",
           "    if (xrc_role_ == (flags & wire::kRequest ? XrcRole::Initiator : XrcRole::Target)) {",
           "    if (false) {", ("xrc",)),
    Mutant("xrc: the last handle of a domain in use may be closed", "provider/xrc.cpp",
           "        if (x->domain->handles == 1 && x->domain->users.load() > 0) return EBUSY;", "",
           ("xrc-integration",)),
    Mutant("xrc: a target QP accepts post_send", "transport/rc_qp.cpp",
           "    if (xrc_role_ == XrcRole::Target) return EINVAL;  // it only receives", "",
           ("xrc", "xrc-integration")),
    Mutant("requester: each QP takes a full window whatever the engine's other QPs have",
           "transport/rc_requester.cpp",
           "kEngineWindowBytes / std::max<uint32_t>(1, engine_.qp_count());",
           "kEngineWindowBytes;", ("transport",)),
    Mutant("requester: an answer posted mid-batch overtakes the ACK it follows",
           "transport/rc_qp.cpp", "    if (!silent_answer) send_pending_ack();\n", "",
           ("transport",)),
    Mutant("requester: a packet the socket refuses for good is retried", "transport/rc_qp.cpp",
           "return result != Engine::TransmitResult::Failed;", "return true;", ("transport",)),
    Mutant("requester: a full socket buffer fails the request", "transport/engine_transmit.cpp",
           "            bump(counters_->tx_dropped_full, packets);\n            return TransmitResult::Lost;",
           "            bump(counters_->tx_dropped_full, packets);\n            return TransmitResult::Failed;",
           ("transport",)),
    Mutant("requester: EMSGSIZE treated as a loss", "transport/engine_transmit.cpp",
           "            bump(counters_->tx_too_big, packets);\n            return TransmitResult::Failed;",
           "            bump(counters_->tx_too_big, packets);\n            return TransmitResult::Lost;",
           ("transport",)),
    Mutant("provider: loads on libibverbs older than v36", "provider/meson.build",
           "  'abi_floor.cpp',\n", "", ("abi",)),
    # --- device sharing (transport/device_slots.cpp, qpn_steering.cpp) ---
    Mutant("sharing: steering program not attached", "transport/qpn_steering.cpp",
           "if (::setsockopt(socket_fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_EBPF, &prog_fd_,",
           "if (false && ::setsockopt(socket_fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_EBPF, &prog_fd_,",
           ("transport",)),
    Mutant("sharing: a dead holder's slot is never taken back", "transport/device_slots.cpp",
           "if (!rested_only && e.state == kHeld && !held_by_someone(fd, n)) {",
           "if (!rested_only && e.state == kHeld && !held_by_someone(fd, n) && false) {",
           ("transport",)),
    Mutant("sharing: slot 0 (QP0/QP1) handed out", "transport/device_slots.cpp",
           "const unsigned n = 1 + (start + k) % (kSlots - 1);",
           "const unsigned n = (start + k) % kSlots;",
           ("transport",)),
    Mutant("sharing: slots handed out in order (QPNs guessable)", "transport/device_slots.cpp",
           "const unsigned start = static_cast<unsigned>(random_u64() % (kSlots - 1));",
           "const unsigned start = 0 * static_cast<unsigned>(random_u64() % (kSlots - 1));",
           ("transport",)),
    Mutant("sharing: a holder always believes itself alone on the device",
           "transport/device_slots.cpp", "    return fl.l_type == F_UNLCK;\n}\n\nDeviceSlot::~",
           "    return true;\n}\n\nDeviceSlot::~", ("slots",)),
    Mutant("counters: a file of another build's layout started afresh under its other users",
           "transport/device_counters.cpp",
           "!header_ok_or_written(static_cast<Header*>(map)) && alone)",
           "!header_ok_or_written(static_cast<Header*>(map)) && (alone || true))", ("slots",)),
    Mutant("counters: a file of another build's layout never started afresh (stats stays blind)",
           "transport/engine.cpp", "slot->number(), slot->alone(), why);",
           "slot->number(), false, why);", ("stats-app",)),
    # (Handing out a held slot, or a fork child marking its parent's slot free, are caught
    # by the slot's lock itself: a claim believes the lock, not the table, so those mutants
    # change nothing a user could see and are not listed.)
    Mutant("sharing: a fork child takes its parent's socket out of the map",
           "transport/qpn_steering.cpp",
           "    if (::getpid() == owner_pid_) {\n        bpf_map_delete_elem(map_fd_, &slot_);",
           "    {\n        bpf_map_delete_elem(map_fd_, &slot_);", ("transport",)),
    Mutant("provider: destroy_cq does not wait for completion-event acknowledgements",
           "provider/cq.cpp",
           "&ibcq->comp_events_completed, comp_delivered);",
           "&ibcq->comp_events_completed, 0 * comp_delivered);", ("integration",)),
    Mutant("channel: purge keeps the destroyed CQ's records", "provider/comp_channel.cpp",
           "std::remove(scratch_.data(), scratch_.data() + drained, cq_handle)",
           "(scratch_.data() + drained)", ("comp_channel",)),
    # LeakSanitizer reports what the context forgot when the test closes it with objects open.
    Mutant("provider: closing a context forgets its QPs and MRs", "provider/device.cpp",
           "for (UroceQp* qp : st->live_qps.take_all()) reclaim_qp(*st, qp);",
           "for (UroceQp* qp : st->live_qps.take_all()) (void)qp;", ("integration-asan",),
           also=(("for (UroceMr* mr : st->live_mrs.take_all()) reclaim_mr(*st, mr);",
                  "for (UroceMr* mr : st->live_mrs.take_all()) (void)mr;"),)),
    Mutant("provider: fork guard not installed (children use their parent's objects)",
           "provider/device.cpp", "    fork_guard_install();\n", "", ("integration",)),
    Mutant("sharing: contexts count privately, not into the device's counters",
           "transport/engine.cpp",
           "counters_(device_counters_ ? &device_counters_->block() : &own_counters_)",
           "counters_(&own_counters_)", ("integration",)),
    Mutant("sharing: source-port sockets not shared between contexts", "transport/send_sockets.cpp",
           "std::make_unique<UdpSocket>(ip_, port, /*reuseport=*/true)",
           "std::make_unique<UdpSocket>(ip_, port, /*reuseport=*/false)", ("integration",)),
    Mutant("counters: a QP does not count what it receives", "transport/qp_common.cpp",
           "    bump(qp_counters_.rx_packets);\n", "", ("integration",)),
    Mutant("provider: destroy_qp does not wait for acknowledgements", "provider/qp.cpp",
           "    wait_for_acks(&ibqp->mutex, &ibqp->cond, &ibqp->events_completed, qp->events.delivered);\n",
           "", ("integration",)),
    # --- connection manager MADs (transport/cm/) ---
    Mutant("cm: REQ flow label one bit off", "transport/cm/cm_messages.cpp",
           "io.field(at(288, 20), p.flow_label);", "io.field(at(289, 20), p.flow_label);", ("wire",)),
    Mutant("cm: REP target ACK delay one bit off", "transport/cm/cm_messages.cpp",
           "io.field(BitField{208, 5}, m.target_ack_delay);",
           "io.field(BitField{209, 5}, m.target_ack_delay);", ("wire",)),
    Mutant("cm: another management class decoded as CM", "transport/cm/cm_messages.cpp",
           "    if (h.management_class != kCmManagementClass) return CmDecodeError::NotCm;\n", "",
           ("wire",)),
    Mutant("cm: a method other than Send decoded", "transport/cm/cm_messages.cpp",
           "    if (h.method != kMadMethodSend) return CmDecodeError::BadMethod;\n", "", ("wire",)),
    Mutant("cm: RDMA CM header version not checked", "transport/cm/ip_cm_header.cpp",
           "    if (h.major_version != 0) return IpCmHeaderError::BadVersion;\n", "", ("wire",)),
    Mutant("cm: any service ID taken for an IP one", "transport/cm/ip_cm_header.cpp",
           "    if ((service_id >> 24) != kIpServicePrefix) return std::nullopt;\n", "", ("wire",)),
    Mutant("cm: a message from another address steers a connection",
           "transport/cm/cm_agent_receive.cpp",
           "    if (!c || c->peer_ip != peer_ip) return nullptr;",
           "    if (!c || (c->peer_ip != peer_ip && c->silent)) return nullptr;", ("cm",)),
    Mutant("cm: nothing resent on timeout", "transport/cm/cm_agent.cpp",
           "c.retries_left = timers_.max_retries;", "c.retries_left = 0;", ("cm",)),
    Mutant("cm: timewait ends without TimewaitExit", "transport/cm/cm_agent.cpp",
           "if (gone.report_exit) emit(", "if (gone.report_exit && gone.silent) emit(", ("cm",)),
    Mutant("cm: QP1 takes a wrong Q_Key", "transport/cm/gsi_qp.cpp",
           "pkt.h.deth.qkey != kGsiQkey || ", "", ("cm",)),
    Mutant("steering: REQs not steered to the listener", "transport/qpn_steering.bpf.c",
           "            slot = *listener;", "            return SK_PASS;", ("cm",)),
    Mutant("steering: CM answers not steered by comm ID", "transport/qpn_steering.bpf.c",
           "            slot = be32_at(mad + kCmSecondFieldAt) >> kCmIdSlotShift;",
           "            return SK_PASS;", ("cm",)),
    Mutant("steering: a live listener's service taken over", "transport/qpn_steering.cpp",
           "            return EADDRINUSE;\n", "", ("cm",)),
    Mutant("ports: claims of one port do not conflict", "transport/cm/port_table.cpp",
           "    const int any_fd = lock_port(path_, port, ip == 0, err);",
           "    const int any_fd = lock_port(path_, port, false, err);", ("cm",),
           also=(("        addr_fd = lock_port(path_ + suffix, port, true, err);",
                  "        addr_fd = lock_port(path_ + suffix, port, false, err);"),)),
    Mutant("ports: an address's claim does not block an any-address claim",
           "transport/cm/port_table.cpp",
           "    const int any_fd = lock_port(path_, port, ip == 0, err);",
           "    const int any_fd = ip == 0 ? lock_port(path_, port, true, err) : ::dup(0);", ("cm",)),
    # --- RDMA CM identifiers (transport/cm/rdma_cm*.cpp) ---
    Mutant("rdma_cm: the passive side ignores the REQ's starting PSN",
           "transport/cm/rdma_cm_connection.cpp",
           "    id->sq_psn = req->starting_psn;", "    id->sq_psn = random_psn();", ("cm",)),
    Mutant("rdma_cm: the REP names the PSN this side sends from (not the kernel's rule)",
           "transport/cm/rdma_cm_connection.cpp",
           "        rep.starting_psn = id->rq_psn;", "        rep.starting_psn = id->sq_psn;",
           ("wire",)),
    Mutant("rdma_cm: the active side ignores the REP's QPN", "transport/cm/rdma_cm_connection.cpp",
           "    id.remote_qpn = rep->local_qpn;", "    id.remote_qpn = rep->local_qpn + 1;", ("cm",)),
    Mutant("rdma_cm: connect private data longer than the REQ carries",
           "transport/cm/rdma_cm_connection.cpp",
           "param.private_data.size() > kConnectPrivateBytes",
           "param.private_data.size() > kReqPrivateBytes", ("cm",)),
    Mutant("rdma_cm: a destroyed connection is not disconnected", "transport/cm/rdma_cm.cpp",
           "            it->second->agent().destroy(id.comm_id);", "", ("cm",)),
    Mutant("steering: a REQ nobody listens for goes to no CM", "transport/qpn_steering.bpf.c",
           "            if (!listener) return to_any_cm(md);",
           "            if (!listener) return SK_PASS;", ("rdma_cm-app",)),
    # --- adaptive retransmission (transport/rtt_estimator.cpp, rc_completer.cpp) ---
    Mutant("rtt: no floor under the adaptive timeout (spurious resends on a busy host)",
           "transport/rtt_estimator.cpp",
           "measured_ ? std::max(kMinRtoUs, srtt_us_ + 4 * rttvar_us_) : kInitialRtoUs;",
           "measured_ ? srtt_us_ + 4 * rttvar_us_ : kInitialRtoUs;", ("rtt",)),
    Mutant("rtt: no initial guess (a loss before the first sample waits 67 ms)",
           "transport/rtt_estimator.cpp", ": kInitialRtoUs;", ": cap_us;", ("probe",)),
    Mutant("rtt: an early resend just before the local ACK timeout's own resend",
           "transport/rtt_estimator.cpp", "    return rto_us <= deadline_us / 2 ? rto_us : deadline_us;",
           "    return std::min(rto_us, deadline_us);", ("rtt",)),
    Mutant("resend budget: early resends are never held back (thousands of QPs flood their peer)",
           "transport/rc_completer.cpp", "    } else if (!engine_.resend_budget().take(now)) {",
           "    } else if (false) {", ("probe",)),
    Mutant("resend budget: tail-loss probes are never held back",
           "transport/rc_completer.cpp", "        if (!engine_.resend_budget().take(now)) {",
           "        if (false) {", ("probe",)),
    Mutant("resend budget: the allowance never comes back once spent",
           "transport/resend_budget.cpp", "            tokens_ = std::min<uint32_t>(burst_, tokens_ + static_cast<uint32_t>(periods));",
           "            tokens_ = std::min<uint32_t>(burst_, tokens_);", ("probe",)),
    Mutant("rtt: a sequence NAK measures nothing (under loss, no sample for long)",
           "transport/rc_completer.cpp",
           "                // (under loss, it is often the only sample there is).\n"
           "                take_rtt_sample(psn);",
           "                // (under loss, it is often the only sample there is).\n"
           "                (void)0;", ("probe",)),
    Mutant("probe: the whole window again instead of the last packet",
           "transport/rc_completer.cpp", "    rewind_to(probe_psn_, Resend::Probe);",
           "    rewind_to(oldest_unacked(), Resend::Probe);", ("probe",)),
    Mutant("probe: sent without AckReq (the responder may stay silent)",
           "transport/rc_requester.cpp", "(probes_sent_ > 0 && h.bth.psn == probe_psn_);", "false;",
           ("probe",)),
    Mutant("probe: READ requests probed too (executed again)", "transport/rc_completer.cpp",
           "        return d < static_cast<int32_t>(e.npkts) && !takes_responder_resource(e.wqe.opcode);",
           "        return d < static_cast<int32_t>(e.npkts);", ("probe",)),
    Mutant("probe: none after a NAK's rewind (a lost resend waits for an adaptive timeout)",
           "transport/rc_completer.cpp", "            (nak_resent_ || tail_probe_possible())) {",
           "            (tail_probe_possible())) {", ("probe",)),
    Mutant("probe: the second one repeats the last packet (a silent responder waits 1 ms)",
           "transport/rc_completer.cpp", "        } else if (probes_sent_ == 0 && !nak_resent_) {",
           "        } else if (!nak_resent_) {", ("probe",)),
    Mutant("probe: the go-back-N probe resends only the last packet",
           "transport/rc_completer.cpp",
           "    bump(qp_counters_.tail_probes);\n    rewind_to(oldest_unacked(), Resend::Probe);",
           "    bump(qp_counters_.tail_probes);\n    rewind_to(psn_add(sent_high_, kPsnMask), Resend::Probe);",
           ("probe",)),
    Mutant("probe: never sent", "transport/rc_completer.cpp",
           "        if (probes_sent_ < kMaxTailProbes && rtt_.measured() && probe_us <= us &&",
           "        if (false && rtt_.measured() && probe_us <= us &&", ("probe", "retransmit-integration")),
    Mutant("rtt: the adaptive timeout may pass the local ACK timeout", "transport/rtt_estimator.cpp",
           "    return std::min(rto, cap_us);", "    return rto;", ("rtt",)),
    Mutant("rtt: no round trip is ever measured (every tail loss waits 67 ms)",
           "transport/rc_completer.cpp",
           "    if (!rtt_timing_ || psn_before(psn, rtt_psn_)) return;",
           "    if (rtt_timing_ || !rtt_timing_ || psn_before(psn, rtt_psn_)) return;",
           ("retransmit-integration",)),
    Mutant("rtt: an early resend counts as a retry (retry_cnt spent 67 times faster)",
           "transport/rc_completer.cpp",
           "    if (!ack_deadline_set_ || now >= ack_deadline_) {",
           "    if (true) {", ("probe", "retransmit-integration")),
    Mutant("rtt: UROCE_RETRANSMIT=ack-timeout ignored", "provider/device.cpp",
           "                ec.adaptive_retransmit = false;", "", ("retransmit-integration",)),
    # --- the provider's own capture (transport/packet_capture.cpp, engine.cpp) ---
    Mutant("capture: packets of a train written with identification 0 (their ICRCs are for k)",
           "transport/engine_transmit.cpp", "capture_->sent(flow, static_cast<uint16_t>(i - first), 0,",
           "capture_->sent(flow, 0, 0,", ("capture",)),
    Mutant("capture: a received packet keeps the receiver's guess of its identification",
           "transport/packet_capture.cpp",
           "    wire::icrc_verify(flow, udp_payload, expected_identification, &id);",
           "    (void)0;", ("capture",)),
    Mutant("capture: packets sent alone are not written", "transport/engine_transmit.cpp",
           "        capture_->sent(flow, 0, ttl, std::span(iov, n));", "", ("capture",)),
    Mutant("capture: received packets are not written", "transport/engine.cpp",
           "    if (capture_ && !one.empty())", "    if (false)",
           ("capture",)),
    Mutant("capture: UROCE_PCAP ignored", "provider/device.cpp", "ec.pcap_path = pcap;",
           "(void)pcap;", ("pcap-app",)),
    Mutant("capture: uroce run --pcap ignored", "tools/uroce_main.cpp",
           "(!pcap.empty() && ::setenv(\"UROCE_PCAP\", pcap.c_str(), 1) != 0)",
           "(!pcap.empty() && pcap.c_str() == nullptr)",
           ("pcap-app",)),
    # --- batching: GSO trains and GRO reads (transport/transmit_batch.cpp, engine.cpp) ---
    Mutant("gso: every segment's ICRC for identification 0 (wrong once the kernel cuts a train)",
           "transport/engine_transmit.cpp",
           "wire::icrc(flow, wire::Ipv4Unseen{index, true}, std::span(pieces, n));",
           "wire::icrc(flow, wire::Ipv4Unseen{}, std::span(pieces, n));", ("batch", "tshark-app")),
    Mutant("gso: a refused train resent with the train's ICRCs", "transport/engine_transmit.cpp",
           "        if (i != train.first) {\n            // Sent alone it carries identification 0",
           "        if (false) {\n            // Sent alone it carries identification 0", ("batch",)),
    Mutant("gso: a longer packet joins a train (cut in the wrong places)",
           "transport/transmit_batch.cpp",
           "!t.closed && bytes <= t.segment_bytes &&", "!t.closed &&", ("batch",)),
    Mutant("gso: a full packet joins after the short one (cut in the wrong places)",
           "transport/transmit_batch.cpp",
           "!t.closed && bytes <= t.segment_bytes &&", "bytes <= t.segment_bytes &&", ("batch",)),
    Mutant("gso: packets after one that can never leave still go", "transport/engine_transmit.cpp",
           "        if (batch->failed_tag_ != TransmitBatch::kNoTag) return TransmitResult::Failed;\n",
           "", ("batch",)),
    Mutant("trains: one train per system call (no sendmmsg)", "transport/transmit_batch.cpp",
           "    if (ntrains_ == kMaxTrains) return false;",
           "    if (ntrains_ >= 1) return false;", ("batch",)),
    Mutant("trains: ICRCs numbered across the batch, not from 0 in each train",
           "transport/engine_transmit.cpp", "            index = slot.index_in_train;",
           "            index = static_cast<uint16_t>(batch->count_);", ("batch",)),
    Mutant("trains: the capture numbers packets across the batch", "transport/engine_transmit.cpp",
           "capture_->sent(flow, static_cast<uint16_t>(i - first), 0,",
           "capture_->sent(flow, static_cast<uint16_t>(i), 0,", ("capture",)),
    Mutant("trains: those a sendmmsg refused are never sent", "transport/engine_transmit.cpp",
           "        for (; t < taken; ++t) train_sent(batch, t);\n",
           "        for (; t < taken; ++t) train_sent(batch, t);\n        t = batch.ntrains_;\n",
           ("batch",)),
    Mutant("probe: counted as loss by the poll handoff (the park young again)",
           "transport/rc_requester.cpp", "    if (why == Resend::Loss) engine_.note_loss();",
           "    if (why == Resend::Loss || true) engine_.note_loss();", ("handoff",)),
    Mutant("read responses: each READ answered at once (no train across READs)",
           "transport/rc_responder.cpp",
           "    ++responses_due_;  // at the end of this receive batch\n",
           "    ++responses_due_;\n    send_due_responses();\n", ("batch",)),
    Mutant("read responses: not sent at the end of an engine's receive batch",
           "transport/rc_responder.cpp",
           "    std::lock_guard lock(mutex_);\n    send_due_responses();\n    if (may_hold_ack",
           "    std::lock_guard lock(mutex_);\n    if (may_hold_ack", ("batch",)),
    Mutant("read responses: not sent by a flush of the ACKs (delayed packets, test seam)",
           "transport/rc_responder.cpp",
           "    std::lock_guard lock(mutex_);\n    send_due_responses();\n    ack_held_noted_",
           "    std::lock_guard lock(mutex_);\n    ack_held_noted_", ("transport",)),
    Mutant("gro: a train taken as one packet", "transport/engine.cpp",
           "const size_t step = d.segment_size ? d.segment_size : std::max<size_t>(d.length, 1);",
           "const size_t step = std::max<size_t>(d.length, 1);", ("batch",)),
    Mutant("steering: the BTH read in place (a GSO train may reach the wrong context)",
           "transport/qpn_steering.bpf.c",
           "    if (bpf_skb_load_bytes(md, kUdpHeader, bth, kBthBytes) != 0) return SK_PASS;",
           "    if (udp + kUdpHeader + kBthBytes > end) return SK_PASS;\n"
           "    __builtin_memcpy(bth, udp + kUdpHeader, kBthBytes);", ("sharing-integration",)),
    Mutant("gso: UROCE_GSO=off ignored", "provider/device.cpp",
           "if (!env_switch(\"UROCE_GSO\", ec.gso) ||", "if (false ||", ("tshark-app",)),
    Mutant("handoff: a parked socket never given back (a poller that stops waits forever)",
           "transport/poll_handoff.cpp",
           "    if (gap < period && h->parked_.load(std::memory_order_relaxed)) {",
           "    if (h->parked_.load(std::memory_order_relaxed)) {", ("handoff",)),
    Mutant("handoff: a poller's deferred timers never given to the loop at the hand-back",
           "transport/rc_completer.cpp",
           "    timer_deferred_ = false;\n    if (closed_ || !timer_armed_) return;\n",
           "    timer_deferred_ = false;\n    if (true) return;\n", ("handoff",)),
    Mutant("handoff: a poller's timers always added to the loop (the engine thread woken)",
           "transport/engine.h",
           "        return socket_parked() && std::this_thread::get_id() != thread_.get_id();",
           "        return false && std::this_thread::get_id() != thread_.get_id();", ("handoff",)),
    Mutant("handoff: the watch period never grows past kWatchMicros in a long park",
           "transport/poll_handoff.cpp",
           "(long_park ? kLongWatchMicros : kWatchMicros)",
           "(long_park ? kWatchMicros : kWatchMicros)", ("handoff",)),
    Mutant("handoff: every park counts as long (a poller that stops waits a long period)",
           "transport/poll_handoff.cpp",
           ">= kLongParkMicros * 1000;", ">= 0;", ("handoff",)),
    Mutant("handoff: a long period outlives the park that earned it",
           "transport/poll_handoff.cpp",
           "    else if (period > kWatchMicros * 1000)\n"
           "        h->watch_ns_.store(kWatchMicros * 1000, std::memory_order_relaxed);\n",
           "", ("handoff",)),
    Mutant("handoff: a resend leaves the long watch period in force",
           "transport/poll_handoff.h",
           "        parked_at_ns_.store(now_ns(), std::memory_order_relaxed);\n"
           "        if (watch_ns_.load(std::memory_order_relaxed) > kWatchMicros * 1000)\n"
           "            watch_ns_.store(kWatchMicros * 1000, std::memory_order_relaxed);\n",
           "", ("handoff",)),
    Mutant("handoff: a parked socket given back at once (the engine thread still woken)",
           "transport/poll_handoff.cpp",
           "    if (gap < period && h->parked_.load(std::memory_order_relaxed)) {",
           "    if (gap < period && false) {", ("handoff",)),
    Mutant("handoff: the watch never shortens (ib_write_lat waits a full period per WRITE)",
           "transport/poll_handoff.cpp",
           "    if (h->last_poll_found_.load(std::memory_order_relaxed) && h->datagram_waiting())",
           "    if (false)", ("handoff",)),
    Mutant("handoff: the watch shortens after a mere pause of the polls (ib_send_lat slows)",
           "transport/poll_handoff.cpp",
           "    if (h->last_poll_found_.load(std::memory_order_relaxed) && h->datagram_waiting())",
           "    if (h->datagram_waiting())", ("handoff",)),
    Mutant("handoff: the watch never lengthens again (a busy poller's engine thread keeps waking)",
           "transport/poll_handoff.cpp",
           "            std::min(period * 2, (long_park",
           "            std::min(period * 1, (long_park", ("handoff",)),
    Mutant("handoff: inline progress off ignored", "transport/engine.cpp",
           "    if (!config_.inline_progress) return;\n", "", ("handoff",)),
    Mutant("handoff: UROCE_INLINE_PROGRESS=off ignored", "provider/device.cpp",
           "!env_switch(\"UROCE_INLINE_PROGRESS\", ec.inline_progress)", "false",
           ("fast-paths-integration",)),
    Mutant("receive buffers where malloc puts them (the kernel's copy into them slows on AMD)",
           "transport/page_aligned_buffer.h",
           "    static constexpr size_t kAlignment = 4096;",
           "    static constexpr size_t kAlignment = 16;", ("batch",)),
    Mutant("spin-then-block: the engine thread sleeps at once after every batch",
           "transport/engine.cpp",
           "    if (e->config_.engine_spin && e->config_.inline_progress) e->spin_after_batch();\n",
           "", ("handoff",)),
    Mutant("spin-then-block: spins beside a poller or a thread waiting for an event",
           "transport/engine.cpp",
           "    int64_t now = PollHandoff::now_ns();\n"
           "    if (!handoff_->quiet(now, kSpinQuietMicros * 1000)) return;\n",
           "    int64_t now = PollHandoff::now_ns();\n", ("handoff",)),
    Mutant("socket_parks misses the parks of a busy poll (counted only from the loop)",
           "transport/poll_handoff.cpp",
           "    if (!parked_.compare_exchange_strong(expected, true, std::memory_order_relaxed)) return;\n"
           "    bump(counters_.socket_parks);\n",
           "    if (!parked_.compare_exchange_strong(expected, true, std::memory_order_relaxed)) return;\n",
           ("fast-paths-integration",)),
    Mutant("socket_handbacks not counted", "transport/poll_handoff.cpp",
           "    bump(h->counters_.socket_handbacks);\n", "", ("fast-paths-integration",)),
    # --- ACKs held for the answer (transport/engine_held_acks.cpp) ---
    Mutant("held acks: the engine thread's batches send their ACKs at once",
           "transport/engine.cpp", "    e->batch_may_hold_acks_ = e->config_.hold_acks;",
           "    e->batch_may_hold_acks_ = false;", ("held-acks",)),
    Mutant("held acks: held whether or not the application answers (ib_write_bw's receiver waits)",
           "transport/rc_responder.cpp",
           "    return since_post < std::chrono::microseconds(engine_.config().answer_window_micros);",
           "    return true;", ("held-acks",)),
    Mutant("held acks: held while the application streams (ib_write_bw -b's ACKs wait)",
           "transport/rc_responder.cpp", "    if (sq_.size() > 1) return false;\n", "",
           ("held-acks",)),
    Mutant("held acks: held however short the local ACK timeout (the peer's retries run out)",
           "transport/rc_responder.cpp",
           "    if (attrs_.timeout != 0 && local_ack_timeout_us() < 4ull * engine_.config().ack_hold_micros)\n"
           "        return false;\n", "", ("held-acks",)),
    Mutant("held acks: the ACK of a resent request held too (its requester waits on)",
           "transport/rc_responder.cpp", "ack_pending_ && !ack_now_ && !closed_",
           "ack_pending_ && !closed_", ("held-acks",)),
    Mutant("held acks: a CQ poll does not send them", "transport/engine.cpp",
           "    send_held_posts();\n    flush_held_acks();\n", "    send_held_posts();\n",
           ("held-acks",)),
    Mutant("held acks: arming a CQ does not send them", "transport/engine.h",
           "        flush_held_acks();\n        if (handoff_) handoff_->on_arm();",
           "        if (handoff_) handoff_->on_arm();", ("held-acks",)),
    Mutant("held acks: no bound (the timer sends nothing)", "transport/engine_held_acks.cpp",
           "    bump(e->counters_->held_ack_timeouts);\n    e->flush_held_acks();",
           "    bump(e->counters_->held_ack_timeouts);", ("held-acks",)),
    Mutant("held acks: a WRITE answer leaves behind the ACK", "transport/rc_qp.cpp",
           "    if (!silent_answer) send_pending_ack();",
           "    if (silent_answer || !silent_answer) send_pending_ack();", ("held-acks",)),
    Mutant("held acks: a SEND answer overtakes the ACK (ib_send_lat -e overruns its CQ)",
           "transport/rc_qp.cpp",
           "        wqe.opcode == SendOpcode::RdmaWrite || wqe.opcode == SendOpcode::RdmaRead;",
           "        true;", ("held-acks",)),
    Mutant("held acks: a post keeps the ACK after its answer (it waits for the bound)",
           "transport/rc_qp.cpp",
           "    if (state_ == QpState::Rts && !may_wait(wqe, more)) pump();\n    send_pending_ack();",
           "    if (state_ == QpState::Rts && !may_wait(wqe, more)) pump();", ("held-acks",)),
    Mutant("held acks: UROCE_HOLD_ACKS ignored", "provider/device.cpp",
           "            !env_switch(\"UROCE_HOLD_ACKS\", ec.hold_acks)) {",
           "            false) {", ("fast-paths-integration",)),
    # --- posts held for the next poll (transport/held_posts.h), chains of WQEs ---
    Mutant("held posts: a poll sends nothing that waits for it", "transport/engine.cpp",
           "    if (held_posts_.empty()) return;\n", "    return;\n", ("held-posts",)),
    Mutant("held posts: a CQ poll does not send them", "transport/engine.cpp",
           "    send_held_posts();\n    flush_held_acks();\n    if (cq_empty)",
           "    flush_held_acks();\n    if (cq_empty)", ("held-posts",)),
    Mutant("held posts: the hand-back sends nothing (a poller that stops strands its posts)",
           "transport/poll_handoff.cpp", "    if (h->handed_back_) h->handed_back_();\n", "",
           ("held-posts",)),
    Mutant("held posts: a train's worth waits for the poll too", "transport/rc_qp.cpp",
           "    if (unpumped_packets_ >= TransmitBatch::kMaxPackets) return false;", "",
           ("held-posts",)),
    Mutant("held posts: hold_posts off ignored", "transport/engine.h",
           "return config_.hold_posts && socket_parked();", "return socket_parked();",
           ("held-posts",)),
    Mutant("held posts: UROCE_HOLD_POSTS=off ignored", "provider/device.cpp",
           "!env_switch(\"UROCE_HOLD_POSTS\", ec.hold_posts)", "false",
           ("fast-paths-integration",)),
    Mutant("chains: a WQE the provider refuses strands the ones before it", "provider/qp.cpp",
           "        if (qp->rc) qp->rc->ring();\n", "", ("fast-paths-integration",)),
    Mutant("chains: each WQE of a chain sends alone", "provider/qp.cpp",
           "qp->rc->post_send(w, wr->next != nullptr)", "qp->rc->post_send(w, false)",
           ("fast-paths-integration",)),
    # --- fault injector (transport/fault_injector.cpp) ---
    Mutant("faults: until=N ignored (loss in the teardown)", "transport/fault_injector.cpp",
           "    if (until_ != 0 && n >= until_) return {};\n", "", ("faults",)),
    Mutant("faults: corrupt= flips nothing (the receiver's ICRC check goes untested)",
           "transport/engine_faults.cpp",
           "        FaultInjector::corrupt(copy, fault.draw);", "", ("faults",)),
    Mutant("faults: corrupt= may flip the BTH's reserved byte (the ICRC cannot see it)",
           "transport/fault_injector.cpp", "    if (byte >= kMasked) ++byte;", "", ("faults",)),
    Mutant("faults: duplicate= sends once", "transport/engine_faults.cpp",
           "        copies = 2;\n        bump(counters_->tx_duplicated_fault);",
           "        copies = 1;\n        bump(counters_->tx_duplicated_fault);", ("faults",)),
    Mutant("faults: a burst never ends", "transport/fault_injector.cpp",
           "burst_bad_ = burst_bad_ ? d >= burst_leave_ : d < burst_enter_;",
           "burst_bad_ = burst_bad_ ? true : d < burst_enter_;", ("faults",)),
    Mutant("faults: packets of a train escape corrupt= and duplicate=",
           "transport/engine_transmit.cpp",
           "    if (batch && (ttl != 0 || !gso_enabled() || faulted)) {",
           "    if (batch && (ttl != 0 || !gso_enabled())) {", ("faults",)),
    # --- fault rules (fault_plan.h): which packets, delays, the receive side ---
    Mutant("faults: op= ignored (every opcode class faulted)", "transport/fault_injector.cpp",
           "(op_classes_ == 0 || (fault_op_class(opcode) & op_classes_) != 0)",
           "(static_cast<void>(opcode), true)",
           ("faults",)),
    Mutant("faults: qp= ignored (every QP's packets faulted)", "transport/fault_injector.cpp",
           "(!qpn_ || *qpn_ == dest_qp)", "(static_cast<void>(dest_qp), true)", ("faults",)),
    Mutant("faults: dir= ignored (rx rules fault sent packets too)",
           "transport/fault_injector.cpp", "return direction == direction_ && ",
           "return (static_cast<void>(direction), true) && ",
           ("faults",)),
    Mutant("faults: delay= sends at once", "transport/engine_faults.cpp",
           "    if (fault.delay_us == 0) {\n        TransmitResult result",
           "    if (true) {\n        TransmitResult result", ("faults",)),
    Mutant("faults: dir=rx delay= handles at once", "transport/engine_faults.cpp",
           "    if (fault.delay_us == 0) {\n        for (int i = 0; i < copies; ++i) receive_one",
           "    if (true) {\n        for (int i = 0; i < copies; ++i) receive_one", ("faults",)),
    Mutant("faults: jitter adds nothing", "transport/fault_injector.cpp",
           "            us += static_cast<int64_t>(draw(n, kJitterStream) % span) - jitter_us_;",
           "            static_cast<void>(span);", ("faults",)),
    Mutant("faults: reorder= holds nothing back", "transport/fault_injector.cpp",
           "    if (reorder_ != 0 && draw(n, kReorderStream) < reorder_) {",
           "    if (false) {", ("faults",)),
    Mutant("faults: dir=rx rules never applied", "transport/engine_faults.cpp",
           "    if (!faults_.enabled(FaultDirection::Rx)) {", "    if (true) {", ("faults",)),
    Mutant("faults: a packet put at the head of a delay line does not re-arm the timer",
           "transport/engine_faults.cpp", "    if (earliest) arm_delay_timer();", "",
           ("faults",)),
    Mutant("faults: a QP's tx_faults misses its corrupted, duplicated and held-back packets",
           "transport/engine_faults.cpp", "    if (qp) bump(qp->tx_faults);",
           "    static_cast<void>(qp);", ("faults",)),
    Mutant("faults: a full delay line keeps growing", "transport/delay_line.cpp",
           "    if (packets_.size() >= kMaxPackets) return false;\n", "", ("faults",)),
    Mutant("handoff: ibv_req_notify_cq leaves a long watch period (the waiter waits 1 ms)",
           "transport/poll_handoff.cpp",
           "    if (watch_ && parked_.load(std::memory_order_relaxed) &&\n"
           "        watch_ns_.load(std::memory_order_relaxed) > kWatchMicros * 1000) {",
           "    if (false) {", ("handoff",)),
    # --- the receive headers built once (transport/receive_batch.cpp) ---
    Mutant("receive batch: the control length the kernel shortened is not reset (GRO size lost)",
           "transport/receive_batch.cpp",
           "        msgs_[i].msg_hdr.msg_controllen = sizeof controls_[i].bytes;\n", "",
           ("receive-batch",)),
    Mutant("receive batch: the name length is not reset (an IPv6 sender cut to an IPv4 length)",
           "transport/receive_batch.cpp",
           "        msgs_[i].msg_hdr.msg_namelen = sizeof addrs_[i];\n", "", ("receive-batch",)),
    Mutant("receive batch: a truncated datagram reported whole", "transport/receive_batch.cpp",
           "d.length = (h.msg_flags & MSG_TRUNC) ? 0 : msgs_[i].msg_len;",
           "d.length = msgs_[i].msg_len;", ("receive-batch",)),
    Mutant("receive batch: every datagram of a read seen in the first buffer",
           "transport/receive_batch.cpp",
           "        d.data = buffers_.data() + i * buffer_bytes_;",
           "        d.data = buffers_.data();", ("receive-batch",)),
    # --- application memory whose pages are gone (transport/app_memory_guard.cpp) ---
    Mutant("app memory: a fault in a guarded access is not caught (the process dies)",
           "transport/app_memory_guard.cpp",
           "if (sigjmp_buf* landing = t_landing; landing && info && info->si_code > 0) {",
           "if (sigjmp_buf* landing = t_landing; false && landing) {",
           ("app-memory", "vanished-integration")),
    Mutant("app memory: the landing leaves SIGSEGV blocked (the next fault kills)",
           "transport/app_memory_guard.cpp",
           "        pthread_sigmask(SIG_UNBLOCK, &blocked, nullptr);\n", "", ("app-memory",)),
    Mutant("app memory: other faults are swallowed instead of reaching the previous handler",
           "transport/app_memory_guard.cpp",
           "    if (prev.sa_flags & SA_SIGINFO) {\n        prev.sa_sigaction(sig, info, context);",
           "    if (prev.sa_flags & SA_SIGINFO) {\n        (void)context;\n        _exit(0);",
           ("app-memory",)),
    Mutant("app memory: a handler installed since is not kept for the faults that are not ours",
           "transport/app_memory_guard.cpp",
           "    if (ours(now[0]) && ours(now[1])) return true;",
           "    if (g_current.load() != 0 || ours(now[0])) return true;", ("app-memory",)),
    Mutant("app memory: a sent SIGSEGV taken for a fault of a guarded access",
           "transport/app_memory_guard.cpp",
           "landing && info && info->si_code > 0) {", "landing) {", ("app-memory",)),
    Mutant("app memory: a scatter that faulted reported as done", "transport/scatter.cpp",
           "                    memory.note_fault();\n                    return KeyCheck::Unmapped;",
           "                    memory.note_fault();", ("vanished-integration",)),
    Mutant("app memory: an RDMA WRITE into gone pages acknowledged", "transport/rc_responder.cpp",
           "            if (!copy_last_byte_last(reinterpret_cast<uint8_t*>(local), pkt.payload.data(), len)) {",
           "            if (!copy_last_byte_last(reinterpret_cast<uint8_t*>(local), pkt.payload.data(), len) && false) {",
           ("vanished-integration",)),
    Mutant("app memory: a READ of gone pages answered (from pages the ICRC cannot read)",
           "transport/rc_responder.cpp",
           "            if (!refused && len > 0 && !guarded_probe(reinterpret_cast<const void*>(local), len)) {",
           "            if (false) {", ("vanished-integration",)),
    Mutant("app memory: the ICRC over gone pages not guarded (the sender dies)",
           "transport/engine_transmit.cpp",
           "    if (!guarded(compute)) {\n        bump(counters_->app_memory_faults);\n"
           "        return TransmitResult::Failed;\n    }",
           "    compute();", ("vanished-integration",)),
    Mutant("app memory: an atomic on gone pages acknowledged", "transport/rc_atomics.cpp",
           "        if (!guarded(execute)) {", "        if (guarded(execute) && false) {",
           ("vanished-integration",)),
    Mutant("app memory: faults not counted", "transport/memory_table.h",
           "        if (fault_counter_) fault_counter_->fetch_add(1, std::memory_order_relaxed);",
           "", ("vanished-integration",)),
]


def failed_cases(report):
    """Names of the test cases a JUnit report lists as failed (empty if there is none)."""
    try:
        import xml.etree.ElementTree as ET
        root = ET.parse(report).getroot()
    except (OSError, Exception):
        return []
    names = []
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            name = case.get("name", "?")
            if name not in names:
                names.append(name)
    return names


def run(cmd, cwd, timeout):
    # No report from an earlier command may be read as this one's (a non-Catch2 test writes
    # none). A Catch2 command ends with "-o"; it gets the report's absolute path.
    report = os.path.join(cwd, REPORT)
    if os.path.exists(report):
        os.remove(report)
    if cmd[-1] == "-o" or cmd[-1].endswith(" -o"):
        cmd = cmd[:-1] + [cmd[-1] + " " + report] if cmd[-1] != "-o" else cmd + [report]
    try:
        r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=timeout)
        return r.returncode
    except subprocess.TimeoutExpired:
        return "timeout"


def check_list():
    """Every mutant's texts occur exactly once in its file and its test keys exist (run by
    `meson test mutant-list`, so that the list follows the code)."""
    bad = 0
    for m in MUTANTS:
        text = open(os.path.join(TOP, m.file)).read()
        for find, _ in [(m.find, m.replace)] + list(m.also):
            n = text.count(find)
            if n != 1:
                print(f"stale: {m.name}: its text occurs {n} times in {m.file}")
                bad += 1
        for key in m.tests:
            if key not in TESTS:
                print(f"unknown test key {key!r}: {m.name}")
                bad += 1
    names = [m.name for m in MUTANTS]
    for name in sorted({n for n in names if names.count(n) > 1}):
        print(f"duplicate name: {name}")
        bad += 1
    print(f"{len(MUTANTS)} mutants, {bad} problems")
    return 1 if bad else 0


def main():
    if sys.argv[1:] == ["--check"]:
        return check_list()
    wanted = sys.argv[1:]
    selected = [m for m in MUTANTS if not wanted or any(w in m.name for w in wanted)]
    scratch = tempfile.mkdtemp(prefix="uroce-mutants-")
    src = os.path.join(scratch, "src")
    shutil.copytree(TOP, src, ignore=shutil.ignore_patterns(".git", "build*"))
    print(f"scratch copy: {src}", flush=True)
    keys = sorted({t for m in selected for t in m.tests})
    builds = sorted({TESTS[k][0] for k in keys})
    targets = {b: [TESTS[k][1] for k in keys if TESTS[k][0] == b] for b in builds}

    def build_dir(name):
        return os.path.join(scratch, "build-" + name)

    def rebuild(name, only=None):
        # Everything, unless every test of this build names its one target.
        wanted_targets = only if only is not None else targets[name]
        cmd = ["ninja", "-C", build_dir(name)]
        if all(wanted_targets):
            cmd += wanted_targets
        return run(cmd, scratch, 1800) == 0

    for b in builds:
        if run(["meson", "setup", build_dir(b), src] + BUILDS[b], scratch, 600) != 0 or not rebuild(b):
            print(f"mutants: the unmutated tree does not build ({b})", file=sys.stderr)
            return 2
    # The unmutated tree must pass, or every "kill" means nothing.
    for key in keys:
        if run(TESTS[key][2], build_dir(TESTS[key][0]), 1200) != 0:
            print(f"mutants: the unmutated tree fails '{key}'", file=sys.stderr)
            return 2
    killed = survived = other = 0
    for m in selected:
        path = os.path.join(src, m.file)
        original = open(path).read()
        pairs = ((m.find, m.replace),) + m.also
        stale = [f for f, _ in pairs if original.count(f) != 1]
        if stale:
            print(f"STALE      {m.name} ({m.file}: {stale[0]!r} not found exactly once)", flush=True)
            other += 1
            continue
        mutated = original
        for f, r in pairs:
            mutated = mutated.replace(f, r)
        open(path, "w").write(mutated)
        start = time.monotonic()
        try:
            needed = sorted({TESTS[k][0] for k in m.tests})
            if not all(rebuild(b, [TESTS[k][1] for k in m.tests if TESTS[k][0] == b]) for b in needed):
                print(f"UNBUILDABLE {m.name}", flush=True)
                other += 1
                continue
            caught = None
            for key in m.tests:
                build, _, cmd = TESTS[key]
                rc = run(cmd, build_dir(build), 900)
                if rc != 0:
                    caught = f"{key}: {'timed out' if rc == 'timeout' else 'failed'}"
                    cases = failed_cases(os.path.join(build_dir(build), REPORT))
                    if cases:
                        caught += ": " + "; ".join(cases[:3]) + (" ..." if len(cases) > 3 else "")
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
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"{killed} killed, {survived} survived" + (f", {other} stale or unbuildable" if other else ""))
    return 0 if survived == 0 and other == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
