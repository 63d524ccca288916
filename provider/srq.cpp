// Shared receive queues: ibv_create_srq and friends, over transport::SharedReceiveQueue.
//
// QPs created with `srq` take their receive WQEs from it (RcQp's receive source); the limit
// event reaches the application as IBV_EVENT_SRQ_LIMIT_REACHED on the context's async queue.
#include <pthread.h>

#include <cerrno>
#include <new>
#include <optional>

#include "provider/device_limits.h"
#include "provider/objects.h"

namespace uroce::provider {

int to_recv_wqe(const ibv_recv_wr& wr, transport::RecvWqe& out) noexcept {
    if (wr.num_sge < 0 || wr.num_sge > kMaxSge || (wr.num_sge > 0 && !wr.sg_list)) return EINVAL;
    out = transport::RecvWqe{};
    out.wr_id = wr.wr_id;
    out.sgl.count = static_cast<uint32_t>(wr.num_sge);
    for (int i = 0; i < wr.num_sge; ++i)
        out.sgl.sge[i] = {wr.sg_list[i].addr, wr.sg_list[i].length, wr.sg_list[i].lkey};
    return 0;
}

ibv_srq* create_srq(ibv_pd* pd, ibv_srq_init_attr* init) noexcept {
    return new_srq(pd, init, nullptr, nullptr);
}

ibv_srq* new_srq(ibv_pd* pd, ibv_srq_init_attr* init, UroceXrcd* xrcd, UroceCq* cq) noexcept {
    if (inherited(pd->context)) {
        errno = EIO;
        return nullptr;
    }
    if (!init || init->attr.max_wr == 0 || init->attr.max_wr > static_cast<uint32_t>(kMaxSrqWr) ||
        init->attr.max_sge > static_cast<uint32_t>(kMaxSge)) {
        errno = EINVAL;
        return nullptr;
    }
    auto* ctx = to_uctx(pd->context);
    auto* srq = new (std::nothrow) UroceSrq{};
    if (!srq) {
        errno = ENOMEM;
        return nullptr;
    }
    if (!srq->slot.acquire(ctx->state->srqs, kMaxSrq)) {
        delete srq;
        errno = EINVAL;  // as rxe's object pools answer when full
        return nullptr;
    }
    // At least one SGE per WQE, as the QPs' own queues have.
    const uint32_t max_sge = init->attr.max_sge ? init->attr.max_sge : 1;
    const uint64_t handle = reinterpret_cast<uint64_t>(&srq->srq);
    transport::Engine& engine = *ctx->state->engine;
    transport::XrcSrqBinding xrc;
    try {
        if (xrcd) {
            xrc.srqn = engine.allocate_srqn();
            xrc.xrcd = xrcd->domain->id;
            xrc.cq = cq->queue;
            // The CQ stays busy (EBUSY on destroy) until the queue itself goes: a target QP in
            // the middle of a message may hold the queue a little longer than the SRQ lives.
            cq->qp_refs.fetch_add(1);
            xrc.cq_hold = std::shared_ptr<void>(
                cq, [](void* p) { static_cast<UroceCq*>(p)->qp_refs.fetch_sub(1); });
        }
        // srq_limit is not armed here: ibv_create_srq ignores it (ibv_modify_srq arms it).
        srq->queue = std::make_shared<transport::SharedReceiveQueue>(
            to_upd(pd)->id, init->attr.max_wr, max_sge,
            [ctx, handle] { post_async_event(ctx, IBV_EVENT_SRQ_LIMIT_REACHED, handle); }, xrc);
    } catch (...) {
        if (xrc.srqn) engine.detach_xrc_srq(xrc.srqn);
        delete srq;
        errno = ENOMEM;
        return nullptr;
    }
    if (!ctx->state->live_srqs.add(srq)) {
        if (xrc.srqn) engine.detach_xrc_srq(xrc.srqn);
        delete srq;
        errno = ENOMEM;
        return nullptr;
    }
    if (xrcd) {
        srq->xrcd = xrcd->domain;
        srq->xrcd->users.fetch_add(1);
        srq->cq = cq;
        // From now on requests can name it.
        engine.attach_xrc_srq(srq->queue);
    }
    to_upd(pd)->users.fetch_add(1);
    ibv_srq& s = srq->srq;
    s.context = pd->context;
    s.srq_context = init->srq_context;
    s.pd = pd;
    s.handle = static_cast<uint32_t>(handle);
    s.events_completed = 0;
    pthread_mutex_init(&s.mutex, nullptr);
    pthread_cond_init(&s.cond, nullptr);
    init->attr.max_sge = max_sge;
    init->attr.srq_limit = 0;
    return &s;
}

int modify_srq(ibv_srq* ibsrq, ibv_srq_attr* attr, int mask) noexcept {
    if (inherited(ibsrq->context)) return EIO;
    if (!attr || (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT))) return EINVAL;
    transport::SharedReceiveQueue& q = *to_usrq(ibsrq)->queue;
    if ((mask & IBV_SRQ_MAX_WR) && attr->max_wr > static_cast<uint32_t>(kMaxSrqWr)) return EINVAL;
    // Growing always works; shrinking only down to what is queued now. Both attributes at
    // once change together or not at all (ibv_modify_srq(3)).
    std::optional<uint32_t> max_wr, limit;
    if (mask & IBV_SRQ_MAX_WR) max_wr = attr->max_wr;
    if (mask & IBV_SRQ_LIMIT) limit = attr->srq_limit;
    return q.modify(max_wr, limit);
}

