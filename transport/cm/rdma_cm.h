// RDMA CM identifiers (librdmacm's rdma_cm_id, the kernel's rdma_id_private): connecting by
// IP address and port over the IB CM.
//
// One RdmaCm serves one process, as the kernel's RDMA CM serves a host: identifiers bind
// addresses and ports from the host's port spaces (port_table.h), resolve a destination
// address to the local device that reaches it, and connect, listen, accept, reject and
// disconnect through the CmService of that device (cm_service.h). It speaks in identifiers
// and events; what carries them to the application (librdmacm's event channels) is its
// owner's business (provider/ucma_*).
//
//   active:  Idle -> AddrResolved -> RouteResolved -> Connecting -> (ConnectResponse)
//            -> Established -> Disconnected
//   passive: Idle -> Bound -> Listening; each REQ makes a new identifier in ConnectRequest
//            -> (accept) Accepting -> Established -> Disconnected
//
// Events go to the sink in the order they happen, under the RdmaCm's lock: the sink must
// not call back into the RdmaCm.
//
// Addresses are IPv4, host order. This header is part of the transport and knows nothing of
// libibverbs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "transport/cm/cm_agent.h"
#include "transport/cm/ip_cm_header.h"

namespace uroce::transport {
class Engine;
}

namespace uroce::transport::cm {

class CmService;
class PortClaim;

struct CmAddress {
    uint32_t ip = 0;  // host order; 0 = any
    uint16_t port = 0;
    bool operator==(const CmAddress&) const = default;
};

// A device this process can use, as its registry entry describes it.
struct CmDeviceInfo {
    std::string name;
    uint32_t ip = 0;         // host order
    uint64_t node_guid = 0;  // host-order value of the GUID the device reports
    uint32_t mtu = 1024;     // the port's active MTU in bytes
};

// What the RDMA CM needs from the process it runs in.
class CmHost {
  public:
    virtual ~CmHost() = default;
    virtual std::vector<CmDeviceInfo> devices() const = 0;
    // The engine the CM of device `name` runs on, created on first use; it must outlive the
    // RdmaCm. nullptr with an errno in `err`.
    virtual Engine* cm_engine(const std::string& name, int& err) = 0;
    // The port table file of a port space (port_table.h).
    virtual std::string port_table_path(PortSpace ps) const = 0;
};

// librdmacm's enum rdma_cm_event_type, by value.
enum class CmIdEventType : uint8_t {
    AddrResolved = 0,
    AddrError = 1,
    RouteResolved = 2,
    RouteError = 3,
    ConnectRequest = 4,
    ConnectResponse = 5,
    ConnectError = 6,
    Unreachable = 7,
    Rejected = 8,
    Established = 9,
    Disconnected = 10,
    DeviceRemoval = 11,
    MulticastJoin = 12,
    MulticastError = 13,
    AddrChange = 14,
    TimewaitExit = 15,
};
const char* to_string(CmIdEventType t);

// RDMA CM's connection parameters, from the receiver's point of view in events
// (responder_resources: how many RDMA READs this side may have to answer at once).
struct CmConnParam {
    uint32_t qp_num = 0;
    uint32_t qkey = 0;  // UD: the Q_Key of the peer's QP
    bool srq = false;
    uint8_t responder_resources = 0;
    uint8_t initiator_depth = 0;
    uint8_t flow_control = 0;
    uint8_t retry_count = 7;
    uint8_t rnr_retry_count = 7;
    std::vector<uint8_t> private_data;
};

struct CmIdEvent {
    CmIdEventType type = CmIdEventType::AddrError;
    // 0, a negative errno, (Rejected) the REJ reason, or (UD Unreachable) the SIDR status.
    int status = 0;
    uint32_t id = 0;         // the identifier it is for; ConnectRequest: the new one
    uint32_t listen_id = 0;  // ConnectRequest: the listener the REQ came to
    CmConnParam param;
    // UD identifiers: the peer's address vector (ConnectRequest: the requester's;
    // Established: the responder's).
    bool ud = false;
    Gid dgid{};
    uint32_t flow_label = 0;
    uint8_t hop_limit = 0;
};

// What an identifier knows of its addresses and path (rdma_cm's QUERY).
struct CmIdInfo {
    CmAddress src;
    CmAddress dst;
    std::optional<CmDeviceInfo> device;  // once bound to a device or resolved
    Gid sgid{};
    Gid dgid{};
    bool has_path = false;  // route resolved (or a connection request): the fields below
    uint8_t path_mtu = 3;   // IBV_MTU_* numbering
    uint32_t flow_label = 0;
    uint8_t hop_limit = 64;
    uint8_t packet_life_time = 18;
};

// QP states as libibverbs numbers them.
enum class CmQpState : uint8_t { Reset = 0, Init = 1, Rtr = 2, Rts = 3 };

// The attributes the CM gives for a QP state transition (rdma_init_qp_attr), with
// ibv_qp_attr_mask bit values in `mask`.
struct CmQpAttr {
    uint32_t mask = 0;
    CmQpState state = CmQpState::Init;
    uint32_t access_flags = 0;  // IBV_ACCESS_* bits
    uint8_t port_num = 1;
    uint16_t pkey_index = 0;
    uint8_t path_mtu = 3;
    uint32_t dest_qp_num = 0;
    uint32_t rq_psn = 0;
    uint32_t sq_psn = 0;
    uint8_t max_dest_rd_atomic = 0;
    uint8_t max_rd_atomic = 0;
    uint8_t min_rnr_timer = 0;
    uint8_t timeout = 0;
    uint8_t retry_cnt = 0;
    uint8_t rnr_retry = 0;
    uint32_t qkey = 0;
    Gid dgid{};
    uint32_t flow_label = 0;
    uint8_t hop_limit = 0;
    uint8_t traffic_class = 0;
};

// ibv_qp_attr_mask bits (libibverbs' values; the transport does not include verbs.h).
namespace qp_mask {
inline constexpr uint32_t kState = 1u << 0;
inline constexpr uint32_t kAccessFlags = 1u << 3;
inline constexpr uint32_t kPkeyIndex = 1u << 4;
inline constexpr uint32_t kPort = 1u << 5;
inline constexpr uint32_t kQkey = 1u << 6;
inline constexpr uint32_t kAv = 1u << 7;
inline constexpr uint32_t kPathMtu = 1u << 8;
inline constexpr uint32_t kTimeout = 1u << 9;
inline constexpr uint32_t kRetryCnt = 1u << 10;
inline constexpr uint32_t kRnrRetry = 1u << 11;
inline constexpr uint32_t kRqPsn = 1u << 12;
inline constexpr uint32_t kMaxQpRdAtomic = 1u << 13;
inline constexpr uint32_t kMinRnrTimer = 1u << 15;
inline constexpr uint32_t kSqPsn = 1u << 16;
inline constexpr uint32_t kMaxDestRdAtomic = 1u << 17;
inline constexpr uint32_t kDestQpn = 1u << 20;
}  // namespace qp_mask

// IBV_ACCESS_* bits the CM grants in INIT.
namespace access {
inline constexpr uint32_t kRemoteWrite = 1u << 1;
inline constexpr uint32_t kRemoteRead = 1u << 2;
inline constexpr uint32_t kRemoteAtomic = 1u << 3;
}  // namespace access

class RdmaCm {
  public:
    using EventSink = std::function<void(const CmIdEvent&)>;
    // Longest consumer private data per message (RDMA CM's limits over the IB CM).
    static constexpr size_t kConnectPrivateBytes = kReqPrivateBytes - kIpCmHeaderBytes;  // 56
    static constexpr size_t kAcceptPrivateBytes = kRepPrivateBytes;                      // 196
    static constexpr size_t kRejectPrivateBytes = kRejPrivateBytes;                      // 148
    static constexpr size_t kUdConnectPrivateBytes = kSidrReqPrivateBytes - kIpCmHeaderBytes;
    static constexpr size_t kUdAcceptPrivateBytes = kSidrRepPrivateBytes;

