// Batching on the real kernel path: packets leave in UDP GSO trains (transmit_batch.h) and
// arrive through UDP_GRO reads, or are cut by the kernel and arrive one by one. Whatever the
// combination, every byte arrives, in place, and every packet's ICRC is the one for the
// IPv4 identification it really carries (Linux numbers the segments of a train 0, 1, 2, ...).
#include <sys/socket.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"
#include "transport/transmit_batch.h"

using namespace uroce::transport;
using namespace uroce::transport::test;

namespace {

constexpr uint32_t kWrite = 48 * kMtu;     // FIRST alone, then trains of MIDDLEs and a LAST
constexpr uint32_t kSend = 20 * kMtu + 3;  // SEND FIRST joins the MIDDLEs' train; odd tail
constexpr uint32_t kRead = 24 * kMtu;      // READ responses, batched by the responder

PairOptions big_pair() {
    PairOptions o;
    o.mem_bytes = 256 * 1024;
    return o;
}

// For tests that count packets and sends: nothing is resent, however slow the machine (no
// adaptive retransmission, and attributes with a local ACK timeout of 4 s).
PairOptions counting_pair() {
    PairOptions o = big_pair();
    o.adaptive = false;
    return o;
}
QpAttributes counting_attributes() {
    QpAttributes attrs = default_attributes();
    attrs.timeout = 20;
    return attrs;
}

// A WRITE from three unaligned pieces, a SEND, and a READ: a -> b, b -> a, each checked.
void exchange(Pair& p) {
    fill(p.a.at(0), kWrite, 11);
    // Three SGEs of odd lengths: a packet's payload spans pieces.
    const uint32_t s1 = 1000, s2 = 20000;
    REQUIRE(p.a.qp->post_send(
                rdma_wqe(SendOpcode::RdmaWrite, 1,
                         {p.a.sge(0, s1), p.a.sge(s1, s2), p.a.sge(s1 + s2, kWrite - s1 - s2)},
                         p.b.iova + 4096, p.b.keys.rkey)) == 0);
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
    CHECK(first_mismatch(p.b.at(4096), kWrite, 11) == kWrite);
    CHECK(all_bytes(p.b.at(0), 4096, kUntouched));
    CHECK(all_bytes(p.b.at(4096 + kWrite), 1024, kUntouched));

    const size_t send_at = 128 * 1024;
    fill(p.a.at(send_at), kSend, 12);
    REQUIRE(p.b.qp->post_recv(recv_wqe(2, {p.b.sge(send_at, kSend)})) == 0);
    REQUIRE(p.a.qp->post_send(send_wqe(3, {p.a.sge(send_at, kSend)})) == 0);
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
    const Completion r = p.wait_one(*p.b.rcq);
    CHECK(r.status == WcStatus::Success);
    CHECK(r.byte_len == kSend);
    CHECK(first_mismatch(p.b.at(send_at), kSend, 12) == kSend);

    // READ: b's responses come back in trains.
    fill(p.b.at(200 * 1024), kRead, 13);
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaRead, 4, {p.a.sge(200 * 1024, kRead)},
                                       p.b.iova + 200 * 1024, p.b.keys.rkey)) == 0);
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
    CHECK(first_mismatch(p.a.at(200 * 1024), kRead, 13) == kRead);
}

}  // namespace

