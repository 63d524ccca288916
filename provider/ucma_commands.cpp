// The ucma commands librdmacm writes to its rdma_cm fd, answered by the process's RDMA CM
// (transport/cm/rdma_cm.h), and the events it reads back. The layouts are the kernel's
// (rdma/rdma_user_cm.h); each command is checked as the kernel checks it (the header's sizes
// fit the write, the identifier belongs to the channel written to).
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/ib.h>
#include <infiniband/sa.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/rdma_user_cm.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "provider/cm_host.h"
#include "provider/ucma.h"
#include "provider/ucma_channel.h"
#include "transport/cm/rdma_cm.h"

namespace uroce::provider::ucma {
namespace {

namespace tcm = transport::cm;

struct IdEntry {
    std::shared_ptr<Channel> channel;
    uint64_t uid = 0;
    bool af_ib = false;  // bound with an AF_IB address (librdmacm's probe for AF_IB support)
    uint64_t sid = 0;    // that address's service ID, network order
};

struct FileId {
    dev_t dev = 0;
    ino_t ino = 0;
    bool operator==(const FileId&) const = default;
};

struct ChannelEntry {
    std::shared_ptr<Channel> channel;
    FileId file;
};

class Ucma {
  public:
    std::mutex mutex;  // channels and ids; taken inside the RDMA CM's lock (its event sink)
    std::unordered_map<int, ChannelEntry> channels;
    std::atomic<size_t> channel_count{0};
    std::unordered_map<uint32_t, IdEntry> ids;
    // Multicast joins (rdma_join_multicast), by the handle LEAVE_MCAST names; their handles
    // have the top bit set, so that a channel counts their events apart from identifiers'.
    struct McEntry {
        uint32_t id = 0;
        std::shared_ptr<Channel> channel;
    };
    std::unordered_map<uint32_t, McEntry> mcs;
    uint32_t next_mc = 0;

    // Created on the first command that needs it, never destroyed (its engines run until
    // the process exits).
    tcm::RdmaCm* cm() {
        std::call_once(cm_once_, [this] {
            cm_ = new tcm::RdmaCm(cm_host(), [this](const tcm::CmIdEvent& ev) { deliver(ev); });
            owner_ = ::getpid();
            std::atexit(&Ucma::at_exit);
        });
        return cm_;
    }

  private:
    // A process that exits with identifiers left: the kernel's RDMA CM would destroy them
    // when the file closes, so that peers hear DREQ/DREP/REJ at once instead of timing
    // out. Not in a child of fork(), whose copies are the parent's.
    static void at_exit();

    void deliver(const tcm::CmIdEvent& ev);

