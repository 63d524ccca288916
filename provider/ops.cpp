// The operations table libibverbs calls through, and uroce's exported counters.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "provider/objects.h"
#include "uroce/uroce.h"

namespace uroce::provider {

bool is_uroce_context(ibv_context* c) noexcept;

namespace {

// Entries left null keep libibverbs' defaults, which fail with EOPNOTSUPP.
verbs_context_ops make_ops() {
    verbs_context_ops o{};
    o.advise_mr = advise_mr;
    o.alloc_parent_domain = alloc_parent_domain;
    o.alloc_mw = alloc_mw;
    o.alloc_pd = alloc_pd;
    o.bind_mw = bind_mw;
    o.close_xrcd = close_xrcd;
    o.async_event = async_event;
    o.attach_mcast = attach_mcast;
    o.cq_event = cq_event;
    o.create_ah = create_ah;
    o.create_cq = create_cq;
    o.create_cq_ex = create_cq_ex;
    o.create_qp = create_qp;
    o.create_qp_ex = create_qp_ex;
    o.create_srq = create_srq;
    o.create_srq_ex = create_srq_ex;
    o.dealloc_pd = dealloc_pd;
    o.dealloc_mw = dealloc_mw;
    o.dereg_mr = dereg_mr;
    o.destroy_ah = destroy_ah;
    o.destroy_cq = destroy_cq;
    o.destroy_qp = destroy_qp;
    o.destroy_srq = destroy_srq;
    o.detach_mcast = detach_mcast;
    o.free_context = free_context;
    o.get_srq_num = get_srq_num;
    o.modify_qp = modify_qp;
    o.modify_srq = modify_srq;
    o.open_xrcd = open_xrcd;
    o.poll_cq = poll_cq;
    o.post_recv = post_recv;
    o.post_send = post_send;
    o.post_srq_recv = post_srq_recv;
    o.query_device_ex = query_device_ex;
    o.query_port = query_port;
    o.query_qp = query_qp;
    o.query_rt_values = query_rt_values;
    o.query_srq = query_srq;
    o.reg_mr = reg_mr;
    o.req_notify_cq = req_notify_cq;
    o.rereg_mr = rereg_mr;
    o.resize_cq = resize_cq;
    return o;
}

}  // namespace

const verbs_context_ops kContextOps = make_ops();

void print_counters(const ContextState& st, const char* device) noexcept {
    const transport::CounterValues c = st.engine->counters_since_start();
    std::fprintf(stderr, "uroce %s counters:", device);
#define UROCE_PRINT(name) \
    std::fprintf(stderr, " %s=%llu", #name, static_cast<unsigned long long>(c.name));
    UROCE_COUNTERS(UROCE_PRINT)
#undef UROCE_PRINT
    std::fprintf(stderr, "\n");
}

}  // namespace uroce::provider

namespace {

int lookup(const uroce::transport::CounterValues& c, const char* name, uint64_t* value) {
#define UROCE_MATCH(n)                \
    if (std::strcmp(name, #n) == 0) { \
        *value = c.n;                 \
        return 0;                     \
    }
    UROCE_COUNTERS(UROCE_MATCH)
#undef UROCE_MATCH
    return ENOENT;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int uroce_read_counter(ibv_context* ctx,
                                                                         const char* name,
                                                                         uint64_t* value) {
    using namespace uroce::provider;
    if (!is_uroce_context(ctx) || !name || !value) return EINVAL;
    return lookup(to_uctx(ctx)->state->engine->counters_since_start(), name, value);
}

extern "C" __attribute__((visibility("default"))) int uroce_read_device_counter(ibv_context* ctx,
                                                                                const char* name,
                                                                                uint64_t* value) {
    using namespace uroce::provider;
    if (!is_uroce_context(ctx) || !name || !value) return EINVAL;
    try {
        uroce::transport::CounterValues totals;
        std::string why;
        if (!uroce::transport::DeviceCounters::read_totals(
                to_uctx(ctx)->state->engine->config().counters_file, totals, why))
            return EIO;
        return lookup(totals, name, value);
    } catch (...) {
        return ENOMEM;  // nothing may cross the C boundary
    }
}

extern "C" __attribute__((visibility("default"))) int uroce_read_qp_counter(ibv_qp* qp,
                                                                            const char* name,
                                                                            uint64_t* value) {
    using namespace uroce::provider;
    if (!qp || !is_uroce_context(qp->context) || !name || !value) return EINVAL;
    const uroce::transport::QpCounterValues c =
        uroce::transport::snapshot(to_uctx(qp->context)->state->engine->qp_counters(qp->qp_num));
#define UROCE_MATCH_QP(n)             \
    if (std::strcmp(name, #n) == 0) { \
        *value = c.n;                 \
        return 0;                     \
    }
    UROCE_QP_COUNTERS(UROCE_MATCH_QP)
#undef UROCE_MATCH_QP
    return ENOENT;
}
