// CM MADs and the RDMA IP CM header, checked against the connection the Linux kernel's RDMA CM
// set up in the rc_write_rdmacm capture (ib_write_bw -R between two rxe devices): every CM MAD
// there decodes and re-encodes to the same 256 bytes, and the messages uroce builds from the
// kernel's field values (written out below as tshark reads them) are byte-identical to the
// kernel's, whole RoCEv2 packet and ICRC included.
#include <catch2/catch.hpp>

#include <arpa/inet.h>

#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <vector>

#include "captures.h"
#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"
#include "transport/cm/cm_messages.h"
#include "transport/cm/cm_service.h"
#include "transport/cm/ip_cm_header.h"
#include "transport/cm/rdma_cm.h"
#include "uroce/icrc.h"
#include "uroce/wire.h"

using namespace uroce::transport::cm;
using uroce::IpAddress;
using uroce::wire::parse_packet;
using uroce::wire::ParsedPacket;
using uroce::wire::ParseError;
using wiretest::CapturedPacket;
using wiretest::find_packet;

namespace {

constexpr const char* kCapture = "rc_write_rdmacm";
// The frames carrying CM MADs (every other frame is RC traffic).
constexpr size_t kCmFrames[] = {1, 2, 3, 24, 25, 26, 81, 82, 83, 84, 85, 86};

// 192.168.77.2 (the client, rxe0) and 192.168.77.3 (the server, rxe1).
constexpr uint32_t kClientIp = 0xc0a84d02;
constexpr uint32_t kServerIp = 0xc0a84d03;
constexpr uint16_t kClientPort = 0xcca2;  // the client's RDMA CM source port
constexpr uint16_t kServerPort = 0x4853;  // perftest's default port, 18515
constexpr uint64_t kClientGuid = 0x505400fffe770002;
constexpr uint64_t kServerGuid = 0x505400fffe770003;

// The RoCE GID of an IPv4 address: ::ffff:a.b.c.d.
Gid roce_gid(uint32_t ip) {
    Gid g{};
    g[10] = 0xff;
    g[11] = 0xff;
    const uint32_t be = htonl(ip);
    std::memcpy(g.data() + 12, &be, 4);
    return g;
}

std::span<const uint8_t> mad_of(const CapturedPacket& cp) {
    ParsedPacket p;
    REQUIRE(parse_packet(cp.udp, p) == ParseError::None);
    REQUIRE(p.payload.size() == kMadBytes);
    return p.payload;
}

std::vector<uint8_t> bytes(std::span<const uint8_t> s) {
    return {s.begin(), s.end()};
}

// The header every CM MAD of the first connection carries: the kernel puts its MAD agent's
// number in the top half of the transaction ID and the active side's communication ID in
// the bottom half, and a REP or RTU reuses the REQ's transaction ID.
MadHeader header(uint64_t tid) {
    MadHeader h;
    h.transaction_id = tid;
    return h;
}

CmReq kernel_req_frame1() {
    CmReq r;
    r.local_comm_id = 0xcafdc8b1;
    r.service_id = service_id_of(PortSpace::Tcp, kServerPort);
    r.local_ca_guid = kClientGuid;
    r.local_qkey = 0;
    r.local_qpn = 0x11;
    r.responder_resources = 0;
    r.initiator_depth = 0;
    r.remote_cm_response_timeout = 20;
    r.transport = CmTransport::Rc;
    r.starting_psn = 0x3d3f2a;
    r.local_cm_response_timeout = 20;
    r.retry_count = 7;
    r.pkey = 0xffff;
    r.path_mtu = 3;  // 1024
    r.rnr_retry_count = 7;
    r.max_cm_retries = 15;
    r.primary.local_lid = 0xffff;
    r.primary.remote_lid = 0xffff;
    r.primary.local_gid = roce_gid(kClientIp);
    r.primary.remote_gid = roce_gid(kServerIp);
    r.primary.flow_label = roce_flow_label(kClientPort, kServerPort);
    r.primary.hop_limit = 64;
    r.primary.local_ack_timeout = 19;
    IpCmHeader ip;
    ip.ip_version = 4;
    ip.source_port = kClientPort;
    ip.source = ip_cm_address_v4(htonl(kClientIp));
    ip.destination = ip_cm_address_v4(htonl(kServerIp));
    write_ip_cm_header(ip, r.private_data);
    return r;
}

}  // namespace

