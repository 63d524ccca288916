// RDMA CM identifiers against a raw peer (rdma_cm_world.h): REQs and SIDR REQs of the test's
// making from QP1 of A's engine reach B's RdmaCm, and what B's CM answers comes back to the
// test. A flood of requests against a listener's backlog, and requests no CM should take.
// Waits are bounded.
#include <catch2/catch.hpp>
#include <chrono>

#include "tests/unit/transport/rdma_cm_world.h"

using namespace uroce::transport;
using namespace uroce::transport::cm;
using namespace uroce::transport::test;

namespace {

// Long enough for any answer on loopback to have come; what must not come is waited for so.
constexpr auto kQuiet = std::chrono::milliseconds(300);

uint32_t listen_on_b(World& w, int backlog, bool ud = false) {
    const uint32_t id = w.b.create_id(ud ? PortSpace::Udp : PortSpace::Tcp, ud);
    REQUIRE(w.b.bind(id, {w.p.b.ip.v4(), kPort}) == 0);
    REQUIRE(w.b.listen(id, backlog) == 0);
    return id;
}

CmSidrReq rdma_cm_sidr_req(uint32_t request_id, CmAddress src, CmAddress dst) {
    CmSidrReq req;
    req.request_id = request_id;
    req.service_id = service_id_of(PortSpace::Udp, dst.port);
    IpCmHeader ip;
    ip.ip_version = 4;
    ip.source_port = src.port;
    ip.source = ip_cm_address_v4(htonl(src.ip));
    ip.destination = ip_cm_address_v4(htonl(dst.ip));
    write_ip_cm_header(ip, req.private_data);
    return req;
}

}  // namespace

TEST_CASE("RDMA CM: a REQ whose path MTU is no MTU is rejected (Invalid MTU)", "[cm][rdma_cm]") {
    // The MTU field is 4 bits; 1..5 are 256..4096 bytes, the rest is no MTU. A QP cannot take
    // 0 (nor 6..15): B's CM refuses such a REQ itself, rather than make an identifier whose
    // accept can only fail.
    World w;
    const uint32_t listener = listen_on_b(w, 8);
    RawPeer peer(*w.p.a.engine);
    const CmAddress from{w.p.a.ip.v4(), 5000};
    const CmAddress to{w.p.b.ip.v4(), kPort};
    uint32_t comm_id = 0x100;
    for (const uint8_t mtu : {0, 6, 15}) {
        INFO("path MTU " << int(mtu));
        CmReq req = rdma_cm_req(++comm_id, from, to);
        req.path_mtu = mtu;
        peer.send(to.ip, comm_id, req);
        const CmRej rej = peer.next<CmRej>();
        CHECK(rej.reason == static_cast<uint16_t>(CmRejectReason::InvalidMtu));
        CHECK(rej.remote_comm_id == comm_id);
        CHECK(rej.message_rejected == CmMessageKind::Req);
    }
    CHECK(w.eb.pending() == 0);  // no identifier was made for any

    // A valid MTU smaller than the device's is the connection's.
    CmReq req = rdma_cm_req(++comm_id, from, to);
    req.path_mtu = 1;
    peer.send(to.ip, comm_id, req);
    const CmIdEvent ev = w.eb.next(CmIdEventType::ConnectRequest);
    CHECK(ev.listen_id == listener);
    CmQpAttr rtr;
    REQUIRE(w.b.init_qp_attr(ev.id, CmQpState::Rtr, rtr) == 0);
    CHECK(rtr.path_mtu == 1);
}

