// The IB CM state machine (transport/cm/cm_agent.h): two agents on an in-memory wire that
// can lose, hold back or forge messages, driven by a fake clock, so timeouts and retries are
// exercised without waiting.
#include <catch2/catch.hpp>

#include <cerrno>
#include <deque>
#include <functional>
#include <vector>

#include "transport/cm/cm_agent.h"
#include "transport/cm/ip_cm_header.h"

using namespace uroce::transport::cm;

namespace {

constexpr uint32_t kIpA = 0x7f000001;
constexpr uint32_t kIpB = 0x7f000002;
constexpr uint32_t kIpForger = 0x7f000009;
constexpr uint64_t kService = service_id_of(PortSpace::Tcp, 7471);

struct Datagram {
    uint32_t src;
    uint32_t dst;
    std::array<uint8_t, kMadBytes> mad;
};

// Every MAD any agent sends, in order; deliver() hands them on, drop() loses them.
struct Wire {
    std::deque<Datagram> in_flight;
    std::vector<Datagram> sent;  // everything ever sent, for the checks
};

class WireSender : public MadSender {
  public:
    WireSender(Wire& wire, uint32_t ip) : wire_(wire), ip_(ip) {}
    void send_mad(uint32_t dst_ip, std::span<const uint8_t, kMadBytes> mad) override {
        Datagram d{ip_, dst_ip, {}};
        std::copy(mad.begin(), mad.end(), d.mad.begin());
        wire_.in_flight.push_back(d);
        wire_.sent.push_back(d);
    }

  private:
    Wire& wire_;
    uint32_t ip_;
};

CmAttribute attribute(const Datagram& d) {
    return static_cast<CmAttribute>((d.mad[16] << 8) | d.mad[17]);
}

struct Node {
    Node(Wire& wire, uint32_t addr, uint16_t prefix, CmClock::time_point& now, CmTimers timers)
        : sender(wire, addr),
          ip(addr),
          agent(
              sender, prefix, 0x1000 + addr, timers,
              [this](const CmEvent& e) { events.push_back(e); }, [&now] { return now; }) {}

    // The one event of `type` recorded since the last take(); fails the test otherwise.
    CmEvent take(CmEventType type) {
        INFO("node " << ip << " expects " << to_string(type));
        REQUIRE(events.size() == 1);
        CmEvent e = events.front();
        CHECK(e.type == type);
        INFO("got " << to_string(e.type));
        REQUIRE(e.type == type);
        events.clear();
        return e;
    }

    WireSender sender;
    uint32_t ip;
    std::vector<CmEvent> events;
    CmAgent agent;
};

struct Fixture {
    Fixture() = default;
    explicit Fixture(CmTimers t) : timers(t) {}

    CmClock::time_point now{};
    Wire wire;
    CmTimers timers{.response_exponent = 18,
                    .max_retries = 3,
                    .timewait = std::chrono::seconds(2),
                    .unmatched_hold = std::chrono::milliseconds(100)};
    Node a{wire, kIpA, 0x011, now, timers};
    Node b{wire, kIpB, 0x022, now, timers};

    Node& node(uint32_t ip) { return ip == kIpA ? a : b; }

    // Delivers what is in flight (and what that causes) until the wire is quiet; messages
    // `lose` returns true for are dropped instead. Bounded: a loop of answers fails.
    void deliver(const std::function<bool(const Datagram&)>& lose = {}) {
        for (int n = 0; n < 100 && !wire.in_flight.empty(); ++n) {
            Datagram d = wire.in_flight.front();
            wire.in_flight.pop_front();
            if (lose && lose(d)) continue;
            if (d.dst == kIpA || d.dst == kIpB) node(d.dst).agent.on_mad(d.src, d.mad);
        }
        REQUIRE(wire.in_flight.empty());
    }

    // Moves the clock by `d` and lets both agents act on it.
    void advance(CmClock::duration d) {
        now += d;
        a.agent.expire();
        b.agent.expire();
    }
    CmClock::duration response() const { return response_time(timers.response_exponent); }

    size_t count_sent(CmAttribute attr, uint32_t src) const {
        size_t n = 0;
        for (const auto& d : wire.sent)
            if (attribute(d) == attr && d.src == src) ++n;
        return n;
    }

    CmReq request() const {
        CmReq r;
        r.service_id = kService;
        r.local_qpn = 0x11a2b3;
        r.starting_psn = 0x123456;
        r.path_mtu = 3;
        r.private_data[50] = 0x5a;
        return r;
    }

