// RDMA CM through the real librdmacm: its rdma_cm device answered by the provider (ucma
// emulation), identifiers connecting RC QPs between two uroce devices in this process, data
// sent over the connection, and the error paths applications meet: a port nobody listens on,
// a rejection with private data, bad addresses and ports, a non-blocking channel with nothing
// to read; an identifier moved to another channel. Every wait is bounded (the channels are
// non-blocking and polled).
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;

namespace {

constexpr auto kLimit = std::chrono::seconds(10);

uint16_t next_port() {
    static uint16_t port = static_cast<uint16_t>(30000 + ::getpid() % 20000);
    return ++port;
}

sockaddr_in address(const std::string& ip, uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    REQUIRE(inet_pton(AF_INET, ip.c_str(), &a.sin_addr) == 1);
    return a;
}

sockaddr* sa(sockaddr_in& a) {
    return reinterpret_cast<sockaddr*>(&a);
}

// A non-blocking event channel, destroyed at the end of the scope.
struct Channel {
    rdma_event_channel* ch = rdma_create_event_channel();
    Channel() {
        REQUIRE(ch != nullptr);
        const int flags = fcntl(ch->fd, F_GETFL);
        REQUIRE(fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) == 0);
    }
    ~Channel() {
        if (ch) rdma_destroy_event_channel(ch);
    }
    // The next event, which must be `type` (acknowledged before returning its copy).
    rdma_cm_event next(rdma_cm_event_type type) {
        INFO("waiting for " << rdma_event_str(type));
        REQUIRE(wait_readable(ch->fd, kLimit));
        rdma_cm_event* ev = nullptr;
        REQUIRE(rdma_get_cm_event(ch, &ev) == 0);
        rdma_cm_event copy = *ev;
        INFO("got " << rdma_event_str(ev->event) << " status " << ev->status);
        REQUIRE(rdma_ack_cm_event(ev) == 0);
        REQUIRE(copy.event == type);
        return copy;
    }
    // Like next(), but the private data is copied out before the acknowledgement.
    rdma_cm_event next_with_data(rdma_cm_event_type type, std::vector<uint8_t>& data) {
        REQUIRE(wait_readable(ch->fd, kLimit));
        rdma_cm_event* ev = nullptr;
        REQUIRE(rdma_get_cm_event(ch, &ev) == 0);
        rdma_cm_event copy = *ev;
        INFO("got " << rdma_event_str(ev->event) << " status " << ev->status);
        const auto* p = static_cast<const uint8_t*>(ev->param.conn.private_data);
        data.assign(p, p + (p ? ev->param.conn.private_data_len : 0));
        REQUIRE(rdma_ack_cm_event(ev) == 0);
        REQUIRE(copy.event == type);
        return copy;
    }
};

// An RC QP on an identifier, with a PD, a CQ and one registered buffer.
struct CmQp {
    ibv_pd* pd = nullptr;
    ibv_cq* cq = nullptr;
    ibv_mr* mr = nullptr;
    std::vector<uint8_t> buf = std::vector<uint8_t>(4096);
    rdma_cm_id* id = nullptr;
    explicit CmQp(rdma_cm_id* cm_id) : id(cm_id) {
        REQUIRE(id->verbs != nullptr);
        pd = ibv_alloc_pd(id->verbs);
        REQUIRE(pd);
        cq = ibv_create_cq(id->verbs, 16, nullptr, nullptr, 0);
        REQUIRE(cq);
        const int access = IBV_ACCESS_LOCAL_WRITE;
        mr = ibv_reg_mr(pd, buf.data(), buf.size(), access);
        REQUIRE(mr);
        ibv_qp_init_attr attr{};
        attr.send_cq = cq;
        attr.recv_cq = cq;
        attr.qp_type = IBV_QPT_RC;
        attr.cap.max_send_wr = 8;
        attr.cap.max_recv_wr = 8;
        attr.cap.max_send_sge = 1;
        attr.cap.max_recv_sge = 1;
        REQUIRE(rdma_create_qp(id, pd, &attr) == 0);
    }
    ~CmQp() {
        rdma_destroy_qp(id);
        ibv_dereg_mr(mr);
        ibv_destroy_cq(cq);
        ibv_dealloc_pd(pd);
    }
    void post_recv(size_t len) {
        ibv_sge sge{reinterpret_cast<uint64_t>(buf.data()), static_cast<uint32_t>(len), mr->lkey};
        ibv_recv_wr wr{};
        wr.wr_id = 1;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        ibv_recv_wr* bad = nullptr;
        REQUIRE(ibv_post_recv(id->qp, &wr, &bad) == 0);
    }
    void post_send(size_t len) {
        ibv_sge sge{reinterpret_cast<uint64_t>(buf.data()), static_cast<uint32_t>(len), mr->lkey};
        ibv_send_wr wr{};
        wr.wr_id = 2;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED;
        ibv_send_wr* bad = nullptr;
        REQUIRE(ibv_post_send(id->qp, &wr, &bad) == 0);
    }
    ibv_wc completion() {
        const auto wcs = wait_completions(cq, 1);
        REQUIRE(wcs.size() == 1);
        CHECK(wcs[0].status == IBV_WC_SUCCESS);
        return wcs[0];
    }
};