    std::once_flag cm_once_;
    tcm::RdmaCm* cm_ = nullptr;
    pid_t owner_ = 0;
};

Ucma* ucma() noexcept {
    static Ucma* const instance = new (std::nothrow) Ucma();
    return instance;
}

void Ucma::at_exit() {
    Ucma* u = ucma();
    if (u && u->cm_ && u->owner_ == ::getpid()) {
        try {
            u->cm_->destroy_all();
        } catch (...) {
        }
    }
}

bool file_id(int fd, FileId* out) noexcept {
    const int saved = errno;
    struct stat st {};
    const bool ok = ::fstat(fd, &st) == 0;
    errno = saved;
    if (ok) *out = FileId{st.st_dev, st.st_ino};
    return ok;
}

void fill_conn(rdma_ucm_conn_param& out, const tcm::CmConnParam& in) {
    out.qp_num = in.qp_num;
    out.srq = in.srq;
    out.responder_resources = in.responder_resources;
    out.initiator_depth = in.initiator_depth;
    out.flow_control = in.flow_control;
    out.retry_count = in.retry_count;
    out.rnr_retry_count = in.rnr_retry_count;
    const size_t n = std::min(in.private_data.size(), sizeof out.private_data);
    if (n != 0) std::memcpy(out.private_data, in.private_data.data(), n);  // data() may be null
    out.private_data_len = static_cast<uint8_t>(n);
    out.valid = 1;
}

// A UD identifier's event: the peer's QP, Q_Key and address vector (RoCE: a GRH to its GID).
void fill_ud(rdma_ucm_ud_param& out, const tcm::CmIdEvent& ev) {
    out.qp_num = ev.param.qp_num;
    out.qkey = ev.param.qkey;
    std::memcpy(out.ah_attr.grh.dgid, ev.dgid.data(), 16);
    out.ah_attr.grh.flow_label = ev.flow_label;
    out.ah_attr.grh.hop_limit = ev.hop_limit;
    out.ah_attr.grh.sgid_index = 0;
    out.ah_attr.is_global = 1;
    out.ah_attr.port_num = 1;
    const size_t n = std::min(ev.param.private_data.size(), sizeof out.private_data);
    if (n != 0) std::memcpy(out.private_data, ev.param.private_data.data(), n);
    out.private_data_len = static_cast<uint8_t>(n);
}

void Ucma::deliver(const tcm::CmIdEvent& ev) {
    std::lock_guard lock(mutex);
    uint32_t counted_for = ev.id;
    auto it = ids.find(ev.id);
    if (ev.type == tcm::CmIdEventType::ConnectRequest) {
        // The new identifier lives on its listener's channel, under the listener's uid until
        // rdma_accept names its own; the event counts as the listener's.
        const auto listener = ids.find(ev.listen_id);
        if (listener == ids.end()) return;
        try {
            it =
                ids.insert_or_assign(ev.id, IdEntry{listener->second.channel, listener->second.uid})
                    .first;
        } catch (...) {
            return;
        }
        counted_for = ev.listen_id;
    }
    if (it == ids.end()) return;
    rdma_ucm_event_resp resp{};
    resp.uid = it->second.uid;
    resp.id = ev.id;
    resp.event = static_cast<uint32_t>(ev.type);
    resp.status = static_cast<uint32_t>(ev.status);
    if (ev.ud)
        fill_ud(resp.param.ud, ev);
    else
        fill_conn(resp.param.conn, ev.param);
    it->second.channel->push(resp, counted_for);
}

// ---- addresses ------------------------------------------------------------------------------

// An address librdmacm passes: AF_INET, AF_INET6 (the unspecified address, or IPv4-mapped),
// or AF_IB (service ID only). EAFNOSUPPORT for what uroce does not route (IPv6 proper).
int parse_address(const void* data, size_t size, tcm::CmAddress& out, IdEntry* ib) {
    sa_family_t family = 0;
    if (size < sizeof family) return EINVAL;
    std::memcpy(&family, data, sizeof family);
    if (family == AF_INET && size >= sizeof(sockaddr_in)) {
        sockaddr_in sin;
        std::memcpy(&sin, data, sizeof sin);
        out = {ntohl(sin.sin_addr.s_addr), ntohs(sin.sin_port)};
        return 0;
    }
    if (family == AF_INET6 && size >= sizeof(sockaddr_in6)) {
        sockaddr_in6 sin6;
        std::memcpy(&sin6, data, sizeof sin6);
        out.port = ntohs(sin6.sin6_port);
        if (IN6_IS_ADDR_UNSPECIFIED(&sin6.sin6_addr)) {
            out.ip = 0;
            return 0;
        }
        if (IN6_IS_ADDR_V4MAPPED(&sin6.sin6_addr)) {
            uint32_t be = 0;
            std::memcpy(&be, sin6.sin6_addr.s6_addr + 12, 4);
            out.ip = ntohl(be);
            return 0;
        }
        return EAFNOSUPPORT;
    }
    if (family == AF_IB && size >= sizeof(sockaddr_ib) && ib != nullptr) {
        sockaddr_ib sib;
        std::memcpy(&sib, data, sizeof sib);
        out = {0, static_cast<uint16_t>(be64toh(sib.sib_sid) & 0xffff)};
        ib->af_ib = true;
        ib->sid = sib.sib_sid;
        return 0;
    }
    return family == AF_INET || family == AF_INET6 || family == AF_IB ? EINVAL : EAFNOSUPPORT;
}

// Writes an IPv4 address as a sockaddr_in (the rest of `out` zero); returns its size.
uint16_t put_address(const tcm::CmAddress& a, void* out, size_t room) {
    std::memset(out, 0, room);
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(a.port);
    sin.sin_addr.s_addr = htonl(a.ip);
    std::memcpy(out, &sin, std::min(room, sizeof sin));
    return sizeof sin;
}

uint16_t put_ib_address(const IdEntry& e, const tcm::Gid& gid, void* out, size_t room) {
    std::memset(out, 0, room);
    sockaddr_ib sib{};
    sib.sib_family = AF_IB;
    sib.sib_pkey = htons(0xffff);
    std::memcpy(&sib.sib_addr, gid.data(), 16);
    sib.sib_sid = e.sid;
    sib.sib_sid_mask = e.af_ib ? htobe64(~0ull) : 0;
    std::memcpy(out, &sib, std::min(room, sizeof sib));
    return sizeof sib;
}

void fill_path_rec(ib_user_path_rec& p, const tcm::CmIdInfo& info) {
    std::memcpy(p.dgid, info.dgid.data(), 16);
    std::memcpy(p.sgid, info.sgid.data(), 16);
    p.dlid = htons(0xffff);  // permissive: RoCE has no LIDs
    p.slid = htons(0xffff);
    p.flow_label = htonl(info.flow_label);
    p.reversible = 1;
    p.mtu = info.path_mtu;
    p.pkey = htons(0xffff);
    p.hop_limit = info.hop_limit;
    p.numb_path = 1;
    p.mtu_selector = 2;  // exactly
    p.rate_selector = 2;
    p.rate = 3;  // 10 Gb/s, as rxe reports
    p.packet_life_time_selector = 2;
    p.packet_life_time = info.packet_life_time;
}

void fill_path_record(ibv_path_record& p, const tcm::CmIdInfo& info) {
    std::memset(&p, 0, sizeof p);
    std::memcpy(p.dgid.raw, info.dgid.data(), 16);
    std::memcpy(p.sgid.raw, info.sgid.data(), 16);
    p.dlid = htons(0xffff);
    p.slid = htons(0xffff);
    p.flowlabel_hoplimit = htonl((info.flow_label << 8) | info.hop_limit);
    p.reversible_numpath = 0x80 | 1;
    p.pkey = htons(0xffff);
    p.mtu = static_cast<uint8_t>((2u << 6) | info.path_mtu);
    p.rate = static_cast<uint8_t>((2u << 6) | 3u);
    p.packetlifetime = static_cast<uint8_t>((2u << 6) | info.packet_life_time);
}

// ---- commands -------------------------------------------------------------------------------

// A command's body and where its response goes, checked against the header's sizes.
struct Command {
    const uint8_t* body;
    size_t in;
    size_t out;
};

template <typename T>
bool take(const Command& c, T& cmd) {
    if (c.in < sizeof(T)) return false;
    std::memcpy(&cmd, c.body, sizeof(T));
    return true;
}

template <typename R>
int respond(uint64_t where, size_t room, const R& resp, size_t size = sizeof(R)) {
    if (where == 0) return EFAULT;
    if (room < size) return ENOSPC;
    std::memcpy(reinterpret_cast<void*>(static_cast<uintptr_t>(where)), &resp, size);
    return 0;
}

class Handler {
  public:
    Handler(Ucma& u, std::shared_ptr<Channel> channel) : u_(u), channel_(std::move(channel)) {}

