// RDMA CM identifiers: addresses, ports and the event plumbing. The connection half
// (connect, accept, reject, disconnect and the IB CM's events) is in rdma_cm_connection.cpp.
#include "transport/cm/rdma_cm.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

#include "transport/cm/cm_service.h"
#include "transport/cm/port_table.h"
#include "transport/cm/rdma_cm_id.h"
#include "transport/local_addresses.h"

namespace uroce::transport::cm {

const char* to_string(CmIdEventType t) {
    switch (t) {
        case CmIdEventType::AddrResolved:
            return "ADDR_RESOLVED";
        case CmIdEventType::AddrError:
            return "ADDR_ERROR";
        case CmIdEventType::RouteResolved:
            return "ROUTE_RESOLVED";
        case CmIdEventType::RouteError:
            return "ROUTE_ERROR";
        case CmIdEventType::ConnectRequest:
            return "CONNECT_REQUEST";
        case CmIdEventType::ConnectResponse:
            return "CONNECT_RESPONSE";
        case CmIdEventType::ConnectError:
            return "CONNECT_ERROR";
        case CmIdEventType::Unreachable:
            return "UNREACHABLE";
        case CmIdEventType::Rejected:
            return "REJECTED";
        case CmIdEventType::Established:
            return "ESTABLISHED";
        case CmIdEventType::Disconnected:
            return "DISCONNECTED";
        case CmIdEventType::DeviceRemoval:
            return "DEVICE_REMOVAL";
        case CmIdEventType::MulticastJoin:
            return "MULTICAST_JOIN";
        case CmIdEventType::MulticastError:
            return "MULTICAST_ERROR";
        case CmIdEventType::AddrChange:
            return "ADDR_CHANGE";
        case CmIdEventType::TimewaitExit:
            return "TIMEWAIT_EXIT";
    }
    return "?";
}

Gid roce_gid_of(uint32_t ip) {
    Gid g{};
    g[10] = 0xff;
    g[11] = 0xff;
    const uint32_t be = htonl(ip);
    std::memcpy(g.data() + 12, &be, 4);
    return g;
}

uint8_t mtu_enum_of(uint32_t bytes) {
    switch (bytes) {
        case 256:
            return 1;
        case 512:
            return 2;
        case 2048:
            return 4;
        case 4096:
            return 5;
        default:
            return 3;  // 1024
    }
}

RdmaCm::RdmaCm(CmHost& host, EventSink sink, CmTimers timers)
    : host_(host), sink_(std::move(sink)), timers_(timers) {}

RdmaCm::~RdmaCm() {
    std::map<std::string, std::unique_ptr<CmService>> services;
    {
        Lock lock(*this);
        for (auto& [handle, id] : ids_) {
            id->silent = true;
            release(*id);
        }
        ids_.clear();
        by_comm_id_.clear();
        services.swap(services_);
    }
    // Without the lock: a service's destructor waits for a MAD being handled, whose event
    // may be trying the lock.
    services.clear();
}

RdmaCm::Id* RdmaCm::find(uint32_t id) {
    const auto it = ids_.find(id);
    return it == ids_.end() ? nullptr : it->second.get();
}

std::optional<CmDeviceInfo> RdmaCm::device_by_ip(uint32_t ip) const {
    for (auto& d : host_.devices())
        if (d.ip == ip) return d;
    return std::nullopt;
}

CmService* RdmaCm::service(const std::string& device, int& err) {
    if (auto it = services_.find(device); it != services_.end()) return it->second.get();
    std::optional<CmDeviceInfo> info;
    for (auto& d : host_.devices())
        if (d.name == device) info = d;
    if (!info) {
        err = ENODEV;
        return nullptr;
    }
    Engine* engine = host_.cm_engine(device, err);
    if (!engine) return nullptr;
    auto svc = std::make_unique<CmService>(*engine, info->node_guid, timers_,
                                           [this, device](const CmEvent& ev) {
                                               post(Inbound{device, ev});
                                           });
    CmService* raw = svc.get();
    services_.emplace(device, std::move(svc));
    return raw;
}

uint32_t RdmaCm::create_id(PortSpace ps, bool ud) {
    Lock lock(*this);
    while (next_id_ == 0 || ids_.count(next_id_)) ++next_id_;
    const uint32_t handle = next_id_++;
    auto id = std::make_unique<Id>();
    id->handle = handle;
    id->ps = ps;
    id->ud = ud;
    id->qkey = ud && ps == PortSpace::Udp ? kUdpQkey : 0;
    ids_.emplace(handle, std::move(id));
    lock.unlock_and_drain();
    return handle;
}

void RdmaCm::release(Id& id) {
    if (id.comm_id != 0) {
        if (auto it = services_.find(id.comm_device); it != services_.end())
            it->second->agent().destroy(id.comm_id);
        by_comm_id_.erase({id.comm_device, id.comm_id});
        id.comm_id = 0;
    }
    for (const std::string& dev : id.listening_on)
        if (auto it = services_.find(dev); it != services_.end())
            it->second->stop_listening(service_id_of(id.ps, id.src.port));
    id.listening_on.clear();
    id.listening.reset();
    id.port.reset();
}

int RdmaCm::destroy_id(uint32_t handle) {
    Lock lock(*this);
    Id* id = find(handle);
    int rc = EINVAL;
    if (id) {
        id->silent = true;
        release(*id);
        // Connection requests that were never handed over die with their listener.
        for (auto& [h, other] : ids_)
            if (other->listen_parent == handle && other->state == State::ConnectRequest)
                other->listen_parent = 0;
        ids_.erase(handle);
        rc = 0;
    }
    lock.unlock_and_drain();
    return rc;
}

void RdmaCm::destroy_all() {
    // Called at exit, perhaps from a signal handler that interrupted this very thread inside
    // a call holding the lock (then it gives up at once: a try_lock would be undefined), or
    // while another thread holds it: waits a little for the lock, and gives up rather than
    // hang.
    if (held_here()) return;
    std::optional<Lock> lock;
    for (int i = 0; !lock.emplace(*this, std::try_to_lock).owns(); ++i) {
        if (i == 200) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    for (auto& [handle, id] : ids_) {
        id->silent = true;
        release(*id);
    }
    ids_.clear();
    by_comm_id_.clear();
    lock->unlock_and_drain();
}

int RdmaCm::claim_port(Id& id, uint32_t ip, uint16_t port) {
    PortTable table(host_.port_table_path(id.ps));
    int err = 0;
    id.port = port != 0 ? table.claim(ip, port, err) : table.claim_ephemeral(ip, err);
    if (!id.port) return err != 0 ? err : EADDRINUSE;
    id.src.port = id.port->port();
    return 0;
}

int RdmaCm::bind_locked(Id& id, CmAddress addr) {
    if (id.state != State::Idle) return EINVAL;
    std::optional<CmDeviceInfo> dev;
    if (addr.ip != 0) {
        dev = device_by_ip(addr.ip);
        if (!dev) return EADDRNOTAVAIL;
    }
    if (const int rc = claim_port(id, addr.ip, addr.port); rc != 0) return rc;
    id.src.ip = addr.ip;
    id.device = dev;
    id.state = State::Bound;
    return 0;
}

int RdmaCm::bind(uint32_t handle, CmAddress addr) {
    Lock lock(*this);
    Id* id = find(handle);
    const int rc = id ? bind_locked(*id, addr) : EINVAL;
    lock.unlock_and_drain();
    return rc;
}

int RdmaCm::resolve_addr(uint32_t handle, std::optional<CmAddress> src, CmAddress dst) {
    Lock lock(*this);
    Id* id = find(handle);
    int rc = 0;
    if (!id) {
        rc = EINVAL;
    } else if (id->state != State::Idle && id->state != State::Bound &&
               id->state != State::AddrResolved) {
        rc = EINVAL;
    } else if (dst.ip == 0) {
        rc = EADDRNOTAVAIL;
    } else {
        if (id->state == State::Idle) rc = bind_locked(*id, src.value_or(CmAddress{}));
        if (rc == 0) {
            // Which device reaches dst: the bound one; else, for a dst of this network
            // namespace (loopback), the device that has dst; else the device whose address
            // the namespace's routing sends from to dst (local_addresses.h: a device registered
            // with dst may be another namespace's); else one that has dst; else the only
            // device there is.
            std::optional<CmDeviceInfo> dev = id->device;
            if (!dev && is_local_address(IpAddress::v4(dst.ip))) dev = device_by_ip(dst.ip);
            if (!dev)
                if (const auto from = route_source(IpAddress::v4(dst.ip)); from && from->is_v4())
                    dev = device_by_ip(from->v4());
            if (!dev) dev = device_by_ip(dst.ip);
            if (!dev) {
                const auto all = host_.devices();
                if (all.size() == 1) dev = all.front();
            }
            id->dst = dst;
            CmIdEvent ev;
            ev.id = handle;
            if (dev) {
                id->device = dev;
                id->src.ip = dev->ip;
                id->state = State::AddrResolved;
                ev.type = CmIdEventType::AddrResolved;
            } else {
                ev.type = CmIdEventType::AddrError;
                ev.status = -EHOSTUNREACH;
            }
            emit(std::move(ev));
        }
    }
    lock.unlock_and_drain();
    return rc;
}

int RdmaCm::resolve_route(uint32_t handle) {
    Lock lock(*this);
    Id* id = find(handle);
    int rc = 0;
    if (!id || (id->state != State::AddrResolved && id->state != State::RouteResolved)) {
        rc = EINVAL;
    } else {
        // RoCE needs no path query: the path follows from the two addresses, as the
        // kernel builds it for RoCE (permissive LIDs, GIDs from the IPs, flow label from
        // the ports).
        // The path MTU is the smaller of the two ports' when the destination is a device of
        // this host (IBA's REP carries none: the passive side follows the REQ's, so the
        // active side must not offer more than the peer takes); else this port's, as the
        // kernel takes its netdev's.
        uint32_t mtu = id->device->mtu;
        if (const auto peer = device_by_ip(id->dst.ip)) mtu = std::min(mtu, peer->mtu);
        id->path_mtu = mtu_enum_of(mtu);
        id->state = State::RouteResolved;
        CmIdEvent ev;
        ev.type = CmIdEventType::RouteResolved;
        ev.id = handle;
        emit(std::move(ev));
    }
    lock.unlock_and_drain();
    return rc;
}

int RdmaCm::query(uint32_t handle, CmIdInfo& out) {
    Lock lock(*this);
    const Id* id = find(handle);
    if (!id) {
        lock.unlock_and_drain();
        return EINVAL;
    }
    out = CmIdInfo{};
    out.src = id->src;
    out.dst = id->dst;
    out.device = id->device;
    if (id->src.ip != 0) out.sgid = roce_gid_of(id->src.ip);
    if (id->dst.ip != 0) out.dgid = roce_gid_of(id->dst.ip);
    out.has_path = id->state != State::Idle && id->state != State::Bound &&
                   id->state != State::AddrResolved && id->state != State::Listening;
    out.path_mtu = id->path_mtu;
    out.flow_label = roce_flow_label(id->active ? id->src.port : id->dst.port,
                                     id->active ? id->dst.port : id->src.port);
    out.hop_limit = kHopLimit;
    out.packet_life_time = kPacketLifeTime;
    lock.unlock_and_drain();
    return 0;
}

int RdmaCm::listen(uint32_t handle, int backlog) {
    Lock lock(*this);
    Id* id = find(handle);
    int rc = 0;
    if (backlog <= 0 || backlog > kMaxBacklog) backlog = kMaxBacklog;
    if (!id) {
        rc = EINVAL;
    } else if (id->ps == PortSpace::Ipoib) {
        rc = EOPNOTSUPP;
    } else if (id->state == State::Listening) {
        id->backlog = backlog;  // only the backlog changes
    } else {
        if (id->state == State::Idle) rc = bind_locked(*id, CmAddress{});
        if (rc == 0 && id->state != State::Bound) rc = EINVAL;
        if (rc == 0) {
            std::vector<std::string> devices;
            if (id->device) {
                devices.push_back(id->device->name);
            } else {
                for (auto& d : host_.devices()) devices.push_back(d.name);
            }
            const uint64_t sid = service_id_of(id->ps, id->src.port);
            for (const std::string& dev : devices) {
                int err = 0;
                CmService* svc = service(dev, err);
                if (!svc) {
                    // A listener on every device does without one that cannot run a CM.
                    if (id->device) rc = err;
                    continue;
                }
                if (const int e = svc->listen(sid, handle); e != 0) {
                    rc = e;
                    break;
                }
                id->listening_on.push_back(dev);
            }
            if (rc == 0 && id->listening_on.empty()) rc = ENODEV;
            if (rc != 0) {
                for (const std::string& dev : id->listening_on) services_[dev]->stop_listening(sid);
                id->listening_on.clear();
            } else {
                id->state = State::Listening;
                id->backlog = backlog;
                int err = 0;
                id->listening = PortTable(host_.port_table_path(id->ps) + ".listening")
                                    .claim(id->src.ip, id->src.port, err);
            }
        }
    }
    lock.unlock_and_drain();
    return rc;
}

void RdmaCm::request_reported(uint32_t handle) {
    Lock lock(*this);
    if (Id* id = find(handle)) id->reported = true;
    lock.unlock_and_drain();
}

size_t RdmaCm::id_count() {
    Lock lock(*this);
    const size_t n = ids_.size();
    lock.unlock_and_drain();
    return n;
}

CmAgentCounters RdmaCm::counters() {
    Lock lock(*this);
    CmAgentCounters total;
    for (auto& [name, svc] : services_) {
        const CmAgentCounters c = svc->agent().counters();
        total.rx_mads += c.rx_mads;
        total.rx_malformed += c.rx_malformed;
        total.rx_unmatched += c.rx_unmatched;
        total.rx_unexpected += c.rx_unexpected;
        total.rx_duplicates += c.rx_duplicates;
        total.rx_held += c.rx_held;
        total.rx_left_to_other += c.rx_left_to_other;
        total.tx_mads += c.tx_mads;
        total.tx_resends += c.tx_resends;
        total.rej_sent += c.rej_sent;
    }
    lock.unlock_and_drain();
    return total;
}

// ---- events -------------------------------------------------------------------------------

void RdmaCm::emit(CmIdEvent ev) {
    const Id* id = find(ev.id);
    if (!id || id->silent) return;
    sink_(ev);
}

void RdmaCm::post(Inbound in) {
    {
        std::lock_guard lock(inbox_mutex_);
        inbox_.push_back(std::move(in));
        inbox_waiting_.store(true, std::memory_order_release);
    }
    // Raised by an agent call this thread makes under the lock: its caller drains it before
    // it lets go.
    if (held_here()) return;
    Lock lock(*this, std::try_to_lock);
    if (lock.owns()) lock.unlock_and_drain();
}

void RdmaCm::drain_locked() {
    for (;;) {
        std::vector<Inbound> batch;
        {
            std::lock_guard lock(inbox_mutex_);
            batch.swap(inbox_);
            inbox_waiting_.store(false, std::memory_order_release);
        }
        if (batch.empty()) return;
        for (const Inbound& in : batch) on_cm_event(in.device, in.event);
    }
}

void RdmaCm::unlock_and_drain() {
    // Called with mutex_ held; returns with it released. An event posted while this thread
    // held the lock is handled here; one posted just after is handled by its poster, whose
    // try_lock then succeeds, or here again.
    for (;;) {
        drain_locked();
        holder_.store(std::thread::id{}, std::memory_order_relaxed);
        mutex_.unlock();
        if (!inbox_waiting_.load(std::memory_order_acquire)) return;
        if (!mutex_.try_lock()) return;
        holder_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    }
}

RdmaCm::Lock::Lock(RdmaCm& cm) : cm_(cm) {
    cm_.mutex_.lock();
    cm_.holder_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    owns_ = true;
}

RdmaCm::Lock::Lock(RdmaCm& cm, std::try_to_lock_t) : cm_(cm) {
    if (!cm_.mutex_.try_lock()) return;  // never held by this thread: post() checks first
    cm_.holder_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    owns_ = true;
}

RdmaCm::Lock::~Lock() {
    if (!owns_) return;
    cm_.holder_.store(std::thread::id{}, std::memory_order_relaxed);
    cm_.mutex_.unlock();
}

void RdmaCm::Lock::unlock_and_drain() {
    owns_ = false;
    cm_.unlock_and_drain();
}

}  // namespace uroce::transport::cm
