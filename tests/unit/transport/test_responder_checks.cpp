// The responder against the IBA's rules: what an ACK may name, responder resources and
// duplicate READs, paced READ responses, length and opcode-sequence checks, whole-range key
// checks, receive buffers without local write, and CNPs. Most tests play the requester by
// hand (ForgedPeer) and read what the responder sent (TxRecorder).
#include <event2/event.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/engine_thread_blocker.h"
#include "tests/unit/transport/forged_peer.h"
#include "tests/unit/transport/hostile_peer.h"

using namespace uroce::transport;
using namespace uroce::transport::test;
namespace wire = uroce::wire;

namespace {

// A READ of kLong packets goes out in four bursts of RcQp::kResponseBurst, from a region of
// kLong packets (PairOptions::mem_bytes).
constexpr uint32_t kBurst = RcQp::kResponseBurst;
constexpr uint32_t kLong = 4 * kBurst;

PairOptions long_reads() {
    PairOptions o;
    o.mem_bytes = size_t{kLong} * kMtu;
    return o;
}

}  // namespace

// --- point 8: the coalesced ACK ---

TEST_CASE(
    "Responder: an ACK never names a PSN of a READ's responses; a lost READ response "
    "is recovered",
    "[responder][ack]") {
    Pair p;
    p.connect();
    fill(p.b.at(0), 4096, 5);
    // b (the responder) loses its first READ_RESP_ONLY.
    std::atomic<bool> lost_one{false};
    TxRecorder b_out(*p.b.engine, [&lost_one](const wire::ParsedPacket& pkt) {
        if (pkt.h.bth.opcode != static_cast<uint8_t>(wire::Opcode::RcReadResponseOnly))
            return false;
        return !lost_one.exchange(true);
    });
    {
        // The WRITE and the READ reach b in one receive batch, as they did live.
        EngineThreadBlocker hold_b(*p.b.engine);
        fill(p.a.at(0), 64, 6);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, 64)},
                                           p.b.iova + 8192, p.b.keys.rkey)) == 0);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaRead, 2, {p.a.sge(4096, 64)},
                                           p.b.iova + 0, p.b.keys.rkey)) == 0);
    }
    const auto done = p.wait(*p.a.scq, 2);
    REQUIRE(done.size() == 2);
    CHECK(done[0].status == WcStatus::Success);
    CHECK(done[1].wr_id == 2);
    CHECK(done[1].status == WcStatus::Success);
    CHECK(first_mismatch(p.a.at(4096), 64, 5) == 64);
    CHECK(all_bytes(p.a.at(4096 + 64), 64, kUntouched));
    CHECK(first_mismatch(p.b.at(8192), 64, 6) == 64);
    CHECK(lost_one);
    // The READ is PSN 1 (the WRITE 0): no ACK may name it.
    const auto out = sent(b_out);
    size_t acks = 0;
    for (const Sent& s : out) {
        if (!s.is_plain_ack()) continue;
        ++acks;
        CHECK(s.psn != 1);
    }
    CHECK(acks >= 1);
}

// --- point 10: responder resources and duplicates ---

TEST_CASE(
    "Responder: a duplicate READ from mid-range is answered from its resource, with the "
    "original MSN",
    "[responder][duplicate]") {
    Hostile t;
    REQUIRE(t.p.a.qp->post_recv(recv_wqe(1, {t.p.a.sge(60000, 64)})) == 0);
    t.peer.inject(t.read(0, 0, 3 * kMtu));  // PSNs 0..2, MSN 1
    wire::Headers send = t.peer.headers(wire::Opcode::RcSendOnly, 3);
    send.bth.ack_req = true;
    t.peer.inject(send, bytes(8, 9));  // MSN 2
    REQUIRE(t.p.wait_one(*t.p.a.rcq).status == WcStatus::Success);
    t.a_out.clear();
    // The kernel's requester asks for the rest from the first missing response.
    t.peer.inject(t.read(1, kMtu, 2 * kMtu));
    REQUIRE(t.p.wait_until([&] { return read_responses(t.a_out) == 2; }));
    const auto out = sent(t.a_out);
    REQUIRE(out.size() == 2);
    CHECK(out[0].is(wire::Opcode::RcReadResponseFirst));
    CHECK(out[0].psn == 1);
    CHECK(out[1].is(wire::Opcode::RcReadResponseLast));
    CHECK(out[1].psn == 2);
    for (size_t i = 0; i < 2; ++i) {
        CHECK(out[i].msn == 1);
        REQUIRE(out[i].payload.size() == kMtu);
        CHECK(std::memcmp(out[i].payload.data(), t.p.a.at((i + 1) * kMtu), kMtu) == 0);
    }
    CHECK(t.p.a.qp->state() == QpState::Rts);
}

