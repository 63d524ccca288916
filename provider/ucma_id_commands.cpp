// Identifiers' ucma commands: CREATE_ID, DESTROY_ID, BIND(_IP), RESOLVE_IP/ADDR/ROUTE,
// QUERY(_ROUTE), SET_OPTION, MIGRATE_ID (ucma_handler.h).
#include <arpa/inet.h>
#include <endian.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_user_cm.h>

#include <cerrno>
#include <cstddef>
#include <optional>
#include <vector>

#include "provider/ucma_handler.h"
#include "provider/ucma_layouts.h"

namespace uroce::provider::ucma {

namespace tcm = transport::cm;

bool Handler::mine(uint32_t id, IdEntry* copy) {
    std::lock_guard lock(u_.mutex);
    const auto it = u_.ids.find(id);
    if (it == u_.ids.end() || it->second.channel != channel_) return false;
    if (copy) *copy = it->second;
    return true;
}

int Handler::create_id(const Command& c) {
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
        u_.ids[resp.id] = IdEntry{channel_, cmd.uid, IbService{}};
    }
    return respond(cmd.response, c.out, resp);
}

int Handler::destroy(uint32_t id, uint32_t* reported) {
    // The RDMA CM forgets the identifier first: a request that reaches a listener until then
    // is still delivered to its channel (then purged below, its new identifier destroyed);
    // forgotten here first, its CONNECT_REQUEST would find no listener, and the new
    // identifier would live on unseen, its requester never answered.
    u_.cm()->destroy_id(id);
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
    Channel::Purged p = channel_->purge(id);
    // Connection requests the application never took die with their listener.
    for (uint32_t orphan : p.orphan_requests) {
        u_.cm()->destroy_id(orphan);
        {
            std::lock_guard lock(u_.mutex);
            u_.ids.erase(orphan);
        }
        channel_->purge(orphan);
    }
    if (reported) *reported = p.reported;
    return 0;
}

int Handler::destroy_id(const Command& c) {
    rdma_ucm_destroy_id cmd;
    if (!take(c, cmd)) return EINVAL;
    if (!mine(cmd.id)) return EINVAL;
    if (cmd.response == 0) return EFAULT;
    if (c.out < sizeof(rdma_ucm_destroy_id_resp)) return ENOSPC;
    rdma_ucm_destroy_id_resp resp{};
    destroy(cmd.id, &resp.events_reported);
    return respond(cmd.response, c.out, resp);
}

int Handler::do_bind(uint32_t id, const void* addr, size_t size) {
    IdEntry e;
    if (!mine(id, &e)) return EINVAL;
    tcm::CmAddress a;
    if (const int rc = parse_address(addr, size, a, &e.ib); rc != 0) return rc;
    if (const int rc = u_.cm()->bind(id, a); rc != 0) return rc;
    if (e.ib.af_ib) {
        std::lock_guard lock(u_.mutex);
        if (auto it = u_.ids.find(id); it != u_.ids.end()) it->second.ib = e.ib;
    }
    return 0;
}

int Handler::bind_ip(const Command& c) {
    rdma_ucm_bind_ip cmd;
    if (!take(c, cmd)) return EINVAL;
    return do_bind(cmd.id, &cmd.addr, sizeof cmd.addr);
}

int Handler::bind(const Command& c) {
    rdma_ucm_bind cmd;
    if (!take(c, cmd)) return EINVAL;
    if (cmd.addr_size > sizeof cmd.addr) return EINVAL;
    return do_bind(cmd.id, &cmd.addr, cmd.addr_size);
}