TEST_CASE("GSO trains and GRO reads carry every byte, each ICRC for its identification",
          "[transmit_batch]") {
    PairOptions o = big_pair();
    SECTION("GSO on, GRO on: trains stay whole, segment k checks as identification k") {
        Pair p(o);
        p.connect();
        exchange(p);
        CHECK(p.a.counters().tx_gso_sends.load() > 0);
        CHECK(p.b.counters().tx_gso_sends.load() > 0);  // the READ responses
        // The WRITE's FIRST and its MIDDLEs: two trains, one sendmmsg.
        CHECK(p.a.counters().tx_multi_sends.load() > 0);
        CHECK(p.b.counters().rx_gro_datagrams.load() > 0);
        CHECK(p.a.counters().rx_gro_datagrams.load() > 0);
        // Every segment's ICRC matched the identification of its place in the train.
        CHECK(p.a.counters().rx_icrc_unseen_fields.load() == 0);
        CHECK(p.b.counters().rx_icrc_unseen_fields.load() == 0);
        CHECK(p.a.counters().rx_bad_icrc.load() == 0);
        CHECK(p.b.counters().rx_bad_icrc.load() == 0);
        CHECK(p.a.counters().tx_gso_fallbacks.load() == 0);
    }
    SECTION("GSO on, GRO off: the kernel cuts the trains, identifications 1, 2, ... arrive") {
        o.gro_a = o.gro_b = false;
        Pair p(o);
        p.connect();
        exchange(p);
        CHECK(p.a.counters().tx_gso_sends.load() > 0);
        CHECK(p.b.counters().rx_gro_datagrams.load() == 0);
        // Segments after the first carry non-zero identifications, which the receiver does
        // not see: accepted because the sender's ICRC covered exactly those values.
        CHECK(p.b.counters().rx_icrc_unseen_fields.load() > 0);
        CHECK(p.a.counters().rx_icrc_unseen_fields.load() > 0);
        CHECK(p.a.counters().rx_bad_icrc.load() == 0);
        CHECK(p.b.counters().rx_bad_icrc.load() == 0);
    }
    SECTION("GSO off: one datagram per packet, identification 0 everywhere") {
        o.gso_a = o.gso_b = false;
        Pair p(o);
        p.connect();
        exchange(p);
        CHECK(p.a.counters().tx_gso_sends.load() == 0);
        CHECK(p.b.counters().tx_gso_sends.load() == 0);
        CHECK(p.a.counters().tx_multi_sends.load() == 0);
        CHECK(p.b.counters().rx_gro_datagrams.load() == 0);
        CHECK(p.b.counters().rx_icrc_unseen_fields.load() == 0);
        CHECK(p.a.counters().rx_icrc_unseen_fields.load() == 0);
    }
}

TEST_CASE("Trains under loss: go-back-N resends in trains, every byte arrives once",
          "[transmit_batch]") {
    PairOptions o = big_pair();
    o.faults_a.drop = 0.05;
    o.faults_a.seed = 5;
    o.faults_b.drop = 0.05;
    o.faults_b.seed = 6;
    Pair p(o);
    p.connect();
    for (int round = 0; round < 4; ++round) {
        INFO("round " << round);
        exchange(p);
    }
    CHECK(p.a.counters().tx_dropped_fault.load() > 0);
    CHECK(p.a.counters().retransmitted_packets.load() > 0);
    CHECK(p.a.counters().tx_gso_sends.load() > 0);
    CHECK(p.a.counters().rx_bad_icrc.load() == 0);
    CHECK(p.b.counters().rx_bad_icrc.load() == 0);
    CHECK(p.a.qp->state() == QpState::Rts);
    CHECK(p.b.qp->state() == QpState::Rts);
}

// The responder answers the READs of one receive batch at its end, all in one transmit
// batch (rc_responder.cpp): a READ's LAST shares the train of the next one's FIRST (both
// carry an AETH, a size the MIDDLEs have not). Seen here with one-packet READs, whose
// responses are all of one size: one train for the lot, where READs answered one by one
// would take a sendmsg each and no GSO send at all.
TEST_CASE("READs that arrive in one batch are answered in one train", "[transmit_batch]") {
    Pair p(counting_pair());
    QpAttributes attrs = counting_attributes();
    attrs.max_rd_atomic = attrs.max_dest_rd_atomic = 16;
    p.connect(attrs, attrs);
    constexpr uint32_t kReads = 8, kLen = 64;
    fill(p.b.at(0), kReads * kLen, 21);
    // One post of eight WQEs: the requests leave in one train and reach b in one read.
    for (uint32_t i = 0; i < kReads; ++i)
        REQUIRE(
            p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaRead, i, {p.a.sge(4096 + i * kLen, kLen)},
                                       p.b.iova + i * kLen, p.b.keys.rkey),
                              i + 1 < kReads) == 0);
    const auto s = p.wait(*p.a.scq, kReads);
    REQUIRE(s.size() == kReads);
    for (uint32_t i = 0; i < kReads; ++i) {
        CHECK(s[i].wr_id == i);
        CHECK(s[i].status == WcStatus::Success);
    }
    CHECK(first_mismatch(p.a.at(4096), kReads * kLen, 21) == kReads * kLen);
    // The requests went as one train (what the case sets up) ...
    CHECK(p.a.counters().tx_packets.load() == kReads);
    CHECK(p.a.counters().tx_gso_sends.load() == 1);
    // ... and so did the responses, nothing else.
    CHECK(p.b.counters().tx_packets.load() == kReads);
    CHECK(p.b.counters().tx_gso_sends.load() == 1);
    CHECK(p.b.counters().rx_gro_datagrams.load() == 1);
}