TEST_CASE("RDMA CM: a listener takes no more requests than its backlog", "[cm][rdma_cm]") {
    // As the kernel's: a REQ beyond the backlog (connection requests not yet handed to the
    // application) is dropped unanswered and forgotten, so that the peer's resend is taken
    // once there is room again; the flood makes no identifiers.
    World w;
    const uint32_t listener = listen_on_b(w, 4);
    RawPeer peer(*w.p.a.engine);
    const CmAddress from{w.p.a.ip.v4(), 5000};
    const CmAddress to{w.p.b.ip.v4(), kPort};
    constexpr uint32_t kFlood = 40;
    for (uint32_t i = 1; i <= kFlood; ++i) peer.send(to.ip, i, rdma_cm_req(i, from, to));
    std::vector<uint32_t> taken;
    for (int i = 0; i < 4; ++i) {
        const CmIdEvent ev = w.eb.next(CmIdEventType::ConnectRequest);
        CHECK(ev.listen_id == listener);
        taken.push_back(ev.id);
    }
    CHECK_FALSE(peer.next(kQuiet));  // no REJ: the peer is to try again
    CHECK(w.eb.pending() == 0);
    CHECK(w.b.id_count() == 1 + 4);
    CHECK(w.b.counters().rej_sent == 0);

    // Two handed to the application (librdmacm read their events): two resends are taken,
    // a third is not.
    w.b.request_reported(taken[0]);
    w.b.request_reported(taken[1]);
    for (uint32_t i = kFlood - 2; i <= kFlood; ++i) peer.send(to.ip, i, rdma_cm_req(i, from, to));
    CHECK(w.eb.next(CmIdEventType::ConnectRequest).listen_id == listener);
    CHECK(w.eb.next(CmIdEventType::ConnectRequest).listen_id == listener);
    CHECK_FALSE(peer.next(kQuiet));
    CHECK(w.eb.pending() == 0);
    CHECK(w.b.id_count() == 1 + 6);

    // One that the application rejects, unread (only the transport's user can), makes room
    // too: the rejected one's REJ comes back, and the one resend left out is taken (the
    // others are resends of requests already taken, and change nothing).
    REQUIRE(w.b.reject(taken[2], {}) == 0);
    CHECK(peer.next<CmRej>().reason == static_cast<uint16_t>(CmRejectReason::ConsumerReject));
    for (uint32_t i = kFlood - 2; i <= kFlood; ++i) peer.send(to.ip, i, rdma_cm_req(i, from, to));
    CHECK(w.eb.next(CmIdEventType::ConnectRequest).listen_id == listener);
    CHECK_FALSE(peer.next(kQuiet));
    CHECK(w.eb.pending() == 0);
}

TEST_CASE("RDMA CM: a backlog of 0 or beyond the limit is the limit", "[cm][rdma_cm]") {
    World w;
    const uint32_t listener = listen_on_b(w, 0);
    RawPeer peer(*w.p.a.engine);
    const CmAddress from{w.p.a.ip.v4(), 5000};
    const CmAddress to{w.p.b.ip.v4(), kPort};
    // Far more than a backlog of 0 would take if it were taken literally.
    for (uint32_t i = 1; i <= 8; ++i) peer.send(to.ip, i, rdma_cm_req(i, from, to));
    for (int i = 0; i < 8; ++i)
        CHECK(w.eb.next(CmIdEventType::ConnectRequest).listen_id == listener);
    CHECK(w.b.listen(listener, -1) == 0);  // again: the backlog changes
    CHECK(w.b.listen(listener, 1 << 30) == 0);
}

TEST_CASE("RDMA CM: a SIDR REQ beyond the backlog is answered rejected", "[cm][rdma_cm]") {
    // The kernel's CM answers a SIDR REQ its listener has no room for with status "rejected".
    World w;
    const uint32_t listener = listen_on_b(w, 1, true);
    RawPeer peer(*w.p.a.engine);
    const CmAddress from{w.p.a.ip.v4(), 5000};
    const CmAddress to{w.p.b.ip.v4(), kPort};
    peer.send(to.ip, 1, rdma_cm_sidr_req(1, from, to));
    CHECK(w.eb.next(CmIdEventType::ConnectRequest).listen_id == listener);
    peer.send(to.ip, 2, rdma_cm_sidr_req(2, from, to));
    const CmSidrRep rep = peer.next<CmSidrRep>();
    CHECK(rep.request_id == 2);
    CHECK(rep.status == static_cast<uint8_t>(SidrStatus::Rejected));
    CHECK(w.eb.pending() == 0);
}