// A client identifier on `channel` whose route from device A to `dst` is resolved.
rdma_cm_id* resolved_client(Channel& channel, sockaddr_in dst) {
    rdma_cm_id* id = nullptr;
    REQUIRE(rdma_create_id(channel.ch, &id, nullptr, RDMA_PS_TCP) == 0);
    auto src = address(devices().ip_a, 0);
    REQUIRE(rdma_resolve_addr(id, sa(src), sa(dst), 2000) == 0);
    channel.next(RDMA_CM_EVENT_ADDR_RESOLVED);
    REQUIRE(id->verbs != nullptr);
    CHECK(std::string(ibv_get_device_name(id->verbs->device)) == devices().a);
    REQUIRE(rdma_resolve_route(id, 2000) == 0);
    channel.next(RDMA_CM_EVENT_ROUTE_RESOLVED);
    return id;
}

rdma_cm_id* listener(Channel& channel, sockaddr_in at) {
    rdma_cm_id* id = nullptr;
    REQUIRE(rdma_create_id(channel.ch, &id, nullptr, RDMA_PS_TCP) == 0);
    REQUIRE(rdma_bind_addr(id, sa(at)) == 0);
    REQUIRE(rdma_listen(id, 4) == 0);
    return id;
}

}  // namespace

TEST_CASE("RDMA CM: connect, send both ways, disconnect", "[rdma_cm]") {
    Channel server_ch, client_ch;
    const uint16_t port = next_port();
    rdma_cm_id* lid = listener(server_ch, address(devices().ip_b, port));
    CHECK(ntohs(rdma_get_src_port(lid)) == port);
    rdma_cm_id* cid = resolved_client(client_ch, address(devices().ip_b, port));
    CHECK(ntohs(rdma_get_dst_port(cid)) == port);
    // The client's QP goes before its identifier (rdma_destroy_qp reads the identifier:
    // destroyed after it, the QP's destroy read freed memory, and the test crashed now
    // and then).
    rdma_cm_id* sid = nullptr;
    {
        CmQp client(cid);

        const char hello[] = "hello from the client";
        rdma_conn_param cp{};
        cp.private_data = hello;
        cp.private_data_len = sizeof hello;
        cp.responder_resources = 1;
        cp.initiator_depth = 1;
        cp.retry_count = 7;
        cp.rnr_retry_count = 7;
        REQUIRE(rdma_connect(cid, &cp) == 0);

        // The request arrives on a new identifier, with the client's private data.
        REQUIRE(wait_readable(server_ch.ch->fd, kLimit));
        rdma_cm_event* ev = nullptr;
        REQUIRE(rdma_get_cm_event(server_ch.ch, &ev) == 0);
        REQUIRE(ev->event == RDMA_CM_EVENT_CONNECT_REQUEST);
        sid = ev->id;
        CHECK(ev->listen_id == lid);
        REQUIRE(ev->param.conn.private_data_len >= sizeof hello);
        CHECK(std::memcmp(ev->param.conn.private_data, hello, sizeof hello) == 0);
        REQUIRE(sid->verbs != nullptr);
        CHECK(std::string(ibv_get_device_name(sid->verbs->device)) == devices().b);
        REQUIRE(rdma_ack_cm_event(ev) == 0);
        {
            CmQp server(sid);
            server.post_recv(64);
            const char welcome[] = "welcome";
            rdma_conn_param ap{};
            ap.private_data = welcome;
            ap.private_data_len = sizeof welcome;
            ap.responder_resources = 1;
            ap.initiator_depth = 1;
            ap.rnr_retry_count = 7;
            REQUIRE(rdma_accept(sid, &ap) == 0);

            std::vector<uint8_t> data;
            client_ch.next_with_data(RDMA_CM_EVENT_ESTABLISHED, data);
            REQUIRE(data.size() >= sizeof welcome);
            CHECK(std::memcmp(data.data(), welcome, sizeof welcome) == 0);
            server_ch.next(RDMA_CM_EVENT_ESTABLISHED);

            // The QPs the CM moved to RTS carry data both ways.
            ibv_qp_attr attr{};
            ibv_qp_init_attr init{};
            REQUIRE(ibv_query_qp(cid->qp, &attr, IBV_QP_STATE | IBV_QP_DEST_QPN, &init) == 0);
            CHECK(attr.qp_state == IBV_QPS_RTS);
            CHECK(attr.dest_qp_num == sid->qp->qp_num);
            fill_pattern(client.buf.data(), 64, 11);
            const std::vector<uint8_t> sent(client.buf.begin(), client.buf.begin() + 64);
            client.post_recv(64);
            client.post_send(64);
            CHECK(client.completion().opcode == IBV_WC_SEND);
            const ibv_wc got = server.completion();
            CHECK(got.opcode == IBV_WC_RECV);
            CHECK(got.byte_len == 64);
            CHECK(std::equal(sent.begin(), sent.end(), server.buf.begin()));
            fill_pattern(server.buf.data(), 64, 12);
            const std::vector<uint8_t> back(server.buf.begin(), server.buf.begin() + 64);
            server.post_send(64);
            CHECK(server.completion().opcode == IBV_WC_SEND);
            CHECK(client.completion().opcode == IBV_WC_RECV);
            CHECK(std::equal(back.begin(), back.end(), client.buf.begin()));

            REQUIRE(rdma_disconnect(cid) == 0);
            server_ch.next(RDMA_CM_EVENT_DISCONNECTED);
            REQUIRE(rdma_disconnect(sid) == 0);
            client_ch.next(RDMA_CM_EVENT_DISCONNECTED);
        }
    }
    // Every event was acknowledged: destroy returns at once.
    REQUIRE(rdma_destroy_id(sid) == 0);
    REQUIRE(rdma_destroy_id(lid) == 0);
    REQUIRE(rdma_destroy_id(cid) == 0);
}