TEST_CASE("Responder: duplicates that match no executed READ are dropped and counted",
          "[responder][duplicate]") {
    Hostile t;
    REQUIRE(t.p.a.qp->post_recv(recv_wqe(1, {t.p.a.sge(60000, 64)})) == 0);
    t.peer.inject(t.read(0, 0, kMtu));  // PSN 0
    wire::Headers send = t.peer.headers(wire::Opcode::RcSendOnly, 1);
    send.bth.ack_req = true;
    t.peer.inject(send, bytes(8, 9));
    REQUIRE(t.p.wait_one(*t.p.a.rcq).status == WcStatus::Success);
    t.a_out.clear();

    SECTION("a forged RETH: longer than the original") {
        t.peer.inject(t.read(0, 0, 60 * kMtu));
    }
    SECTION("a forged RETH: another address") {
        t.peer.inject(t.read(0, kMtu, kMtu));
    }
    SECTION("a forged RETH: another key") {
        wire::Headers h = t.read(0, 0, kMtu);
        h.reth.rkey ^= 0x100;
        t.peer.inject(h);
    }
    SECTION("a READ at the PSN of a SEND") {
        t.peer.inject(t.read(1, 0, kMtu));
    }
    t.p.wait_until([] { return false; }, 50ms);
    CHECK(read_responses(t.a_out) == 0);
    CHECK(t.p.a.counters().rx_duplicate_dropped.load() == 1);
    CHECK(t.p.a.qp->state() == QpState::Rts);
}

TEST_CASE("Responder: a duplicate READ cannot skip responses that have not gone out",
          "[responder][duplicate]") {
    Hostile t(default_attributes(), long_reads());
    {
        EngineThreadBlocker hold(*t.p.a.engine);
        t.peer.inject(t.read(0, 0, kLong * kMtu));
        REQUIRE(read_responses(t.a_out) == kBurst);
        // A "duplicate" asking from past what went out: no requester was sent those PSNs,
        // and moving the cursor there would leave the ones between unsent.
        constexpr uint32_t kSkip = kBurst + 5;
        t.peer.inject(t.read(kSkip, uint64_t{kSkip} * kMtu, (kLong - kSkip) * kMtu));
        CHECK(t.p.a.counters().rx_duplicate_dropped.load() == 1);
    }
    REQUIRE(t.p.wait_until([&] { return read_responses(t.a_out) == kLong; }));
    t.p.wait_until([] { return false; }, 20ms);
    const auto out = sent(t.a_out);
    REQUIRE(out.size() == kLong);  // each response once, in order
    for (uint32_t i = 0; i < kLong; ++i) {
        CAPTURE(i);
        CHECK(out[i].psn == i);
    }
}

TEST_CASE("Responder: more READs outstanding than max_dest_rd_atomic get an invalid request NAK",
          "[responder][resources]") {
    QpAttributes attrs = default_attributes();
    attrs.max_dest_rd_atomic = 1;
    Hostile t(attrs, long_reads());
    EngineThreadBlocker hold(*t.p.a.engine);
    t.peer.inject(t.read(0, 0, kLong * kMtu));  // PSNs 0..kLong-1; responses not all out yet
    REQUIRE(read_responses(t.a_out) < kLong);
    t.peer.inject(t.read(kLong, 0, kMtu));
    t.check_refused(wire::NakCode::InvalidRequest, kLong, AsyncEventType::QpRequestError);
}