    // B answers the REQ it got as `idb` (REP), A the REP (RTU): established on both sides.
    void accept(uint32_t idb, uint32_t ida) {
        REQUIRE(b.agent.send_rep(idb, CmRep{}) == 0);
        deliver();
        a.take(CmEventType::RepReceived);
        REQUIRE(a.agent.send_rtu(ida) == 0);
        deliver();
        b.take(CmEventType::Established);
    }

    // A and B through REQ, REP, RTU; returns (A's comm ID, B's comm ID).
    std::pair<uint32_t, uint32_t> connect() {
        const int listening = b.agent.listen(kService, 77);
        REQUIRE((listening == 0 || listening == EADDRINUSE));
        const uint32_t ida = a.agent.send_req(kIpB, request());
        REQUIRE(ida != 0);
        deliver();
        const CmEvent req = b.take(CmEventType::ReqReceived);
        CmRep rep;
        rep.local_qpn = 0x22c4d5;
        rep.starting_psn = 0x654321;
        REQUIRE(b.agent.send_rep(req.comm_id, rep) == 0);
        deliver();
        const CmEvent got = a.take(CmEventType::RepReceived);
        REQUIRE(got.comm_id == ida);
        REQUIRE(a.agent.send_rtu(ida) == 0);
        deliver();
        b.take(CmEventType::Established);
        REQUIRE(a.agent.state(ida) == CmState::Established);
        REQUIRE(b.agent.state(req.comm_id) == CmState::Established);
        return {ida, req.comm_id};
    }
};

// A REJ Timeout as an active side that knows no comm ID of its peer's sends it.
CmRej make_rej_for_test(uint32_t sender_id) {
    CmRej r;
    r.local_comm_id = sender_id;
    r.remote_comm_id = 0;
    r.message_rejected = CmMessageKind::Other;
    r.reason = static_cast<uint16_t>(CmRejectReason::Timeout);
    return r;
}

}  // namespace

TEST_CASE_METHOD(Fixture, "a connection is set up and torn down", "[cm]") {
    REQUIRE(b.agent.listen(kService, 77) == 0);
    const uint32_t ida = a.agent.send_req(kIpB, request());
    CHECK(ida >> 20 == 0x011);  // the comm ID carries the agent's prefix (its slot)
    CHECK(a.agent.state(ida) == CmState::ReqSent);
    deliver();

    const CmEvent req = b.take(CmEventType::ReqReceived);
    CHECK(req.listener == 77);
    CHECK(req.peer_ip == kIpA);
    CHECK(req.comm_id >> 20 == 0x022);
    const CmReq& r = std::get<CmReq>(req.message->body);
    CHECK(r.local_comm_id == ida);
    CHECK(r.local_qpn == 0x11a2b3);
    CHECK(r.starting_psn == 0x123456);
    CHECK(r.local_ca_guid == 0x1000 + kIpA);
    CHECK(r.private_data[50] == 0x5a);
    CHECK(r.remote_cm_response_timeout == 18);
    CHECK(r.max_cm_retries == 3);

    CmRep rep;
    rep.local_qpn = 0x22c4d5;
    rep.starting_psn = 0x654321;
    rep.private_data[0] = 0xa5;
    REQUIRE(b.agent.send_rep(req.comm_id, rep) == 0);
    CHECK(b.agent.state(req.comm_id) == CmState::RepSent);
    deliver();
    const CmEvent got = a.take(CmEventType::RepReceived);
    const CmRep& p = std::get<CmRep>(got.message->body);
    CHECK(p.local_comm_id == req.comm_id);
    CHECK(p.remote_comm_id == ida);
    CHECK(p.local_qpn == 0x22c4d5);
    CHECK(p.private_data[0] == 0xa5);
    CHECK(p.local_ca_guid == 0x1000 + kIpB);
    // REP and RTU carry the REQ's transaction ID.
    CHECK(got.message->header.transaction_id == req.message->header.transaction_id);

    REQUIRE(a.agent.send_rtu(ida) == 0);
    deliver();
    b.take(CmEventType::Established);

    REQUIRE(a.agent.send_dreq(ida) == 0);
    deliver();
    const CmEvent dreq = b.take(CmEventType::DreqReceived);
    CHECK(std::get<CmDreq>(dreq.message->body).remote_qpn == 0x22c4d5);  // B's own QP
    REQUIRE(b.agent.send_drep(req.comm_id) == 0);
    deliver();
    a.take(CmEventType::Disconnected);
    CHECK(a.agent.state(ida) == CmState::Timewait);
    CHECK(b.agent.state(req.comm_id) == CmState::Timewait);

    advance(timers.timewait - std::chrono::milliseconds(1));
    CHECK(a.events.empty());
    advance(std::chrono::milliseconds(1));
    a.take(CmEventType::TimewaitExit);
    b.take(CmEventType::TimewaitExit);
    CHECK_FALSE(a.agent.state(ida).has_value());
    CHECK_FALSE(b.agent.state(req.comm_id).has_value());
    CHECK_FALSE(a.agent.next_deadline().has_value());
    const auto ca = a.agent.counters();
    const auto cb = b.agent.counters();
    CHECK(ca.rx_unexpected + cb.rx_unexpected + ca.rx_unmatched + cb.rx_unmatched == 0);
    CHECK(ca.tx_resends + cb.tx_resends == 0);
}