TEST_CASE("every CM MAD the kernel sent decodes and re-encodes to the same bytes") {
    for (size_t frame : kCmFrames) {
        CAPTURE(frame);
        const auto mad = mad_of(find_packet(kCapture, frame));
        CmMad decoded;
        REQUIRE(decode_cm_mad(mad, decoded) == CmDecodeError::None);
        const auto again = encode_cm_mad(decoded);
        CHECK(bytes(again) == bytes(mad));
    }
}

TEST_CASE("the kernel's connection, as the CM messages say it") {
    const auto decode = [](size_t frame) {
        CmMad m;
        REQUIRE(decode_cm_mad(mad_of(find_packet(kCapture, frame)), m) == CmDecodeError::None);
        return m;
    };
    const CmMad req = decode(1);
    REQUIRE(std::holds_alternative<CmReq>(req.body));
    CHECK(std::get<CmReq>(req.body) == kernel_req_frame1());
    MadHeader want = header(0x00000002b1c8fdca);
    want.attribute_id = static_cast<uint16_t>(CmAttribute::Req);
    CHECK(req.header == want);

    const CmMad rep = decode(2);
    REQUIRE(std::holds_alternative<CmRep>(rep.body));
    const auto& r = std::get<CmRep>(rep.body);
    CHECK(r.local_comm_id == 0xcbfdc8b1);
    CHECK(r.remote_comm_id == 0xcafdc8b1);
    CHECK(r.local_qpn == 0x11);
    CHECK(r.starting_psn == 0x168009);
    CHECK(r.target_ack_delay == 15);
    CHECK(r.rnr_retry_count == 7);
    CHECK_FALSE(r.srq);
    CHECK(r.local_ca_guid == kServerGuid);

    const CmMad dreq = decode(81);
    REQUIRE(std::holds_alternative<CmDreq>(dreq.body));
    CHECK(std::get<CmDreq>(dreq.body).remote_qpn == 0x12);

    // The server's DREQ comes from another MAD agent (transaction ID top half 4).
    const CmMad server_dreq = decode(83);
    CHECK(server_dreq.header.transaction_id == 0x00000004b1c8fdcb);
    CHECK(std::get<CmDreq>(server_dreq.body).remote_qpn == 0x11);
}

TEST_CASE("messages built from the kernel's field values are byte-identical to the kernel's") {
    SECTION("REQ, with the RDMA CM header in its private data") {
        const CmMad m{header(0x00000002b1c8fdca), kernel_req_frame1()};
        CHECK(bytes(encode_cm_mad(m)) == bytes(mad_of(find_packet(kCapture, 1))));
    }
    SECTION("REP") {
        CmRep r;
        r.local_comm_id = 0xcbfdc8b1;
        r.remote_comm_id = 0xcafdc8b1;
        r.local_qpn = 0x11;
        r.starting_psn = 0x168009;
        r.target_ack_delay = 15;
        r.rnr_retry_count = 7;
        r.local_ca_guid = kServerGuid;
        const CmMad m{header(0x00000002b1c8fdca), r};
        CHECK(bytes(encode_cm_mad(m)) == bytes(mad_of(find_packet(kCapture, 2))));
    }
    SECTION("RTU") {
        CmRtu r;
        r.local_comm_id = 0xcafdc8b1;
        r.remote_comm_id = 0xcbfdc8b1;
        const CmMad m{header(0x00000002b1c8fdca), r};
        CHECK(bytes(encode_cm_mad(m)) == bytes(mad_of(find_packet(kCapture, 3))));
    }
    SECTION("DREQ and DREP") {
        CmDreq d;
        d.local_comm_id = 0xcefdc8b1;
        d.remote_comm_id = 0xcffdc8b1;
        d.remote_qpn = 0x12;
        CHECK(bytes(encode_cm_mad({header(0x00000002b1c8fdce), d})) ==
              bytes(mad_of(find_packet(kCapture, 81))));
        CmDrep p;
        p.local_comm_id = 0xcffdc8b1;
        p.remote_comm_id = 0xcefdc8b1;
        CHECK(bytes(encode_cm_mad({header(0x00000002b1c8fdce), p})) ==
              bytes(mad_of(find_packet(kCapture, 82))));
    }
    SECTION("the whole RoCEv2 packet: UD SEND ONLY to QP1, GSI Q_Key, ICRC") {
        const CapturedPacket& cp = find_packet(kCapture, 1);
        uroce::wire::Headers h;
        h.bth.opcode = static_cast<uint8_t>(uroce::wire::Opcode::UdSendOnly);
        h.bth.migreq = false;
        h.bth.pkey = 0xffff;
        h.bth.dest_qp = kGsiQpn;
        h.bth.ack_req = true;
        h.bth.psn = 0;
        h.deth.qkey = kGsiQkey;
        h.deth.src_qp = kGsiQpn;
        std::vector<uint8_t> pkt(uroce::wire::kMaxHeaderBytes);
        pkt.resize(uroce::wire::build_headers(h, pkt.data()));
        const auto mad = encode_cm_mad({header(0x00000002b1c8fdca), kernel_req_frame1()});
        pkt.insert(pkt.end(), mad.begin(), mad.end());
        const uint32_t icrc = uroce::wire::icrc(cp.flow, cp.unseen, pkt);
        for (int i = 0; i < 4; ++i) pkt.push_back(static_cast<uint8_t>(icrc >> (8 * i)));
        CHECK(pkt == cp.udp);
    }
}