TEST_CASE("RDMA CM: a rejection carries its reason and private data", "[rdma_cm]") {
    Channel server_ch, client_ch;
    const uint16_t port = next_port();
    rdma_cm_id* lid = listener(server_ch, address(devices().ip_b, port));
    rdma_cm_id* cid = resolved_client(client_ch, address(devices().ip_b, port));
    {
        CmQp client(cid);
        rdma_conn_param cp{};
        cp.retry_count = 7;
        REQUIRE(rdma_connect(cid, &cp) == 0);
        REQUIRE(wait_readable(server_ch.ch->fd, kLimit));
        rdma_cm_event* ev = nullptr;
        REQUIRE(rdma_get_cm_event(server_ch.ch, &ev) == 0);
        REQUIRE(ev->event == RDMA_CM_EVENT_CONNECT_REQUEST);
        rdma_cm_id* sid = ev->id;
        REQUIRE(rdma_ack_cm_event(ev) == 0);
        const char no[] = "no room";
        REQUIRE(rdma_reject(sid, no, sizeof no) == 0);
        std::vector<uint8_t> data;
        const rdma_cm_event rej = client_ch.next_with_data(RDMA_CM_EVENT_REJECTED, data);
        CHECK(rej.status == 28);  // IB_CM_REJ_CONSUMER_DEFINED
        REQUIRE(data.size() >= sizeof no);
        CHECK(std::memcmp(data.data(), no, sizeof no) == 0);
        REQUIRE(rdma_destroy_id(sid) == 0);
    }
    REQUIRE(rdma_destroy_id(cid) == 0);
    REQUIRE(rdma_destroy_id(lid) == 0);
}