TEST_CASE_METHOD(Fixture, "a REQ nobody listens for is rejected once it has waited", "[cm]") {
    b.agent.listen(kService + 1, 1);
    const uint32_t ida = a.agent.send_req(kIpB, request());
    deliver();
    // Held for a listener that may come (unmatched_hold): no answer yet.
    CHECK(a.events.empty());
    CHECK(b.events.empty());
    CHECK(b.agent.counters().rx_held == 1);
    CHECK(b.agent.counters().rej_sent == 0);
    REQUIRE(b.agent.next_deadline() == now + timers.unmatched_hold);
    advance(timers.unmatched_hold - std::chrono::milliseconds(1));
    deliver();
    CHECK(a.events.empty());
    CHECK(b.agent.counters().rej_sent == 0);
    advance(std::chrono::milliseconds(1));
    deliver();
    CHECK(b.events.empty());
    const CmEvent rej = a.take(CmEventType::Rejected);
    CHECK(rej.comm_id == ida);
    CHECK(std::get<CmRej>(rej.message->body).reason ==
          static_cast<uint16_t>(CmRejectReason::InvalidServiceId));
    CHECK_FALSE(a.agent.state(ida).has_value());
    CHECK(b.agent.counters().rej_sent == 1);
    CHECK(b.agent.counters().rx_unmatched == 1);
    CHECK_FALSE(b.agent.next_deadline().has_value());
    // A listener after the REJ does not see the rejected REQ.
    CHECK(b.agent.listen(kService, 2) == 0);
    advance(timers.unmatched_hold);
    CHECK(b.events.empty());
    // Listening afterwards makes the same service reachable, at once.
    b.agent.stop_listening(kService + 1);
    CHECK(b.agent.listen(kService, 3) == EADDRINUSE);
    a.agent.send_req(kIpB, request());
    deliver();
    CHECK(b.take(CmEventType::ReqReceived).listener == 2);
}

TEST_CASE_METHOD(Fixture, "a REQ that comes just before its listener is taken", "[cm]") {
    SECTION("REQ") {
        const uint32_t ida = a.agent.send_req(kIpB, request());
        deliver();
        CHECK(b.events.empty());
        // The peer's REQ resent while it waits is not held twice.
        CmReq again = request();
        again.local_comm_id = ida;
        b.agent.on_mad(kIpA, encode_cm_mad({MadHeader{}, again}));
        CHECK(b.agent.counters().rx_held == 1);
        CHECK(b.agent.counters().rx_duplicates == 1);
        advance(timers.unmatched_hold / 2);
        REQUIRE(b.agent.listen(kService, 9) == 0);
        // Due at once, taken on the owner's next expire(), not inside listen().
        CHECK(b.events.empty());
        REQUIRE(b.agent.next_deadline() == now);
        b.agent.expire();
        const CmEvent req = b.take(CmEventType::ReqReceived);
        CHECK(req.listener == 9);
        CHECK(req.peer_ip == kIpA);
        CHECK(std::get<CmReq>(req.message->body).local_qpn == 0x11a2b3);
        accept(req.comm_id, ida);
        CHECK(a.agent.state(ida) == CmState::Established);
        // Past the hold nothing more happens: the held REQ is gone, no REJ went out.
        advance(timers.unmatched_hold);
        deliver();
        CHECK(a.events.empty());
        CHECK(b.events.empty());
        CHECK(b.agent.counters().rej_sent == 0);
        CHECK(count_sent(CmAttribute::Rej, kIpB) == 0);
    }
    SECTION("SIDR REQ") {
        CmSidrReq sreq;
        sreq.service_id = kService;
        const uint32_t ida = a.agent.send_sidr_req(kIpB, sreq);
        deliver();
        CHECK(a.events.empty());
        REQUIRE(b.agent.listen(kService, 4) == 0);
        b.agent.expire();
        const CmEvent req = b.take(CmEventType::SidrReqReceived);
        CHECK(req.listener == 4);
        CmSidrRep rep;
        rep.qpn = 0x123;
        REQUIRE(b.agent.send_sidr_rep(req.comm_id, rep) == 0);
        deliver();
        const CmEvent got = a.take(CmEventType::SidrRepReceived);
        CHECK(got.comm_id == ida);
        CHECK(std::get<CmSidrRep>(got.message->body).status == 0);
    }
    SECTION(
        "its listener came up in another context of the device: no answer, the resend goes there") {
        b.agent.set_listened_elsewhere([](uint64_t service) { return service == kService; });
        const uint32_t ida = a.agent.send_req(kIpB, request());
        deliver();
        advance(timers.unmatched_hold);
        deliver();
        CHECK(a.events.empty());
        CHECK(b.events.empty());
        CHECK(b.agent.counters().rx_left_to_other == 1);
        CHECK(b.agent.counters().rej_sent == 0);
        CHECK(count_sent(CmAttribute::Rej, kIpB) == 0);
        CHECK_FALSE(b.agent.next_deadline().has_value());
        CHECK(a.agent.state(ida) == CmState::ReqSent);  // A resends after its response time
        // A listener here still comes first: the REQ is taken, not left.
        a.agent.send_req(kIpB, request());
        deliver();
        REQUIRE(b.agent.listen(kService, 6) == 0);
        b.agent.expire();
        CHECK(b.take(CmEventType::ReqReceived).listener == 6);
        CHECK(b.agent.counters().rx_left_to_other == 1);
    }
    SECTION("another service's listener does not take it") {
        a.agent.send_req(kIpB, request());
        deliver();
        REQUIRE(b.agent.listen(kService + 1, 5) == 0);
        CHECK(b.agent.next_deadline() == now + timers.unmatched_hold);
        b.agent.expire();
        CHECK(b.events.empty());
        advance(timers.unmatched_hold);
        deliver();
        CHECK(a.take(CmEventType::Rejected).comm_id != 0);
        CHECK(b.events.empty());
    }
}