TEST_CASE("Responder: max_dest_rd_atomic READs may be outstanding", "[responder][resources]") {
    QpAttributes attrs = default_attributes();
    attrs.max_dest_rd_atomic = 2;
    Hostile t(attrs);
    {
        EngineThreadBlocker hold(*t.p.a.engine);
        t.peer.inject(t.read(0, 0, 64 * kMtu));
        t.peer.inject(t.read(64, 0, kMtu));
    }
    REQUIRE(t.p.wait_until([&] { return read_responses(t.a_out) == 65; }));
    CHECK(t.p.a.qp->state() == QpState::Rts);
    CHECK(naks(t.a_out, wire::NakCode::InvalidRequest, 64) == 0);
}

// --- point 11: paced READ responses ---

TEST_CASE("Responder: a large READ goes out in bursts, continued from the engine thread",
          "[responder][paced]") {
    Hostile t(default_attributes(), long_reads());
    {
        EngineThreadBlocker hold(*t.p.a.engine);
        t.peer.inject(t.read(0, 0, kLong * kMtu));
        // The receive path sent a first burst only, a whole one.
        CHECK(read_responses(t.a_out) == kBurst);
    }
    REQUIRE(t.p.wait_until([&] { return read_responses(t.a_out) == kLong; }));
    const auto out = sent(t.a_out);
    REQUIRE(out.size() == kLong);
    for (uint32_t i = 0; i < kLong; ++i) {
        CAPTURE(i);
        CHECK(out[i].psn == i);
        CHECK(out[i].is(i == 0           ? wire::Opcode::RcReadResponseFirst
                        : i == kLong - 1 ? wire::Opcode::RcReadResponseLast
                                         : wire::Opcode::RcReadResponseMiddle));
        REQUIRE(out[i].payload.size() == kMtu);
        CHECK(std::memcmp(out[i].payload.data(), t.p.a.at(i * kMtu), kMtu) == 0);
    }
}

TEST_CASE("Responder: a duplicate READ restarts its responses instead of adding a copy",
          "[responder][paced][duplicate]") {
    Hostile t(default_attributes(), long_reads());
    {
        EngineThreadBlocker hold(*t.p.a.engine);
        t.peer.inject(t.read(0, 0, kLong * kMtu));
        t.peer.inject(t.read(0, 0, kLong * kMtu));
        t.peer.inject(t.read(0, 0, kLong * kMtu));
    }
    REQUIRE(t.p.wait_until([&] {
        const auto out = sent(t.a_out);
        return !out.empty() && out.back().is(wire::Opcode::RcReadResponseLast);
    }));
    t.p.wait_until([] { return false; }, 50ms);
    // A first burst for the request and for each duplicate (each restarting at PSN 0),
    // then the rest once: not three copies of the READ.
    CHECK(read_responses(t.a_out) == 3 * kBurst + (kLong - kBurst));
    CHECK(t.p.a.counters().rx_duplicate.load() == 2);
}

TEST_CASE("Responder: requests after a READ are executed after its responses have gone out",
          "[responder][paced]") {
    constexpr uint32_t kRead = 2 * kBurst;  // PSNs 0..kRead-1; the WRITE's is kRead
    Hostile t(default_attributes(), long_reads());
    const auto fresh = bytes(kMtu, 77);
    const GuardedBytes old = t.p.a.mem;
    {
        EngineThreadBlocker hold(*t.p.a.engine);
        t.peer.inject(t.read(0, 0, kRead * kMtu));
        t.peer.inject(t.write(wire::Opcode::RcWriteOnly, kRead, 0, kMtu), fresh);
        // Accepted but waiting: the bytes the READ is returning are still there.
        CHECK(t.p.a.mem == old);
    }
    REQUIRE(t.p.wait_until([&] {
        for (const Sent& s : sent(t.a_out))
            if (s.is_plain_ack() && s.psn == kRead) return true;
        return false;
    }));
    const auto out = sent(t.a_out);
    REQUIRE(out.size() == kRead + 1);
    for (uint32_t i = 0; i < kRead; ++i) {
        CAPTURE(i);
        CHECK(out[i].psn == i);
        CHECK(out[i].is_read_response());
        // The READ returns what was there before the WRITE that came after it.
        REQUIRE(out[i].payload.size() == kMtu);
        CHECK(std::memcmp(out[i].payload.data(), old.data() + i * kMtu, kMtu) == 0);
    }
    CHECK(out[kRead].is_plain_ack());
    CHECK(std::memcmp(t.p.a.at(0), fresh.data(), kMtu) == 0);
    CHECK(std::memcmp(t.p.a.at(kMtu), old.data() + kMtu, old.size() - kMtu) == 0);
}