    RdmaCm(CmHost& host, EventSink sink, CmTimers timers = {});
    // Destroys every identifier (connected ones send their DREQ) and the CM services.
    ~RdmaCm();
    RdmaCm(const RdmaCm&) = delete;
    RdmaCm& operator=(const RdmaCm&) = delete;

    // The Q_Key of UD identifiers in the UDP port space (librdmacm's RDMA_UDP_QKEY).
    static constexpr uint32_t kUdpQkey = 0x01234567;
    // The largest listen backlog, and the one of a listen that names none: the kernel's
    // default net.rdma_ucm.max_backlog.
    static constexpr int kMaxBacklog = 1024;

    // A new identifier (never 0), for RC connections or, `ud`, UD QPs (resolved through SIDR
    // REQ/REP: the passive side's CONNECT_REQUEST, then the active side's ESTABLISHED with
    // the peer's QPN and Q_Key). IPoIB identifiers are created, but their connect/listen
    // fail with EOPNOTSUPP.
    uint32_t create_id(PortSpace ps, bool ud = false);
    // Forgets the identifier as rdma_destroy_id does (a connection is disconnected or
    // rejected, its port released); its further events are not reported. EINVAL if unknown.
    int destroy_id(uint32_t id);

    // Destroys every identifier as destroy_id does (connections disconnected or rejected on
    // the wire): what the kernel does when a process that still has identifiers exits.
    void destroy_all();

