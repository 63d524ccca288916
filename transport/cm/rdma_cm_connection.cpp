// RDMA CM identifiers: the connection half. An identifier's connection is one IB CM
// connection of its device's CmAgent; the agent's events become RDMA CM events here.
#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transport/cm/cm_service.h"
#include "transport/cm/rdma_cm.h"
#include "transport/cm/rdma_cm_id.h"
#include "transport/random_source.h"

namespace uroce::transport::cm {

namespace {

constexpr uint32_t kPsnMask = 0xffffff;

uint32_t random_psn() {
    return static_cast<uint32_t>(random_u64()) & kPsnMask;
}

template <size_t N>
std::vector<uint8_t> bytes_of(const std::array<uint8_t, N>& a, size_t from = 0) {
    return {a.begin() + static_cast<std::ptrdiff_t>(from), a.end()};
}

template <size_t N>
void copy_private(std::span<const uint8_t> from, std::array<uint8_t, N>& to, size_t at = 0) {
    std::copy_n(from.begin(), std::min(from.size(), N - at), to.begin() + at);
}

}  // namespace

void RdmaCm::forget_connection(Id& id) {
    by_comm_id_.erase({id.comm_device, id.comm_id});
    id.comm_id = 0;
}

int RdmaCm::connect(uint32_t handle, const CmConnParam& param) {
    Lock lock(*this);
    Id* id = find(handle);
    int rc = 0;
    if (!id || id->state != State::RouteResolved) {
        rc = EINVAL;
    } else if (id->ps == PortSpace::Ipoib) {
        rc = EOPNOTSUPP;
    } else if (id->ud) {
        rc = connect_ud(*id, param);
    } else if (param.private_data.size() > kConnectPrivateBytes) {
        rc = EINVAL;
    } else if (CmService* svc = service(id->device->name, rc); svc != nullptr) {
        id->active = true;
        id->local_qpn = param.qp_num & kPsnMask;
        id->rq_psn = random_psn();
        id->responder_resources = param.responder_resources;
        id->initiator_depth = param.initiator_depth;
        id->retry_count = std::min<uint8_t>(param.retry_count, 7);

        CmReq req;
        req.service_id = service_id_of(id->ps, id->dst.port);
        req.local_qpn = id->local_qpn;
        req.responder_resources = param.responder_resources;
        req.initiator_depth = param.initiator_depth;
        req.remote_cm_response_timeout = kCmResponseTimeout;
        req.transport = CmTransport::Rc;
        req.end_to_end_flow_control = param.flow_control != 0;
        req.starting_psn = id->rq_psn;
        req.local_cm_response_timeout = kCmResponseTimeout;
        req.retry_count = id->retry_count;
        req.pkey = 0xffff;
        req.path_mtu = id->path_mtu;
        req.rnr_retry_count = std::min<uint8_t>(param.rnr_retry_count, 7);
        req.max_cm_retries = timers_.max_retries;
        req.srq = param.srq;
        req.primary.local_lid = 0xffff;
        req.primary.remote_lid = 0xffff;
        req.primary.local_gid = roce_gid_of(id->src.ip);
        req.primary.remote_gid = roce_gid_of(id->dst.ip);
        req.primary.flow_label = roce_flow_label(id->src.port, id->dst.port);
        req.primary.hop_limit = kHopLimit;
        req.primary.local_ack_timeout = kLocalAckTimeout;
        IpCmHeader ip;
        ip.ip_version = 4;
        ip.source_port = id->src.port;
        ip.source = ip_cm_address_v4(htonl(id->src.ip));
        ip.destination = ip_cm_address_v4(htonl(id->dst.ip));
        write_ip_cm_header(ip, req.private_data);
        copy_private(param.private_data, req.private_data, kIpCmHeaderBytes);

        const uint32_t comm_id = svc->agent().send_req(id->dst.ip, req);
        if (comm_id == 0) {
            rc = ENOMEM;
        } else {
            id->comm_id = comm_id;
            id->comm_device = id->device->name;
            by_comm_id_[{id->comm_device, comm_id}] = handle;
            id->state = State::Connecting;
            id->had_connection = true;
        }
    }
    lock.unlock_and_drain();
    return rc;
}

int RdmaCm::accept(uint32_t handle, const CmConnParam* param) {
    Lock lock(*this);
    Id* id = find(handle);
    int rc = 0;
    auto svc = id ? services_.find(id->comm_device) : services_.end();
    if (!id || id->comm_id == 0 || svc == services_.end()) {
        rc = EINVAL;
    } else if (id->state == State::ConnectResponse && !id->active) {
        rc = EINVAL;
    } else if (id->state == State::ConnectResponse) {
        // The active side's QP is ready (librdmacm moved it to RTS): the RTU completes it.
        rc = svc->second->agent().send_rtu(id->comm_id);
        if (rc == 0) id->state = State::Established;
    } else if (id->state != State::ConnectRequest || param == nullptr) {
        rc = EINVAL;
    } else if (id->ud) {
        rc = accept_ud(*id, *param);
    } else if (param->private_data.size() > kAcceptPrivateBytes) {
        rc = EINVAL;
    } else {
        id->local_qpn = param->qp_num & kPsnMask;
        id->responder_resources = param->responder_resources;
        id->initiator_depth = param->initiator_depth;
        CmRep rep;
        rep.local_qpn = id->local_qpn;
        rep.starting_psn = id->rq_psn;
        rep.responder_resources = param->responder_resources;
        rep.initiator_depth = param->initiator_depth;
        rep.target_ack_delay = kTargetAckDelay;
        rep.end_to_end_flow_control = param->flow_control != 0;
        rep.rnr_retry_count = std::min<uint8_t>(param->rnr_retry_count, 7);
        rep.srq = param->srq;
        copy_private(param->private_data, rep.private_data);
        rc = svc->second->agent().send_rep(id->comm_id, rep);
        if (rc == 0) id->state = State::Accepting;
    }
    lock.unlock_and_drain();
    return rc;
}

int RdmaCm::reject(uint32_t handle, std::span<const uint8_t> private_data) {
    Lock lock(*this);
    Id* id = find(handle);
    int rc = 0;
    auto svc = id ? services_.find(id->comm_device) : services_.end();
    if (!id || id->comm_id == 0 || svc == services_.end() ||
        (id->state != State::ConnectRequest && id->state != State::ConnectResponse)) {
        rc = EINVAL;
    } else if (private_data.size() > kRejectPrivateBytes) {
        rc = EINVAL;
    } else if (id->ud) {
        CmSidrRep rep;
        rep.status = static_cast<uint8_t>(SidrStatus::Rejected);
        copy_private(private_data, rep.private_data);
        rc = svc->second->agent().send_sidr_rep(id->comm_id, rep);
        if (rc == 0) {
            by_comm_id_.erase({id->comm_device, id->comm_id});
            id->comm_id = 0;
            id->state = State::Disconnected;
        }
    } else {
        rc = svc->second->agent().send_rej(id->comm_id, CmRejectReason::ConsumerReject,
                                           private_data);
        if (rc == 0) {
            id->state = State::Disconnected;
            forget_connection(*id);  // the agent forgot it: its comm ID may name another soon
        }
    }
    lock.unlock_and_drain();
    return rc;
}

int RdmaCm::disconnect(uint32_t handle) {
    Lock lock(*this);
    Id* id = find(handle);
    int rc = 0;
    auto svc = id ? services_.find(id->comm_device) : services_.end();
    if (!id) {
        rc = EINVAL;
    } else if (id->comm_id == 0 || svc == services_.end()) {
        // No connection now (rejected, unreachable, its timewait over; or never one). The
        // kernel's rdma_disconnect fails only for an identifier without an IB CM identifier:
        // one that never connected nor came from a REQ, and is no listener on a device.
        rc = id->had_connection || (id->state == State::Listening && id->device) ? 0 : EINVAL;
    } else {
        CmAgent& agent = svc->second->agent();
        const auto st = agent.state(id->comm_id);
        if (st == CmState::Established) {
            rc = agent.send_dreq(id->comm_id);
        } else if (st == CmState::DreqReceived) {
            rc = agent.send_drep(id->comm_id);
        } else if (st == CmState::RepReceived || st == CmState::ReqReceived ||
                   st == CmState::MraSent || st == CmState::RepSent) {
            // RepSent: REP sent, no RTU yet: the connection is given up as the kernel does,
            // with a DREQ once the RTU would have made it established; here, a REJ.
            rc = agent.send_rej(id->comm_id, CmRejectReason::ConsumerReject);
            if (rc == 0) forget_connection(*id);  // as in reject()
        } else {
            rc = 0;  // already disconnecting or gone: nothing more to say
        }
        if (rc == 0) id->state = State::Disconnected;
    }
    lock.unlock_and_drain();
    return rc;
}

int RdmaCm::establish(uint32_t handle) {
    Lock lock(*this);
    Id* id = find(handle);
    int rc = EINVAL;
    if (id && id->state == State::Accepting) {
        if (auto svc = services_.find(id->comm_device); svc != services_.end())
            rc = svc->second->agent().notify_established(id->comm_id);
    }
    lock.unlock_and_drain();
    return rc;
}

int RdmaCm::init_qp_attr(uint32_t handle, CmQpState state, CmQpAttr& out) {
    Lock lock(*this);
    Id* id = find(handle);
    int rc = 0;
    out = CmQpAttr{};
    out.state = state;
    const bool connected = id != nullptr && id->comm_id != 0;
    if (!id || !id->device) {
        rc = EINVAL;
    } else if (id->ud) {
        // A UD QP needs only its Q_Key (INIT); RTR and RTS carry no peer (and RTS starts
        // at PSN 0, as librdmacm sets it).
        out.mask = qp_mask::kState;
        if (state == CmQpState::Init) {
            out.mask |= qp_mask::kPkeyIndex | qp_mask::kPort | qp_mask::kQkey;
            out.qkey = id->qkey;
        } else if (state == CmQpState::Rts) {
            out.mask |= qp_mask::kSqPsn;
        }
    } else if (state == CmQpState::Init) {
        // Before a connection exists the QP gets no remote access (as the kernel's
        // cma_ib_init_qp_attr); with one, what the connection agreed.
        out.mask = qp_mask::kState | qp_mask::kAccessFlags | qp_mask::kPkeyIndex | qp_mask::kPort;
        if (connected) {
            out.access_flags = access::kRemoteWrite;
            if (id->responder_resources != 0)
                out.access_flags |= access::kRemoteRead | access::kRemoteAtomic;
        }
    } else if (!connected || id->remote_qpn == 0) {
        rc = EINVAL;
    } else if (state == CmQpState::Rtr) {
        out.mask = qp_mask::kState | qp_mask::kAv | qp_mask::kPathMtu | qp_mask::kDestQpn |
                   qp_mask::kRqPsn | qp_mask::kMaxDestRdAtomic | qp_mask::kMinRnrTimer;
        out.path_mtu = id->path_mtu;
        out.dest_qp_num = id->remote_qpn;
        out.rq_psn = id->rq_psn;
        out.max_dest_rd_atomic = id->responder_resources;
        out.min_rnr_timer = 0;
        out.dgid = roce_gid_of(id->dst.ip);
        out.flow_label = roce_flow_label(id->active ? id->src.port : id->dst.port,
                                         id->active ? id->dst.port : id->src.port);
        out.hop_limit = kHopLimit;
    } else if (state == CmQpState::Rts) {
        out.mask = qp_mask::kState | qp_mask::kTimeout | qp_mask::kRetryCnt | qp_mask::kRnrRetry |
                   qp_mask::kSqPsn | qp_mask::kMaxQpRdAtomic;
        out.timeout = kLocalAckTimeout;
        out.retry_cnt = id->retry_count;
        out.rnr_retry = id->rnr_retry_count;
        out.sq_psn = id->sq_psn;
        out.max_rd_atomic = id->initiator_depth;
    } else {
        rc = EINVAL;
    }
    lock.unlock_and_drain();
    return rc;
}

// ---- the IB CM's events -------------------------------------------------------------------

RdmaCm::Id* RdmaCm::open_passive(const Id& listener, const CmDeviceInfo& dev, const IpCmHeader& ip,
                                 const std::string& device, uint32_t comm_id) {
    while (next_id_ == 0 || ids_.count(next_id_)) ++next_id_;
    const uint32_t handle = next_id_++;
    auto id = std::make_unique<Id>();
    id->handle = handle;
    id->ps = listener.ps;
    id->ud = listener.ud;
    id->qkey = listener.qkey;
    id->state = State::ConnectRequest;
    id->src = CmAddress{dev.ip, listener.src.port};
    uint32_t src_be = 0;
    std::memcpy(&src_be, ip.source.data() + 12, 4);
    id->dst = CmAddress{ntohl(src_be), ip.source_port};
    id->device = dev;
    id->listen_parent = listener.handle;
    id->had_connection = true;
    id->comm_id = comm_id;
    id->comm_device = device;
    by_comm_id_[{device, comm_id}] = handle;
    return ids_.emplace(handle, std::move(id)).first->second.get();
}

bool RdmaCm::backlog_full(const Id& listener) const {
    // Counted, not kept: whatever ends a request's wait (handed over, accepted, rejected,
    // destroyed, rejected by its requester) frees its place, with no count to keep in step.
    int waiting = 0;
    for (const auto& [handle, id] : ids_)
        if (id->listen_parent == listener.handle && id->state == State::ConnectRequest &&
            !id->reported)
            ++waiting;
    return waiting >= listener.backlog;
}

void RdmaCm::on_req(const std::string& device, const CmEvent& ev) {
    const Id* listener = find(static_cast<uint32_t>(ev.listener));
    auto svc = services_.find(device);
    if (svc == services_.end()) return;
    const bool sidr = ev.type == CmEventType::SidrReqReceived;
    const CmReq* req = ev.message ? std::get_if<CmReq>(&ev.message->body) : nullptr;
    const CmSidrReq* sreq = ev.message ? std::get_if<CmSidrReq>(&ev.message->body) : nullptr;
    IpCmHeader ip;
    std::optional<CmDeviceInfo> dev;
    for (auto& d : host_.devices())
        if (d.name == device) dev = d;
    const bool taken =
        listener && listener->state == State::Listening && dev && listener->ud == sidr &&
        (sidr ? sreq != nullptr : req != nullptr && req->transport == CmTransport::Rc) &&
        read_ip_cm_header(sidr ? std::span<const uint8_t>(sreq->private_data)
                               : std::span<const uint8_t>(req->private_data),
                          ip) == IpCmHeaderError::None &&
        ip.ip_version == 4;
    if (!taken) {
        // Not a connection this process can take (gone listener, no RDMA CM header, another
        // transport): the requester hears so at once instead of timing out.
        if (sidr) {
            CmSidrRep no;
            no.status = static_cast<uint8_t>(SidrStatus::ServiceIdNotSupported);
            svc->second->agent().send_sidr_rep(ev.comm_id, no);
        } else {
            svc->second->agent().send_rej(ev.comm_id, req && req->transport != CmTransport::Rc
                                                          ? CmRejectReason::InvalidTransportType
                                                          : CmRejectReason::InvalidServiceId);
        }
        return;
    }
    if (!sidr && (req->path_mtu < 1 || req->path_mtu > 5)) {
        // The 4-bit MTU field names 256..4096 bytes with 1..5; anything else is no MTU a QP
        // can take (its RTR would fail, and the accept with it). The kernel's CM passes the
        // field on unchecked and leaves it to the driver; IBA has a REJ for it.
        svc->second->agent().send_rej(ev.comm_id, CmRejectReason::InvalidMtu);
        return;
    }
    if (backlog_full(*listener)) {
        // As the kernel's: no REJ (its CM resets the REQ to idle when the listener has no
        // room), so that the peer's resend, 1 to 4 s later, may find room; the agent forgets
        // the REQ so that the resend is a new one. A SIDR REQ is rejected.
        if (sidr) {
            CmSidrRep full;
            full.status = static_cast<uint8_t>(SidrStatus::Rejected);
            svc->second->agent().send_sidr_rep(ev.comm_id, full);
        } else {
            svc->second->agent().abandon(ev.comm_id);
        }
        return;
    }
    Id* id = open_passive(*listener, *dev, ip, device, ev.comm_id);
    CmIdEvent out;
    out.type = CmIdEventType::ConnectRequest;
    out.id = id->handle;
    out.listen_id = listener->handle;
    if (sidr) {
        out.ud = true;
        out.param.private_data = bytes_of(sreq->private_data, kIpCmHeaderBytes);
        out.dgid = roce_gid_of(id->dst.ip);
        out.flow_label = roce_flow_label(id->dst.port, id->src.port);
        out.hop_limit = kHopLimit;
        emit(std::move(out));
        return;
    }
    id->remote_qpn = req->local_qpn;
    id->sq_psn = req->starting_psn;
    id->rq_psn = random_psn();
    // From this side's point of view: it answers as many READs as the peer issues.
    id->responder_resources = req->initiator_depth;
    id->initiator_depth = req->responder_resources;
    id->retry_count = req->retry_count;
    id->rnr_retry_count = req->rnr_retry_count;
    id->path_mtu = std::min(req->path_mtu, mtu_enum_of(dev->mtu));
    out.param.responder_resources = req->initiator_depth;
    out.param.initiator_depth = req->responder_resources;
    out.param.flow_control = req->end_to_end_flow_control;
    out.param.retry_count = req->retry_count;
    out.param.rnr_retry_count = req->rnr_retry_count;
    out.param.srq = req->srq;
    out.param.qp_num = req->local_qpn;
    out.param.private_data = bytes_of(req->private_data, kIpCmHeaderBytes);
    emit(std::move(out));
}

int RdmaCm::connect_ud(Id& id, const CmConnParam& param) {
    if (param.private_data.size() > kUdConnectPrivateBytes) return EINVAL;
    int rc = 0;
    CmService* svc = service(id.device->name, rc);
    if (!svc) return rc;
    CmSidrReq req;
    req.service_id = service_id_of(id.ps, id.dst.port);
    req.pkey = 0xffff;
    IpCmHeader ip;
    ip.ip_version = 4;
    ip.source_port = id.src.port;
    ip.source = ip_cm_address_v4(htonl(id.src.ip));
    ip.destination = ip_cm_address_v4(htonl(id.dst.ip));
    write_ip_cm_header(ip, req.private_data);
    copy_private(param.private_data, req.private_data, kIpCmHeaderBytes);
    const uint32_t request_id = svc->agent().send_sidr_req(id.dst.ip, req);
    if (request_id == 0) return ENOMEM;
    id.active = true;
    id.comm_id = request_id;
    id.comm_device = id.device->name;
    by_comm_id_[{id.comm_device, request_id}] = id.handle;
    id.state = State::Connecting;
    id.had_connection = true;
    return 0;
}

int RdmaCm::accept_ud(Id& id, const CmConnParam& param) {
    if (param.private_data.size() > kUdAcceptPrivateBytes) return EINVAL;
    auto svc = services_.find(id.comm_device);
    if (svc == services_.end()) return EINVAL;
    CmSidrRep rep;
    rep.status = static_cast<uint8_t>(SidrStatus::Ok);
    rep.qpn = param.qp_num & kPsnMask;
    rep.qkey = param.qkey != 0 ? param.qkey : id.qkey;
    copy_private(param.private_data, rep.private_data);
    const int rc = svc->second->agent().send_sidr_rep(id.comm_id, rep);
    if (rc != 0) return rc;
    // The exchange is over: SIDR keeps no connection.
    by_comm_id_.erase({id.comm_device, id.comm_id});
    id.comm_id = 0;
    id.local_qpn = rep.qpn;
    id.state = State::Established;
    return 0;
}

void RdmaCm::on_sidr_rep(Id& id, const CmEvent& ev) {
    const CmSidrRep* rep = ev.message ? std::get_if<CmSidrRep>(&ev.message->body) : nullptr;
    if (id.state != State::Connecting) return;
    by_comm_id_.erase({id.comm_device, id.comm_id});
    id.comm_id = 0;
    CmIdEvent out;
    out.id = id.handle;
    out.ud = true;
    if (!rep) {  // no answer after the retries
        id.state = State::Disconnected;
        out.type = CmIdEventType::Unreachable;
        out.status = -ETIMEDOUT;
    } else if (rep->status != static_cast<uint8_t>(SidrStatus::Ok)) {
        id.state = State::Disconnected;
        out.type = CmIdEventType::Unreachable;
        out.status = rep->status;
        out.param.private_data = bytes_of(rep->private_data);
    } else {
        id.remote_qpn = rep->qpn;
        id.state = State::Established;
        out.type = CmIdEventType::Established;
        out.param.qp_num = rep->qpn;
        out.param.qkey = rep->qkey;
        out.param.private_data = bytes_of(rep->private_data);
        out.dgid = roce_gid_of(id.dst.ip);
        out.flow_label = roce_flow_label(id.src.port, id.dst.port);
        out.hop_limit = kHopLimit;
    }
    emit(std::move(out));
}

void RdmaCm::on_rep(Id& id, const CmEvent& ev) {
    const CmRep* rep = ev.message ? std::get_if<CmRep>(&ev.message->body) : nullptr;
    if (!rep || id.state != State::Connecting) return;
    id.remote_qpn = rep->local_qpn;
    id.sq_psn = rep->starting_psn;
    id.responder_resources = std::min(id.responder_resources, rep->initiator_depth);
    id.initiator_depth = std::min(id.initiator_depth, rep->responder_resources);
    id.rnr_retry_count = rep->rnr_retry_count;
    id.state = State::ConnectResponse;
    CmIdEvent out;
    out.type = CmIdEventType::ConnectResponse;
    out.id = id.handle;
    out.param.responder_resources = rep->initiator_depth;
    out.param.initiator_depth = rep->responder_resources;
    out.param.flow_control = rep->end_to_end_flow_control;
    out.param.rnr_retry_count = rep->rnr_retry_count;
    out.param.srq = rep->srq;
    out.param.qp_num = rep->local_qpn;
    out.param.private_data = bytes_of(rep->private_data);
    emit(std::move(out));
}

void RdmaCm::on_cm_event(const std::string& device, const CmEvent& ev) {
    if (ev.type == CmEventType::ReqReceived || ev.type == CmEventType::SidrReqReceived) {
        on_req(device, ev);
        return;
    }
    const auto it = by_comm_id_.find({device, ev.comm_id});
    if (it == by_comm_id_.end()) return;
    Id* id = find(it->second);
    if (!id) {
        by_comm_id_.erase(it);
        return;
    }
    CmIdEvent out;
    out.id = id->handle;
    switch (ev.type) {
        case CmEventType::RepReceived:
            on_rep(*id, ev);
            return;
        case CmEventType::SidrRepReceived:
        case CmEventType::SidrTimeout:
            on_sidr_rep(*id, ev);
            return;
        case CmEventType::Established:
            if (id->state != State::Accepting) return;
            id->state = State::Established;
            out.type = CmIdEventType::Established;
            break;
        case CmEventType::Rejected: {
            const CmRej* rej = ev.message ? std::get_if<CmRej>(&ev.message->body) : nullptr;
            id->state = State::Disconnected;
            out.type = CmIdEventType::Rejected;
            if (rej) {
                out.status = rej->reason;
                out.param.private_data = bytes_of(rej->private_data);
            }
            by_comm_id_.erase(it);
            id->comm_id = 0;
            break;
        }
        case CmEventType::Unreachable:
            id->state = State::Disconnected;
            out.type = CmIdEventType::Unreachable;
            out.status = -ETIMEDOUT;
            by_comm_id_.erase(it);
            id->comm_id = 0;
            break;
        case CmEventType::DreqReceived:
            // Answered now, not when the application disconnects or destroys the identifier
            // as a kernel's CM does: a kernel also answers for a process that dies (its files
            // close), uroce cannot, and qperf 0.4.11's server crashes right after this event
            // (docs/rdma-cm.md). The DREP carries nothing the application could add.
            if (auto svc = services_.find(device); svc != services_.end())
                svc->second->agent().send_drep(ev.comm_id);
            [[fallthrough]];
        case CmEventType::Disconnected:
            id->state = State::Disconnected;
            if (id->disconnect_reported) return;
            id->disconnect_reported = true;
            out.type = CmIdEventType::Disconnected;
            break;
        case CmEventType::TimewaitExit:
            by_comm_id_.erase(it);
            id->comm_id = 0;
            out.type = CmIdEventType::TimewaitExit;
            break;
        default:
            return;
    }
    emit(std::move(out));
}

}  // namespace uroce::transport::cm