// A WRITE's FIRST carries the RETH, so it cannot share the train of the shorter MIDDLEs;
// a 64 KiB SEND of 4 KiB packets fills more than one train (65,507 bytes). A batch keeps
// several trains and hands them to the kernel in one sendmmsg (transmit_batch.h).
TEST_CASE("The trains of one batch leave in one system call", "[transmit_batch]") {
    Pair p(counting_pair());
    p.connect(counting_attributes(), counting_attributes());
    // FIRST + MIDDLE (closed: the MIDDLE is shorter), then 46 MIDDLEs and the LAST.
    fill(p.a.at(0), kWrite, 31);
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, kWrite)},
                                       p.b.iova + 4096, p.b.keys.rkey)) == 0);
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
    CHECK(first_mismatch(p.b.at(4096), kWrite, 31) == kWrite);
    CHECK(p.a.counters().tx_packets.load() == kWrite / kMtu);
    CHECK(p.a.counters().tx_gso_sends.load() == 2);
    CHECK(p.a.counters().tx_multi_sends.load() == 1);
    // Each train's packets carry the ICRCs for identifications 0, 1, 2, ... of their own
    // train, as the kernel numbers them, and b's GRO reads found exactly those.
    CHECK(p.b.counters().rx_packets.load() == kWrite / kMtu);
    CHECK(p.b.counters().rx_icrc_unseen_fields.load() == 0);
    CHECK(p.b.counters().rx_bad_icrc.load() == 0);
}

// A batch builds its packets in the thread's staging area (transmit_batch.h); a second batch
// opened on a thread whose area is taken sends each packet alone, gathered from registered
// memory, with the ICRC for identification 0. Nothing in uroce nests batches today: the test
// thread holds the outer one while a post's own batch pumps on it.
TEST_CASE("A batch opened inside another sends its packets alone, every byte intact",
          "[transmit_batch]") {
    Pair p(counting_pair());
    p.connect(counting_attributes(), counting_attributes());
    fill(p.a.at(0), kWrite, 41);
    {
        TransmitBatch outer(*p.a.engine, nullptr);
        REQUIRE(outer.usable());
        TransmitBatch inner(*p.a.engine, nullptr);
        CHECK_FALSE(inner.usable());
    }
    {
        TransmitBatch outer(*p.a.engine, nullptr);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, kWrite)},
                                           p.b.iova + 4096, p.b.keys.rkey)) == 0);
        // Sent by the post itself, one packet per system call.
        CHECK(p.a.counters().tx_packets.load() == kWrite / kMtu);
        CHECK(p.a.counters().tx_gso_sends.load() == 0);
        CHECK(p.a.counters().tx_multi_sends.load() == 0);
    }
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
    CHECK(first_mismatch(p.b.at(4096), kWrite, 41) == kWrite);
    CHECK(p.b.counters().rx_icrc_unseen_fields.load() == 0);
    CHECK(p.b.counters().rx_bad_icrc.load() == 0);
    // The outer batch gone, the next post builds trains again.
    fill(p.a.at(0), kWrite, 42);
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 2, {p.a.sge(0, kWrite)},
                                       p.b.iova + 4096, p.b.keys.rkey)) == 0);
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
    CHECK(first_mismatch(p.b.at(4096), kWrite, 42) == kWrite);
    CHECK(p.a.counters().tx_gso_sends.load() == 2);
    CHECK(p.b.counters().rx_bad_icrc.load() == 0);
}

// The staging area is reused from batch to batch: a packet's pad bytes must be written, not
// left as the last batch had them (IBA: pad bytes are zero; the ICRC would cover them either
// way, so only the bytes show it).
TEST_CASE("A staged packet's pad bytes are zero, whatever the staging area held",
          "[transmit_batch]") {
    Pair p(big_pair());
    p.connect();
    // 0xff bytes all over the posting thread's staging area: a WRITE of full packets.
    std::memset(p.a.at(0), 0xff, kWrite);
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, kWrite)},
                                       p.b.iova + 4096, p.b.keys.rkey)) == 0);
    REQUIRE(p.wait_one(*p.a.scq).status == WcStatus::Success);
    TxRecorder a_out(*p.a.engine);
    // SENDs whose LAST carries 3, 2 and 1 payload bytes: pad 1, 2, 3.
    const size_t at = 128 * 1024;
    for (uint32_t tail = 3; tail >= 1; --tail) {
        const uint32_t len = 20 * kMtu + tail;
        fill(p.a.at(at), len, 60 + tail);
        REQUIRE(p.b.qp->post_recv(recv_wqe(tail, {p.b.sge(at, len)})) == 0);
        REQUIRE(p.a.qp->post_send(send_wqe(tail, {p.a.sge(at, len)})) == 0);
        REQUIRE(p.wait_one(*p.a.scq).status == WcStatus::Success);
        REQUIRE(p.wait_one(*p.b.rcq).byte_len == len);
        CHECK(first_mismatch(p.b.at(at), len, 60 + tail) == len);
    }
    const auto lasts = a_out.with_opcode(uroce::wire::Opcode::RcSendLast);
    REQUIRE(lasts.size() >= 3);
    for (const SentPacket& last : lasts) {
        const uint8_t pad = last.parsed().h.bth.pad;
        CHECK(pad == 4 - last.parsed().payload.size());
        for (size_t i = last.bytes.size() - 4 - pad; i < last.bytes.size() - 4; ++i)
            CHECK(last.bytes[i] == 0);
    }
}

