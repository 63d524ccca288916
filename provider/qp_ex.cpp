// ibv_create_qp_ex and the ibv_wr_* send API. A batch of work requests builds up between
// wr_start and wr_complete as ordinary ibv_send_wr (inline data copied at once, as the API
// allows the caller to reuse its buffer), and wr_complete posts it through post_send_all, so
// both APIs share one set of checks (the WQE builders) and one path into the transport. A bad
// request (too many SGEs, inline data too long, an opcode the QP was not created for) fails the
// whole batch at wr_complete, with nothing posted.
#include <cerrno>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "provider/device_limits.h"
#include "provider/objects.h"
#include "provider/qp_ex_layout.h"

namespace uroce::provider {

struct WrBatch {
    // Where one request's SGEs and inline bytes lie in the batch's flat arrays. Only the newest
    // request can be changed, so its pieces are always at the arrays' ends.
    struct Pieces {
        size_t sge_first = 0;
        size_t inline_first = 0;  // its copy of inline data, if `inline_sge`
        bool inline_sge = false;  // its one SGE points into inline_bytes (fixed up at the end)
    };
    // Every container keeps its capacity from batch to batch: a request allocates nothing
    // once the batches have been as large before (perftest posts through this API).
    std::vector<ibv_send_wr> wrs;
    std::vector<Pieces> pieces;         // one per request
    std::vector<ibv_sge> sges;          // all requests' SGEs, back to back
    std::vector<uint8_t> inline_bytes;  // copies of inline buffers, back to back
    std::vector<BuiltSend> built;       // post_send_all's scratch, kept
    uint64_t ops = 0;                   // IBV_QP_EX_WITH_* the QP was created with
    int error = 0;                      // first build error, reported by wr_complete
};

namespace {

WrBatch& batch_of(ibv_qp_ex* qpx) {
    return *reinterpret_cast<UroceQp*>(qpx)->batch;
}

void fail(WrBatch& b, int err) {
    if (!b.error) b.error = err;
}

// Starts a work request with `opcode`, if the QP was created for `op_flag`.
ibv_send_wr* begin(ibv_qp_ex* qpx, ibv_wr_opcode opcode, uint64_t op_flag) {
    WrBatch& b = batch_of(qpx);
    if (!(b.ops & op_flag)) {
        fail(b, EINVAL);
        return nullptr;
    }
    try {
        ibv_send_wr wr{};
        wr.wr_id = qpx->wr_id;
        wr.opcode = opcode;
        wr.send_flags = static_cast<int>(qpx->wr_flags);
        b.wrs.push_back(wr);
        b.pieces.push_back({b.sges.size(), b.inline_bytes.size(), false});
    } catch (...) {
        fail(b, ENOMEM);
        return nullptr;
    }
    return &b.wrs.back();
}

// The request the setters apply to, or nullptr (none started: the batch fails).
ibv_send_wr* current(ibv_qp_ex* qpx) {
    WrBatch& b = batch_of(qpx);
    if (b.wrs.empty()) {
        fail(b, EINVAL);
        return nullptr;
    }
    return &b.wrs.back();
}

void wr_start(ibv_qp_ex* qpx) {
    WrBatch& b = batch_of(qpx);
    b.wrs.clear();
    b.pieces.clear();
    b.sges.clear();
    b.inline_bytes.clear();
    b.error = 0;
}

void wr_abort(ibv_qp_ex* qpx) {
    wr_start(qpx);  // nothing was posted: dropping the batch is all
}

int wr_complete(ibv_qp_ex* qpx) {
    WrBatch& b = batch_of(qpx);
    int err = b.error;
    if (!err && !b.wrs.empty()) {
        for (size_t i = 0; i < b.wrs.size(); ++i) {
            const WrBatch::Pieces& p = b.pieces[i];
            const size_t end = i + 1 < b.pieces.size() ? b.pieces[i + 1].sge_first : b.sges.size();
            b.wrs[i].sg_list = end > p.sge_first ? &b.sges[p.sge_first] : nullptr;
            b.wrs[i].num_sge = static_cast<int>(end - p.sge_first);
            if (p.inline_sge)  // the copy's place is final only now
                b.sges[p.sge_first].addr =
                    reinterpret_cast<uint64_t>(b.inline_bytes.data() + p.inline_first);
            b.wrs[i].next = i + 1 < b.wrs.size() ? &b.wrs[i + 1] : nullptr;
        }
        // All or nothing (post_send stops at the first request it refuses, after it queued
        // those before it).
        err = post_send_all(&qpx->qp_base, b.wrs.data(), b.wrs.size(), b.built);
    }
    wr_start(qpx);
    return err;
}

void wr_send(ibv_qp_ex* qpx) {
    begin(qpx, IBV_WR_SEND, IBV_QP_EX_WITH_SEND);
}

void wr_send_imm(ibv_qp_ex* qpx, __be32 imm) {
    if (ibv_send_wr* wr = begin(qpx, IBV_WR_SEND_WITH_IMM, IBV_QP_EX_WITH_SEND_WITH_IMM))
        wr->imm_data = imm;
}

void wr_rdma_write(ibv_qp_ex* qpx, uint32_t rkey, uint64_t addr) {
    if (ibv_send_wr* wr = begin(qpx, IBV_WR_RDMA_WRITE, IBV_QP_EX_WITH_RDMA_WRITE))
        wr->wr.rdma = {addr, rkey};
}

void wr_rdma_write_imm(ibv_qp_ex* qpx, uint32_t rkey, uint64_t addr, __be32 imm) {
    if (ibv_send_wr* wr =
            begin(qpx, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM)) {
        wr->wr.rdma = {addr, rkey};
        wr->imm_data = imm;
    }
}

void wr_rdma_read(ibv_qp_ex* qpx, uint32_t rkey, uint64_t addr) {
    if (ibv_send_wr* wr = begin(qpx, IBV_WR_RDMA_READ, IBV_QP_EX_WITH_RDMA_READ))
        wr->wr.rdma = {addr, rkey};
}

void wr_atomic_cmp_swp(ibv_qp_ex* qpx, uint32_t rkey, uint64_t addr, uint64_t compare,
                       uint64_t swap) {
    if (ibv_send_wr* wr = begin(qpx, IBV_WR_ATOMIC_CMP_AND_SWP, IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP))
        wr->wr.atomic = {addr, compare, swap, rkey};
}

void wr_set_inline_data(ibv_qp_ex* qpx, void* addr, size_t length);

// The 8 bytes are copied now, as inline data is: the caller may reuse its buffer at once.
void wr_atomic_write(ibv_qp_ex* qpx, uint32_t rkey, uint64_t addr, const void* atomic_wr) {
    ibv_send_wr* wr = begin(qpx, IBV_WR_ATOMIC_WRITE, IBV_QP_EX_WITH_ATOMIC_WRITE);
    if (!wr) return;
    wr->wr.rdma = {addr, rkey};
    if (!atomic_wr) {
        fail(batch_of(qpx), EINVAL);
        return;
    }
    wr_set_inline_data(qpx, const_cast<void*>(atomic_wr), 8);
}

void wr_atomic_fetch_add(ibv_qp_ex* qpx, uint32_t rkey, uint64_t addr, uint64_t add) {
    if (ibv_send_wr* wr =
            begin(qpx, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD))
        wr->wr.atomic = {addr, add, 0, rkey};
}

void wr_send_inv(ibv_qp_ex* qpx, uint32_t invalidate_rkey) {
    if (ibv_send_wr* wr = begin(qpx, IBV_WR_SEND_WITH_INV, IBV_QP_EX_WITH_SEND_WITH_INV))
        wr->invalidate_rkey = invalidate_rkey;
}

void wr_local_inv(ibv_qp_ex* qpx, uint32_t invalidate_rkey) {
    if (ibv_send_wr* wr = begin(qpx, IBV_WR_LOCAL_INV, IBV_QP_EX_WITH_LOCAL_INV))
        wr->invalidate_rkey = invalidate_rkey;
}

void wr_bind_mw(ibv_qp_ex* qpx, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info* info) {
    ibv_send_wr* wr = begin(qpx, IBV_WR_BIND_MW, IBV_QP_EX_WITH_BIND_MW);
    if (!wr) return;
    if (!info) {
        fail(batch_of(qpx), EINVAL);
        return;
    }
    wr->bind_mw.mw = mw;
    wr->bind_mw.rkey = rkey;
    wr->bind_mw.bind_info = *info;
}

void wr_set_ud_addr(ibv_qp_ex* qpx, ibv_ah* ah, uint32_t remote_qpn, uint32_t remote_qkey) {
    if (ibv_send_wr* wr = current(qpx)) wr->wr.ud = {ah, remote_qpn, remote_qkey};
}

void wr_set_xrc_srqn(ibv_qp_ex* qpx, uint32_t remote_srqn) {
    if (ibv_send_wr* wr = current(qpx)) wr->qp_type.xrc.remote_srqn = remote_srqn;
}

void wr_set_sge_list(ibv_qp_ex* qpx, size_t num_sge, const ibv_sge* sg_list) {
    WrBatch& b = batch_of(qpx);
    if (!current(qpx)) return;
    if (num_sge > static_cast<size_t>(kMaxSge) || (num_sge && !sg_list)) {
        fail(b, EINVAL);
        return;
    }
    WrBatch::Pieces& p = b.pieces.back();
    try {
        b.sges.resize(p.sge_first);  // a second call replaces the first one's list
        b.sges.insert(b.sges.end(), sg_list, sg_list + num_sge);
        p.inline_sge = false;
    } catch (...) {
        fail(b, ENOMEM);
    }
}

void wr_set_sge(ibv_qp_ex* qpx, uint32_t lkey, uint64_t addr, uint32_t length) {
    const ibv_sge sge{addr, length, lkey};
    wr_set_sge_list(qpx, 1, &sge);
}

void wr_set_inline_data_list(ibv_qp_ex* qpx, size_t num_buf, const ibv_data_buf* bufs) {
    WrBatch& b = batch_of(qpx);
    ibv_send_wr* wr = current(qpx);
    if (!wr) return;
    size_t total = 0;
    for (size_t i = 0; i < num_buf; ++i) total += bufs[i].length;
    if (total > kMaxInline || (num_buf && !bufs)) {
        fail(b, EINVAL);
        return;
    }
    WrBatch::Pieces& p = b.pieces.back();
    try {
        b.inline_bytes.resize(p.inline_first + total);  // replaces an earlier call's copy
        size_t off = p.inline_first;
        for (size_t i = 0; i < num_buf; ++i) {
            if (bufs[i].length)
                std::memcpy(b.inline_bytes.data() + off, bufs[i].addr, bufs[i].length);
            off += bufs[i].length;
        }
        // Its address is set at wr_complete: the copies may still move as the batch grows.
        b.sges.resize(p.sge_first);
        b.sges.push_back(ibv_sge{0, static_cast<uint32_t>(total), 0});
        p.inline_sge = true;
        wr->send_flags |= IBV_SEND_INLINE;
    } catch (...) {
        fail(b, ENOMEM);
    }
}

void wr_set_inline_data(ibv_qp_ex* qpx, void* addr, size_t length) {
    const ibv_data_buf buf{addr, length};
    wr_set_inline_data_list(qpx, 1, &buf);
}

// What each QP type can be asked for.
constexpr uint64_t kRcOps = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
                            IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                            IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                            IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_BIND_MW |
                            IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_SEND_WITH_INV;
// ATOMIC WRITE has no XRC opcode: RC only.
constexpr uint64_t kRcOnlyOps = IBV_QP_EX_WITH_ATOMIC_WRITE;
constexpr uint64_t kUcOps = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
                            IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
constexpr uint64_t kUdOps = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;

}  // namespace

ibv_qp* create_qp_ex(ibv_context* ctx, ibv_qp_init_attr_ex* attr) noexcept {
    if (!attr) {
        errno = EINVAL;
        return nullptr;
    }
    // An XRC target belongs to an XRC domain and has no PD; every other QP has a PD.
    const bool target = attr->qp_type == IBV_QPT_XRC_RECV;
    if (target
            ? !(attr->comp_mask & IBV_QP_INIT_ATTR_XRCD) || !attr->xrcd ||
                  attr->xrcd->context != ctx
            : !(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd || attr->pd->context != ctx) {
        errno = EINVAL;
        return nullptr;
    }
    // RSS, TSO, create flags and the rest are not offered.
    if (attr->comp_mask &
        ~static_cast<uint32_t>(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS |
                               IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_XRCD)) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    if ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && attr->create_flags) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    uint64_t ops = 0;
    if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
        const uint64_t allowed = attr->qp_type == IBV_QPT_RC         ? kRcOps | kRcOnlyOps
                                 : attr->qp_type == IBV_QPT_XRC_SEND ? kRcOps
                                 : attr->qp_type == IBV_QPT_UC       ? kUcOps
                                 : attr->qp_type == IBV_QPT_UD       ? kUdOps
                                                                     : 0;
        if (attr->send_ops_flags & ~allowed) {
            errno = EOPNOTSUPP;  // bind/invalidate, TSO, ... (or not on this QP type)
            return nullptr;
        }
        ops = attr->send_ops_flags;
    }
    std::unique_ptr<WrBatch> batch;
    if (ops) {
        batch.reset(new (std::nothrow) WrBatch);
        if (!batch) {
            errno = ENOMEM;
            return nullptr;
        }
        batch->ops = ops;
    }
    // ibv_qp_init_attr_ex starts with the fields of ibv_qp_init_attr (libibverbs relies on
    // this too), so the one creation path serves both.
    ibv_qp* ibqp =
        new_qp(ctx, target ? nullptr : attr->pd, reinterpret_cast<ibv_qp_init_attr*>(attr),
               target ? to_uxrcd(attr->xrcd) : nullptr);
    if (!ibqp || !ops) return ibqp;
    UroceQp* qp = to_uqp(ibqp);
    qp->batch.reset(batch.release());
    ibv_qp_ex& x = qp->vqp.qp_ex;
    x.comp_mask = 0;
    x.wr_start = wr_start;
    x.wr_complete = wr_complete;
    x.wr_abort = wr_abort;
    x.wr_send = wr_send;
    x.wr_send_imm = wr_send_imm;
    x.wr_rdma_write = wr_rdma_write;
    x.wr_rdma_write_imm = wr_rdma_write_imm;
    x.wr_rdma_read = wr_rdma_read;
    x.wr_atomic_cmp_swp = wr_atomic_cmp_swp;
    x.wr_atomic_fetch_add = wr_atomic_fetch_add;
    // Where a v43 or older libibverbs reads comp_mask (qp_ex_layout.h): set_qp_comp_mask
    // overwrites it there, and such a release has no wr_atomic_write to call.
    x.wr_atomic_write = wr_atomic_write;
    x.wr_set_ud_addr = wr_set_ud_addr;
    x.wr_set_xrc_srqn = wr_set_xrc_srqn;
    x.wr_send_inv = wr_send_inv;
    x.wr_local_inv = wr_local_inv;
    x.wr_bind_mw = wr_bind_mw;
    x.wr_set_sge = wr_set_sge;
    x.wr_set_sge_list = wr_set_sge_list;
    x.wr_set_inline_data = wr_set_inline_data;
    x.wr_set_inline_data_list = wr_set_inline_data_list;
    set_qp_comp_mask(qp->vqp, VERBS_QP_EX);  // last: it may use a slot of ibv_qp_ex
    return ibqp;
}

void WrBatchDeleter::operator()(WrBatch* b) const noexcept {
    delete b;
}

}  // namespace uroce::provider