TEST_CASE("Responder: deregistration in the middle of a READ stops it at once",
          "[responder][paced][keys]") {
    Hostile t(default_attributes(), long_reads());
    {
        EngineThreadBlocker hold(*t.p.a.engine);
        t.peer.inject(t.read(0, 0, kLong * kMtu));
        const size_t before = read_responses(t.a_out);
        REQUIRE(before < kLong);
        REQUIRE(t.p.a.engine->memory().remove(t.p.a.keys.lkey));
        hold.release();
        REQUIRE(t.p.wait_until([&] { return t.p.a.qp->state() == QpState::Err; }));
        t.p.wait_until([] { return false; }, 50ms);
        CHECK(read_responses(t.a_out) == before);
    }
    // As rxe does: a remote access NAK for the READ request's PSN.
    t.check_refused(wire::NakCode::RemoteAccessError, 0, AsyncEventType::QpAccessError);
}

TEST_CASE(
    "Responder: a duplicate READ for a region deregistered since gets an access NAK at the "
    "PSN it asked for; the QP stays up",
    "[responder][duplicate][keys]") {
    Hostile t;
    t.peer.inject(t.read(0, 0, 4 * kMtu));  // PSNs 0..3, every response out once
    REQUIRE(t.p.wait_until([&] { return read_responses(t.a_out) == 4; }));
    // The requester had the READ complete; its application deregisters the region (here the
    // responder's, as a peer told it to), and the READ's resent request comes in late.
    REQUIRE(t.p.a.engine->memory().remove(t.p.a.keys.lkey));
    t.a_out.clear();
    t.peer.inject(t.read(1, kMtu, 3 * kMtu));
    REQUIRE(
        t.p.wait_until([&] { return naks(t.a_out, wire::NakCode::RemoteAccessError, 1) == 1; }));
    t.p.wait_until([] { return false; }, 50ms);
    CHECK(read_responses(t.a_out) == 0);
    CHECK(sent(t.a_out).size() == 1);  // the NAK only, once
    CHECK(t.p.a.qp->state() == QpState::Rts);
    CHECK(!has_event(t.p.a, AsyncEventType::QpAccessError));
    // The connection goes on: a WRITE into the same bytes, registered again, executes.
    const MemoryKeys again = t.p.a.engine->memory().add(kPd, t.p.a.addr(0), t.p.a.mem.size(),
                                                        t.p.a.iova, kRemoteWrite | kRemoteRead);
    wire::Headers w = t.write(wire::Opcode::RcWriteOnly, 4, 0, kMtu);
    w.reth.rkey = again.rkey;
    const auto fresh = bytes(kMtu, 78);
    t.peer.inject(w, fresh);
    REQUIRE(t.p.wait_until([&] {
        for (const Sent& s : sent(t.a_out))
            if (s.is_plain_ack() && s.psn == 4) return true;
        return false;
    }));
    CHECK(std::memcmp(t.p.a.at(0), fresh.data(), kMtu) == 0);
}

TEST_CASE(
    "Responder: a replay cut short by a deregistration NAKs the PSN it reached; the QP stays up",
    "[responder][paced][duplicate][keys]") {
    Hostile t(default_attributes(), long_reads());
    t.peer.inject(t.read(0, 0, kLong * kMtu));
    REQUIRE(t.p.wait_until([&] { return read_responses(t.a_out) == kLong; }));
    t.a_out.clear();
    {
        // The requester lost responses from PSN 10 on and asks for them again; the region
        // goes while the replay is under way.
        EngineThreadBlocker hold(*t.p.a.engine);
        t.peer.inject(t.read(10, 10 * kMtu, (kLong - 10) * kMtu));
        const size_t before = read_responses(t.a_out);
        REQUIRE(before > 0);
        REQUIRE(before < kLong - 10);
        REQUIRE(t.p.a.engine->memory().remove(t.p.a.keys.lkey));
        hold.release();
        const uint32_t at = 10 + static_cast<uint32_t>(before);
        REQUIRE(t.p.wait_until(
            [&] { return naks(t.a_out, wire::NakCode::RemoteAccessError, at) == 1; }));
        t.p.wait_until([] { return false; }, 50ms);
        CHECK(read_responses(t.a_out) == before);
    }
    CHECK(t.p.a.qp->state() == QpState::Rts);
}