// Only speed depends on it (transmit_batch.h): each train's first payload starts a cache
// line of the page-aligned staging area, at the first such place after what is taken.
TEST_CASE("A train's first payload starts a cache line of the staging area", "[transmit_batch]") {
    for (size_t used : {size_t{0}, size_t{1}, size_t{52}, size_t{53}, size_t{4112}, size_t{9000}})
        for (uint32_t header : {12u, 16u, 28u, 32u, 64u}) {
            INFO("used " << used << ", header " << header);
            const uint32_t at = TransmitBatch::train_offset(used, header);
            CHECK(at >= used);
            CHECK(at < used + 64);
            CHECK((at + header) % 64 == 0);
        }
}

// SO_NO_CHECK (no UDP checksum) makes Linux refuse GSO sends with EINVAL while it still
// takes single datagrams: the refusal a path without checksum offload gives.
TEST_CASE("A path that refuses GSO gets the packets one by one, ICRCs redone for id 0",
          "[transmit_batch]") {
    // Only the 67 ms local ACK timeout could resend anything (not a probe or an early
    // timeout that a stall on a loaded machine triggers): a resend means a packet was lost.
    PairOptions o = big_pair();
    o.adaptive = false;
    Pair p(o);
    p.connect();
    const int fd = p.a.engine->sender_for_qpn(p.a.qp->qpn()).fd();
    const int one = 1;
    REQUIRE(::setsockopt(fd, SOL_SOCKET, SO_NO_CHECK, &one, sizeof one) == 0);

    for (uint64_t round = 0; round < 2; ++round) {
        INFO("round " << round);
        fill(p.a.at(0), kWrite, 20 + round);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, round, {p.a.sge(0, kWrite)},
                                           p.b.iova + 4096, p.b.keys.rkey)) == 0);
        CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
        CHECK(first_mismatch(p.b.at(4096), kWrite, 20 + round) == kWrite);
    }
    // Refused once, then never tried again by this engine.
    CHECK(p.a.counters().tx_gso_fallbacks.load() == 1);
    CHECK_FALSE(p.a.engine->gso_enabled());
    CHECK(p.a.counters().tx_gso_sends.load() == 0);
    // Every packet of the refused train went out alone with the ICRC for identification 0:
    // none needed the unseen-identification rule, and nothing was lost on the way.
    CHECK(p.b.counters().rx_icrc_unseen_fields.load() == 0);
    CHECK(p.b.counters().rx_bad_icrc.load() == 0);
    CHECK(p.a.counters().retransmit_timeouts.load() == 0);
    CHECK(p.a.counters().retransmitted_packets.load() == 0);
    // b is untouched by a's trouble.
    CHECK(p.b.engine->gso_enabled());
}

// Where the kernel copies received datagrams to (page_aligned_buffer.h): a buffer 16 bytes
// into a page made the copy of a GSO train several times slower on AMD CPUs. Only speed
// depends on it, so the addresses are checked, with GRO (64 KiB buffers) and without.
TEST_CASE("Receive buffers start on a page, every buffer of a batch on a cache line",
          "[transmit_batch]") {
    PairOptions o = big_pair();
    o.gro_b = false;
    Pair p(o);
    p.connect();
    exchange(p);  // the buffers carried real traffic both ways
    for (Engine* e : {p.a.engine.get(), p.b.engine.get()}) {
        REQUIRE(e->receive_buffers() > 1);
        CHECK(reinterpret_cast<uintptr_t>(e->receive_buffer(0)) % 4096 == 0);
        for (size_t i = 1; i < e->receive_buffers(); ++i)
            CHECK(reinterpret_cast<uintptr_t>(e->receive_buffer(i)) % 64 == 0);
    }
    CHECK(p.a.counters().rx_gro_datagrams.load() > 0);   // a: GRO on
    CHECK(p.b.counters().rx_gro_datagrams.load() == 0);  // b: GRO off
}