    int run(uint32_t op, const Command& c) {
        switch (op) {
            case RDMA_USER_CM_CMD_CREATE_ID:
                return create_id(c);
            case RDMA_USER_CM_CMD_DESTROY_ID:
                return destroy_id(c);
            case RDMA_USER_CM_CMD_BIND_IP:
                return bind_ip(c);
            case RDMA_USER_CM_CMD_BIND:
                return bind(c);
            case RDMA_USER_CM_CMD_RESOLVE_IP:
                return resolve_ip(c);
            case RDMA_USER_CM_CMD_RESOLVE_ADDR:
                return resolve_addr(c);
            case RDMA_USER_CM_CMD_RESOLVE_ROUTE:
                return resolve_route(c);
            case RDMA_USER_CM_CMD_QUERY_ROUTE:
                return query_route(c);
            case RDMA_USER_CM_CMD_QUERY:
                return query(c);
            case RDMA_USER_CM_CMD_CONNECT:
                return connect(c);
            case RDMA_USER_CM_CMD_LISTEN:
                return listen(c);
            case RDMA_USER_CM_CMD_ACCEPT:
                return accept(c);
            case RDMA_USER_CM_CMD_REJECT:
                return reject(c);
            case RDMA_USER_CM_CMD_DISCONNECT:
                return disconnect(c);
            case RDMA_USER_CM_CMD_INIT_QP_ATTR:
                return init_qp_attr(c);
            case RDMA_USER_CM_CMD_GET_EVENT:
                return get_event(c);
            case RDMA_USER_CM_CMD_SET_OPTION:
                return set_option(c);
            case RDMA_USER_CM_CMD_NOTIFY:
                return notify(c);
            case RDMA_USER_CM_CMD_MIGRATE_ID:
                return migrate_id(c);
            case RDMA_USER_CM_CMD_JOIN_IP_MCAST:
                return join_ip_mcast(c);
            case RDMA_USER_CM_CMD_JOIN_MCAST:
                return join_mcast(c);
            case RDMA_USER_CM_CMD_LEAVE_MCAST:
                return leave_mcast(c);
            // GET_OPTION (no librdmacm call issues it), and anything newer.
            default:
                return ENOSYS;
        }
    }

  private:
    // The identifier, if it is on this channel (EINVAL otherwise, as the kernel).
    bool mine(uint32_t id, IdEntry* copy = nullptr) {
        std::lock_guard lock(u_.mutex);
        const auto it = u_.ids.find(id);
        if (it == u_.ids.end() || it->second.channel != channel_) return false;
        if (copy) *copy = it->second;
        return true;
    }