TEST_CASE("the RDMA CM header and service ID of the kernel's REQ") {
    CmMad m;
    REQUIRE(decode_cm_mad(mad_of(find_packet(kCapture, 1)), m) == CmDecodeError::None);
    const CmReq& req = std::get<CmReq>(m.body);
    IpCmHeader ip;
    REQUIRE(read_ip_cm_header(req.private_data, ip) == IpCmHeaderError::None);
    CHECK(ip.ip_version == 4);
    CHECK(ip.source_port == kClientPort);
    CHECK(ip.source == ip_cm_address_v4(htonl(kClientIp)));
    CHECK(ip.destination == ip_cm_address_v4(htonl(kServerIp)));
    const auto svc = ip_service_of(req.service_id);
    REQUIRE(svc.has_value());
    CHECK(svc->port_space == PortSpace::Tcp);
    CHECK(svc->port == kServerPort);
    CHECK(req.primary.flow_label == roce_flow_label(kClientPort, kServerPort));
}

TEST_CASE("every field of every CM message survives encode and decode") {
    // Random values in every field (each within its width), so a field written at the wrong
    // offset, or two fields overlapping, shows up as a difference after the round trip.
    std::mt19937_64 rng(20261126);
    const auto rnd = [&rng](unsigned bits) {
        return bits == 64 ? rng() : rng() & ((1ull << bits) - 1);
    };
    const auto fill = [&rnd](auto& arr) {
        for (auto& b : arr) b = static_cast<uint8_t>(rnd(8));
    };
    const auto path = [&](CmPath& p) {
        p.local_lid = static_cast<uint16_t>(rnd(16));
        p.remote_lid = static_cast<uint16_t>(rnd(16));
        fill(p.local_gid);
        fill(p.remote_gid);
        p.flow_label = static_cast<uint32_t>(rnd(20));
        p.packet_rate = static_cast<uint8_t>(rnd(6));
        p.traffic_class = static_cast<uint8_t>(rnd(8));
        p.hop_limit = static_cast<uint8_t>(rnd(8));
        p.sl = static_cast<uint8_t>(rnd(4));
        p.subnet_local = rnd(1);
        p.local_ack_timeout = static_cast<uint8_t>(rnd(5));
    };
    for (int round = 0; round < 50; ++round) {
        CmReq q;
        q.local_comm_id = static_cast<uint32_t>(rnd(32));
        q.service_id = rnd(64);
        q.local_ca_guid = rnd(64);
        q.local_qkey = static_cast<uint32_t>(rnd(32));
        q.local_qpn = static_cast<uint32_t>(rnd(24));
        q.responder_resources = static_cast<uint8_t>(rnd(8));
        q.local_eecn = static_cast<uint32_t>(rnd(24));
        q.initiator_depth = static_cast<uint8_t>(rnd(8));
        q.remote_eecn = static_cast<uint32_t>(rnd(24));
        q.remote_cm_response_timeout = static_cast<uint8_t>(rnd(5));
        q.transport = static_cast<CmTransport>(rnd(2));
        q.end_to_end_flow_control = rnd(1);
        q.starting_psn = static_cast<uint32_t>(rnd(24));
        q.local_cm_response_timeout = static_cast<uint8_t>(rnd(5));
        q.retry_count = static_cast<uint8_t>(rnd(3));
        q.pkey = static_cast<uint16_t>(rnd(16));
        q.path_mtu = static_cast<uint8_t>(rnd(4));
        q.rdc_exists = rnd(1);
        q.rnr_retry_count = static_cast<uint8_t>(rnd(3));
        q.max_cm_retries = static_cast<uint8_t>(rnd(4));
        q.srq = rnd(1);
        q.extended_transport = static_cast<uint8_t>(rnd(3));
        path(q.primary);
        path(q.alternate);
        fill(q.private_data);

        CmMra a;
        a.local_comm_id = static_cast<uint32_t>(rnd(32));
        a.remote_comm_id = static_cast<uint32_t>(rnd(32));
        a.message_mraed = static_cast<CmMessageKind>(rnd(2));
        a.service_timeout = static_cast<uint8_t>(rnd(5));
        fill(a.private_data);

        CmRej j;
        j.local_comm_id = static_cast<uint32_t>(rnd(32));
        j.remote_comm_id = static_cast<uint32_t>(rnd(32));
        j.message_rejected = static_cast<CmMessageKind>(rnd(2));
        j.reject_info_length = static_cast<uint8_t>(rnd(7));
        j.reason = static_cast<uint16_t>(rnd(16));
        fill(j.additional_reject_info);
        fill(j.private_data);

        CmRep p;
        p.local_comm_id = static_cast<uint32_t>(rnd(32));
        p.remote_comm_id = static_cast<uint32_t>(rnd(32));
        p.local_qkey = static_cast<uint32_t>(rnd(32));
        p.local_qpn = static_cast<uint32_t>(rnd(24));
        p.local_eecn = static_cast<uint32_t>(rnd(24));
        p.starting_psn = static_cast<uint32_t>(rnd(24));
        p.responder_resources = static_cast<uint8_t>(rnd(8));
        p.initiator_depth = static_cast<uint8_t>(rnd(8));
        p.target_ack_delay = static_cast<uint8_t>(rnd(5));
        p.failover_accepted = static_cast<uint8_t>(rnd(2));
        p.end_to_end_flow_control = rnd(1);
        p.rnr_retry_count = static_cast<uint8_t>(rnd(3));
        p.srq = rnd(1);
        p.local_ca_guid = rnd(64);
        fill(p.private_data);

        CmRtu t;
        t.local_comm_id = static_cast<uint32_t>(rnd(32));
        t.remote_comm_id = static_cast<uint32_t>(rnd(32));
        fill(t.private_data);

        CmDreq d;
        d.local_comm_id = static_cast<uint32_t>(rnd(32));
        d.remote_comm_id = static_cast<uint32_t>(rnd(32));
        d.remote_qpn = static_cast<uint32_t>(rnd(24));
        fill(d.private_data);

        CmDrep e;
        e.local_comm_id = static_cast<uint32_t>(rnd(32));
        e.remote_comm_id = static_cast<uint32_t>(rnd(32));
        fill(e.private_data);

        CmSidrReq sq;
        sq.request_id = static_cast<uint32_t>(rnd(32));
        sq.pkey = static_cast<uint16_t>(rnd(16));
        sq.service_id = rnd(64);
        fill(sq.private_data);

        CmSidrRep sp;
        sp.request_id = static_cast<uint32_t>(rnd(32));
        sp.status = static_cast<uint8_t>(rnd(8));
        sp.additional_info_length = static_cast<uint8_t>(rnd(8));
        sp.qpn = static_cast<uint32_t>(rnd(24));
        sp.service_id = rnd(64);
        sp.qkey = static_cast<uint32_t>(rnd(32));
        fill(sp.class_port_info);
        fill(sp.private_data);

        const CmBody bodies[] = {q, a, j, p, t, d, e, sq, sp};
        for (const CmBody& body : bodies) {
            CAPTURE(round, body.index());
            CmMad m;
            m.header.transaction_id = rnd(64);
            m.header.attribute_modifier = static_cast<uint32_t>(rnd(32));
            m.body = body;
            const auto wire = encode_cm_mad(m);
            CmMad back;
            REQUIRE(decode_cm_mad(wire, back) == CmDecodeError::None);
            CHECK(back.body == body);
            CHECK(back.header.transaction_id == m.header.transaction_id);
            CHECK(back.header.attribute_modifier == m.header.attribute_modifier);
            CHECK(back.header.attribute_id == static_cast<uint16_t>(attribute_of(body)));
        }
    }
}

