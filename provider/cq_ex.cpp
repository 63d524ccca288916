// Extended CQs (ibv_create_cq_ex): the start/next/end polling API and the read_* accessors,
// over the same UroceCq and CompletionQueue as ibv_create_cq, so ibv_poll_cq, notification,
// completion channels and ibv_destroy_cq work on them unchanged.
#include <arpa/inet.h>
#include <time.h>

#include <cerrno>

#include "provider/device_limits.h"
#include "provider/objects.h"

namespace uroce::provider {

namespace {

// What read_* can answer. Timestamps are CLOCK_MONOTONIC in ns, so the "HCA clock" runs at
// 1 GHz (hca_core_clock 1,000,000 kHz in ibv_query_device_ex).
constexpr uint64_t kSupportedWcFlags =
    IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_SRC_QP |
    IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL | IBV_WC_EX_WITH_DLID_PATH_BITS |
    IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;

UroceCq* of(ibv_cq_ex* c) {
    return reinterpret_cast<UroceCq*>(c);
}

uint64_t now_ns(clockid_t clock) {
    timespec ts{};
    clock_gettime(clock, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// Takes the next completion into `current`; ENOENT if there is none.
int take_next(ibv_cq_ex* c) {
    UroceCq* cq = of(c);
    transport::Completion one;
    if (cq->queue->poll(std::span(&one, 1)) == 0) return ENOENT;
    cq->current = one;
    c->wr_id = one.wr_id;
    c->status = wc_status(one.status);
    return 0;
}

int start_poll(ibv_cq_ex* c, ibv_poll_cq_attr* attr) {
    if (attr && attr->comp_mask) return EINVAL;
    if (inherited(c->context)) return EIO;
    // An empty queue: do the receive work here rather than wait for the engine thread. Events
    // are held back until end_poll: what this pass takes needs none.
    transport::CompletionQueue& q = *of(c)->queue;
    q.hold_events();
    to_uctx(c->context)->state->engine->on_cq_poll(q.depth() == 0);
    const int ret = take_next(c);
    if (ret == 0) to_uctx(c->context)->state->engine->note_completions_taken();
    if (ret != 0) q.release_events();  // no end_poll follows a failed start_poll
    return ret;
}

int next_poll(ibv_cq_ex* c) {
    return take_next(c);
}

void end_poll(ibv_cq_ex* c) {
    of(c)->queue->release_events();
}

ibv_wc_opcode read_opcode(ibv_cq_ex* c) {
    return wc_opcode(of(c)->current.opcode);
}
uint32_t read_vendor_err(ibv_cq_ex*) {
    return 0;
}
uint32_t read_byte_len(ibv_cq_ex* c) {
    return of(c)->current.byte_len;
}
__be32 read_imm_data(ibv_cq_ex* c) {
    // ibv_wc_read_invalidated_rkey returns this unconverted: an invalidated rkey goes in host
    // order (as ibv_poll_cq's invalidated_rkey), immediate data in network order.
    const transport::Completion& cur = of(c)->current;
    return cur.with_inv ? cur.imm : htonl(cur.imm);
}
uint32_t read_qp_num(ibv_cq_ex* c) {
    return of(c)->current.qp_num;
}
uint32_t read_src_qp(ibv_cq_ex* c) {
    return of(c)->current.src_qp;
}
unsigned int read_wc_flags(ibv_cq_ex* c) {
    const transport::Completion& cur = of(c)->current;
    unsigned int f = 0;
    if (cur.with_imm) f |= IBV_WC_WITH_IMM;
    if (cur.with_grh) f |= IBV_WC_GRH;
    if (cur.with_inv) f |= IBV_WC_WITH_INV;
    return f;
}
uint32_t read_slid(ibv_cq_ex*) {
    return 0;  // RoCE has no LIDs
}
uint8_t read_sl(ibv_cq_ex* c) {
    return wc_sl(of(c)->current, of(c)->ipv6);
}
uint8_t read_dlid_path_bits(ibv_cq_ex*) {
    return 0;
}
uint64_t read_completion_ts(ibv_cq_ex* c) {
    return of(c)->current.timestamp_ns;
}
uint64_t read_completion_wallclock_ns(ibv_cq_ex* c) {
    // The monotonic stamp moved onto the wall clock.
    const uint64_t mono = now_ns(CLOCK_MONOTONIC);
    const uint64_t wall = now_ns(CLOCK_REALTIME);
    return wall - (mono - of(c)->current.timestamp_ns);
}

}  // namespace

ibv_cq_ex* create_cq_ex(ibv_context* ibctx, ibv_cq_init_attr_ex* attr) noexcept {
    if (!attr) {
        errno = EINVAL;
        return nullptr;
    }
    // CQ flags (single-threaded hints) are not offered; a parent domain is taken (it only
    // names allocators, which uroce's queues do not use) if it is one of this context.
    if (attr->comp_mask &
        ~static_cast<uint32_t>(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD)) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    if ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) &&
        (!attr->parent_domain || attr->parent_domain->context != ibctx ||
         !to_upd(attr->parent_domain)->protection_domain)) {
        errno = EINVAL;
        return nullptr;
    }
    if ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) && attr->flags) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    if (attr->wc_flags & ~kSupportedWcFlags) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    if (attr->cqe == 0 || attr->cqe > static_cast<uint32_t>(kMaxCqe) ||
        attr->comp_vector > static_cast<uint32_t>(INT32_MAX)) {
        errno = EINVAL;
        return nullptr;
    }
    UroceCq* cq = new_cq(ibctx, static_cast<int>(attr->cqe), attr->channel,
                         static_cast<int>(attr->comp_vector));
    if (!cq) return nullptr;
    cq->wc_flags_asked = attr->wc_flags;
    ibv_cq_ex& x = cq->vcq.cq_ex;
    // libibverbs' ibv_create_cq_ex initialises the rest (context, channel and its reference,
    // cq_context, event counters, mutex and cond) once this returns, as for ibv_create_cq.
    x.cqe = static_cast<int>(attr->cqe);
    x.comp_mask = 0;
    x.start_poll = start_poll;
    x.next_poll = next_poll;
    x.end_poll = end_poll;
    x.read_opcode = read_opcode;
    x.read_vendor_err = read_vendor_err;
    x.read_byte_len = read_byte_len;
    x.read_imm_data = read_imm_data;
    x.read_qp_num = read_qp_num;
    x.read_src_qp = read_src_qp;
    x.read_wc_flags = read_wc_flags;
    x.read_slid = read_slid;
    x.read_sl = read_sl;
    x.read_dlid_path_bits = read_dlid_path_bits;
    x.read_completion_ts = read_completion_ts;
    x.read_completion_wallclock_ns = read_completion_wallclock_ns;
    return &x;
}

int query_rt_values(ibv_context* ibctx, ibv_values_ex* values) noexcept {
    if (inherited(ibctx)) return EIO;
    if (!values) return EINVAL;
    if (values->comp_mask & ~static_cast<uint32_t>(IBV_VALUES_MASK_RAW_CLOCK)) return EINVAL;
    if (values->comp_mask & IBV_VALUES_MASK_RAW_CLOCK)
        clock_gettime(CLOCK_MONOTONIC, &values->raw_clock);  // the clock of the timestamps
    return 0;
}

}  // namespace uroce::provider
