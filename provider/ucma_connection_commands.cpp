// Connections', events' and multicast's ucma commands: CONNECT, LISTEN, ACCEPT, REJECT,
// DISCONNECT, INIT_QP_ATTR, NOTIFY, GET_EVENT, JOIN_(IP_)MCAST, LEAVE_MCAST (ucma_handler.h).
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/rdma_user_cm.h>

#include <algorithm>
#include <cerrno>
#include <span>

#include "provider/ucma_handler.h"
#include "provider/ucma_layouts.h"

namespace uroce::provider::ucma {

namespace tcm = transport::cm;

int Handler::connect(const Command& c) {
    rdma_ucm_connect cmd;
    if (!take(c, cmd)) return EINVAL;
    if (!mine(cmd.id)) return EINVAL;
    if (!cmd.conn_param.valid) return EINVAL;
    return u_.cm()->connect(cmd.id, conn_param(cmd.conn_param));
}

int Handler::listen(const Command& c) {
    rdma_ucm_listen cmd;
    if (!take(c, cmd)) return EINVAL;
    if (!mine(cmd.id)) return EINVAL;
    return u_.cm()->listen(cmd.id, static_cast<int>(cmd.backlog));
}

int Handler::accept(const Command& c) {
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

int Handler::reject(const Command& c) {
    rdma_ucm_reject cmd;
    if (!take(c, cmd)) return EINVAL;
    if (!mine(cmd.id)) return EINVAL;
    return u_.cm()->reject(cmd.id,
                           std::span<const uint8_t>(cmd.private_data, cmd.private_data_len));
}

int Handler::disconnect(const Command& c) {
    rdma_ucm_disconnect cmd;
    if (!take(c, cmd)) return EINVAL;
    if (!mine(cmd.id)) return EINVAL;
    return u_.cm()->disconnect(cmd.id);
}

int Handler::init_qp_attr(const Command& c) {
    rdma_ucm_init_qp_attr cmd;
    if (!take(c, cmd)) return EINVAL;
    if (!mine(cmd.id)) return EINVAL;
    if (cmd.qp_state != IBV_QPS_INIT && cmd.qp_state != IBV_QPS_RTR && cmd.qp_state != IBV_QPS_RTS)
        return EINVAL;
    if (cmd.response == 0) return EFAULT;
    if (c.out < sizeof(ib_uverbs_qp_attr)) return ENOSPC;
    tcm::CmQpAttr a;
    if (const int rc = u_.cm()->init_qp_attr(cmd.id, static_cast<tcm::CmQpState>(cmd.qp_state), a);
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

int Handler::get_event(const Command& c) {
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
    // Handed over: the request no longer takes up its listener's backlog (the kernel's ucma
    // gives the place back when GET_EVENT reads a CONNECT_REQUEST).
    if (resp.event == static_cast<uint32_t>(tcm::CmIdEventType::ConnectRequest))
        u_.cm()->request_reported(resp.id);
    std::memcpy(reinterpret_cast<void*>(static_cast<uintptr_t>(cmd.response)), &resp,
                std::min(c.out, sizeof resp));
    return 0;
}

int Handler::notify(const Command& c) {
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
int Handler::join(uint32_t id, const void* addr, size_t size, uint64_t uid, uint64_t response,
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

int Handler::join_ip_mcast(const Command& c) {
    rdma_ucm_join_ip_mcast cmd;
    if (!take(c, cmd)) return EINVAL;
    return join(cmd.id, &cmd.addr, sizeof cmd.addr, cmd.uid, cmd.response, c.out);
}

int Handler::join_mcast(const Command& c) {
    rdma_ucm_join_mcast cmd;
    if (!take(c, cmd)) return EINVAL;
    if (cmd.addr_size > sizeof cmd.addr) return EINVAL;
    if (cmd.join_flags != RDMA_MC_JOIN_FLAG_FULLMEMBER &&
        cmd.join_flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER)
        return EINVAL;
    return join(cmd.id, &cmd.addr, cmd.addr_size, cmd.uid, cmd.response, c.out);
}

int Handler::leave_mcast(const Command& c) {
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

}  // namespace uroce::provider::ucma