TEST_CASE("what is not a CM MAD uroce acts on is refused, with the reason") {
    const auto good = encode_cm_mad({header(1), kernel_req_frame1()});
    CmMad out;
    SECTION("shorter than a MAD") {
        CHECK(decode_cm_mad(std::span(good).first(kMadBytes - 1), out) == CmDecodeError::TooShort);
        CHECK(decode_cm_mad({}, out) == CmDecodeError::TooShort);
    }
    SECTION("header fields") {
        struct Case {
            size_t byte;
            uint8_t value;
            CmDecodeError expect;
        };
        const Case cases[] = {
            {0, 2, CmDecodeError::BadBaseVersion},
            {1, 0x01, CmDecodeError::NotCm},
            {1, 0x81, CmDecodeError::NotCm},
            {2, 1, CmDecodeError::BadClassVersion},
            {3, 0x01, CmDecodeError::BadMethod},
            {3, 0x81, CmDecodeError::BadMethod},
            {17, 0x19, CmDecodeError::UnsupportedAttribute},  // LAP
            {17, 0x1a, CmDecodeError::UnsupportedAttribute},  // APR
            {17, 0x01, CmDecodeError::UnsupportedAttribute},  // ClassPortInfo
            {17, 0x00, CmDecodeError::UnsupportedAttribute},
            {16, 0x80, CmDecodeError::UnsupportedAttribute},  // 0x8010: vendor range
        };
        for (const Case& c : cases) {
            CAPTURE(c.byte, c.value);
            auto bad = good;
            bad[c.byte] = c.value;
            CHECK(decode_cm_mad(bad, out) == c.expect);
            CHECK(std::string(to_string(c.expect)).size() > 3);
        }
    }
    SECTION("longer is fine: bytes past the MAD are not read") {
        std::vector<uint8_t> longer(good.begin(), good.end());
        longer.resize(kMadBytes + 40, 0xee);
        REQUIRE(decode_cm_mad(longer, out) == CmDecodeError::None);
        CHECK(std::get<CmReq>(out.body) == kernel_req_frame1());
    }
}