    int create_id(const Command& c) {
        rdma_ucm_create_id cmd;
        if (!take(c, cmd)) return EINVAL;
        const auto ps = static_cast<tcm::PortSpace>(cmd.ps);
        if (ps != tcm::PortSpace::Tcp && ps != tcm::PortSpace::Udp && ps != tcm::PortSpace::Ib &&
            ps != tcm::PortSpace::Ipoib)
            return EINVAL;
        rdma_ucm_create_id_resp resp{};
        if (cmd.response == 0) return EFAULT;
        if (c.out < sizeof resp) return ENOSPC;
        resp.id = u_.cm()->create_id(ps, cmd.qp_type == IBV_QPT_UD);
        {
            std::lock_guard lock(u_.mutex);
            u_.ids[resp.id] = IdEntry{channel_, cmd.uid};
        }
        return respond(cmd.response, c.out, resp);
    }

    int destroy(uint32_t id, uint32_t* reported) {
        std::vector<uint32_t> joins;
        {
            std::lock_guard lock(u_.mutex);
            u_.ids.erase(id);
            // The identifier's multicast joins go with it, as in the kernel.
            for (auto it = u_.mcs.begin(); it != u_.mcs.end();) {
                if (it->second.id == id) {
                    joins.push_back(it->first);
                    it = u_.mcs.erase(it);
                } else {
                    ++it;
                }
            }
        }
        for (uint32_t mc : joins) channel_->purge(mc);
        u_.cm()->destroy_id(id);
        Channel::Purged p = channel_->purge(id);
        // Connection requests the application never took die with their listener.
        for (uint32_t orphan : p.orphan_requests) {
            {
                std::lock_guard lock(u_.mutex);
                u_.ids.erase(orphan);
            }
            u_.cm()->destroy_id(orphan);
            channel_->purge(orphan);
        }
        if (reported) *reported = p.reported;
        return 0;
    }

    int destroy_id(const Command& c) {
        rdma_ucm_destroy_id cmd;
        if (!take(c, cmd)) return EINVAL;
        if (!mine(cmd.id)) return EINVAL;
        if (cmd.response == 0) return EFAULT;
        if (c.out < sizeof(rdma_ucm_destroy_id_resp)) return ENOSPC;
        rdma_ucm_destroy_id_resp resp{};
        destroy(cmd.id, &resp.events_reported);
        return respond(cmd.response, c.out, resp);
    }

    int do_bind(uint32_t id, const void* addr, size_t size) {
        IdEntry e;
        if (!mine(id, &e)) return EINVAL;
        tcm::CmAddress a;
        if (const int rc = parse_address(addr, size, a, &e); rc != 0) return rc;
        if (const int rc = u_.cm()->bind(id, a); rc != 0) return rc;
        if (e.af_ib) {
            std::lock_guard lock(u_.mutex);
            if (auto it = u_.ids.find(id); it != u_.ids.end()) {
                it->second.af_ib = true;
                it->second.sid = e.sid;
            }
        }
        return 0;
    }

    int bind_ip(const Command& c) {
        rdma_ucm_bind_ip cmd;
        if (!take(c, cmd)) return EINVAL;
        return do_bind(cmd.id, &cmd.addr, sizeof cmd.addr);
    }

    int bind(const Command& c) {
        rdma_ucm_bind cmd;
        if (!take(c, cmd)) return EINVAL;
        if (cmd.addr_size > sizeof cmd.addr) return EINVAL;
        return do_bind(cmd.id, &cmd.addr, cmd.addr_size);
    }

    int do_resolve(uint32_t id, const void* src, size_t src_size, const void* dst,
                   size_t dst_size) {
        if (!mine(id)) return EINVAL;
        tcm::CmAddress d;
        if (const int rc = parse_address(dst, dst_size, d, nullptr); rc != 0) return rc;
        std::optional<tcm::CmAddress> s;
        sa_family_t family = 0;
        if (src_size >= sizeof family) std::memcpy(&family, src, sizeof family);
        if (family != 0) {
            tcm::CmAddress a;
            if (const int rc = parse_address(src, src_size, a, nullptr); rc != 0) return rc;
            s = a;
        }
        return u_.cm()->resolve_addr(id, s, d);
    }

    int resolve_ip(const Command& c) {
        rdma_ucm_resolve_ip cmd;
        if (!take(c, cmd)) return EINVAL;
        return do_resolve(cmd.id, &cmd.src_addr, sizeof cmd.src_addr, &cmd.dst_addr,
                          sizeof cmd.dst_addr);
    }

    int resolve_addr(const Command& c) {
        rdma_ucm_resolve_addr cmd;
        if (!take(c, cmd)) return EINVAL;
        if (cmd.src_size > sizeof cmd.src_addr || cmd.dst_size > sizeof cmd.dst_addr) return EINVAL;
        return do_resolve(cmd.id, &cmd.src_addr, cmd.src_size, &cmd.dst_addr, cmd.dst_size);
    }

    int resolve_route(const Command& c) {
        rdma_ucm_resolve_route cmd;
        if (!take(c, cmd)) return EINVAL;
        if (!mine(cmd.id)) return EINVAL;
        return u_.cm()->resolve_route(cmd.id);
    }

