// Memory windows (ibv_alloc_mw, ibv_bind_mw for type 1, IBV_WR_BIND_MW for type 2): an rkey
// for part of a registered region with rights of its own, kept in the engine's memory table.
#include <cerrno>
#include <new>

#include "provider/device_limits.h"
#include "provider/objects.h"

namespace uroce::provider {

ibv_mw* alloc_mw(ibv_pd* pd, ibv_mw_type type) noexcept {
    if (inherited(pd->context)) {
        errno = EIO;
        return nullptr;
    }
    if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) {
        errno = EINVAL;
        return nullptr;
    }
    auto* mw = new (std::nothrow) UroceMw{};
    if (!mw) {
        errno = ENOMEM;
        return nullptr;
    }
    ContextState& st = *to_uctx(pd->context)->state;
    if (!mw->slot.acquire(st.mws, kMaxMw)) {
        delete mw;
        errno = ENOMEM;
        return nullptr;
    }
    try {
        mw->mw.rkey = st.engine->memory().add_window(to_upd(pd)->id, type == IBV_MW_TYPE_2);
    } catch (...) {
        delete mw;
        errno = ENOMEM;
        return nullptr;
    }
    if (!st.live_mws.add(mw)) {
        st.engine->memory().remove_window(mw->mw.rkey);
        delete mw;
        errno = ENOMEM;
        return nullptr;
    }
    mw->mw.context = pd->context;
    mw->mw.pd = pd;
    mw->mw.type = type;
    mw->mw.handle = mw->mw.rkey >> 8;
    to_upd(pd)->users.fetch_add(1);
    return &mw->mw;
}

int dealloc_mw(ibv_mw* ibmw) noexcept {
    if (inherited(ibmw->context)) return 0;  // the parent's (fork_guard.h)
    auto* mw = reinterpret_cast<UroceMw*>(ibmw);
    ContextState& st = *to_uctx(ibmw->context)->state;
    st.live_mws.remove(mw);
    // Takes effect at once, as deregistering a region does: its rkey grants nothing more.
    st.engine->memory().remove_window(ibmw->rkey);
    to_upd(ibmw->pd)->users.fetch_sub(1);
    delete mw;
    return 0;
}

void reclaim_mw(ContextState& st, UroceMw* mw) noexcept {
    st.engine->memory().remove_window(mw->mw.rkey);
    delete mw;
}

int mw_bind_wqe(ibv_qp* qp, ibv_mw* mw, uint32_t new_rkey, const ibv_mw_bind_info& info,
                ibv_mw_type type, transport::MwBind& out) noexcept {
    if (!mw || mw->context != qp->context || mw->type != type || (new_rkey >> 8) != (mw->rkey >> 8))
        return EINVAL;
    constexpr uint32_t kGrantable =
        IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    // Zero-based windows are not offered; a bind of length 0 unbinds (type 1 invalidation).
    if ((info.mw_access_flags & ~(kGrantable | IBV_ACCESS_LOCAL_WRITE)) ||
        (info.length && (!info.mr || info.mr->context != qp->context)))
        return EINVAL;
    out = transport::MwBind{};
    out.mw_rkey = mw->rkey;
    out.new_rkey = new_rkey;
    out.mr_lkey = info.mr ? info.mr->lkey : 0;
    out.addr = info.addr;
    out.length = info.length;
    if (info.mw_access_flags & IBV_ACCESS_REMOTE_WRITE) out.access |= transport::kRemoteWrite;
    if (info.mw_access_flags & IBV_ACCESS_REMOTE_READ) out.access |= transport::kRemoteRead;
    if (info.mw_access_flags & IBV_ACCESS_REMOTE_ATOMIC) out.access |= transport::kRemoteAtomic;
    return 0;
}

int bind_mw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* bind) noexcept {
    if (inherited(qp->context)) return EIO;
    if (!bind || qp->qp_type != IBV_QPT_RC) return EINVAL;
    // Type 1: the provider picks the next key byte (as ibv_inc_rkey does).
    const uint32_t new_rkey = (mw ? (mw->rkey & 0xffffff00u) | ((mw->rkey + 1) & 0xffu) : 0);
    transport::SendWqe w;
    w.opcode = transport::SendOpcode::BindMw;
    if (int e = mw_bind_wqe(qp, mw, new_rkey, bind->bind_info, IBV_MW_TYPE_1, w.bind)) return e;
    auto* uqp = to_uqp(qp);
    w.wr_id = bind->wr_id;
    w.signaled = uqp->sq_sig_all || (bind->send_flags & IBV_SEND_SIGNALED);
    w.fence = bind->send_flags & IBV_SEND_FENCE;
    std::unique_lock post_lock(uqp->post_mutex, std::defer_lock);
    if (uqp->batch) post_lock.lock();
    if (int e = uqp->rc->post_send(w)) return e;
    mw->rkey = new_rkey;
    return 0;
}

}  // namespace uroce::provider