    // Every call below returns 0 or an errno, as the kernel's ucma commands do.
    // ip 0 binds every device; port 0 an ephemeral port. EADDRNOTAVAIL: no device has ip.
    int bind(uint32_t id, CmAddress addr);
    // Reports AddrResolved (or AddrError) through the sink. `src` binds first if given.
    int resolve_addr(uint32_t id, std::optional<CmAddress> src, CmAddress dst);
    int resolve_route(uint32_t id);
    int query(uint32_t id, CmIdInfo& out);
    // `backlog`: how many connection requests may wait for the application (not yet handed to
    // it, nor accepted or rejected); 0, negative or above kMaxBacklog means kMaxBacklog. As
    // in the kernel, a REQ beyond it is dropped unanswered and forgotten, so that the peer's
    // resend is taken once there is room; a SIDR REQ beyond it is answered "rejected". A
    // listening identifier's backlog changes with a second listen.
    int listen(uint32_t id, int backlog);
    // The application has been handed the ConnectRequest of identifier `id` (librdmacm read its
    // event): it no longer counts against its listener's backlog, as in the kernel's ucma.
    void request_reported(uint32_t id);
    // How many identifiers there are (the tests: a flood of requests must not grow it).
    size_t id_count();
    int connect(uint32_t id, const CmConnParam& param);
    // Passive: answers the REQ with a REP. Active (`param` nullptr, after ConnectResponse):
    // sends the RTU; the connection is established without an event (librdmacm reports it).
    int accept(uint32_t id, const CmConnParam* param);
    int reject(uint32_t id, std::span<const uint8_t> private_data);
    int disconnect(uint32_t id);
    int init_qp_attr(uint32_t id, CmQpState state, CmQpAttr& out);
    // The QP saw its first packet before the RTU (IBV_EVENT_COMM_EST).
    int establish(uint32_t id);

    CmAgentCounters counters();

  private:
    struct Id;
    enum class State : uint8_t;

    // Under mutex_.
    Id* find(uint32_t id);
    std::optional<CmDeviceInfo> device_by_ip(uint32_t ip) const;
    CmService* service(const std::string& device, int& err);
    int claim_port(Id& id, uint32_t ip, uint16_t port);
    int bind_locked(Id& id, CmAddress addr);
    void emit(CmIdEvent ev);
    void release(Id& id);
    // The agent no longer has the identifier's connection (a REJ removed it).
    void forget_connection(Id& id);
    void on_cm_event(const std::string& device, const CmEvent& ev);
    // A new passive identifier for a REQ or SIDR REQ that `listener` takes.
    Id* open_passive(const Id& listener, const CmDeviceInfo& dev, const IpCmHeader& ip,
                     const std::string& device, uint32_t comm_id);
    void on_req(const std::string& device, const CmEvent& ev);
    // The listener's backlog is taken up by requests waiting for the application.
    bool backlog_full(const Id& listener) const;
    void on_rep(Id& id, const CmEvent& ev);
    void on_sidr_rep(Id& id, const CmEvent& ev);
    int connect_ud(Id& id, const CmConnParam& param);
    int accept_ud(Id& id, const CmConnParam& param);

    // Agent events arrive on engine threads, and on the thread that holds mutex_ when an
    // agent call made under it raises one (notify_established's Established). They wait in
    // the inbox and are handled by whoever holds mutex_ next, before it lets go, so they are
    // handled in order and never lost. The holder notes itself (holder_): its own post() must
    // not try_lock a std::mutex its thread holds (undefined), and leaves the event to it.
    struct Inbound {
        std::string device;
        CmEvent event;
    };
    void post(Inbound in);
    void unlock_and_drain();  // mutex_ held by this thread; returns with it released
    void drain_locked();
    bool held_here() const {
        return holder_.load(std::memory_order_relaxed) == std::this_thread::get_id();
    }

    // mutex_, held by this thread and noted as such.
    class Lock {
      public:
        explicit Lock(RdmaCm& cm);             // waits for mutex_
        Lock(RdmaCm& cm, std::try_to_lock_t);  // takes mutex_ only if it is free
        // Lets go without draining if still held (the way out of ~RdmaCm and of exceptions).
        ~Lock();
        Lock(const Lock&) = delete;
        Lock& operator=(const Lock&) = delete;
        bool owns() const { return owns_; }
        // Handles the inbox and lets go.
        void unlock_and_drain();

      private:
        RdmaCm& cm_;
        bool owns_ = false;
    };

    CmHost& host_;
    const EventSink sink_;
    const CmTimers timers_;

    std::mutex mutex_;
    std::atomic<std::thread::id> holder_{};  // of mutex_; only the holder sets its own id
    std::map<uint32_t, std::unique_ptr<Id>> ids_;
    uint32_t next_id_ = 1;
    std::map<std::string, std::unique_ptr<CmService>> services_;  // by device name
    // (device, comm ID) -> identifier, for the agent's events.
    std::map<std::pair<std::string, uint32_t>, uint32_t> by_comm_id_;

    std::mutex inbox_mutex_;
    std::vector<Inbound> inbox_;
    std::atomic<bool> inbox_waiting_{false};
};

}  // namespace uroce::transport::cm