    int query_route(const Command& c) {
        rdma_ucm_query cmd;
        if (!take(c, cmd)) return EINVAL;
        if (!mine(cmd.id)) return EINVAL;
        tcm::CmIdInfo info;
        if (const int rc = u_.cm()->query(cmd.id, info); rc != 0) return rc;
        rdma_ucm_query_route_resp resp{};
        resp.ibdev_index = UINT32_MAX;
        if (info.device) {
            resp.node_guid = htobe64(info.device->node_guid);
            resp.port_num = 1;
        }
        put_address(info.src, &resp.src_addr, sizeof resp.src_addr);
        put_address(info.dst, &resp.dst_addr, sizeof resp.dst_addr);
        if (info.has_path) {
            fill_path_rec(resp.ib_route[0], info);
            resp.num_paths = 1;
        } else {
            std::memcpy(resp.ib_route[0].sgid, info.sgid.data(), 16);
            std::memcpy(resp.ib_route[0].dgid, info.dgid.data(), 16);
            resp.ib_route[0].pkey = htons(0xffff);
        }
        return respond(cmd.response, c.out, resp);
    }

    int query(const Command& c) {
        rdma_ucm_query cmd;
        if (!take(c, cmd)) return EINVAL;
        IdEntry e;
        if (!mine(cmd.id, &e)) return EINVAL;
        tcm::CmIdInfo info;
        if (const int rc = u_.cm()->query(cmd.id, info); rc != 0) return rc;
        switch (cmd.option) {
            case RDMA_USER_CM_QUERY_ADDR: {
                rdma_ucm_query_addr_resp resp{};
                resp.ibdev_index = UINT32_MAX;
                if (info.device) {
                    resp.node_guid = htobe64(info.device->node_guid);
                    resp.port_num = 1;
                }
                resp.pkey = htons(0xffff);
                if (e.af_ib) {
                    resp.src_size =
                        put_ib_address(e, info.sgid, &resp.src_addr, sizeof resp.src_addr);
                } else {
                    resp.src_size = put_address(info.src, &resp.src_addr, sizeof resp.src_addr);
                    resp.dst_size = put_address(info.dst, &resp.dst_addr, sizeof resp.dst_addr);
                }
                return respond(cmd.response, c.out, resp);
            }
            case RDMA_USER_CM_QUERY_GID: {
                rdma_ucm_query_addr_resp resp{};
                resp.ibdev_index = UINT32_MAX;
                if (info.device) {
                    resp.node_guid = htobe64(info.device->node_guid);
                    resp.port_num = 1;
                }
                resp.pkey = htons(0xffff);
                resp.src_size = put_ib_address(e, info.sgid, &resp.src_addr, sizeof resp.src_addr);
                resp.dst_size = put_ib_address(e, info.dgid, &resp.dst_addr, sizeof resp.dst_addr);
                return respond(cmd.response, c.out, resp);
            }
            case RDMA_USER_CM_QUERY_PATH: {
                static_assert(sizeof(ibv_path_data) == sizeof(ib_path_rec_data));
                // rdma_ucm_query_path_resp's fixed part (its path_data[] follows): not the
                // structure itself, whose flexible array cannot be an object's member.
                struct {
                    uint32_t num_paths;
                    uint32_t reserved;
                } head{};
                static_assert(sizeof head == offsetof(rdma_ucm_query_path_resp, path_data));
                ibv_path_data path{};
                if (info.has_path && c.out >= sizeof head + sizeof path) {
                    head.num_paths = 1;
                    path.flags =
                        IBV_PATH_FLAG_GMP | IBV_PATH_FLAG_PRIMARY | IBV_PATH_FLAG_BIDIRECTIONAL;
                    fill_path_record(path.path, info);
                }
                uint8_t resp[sizeof head + sizeof path];
                std::memcpy(resp, &head, sizeof head);
                std::memcpy(resp + sizeof head, &path, sizeof path);
                // As the kernel: as many paths as fit, the header at least.
                const size_t size = head.num_paths != 0 ? sizeof resp : sizeof head;
                return respond(cmd.response, c.out, resp, size);
            }
            default:
                return ENOSYS;
        }
    }

    static tcm::CmConnParam conn_param(const rdma_ucm_conn_param& p) {
        tcm::CmConnParam out;
        out.qp_num = p.qp_num;
        out.srq = p.srq != 0;
        out.responder_resources = p.responder_resources;
        out.initiator_depth = p.initiator_depth;
        out.flow_control = p.flow_control;
        out.retry_count = p.retry_count;
        out.rnr_retry_count = p.rnr_retry_count;
        out.private_data.assign(
            p.private_data,
            p.private_data + std::min<size_t>(p.private_data_len, sizeof p.private_data));
        return out;
    }

