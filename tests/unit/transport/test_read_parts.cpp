// A responder asked again for part of a READ it executed (rc_responder.cpp, on_duplicate):
// a requester that kept the responses after a gap asks for the gap alone, from the PSN of its
// first response to the end of a response before the READ's end. The responder answers that
// part and nothing more, with the READ's MSN, a First (or Only) first and a Last at the part's
// end; a part that does not match whole responses of the READ is dropped. a is the responder
// under test; the test forges the requester's packets (hostile_peer.h).
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <vector>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/engine_thread_blocker.h"
#include "tests/unit/transport/forged_peer.h"
#include "tests/unit/transport/hostile_peer.h"

using namespace uroce::transport;
using namespace uroce::transport::test;
using namespace std::chrono_literals;
namespace wire = uroce::wire;

namespace {

constexpr uint32_t kPkts = 6;  // responses of the READ each case executes

// a has executed a READ of kPkts responses at PSN 0 (MSN 1) and a SEND after it (MSN 2),
// every response has gone out once, and what a sent so far is forgotten.
struct ExecutedRead {
    Hostile t;
    ExecutedRead() {
        fill(t.p.a.at(0), kPkts * kMtu, 31);
        REQUIRE(t.p.a.qp->post_recv(recv_wqe(1, {t.p.a.sge(kPkts * kMtu, 64)})) == 0);
        t.peer.inject(t.read(0, 0, kPkts * kMtu));
        wire::Headers send = t.peer.headers(wire::Opcode::RcSendOnly, kPkts);
        send.bth.ack_req = true;
        t.peer.inject(send, bytes(8, 9));
        REQUIRE(t.p.wait_one(*t.p.a.rcq).status == WcStatus::Success);
        REQUIRE(t.p.wait_until([&] { return read_responses(t.a_out) == kPkts; }));
        t.a_out.clear();
    }
    // The READ responses a sent since, once nothing more has come for 30 ms.
    std::vector<Sent> responses_after_quiet() {
        t.p.wait_until([] { return false; }, 30ms);
        std::vector<Sent> out;
        for (const Sent& s : sent(t.a_out))
            if (s.is_read_response()) out.push_back(s);
        return out;
    }
    // Checks that `s` is response `i` of the READ, with opcode `op`, its data and MSN.
    void check_response(const Sent& s, uint32_t i, wire::Opcode op) {
        INFO("response " << i);
        CHECK(s.psn == i);
        CHECK(s.is(op));
        CHECK(s.msn == 1);
        REQUIRE(s.payload.size() == kMtu);
        CHECK(std::memcmp(s.payload.data(), t.p.a.at(uint64_t{i} * kMtu), kMtu) == 0);
    }
};

}  // namespace

TEST_CASE("Responder: a duplicate READ for part of a READ is answered with that part alone",
          "[responder][duplicate][read_recovery]") {
    ExecutedRead r;
    // Responses 2 and 3 of 0..5: a First and a Last, then nothing (not on to the end).
    r.t.peer.inject(r.t.read(2, 2 * kMtu, 2 * kMtu));
    auto out = r.responses_after_quiet();
    REQUIRE(out.size() == 2);
    r.check_response(out[0], 2, wire::Opcode::RcReadResponseFirst);
    r.check_response(out[1], 3, wire::Opcode::RcReadResponseLast);
    // One response later on: an Only. Parts move forward, each answered as asked.
    r.t.a_out.clear();
    r.t.peer.inject(r.t.read(4, 4 * kMtu, kMtu));
    out = r.responses_after_quiet();
    REQUIRE(out.size() == 1);
    r.check_response(out[0], 4, wire::Opcode::RcReadResponseOnly);
    // And the rest from there, as before: to the READ's end.
    r.t.a_out.clear();
    r.t.peer.inject(r.t.read(4, 4 * kMtu, 2 * kMtu));
    out = r.responses_after_quiet();
    REQUIRE(out.size() == 2);
    r.check_response(out[0], 4, wire::Opcode::RcReadResponseFirst);
    r.check_response(out[1], 5, wire::Opcode::RcReadResponseLast);
    CHECK(r.t.p.a.counters().rx_duplicate_dropped.load() == 0);
    CHECK(r.t.p.a.qp->state() == QpState::Rts);
}

TEST_CASE("Responder: a part that is not whole responses of the READ is dropped",
          "[responder][duplicate][read_recovery]") {
    ExecutedRead r;
    SECTION("ending inside a response") {
        r.t.peer.inject(r.t.read(1, kMtu, kMtu + 1));
    }
    SECTION("of no bytes") {
        r.t.peer.inject(r.t.read(1, kMtu, 0));
    }
    SECTION("running past the READ's end") {
        r.t.peer.inject(r.t.read(4, 4 * kMtu, 3 * kMtu));
    }
    SECTION("at an address that is not its first response's") {
        r.t.peer.inject(r.t.read(2, 3 * kMtu, kMtu));
    }
    CHECK(r.responses_after_quiet().empty());
    CHECK(r.t.p.a.counters().rx_duplicate_dropped.load() == 1);
    CHECK(r.t.p.a.qp->state() == QpState::Rts);
}

TEST_CASE("Responder: a part asked for while the READ's first responses go runs to the end",
          "[responder][duplicate][read_recovery]") {
    // Responses go out in bursts; one asked for again before the last burst has gone is
    // answered to the READ's end: stopping at the part's end would leave the rest unsent.
    constexpr uint32_t kBurst = RcQp::kResponseBurst;
    constexpr uint32_t kLong = 4 * kBurst;
    PairOptions o;
    o.mem_bytes = size_t{kLong} * kMtu;
    Hostile t(default_attributes(), o);
    fill(t.p.a.at(0), kLong * kMtu, 5);
    {
        EngineThreadBlocker hold(*t.p.a.engine);
        t.peer.inject(t.read(0, 0, kLong * kMtu));
        REQUIRE(read_responses(t.a_out) == kBurst);
        t.peer.inject(t.read(2, 2 * kMtu, kMtu));
    }
    REQUIRE(t.p.wait_until([&] { return read_responses(t.a_out) >= kLong + kBurst - 2; }));
    t.p.wait_until([] { return false; }, 30ms);
    std::vector<Sent> out;
    for (const Sent& s : sent(t.a_out))
        if (s.is_read_response()) out.push_back(s);
    // The first burst, then from response 2 (a First) to the last (a Last), each once.
    REQUIRE(out.size() == kLong + kBurst - 2);
    for (uint32_t k = 0; k < out.size(); ++k) {
        const uint32_t i = k < kBurst ? k : k - kBurst + 2;
        CAPTURE(k, i);
        CHECK(out[k].psn == i);
        if (k == kBurst) CHECK(out[k].is(wire::Opcode::RcReadResponseFirst));
        if (k + 1 == out.size()) CHECK(out[k].is(wire::Opcode::RcReadResponseLast));
        if (k > kBurst && k + 1 < out.size()) CHECK(out[k].is(wire::Opcode::RcReadResponseMiddle));
        REQUIRE(out[k].payload.size() == kMtu);
        CHECK(std::memcmp(out[k].payload.data(), t.p.a.at(uint64_t{i} * kMtu), kMtu) == 0);
    }
}
