// RDMA CM identifiers (transport/cm/rdma_cm.h) over real UDP: two "processes" (an RdmaCm
// each) on two engines on loopback, sharing a port table as the processes of a host do.
// Connection set-up and tear-down with the events librdmacm would see, the QP attributes
// each side gets (the PSNs and QPNs must cross-match), rejection, refusal, and bad calls.
// Waits are bounded.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <thread>

#include "tests/unit/transport/rdma_cm_world.h"
#include "transport/cm/port_table.h"
#include "transport/cm/rdma_cm.h"
#include "transport/local_addresses.h"

using namespace uroce::transport;
using namespace uroce::transport::cm;
using namespace uroce::transport::test;
using uroce::IpAddress;

TEST_CASE("RDMA CM: connect, accept, established, disconnect, timewait", "[cm][rdma_cm]") {
    World w;
    w.listen_and_resolve();

    CmIdInfo info;
    REQUIRE(w.a.query(w.client, info) == 0);
    REQUIRE(info.device);
    CHECK(info.device->name == "devA");
    CHECK(info.src.ip == w.p.a.ip.v4());
    CHECK(info.src.port >= PortTable::kEphemeralFirst);
    CHECK(info.dst == CmAddress{w.p.b.ip.v4(), kPort});
    CHECK(info.has_path);
    CHECK(info.path_mtu == 3);  // the smaller of 1024 (A) and 4096 (B)
    CHECK(info.sgid[10] == 0xff);
    CHECK(info.sgid[15] == (w.p.a.ip.v4() & 0xff));

    // Before a connection the QP gets no remote access, and no RTR attributes exist.
    CmQpAttr attr;
    REQUIRE(w.a.init_qp_attr(w.client, CmQpState::Init, attr) == 0);
    CHECK(attr.access_flags == 0);
    CHECK(attr.mask ==
          (qp_mask::kState | qp_mask::kAccessFlags | qp_mask::kPkeyIndex | qp_mask::kPort));
    CHECK(w.a.init_qp_attr(w.client, CmQpState::Rtr, attr) == EINVAL);

    CmConnParam cp;
    cp.qp_num = 0x123;
    cp.responder_resources = 4;
    cp.initiator_depth = 2;
    cp.private_data = bytes("hello");
    REQUIRE(w.a.connect(w.client, cp) == 0);

    const CmIdEvent req = w.eb.next(CmIdEventType::ConnectRequest);
    CHECK(req.listen_id == w.listener);
    const uint32_t server = req.id;
    CHECK(server != w.listener);
    CHECK(req.param.qp_num == 0x123);
    // From the passive side's point of view: it answers the client's 2 READs, issues up
    // to 4.
    CHECK(req.param.responder_resources == 2);
    CHECK(req.param.initiator_depth == 4);
    REQUIRE(req.param.private_data.size() == RdmaCm::kConnectPrivateBytes);
    CHECK(
        std::equal(cp.private_data.begin(), cp.private_data.end(), req.param.private_data.begin()));
    CmIdInfo sinfo;
    REQUIRE(w.b.query(server, sinfo) == 0);
    CHECK(sinfo.src == CmAddress{w.p.b.ip.v4(), kPort});
    CHECK(sinfo.dst == CmAddress{w.p.a.ip.v4(), info.src.port});

    // The passive QP: the client's QPN, and the PSN the client starts from.
    CmQpAttr s_rtr, s_rts;
    REQUIRE(w.b.init_qp_attr(server, CmQpState::Rtr, s_rtr) == 0);
    REQUIRE(w.b.init_qp_attr(server, CmQpState::Rts, s_rts) == 0);
    CHECK(s_rtr.dest_qp_num == 0x123);
    CHECK(s_rtr.max_dest_rd_atomic == 2);
    CHECK(s_rtr.path_mtu == 3);
    CHECK(s_rtr.dgid[15] == (w.p.a.ip.v4() & 0xff));

    CmConnParam ap;
    ap.qp_num = 0x456;
    ap.responder_resources = 2;
    ap.initiator_depth = 4;
    ap.private_data = bytes("world");
    REQUIRE(w.b.accept(server, &ap) == 0);
    const CmIdEvent rep = w.ea.next(CmIdEventType::ConnectResponse);
    CHECK(rep.id == w.client);
    CHECK(rep.param.qp_num == 0x456);
    REQUIRE(rep.param.private_data.size() == RdmaCm::kAcceptPrivateBytes);
    CHECK(
        std::equal(ap.private_data.begin(), ap.private_data.end(), rep.param.private_data.begin()));

    CmQpAttr c_init, c_rtr, c_rts;
    REQUIRE(w.a.init_qp_attr(w.client, CmQpState::Init, c_init) == 0);
    REQUIRE(w.a.init_qp_attr(w.client, CmQpState::Rtr, c_rtr) == 0);
    REQUIRE(w.a.init_qp_attr(w.client, CmQpState::Rts, c_rts) == 0);
    CHECK(c_init.access_flags ==
          (access::kRemoteWrite | access::kRemoteRead | access::kRemoteAtomic));
    CHECK(c_rtr.dest_qp_num == 0x456);
    // Each side receives from the PSN the other sends from.
    CHECK(c_rtr.rq_psn == s_rts.sq_psn);
    CHECK(s_rtr.rq_psn == c_rts.sq_psn);
    CHECK(c_rts.max_rd_atomic == 2);
    CHECK(c_rtr.max_dest_rd_atomic == 4);
    CHECK(c_rts.retry_cnt == 7);
    CHECK(c_rtr.mask == (qp_mask::kState | qp_mask::kAv | qp_mask::kPathMtu | qp_mask::kDestQpn |
                         qp_mask::kRqPsn | qp_mask::kMaxDestRdAtomic | qp_mask::kMinRnrTimer));

    REQUIRE(w.a.accept(w.client, nullptr) == 0);  // the RTU
    CHECK(w.eb.next(CmIdEventType::Established).id == server);

    REQUIRE(w.a.disconnect(w.client) == 0);
    CHECK(w.eb.next(CmIdEventType::Disconnected).id == server);
    // B's CM answered the DREQ (DREP) by itself: A hears it before B's application acts, as
    // it would if B's process died here (qperf's server does). B's disconnect then does
    // nothing more.
    CHECK(w.ea.next(CmIdEventType::Disconnected).id == w.client);
    CHECK(w.a.counters().tx_resends == 0);  // the DREP, not the DREQ's timeout
    REQUIRE(w.b.disconnect(server) == 0);
    CHECK(w.ea.next(CmIdEventType::TimewaitExit).id == w.client);
    CHECK(w.eb.next(CmIdEventType::TimewaitExit).id == server);
    CHECK(w.a.disconnect(w.client) == 0);  // the kernel's answer too, once the comm ID is free
    CHECK(w.a.destroy_id(w.client) == 0);
    CHECK(w.b.destroy_id(server) == 0);
    // The listener is marked in the ".listening" table for as long as it listens.
    const PortTable marks(w.host_b.port_table_path(PortSpace::Tcp) + ".listening");
    int err = 0;
    CHECK_FALSE(marks.claim(w.p.b.ip.v4(), kPort, err));
    CHECK(err == EADDRINUSE);
    CHECK(w.b.destroy_id(w.listener) == 0);
    CHECK(marks.claim(w.p.b.ip.v4(), kPort, err));
    CHECK(w.ea.pending() == 0);
    CHECK(w.eb.pending() == 0);
}