TEST_CASE("a malformed RDMA CM header is refused") {
    std::array<uint8_t, kReqPrivateBytes> pd = kernel_req_frame1().private_data;
    IpCmHeader h;
    CHECK(read_ip_cm_header(std::span(pd).first(kIpCmHeaderBytes - 1), h) ==
          IpCmHeaderError::TooShort);
    auto bad = pd;
    bad[0] = 0x10;  // major version 1
    CHECK(read_ip_cm_header(bad, h) == IpCmHeaderError::BadVersion);
    bad = pd;
    bad[1] = 0x50;  // IP version 5
    CHECK(read_ip_cm_header(bad, h) == IpCmHeaderError::BadIpVersion);
    bad = pd;
    bad[1] = 0x60;  // IPv6 is a valid version
    CHECK(read_ip_cm_header(bad, h) == IpCmHeaderError::None);
    CHECK(h.ip_version == 6);
}

TEST_CASE("service IDs of the RDMA IP CM port spaces") {
    CHECK(service_id_of(PortSpace::Tcp, 0x4853) == 0x0000000001064853ull);
    CHECK(service_id_of(PortSpace::Udp, 7174) == 0x0000000001111c06ull);
    CHECK(service_id_of(PortSpace::Ib, 1) == 0x00000000013f0001ull);
    for (PortSpace ps : {PortSpace::Tcp, PortSpace::Udp, PortSpace::Ib}) {
        const auto s = ip_service_of(service_id_of(ps, 4242));
        REQUIRE(s.has_value());
        CHECK(s->port_space == ps);
        CHECK(s->port == 4242);
    }
    CHECK_FALSE(ip_service_of(service_id_of(PortSpace::Ipoib, 1)).has_value());
    CHECK_FALSE(ip_service_of(0x0000000002064853ull).has_value());  // another prefix
    CHECK_FALSE(ip_service_of(0x0000000001074853ull).has_value());  // protocol 7
    CHECK_FALSE(ip_service_of(0x1000000001064853ull).has_value());
}

