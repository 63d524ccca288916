// RDMA CM identifiers against a raw peer (rdma_cm_world.h): REQs and SIDR REQs of the test's
// making from QP1 of A's engine reach B's RdmaCm, and what B's CM answers comes back to the
// test: requests no CM should take.
// Waits are bounded.
#include <catch2/catch.hpp>

#include "tests/unit/transport/rdma_cm_world.h"

using namespace uroce::transport;
using namespace uroce::transport::cm;
using namespace uroce::transport::test;

namespace {

uint32_t listen_on_b(World& w, int backlog) {
    const uint32_t id = w.b.create_id(PortSpace::Tcp);
    REQUIRE(w.b.bind(id, {w.p.b.ip.v4(), kPort}) == 0);
    REQUIRE(w.b.listen(id, backlog) == 0);
    return id;
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
