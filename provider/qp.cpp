// Queue pairs: creation, state changes, queries and posting work.
#include <arpa/inet.h>
#include <pthread.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "provider/device_limits.h"
#include "provider/objects.h"
#include "provider/qp_attributes.h"
#include "provider/qp_ex_layout.h"
#include "provider/qp_modify.h"

namespace uroce::provider {

namespace {

using transport::QpState;

ibv_qp_state to_ibv(QpState s) {
    switch (s) {
        case QpState::Reset:
            return IBV_QPS_RESET;
        case QpState::Init:
            return IBV_QPS_INIT;
        case QpState::Rtr:
            return IBV_QPS_RTR;
        case QpState::Rts:
            return IBV_QPS_RTS;
        case QpState::Sqd:
            return IBV_QPS_SQD;
        case QpState::Sqe:
            return IBV_QPS_SQE;
        case QpState::Err:
            return IBV_QPS_ERR;
    }
    return IBV_QPS_ERR;
}

bool belongs(ibv_cq* cq, ibv_context* ctx) {
    return cq && cq->context == ctx;
}

// Takes the QP's waiting completions out of its CQs (RESET, destroy), except receives from an
// SRQ: the SRQ's WQE is used up, and the completion is what returns its buffer to the
// application (a NIC returns such a WQE to the SRQ instead).
void remove_completions(UroceQp& qp) {
    const uint32_t qpn = qp.vqp.qp.qp_num;
    if (qp.recv_cq) qp.recv_cq->queue->remove_qp(qpn, qp.srq != nullptr);
    if (qp.send_cq && qp.send_cq != qp.recv_cq) qp.send_cq->queue->remove_qp(qpn);
}

}  // namespace

ibv_qp* create_qp(ibv_pd* pd, ibv_qp_init_attr* init) noexcept {
    return new_qp(pd->context, pd, init, nullptr);
}

ibv_qp* new_qp(ibv_context* ibctx, ibv_pd* pd, ibv_qp_init_attr* init, UroceXrcd* xrcd) noexcept {
    if (inherited(ibctx)) {
        errno = EIO;
        return nullptr;
    }
    if (!init) {
        errno = EINVAL;
        return nullptr;
    }
    const ibv_qp_type type = init->qp_type;
    if (type != IBV_QPT_RC && type != IBV_QPT_UC && type != IBV_QPT_UD &&
        type != IBV_QPT_XRC_SEND && type != IBV_QPT_XRC_RECV) {
        errno = EOPNOTSUPP;  // raw packet QPs
        return nullptr;
    }
    // An XRC target has no PD, no CQs and no queues of its own: it needs a domain. An XRC
    // initiator sends only: it has no receive CQ, SRQ or receive queue.
    const bool target = type == IBV_QPT_XRC_RECV;
    const bool initiator = type == IBV_QPT_XRC_SEND;
    if (target != (xrcd != nullptr) || target != (pd == nullptr)) {
        errno = EINVAL;
        return nullptr;
    }
    // What an XRC QP has no use for is ignored, as the kernel ignores it.
    ibv_cq* const send_cq = target ? nullptr : init->send_cq;
    ibv_cq* const recv_cq = (initiator || target) ? nullptr : init->recv_cq;
    ibv_srq* const ibsrq = (initiator || target) ? nullptr : init->srq;
    ibv_qp_cap& cap = init->cap;
    if (initiator || target) {
        cap.max_recv_wr = 0;
        cap.max_recv_sge = 0;
    }
    if (target) cap = ibv_qp_cap{};
    UroceSrq* srq = ibsrq ? to_usrq(ibsrq) : nullptr;
    // With an SRQ the receive capabilities are ignored: the QP has no receive queue. An XRC
    // SRQ is found by the requests that name it, never attached to a QP.
    if ((!target && !belongs(send_cq, ibctx)) ||
        (!target && !initiator && !belongs(recv_cq, ibctx)) ||
        (srq && (srq->srq.context != ibctx || srq->xrcd)) ||
        (xrcd && xrcd->vxrcd.xrcd.context != ibctx) ||
        cap.max_send_wr > static_cast<uint32_t>(kMaxQpWr) ||
        (!srq && cap.max_recv_wr > static_cast<uint32_t>(kMaxQpWr)) ||
        cap.max_send_sge > static_cast<uint32_t>(kMaxSge) ||
        (!srq && cap.max_recv_sge > static_cast<uint32_t>(kMaxSge)) ||
        cap.max_inline_data > kMaxInline) {
        errno = EINVAL;
        return nullptr;
    }
    auto* ctx = to_uctx(ibctx);
    auto* qp = new (std::nothrow) UroceQp{};
    if (!qp) {
        errno = ENOMEM;
        return nullptr;
    }
    if (!qp->slot.acquire(ctx->state->qps, kMaxQp)) {
        delete qp;
        errno = EINVAL;  // as rxe's object pools answer when full
        return nullptr;
    }
    // The queues hold what was asked for (at least one entry); every QP takes the device's
    // SGE and inline limits, and the caller learns them through the written-back caps.
    transport::QpCaps caps;
    const bool sends = !target;
    const bool receives = !srq && !initiator && !target;
    caps.max_send_wr = sends ? (cap.max_send_wr ? cap.max_send_wr : 1) : 0;
    caps.max_recv_wr = receives ? (cap.max_recv_wr ? cap.max_recv_wr : 1) : 0;
    caps.max_send_sge = sends ? kMaxSge : 0;
    caps.max_recv_sge = receives ? kMaxSge : 0;
    caps.max_inline_data = sends ? kMaxInline : 0;
    qp->send_cq = send_cq ? to_ucq(send_cq) : nullptr;
    qp->recv_cq = recv_cq ? to_ucq(recv_cq) : nullptr;
    qp->sq_sig_all = init->sq_sig_all != 0;
    qp->srq = srq;
    transport::Engine& engine = *ctx->state->engine;
    uint32_t qpn = 0;
    try {
        qpn = engine.allocate_qpn();
        if (init->qp_type == IBV_QPT_UD) {
            qp->ud = std::make_shared<transport::UdQp>(engine, qpn, to_upd(pd)->id, caps,
                                                       qp->send_cq->queue, qp->recv_cq->queue,
                                                       &qp->vqp.qp, srq ? srq->queue : nullptr);
            engine.attach(qp->ud);
        } else if (init->qp_type == IBV_QPT_UC) {
            qp->uc = std::make_shared<transport::UcQp>(engine, qpn, to_upd(pd)->id, caps,
                                                       qp->send_cq->queue, qp->recv_cq->queue,
                                                       &qp->vqp.qp, srq ? srq->queue : nullptr);
            engine.attach(qp->uc);
        } else {
            const transport::XrcRole role = target      ? transport::XrcRole::Target
                                            : initiator ? transport::XrcRole::Initiator
                                                        : transport::XrcRole::None;
            qp->rc = std::make_shared<transport::RcQp>(engine, qpn, pd ? to_upd(pd)->id : 0, caps,
                                                       qp->send_cq ? qp->send_cq->queue : nullptr,
                                                       qp->recv_cq ? qp->recv_cq->queue : nullptr,
                                                       &qp->vqp.qp, srq ? srq->queue : nullptr,
                                                       role, xrcd ? xrcd->domain->id : 0);
            engine.attach(qp->rc);
        }
    } catch (...) {
        if (qpn) engine.detach(qpn);  // gives the reserved QPN back
        delete qp;
        errno = ENOMEM;
        return nullptr;
    }
    if (!ctx->state->live_qps.add(qp)) {
        engine.detach(qpn);
        delete qp;
        errno = ENOMEM;
        return nullptr;
    }
    if (pd) to_upd(pd)->users.fetch_add(1);
    if (qp->send_cq) qp->send_cq->qp_refs.fetch_add(1);
    if (qp->recv_cq) qp->recv_cq->qp_refs.fetch_add(1);
    if (srq) srq->qp_refs.fetch_add(1);
    if (xrcd) {
        qp->xrcd = xrcd->domain;
        qp->xrcd->users.fetch_add(1);
        set_qp_comp_mask(qp->vqp, VERBS_QP_XRCD);
        qp->vqp.xrcd = &xrcd->vxrcd;
    }

    // What libibverbs' kernel helpers would have filled in.
    ibv_qp& q = qp->vqp.qp;
    q.context = ibctx;
    q.qp_context = init->qp_context;
    q.pd = pd;
    q.send_cq = send_cq;
    q.recv_cq = recv_cq;
    q.srq = ibsrq;
    q.handle = qpn;
    q.qp_num = qpn;
    q.state = IBV_QPS_RESET;
    q.qp_type = init->qp_type;
    q.events_completed = 0;
    pthread_mutex_init(&q.mutex, nullptr);
    pthread_cond_init(&q.cond, nullptr);

    qp->attr.qp_state = IBV_QPS_RESET;
    qp->attr.cur_qp_state = IBV_QPS_RESET;
    qp->attr.path_mtu = mtu_enum(ctx->state->device->config.mtu);
    qp->attr.path_mig_state = IBV_MIG_MIGRATED;
    qp->attr.port_num = 1;

    cap.max_send_wr = caps.max_send_wr;
    cap.max_recv_wr = caps.max_recv_wr;
    cap.max_send_sge = caps.max_send_sge;
    cap.max_recv_sge = caps.max_recv_sge;
    cap.max_inline_data = caps.max_inline_data;
    qp->attr.cap = cap;
    return &qp->vqp.qp;
}

int destroy_qp(ibv_qp* ibqp) noexcept {
    if (inherited(ibqp->context)) return 0;  // the parent's (fork_guard.h)
    auto* qp = to_uqp(ibqp);
    ContextState* st = to_uctx(ibqp->context)->state;
    st->live_qps.remove(qp);
    // After detach no packet, timer or transport event reaches the QP.
    st->engine->detach(ibqp->qp_num);
    qp->rc.reset();
    qp->uc.reset();
    qp->ud.reset();
    // Its completions still waiting leave the CQs, as on RESET (and as NICs clean their CQs
    // when a QP is destroyed): its number goes back to the pool, and a new QP that draws it
    // must not be reported work requests it never posted.
    remove_completions(*qp);
    // Events not yet read never will be; those the application has read it must acknowledge
    // before the QP goes (libibverbs' contract: a kernel provider waits the same way).
    st->async_events.retract(reinterpret_cast<uint64_t>(ibqp), &qp->events);
    wait_for_acks(&ibqp->mutex, &ibqp->cond, &ibqp->events_completed, qp->events.delivered);
    if (ibqp->pd) to_upd(ibqp->pd)->users.fetch_sub(1);
    if (qp->send_cq) qp->send_cq->qp_refs.fetch_sub(1);
    if (qp->recv_cq) qp->recv_cq->qp_refs.fetch_sub(1);
    if (qp->srq) qp->srq->qp_refs.fetch_sub(1);
    if (qp->xrcd) qp->xrcd->users.fetch_sub(1);
    pthread_cond_destroy(&ibqp->cond);
    pthread_mutex_destroy(&ibqp->mutex);
    delete qp;
    return 0;
}

void reclaim_qp(ContextState& st, UroceQp* qp) noexcept {
    st.engine->detach(qp->vqp.qp.qp_num);
    qp->rc.reset();
    qp->uc.reset();
    qp->ud.reset();
    pthread_cond_destroy(&qp->vqp.qp.cond);
    pthread_mutex_destroy(&qp->vqp.qp.mutex);
    delete qp;
}

int modify_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int mask) noexcept {
    if (inherited(ibqp->context)) return EIO;
    if (!attr) return EINVAL;
    mask &= ~ignored_attributes(ibqp->qp_type);
    auto* qp = to_uqp(ibqp);
    std::lock_guard lock(qp->attr_mutex);
    const QpState current = qp_state(*qp);
    QpState next;
    const int family = to_uctx(ibqp->context)->state->device->config.ip.family();
    if (int err = check_modify(ibqp->qp_type, current, *attr, mask, family, next)) return err;
    const uint32_t port_mtu = to_uctx(ibqp->context)->state->device->config.mtu;
    const int err = modify_attributes(
        qp->attr, *attr, mask, to_ibv(next), mtu_enum(port_mtu), [&](const ibv_qp_attr& a) {
            if (qp->ud) return modify_ud_qp(*qp, a, mask, current, next);
            const transport::QpAttributes t = to_transport(a, port_mtu);
            return qp->uc ? qp->uc->modify(t, current, next) : qp->rc->modify(t, current, next);
        });
    if (err == 0 && next == QpState::Reset && current != QpState::Reset) {
        // Completions of work requests the reset discarded (the flushes of an earlier ERR)
        // leave the CQs, as NICs clean their CQs on reset: after RESET -> RTS the application
        // must not poll stale completions of the QP's previous life.
        remove_completions(*qp);
    }
    return err;
}