TEST_CASE("RDMA CM: a request withdrawn before it is accepted stays off the listener",
          "[rdma_cm]") {
    // The client gives up on a connection the server has not accepted yet (its REJ reaches
    // the new identifier). As with a kernel's RDMA CM, the new identifier reports nothing
    // before rdma_accept names it: its REJECTED must not arrive as an event of the listener,
    // and destroying the new identifier must not wait for an acknowledgement it never gets.
    Channel server_ch, client_ch;
    const uint16_t port = next_port();
    rdma_cm_id* lid = listener(server_ch, address(devices().ip_b, port));
    rdma_cm_id* cid = resolved_client(client_ch, address(devices().ip_b, port));
    rdma_cm_id* sid = nullptr;
    {
        CmQp client(cid);
        rdma_conn_param cp{};
        cp.retry_count = 7;
        REQUIRE(rdma_connect(cid, &cp) == 0);
        sid = server_ch.next(RDMA_CM_EVENT_CONNECT_REQUEST).id;
        REQUIRE(sid != nullptr);
    }
    REQUIRE(rdma_destroy_id(cid) == 0);  // REQ sent, no answer yet: a REJ goes out

    // Nothing to read (an event would have come well within this).
    std::string event;
    if (wait_readable(server_ch.ch->fd, std::chrono::milliseconds(500))) {
        rdma_cm_event* ev = nullptr;
        REQUIRE(rdma_get_cm_event(server_ch.ch, &ev) == 0);
        event = std::string(rdma_event_str(ev->event)) + (ev->id == lid ? " on the listener" : "");
        REQUIRE(rdma_ack_cm_event(ev) == 0);
    }
    CHECK(event == "");
    // The destroy returns (in a thread of its own: it would wait for ever).
    auto done = std::make_shared<std::promise<int>>();
    std::thread([sid, done] { done->set_value(rdma_destroy_id(sid)); }).detach();
    auto result = done->get_future();
    REQUIRE(result.wait_for(kLimit) == std::future_status::ready);
    CHECK(result.get() == 0);
    REQUIRE(rdma_destroy_id(lid) == 0);
}

TEST_CASE("RDMA CM: a listener's backlog holds requests until their events are read", "[rdma_cm]") {
    // Backlog 1: the second client's REQ finds no room while the first request's event waits
    // unread, and is dropped unanswered (test_rdma_cm_peer.cpp shows it); once that event is
    // read, the REQ's resend (about a second later) is taken.
    Channel server_ch, client_ch;
    const uint16_t port = next_port();
    rdma_cm_id* lid = nullptr;
    REQUIRE(rdma_create_id(server_ch.ch, &lid, nullptr, RDMA_PS_TCP) == 0);
    auto at = address(devices().ip_b, port);
    REQUIRE(rdma_bind_addr(lid, sa(at)) == 0);
    REQUIRE(rdma_listen(lid, 1) == 0);
    rdma_cm_id* first = resolved_client(client_ch, address(devices().ip_b, port));
    rdma_cm_id* second = resolved_client(client_ch, address(devices().ip_b, port));
    {
        CmQp q1(first), q2(second);
        rdma_conn_param cp{};
        cp.retry_count = 7;
        REQUIRE(rdma_connect(first, &cp) == 0);
        REQUIRE(wait_readable(server_ch.ch->fd, kLimit));
        REQUIRE(rdma_connect(second, &cp) == 0);
        const rdma_cm_event req1 = server_ch.next(RDMA_CM_EVENT_CONNECT_REQUEST);
        // Reading it made room (GET_EVENT tells the RDMA CM): without that, the second REQ
        // would be dropped until its retries ran out.
        const rdma_cm_event req2 = server_ch.next(RDMA_CM_EVENT_CONNECT_REQUEST);
        CHECK(rdma_get_dst_port(req1.id) == rdma_get_src_port(first));
        CHECK(rdma_get_dst_port(req2.id) == rdma_get_src_port(second));
        CHECK(rdma_reject(req1.id, nullptr, 0) == 0);
        CHECK(rdma_reject(req2.id, nullptr, 0) == 0);
        client_ch.next(RDMA_CM_EVENT_REJECTED);
        client_ch.next(RDMA_CM_EVENT_REJECTED);
        REQUIRE(rdma_destroy_id(req1.id) == 0);
        REQUIRE(rdma_destroy_id(req2.id) == 0);
    }
    REQUIRE(rdma_destroy_id(first) == 0);
    REQUIRE(rdma_destroy_id(second) == 0);
    REQUIRE(rdma_destroy_id(lid) == 0);
}