TEST_CASE("REQs for no listener: held up to a bound, or not at all when told so", "[cm]") {
    SECTION("at most 64 wait; the next is rejected at once") {
        Fixture f;
        for (int i = 0; i < 65; ++i) f.a.agent.send_req(kIpB, f.request());
        f.deliver();
        CHECK(f.b.agent.counters().rx_held == 64);
        CHECK(f.b.agent.counters().rej_sent == 1);
        CHECK(f.a.take(CmEventType::Rejected).comm_id != 0);
        f.advance(f.timers.unmatched_hold);
        f.deliver();
        CHECK(f.a.events.size() == 64);
        CHECK(f.b.agent.counters().rej_sent == 65);
    }
    SECTION("a hold of 0 rejects at once, as a kernel's CM does") {
        Fixture f(CmTimers{.unmatched_hold = {}});
        f.a.agent.send_req(kIpB, f.request());
        f.deliver();
        CHECK(f.a.take(CmEventType::Rejected).comm_id != 0);
        CHECK(f.b.agent.counters().rx_held == 0);
        CHECK_FALSE(f.b.agent.next_deadline().has_value());
    }
}

TEST_CASE_METHOD(Fixture, "lost messages are sent again, and answered once", "[cm]") {
    REQUIRE(b.agent.listen(kService, 1) == 0);
    SECTION("the REQ") {
        const uint32_t ida = a.agent.send_req(kIpB, request());
        deliver([](const Datagram&) { return true; });
        advance(response() - std::chrono::microseconds(1));
        CHECK(wire.in_flight.empty());  // not yet
        advance(std::chrono::microseconds(1));
        CHECK(a.agent.counters().tx_resends == 1);
        deliver();
        const CmEvent req = b.take(CmEventType::ReqReceived);
        CHECK(std::get<CmReq>(req.message->body).local_comm_id == ida);
    }
    SECTION("the REP: a resent REQ gets it again, and the user sees one REQ") {
        const uint32_t ida = a.agent.send_req(kIpB, request());
        deliver();
        const CmEvent req = b.take(CmEventType::ReqReceived);
        REQUIRE(b.agent.send_rep(req.comm_id, CmRep{}) == 0);
        deliver([](const Datagram& d) { return attribute(d) == CmAttribute::Rep; });
        // Both timers run out together: A resends its REQ, B its REP. Lose B's own resend,
        // so that the REP A gets is B's answer to the resent REQ.
        advance(response());
        int reps = 0;
        deliver(
            [&reps](const Datagram& d) { return attribute(d) == CmAttribute::Rep && reps++ == 0; });
        CHECK(b.events.empty());
        CHECK(b.agent.counters().rx_duplicates == 1);
        a.take(CmEventType::RepReceived);
        REQUIRE(a.agent.send_rtu(ida) == 0);
        deliver();
        b.take(CmEventType::Established);
    }
    SECTION("the RTU: B resends its REP, A answers with the RTU again") {
        const uint32_t ida = a.agent.send_req(kIpB, request());
        deliver();
        const CmEvent req = b.take(CmEventType::ReqReceived);
        REQUIRE(b.agent.send_rep(req.comm_id, CmRep{}) == 0);
        deliver();
        a.take(CmEventType::RepReceived);
        REQUIRE(a.agent.send_rtu(ida) == 0);
        deliver([](const Datagram& d) { return attribute(d) == CmAttribute::Rtu; });
        CHECK(b.agent.state(req.comm_id) == CmState::RepSent);
        advance(response());
        deliver();
        b.take(CmEventType::Established);
        CHECK(a.events.empty());
        CHECK(count_sent(CmAttribute::Rtu, kIpA) == 2);
    }
    SECTION("the DREP: a DREQ resent to a connection in timewait is answered") {
        wire.in_flight.clear();
        b.events.clear();
        auto [ida, idb] = connect();
        REQUIRE(a.agent.send_dreq(ida) == 0);
        deliver();
        b.take(CmEventType::DreqReceived);
        REQUIRE(b.agent.send_drep(idb) == 0);
        deliver([](const Datagram& d) { return attribute(d) == CmAttribute::Drep; });
        advance(response());
        deliver();
        a.take(CmEventType::Disconnected);
        CHECK(b.events.empty());
        CHECK(count_sent(CmAttribute::Drep, kIpB) == 2);
    }
}