int query_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int, ibv_qp_init_attr* init) noexcept {
    if (inherited(ibqp->context)) return EIO;
    if (!attr || !init) return EINVAL;
    auto* qp = to_uqp(ibqp);
    {
        std::lock_guard lock(qp->attr_mutex);
        *attr = qp->attr;
    }
    // The transport may have moved the QP to ERR on its own.
    const QpState s = qp_state(*qp);
    attr->qp_state = to_ibv(s);
    attr->cur_qp_state = attr->qp_state;
    // The PSNs in use, once the QP has them, as mlx5 and rxe report them.
    const transport::QpCommon::Psns psns = qp->ud   ? qp->ud->psns()
                                           : qp->uc ? qp->uc->psns()
                                                    : qp->rc->psns();
    if (psns.send) attr->sq_psn = *psns.send;
    if (psns.expected) attr->rq_psn = *psns.expected;
    // Draining while requests sent before SQD are in flight: UC and UD QPs have none once
    // there (their sends complete as they leave).
    attr->sq_draining = s == QpState::Sqd && qp->rc && qp->rc->sq_draining();
    attr->cap.max_inline_data = kMaxInline;
    *init = ibv_qp_init_attr{};
    init->qp_context = ibqp->qp_context;
    init->send_cq = ibqp->send_cq;
    init->recv_cq = ibqp->recv_cq;
    init->srq = ibqp->srq;
    init->cap = attr->cap;
    init->qp_type = ibqp->qp_type;
    init->sq_sig_all = qp->sq_sig_all;
    return 0;
}