    int connect(const Command& c) {
        rdma_ucm_connect cmd;
        if (!take(c, cmd)) return EINVAL;
        if (!mine(cmd.id)) return EINVAL;
        if (!cmd.conn_param.valid) return EINVAL;
        return u_.cm()->connect(cmd.id, conn_param(cmd.conn_param));
    }

    int listen(const Command& c) {
        rdma_ucm_listen cmd;
        if (!take(c, cmd)) return EINVAL;
        if (!mine(cmd.id)) return EINVAL;
        return u_.cm()->listen(cmd.id, static_cast<int>(cmd.backlog));
    }

    int accept(const Command& c) {
        rdma_ucm_accept cmd;
        if (!take(c, cmd)) return EINVAL;
        if (!mine(cmd.id)) return EINVAL;
        const tcm::CmConnParam param = conn_param(cmd.conn_param);
        // The identifier's own uid from now on, before the REP goes out: the ESTABLISHED
        // its RTU brings must name it, not the listener (librdmacm counts events per uid,
        // and rdma_destroy_id waits for as many acknowledgements as were reported).
        if (cmd.uid != 0) {
            std::lock_guard lock(u_.mutex);
            if (auto it = u_.ids.find(cmd.id); it != u_.ids.end()) it->second.uid = cmd.uid;
        }
        return u_.cm()->accept(cmd.id, cmd.conn_param.valid ? &param : nullptr);
    }

    int reject(const Command& c) {
        rdma_ucm_reject cmd;
        if (!take(c, cmd)) return EINVAL;
        if (!mine(cmd.id)) return EINVAL;
        return u_.cm()->reject(cmd.id,
                               std::span<const uint8_t>(cmd.private_data, cmd.private_data_len));
    }

    int disconnect(const Command& c) {
        rdma_ucm_disconnect cmd;
        if (!take(c, cmd)) return EINVAL;
        if (!mine(cmd.id)) return EINVAL;
        return u_.cm()->disconnect(cmd.id);
    }

    int init_qp_attr(const Command& c) {
        rdma_ucm_init_qp_attr cmd;
        if (!take(c, cmd)) return EINVAL;
        if (!mine(cmd.id)) return EINVAL;
        if (cmd.qp_state != IBV_QPS_INIT && cmd.qp_state != IBV_QPS_RTR &&
            cmd.qp_state != IBV_QPS_RTS)
            return EINVAL;
        if (cmd.response == 0) return EFAULT;
        if (c.out < sizeof(ib_uverbs_qp_attr)) return ENOSPC;
        tcm::CmQpAttr a;
        if (const int rc =
                u_.cm()->init_qp_attr(cmd.id, static_cast<tcm::CmQpState>(cmd.qp_state), a);
            rc != 0)
            return rc;
        ib_uverbs_qp_attr resp{};
        resp.qp_attr_mask = a.mask;
        resp.qp_state = static_cast<uint32_t>(a.state);
        resp.path_mtu = a.path_mtu;
        resp.rq_psn = a.rq_psn;
        resp.sq_psn = a.sq_psn;
        resp.dest_qp_num = a.dest_qp_num;
        resp.qp_access_flags = a.access_flags;
        resp.pkey_index = a.pkey_index;
        resp.port_num = a.port_num;
        resp.max_rd_atomic = a.max_rd_atomic;
        resp.max_dest_rd_atomic = a.max_dest_rd_atomic;
        resp.min_rnr_timer = a.min_rnr_timer;
        resp.timeout = a.timeout;
        resp.retry_cnt = a.retry_cnt;
        resp.rnr_retry = a.rnr_retry;
        resp.qkey = a.qkey;
        if (a.mask & tcm::qp_mask::kAv) {
            std::memcpy(resp.ah_attr.grh.dgid, a.dgid.data(), 16);
            resp.ah_attr.grh.flow_label = a.flow_label;
            resp.ah_attr.grh.hop_limit = a.hop_limit;
            resp.ah_attr.grh.traffic_class = a.traffic_class;
            resp.ah_attr.grh.sgid_index = 0;
            resp.ah_attr.is_global = 1;
            resp.ah_attr.port_num = 1;
        }
        return respond(cmd.response, c.out, resp);
    }

    int get_event(const Command& c) {
        rdma_ucm_get_event cmd;
        if (!take(c, cmd)) return EINVAL;
        rdma_ucm_event_resp resp{};
        // librdmacm of old asked for less than today's structure (no ECE): the kernel's
        // minimum.
        const size_t least = sizeof resp - sizeof resp.reserved - sizeof resp.ece;
        if (c.out < least) return ENOSPC;
        if (cmd.response == 0) return EFAULT;
        const int flags = fcntl(channel_->fd(), F_GETFL);
        if (const int rc = channel_->pop(resp, flags >= 0 && (flags & O_NONBLOCK) != 0); rc != 0)
            return rc;
        std::memcpy(reinterpret_cast<void*>(static_cast<uintptr_t>(cmd.response)), &resp,
                    std::min(c.out, sizeof resp));
        return 0;
    }