TEST_CASE_METHOD(Fixture, "a peer that vanishes ends in an event, never a hang", "[cm]") {
    REQUIRE(b.agent.listen(kService, 1) == 0);
    const auto lose_all = [](const Datagram&) { return true; };
    SECTION("no answer to the REQ: Unreachable after every retry, and a REJ Timeout") {
        const uint32_t ida = a.agent.send_req(kIpB, request());
        for (int i = 0; i < timers.max_retries; ++i) {
            deliver(lose_all);
            advance(response());
            CHECK(a.events.empty());
        }
        deliver(lose_all);
        advance(response());
        a.take(CmEventType::Unreachable);
        CHECK_FALSE(a.agent.state(ida).has_value());
        CHECK(count_sent(CmAttribute::Req, kIpA) == 1u + timers.max_retries);
        CHECK(count_sent(CmAttribute::Rej, kIpA) == 1);
        CHECK_FALSE(a.agent.next_deadline().has_value());
    }
    SECTION("no RTU: the passive side gives up, and its REJ tells the active side") {
        a.agent.send_req(kIpB, request());
        deliver();
        const CmEvent req = b.take(CmEventType::ReqReceived);
        REQUIRE(b.agent.send_rep(req.comm_id, CmRep{}) == 0);
        deliver();
        a.take(CmEventType::RepReceived);
        // A's user never answers: B resends its REP (A counts duplicates), then gives up.
        for (int i = 0; i <= timers.max_retries; ++i) {
            advance(response());
            deliver();
        }
        b.take(CmEventType::Unreachable);
        CHECK(a.agent.counters().rx_duplicates == timers.max_retries);
        const CmEvent rej = a.take(CmEventType::Rejected);
        CHECK(std::get<CmRej>(rej.message->body).reason ==
              static_cast<uint16_t>(CmRejectReason::Timeout));
        CHECK(std::get<CmRej>(rej.message->body).message_rejected == CmMessageKind::Other);
    }
    SECTION("no DREP: Disconnected after the retries") {
        wire.in_flight.clear();
        auto [ida, idb] = connect();
        (void)idb;
        REQUIRE(a.agent.send_dreq(ida) == 0);
        for (int i = 0; i <= timers.max_retries; ++i) {
            deliver(lose_all);
            advance(response());
        }
        a.take(CmEventType::Disconnected);
        CHECK(a.agent.state(ida) == CmState::Timewait);
        advance(timers.timewait);
        a.take(CmEventType::TimewaitExit);
    }
    SECTION("the SIDR REQ") {
        a.agent.send_sidr_req(kIpB, CmSidrReq{.service_id = kService});
        for (int i = 0; i <= timers.max_retries; ++i) {
            deliver(lose_all);
            advance(response());
        }
        a.take(CmEventType::SidrTimeout);
    }
}