int fill_send_wqe(const UroceQp& qp, const ibv_send_wr& wr, transport::SendWqe& w,
                  uint64_t& total) noexcept {
    const bool is_inline = wr.send_flags & IBV_SEND_INLINE;
    if (wr.num_sge < 0 || wr.num_sge > kMaxSge || (wr.num_sge > 0 && !wr.sg_list)) return EINVAL;
    total = 0;
    for (int i = 0; i < wr.num_sge; ++i) total += wr.sg_list[i].length;
    if (is_inline && total > kMaxInline) return EINVAL;
    w.wr_id = wr.wr_id;
    w.signaled = qp.sq_sig_all || (wr.send_flags & IBV_SEND_SIGNALED);
    w.solicited = wr.send_flags & IBV_SEND_SOLICITED;
    w.is_inline = is_inline;
    // Longer than a QP takes is refused by the caller or the QP; the sum must not wrap here.
    w.length = total > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(total);
    w.imm = ntohl(wr.imm_data);
    if (is_inline) {
        // Inline data is copied now, so the caller may reuse its buffer at once.
        uint32_t off = 0;
        for (int i = 0; i < wr.num_sge; ++i) {
            std::memcpy(w.inline_data.data() + off,
                        reinterpret_cast<const void*>(wr.sg_list[i].addr), wr.sg_list[i].length);
            off += wr.sg_list[i].length;
        }
    } else {
        w.sgl.count = static_cast<uint32_t>(wr.num_sge);
        for (int i = 0; i < wr.num_sge; ++i)
            w.sgl.sge[i] = {wr.sg_list[i].addr, wr.sg_list[i].length, wr.sg_list[i].lkey};
    }
    return 0;
}