    int set_option(const Command& c) {
        rdma_ucm_set_option cmd;
        if (!take(c, cmd)) return EINVAL;
        if (!mine(cmd.id)) return EINVAL;
        // Accepted and without effect over uroce: the type of service, address reuse,
        // IPv6-only, the ACK timeout, and a path given by the application (RoCE paths
        // follow from the addresses).
        if (cmd.level == RDMA_OPTION_ID &&
            (cmd.optname == RDMA_OPTION_ID_TOS || cmd.optname == RDMA_OPTION_ID_REUSEADDR ||
             cmd.optname == RDMA_OPTION_ID_AFONLY || cmd.optname == RDMA_OPTION_ID_ACK_TIMEOUT))
            return cmd.optlen >= 1 ? 0 : EINVAL;
        if (cmd.level == RDMA_OPTION_IB && cmd.optname == RDMA_OPTION_IB_PATH) return 0;
        return ENOSYS;
    }

    int notify(const Command& c) {
        rdma_ucm_notify cmd;
        if (!take(c, cmd)) return EINVAL;
        if (!mine(cmd.id)) return EINVAL;
        if (cmd.event != IBV_EVENT_COMM_EST) return 0;
        const int rc = u_.cm()->establish(cmd.id);
        return rc == EINVAL ? 0 : rc;  // already established: nothing to do
    }

    // RoCE has no SA: a join of an IPv4 multicast group is granted at once, the group's
    // MGID being ::ffff:a.b.c.d, and librdmacm attaches the identifier's QP to it (the UD
    // multicast of the transport then carries it as IPv4 multicast).
    int join(uint32_t id, const void* addr, size_t size, uint64_t uid, uint64_t response,
             size_t out) {
        if (!mine(id)) return EINVAL;
        tcm::CmAddress group;
        if (const int rc = parse_address(addr, size, group, nullptr); rc != 0) return rc;
        if ((group.ip >> 28) != 0xe) return EINVAL;  // not 224.0.0.0/4
        tcm::CmIdInfo info;
        if (const int rc = u_.cm()->query(id, info); rc != 0) return rc;
        if (!info.device) return EINVAL;  // neither bound to a device nor resolved
        if (response == 0) return EFAULT;
        if (out < sizeof(rdma_ucm_create_id_resp)) return ENOSPC;
        rdma_ucm_create_id_resp resp{};
        {
            std::lock_guard lock(u_.mutex);
            do resp.id = 0x80000000u | (u_.next_mc++ & 0x7fffffffu);
            while (u_.mcs.count(resp.id));
            u_.mcs[resp.id] = Ucma::McEntry{id, channel_};
        }
        if (const int rc = respond(response, out, resp); rc != 0) {
            std::lock_guard lock(u_.mutex);
            u_.mcs.erase(resp.id);
            return rc;
        }
        rdma_ucm_event_resp ev{};
        ev.uid = uid;
        ev.id = id;
        ev.event = static_cast<uint32_t>(tcm::CmIdEventType::MulticastJoin);
        tcm::CmIdEvent join_ev;
        join_ev.param.qp_num = 0xffffff;
        join_ev.param.qkey = tcm::RdmaCm::kUdpQkey;
        join_ev.dgid[10] = 0xff;
        join_ev.dgid[11] = 0xff;
        const uint32_t be = htonl(group.ip);
        std::memcpy(join_ev.dgid.data() + 12, &be, 4);
        join_ev.hop_limit = 1;  // IPv4 multicast stays on the link (the kernel's TTL 1)
        fill_ud(ev.param.ud, join_ev);
        channel_->push(ev, resp.id);
        return 0;
    }

    int join_ip_mcast(const Command& c) {
        rdma_ucm_join_ip_mcast cmd;
        if (!take(c, cmd)) return EINVAL;
        return join(cmd.id, &cmd.addr, sizeof cmd.addr, cmd.uid, cmd.response, c.out);
    }

    int join_mcast(const Command& c) {
        rdma_ucm_join_mcast cmd;
        if (!take(c, cmd)) return EINVAL;
        if (cmd.addr_size > sizeof cmd.addr) return EINVAL;
        if (cmd.join_flags != RDMA_MC_JOIN_FLAG_FULLMEMBER &&
            cmd.join_flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER)
            return EINVAL;
        return join(cmd.id, &cmd.addr, cmd.addr_size, cmd.uid, cmd.response, c.out);
    }