TEST_CASE("uroce's CM takes the kernel's REQ and answers with the kernel's REP layout") {
    using namespace uroce::transport;
    using namespace uroce::transport::test;
    Pair p;
    std::mutex mutex;
    std::vector<CmEvent> events;
    std::vector<std::vector<uint8_t>> sent;
    p.b.engine->set_transmit_filter([&](std::span<const uint8_t> udp, const uroce::IpAddress&) {
        std::lock_guard lock(mutex);
        sent.emplace_back(udp.begin(), udp.end());
        return false;  // kept here, not sent
    });
    CmService service(*p.b.engine, kServerGuid, CmTimers{}, [&](const CmEvent& e) {
        std::lock_guard lock(mutex);
        events.push_back(e);
    });
    REQUIRE(service.listen(service_id_of(PortSpace::Tcp, kServerPort), 1) == 0);

    // The kernel's REQ MAD, in a packet addressed to this engine.
    uroce::wire::Headers h;
    h.bth.opcode = static_cast<uint8_t>(uroce::wire::Opcode::UdSendOnly);
    h.bth.dest_qp = kGsiQpn;
    h.bth.ack_req = true;
    h.deth.qkey = kGsiQkey;
    h.deth.src_qp = kGsiQpn;
    const uroce::wire::IpFlow flow{p.a.ip, p.b.ip, 55410, p.b.engine->config().port};
    p.b.engine->receive_datagram(forge_packet(h, mad_of(find_packet(kCapture, 1)), flow), p.a.ip,
                                 55410);
    CmEvent req;
    {
        std::lock_guard lock(mutex);
        REQUIRE(events.size() == 1);
        req = events.front();
    }
    REQUIRE(req.type == CmEventType::ReqReceived);
    CHECK(std::get<CmReq>(req.message->body) == kernel_req_frame1());

    CmRep rep;
    rep.local_qpn = 0x11;
    rep.starting_psn = 0x168009;
    rep.target_ack_delay = 15;
    rep.rnr_retry_count = 7;
    REQUIRE(service.agent().send_rep(req.comm_id, rep) == 0);
    std::vector<uint8_t> pkt;
    {
        std::lock_guard lock(mutex);
        REQUIRE(sent.size() == 1);
        pkt = sent.front();
    }
    ParsedPacket parsed;
    REQUIRE(parse_packet(pkt, parsed) == ParseError::None);
    CHECK(parsed.h.bth.opcode == static_cast<uint8_t>(uroce::wire::Opcode::UdSendOnly));
    CHECK(parsed.h.bth.dest_qp == kGsiQpn);
    CHECK(parsed.h.bth.ack_req);
    CHECK_FALSE(parsed.h.bth.migreq);
    CHECK(parsed.h.deth.qkey == kGsiQkey);
    CHECK(parsed.h.deth.src_qp == kGsiQpn);
    REQUIRE(parsed.payload.size() == kMadBytes);
    // Byte for byte the kernel's REP (same transaction ID, remote comm ID, fields), but for
    // the local comm ID, which is ours.
    auto expect = bytes(mad_of(find_packet(kCapture, 2)));
    for (int i = 0; i < 4; ++i)
        expect[kMadHeaderBytes + i] = static_cast<uint8_t>(req.comm_id >> (24 - 8 * i));
    CHECK(bytes(parsed.payload) == expect);
    service.agent().destroy(req.comm_id);
}

TEST_CASE("the kernel sends from the PSN its peer's CM message named") {
    // A REQ's or REP's Starting PSN is, as Linux uses it, the PSN its sender will receive
    // from: the active side's first SEND carries the REP's PSN, the passive side's the REQ's.
    const auto decode = [](size_t frame) {
        CmMad m;
        REQUIRE(decode_cm_mad(mad_of(find_packet(kCapture, frame)), m) == CmDecodeError::None);
        return m;
    };
    const auto psn_of = [](size_t frame) {
        ParsedPacket p;
        REQUIRE(parse_packet(find_packet(kCapture, frame).udp, p) == ParseError::None);
        return p.h.bth.psn;
    };
    const uint32_t req_psn = std::get<CmReq>(decode(1).body).starting_psn;
    const uint32_t rep_psn = std::get<CmRep>(decode(2).body).starting_psn;
    CHECK(psn_of(4) == rep_psn);  // the client's (active) first SEND
    CHECK(psn_of(6) == req_psn);  // the server's (passive) first SEND
}