namespace {

// Sends what the QP queued with `more` (a post refused part-way).
void ring_queued(UroceQp& qp) {
    if (qp.rc) qp.rc->ring();
    if (qp.uc) qp.uc->ring();
    if (qp.ud) qp.ud->ring();
}

}  // namespace

int build_send_wqe(ibv_qp* ibqp, const UroceQp& qp, ibv_send_wr& wr,
                   transport::SendWqe& w) noexcept {
    int err = 0;
    switch (wr.opcode) {
        case IBV_WR_SEND:
            w.opcode = transport::SendOpcode::Send;
            break;
        case IBV_WR_SEND_WITH_IMM:
            w.opcode = transport::SendOpcode::SendWithImm;
            break;
        case IBV_WR_RDMA_WRITE:
            w.opcode = transport::SendOpcode::RdmaWrite;
            break;
        case IBV_WR_RDMA_WRITE_WITH_IMM:
            w.opcode = transport::SendOpcode::RdmaWriteWithImm;
            break;
        case IBV_WR_RDMA_READ:
            w.opcode = transport::SendOpcode::RdmaRead;
            break;
        case IBV_WR_ATOMIC_CMP_AND_SWP:
            w.opcode = transport::SendOpcode::AtomicCmpSwap;
            break;
        case IBV_WR_ATOMIC_FETCH_AND_ADD:
            w.opcode = transport::SendOpcode::AtomicFetchAdd;
            break;
        case IBV_WR_SEND_WITH_INV:
            w.opcode = transport::SendOpcode::SendWithInv;
            w.rkey = wr.invalidate_rkey;
            break;
        case IBV_WR_LOCAL_INV:
            w.opcode = transport::SendOpcode::LocalInv;
            w.rkey = wr.invalidate_rkey;
            break;
        case IBV_WR_ATOMIC_WRITE:
            // RC only (no XRC opcode exists for it): 8 bytes, inline or from a registered
            // buffer, to an 8-byte aligned target.
            w.opcode = transport::SendOpcode::AtomicWrite;
            if (ibqp->qp_type != IBV_QPT_RC) err = EINVAL;
            break;
        case IBV_WR_BIND_MW:
            w.opcode = transport::SendOpcode::BindMw;
            err = mw_bind_wqe(ibqp, wr.bind_mw.mw, wr.bind_mw.rkey, wr.bind_mw.bind_info,
                              IBV_MW_TYPE_2, w.bind);
            break;
        default:
            err = EINVAL;
            break;
    }
    // Local operations carry no data.
    if (!err && transport::is_local_op(w.opcode) && wr.num_sge != 0) err = EINVAL;
    const bool is_inline = wr.send_flags & IBV_SEND_INLINE;
    if (!err && is_inline && w.opcode == transport::SendOpcode::RdmaRead) err = EINVAL;
    uint64_t total = 0;
    if (!err) err = fill_send_wqe(qp, wr, w, total);
    if (!err && total > kMaxMessage) err = EINVAL;
    // An atomic returns 8 bytes into a registered buffer, from an 8-byte aligned target.
    if (!err && transport::is_atomic(w.opcode) &&
        (is_inline || total != 8 || wr.wr.atomic.remote_addr % 8 != 0))
        err = EINVAL;
    if (!err && w.opcode == transport::SendOpcode::AtomicWrite &&
        (total != 8 || wr.wr.rdma.remote_addr % 8 != 0))
        err = EINVAL;
    if (err) return err;
    w.fence = wr.send_flags & IBV_SEND_FENCE;
    if (transport::is_atomic(w.opcode)) {
        w.remote_addr = wr.wr.atomic.remote_addr;
        w.rkey = wr.wr.atomic.rkey;
        w.compare_add = wr.wr.atomic.compare_add;
        w.swap = wr.wr.atomic.swap;
    } else if (w.opcode != transport::SendOpcode::Send &&
               w.opcode != transport::SendOpcode::SendWithImm &&
               w.opcode != transport::SendOpcode::SendWithInv &&
               !transport::is_local_op(w.opcode)) {
        w.remote_addr = wr.wr.rdma.remote_addr;
        w.rkey = wr.wr.rdma.rkey;
    }
    w.remote_srqn = wr.qp_type.xrc.remote_srqn;
    return 0;
}