TEST_CASE("RDMA CM: a rejected connection, with the consumer's private data", "[cm][rdma_cm]") {
    World w;
    w.listen_and_resolve();
    CmConnParam cp;
    cp.qp_num = 0x11;
    REQUIRE(w.a.connect(w.client, cp) == 0);
    const uint32_t server = w.eb.next(CmIdEventType::ConnectRequest).id;
    const auto why = bytes("no room");
    REQUIRE(w.b.reject(server, why) == 0);
    const CmIdEvent rej = w.ea.next(CmIdEventType::Rejected);
    CHECK(rej.status == static_cast<int>(CmRejectReason::ConsumerReject));
    REQUIRE(rej.param.private_data.size() >= why.size());
    CHECK(std::equal(why.begin(), why.end(), rej.param.private_data.begin()));
    // Nothing more to do on either: the connection is gone. A disconnect still succeeds, as
    // the kernel's rdma_disconnect does for any identifier that has had a connection (its IB
    // CM identifier outlives the connection; only one that never had any gets EINVAL).
    CHECK(w.a.disconnect(w.client) == 0);
    CHECK(w.b.disconnect(server) == 0);
    CHECK(w.b.reject(server, {}) == EINVAL);
}

TEST_CASE("RDMA CM: rdma_disconnect after the connection failed succeeds, as on a kernel",
          "[cm][rdma_cm]") {
    // B runs no CM at all: A's REQ goes unanswered, and the connection ends UNREACHABLE.
    World w;
    const uint32_t c = w.a.create_id(PortSpace::Tcp);
    REQUIRE(w.a.resolve_addr(c, CmAddress{w.p.a.ip.v4(), 0}, {w.p.b.ip.v4(), kPort}) == 0);
    w.ea.next(CmIdEventType::AddrResolved);
    REQUIRE(w.a.resolve_route(c) == 0);
    w.ea.next(CmIdEventType::RouteResolved);
    CHECK(w.a.disconnect(c) == EINVAL);  // no connection yet
    REQUIRE(w.a.connect(c, CmConnParam{}) == 0);
    CHECK(w.ea.next(CmIdEventType::Unreachable).status == -ETIMEDOUT);
    CHECK(w.a.disconnect(c) == 0);
    CHECK(w.a.disconnect(c) == 0);
    // A listener bound to a device's address has the kernel's IB CM listener (its disconnect
    // does nothing and succeeds); one on every device has none (EINVAL).
    const uint32_t on_a = w.a.create_id(PortSpace::Tcp);
    REQUIRE(w.a.bind(on_a, {w.p.a.ip.v4(), kPort}) == 0);
    REQUIRE(w.a.listen(on_a, 1) == 0);
    CHECK(w.a.disconnect(on_a) == 0);
    const uint32_t on_all = w.a.create_id(PortSpace::Tcp);
    REQUIRE(w.a.bind(on_all, {0, kPort + 1}) == 0);
    REQUIRE(w.a.listen(on_all, 1) == 0);
    CHECK(w.a.disconnect(on_all) == EINVAL);
    CHECK(w.ea.pending() == 0);
}