TEST_CASE("RDMA CM: a port nobody listens on is refused", "[rdma_cm]") {
    // This process listens on another port of device B, so a CM answers there.
    Channel server_ch, client_ch;
    rdma_cm_id* lid = listener(server_ch, address(devices().ip_b, next_port()));
    rdma_cm_id* cid = resolved_client(client_ch, address(devices().ip_b, next_port()));
    {
        CmQp client(cid);
        rdma_conn_param cp{};
        REQUIRE(rdma_connect(cid, &cp) == 0);
        CHECK(client_ch.next(RDMA_CM_EVENT_REJECTED).status == 8);  // invalid service ID
    }
    REQUIRE(rdma_destroy_id(cid) == 0);
    REQUIRE(rdma_destroy_id(lid) == 0);
}

TEST_CASE("RDMA CM: bad addresses, ports and calls fail as on a kernel", "[rdma_cm]") {
    Channel ch;
    rdma_cm_id* id = nullptr;
    REQUIRE(rdma_create_id(ch.ch, &id, nullptr, RDMA_PS_TCP) == 0);
    SECTION("an address no device has") {
        auto a = address("10.9.8.7", 0);
        CHECK(rdma_bind_addr(id, sa(a)) == -1);
        CHECK(errno == EADDRNOTAVAIL);
    }
    SECTION("a port already bound") {
        rdma_cm_id* other = nullptr;
        REQUIRE(rdma_create_id(ch.ch, &other, nullptr, RDMA_PS_TCP) == 0);
        const uint16_t port = next_port();
        auto a = address(devices().ip_a, port);
        REQUIRE(rdma_bind_addr(other, sa(a)) == 0);
        CHECK(rdma_bind_addr(id, sa(a)) == -1);
        CHECK(errno == EADDRINUSE);
        REQUIRE(rdma_destroy_id(other) == 0);
        CHECK(rdma_bind_addr(id, sa(a)) == 0);  // free again
    }
    SECTION("nothing to read on a non-blocking channel") {
        rdma_cm_event* ev = nullptr;
        CHECK_FALSE(wait_readable(ch.ch->fd, std::chrono::milliseconds(50)));
        CHECK(rdma_get_cm_event(ch.ch, &ev) == -1);
        CHECK(errno == EAGAIN);
    }
    REQUIRE(rdma_destroy_id(id) == 0);
}

TEST_CASE("RDMA CM: events follow an identifier to its new channel", "[rdma_cm]") {
    Channel first, second;
    rdma_cm_id* id = nullptr;
    REQUIRE(rdma_create_id(first.ch, &id, nullptr, RDMA_PS_TCP) == 0);
    REQUIRE(rdma_migrate_id(id, second.ch) == 0);
    auto src = address(devices().ip_a, 0);
    auto dst = address(devices().ip_b, next_port());
    REQUIRE(rdma_resolve_addr(id, sa(src), sa(dst), 2000) == 0);
    second.next(RDMA_CM_EVENT_ADDR_RESOLVED);
    CHECK_FALSE(wait_readable(first.ch->fd, std::chrono::milliseconds(50)));
    REQUIRE(rdma_destroy_id(id) == 0);
}

