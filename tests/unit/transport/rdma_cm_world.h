// Two RDMA CM "processes" (an RdmaCm each) on two engines on loopback, sharing a port table
// as the processes of a host do, with the events each one reports (transport/cm/rdma_cm.h);
// and a raw peer that speaks CM MADs of a test's making from QP1 of A's engine. Shared by
// the RDMA CM unit tests. Waits are bounded.
#pragma once

#include <arpa/inet.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/scratch_dir.h"
#include "transport/cm/gsi_qp.h"
#include "transport/cm/ip_cm_header.h"
#include "transport/cm/rdma_cm.h"

namespace uroce::transport::test {

using namespace uroce::transport::cm;

inline constexpr uint16_t kPort = 7471;

class Events {
  public:
    void push(const CmIdEvent& e) {
        std::lock_guard lock(mutex_);
        events_.push_back(e);
        cv_.notify_all();
    }
    CmIdEvent next(CmIdEventType type) {
        std::unique_lock lock(mutex_);
        INFO("waiting for " << to_string(type));
        REQUIRE(cv_.wait_for(lock, kWait, [this] { return !events_.empty(); }));
        CmIdEvent e = events_.front();
        events_.pop_front();
        INFO("got " << to_string(e.type) << " status " << e.status);
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
    std::deque<CmIdEvent> events_;
};

// One process's view: both devices are listed (for address resolution), but its CM runs only
// on its own device's engine, so clients name their source address (as rping -I does; a
// destination that is a local device would otherwise be reached through that device).
class TestHost : public CmHost {
  public:
    TestHost(Pair& p, bool side_a, std::string ports)
        : p_(p), a_(side_a), ports_(std::move(ports)) {}
    std::vector<CmDeviceInfo> devices() const override {
        return {{"devA", p_.a.ip.v4(), 0xaaaa, 1024}, {"devB", p_.b.ip.v4(), 0xbbbb, 4096}};
    }
    Engine* cm_engine(const std::string& name, int& err) override {
        if (name == (a_ ? "devA" : "devB")) return (a_ ? p_.a : p_.b).engine.get();
        err = ENODEV;
        return nullptr;
    }
    std::string port_table_path(PortSpace ps) const override {
        return ports_ + "/ports-" + std::to_string(static_cast<int>(ps));
    }

  private:
    Pair& p_;
    bool a_;
    std::string ports_;
};

inline std::string ports_dir() {
    return scratch_dir("uroce-rdma-cm").string();
}

inline CmTimers fast_timers() {
    return CmTimers{
        .response_exponent = 14, .max_retries = 3, .timewait = std::chrono::milliseconds(100)};
}

inline std::vector<uint8_t> bytes(const char* s) {
    return {s, s + std::strlen(s)};
}

struct World {
    World() = default;
    explicit World(CmTimers t) : timers(t) {}

    CmTimers timers = fast_timers();
    Pair p;
    std::string dir = ports_dir();
    TestHost host_a{p, true, dir};
    TestHost host_b{p, false, dir};
    Events ea, eb;
    RdmaCm a{host_a, [this](const CmIdEvent& e) { ea.push(e); }, timers};
    RdmaCm b{host_b, [this](const CmIdEvent& e) { eb.push(e); }, timers};

    // A listener on B:kPort, and an A identifier whose route to it is resolved.
    uint32_t listener = 0;
    uint32_t client = 0;
    void listen_and_resolve() {
        listener = b.create_id(PortSpace::Tcp);
        REQUIRE(b.bind(listener, {p.b.ip.v4(), kPort}) == 0);
        REQUIRE(b.listen(listener, 8) == 0);
        client = a.create_id(PortSpace::Tcp);
        REQUIRE(a.resolve_addr(client, CmAddress{p.a.ip.v4(), 0}, {p.b.ip.v4(), kPort}) == 0);
        CHECK(ea.next(CmIdEventType::AddrResolved).id == client);
        REQUIRE(a.resolve_route(client) == 0);
        ea.next(CmIdEventType::RouteResolved);
    }