    int leave_mcast(const Command& c) {
        rdma_ucm_destroy_id cmd;
        if (!take(c, cmd)) return EINVAL;
        if (cmd.response == 0) return EFAULT;
        if (c.out < sizeof(rdma_ucm_destroy_id_resp)) return ENOSPC;
        {
            std::lock_guard lock(u_.mutex);
            const auto it = u_.mcs.find(cmd.id);
            if (it == u_.mcs.end() || it->second.channel != channel_) return EINVAL;
            u_.mcs.erase(it);
        }
        rdma_ucm_destroy_id_resp resp{};
        resp.events_reported = channel_->purge(cmd.id).reported;
        return respond(cmd.response, c.out, resp);
    }

    int migrate_id(const Command& c) {
        rdma_ucm_migrate_id cmd;
        if (!take(c, cmd)) return EINVAL;
        if (cmd.response == 0) return EFAULT;
        if (c.out < sizeof(rdma_ucm_migrate_resp)) return ENOSPC;
        std::shared_ptr<Channel> from;
        {
            std::lock_guard lock(u_.mutex);
            const auto ch = u_.channels.find(static_cast<int>(cmd.fd));
            const auto it = u_.ids.find(cmd.id);
            if (ch == u_.channels.end() || it == u_.ids.end() ||
                it->second.channel != ch->second.channel)
                return EINVAL;
            from = ch->second.channel;
            it->second.channel = channel_;
        }
        rdma_ucm_migrate_resp resp{};
        if (from != channel_) resp.events_reported = from->move_to(*channel_, cmd.id);
        return respond(cmd.response, c.out, resp);
    }

    Ucma& u_;
    std::shared_ptr<Channel> channel_;
};

}  // namespace

namespace detail {

int open_channel() noexcept {
    Ucma* u = ucma();
    if (!u) {
        errno = ENOMEM;
        return -1;
    }
    auto channel = Channel::create();
    if (!channel) return -1;
    FileId id;
    if (!file_id(channel->fd(), &id)) return -1;
    try {
        std::lock_guard lock(u->mutex);
        u->channels[channel->fd()] = ChannelEntry{channel, id};
        u->channel_count.store(u->channels.size(), std::memory_order_release);
    } catch (...) {
        ::close(channel->fd());
        errno = ENOMEM;
        return -1;
    }
    return channel->fd();
}

bool is_channel(int fd) noexcept {
    Ucma* u = ucma();
    if (!u || u->channel_count.load(std::memory_order_acquire) == 0) return false;
    FileId registered;
    {
        std::lock_guard lock(u->mutex);
        const auto it = u->channels.find(fd);
        if (it == u->channels.end()) return false;
        registered = it->second.file;
    }
    FileId now;
    return file_id(fd, &now) && now == registered;
}

ssize_t handle_write(int fd, const void* buf, size_t len) noexcept {
    Ucma* u = ucma();
    rdma_ucm_cmd_hdr hdr{};
    if (!u || buf == nullptr || len < sizeof hdr) {
        errno = EINVAL;
        return -1;
    }
    std::memcpy(&hdr, buf, sizeof hdr);
    if (size_t{hdr.in} + sizeof hdr > len) {
        errno = EINVAL;
        return -1;
    }
    std::shared_ptr<Channel> channel;
    {
        std::lock_guard lock(u->mutex);
        const auto it = u->channels.find(fd);
        if (it == u->channels.end()) {
            errno = EBADF;
            return -1;
        }
        channel = it->second.channel;
    }
    int rc = 0;
    try {
        Handler h(*u, channel);
        rc =
            h.run(hdr.cmd, Command{static_cast<const uint8_t*>(buf) + sizeof hdr, hdr.in, hdr.out});
    } catch (const std::bad_alloc&) {
        rc = ENOMEM;
    } catch (...) {
        rc = EIO;
    }
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    return static_cast<ssize_t>(len);
}

void on_close(int fd) noexcept {
    Ucma* u = ucma();
    if (!u) return;
    std::shared_ptr<Channel> channel;
    std::vector<uint32_t> ids;
    try {
        std::lock_guard lock(u->mutex);
        const auto it = u->channels.find(fd);
        if (it == u->channels.end()) return;
        channel = it->second.channel;
        u->channels.erase(it);
        u->channel_count.store(u->channels.size(), std::memory_order_release);
        for (auto m = u->mcs.begin(); m != u->mcs.end();) {
            if (m->second.channel == channel)
                m = u->mcs.erase(m);
            else
                ++m;
        }
        for (auto i = u->ids.begin(); i != u->ids.end();) {
            if (i->second.channel == channel) {
                ids.push_back(i->first);
                i = u->ids.erase(i);
            } else {
                ++i;
            }
        }
    } catch (...) {
        return;
    }
    channel->close();
    // As closing the kernel's file: the identifiers left on the channel are destroyed.
    for (uint32_t id : ids) u->cm()->destroy_id(id);
}

}  // namespace detail
}  // namespace uroce::provider::ucma