// --- point 12 / test-quality 5: opcode sequence and lengths, forged ---

TEST_CASE("Responder: out-of-sequence opcodes and wrong lengths are refused, memory untouched",
          "[responder][length]") {
    Hostile t;
    REQUIRE(t.p.a.qp->post_recv(recv_wqe(1, {t.p.a.sge(40000, 8192)})) == 0);
    const auto mtu_bytes = bytes(kMtu, 3);
    const GuardedBytes before = t.p.a.mem;
    size_t written = 0;  // bytes a first, valid packet was allowed to write at offset 0
    uint32_t bad_psn = 0;
    wire::NakCode code = wire::NakCode::InvalidRequest;

    SECTION("WRITE Middle without a First") {
        t.peer.inject(t.write(wire::Opcode::RcWriteMiddle, 0, 0, 0), mtu_bytes);
    }
    SECTION("WRITE First while a WRITE is open") {
        t.peer.inject(t.write(wire::Opcode::RcWriteFirst, 0, 0, 3 * kMtu, false), mtu_bytes);
        t.peer.inject(t.write(wire::Opcode::RcWriteFirst, 1, 0, 3 * kMtu, false), mtu_bytes);
        written = kMtu;
        bad_psn = 1;
    }
    SECTION("SEND Middle inside a WRITE") {
        t.peer.inject(t.write(wire::Opcode::RcWriteFirst, 0, 0, 3 * kMtu, false), mtu_bytes);
        t.peer.inject(t.peer.headers(wire::Opcode::RcSendMiddle, 1), mtu_bytes);
        written = kMtu;
        bad_psn = 1;
    }
    SECTION("WRITE Middle shorter than the MTU") {
        t.peer.inject(t.write(wire::Opcode::RcWriteFirst, 0, 0, 3 * kMtu, false), mtu_bytes);
        t.peer.inject(t.peer.headers(wire::Opcode::RcWriteMiddle, 1), bytes(kMtu / 2, 4));
        written = kMtu;
        bad_psn = 1;
    }
    SECTION("WRITE Middle with no payload") {
        t.peer.inject(t.write(wire::Opcode::RcWriteFirst, 0, 0, 3 * kMtu, false), mtu_bytes);
        t.peer.inject(t.peer.headers(wire::Opcode::RcWriteMiddle, 1));
        written = kMtu;
        bad_psn = 1;
    }
    SECTION("WRITE Only longer than the MTU") {
        t.peer.inject(t.write(wire::Opcode::RcWriteOnly, 0, 0, 2 * kMtu), bytes(2 * kMtu, 4));
    }
    SECTION("SEND Only longer than the MTU") {
        wire::Headers h = t.peer.headers(wire::Opcode::RcSendOnly, 0);
        t.peer.inject(h, bytes(2 * kMtu, 4));
    }
    SECTION("WRITE Last overrunning the RETH length") {
        t.peer.inject(t.write(wire::Opcode::RcWriteFirst, 0, 0, kMtu + 100, false), mtu_bytes);
        t.peer.inject(t.peer.headers(wire::Opcode::RcWriteLast, 1), bytes(200, 4));
        written = kMtu;
        bad_psn = 1;
    }
    SECTION("WRITE Last with no payload") {
        t.peer.inject(t.write(wire::Opcode::RcWriteFirst, 0, 0, kMtu, false), mtu_bytes);
        t.peer.inject(t.peer.headers(wire::Opcode::RcWriteLast, 1));
        written = kMtu;
        bad_psn = 1;
    }
    SECTION("SEND Only with a pad count that does not pad to 4 bytes") {
        const auto pkt = forge_packet(t.peer.headers(wire::Opcode::RcSendOnly, 0), bytes(13, 4),
                                      wire::IpFlow{t.peer.ip, t.p.a.engine->config().ip,
                                                   t.peer.port, t.p.a.engine->config().port},
                                      {}, 0);
        t.p.a.engine->receive_datagram(pkt, t.peer.ip, t.peer.port);
    }
    SECTION("WRITE with a RETH length over 2^31") {
        t.peer.inject(t.write(wire::Opcode::RcWriteFirst, 0, 0, (1u << 31) + kMtu), mtu_bytes);
    }
    SECTION("READ with a RETH length over 2^31") {
        t.peer.inject(t.read(0, 0, (1u << 31) + 1));
    }
    t.check_refused(code, bad_psn, AsyncEventType::QpRequestError);
    CHECK(read_responses(t.a_out) == 0);
    // Only the valid first packet (if any) landed; every other byte is as it was.
    CHECK(std::memcmp(t.p.a.at(0), mtu_bytes.data(), written) == 0);
    CHECK(std::memcmp(t.p.a.at(written), before.data() + written, before.size() - written) == 0);
    // The receive was flushed, not completed with data.
    const Completion c = t.p.wait_one(*t.p.a.rcq);
    CHECK(c.status == WcStatus::WrFlushErr);
}