TEST_CASE_METHOD(Fixture, "an MRA buys the passive side time without resends", "[cm]") {
    REQUIRE(b.agent.listen(kService, 1) == 0);
    const uint32_t ida = a.agent.send_req(kIpB, request());
    deliver();
    const CmEvent req = b.take(CmEventType::ReqReceived);
    REQUIRE(b.agent.send_mra(req.comm_id, 24) == 0);  // about 69 s
    deliver();
    // Far longer than all of A's retries would take: no resend, no event.
    for (int i = 0; i < 20; ++i) advance(response());
    CHECK(a.events.empty());
    CHECK(a.agent.counters().tx_resends == 0);
    CHECK(a.agent.state(ida) == CmState::ReqSent);
    REQUIRE(b.agent.send_rep(req.comm_id, CmRep{}) == 0);
    deliver();
    a.take(CmEventType::RepReceived);
    // Past the granted time, with no REP: Unreachable.
    const uint32_t id2 = a.agent.send_req(kIpB, request());
    deliver();
    const CmEvent req2 = b.take(CmEventType::ReqReceived);
    REQUIRE(b.agent.send_mra(req2.comm_id, 10) == 0);
    deliver();
    advance(response_time(10) + response());
    a.take(CmEventType::Unreachable);
    CHECK_FALSE(a.agent.state(id2).has_value());
}

TEST_CASE_METHOD(Fixture, "both sides disconnect at once", "[cm]") {
    auto [ida, idb] = connect();
    REQUIRE(a.agent.send_dreq(ida) == 0);
    REQUIRE(b.agent.send_dreq(idb) == 0);
    deliver();
    a.take(CmEventType::DreqReceived);
    b.take(CmEventType::DreqReceived);
    REQUIRE(a.agent.send_drep(ida) == 0);
    REQUIRE(b.agent.send_drep(idb) == 0);
    deliver();
    CHECK(a.events.empty());
    CHECK(b.events.empty());
    CHECK(a.agent.state(ida) == CmState::Timewait);
    CHECK(b.agent.state(idb) == CmState::Timewait);
    CHECK(a.agent.counters().rx_unexpected + b.agent.counters().rx_unexpected == 0);
    advance(timers.timewait);
    a.take(CmEventType::TimewaitExit);
    b.take(CmEventType::TimewaitExit);
}

TEST_CASE_METHOD(Fixture, "forged and stray messages do not move a connection", "[cm]") {
    REQUIRE(b.agent.listen(kService, 1) == 0);
    const uint32_t ida = a.agent.send_req(kIpB, request());
    deliver();
    const CmEvent req = b.take(CmEventType::ReqReceived);

    SECTION("a REP with the right comm ID from another address") {
        CmRep forged;
        forged.local_comm_id = 0x12345;
        forged.remote_comm_id = ida;
        a.agent.on_mad(kIpForger, encode_cm_mad({MadHeader{}, forged}));
        CHECK(a.events.empty());
        CHECK(a.agent.state(ida) == CmState::ReqSent);
        CHECK(a.agent.counters().rx_unmatched == 1);
    }
    SECTION("after the connection is up: DREQ from another address, or naming another peer ID") {
        accept(req.comm_id, ida);
        CmDreq forged;
        forged.local_comm_id = req.comm_id;
        forged.remote_comm_id = ida;
        a.agent.on_mad(kIpForger, encode_cm_mad({MadHeader{}, forged}));
        forged.local_comm_id = req.comm_id ^ 1;
        a.agent.on_mad(kIpB, encode_cm_mad({MadHeader{}, forged}));
        CmRej rej;
        rej.local_comm_id = req.comm_id;
        rej.remote_comm_id = ida;
        a.agent.on_mad(kIpB, encode_cm_mad({MadHeader{}, rej}));  // no REJ once established
        CHECK(a.events.empty());
        CHECK(a.agent.state(ida) == CmState::Established);
        CHECK(a.agent.counters().rx_unmatched == 1);
        CHECK(a.agent.counters().rx_unexpected == 2);
    }
    SECTION("an RTU before any REP was sent") {
        CmRtu rtu;
        rtu.local_comm_id = ida;
        rtu.remote_comm_id = req.comm_id;
        b.agent.on_mad(kIpA, encode_cm_mad({MadHeader{}, rtu}));
        CHECK(b.events.empty());
        CHECK(b.agent.state(req.comm_id) == CmState::ReqReceived);
        CHECK(b.agent.counters().rx_unexpected == 1);
    }
    SECTION("garbage, and MADs that are not CM") {
        std::array<uint8_t, kMadBytes> junk{};
        for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<uint8_t>(i * 37);
        a.agent.on_mad(kIpB, junk);
        a.agent.on_mad(kIpB, std::span(junk).first(100));
        auto not_cm = encode_cm_mad({MadHeader{}, CmRtu{}});
        not_cm[1] = 0x04;  // performance management class
        a.agent.on_mad(kIpB, not_cm);
        CHECK(a.agent.counters().rx_malformed == 3);
        CHECK(a.events.empty());
        CHECK(wire.in_flight.empty());
    }
    SECTION("a DREQ for a connection nobody has gets a DREP") {
        CmDreq stray;
        stray.local_comm_id = 0xabcde;
        stray.remote_comm_id = 0x99999;
        a.agent.on_mad(kIpB, encode_cm_mad({MadHeader{}, stray}));
        REQUIRE(wire.in_flight.size() == 1);
        CHECK(attribute(wire.in_flight.front()) == CmAttribute::Drep);
        CmMad drep;
        REQUIRE(decode_cm_mad(wire.in_flight.front().mad, drep) == CmDecodeError::None);
        CHECK(std::get<CmDrep>(drep.body).remote_comm_id == 0xabcde);
        CHECK(std::get<CmDrep>(drep.body).local_comm_id == 0x99999);
        wire.in_flight.clear();
    }
}