namespace {

// The devices and port tables of one test "process" for RdmaCm.
class OneDeviceHost : public uroce::transport::cm::CmHost {
  public:
    OneDeviceHost(uroce::transport::Engine& engine, uint32_t ip, std::string dir)
        : engine_(engine), ip_(ip), dir_(std::move(dir)) {}
    std::vector<CmDeviceInfo> devices() const override {
        return {{"devB", ip_, kServerGuid, 1024}};
    }
    uroce::transport::Engine* cm_engine(const std::string&, int&) override { return &engine_; }
    std::string port_table_path(PortSpace) const override { return dir_ + "/ports"; }

  private:
    uroce::transport::Engine& engine_;
    uint32_t ip_;
    std::string dir_;
};

}  // namespace

TEST_CASE("an RdmaCm listener takes the kernel's REQ with the kernel's PSN rules") {
    using namespace uroce::transport;
    using namespace uroce::transport::test;
    Pair p;
    std::mutex mutex;
    std::vector<CmIdEvent> events;
    std::vector<std::vector<uint8_t>> sent;
    p.b.engine->set_transmit_filter([&](std::span<const uint8_t> udp, const uroce::IpAddress&) {
        std::lock_guard lock(mutex);
        sent.emplace_back(udp.begin(), udp.end());
        return false;
    });
    char dir_template[] = "/tmp/uroce-cm-kernel-XXXXXX";
    REQUIRE(::mkdtemp(dir_template) != nullptr);
    OneDeviceHost host(*p.b.engine, p.b.ip.v4(), dir_template);
    RdmaCm cm(host, [&](const CmIdEvent& e) {
        std::lock_guard lock(mutex);
        events.push_back(e);
    });
    const uint32_t listener = cm.create_id(PortSpace::Tcp);
    REQUIRE(cm.bind(listener, {p.b.ip.v4(), kServerPort}) == 0);
    REQUIRE(cm.listen(listener, 1) == 0);

    uroce::wire::Headers h;
    h.bth.opcode = static_cast<uint8_t>(uroce::wire::Opcode::UdSendOnly);
    h.bth.dest_qp = kGsiQpn;
    h.bth.ack_req = true;
    h.deth.qkey = kGsiQkey;
    h.deth.src_qp = kGsiQpn;
    const uroce::wire::IpFlow flow{p.a.ip, p.b.ip, 55410, p.b.engine->config().port};
    p.b.engine->receive_datagram(forge_packet(h, mad_of(find_packet(kCapture, 1)), flow), p.a.ip,
                                 55410);
    CmIdEvent req;
    {
        std::lock_guard lock(mutex);
        REQUIRE(events.size() == 1);
        req = events.front();
    }
    REQUIRE(req.type == CmIdEventType::ConnectRequest);
    const CmReq kreq = kernel_req_frame1();
    CHECK(req.param.qp_num == kreq.local_qpn);
    CmIdInfo info;
    REQUIRE(cm.query(req.id, info) == 0);
    CHECK(info.dst.port == kClientPort);  // from the RDMA IP CM header
    CmQpAttr rtr, rts;
    REQUIRE(cm.init_qp_attr(req.id, CmQpState::Rtr, rtr) == 0);
    REQUIRE(cm.init_qp_attr(req.id, CmQpState::Rts, rts) == 0);
    CHECK(rtr.dest_qp_num == kreq.local_qpn);
    CHECK(rts.sq_psn == kreq.starting_psn);  // the passive side sends from the REQ's PSN

    CmConnParam ap;
    ap.qp_num = 0x11;
    REQUIRE(cm.accept(req.id, &ap) == 0);
    std::vector<uint8_t> pkt;
    {
        std::lock_guard lock(mutex);
        REQUIRE(sent.size() == 1);
        pkt = sent.front();
    }
    ParsedPacket parsed;
    REQUIRE(parse_packet(pkt, parsed) == ParseError::None);
    CmMad rep;
    REQUIRE(decode_cm_mad(parsed.payload, rep) == CmDecodeError::None);
    REQUIRE(std::holds_alternative<CmRep>(rep.body));
    // ... and names in its REP the PSN it receives from.
    CHECK(std::get<CmRep>(rep.body).starting_psn == rtr.rq_psn);
    CHECK(std::get<CmRep>(rep.body).local_qpn == 0x11u);
    cm.destroy_all();
    std::filesystem::remove_all(dir_template);
}