int post_send(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad_wr) noexcept {
    if (inherited(ibqp->context)) {
        *bad_wr = wr;
        return EIO;
    }
    auto* qp = to_uqp(ibqp);
    std::unique_lock post_lock(qp->post_mutex, std::defer_lock);
    if (qp->batch) post_lock.lock();
    if (qp->ud) return post_send_ud(*qp, wr, bad_wr);
    // WQEs queued with `more` go out with the last one, or here when a WQE is refused.
    auto& engine = *to_uctx(ibqp->context)->state->engine;
    auto refuse = [&](ibv_send_wr* bad, int err) {
        ring_queued(*qp);
        engine.note_post();
        *bad_wr = bad;
        return err;
    };
    for (; wr; wr = wr->next) {
        transport::SendWqe w;
        if (int err = build_send_wqe(ibqp, *qp, *wr, w)) return refuse(wr, err);
        if (int e = qp->uc ? qp->uc->post_send(w, wr->next != nullptr)
                           : qp->rc->post_send(w, wr->next != nullptr))
            return refuse(wr, e);
        // The window answers to its new rkey from now on (the bind runs in queue order).
        if (w.opcode == transport::SendOpcode::BindMw) wr->bind_mw.mw->rkey = w.bind.new_rkey;
    }
    engine.note_post();
    return 0;
}