TEST_CASE_METHOD(Fixture, "the user rejects, or walks away", "[cm]") {
    REQUIRE(b.agent.listen(kService, 1) == 0);
    const uint32_t ida = a.agent.send_req(kIpB, request());
    deliver();
    const CmEvent req = b.take(CmEventType::ReqReceived);
    SECTION("a consumer REJ with private data") {
        const uint8_t why[] = {1, 2, 3, 4};
        REQUIRE(b.agent.send_rej(req.comm_id, CmRejectReason::ConsumerReject, why) == 0);
        CHECK_FALSE(b.agent.state(req.comm_id).has_value());
        deliver();
        const CmEvent rej = a.take(CmEventType::Rejected);
        const CmRej& r = std::get<CmRej>(rej.message->body);
        CHECK(r.reason == static_cast<uint16_t>(CmRejectReason::ConsumerReject));
        CHECK(r.message_rejected == CmMessageKind::Req);
        CHECK(r.private_data[3] == 4);
        CHECK(r.private_data[4] == 0);
    }
    SECTION("the passive user destroys its ID before answering") {
        b.agent.destroy(req.comm_id);
        deliver();
        CHECK(std::get<CmRej>(a.take(CmEventType::Rejected).message->body).reason ==
              static_cast<uint16_t>(CmRejectReason::ConsumerReject));
        CHECK(b.events.empty());
    }
    SECTION("the active user walks away before any answer: the passive side hears its REJ") {
        // A knows no comm ID of B's yet: its REJ Timeout names B's connection by A's own
        // comm ID (and, as the kernel's, its CA GUID). One from another address is no REJ.
        CmRej forged = make_rej_for_test(ida);
        b.agent.on_mad(kIpForger, encode_cm_mad({MadHeader{}, forged}));
        CHECK(b.agent.state(req.comm_id) == CmState::ReqReceived);
        a.agent.destroy(ida);
        deliver();
        const CmEvent rej = b.take(CmEventType::Rejected);
        CHECK(rej.comm_id == req.comm_id);
        CHECK(std::get<CmRej>(rej.message->body).reason ==
              static_cast<uint16_t>(CmRejectReason::Timeout));
        CHECK_FALSE(b.agent.state(req.comm_id).has_value());
        CHECK(b.agent.send_rep(req.comm_id, CmRep{}) == EINVAL);
        CHECK(a.events.empty());
    }
    SECTION("the active user destroys an established connection: the peer sees a DREQ") {
        accept(req.comm_id, ida);
        a.agent.destroy(ida);
        deliver();
        b.take(CmEventType::DreqReceived);
        REQUIRE(b.agent.send_drep(req.comm_id) == 0);
        deliver();
        advance(timers.timewait);
        CHECK(a.events.empty());  // destroyed: nothing more is reported
        b.take(CmEventType::TimewaitExit);
        CHECK_FALSE(a.agent.state(ida).has_value());
    }
    SECTION("requests the state does not allow") {
        CHECK(b.agent.send_rtu(req.comm_id) == EINVAL);
        CHECK(b.agent.send_dreq(req.comm_id) == EINVAL);
        CHECK(b.agent.send_drep(req.comm_id) == EINVAL);
        CHECK(a.agent.send_rep(ida, CmRep{}) == EINVAL);
        CHECK(a.agent.notify_established(ida) == EINVAL);
        CHECK(b.agent.send_rep(0x424242, CmRep{}) == EINVAL);
        std::vector<uint8_t> too_long(kRejPrivateBytes + 1, 1);
        CHECK(b.agent.send_rej(req.comm_id, CmRejectReason::ConsumerReject, too_long) == EINVAL);
        CHECK(b.agent.state(req.comm_id) == CmState::ReqReceived);
        CHECK(wire.in_flight.empty());
    }
    SECTION("the first packet on the QP stands in for a lost RTU") {
        REQUIRE(b.agent.send_rep(req.comm_id, CmRep{}) == 0);
        REQUIRE(b.agent.notify_established(req.comm_id) == 0);
        b.take(CmEventType::Established);
        CHECK(b.agent.state(req.comm_id) == CmState::Established);
        // No REP resends once established.
        advance(response());
        CHECK(count_sent(CmAttribute::Rep, kIpB) == 1);
    }
}

