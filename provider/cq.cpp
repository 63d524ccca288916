// Completion queues, their completion events and the work completions they return.
#include <arpa/inet.h>

#include <cerrno>
#include <new>

#include "provider/device_limits.h"
#include "provider/objects.h"

namespace uroce::provider {

ibv_wc_status wc_status(transport::WcStatus s) {
    using S = transport::WcStatus;
    switch (s) {
        case S::Success:
            return IBV_WC_SUCCESS;
        case S::LocLenErr:
            return IBV_WC_LOC_LEN_ERR;
        case S::LocQpOpErr:
            return IBV_WC_LOC_QP_OP_ERR;
        case S::LocProtErr:
            return IBV_WC_LOC_PROT_ERR;
        case S::WrFlushErr:
            return IBV_WC_WR_FLUSH_ERR;
        case S::BadResp:
            return IBV_WC_BAD_RESP_ERR;
        case S::RemInvReqErr:
            return IBV_WC_REM_INV_REQ_ERR;
        case S::RemAccessErr:
            return IBV_WC_REM_ACCESS_ERR;
        case S::RemOpErr:
            return IBV_WC_REM_OP_ERR;
        case S::RetryExcErr:
            return IBV_WC_RETRY_EXC_ERR;
        case S::RnrRetryExcErr:
            return IBV_WC_RNR_RETRY_EXC_ERR;
        case S::MwBindErr:
            return IBV_WC_MW_BIND_ERR;
        case S::GeneralErr:
            return IBV_WC_GENERAL_ERR;
    }
    return IBV_WC_GENERAL_ERR;
}

ibv_wc_opcode wc_opcode(transport::WcOpcode op) {
    using O = transport::WcOpcode;
    switch (op) {
        case O::Send:
            return IBV_WC_SEND;
        case O::RdmaWrite:
            return IBV_WC_RDMA_WRITE;
        case O::RdmaRead:
            return IBV_WC_RDMA_READ;
        case O::CompSwap:
            return IBV_WC_COMP_SWAP;
        case O::FetchAdd:
            return IBV_WC_FETCH_ADD;
        case O::BindMw:
            return IBV_WC_BIND_MW;
        case O::LocalInv:
            return IBV_WC_LOCAL_INV;
        case O::Recv:
            return IBV_WC_RECV;
        case O::RecvRdmaWithImm:
            return IBV_WC_RECV_RDMA_WITH_IMM;
        case O::AtomicWrite:
            return IBV_WC_ATOMIC_WRITE;
    }
    return IBV_WC_SEND;
}

// RoCE packets carry no SL; for a UD receive ConnectX NICs (mlx5) report the packet's L3 header
// type in sl instead (0 GRH, 1 IPv6, 2 IPv4). UCX's ud_verbs (up to 1.18) reads the destination
// address out of the GRH area by it and, given 0 (rxe's value), drops every datagram. A device
// receives in its own family only. 1 and 2 are also valid SLs for an AH made from the
// completion (ibv_create_ah_from_wc copies sl).
constexpr uint8_t kRoceL3HeaderIpv6 = 1;
constexpr uint8_t kRoceL3HeaderIpv4 = 2;

uint8_t wc_sl(const transport::Completion& c, bool ipv6) {
    if (!c.with_grh) return 0;
    return ipv6 ? kRoceL3HeaderIpv6 : kRoceL3HeaderIpv4;
}

UroceCq* new_cq(ibv_context* ibctx, int cqe, ibv_comp_channel* channel, int comp_vector) noexcept {
    if (inherited(ibctx)) {
        errno = EIO;
        return nullptr;
    }
    if (cqe < 1 || cqe > kMaxCqe || comp_vector < 0 || comp_vector >= kNumCompVectors) {
        errno = EINVAL;
        return nullptr;
    }
    std::shared_ptr<CompChannel> chan;
    if (channel) {
        chan = comp_channel_lookup(channel->fd);
        if (!chan) {
            // Not a channel uroce made (or one already closed).
            errno = EINVAL;
            return nullptr;
        }
    }
    auto* cq = new (std::nothrow) UroceCq{};
    if (!cq) {
        errno = ENOMEM;
        return nullptr;
    }
    auto* ctx = to_uctx(ibctx);
    cq->ipv6 = !ctx->state->device->config.ip.is_v4();
    if (!cq->slot.acquire(ctx->state->cqs, kMaxCq)) {
        delete cq;
        errno = EINVAL;  // as rxe's object pools answer when full
        return nullptr;
    }
    const uint64_t handle = reinterpret_cast<uint64_t>(&cq->vcq.cq);
    try {
        std::weak_ptr<CompChannel> weak = chan;
        cq->queue = std::make_shared<transport::CompletionQueue>(
            static_cast<uint32_t>(cqe),
            [weak, handle] {
                if (auto c = weak.lock()) c->notify(handle);
            },
            [ctx, handle] { post_async_event(ctx, IBV_EVENT_CQ_ERR, handle); });
    } catch (...) {
        delete cq;
        errno = ENOMEM;
        return nullptr;
    }
    if (!ctx->state->live_cqs.add(cq)) {
        delete cq;
        errno = ENOMEM;
        return nullptr;
    }
    cq->channel = std::move(chan);
    cq->vcq.cq.cqe = cqe;
    return cq;
}

ibv_cq* create_cq(ibv_context* ibctx, int cqe, ibv_comp_channel* channel,
                  int comp_vector) noexcept {
    UroceCq* cq = new_cq(ibctx, cqe, channel, comp_vector);
    return cq ? &cq->vcq.cq : nullptr;
}

int destroy_cq(ibv_cq* ibcq) noexcept {
    if (inherited(ibcq->context)) return 0;  // the parent's (fork_guard.h)
    auto* cq = to_ucq(ibcq);
    if (cq->qp_refs.load() > 0) return EBUSY;
    // As for QPs: unread CQ error events are taken back, read ones must be acknowledged.
    to_uctx(ibcq->context)
        ->state->async_events.retract(reinterpret_cast<uint64_t>(ibcq), &cq->events);
    // Completion events still queued for this CQ must never reach the application...
    uint32_t comp_delivered = cq->comp_events_delivered.load();
    if (cq->channel) {
        // ...and those it read from the channel's fd are counted there, as the kernel counts
        // them when they leave its queue (a reader between read() and the cq_event op is
        // then waited for too).
        uint64_t taken = 0;
        cq->channel->purge(reinterpret_cast<uint64_t>(ibcq), &taken);
        comp_delivered = static_cast<uint32_t>(taken);
    }
    // Delivered events must be acknowledged first (ibv_ack_cq_events), as the kernel
    // requires: an application that never acknowledges them blocks here, as it would there.
    wait_for_acks(&ibcq->mutex, &ibcq->cond, &ibcq->async_events_completed, cq->events.delivered);
    wait_for_acks(&ibcq->mutex, &ibcq->cond, &ibcq->comp_events_completed, comp_delivered);
    to_uctx(ibcq->context)->state->live_cqs.remove(cq);
    delete cq;
    return 0;
}

void reclaim_cq(UroceCq* cq) noexcept {
    // The channel may outlive the context: it must not hand out events for a freed CQ.
    if (cq->channel) cq->channel->purge(reinterpret_cast<uint64_t>(&cq->vcq.cq));
    delete cq;
}

int poll_cq(ibv_cq* ibcq, int n, ibv_wc* wc) noexcept {
    if (inherited(ibcq->context)) return -EIO;
    if (n <= 0) return n < 0 ? -EINVAL : 0;
    auto* cq = to_ucq(ibcq);
    // An empty queue: do the receive work here rather than wait for the engine thread. (Events
    // are not held back here, unlike ibv_start_poll: an armed CQ signals every completion that
    // reaches it, as hardware does, and ibv_poll_cq users take an empty CQ after an event.)
    to_uctx(ibcq->context)->state->engine->on_cq_poll(cq->queue->depth() == 0);
    constexpr int kChunk = 32;
    transport::Completion c[kChunk];
    int total = 0;
    while (total < n) {
        const size_t want = static_cast<size_t>(std::min(kChunk, n - total));
        const size_t got = cq->queue->poll(std::span(c, want));
        for (size_t i = 0; i < got; ++i) {
            ibv_wc& w = wc[total + static_cast<int>(i)];
            w = ibv_wc{};
            w.wr_id = c[i].wr_id;
            w.status = wc_status(c[i].status);
            w.opcode = wc_opcode(c[i].opcode);
            w.vendor_err = 0;
            w.byte_len = c[i].byte_len;
            w.qp_num = c[i].qp_num;
            w.src_qp = c[i].src_qp;
            w.pkey_index = 0;
            w.sl = wc_sl(c[i], cq->ipv6);
            if (c[i].with_grh) w.wc_flags |= IBV_WC_GRH;
            if (c[i].with_inv) {
                w.wc_flags |= IBV_WC_WITH_INV;
                w.invalidated_rkey = c[i].imm;
            }
            if (c[i].with_imm) {
                w.wc_flags |= IBV_WC_WITH_IMM;
                w.imm_data = htonl(c[i].imm);
            }
        }
        total += static_cast<int>(got);
        if (got < want) break;
    }
    if (total > 0) to_uctx(ibcq->context)->state->engine->note_completions_taken();
    return total;
}

int resize_cq(ibv_cq* ibcq, int cqe) noexcept {
    if (inherited(ibcq->context)) return EIO;
    if (cqe < 1 || cqe > kMaxCqe) return EINVAL;
    // Completions waiting stay; a size below their number is refused.
    if (int e = to_ucq(ibcq)->queue->resize(static_cast<uint32_t>(cqe))) return e;
    ibcq->cqe = cqe;
    return 0;
}

int req_notify_cq(ibv_cq* ibcq, int solicited_only) noexcept {
    if (inherited(ibcq->context)) return EIO;
    to_ucq(ibcq)->queue->arm(solicited_only != 0);
    to_uctx(ibcq->context)->state->engine->note_cq_armed();
    return 0;
}

void cq_event(ibv_cq* ibcq) noexcept {
    if (inherited(ibcq->context)) return;
    auto* cq = to_ucq(ibcq);
    cq->comp_events_delivered.fetch_add(1);
    // ibv_get_cq_event just made room in the channel's fd: records held back while it was
    // full follow now.
    if (cq->channel) cq->channel->refill();
}

}  // namespace uroce::provider