// --- test-quality 1 and 2: whole-range checks ---

TEST_CASE(
    "Responder: a READ running off its region returns no byte, not even its first "
    "packets",
    "[responder][keys]") {
    Pair p;
    p.connect();
    TxRecorder b_out(*p.b.engine);
    fill(p.b.at(0), p.b.mem.size(), 8);
    // First packet inside b's region, the end 1 KiB beyond it.
    const size_t start = p.b.mem.size() - 3 * kMtu;
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaRead, 1, {p.a.sge(0, 4 * kMtu)},
                                       p.b.iova + start, p.b.keys.rkey)) == 0);
    const Completion c = p.wait_one(*p.a.scq);
    CHECK(c.status == WcStatus::RemAccessErr);
    CHECK(read_responses(b_out) == 0);
    CHECK(naks(b_out, wire::NakCode::RemoteAccessError, 0) == 1);
    CHECK(all_bytes(p.a.at(0), p.a.mem.size(), kUntouched));
    CHECK(p.b.qp->state() == QpState::Err);
    CHECK(has_event(p.b, AsyncEventType::QpAccessError));
}

TEST_CASE("Responder: a WRITE running off its region changes no byte of it", "[responder][keys]") {
    Pair p;
    p.connect();
    // A second, smaller region inside b's memory: the bytes around it are guards.
    const size_t region_at = 4096;
    const size_t region_len = 16 * kMtu;
    const uint64_t region_iova = 0x300000000000ull;
    const MemoryKeys keys = p.b.engine->memory().add(kPd, p.b.addr(region_at), region_len,
                                                     region_iova, kLocalWrite | kRemoteWrite);
    fill(p.a.at(0), 8 * kMtu, 2);
    // Starts 4 packets before the region's end, ends 4 packets beyond it.
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, 8 * kMtu)},
                                       region_iova + region_len - 4 * kMtu, keys.rkey)) == 0);
    const Completion c = p.wait_one(*p.a.scq);
    CHECK(c.status == WcStatus::RemAccessErr);
    CHECK(all_bytes(p.b.at(0), p.b.mem.size(), kUntouched));
    CHECK(p.b.qp->state() == QpState::Err);
    CHECK(has_event(p.b, AsyncEventType::QpAccessError));
}