int Handler::do_resolve(uint32_t id, const void* src, size_t src_size, const void* dst,
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

int Handler::resolve_ip(const Command& c) {
    rdma_ucm_resolve_ip cmd;
    if (!take(c, cmd)) return EINVAL;
    return do_resolve(cmd.id, &cmd.src_addr, sizeof cmd.src_addr, &cmd.dst_addr,
                      sizeof cmd.dst_addr);
}

int Handler::resolve_addr(const Command& c) {
    rdma_ucm_resolve_addr cmd;
    if (!take(c, cmd)) return EINVAL;
    if (cmd.src_size > sizeof cmd.src_addr || cmd.dst_size > sizeof cmd.dst_addr) return EINVAL;
    return do_resolve(cmd.id, &cmd.src_addr, cmd.src_size, &cmd.dst_addr, cmd.dst_size);
}

int Handler::resolve_route(const Command& c) {
    rdma_ucm_resolve_route cmd;
    if (!take(c, cmd)) return EINVAL;
    if (!mine(cmd.id)) return EINVAL;
    return u_.cm()->resolve_route(cmd.id);
}

int Handler::query_route(const Command& c) {
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

namespace {

// QUERY(ADDR) and QUERY(GID)'s response without its addresses: the device and port.
rdma_ucm_query_addr_resp address_response(const tcm::CmIdInfo& info) {
    rdma_ucm_query_addr_resp resp{};
    resp.ibdev_index = UINT32_MAX;
    if (info.device) {
        resp.node_guid = htobe64(info.device->node_guid);
        resp.port_num = 1;
    }
    resp.pkey = htons(0xffff);
    return resp;
}

}  // namespace

int Handler::query(const Command& c) {
    rdma_ucm_query cmd;
    if (!take(c, cmd)) return EINVAL;
    IdEntry e;
    if (!mine(cmd.id, &e)) return EINVAL;
    tcm::CmIdInfo info;
    if (const int rc = u_.cm()->query(cmd.id, info); rc != 0) return rc;
    switch (cmd.option) {
        case RDMA_USER_CM_QUERY_ADDR: {
            rdma_ucm_query_addr_resp resp = address_response(info);
            if (e.ib.af_ib) {
                resp.src_size =
                    put_ib_address(e.ib, info.sgid, &resp.src_addr, sizeof resp.src_addr);
            } else {
                resp.src_size = put_address(info.src, &resp.src_addr, sizeof resp.src_addr);
                resp.dst_size = put_address(info.dst, &resp.dst_addr, sizeof resp.dst_addr);
            }
            return respond(cmd.response, c.out, resp);
        }
        case RDMA_USER_CM_QUERY_GID: {
            rdma_ucm_query_addr_resp resp = address_response(info);
            resp.src_size = put_ib_address(e.ib, info.sgid, &resp.src_addr, sizeof resp.src_addr);
            resp.dst_size = put_ib_address(e.ib, info.dgid, &resp.dst_addr, sizeof resp.dst_addr);
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

int Handler::set_option(const Command& c) {
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

int Handler::migrate_id(const Command& c) {
    rdma_ucm_migrate_id cmd;
    if (!take(c, cmd)) return EINVAL;
    if (cmd.response == 0) return EFAULT;
    if (c.out < sizeof(rdma_ucm_migrate_resp)) return ENOSPC;
    rdma_ucm_migrate_resp resp{};
    {
        // Held throughout: an event delivered meanwhile (under this lock) goes to the new
        // channel after the moved ones, and a command about a moved request's identifier
        // waits until the identifier has moved too.
        std::lock_guard lock(u_.mutex);
        const auto ch = u_.channels.find(static_cast<int>(cmd.fd));
        const auto it = u_.ids.find(cmd.id);
        if (ch == u_.channels.end() || it == u_.ids.end() ||
            it->second.channel != ch->second.channel)
            return EINVAL;
        const std::shared_ptr<Channel> from = ch->second.channel;
        it->second.channel = channel_;
        if (from != channel_) {
            Channel::Moved moved = from->move_to(*channel_, cmd.id);
            resp.events_reported = moved.reported;
            // A CONNECT_REQUEST read from the new channel makes librdmacm put the new
            // identifier there and ask about it through it (QUERY, then ACCEPT): the identifier
            // goes with its event. The kernel's ucma leaves it on the old file, where librdmacm
            // then fails to query it and drops the request.
            for (const uint32_t request : moved.requests)
                if (auto r = u_.ids.find(request); r != u_.ids.end() && r->second.channel == from)
                    r->second.channel = channel_;
        }
    }
    return respond(cmd.response, c.out, resp);
}

}  // namespace uroce::provider::ucma