TEST_CASE("RDMA CM: a port nobody listens on is refused", "[cm][rdma_cm]") {
    World w;
    const uint32_t c = w.resolve_to_unheard_port();
    REQUIRE(w.a.connect(c, CmConnParam{}) == 0);
    CHECK(w.ea.next(CmIdEventType::Rejected).status ==
          static_cast<int>(CmRejectReason::InvalidServiceId));
    CHECK(w.eb.pending() == 0);
}

TEST_CASE("RDMA CM: a connect that comes just before the listen is taken", "[cm][rdma_cm]") {
    // As perftest -R's client does: its REQ reaches B before B's listener exists. A long hold,
    // so that a slow machine cannot make the REQ time out before the test listens.
    CmTimers t = fast_timers();
    t.unmatched_hold = std::chrono::seconds(30);
    World w(t);
    const uint32_t c = w.resolve_to_unheard_port();
    CmConnParam cp;
    cp.qp_num = 0x456;
    cp.private_data = bytes("early");
    REQUIRE(w.a.connect(c, cp) == 0);
    for (int i = 0; i < 10000 && w.b.counters().rx_held == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    REQUIRE(w.b.counters().rx_held == 1);
    CHECK(w.ea.pending() == 0);
    CHECK(w.eb.pending() == 0);

    const uint32_t listener = w.b.create_id(PortSpace::Tcp);
    REQUIRE(w.b.bind(listener, {w.p.b.ip.v4(), kPort}) == 0);
    REQUIRE(w.b.listen(listener, 8) == 0);
    const CmIdEvent req = w.eb.next(CmIdEventType::ConnectRequest);
    CHECK(req.listen_id == listener);
    CHECK(req.param.qp_num == 0x456);
    CHECK(
        std::equal(cp.private_data.begin(), cp.private_data.end(), req.param.private_data.begin()));
    CmConnParam ap;
    ap.qp_num = 0x789;
    REQUIRE(w.b.accept(req.id, &ap) == 0);
    const CmIdEvent rep = w.ea.next(CmIdEventType::ConnectResponse);
    CHECK(rep.id == c);
    CHECK(rep.param.qp_num == 0x789);
    REQUIRE(w.a.accept(c, nullptr) == 0);  // the RTU
    CHECK(w.eb.next(CmIdEventType::Established).id == req.id);
    CHECK(w.b.counters().rej_sent == 0);
    CHECK(w.b.counters().rx_unmatched == 0);
}

TEST_CASE("RDMA CM: the server disconnects after its accept, before the RTU", "[cm][rdma_cm]") {
    // B accepted (REP sent); A has its CONNECT_RESPONSE but has not answered yet. B's
    // rdma_disconnect gives the connection up (a REJ, as docs and code say) and succeeds.
    World w;
    w.listen_and_resolve();
    REQUIRE(w.a.connect(w.client, CmConnParam{}) == 0);
    const uint32_t server = w.eb.next(CmIdEventType::ConnectRequest).id;
    CmConnParam ap;
    REQUIRE(w.b.accept(server, &ap) == 0);
    w.ea.next(CmIdEventType::ConnectResponse);
    CHECK(w.b.disconnect(server) == 0);
    CHECK(w.ea.next(CmIdEventType::Rejected).id == w.client);
    CHECK(w.a.accept(w.client, nullptr) == EINVAL);  // no RTU for a connection that is gone
    CHECK(w.b.destroy_id(server) == 0);
    CHECK(w.eb.pending() == 0);
}

TEST_CASE("RDMA CM: a QP's first packet before the RTU establishes the connection once",
          "[cm][rdma_cm]") {
    // rdma_notify(IBV_EVENT_COMM_EST): the agent raises ESTABLISHED inside the call, on the
    // thread that holds the RdmaCm's lock; the event waits for that thread to hand it over
    // (it must not try to take the lock it holds).
    World w;
    w.listen_and_resolve();
    REQUIRE(w.a.connect(w.client, CmConnParam{}) == 0);
    const uint32_t server = w.eb.next(CmIdEventType::ConnectRequest).id;
    CmConnParam ap;
    REQUIRE(w.b.accept(server, &ap) == 0);
    w.ea.next(CmIdEventType::ConnectResponse);
    CHECK(w.b.establish(server) == 0);
    CHECK(w.eb.pending() == 1);  // handed over before establish() returned
    CHECK(w.eb.next(CmIdEventType::Established).id == server);
    CHECK(w.b.establish(server) == EINVAL);       // established already
    REQUIRE(w.a.accept(w.client, nullptr) == 0);  // the late RTU changes nothing
    REQUIRE(w.a.disconnect(w.client) == 0);
    CHECK(w.eb.next(CmIdEventType::Disconnected).id == server);  // not a second ESTABLISHED
    CHECK(w.ea.next(CmIdEventType::Disconnected).id == w.client);
}

TEST_CASE("RDMA CM: a destroyed connection is disconnected on the wire", "[cm][rdma_cm]") {
    World w;
    w.listen_and_resolve();
    REQUIRE(w.a.connect(w.client, CmConnParam{}) == 0);
    const uint32_t server = w.eb.next(CmIdEventType::ConnectRequest).id;
    CmConnParam ap;
    REQUIRE(w.b.accept(server, &ap) == 0);
    w.ea.next(CmIdEventType::ConnectResponse);
    REQUIRE(w.a.accept(w.client, nullptr) == 0);
    w.eb.next(CmIdEventType::Established);
    // As rdma_destroy_id, or a process exiting with the identifier (destroy_all): a DREQ.
    SECTION("destroy_id") {
        REQUIRE(w.a.destroy_id(w.client) == 0);
    }
    SECTION("destroy_all") {
        w.a.destroy_all();
    }
    CHECK(w.eb.next(CmIdEventType::Disconnected).id == server);
    CHECK(w.ea.pending() == 0);  // a destroyed identifier reports nothing
}

TEST_CASE("RDMA CM: bad calls are refused with the kernel's errors", "[cm][rdma_cm]") {
    World w;
    const uint32_t id = w.a.create_id(PortSpace::Tcp);
    SECTION("unknown identifiers") {
        CmIdInfo info;
        CHECK(w.a.destroy_id(id + 1000) == EINVAL);
        CHECK(w.a.bind(id + 1000, {}) == EINVAL);
        CHECK(w.a.query(id + 1000, info) == EINVAL);
        CHECK(w.a.listen(id + 1000, 1) == EINVAL);
        CHECK(w.a.connect(id + 1000, {}) == EINVAL);
    }
    SECTION("an address no device has") {
        CHECK(w.a.bind(id, {ipv4(10, 9, 8, 7).v4(), 0}) == EADDRNOTAVAIL);
    }
    SECTION("a port already bound, by this process or another") {
        const uint32_t other = w.b.create_id(PortSpace::Tcp);
        REQUIRE(w.b.bind(other, {w.p.a.ip.v4(), kPort}) == 0);
        CHECK(w.a.bind(id, {w.p.a.ip.v4(), kPort}) == EADDRINUSE);
        CHECK(w.a.bind(id, {0, kPort}) == EADDRINUSE);              // any address overlaps it
        CHECK(w.a.bind(id, {w.p.b.ip.v4(), kPort}) == 0);           // another address does not
        CHECK(w.a.bind(id, {w.p.b.ip.v4(), kPort + 1}) == EINVAL);  // bound already
    }
    SECTION("steps out of order") {
        CHECK(w.a.resolve_route(id) == EINVAL);  // no address yet
        CHECK(w.a.connect(id, {}) == EINVAL);
        CHECK(w.a.accept(id, nullptr) == EINVAL);
        CHECK(w.a.disconnect(id) == EINVAL);
        CmConnParam p;
        CHECK(w.a.accept(id, &p) == EINVAL);
    }
    SECTION("private data longer than the message carries") {
        REQUIRE(w.a.resolve_addr(id, CmAddress{w.p.a.ip.v4(), 0}, {w.p.b.ip.v4(), kPort}) == 0);
        w.ea.next(CmIdEventType::AddrResolved);
        REQUIRE(w.a.resolve_route(id) == 0);
        w.ea.next(CmIdEventType::RouteResolved);
        CmConnParam p;
        p.private_data.assign(RdmaCm::kConnectPrivateBytes + 1, 0x5a);
        CHECK(w.a.connect(id, p) == EINVAL);
    }
    SECTION("IPoIB port spaces do not connect") {
        const uint32_t ipoib = w.a.create_id(PortSpace::Ipoib, true);
        CHECK(w.a.listen(ipoib, 1) == EOPNOTSUPP);
    }
}

namespace {

// A UD listener on B:kPort and a UD client on A whose route to it is resolved.
void ud_resolve(World& w, uint32_t& listener, uint32_t& client, bool listener_ud = true) {
    listener = w.b.create_id(listener_ud ? PortSpace::Udp : PortSpace::Tcp, listener_ud);
    REQUIRE(w.b.bind(listener, {w.p.b.ip.v4(), kPort}) == 0);
    REQUIRE(w.b.listen(listener, 8) == 0);
    client = w.a.create_id(PortSpace::Udp, true);
    REQUIRE(w.a.resolve_addr(client, CmAddress{w.p.a.ip.v4(), 0}, {w.p.b.ip.v4(), kPort}) == 0);
    w.ea.next(CmIdEventType::AddrResolved);
    REQUIRE(w.a.resolve_route(client) == 0);
    w.ea.next(CmIdEventType::RouteResolved);
}

}  // namespace

TEST_CASE("RDMA CM: UD identifiers resolve the peer's QP through SIDR", "[cm][rdma_cm]") {
    World w;
    uint32_t listener = 0, client = 0;
    ud_resolve(w, listener, client);
    // The UD QP's attributes: its Q_Key in INIT, nothing of a peer.
    CmQpAttr init;
    REQUIRE(w.a.init_qp_attr(client, CmQpState::Init, init) == 0);
    CHECK(init.qkey == RdmaCm::kUdpQkey);
    CHECK((init.mask & qp_mask::kQkey) != 0);
    CHECK((init.mask & qp_mask::kAccessFlags) == 0);
    CmQpAttr rtr;
    REQUIRE(w.a.init_qp_attr(client, CmQpState::Rtr, rtr) == 0);
    CHECK(rtr.mask == qp_mask::kState);

    CmConnParam cp;
    cp.private_data = bytes("ud hello");
    REQUIRE(w.a.connect(client, cp) == 0);
    const CmIdEvent req = w.eb.next(CmIdEventType::ConnectRequest);
    CHECK(req.ud);
    CHECK(req.listen_id == listener);
    REQUIRE(req.param.private_data.size() == RdmaCm::kUdConnectPrivateBytes);
    CHECK(
        std::equal(cp.private_data.begin(), cp.private_data.end(), req.param.private_data.begin()));
    CHECK(req.dgid[15] == (w.p.a.ip.v4() & 0xff));  // the requester's address vector

    CmConnParam ap;
    ap.qp_num = 0x777;
    ap.private_data = bytes("ud welcome");
    REQUIRE(w.b.accept(req.id, &ap) == 0);
    const CmIdEvent est = w.ea.next(CmIdEventType::Established);
    CHECK(est.ud);
    CHECK(est.id == client);
    CHECK(est.param.qp_num == 0x777);
    CHECK(est.param.qkey == RdmaCm::kUdpQkey);
    CHECK(est.dgid[15] == (w.p.b.ip.v4() & 0xff));
    CHECK(est.hop_limit == 64);
    REQUIRE(est.param.private_data.size() == RdmaCm::kUdAcceptPrivateBytes);
    CHECK(
        std::equal(ap.private_data.begin(), ap.private_data.end(), est.param.private_data.begin()));
    CHECK(w.eb.pending() == 0);  // the passive side gets no ESTABLISHED for UD
    CHECK(w.a.destroy_id(client) == 0);
    CHECK(w.b.destroy_id(req.id) == 0);
}

TEST_CASE("RDMA CM: UD requests rejected or for no UD service", "[cm][rdma_cm]") {
    World w;
    uint32_t listener = 0, client = 0;
    SECTION("the listener rejects: UNREACHABLE with the SIDR status") {
        ud_resolve(w, listener, client);
        REQUIRE(w.a.connect(client, CmConnParam{}) == 0);
        const CmIdEvent req = w.eb.next(CmIdEventType::ConnectRequest);
        REQUIRE(w.b.reject(req.id, bytes("full")) == 0);
        const CmIdEvent un = w.ea.next(CmIdEventType::Unreachable);
        CHECK(un.status == static_cast<int>(SidrStatus::Rejected));
        CHECK(un.param.private_data.front() == 'f');
    }
    SECTION("the port has an RC listener: the service is not supported") {
        ud_resolve(w, listener, client, false);
        REQUIRE(w.a.connect(client, CmConnParam{}) == 0);
        CHECK(w.ea.next(CmIdEventType::Unreachable).status ==
              static_cast<int>(SidrStatus::ServiceIdNotSupported));
        CHECK(w.eb.pending() == 0);
    }
    SECTION("private data longer than a SIDR REQ carries") {
        ud_resolve(w, listener, client);
        CmConnParam cp;
        cp.private_data.assign(RdmaCm::kUdConnectPrivateBytes + 1, 1);
        CHECK(w.a.connect(client, cp) == EINVAL);
    }
}

TEST_CASE("RDMA CM: the namespace's own addresses, and the source its routing picks",
          "[cm][rdma_cm]") {
    // Loopback is this namespace's, all of 127.0.0.0/8; the kernel sends to any of it from
    // 127.0.0.1, which is why resolve_addr asks is_local_address() before route_source().
    CHECK(is_local_address(IpAddress::v4(0x7f000001)));
    CHECK(is_local_address(IpAddress::v4(0x7f0102fe)));
    CHECK(route_source(IpAddress::v4(0x7f0102fe)) == std::optional(IpAddress::v4(0x7f000001)));
    // 192.0.2.0/24 is TEST-NET-1 (RFC 5737): no host has it.
    CHECK_FALSE(is_local_address(IpAddress::v4(0xc0000201)));
    CHECK_FALSE(is_local_address(IpAddress::v4(0)));           // bindable, not a host's
    CHECK_FALSE(is_local_address(IpAddress::v4(0xefc80001)));  // 239.200.0.1, a group
    CHECK_FALSE(is_local_address(IpAddress::v4(0xffffffff)));  // broadcast
}