// Deregistration takes effect at once (memory_table.h), in the middle of a WRITE too: it does
// not wait for the message to end, and no packet after it writes a byte. (The READ's case is
// above.) b gets the first packets, then nothing until the region is gone.
TEST_CASE("Responder: a region deregistered in the middle of a WRITE takes no byte more",
          "[responder][keys]") {
    constexpr uint32_t kPackets = 24;
    constexpr uint32_t kArrive = 8;  // packets that arrive before the deregistration
    PairOptions o;
    o.mem_bytes = size_t{kPackets} * kMtu;
    Pair p(o);
    p.connect();
    std::atomic<bool> losing{true};
    std::atomic<bool> silent{false};
    std::atomic<int64_t> first_psn{-1};
    TxRecorder a_out(*p.a.engine, [&](const wire::ParsedPacket& pkt) {
        if (pkt.h.bth.opcode == static_cast<uint8_t>(wire::Opcode::RcWriteFirst))
            first_psn = pkt.h.bth.psn;
        if (silent) return true;  // nothing reaches b while it deregisters
        const int64_t first = first_psn.load();
        if (!losing || first < 0 || !(pkt.info->flags & wire::kWrite)) return false;
        return psn_diff(pkt.h.bth.psn, static_cast<uint32_t>(first)) >= int32_t{kArrive};
    });
    fill(p.a.at(0), p.a.mem.size(), 6);
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, kPackets * kMtu)},
                                       p.b.iova, p.b.keys.rkey)) == 0);
    const size_t arrived = size_t{kArrive} * kMtu;
    // The last byte of a packet is written last.
    REQUIRE(eventually([&] { return landed_byte(&p.b.mem[arrived - 1], p.a.mem[arrived - 1]); }));
    silent = true;  // b gets nothing more until the region is gone
    // From another thread: a read lock the engine kept would hold it for ever.
    auto removed = std::make_shared<std::atomic<int>>(-1);
    std::thread([removed, &memory = p.b.engine->memory(), lkey = p.b.keys.lkey] {
        removed->store(memory.remove(lkey) ? 1 : 0);
    }).detach();
    REQUIRE(eventually([&] { return removed->load() >= 0; }));
    CHECK(removed->load() == 1);
    losing = false;
    silent = false;
    const Completion c = p.wait_one(*p.a.scq);
    CHECK(c.status == WcStatus::RemAccessErr);
    CHECK(std::memcmp(p.b.at(0), p.a.at(0), arrived) == 0);
    CHECK(all_bytes(p.b.at(arrived), p.b.mem.size() - arrived, kUntouched));
    CHECK(p.b.qp->state() == QpState::Err);
    CHECK(has_event(p.b, AsyncEventType::QpAccessError));
}

// --- test-quality 6: receive buffer without local write ---

TEST_CASE("Responder: a receive buffer without local write is not written", "[responder][keys]") {
    Pair p;
    p.connect();
    TxRecorder b_out(*p.b.engine);
    const MemoryKeys ro = p.b.engine->memory().add(kPd, p.b.addr(8192), 4096, p.b.addr(8192), 0);
    REQUIRE(p.b.qp->post_recv(recv_wqe(5, {Sge{p.b.addr(8192), 4096, ro.lkey}})) == 0);
    fill(p.a.at(0), 100, 4);
    REQUIRE(p.a.qp->post_send(send_wqe(1, {p.a.sge(0, 100)})) == 0);
    const Completion r = p.wait_one(*p.b.rcq);
    CHECK(r.wr_id == 5);
    CHECK(r.status == WcStatus::LocProtErr);
    const Completion s = p.wait_one(*p.a.scq);
    CHECK(s.status == WcStatus::RemOpErr);
    CHECK(naks(b_out, wire::NakCode::RemoteOperationalError, 0) == 1);
    CHECK(p.b.qp->state() == QpState::Err);
    CHECK(has_event(p.b, AsyncEventType::QpFatal));
    CHECK(all_bytes(p.b.at(0), p.b.mem.size(), kUntouched));
}

// --- point 13: CNP ---

TEST_CASE("Engine: a RoCEv2 CNP is accepted and counted, not malformed", "[responder][cnp]") {
    Hostile t;
    wire::Headers h;
    h.bth.opcode = static_cast<uint8_t>(wire::Opcode::Cnp);
    h.bth.dest_qp = t.p.a.qp->qpn();
    h.bth.fecn = false;
    h.bth.becn = true;
    const std::vector<uint8_t> reserved(wire::kCnpReservedBytes, 0);
    t.peer.inject(h, reserved);
    CHECK(t.p.a.counters().rx_cnp.load() == 1);
    CHECK(t.p.a.counters().rx_malformed.load() == 0);
    CHECK(t.p.a.qp->state() == QpState::Rts);
    CHECK(t.a_out.packets().empty());
}