    // An A identifier whose route to B:kPort is resolved, nobody listening there; B runs a CM
    // (a listener on kPort + 1), so its agent answers a REQ itself.
    uint32_t resolve_to_unheard_port() {
        const uint32_t other = b.create_id(PortSpace::Tcp);
        REQUIRE(b.bind(other, {p.b.ip.v4(), kPort + 1}) == 0);
        REQUIRE(b.listen(other, 1) == 0);
        const uint32_t c = a.create_id(PortSpace::Tcp);
        REQUIRE(a.resolve_addr(c, CmAddress{p.a.ip.v4(), 0}, {p.b.ip.v4(), kPort}) == 0);
        ea.next(CmIdEventType::AddrResolved);
        REQUIRE(a.resolve_route(c) == 0);
        ea.next(CmIdEventType::RouteResolved);
        return c;
    }
};

// A peer with no CM of its own: QP1 of an engine (A's, whose RdmaCm must then stay off devA)
// sends the CM MADs a test builds and keeps every one that comes back.
class RawPeer {
  public:
    explicit RawPeer(Engine& engine)
        : engine_(engine),
          gsi_(std::make_shared<GsiQp>(engine, [this](uint32_t, std::span<const uint8_t> b) {
              CmMad mad;
              if (decode_cm_mad(b, mad) != CmDecodeError::None) return;
              std::lock_guard lock(mutex_);
              got_.push_back(std::move(mad));
              cv_.notify_all();
          })) {
        engine_.attach(gsi_);
    }
    ~RawPeer() { engine_.detach(kGsiQpn); }
    RawPeer(const RawPeer&) = delete;
    RawPeer& operator=(const RawPeer&) = delete;

    void send(uint32_t dst_ip, uint64_t tid, CmBody body) {
        CmMad mad;
        mad.header.transaction_id = tid;
        mad.body = std::move(body);
        gsi_->send_mad(dst_ip, encode_cm_mad(mad));
    }
    // The next MAD that came, within `wait`; nothing if none did.
    std::optional<CmMad> next(std::chrono::milliseconds wait) {
        std::unique_lock lock(mutex_);
        if (!cv_.wait_for(lock, wait, [this] { return !got_.empty(); })) return std::nullopt;
        CmMad mad = std::move(got_.front());
        got_.pop_front();
        return mad;
    }
    // The next MAD, which must be a `T`.
    template <typename T>
    T next() {
        const auto mad = next(std::chrono::duration_cast<std::chrono::milliseconds>(kWait));
        REQUIRE(mad);
        const T* body = std::get_if<T>(&mad->body);
        INFO("attribute " << static_cast<int>(attribute_of(mad->body)));
        REQUIRE(body != nullptr);
        return *body;
    }

  private:
    Engine& engine_;
    std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<CmMad> got_;
    std::shared_ptr<GsiQp> gsi_;
};

// An RDMA CM REQ, as the kernel's CM would send it, from src to dst (host order) for an RC
// connection in the TCP port space.
inline CmReq rdma_cm_req(uint32_t comm_id, CmAddress src, CmAddress dst) {
    CmReq req;
    req.local_comm_id = comm_id;
    req.service_id = service_id_of(PortSpace::Tcp, dst.port);
    req.local_qpn = 0x100 + (comm_id & 0xff);
    req.transport = CmTransport::Rc;
    req.starting_psn = 0x1234;
    req.remote_cm_response_timeout = 20;
    req.local_cm_response_timeout = 20;
    req.retry_count = 7;
    req.rnr_retry_count = 7;
    req.max_cm_retries = 15;
    req.path_mtu = 3;
    req.primary.local_lid = 0xffff;
    req.primary.remote_lid = 0xffff;
    req.primary.hop_limit = 64;
    IpCmHeader ip;
    ip.ip_version = 4;
    ip.source_port = src.port;
    ip.source = ip_cm_address_v4(htonl(src.ip));
    ip.destination = ip_cm_address_v4(htonl(dst.ip));
    write_ip_cm_header(ip, req.private_data);
    return req;
}

}  // namespace uroce::transport::test