TEST_CASE_METHOD(Fixture, "SIDR resolves a UD service", "[cm]") {
    REQUIRE(b.agent.listen(kService, 9) == 0);
    CmSidrReq q;
    q.service_id = kService;
    q.private_data[0] = 0x77;
    const uint32_t ida = a.agent.send_sidr_req(kIpB, q);
    deliver();
    const CmEvent req = b.take(CmEventType::SidrReqReceived);
    CHECK(req.listener == 9);
    CHECK(std::get<CmSidrReq>(req.message->body).private_data[0] == 0x77);
    CmSidrRep rep;
    rep.status = static_cast<uint8_t>(SidrStatus::Ok);
    rep.qpn = 0x22aaaa;
    rep.qkey = 0x11111111;
    rep.service_id = kService;
    REQUIRE(b.agent.send_sidr_rep(req.comm_id, rep) == 0);
    // The answer is lost; A asks again and gets the same answer, B's user is not asked twice.
    deliver([](const Datagram& d) { return attribute(d) == CmAttribute::SidrRep; });
    advance(response());
    deliver();
    CHECK(b.events.empty());
    const CmEvent got = a.take(CmEventType::SidrRepReceived);
    CHECK(got.comm_id == ida);
    const CmSidrRep& r = std::get<CmSidrRep>(got.message->body);
    CHECK(r.qpn == 0x22aaaa);
    CHECK(r.qkey == 0x11111111);
    CHECK(r.status == 0);
    advance(timers.timewait);
    CHECK(b.events.empty());  // a SIDR answer's rest ends without an event

    SECTION("a service nobody listens for") {
        CmSidrReq other;
        other.service_id = kService + 5;
        a.agent.send_sidr_req(kIpB, other);
        deliver();
        CHECK(a.events.empty());  // waits for a listener first
        advance(timers.unmatched_hold);
        deliver();
        const CmEvent no = a.take(CmEventType::SidrRepReceived);
        CHECK(std::get<CmSidrRep>(no.message->body).status ==
              static_cast<uint8_t>(SidrStatus::ServiceIdNotSupported));
    }
    SECTION("the passive user destroys its ID before answering: the requester hears a no") {
        // As an RC request destroyed before its answer gets a REJ (and as the kernel's CM
        // rejects a SIDR REQ whose ID is destroyed), not silence until the retries run out.
        const uint32_t id2 = a.agent.send_sidr_req(kIpB, q);
        deliver();
        const CmEvent req2 = b.take(CmEventType::SidrReqReceived);
        b.agent.destroy(req2.comm_id);
        deliver();
        const CmEvent no = a.take(CmEventType::SidrRepReceived);
        CHECK(no.comm_id == id2);
        CHECK(std::get<CmSidrRep>(no.message->body).status ==
              static_cast<uint8_t>(SidrStatus::Rejected));
        CHECK(b.events.empty());
    }
}

TEST_CASE_METHOD(Fixture, "a REJ that answers no message of the peer's says so with code 2",
                 "[cm]") {
    // IBA's REJ "Message REJected" is 0 (REQ), 1 (REP) or 2 (no message; the kernel's
    // CM_MSG_RESPONSE_OTHER); 3 is reserved. The REJ Timeout of a REQ that ran out of retries
    // rejects no message of the peer's.
    REQUIRE(b.agent.listen(kService, 1) == 0);
    a.agent.send_req(kIpB, request());
    for (int i = 0; i <= timers.max_retries; ++i) {
        deliver([](const Datagram&) { return true; });
        advance(response());
    }
    a.take(CmEventType::Unreachable);
    REQUIRE(wire.in_flight.size() == 1);
    const Datagram& rej = wire.in_flight.front();
    REQUIRE(attribute(rej) == CmAttribute::Rej);
    CHECK((rej.mad[kMadHeaderBytes + 8] >> 6) == 2);
    wire.in_flight.clear();
}
