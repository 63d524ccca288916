// The CM over real UDP: two engines on loopback, QP1 and an agent on each (CmService), a
// connection set up and torn down with every MAD going through the engines' sockets,
// timers run by the engines' event loops. Waits are bounded.
#include <catch2/catch.hpp>

#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"
#include "transport/cm/cm_service.h"
#include "transport/cm/ip_cm_header.h"
#include "transport/engine.h"

using namespace uroce::transport;
using uroce::IpAddress;
using namespace uroce::transport::cm;
using namespace uroce::transport::test;
namespace wire = uroce::wire;

namespace {

constexpr uint64_t kService = service_id_of(PortSpace::Tcp, 9999);

// Events of one service, recorded on whatever thread delivers them.
class EventLog {
  public:
    void push(const CmEvent& e) {
        std::lock_guard lock(mutex_);
        events_.push_back(e);
        cv_.notify_all();
    }
    // The next event, which must be of `type`; fails after kWait.
    CmEvent next(CmEventType type) {
        std::unique_lock lock(mutex_);
        INFO("waiting for " << to_string(type));
        REQUIRE(cv_.wait_for(lock, kWait, [this] { return !events_.empty(); }));
        CmEvent e = events_.front();
        events_.pop_front();
        INFO("got " << to_string(e.type));
        REQUIRE(e.type == type);
        return e;
    }
    size_t pending() {
        std::lock_guard lock(mutex_);
        return events_.size();
    }

  private:
    std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<CmEvent> events_;
};

CmTimers fast_timers() {
    // 4.096 us * 2^14 = 67 ms between resends, and a short timewait.
    return CmTimers{
        .response_exponent = 14, .max_retries = 3, .timewait = std::chrono::milliseconds(100)};
}

}  // namespace

TEST_CASE("CM over UDP: connect, disconnect, timewait", "[cm]") {
    Pair p;
    EventLog la, lb;
    CmService a(*p.a.engine, 0xaaaa, fast_timers(), [&la](const CmEvent& e) { la.push(e); });
    CmService b(*p.b.engine, 0xbbbb, fast_timers(), [&lb](const CmEvent& e) { lb.push(e); });
    REQUIRE(b.listen(kService, 5) == 0);

    CmReq req;
    req.service_id = kService;
    req.local_qpn = p.a.qp->qpn();
    req.starting_psn = 0x100;
    req.private_data[kIpCmHeaderBytes] = 0x42;
    const uint32_t ida = a.agent().send_req(p.b.ip.v4(), req);
    REQUIRE(ida != 0);
    const CmEvent got_req = lb.next(CmEventType::ReqReceived);
    CHECK(got_req.peer_ip == p.a.ip.v4());
    CHECK(std::get<CmReq>(got_req.message->body).local_qpn == p.a.qp->qpn());
    CHECK(std::get<CmReq>(got_req.message->body).private_data[kIpCmHeaderBytes] == 0x42);
    CHECK(std::get<CmReq>(got_req.message->body).local_ca_guid == 0xaaaa);

    CmRep rep;
    rep.local_qpn = p.b.qp->qpn();
    REQUIRE(b.agent().send_rep(got_req.comm_id, rep) == 0);
    const CmEvent got_rep = la.next(CmEventType::RepReceived);
    CHECK(got_rep.comm_id == ida);
    CHECK(std::get<CmRep>(got_rep.message->body).local_qpn == p.b.qp->qpn());
    REQUIRE(a.agent().send_rtu(ida) == 0);
    lb.next(CmEventType::Established);

    REQUIRE(b.agent().send_dreq(got_req.comm_id) == 0);
    la.next(CmEventType::DreqReceived);
    REQUIRE(a.agent().send_drep(ida) == 0);
    lb.next(CmEventType::Disconnected);
    // The engines' timers end both timewaits.
    la.next(CmEventType::TimewaitExit);
    lb.next(CmEventType::TimewaitExit);
    CHECK(a.gsi_counters().tx_mads == 3);  // REQ, RTU, DREP
    CHECK(b.gsi_counters().tx_mads == 2);  // REP, DREQ
    CHECK(a.gsi_counters().rx_dropped == 0);
}

TEST_CASE("CM over UDP: a peer that never answers times out", "[cm]") {
    Pair p;
    EventLog la;
    CmService a(*p.a.engine, 0xaaaa, fast_timers(), [&la](const CmEvent& e) { la.push(e); });
    // B's engine runs, but nothing listens on its QP1: the REQs are dropped as for an
    // unknown QP, and A gives up after its retries, on its engine's timer.
    CmReq req;
    req.service_id = kService;
    a.agent().send_req(p.b.ip.v4(), req);
    la.next(CmEventType::Unreachable);
    CHECK(a.gsi_counters().tx_mads == 1u + fast_timers().max_retries + 1u);  // REQs + REJ
    CHECK(p.b.counters().rx_unknown_qp.load() >= 1u + fast_timers().max_retries);
}