int post_send_all(ibv_qp* ibqp, ibv_send_wr* wr, size_t count,
                  std::vector<BuiltSend>& built) noexcept {
    if (inherited(ibqp->context)) return EIO;
    auto* qp = to_uqp(ibqp);
    std::lock_guard post_lock(qp->post_mutex);
    try {
        built.resize(count);
    } catch (...) {
        return ENOMEM;
    }
    size_t n = 0;
    for (; wr && n < count; wr = wr->next, ++n) {
        BuiltSend& b = built[n];
        b.wqe = transport::SendWqe{};
        b.wr = wr;
        if (int err = qp->ud ? build_ud_wqe(*qp, *wr, b.wqe, b.dest)
                             : build_send_wqe(ibqp, *qp, *wr, b.wqe))
            return err;
    }
    // An RC (or XRC) send queue refuses a post for want of room; UC and UD QPs send as they
    // post, and hold posts back only in SQD.
    const size_t room = qp->rc   ? qp->rc->send_room()
                        : qp->uc ? qp->uc->send_room()
                                 : qp->ud->send_room();
    if (room < n) return ENOMEM;
    auto& engine = *to_uctx(ibqp->context)->state->engine;
    int err = 0;
    for (size_t i = 0; i < n && !err; ++i) {
        const bool more = i + 1 < n;
        BuiltSend& b = built[i];
        err = qp->ud   ? qp->ud->post_send(b.wqe, b.dest, more)
              : qp->uc ? qp->uc->post_send(b.wqe, more)
                       : qp->rc->post_send(b.wqe, more);
        // The window answers to its new rkey from now on (the bind runs in queue order).
        if (!err && b.wqe.opcode == transport::SendOpcode::BindMw)
            b.wr->bind_mw.mw->rkey = b.wqe.bind.new_rkey;
    }
    // Only a QP that changed state since the checks refuses here (or another thread posting
    // to it at once): WQEs queued with `more` go out now.
    if (err) ring_queued(*qp);
    engine.note_post();
    return err;
}

int post_recv(ibv_qp* ibqp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) noexcept {
    if (inherited(ibqp->context)) {
        *bad_wr = wr;
        return EIO;
    }
    auto* qp = to_uqp(ibqp);
    for (; wr; wr = wr->next) {
        transport::RecvWqe r;
        int e = to_recv_wqe(*wr, r);
        if (e == 0)
            e = qp->ud   ? qp->ud->post_recv(r)
                : qp->uc ? qp->uc->post_recv(r)
                         : qp->rc->post_recv(r);
        if (e) {
            *bad_wr = wr;
            return e;
        }
    }
    return 0;
}

}  // namespace uroce::provider