TEST_CASE("RDMA CM: a listener moved to another channel takes its waiting requests along",
          "[rdma_cm]") {
    // A CONNECT_REQUEST not yet read when the listener moves is read from the new channel;
    // librdmacm then asks about the new identifier through that channel (QUERY, ACCEPT), so
    // the new identifier must have moved with its event, or the request is lost.
    Channel first, second, client_ch;
    const uint16_t port = next_port();
    rdma_cm_id* lid = listener(first, address(devices().ip_b, port));
    rdma_cm_id* cid = resolved_client(client_ch, address(devices().ip_b, port));
    rdma_cm_id* sid = nullptr;
    {
        CmQp client(cid);
        rdma_conn_param cp{};
        cp.retry_count = 7;
        cp.rnr_retry_count = 7;
        REQUIRE(rdma_connect(cid, &cp) == 0);
        REQUIRE(wait_readable(first.ch->fd, kLimit));  // the request waits, unread
        REQUIRE(rdma_migrate_id(lid, second.ch) == 0);
        CHECK_FALSE(wait_readable(first.ch->fd, std::chrono::milliseconds(0)));
        const rdma_cm_event req = second.next(RDMA_CM_EVENT_CONNECT_REQUEST);
        sid = req.id;
        REQUIRE(sid != nullptr);
        CHECK(req.listen_id == lid);
        CHECK(sid->channel == second.ch);
        {
            CmQp server(sid);
            rdma_conn_param ap{};
            ap.rnr_retry_count = 7;
            REQUIRE(rdma_accept(sid, &ap) == 0);
            client_ch.next(RDMA_CM_EVENT_ESTABLISHED);
            second.next(RDMA_CM_EVENT_ESTABLISHED);
            REQUIRE(rdma_disconnect(cid) == 0);
            second.next(RDMA_CM_EVENT_DISCONNECTED);
            client_ch.next(RDMA_CM_EVENT_DISCONNECTED);
        }
    }
    CHECK_FALSE(wait_readable(first.ch->fd, std::chrono::milliseconds(0)));
    REQUIRE(rdma_destroy_id(sid) == 0);
    REQUIRE(rdma_destroy_id(lid) == 0);
    REQUIRE(rdma_destroy_id(cid) == 0);
}

TEST_CASE("RDMA CM: multicast joins are granted with the group's RoCE MGID", "[rdma_cm]") {
    Channel ch;
    rdma_cm_id* id = nullptr;
    REQUIRE(rdma_create_id(ch.ch, &id, nullptr, RDMA_PS_UDP) == 0);
    auto src = address(devices().ip_a, 0);
    REQUIRE(rdma_bind_addr(id, sa(src)) == 0);
    SECTION("a unicast address is no group") {
        auto unicast = address(devices().ip_b, 0);
        CHECK(rdma_join_multicast(id, sa(unicast), nullptr) == -1);
        CHECK(errno == EINVAL);
    }
    SECTION("join, event, leave") {
        auto group = address("239.7.7.7", 0);
        int context = 0;
        REQUIRE(rdma_join_multicast(id, sa(group), &context) == 0);
        REQUIRE(wait_readable(ch.ch->fd, kLimit));
        rdma_cm_event* ev = nullptr;
        REQUIRE(rdma_get_cm_event(ch.ch, &ev) == 0);
        REQUIRE(ev->event == RDMA_CM_EVENT_MULTICAST_JOIN);
        CHECK(ev->id == id);
        CHECK(ev->param.ud.private_data == &context);
        CHECK(ev->param.ud.qp_num == 0xffffff);
        CHECK(ev->param.ud.ah_attr.is_global == 1);
        const uint8_t mgid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 7, 7, 7};
        CHECK(std::memcmp(ev->param.ud.ah_attr.grh.dgid.raw, mgid, 16) == 0);
        REQUIRE(rdma_ack_cm_event(ev) == 0);
        CHECK(rdma_leave_multicast(id, sa(group)) == 0);   // waits for the acknowledgement
        CHECK(rdma_leave_multicast(id, sa(group)) == -1);  // no longer joined
        CHECK(errno == EADDRNOTAVAIL);
    }
    REQUIRE(rdma_destroy_id(id) == 0);
}

TEST_CASE("RDMA CM: rdma_get_devices lists the uroce devices, opened", "[rdma_cm]") {
    int n = 0;
    ibv_context** list = rdma_get_devices(&n);
    REQUIRE(list != nullptr);
    std::vector<std::string> names;
    for (int i = 0; i < n; ++i) {
        REQUIRE(list[i] != nullptr);
        names.push_back(ibv_get_device_name(list[i]->device));
        ibv_device_attr attr{};
        CHECK(ibv_query_device(list[i], &attr) == 0);  // a usable context
    }
    CHECK(list[n] == nullptr);
    for (const std::string& want : {devices().a, devices().b, devices().c}) {
        INFO("device " << want);
        CHECK(std::find(names.begin(), names.end(), want) != names.end());
    }
    rdma_free_devices(list);
}