int query_srq(ibv_srq* ibsrq, ibv_srq_attr* attr) noexcept {
    if (inherited(ibsrq->context)) return EIO;
    if (!attr) return EINVAL;
    const transport::SharedReceiveQueue& q = *to_usrq(ibsrq)->queue;
    attr->max_wr = q.capacity();
    attr->max_sge = q.max_sge();
    attr->srq_limit = q.limit();
    return 0;
}

int destroy_srq(ibv_srq* ibsrq) noexcept {
    if (inherited(ibsrq->context)) return 0;  // the parent's (fork_guard.h)
    auto* srq = to_usrq(ibsrq);
    // A QP still takes WQEs from it (the kernel refuses the same way).
    if (srq->qp_refs.load() > 0) return EBUSY;
    ContextState* st = to_uctx(ibsrq->context)->state;
    // No QP is attached, so no limit event can come any more: take back the unread ones and
    // wait for the acknowledgement of those read.
    // An XRC SRQ first stops being found by new requests (a target QP in the middle of a
    // message keeps the queue alive until it is done with it).
    if (srq->xrcd) {
        st->engine->detach_xrc_srq(srq->queue->xrc().srqn);
        srq->queue->close();
    }
    st->async_events.retract(reinterpret_cast<uint64_t>(ibsrq), &srq->events);
    wait_for_acks(&ibsrq->mutex, &ibsrq->cond, &ibsrq->events_completed, srq->events.delivered);
    st->live_srqs.remove(srq);
    to_upd(ibsrq->pd)->users.fetch_sub(1);
    if (srq->xrcd) srq->xrcd->users.fetch_sub(1);
    pthread_cond_destroy(&ibsrq->cond);
    pthread_mutex_destroy(&ibsrq->mutex);
    delete srq;
    return 0;
}

void reclaim_srq(UroceSrq* srq) noexcept {
    pthread_cond_destroy(&srq->srq.cond);
    pthread_mutex_destroy(&srq->srq.mutex);
    delete srq;
}

int post_srq_recv(ibv_srq* ibsrq, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) noexcept {
    if (inherited(ibsrq->context)) {
        *bad_wr = wr;
        return EIO;
    }
    transport::SharedReceiveQueue& q = *to_usrq(ibsrq)->queue;
    for (; wr; wr = wr->next) {
        transport::RecvWqe r;
        int e = to_recv_wqe(*wr, r);
        if (e == 0) e = q.post(r);
        if (e) {
            *bad_wr = wr;
            return e;
        }
    }
    return 0;
}

}  // namespace uroce::provider