TEST_CASE("CM over UDP: QP1 drops what is not a CM MAD", "[cm]") {
    Pair p;
    EventLog lb;
    CmService b(*p.b.engine, 0xbbbb, fast_timers(), [&lb](const CmEvent& e) { lb.push(e); });
    REQUIRE(b.listen(kService, 5) == 0);
    CmReq req;
    req.service_id = kService;
    const auto mad = encode_cm_mad(CmMad{MadHeader{}, req});
    const wire::IpFlow flow{p.a.ip, p.b.ip, 50000, p.b.engine->config().port};
    wire::Headers h;
    h.bth.opcode = static_cast<uint8_t>(wire::Opcode::UdSendOnly);
    h.bth.dest_qp = kGsiQpn;
    h.deth.src_qp = kGsiQpn;
    SECTION("a wrong Q_Key") {
        h.deth.qkey = 0x12345678;
        p.b.engine->receive_datagram(forge_packet(h, mad, flow), p.a.ip, 50000);
    }
    SECTION("a short MAD") {
        h.deth.qkey = kGsiQkey;
        p.b.engine->receive_datagram(forge_packet(h, std::span(mad).first(200), flow), p.a.ip,
                                     50000);
    }
    SECTION("SEND with immediate") {
        h.deth.qkey = kGsiQkey;
        h.bth.opcode = static_cast<uint8_t>(wire::Opcode::UdSendOnlyImm);
        p.b.engine->receive_datagram(forge_packet(h, mad, flow), p.a.ip, 50000);
    }
    CHECK(b.gsi_counters().rx_dropped == 1);
    CHECK(lb.pending() == 0);
    // The same MAD, as it should be, is taken.
    h.bth.opcode = static_cast<uint8_t>(wire::Opcode::UdSendOnly);
    h.deth.qkey = kGsiQkey;
    p.b.engine->receive_datagram(forge_packet(h, mad, flow), p.a.ip, 50000);
    lb.next(CmEventType::ReqReceived);
}

TEST_CASE("CM on a shared device: an agent that waits answers for a context that died",
          "[cm][qpn_steering]") {
    // Three contexts of one device: one address and port, a slot table, QPN steering (root,
    // as device sharing needs). 1 runs a CM that listens (and answers for the device: service
    // ID 0), 2 runs a CM that connects to it, 3 runs none.
    const auto dir =
        std::filesystem::temp_directory_path() / ("uroce-cm-shared-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const Addresses where = next_addresses();
    EngineConfig config;
    config.ip = where.a;
    config.port = where.port;
    config.slot_table = (dir / "slots").string();
    auto e1 = make_engine(config);
    auto e2 = make_engine(config);
    auto e3 = make_engine(config);
    EventLog l1, l2;
    auto s1 = std::make_unique<CmService>(*e1, 0x1111, fast_timers(),
                                          [&l1](const CmEvent& e) { l1.push(e); });
    // 2 resends every 67 ms for 1 s: long enough for what follows to come first.
    CmTimers slow = fast_timers();
    slow.max_retries = 15;
    CmService s2(*e2, 0x2222, slow, [&l2](const CmEvent& e) { l2.push(e); });
    REQUIRE(s1->listen(kService, 5) == 0);
    CHECK(e3->cm_service_held_elsewhere(0));  // 1 answers for the device
    CHECK(e3->cm_service_held_elsewhere(kService));

    CmReq req;
    req.service_id = kService;
    const uint32_t id2 = s2.agent().send_req(where.a.v4(), req);
    const CmEvent got = l1.next(CmEventType::ReqReceived);
    REQUIRE(s1->agent().send_rep(got.comm_id, CmRep{}) == 0);
    l2.next(CmEventType::RepReceived);
    REQUIRE(s2.agent().send_rtu(id2) == 0);
    l1.next(CmEventType::Established);

    // 1's context goes, and with it the context that answered for the device's forgotten
    // connections (a killed one's claim would stay behind, dead: claim_cm_service() takes
    // that over the same way).
    s1.reset();
    e1.reset();
    CHECK_FALSE(e3->cm_service_held_elsewhere(0));
    // 2 waits for an answer (a REQ to an address nobody is at): at its first resend it offers
    // to answer for the device.
    s2.agent().send_req(where.b.v4(), req);
    bool taken = false;
    const auto deadline = std::chrono::steady_clock::now() + kWait;
    while (!taken && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(1ms);
        taken = e3->cm_service_held_elsewhere(0);
    }
    REQUIRE(taken);
    CHECK_FALSE(e2->cm_service_held_elsewhere(0));
    // So 2's DREQ to 1's dead context reaches 2 itself, which answers for it (DREP): the
    // disconnect ends at once, not after the DREQ's resends.
    REQUIRE(s2.agent().send_dreq(id2) == 0);
    const CmEvent done = l2.next(CmEventType::Disconnected);
    CHECK(done.comm_id == id2);
    CHECK(s2.agent().counters().rx_unmatched >= 1);  // the DREQ it answered for 1
    std::filesystem::remove_all(dir);
}
