// The verbs objects uroce hands to libibverbs. Each starts with the structure libibverbs
// knows (it only ever sees a pointer to that first member) and adds what the provider
// needs; the transport objects behind them are owned through shared pointers.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <sys/types.h>

#include "provider/async_events.h"
#include "provider/comp_channel.h"
#include "provider/fork_guard.h"
#include "provider/limited_slot.h"
#include "provider/live_objects.h"
#include "transport/completion_queue.h"
#include "transport/engine.h"
#include "transport/rc_qp.h"
#include "transport/shared_receive_queue.h"
#include "transport/uc_qp.h"
#include "transport/ud_qp.h"
#include "uroce/verbs_abi.h"

namespace uroce::provider {

// One uroce device, as the registry describes it (ibdev_path/uroce/*).
struct DeviceConfig {
    IpAddress ip;  // IPv4 or IPv6: the device's family
    uint16_t udp_port = 4791;
    uint32_t mtu = 1024;
    uint64_t node_guid = 0;  // as libibverbs shows it (host order value of the big-endian GUID)
};

struct UroceDevice {
    verbs_device vdev;  // must be first
    DeviceConfig config;
};

struct UrocePd;
struct UroceMr;
struct UroceCq;
struct UroceQp;
struct UroceSrq;
struct UroceAh;
struct UroceMw;
struct UroceXrcd;
struct XrcDomain;

// What a context owns beyond libibverbs' part.
struct ContextState {
    UroceDevice* device = nullptr;
    std::unique_ptr<transport::Engine> engine;
    AsyncEventQueue async_events;
    int cmd_fd = -1;
    std::atomic<uint32_t> next_pd{1};
    // The fork generation the context was opened in (fork_guard.h).
    uint32_t fork_generation = current_fork_generation();
    // Live objects of each kind, against the limits the device advertises.
    std::atomic<int> qps{0};
    std::atomic<int> cqs{0};
    std::atomic<int> pds{0};
    std::atomic<int> mrs{0};
    std::atomic<int> srqs{0};
    std::atomic<int> ahs{0};
    // What the application has not destroyed; free_context reclaims it.
    LiveObjects<UroceQp> live_qps;
    LiveObjects<UroceSrq> live_srqs;
    LiveObjects<UroceAh> live_ahs;
    LiveObjects<UroceMw> live_mws;
    std::atomic<int> mws{0};
    std::atomic<int> xrcds{0};
    LiveObjects<UroceXrcd> live_xrcds;
    // The XRC domains open on files, found again by the file's identity (xrc.cpp).
    std::mutex xrc_domains_mutex;
    std::vector<std::weak_ptr<XrcDomain>> xrc_domains;
    std::atomic<uint32_t> next_xrcd{1};
    LiveObjects<UroceCq> live_cqs;
    LiveObjects<UroceMr> live_mrs;
    LiveObjects<UrocePd> live_pds;
};

// libibverbs allocates this with calloc (through _verbs_init_and_alloc_context), so it
// holds only plain members; the rest lives in ContextState.
struct UroceContext {
    verbs_context vctx;  // must be first
    ContextState* state;
};

struct UrocePd {
    ibv_pd pd;        // must be first
    uint32_t id = 0;  // a parent domain has the id of the PD it wraps
    // Set for a parent domain (ibv_alloc_parent_domain): the PD it stands for, kept busy
    // while the parent domain lives.
    UrocePd* protection_domain = nullptr;
    std::atomic<int> users{0};  // MRs and QPs in this PD
    LimitedSlot slot;
};

struct UroceMr {
    verbs_mr vmr;  // must be first
    uint32_t pd_id = 0;
    LimitedSlot slot;
};

struct UroceCq {
    verbs_cq vcq;  // must be first
    std::shared_ptr<transport::CompletionQueue> queue;
    std::shared_ptr<CompChannel> channel;
    std::atomic<int> qp_refs{0};
    AsyncEventTally events;  // guarded by the context's AsyncEventQueue
    // Completion events handed to the application by ibv_get_cq_event (through the cq_event
    // op); destroy waits until ibv_ack_cq_events has acknowledged as many.
    std::atomic<uint32_t> comp_events_delivered{0};
    // ibv_cq_ex polling (cq_ex.cpp): the completion start_poll/next_poll made current.
    transport::Completion current{};
    uint64_t wc_flags_asked = 0;  // what create_cq_ex was asked to report
    bool ipv6 = false;            // the device's family: what a UD receive's GRH area holds
    LimitedSlot slot;
};

// An XRC domain (ibv_open_xrcd): XRC SRQs and XRC target QPs of one domain belong together.
// Every ibv_open_xrcd of the same file in a context gets its own handle on one domain.
struct XrcDomain {
    uint32_t id = 0;
    bool on_file = false;  // opened with a file: found again by dev/ino
    dev_t dev = 0;
    ino_t ino = 0;
    std::atomic<int> users{0};  // XRC SRQs and target QPs in it
    int handles = 0;            // open handles; guarded by the context's xrc_domains_mutex
};

struct UroceXrcd {
    verbs_xrcd vxrcd;  // must be first
    std::shared_ptr<XrcDomain> domain;
    LimitedSlot slot;
};

struct UroceSrq {
    ibv_srq srq;  // must be first
    std::shared_ptr<transport::SharedReceiveQueue> queue;
    // XRC SRQs: their domain and their CQ (kept from destruction while the SRQ lives).
    std::shared_ptr<XrcDomain> xrcd;
    UroceCq* cq = nullptr;
    std::atomic<int> qp_refs{0};  // QPs attached: destroy fails with EBUSY meanwhile
    AsyncEventTally events;       // guarded by the context's AsyncEventQueue
    LimitedSlot slot;
};

// A memory window: its rkey lives in the engine's memory table.
struct UroceMw {
    ibv_mw mw;  // must be first
    LimitedSlot slot;
};

// An address handle: where UD SENDs that name it go.
struct UroceAh {
    ibv_ah ah;  // must be first
    IpAddress dst_ip;
    uint8_t hop_limit = 0;  // the TTL of multicast packets
    LimitedSlot slot;
};

// A batch of ibv_wr_* work requests (qp_ex.cpp).
struct WrBatch;
struct WrBatchDeleter {
    void operator()(WrBatch* b) const noexcept;
};

struct UroceQp {
    verbs_qp vqp;  // must be first
    // Exactly one of them, as vqp.qp.qp_type says.
    std::shared_ptr<transport::RcQp> rc;
    std::shared_ptr<transport::UcQp> uc;
    std::shared_ptr<transport::UdQp> ud;
    UroceCq* send_cq = nullptr;
    UroceCq* recv_cq = nullptr;
    UroceSrq* srq = nullptr;
    std::shared_ptr<XrcDomain> xrcd;  // XRC target QPs: their domain
    // Made by ibv_create_qp_ex with send_ops_flags: the ibv_wr_* batch being built.
    std::unique_ptr<WrBatch, WrBatchDeleter> batch;
    bool sq_sig_all = false;
    // On a QP with the ibv_wr_* API (batch), held by every ibv_post_send, ibv_bind_mw and
    // ibv_wr_complete: no other post comes between a batch's check of the send queue's room
    // and its posts (all or nothing). Other QPs' posts need not take it.
    std::mutex post_mutex;
    std::mutex attr_mutex;  // guards attr (the verbs view of the attributes, for query)
    ibv_qp_attr attr{};
    AsyncEventTally events;  // guarded by the context's AsyncEventQueue
    LimitedSlot slot;
};

// libibverbs hands out &vctx.context, which is the *last* member of verbs_context.
inline UroceContext* to_uctx(ibv_context* c) {
    return reinterpret_cast<UroceContext*>(reinterpret_cast<char*>(c) -
                                           offsetof(UroceContext, vctx.context));
}
// Whether the context was opened in an ancestor of this process (fork_guard.h).
inline bool inherited(ibv_context* c) {
    return to_uctx(c)->state->fork_generation != current_fork_generation();
}
inline UrocePd* to_upd(ibv_pd* p) {
    return reinterpret_cast<UrocePd*>(p);
}
inline UroceCq* to_ucq(ibv_cq* c) {
    return reinterpret_cast<UroceCq*>(c);
}
inline UroceQp* to_uqp(ibv_qp* q) {
    return reinterpret_cast<UroceQp*>(q);
}
inline UroceSrq* to_usrq(ibv_srq* s) {
    return reinterpret_cast<UroceSrq*>(s);
}
inline UroceXrcd* to_uxrcd(ibv_xrcd* x) {
    return reinterpret_cast<UroceXrcd*>(x);
}
inline UroceAh* to_uah(ibv_ah* a) {
    return reinterpret_cast<UroceAh*>(a);
}
// The transport's view of the QP's state, whatever its type.
inline transport::QpState qp_state(const UroceQp& qp) {
    if (qp.ud) return qp.ud->state();
    if (qp.uc) return qp.uc->state();
    return qp.rc->state();
}

// Queues an asynchronous event for ibv_get_async_event: `element` is the ibv_qp* or ibv_cq*
// the event names (the object must be alive), or the port for port events.
void post_async_event(UroceContext* ctx, ibv_event_type type, uint64_t element) noexcept;

// The operations table for contexts (ops.cpp).
extern const verbs_context_ops kContextOps;

// Verbs entry points (one file per object family).
int query_device_ex(ibv_context*, const ibv_query_device_ex_input*, ibv_device_attr_ex*,
                    size_t) noexcept;
int query_port(ibv_context*, uint8_t, ibv_port_attr*) noexcept;
void async_event(ibv_context*, ibv_async_event*) noexcept;
void free_context(ibv_context*) noexcept;

ibv_pd* alloc_pd(ibv_context*) noexcept;
ibv_pd* alloc_parent_domain(ibv_context*, ibv_parent_domain_init_attr*) noexcept;
int dealloc_pd(ibv_pd*) noexcept;
ibv_mr* reg_mr(ibv_pd*, void*, size_t, uint64_t, int) noexcept;
int dereg_mr(verbs_mr*) noexcept;
int rereg_mr(verbs_mr*, int, ibv_pd*, void*, size_t, int) noexcept;
int advise_mr(ibv_pd*, ibv_advise_mr_advice, uint32_t, ibv_sge*, uint32_t) noexcept;

ibv_cq* create_cq(ibv_context*, int, ibv_comp_channel*, int) noexcept;
// The CQ both create_cq and create_cq_ex make (nullptr with errno set).
UroceCq* new_cq(ibv_context*, int cqe, ibv_comp_channel*, int comp_vector) noexcept;
ibv_cq_ex* create_cq_ex(ibv_context*, ibv_cq_init_attr_ex*) noexcept;
int query_rt_values(ibv_context*, ibv_values_ex*) noexcept;
ibv_wc_status wc_status(transport::WcStatus s);
ibv_wc_opcode wc_opcode(transport::WcOpcode op);
// The work completion's sl: what a RoCE NIC reports there for a received packet (wc_sl in cq.cpp).
// `ipv6`: the CQ's device is an IPv6 one.
uint8_t wc_sl(const transport::Completion& c, bool ipv6);
int destroy_cq(ibv_cq*) noexcept;
int poll_cq(ibv_cq*, int, ibv_wc*) noexcept;
int req_notify_cq(ibv_cq*, int) noexcept;
int resize_cq(ibv_cq*, int) noexcept;
void cq_event(ibv_cq*) noexcept;

ibv_qp* create_qp(ibv_pd*, ibv_qp_init_attr*) noexcept;
// The QP create_qp and create_qp_ex make: `pd` is null, and `xrcd` set, for an XRC target.
ibv_qp* new_qp(ibv_context*, ibv_pd*, ibv_qp_init_attr*, UroceXrcd* xrcd) noexcept;
ibv_qp* create_qp_ex(ibv_context*, ibv_qp_init_attr_ex*) noexcept;
int destroy_qp(ibv_qp*) noexcept;
int modify_qp(ibv_qp*, ibv_qp_attr*, int) noexcept;
int query_qp(ibv_qp*, ibv_qp_attr*, int, ibv_qp_init_attr*) noexcept;
int post_send(ibv_qp*, ibv_send_wr*, ibv_send_wr**) noexcept;
int post_recv(ibv_qp*, ibv_recv_wr*, ibv_recv_wr**) noexcept;

ibv_srq* create_srq(ibv_pd*, ibv_srq_init_attr*) noexcept;
// The SRQ create_srq and create_srq_ex make: an XRC SRQ with `xrcd` and `cq`.
ibv_srq* new_srq(ibv_pd*, ibv_srq_init_attr*, UroceXrcd* xrcd, UroceCq* cq) noexcept;
// XRC (xrc.cpp).
ibv_xrcd* open_xrcd(ibv_context*, ibv_xrcd_init_attr*) noexcept;
int close_xrcd(ibv_xrcd*) noexcept;
ibv_srq* create_srq_ex(ibv_context*, ibv_srq_init_attr_ex*) noexcept;
int get_srq_num(ibv_srq*, uint32_t*) noexcept;
int modify_srq(ibv_srq*, ibv_srq_attr*, int) noexcept;
int query_srq(ibv_srq*, ibv_srq_attr*) noexcept;
int destroy_srq(ibv_srq*) noexcept;
int post_srq_recv(ibv_srq*, ibv_recv_wr*, ibv_recv_wr**) noexcept;
ibv_mw* alloc_mw(ibv_pd*, ibv_mw_type) noexcept;
int dealloc_mw(ibv_mw*) noexcept;
int bind_mw(ibv_qp*, ibv_mw*, ibv_mw_bind*) noexcept;
// The transport's bind of `mw` (of type `type`) under `new_rkey`: EINVAL for a window of
// another type or context, an rkey of another window, or access flags it cannot grant.
int mw_bind_wqe(ibv_qp* qp, ibv_mw* mw, uint32_t new_rkey, const ibv_mw_bind_info& info,
                ibv_mw_type type, transport::MwBind& out) noexcept;
ibv_ah* create_ah(ibv_pd*, ibv_ah_attr*) noexcept;
int destroy_ah(ibv_ah*) noexcept;
// UD QPs (ud_qp.cpp): the parts of modify_qp and post_send that differ from RC.
int modify_ud_qp(UroceQp& qp, const ibv_qp_attr& attr, int mask, transport::QpState current,
                 transport::QpState next) noexcept;
int post_send_ud(UroceQp& qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) noexcept;
// The WQE (and destination) a UD send request asks for: EINVAL if post_send_ud would refuse it
// before it reaches the QP.
int build_ud_wqe(const UroceQp& qp, const ibv_send_wr& wr, transport::SendWqe& w,
                 transport::UdDestination& dest) noexcept;
// The same for RC, UC and XRC send requests.
int build_send_wqe(ibv_qp* ibqp, const UroceQp& qp, ibv_send_wr& wr,
                   transport::SendWqe& w) noexcept;
// A send request built into its WQE (and, for UD, its destination), not yet posted.
struct BuiltSend {
    transport::SendWqe wqe;
    transport::UdDestination dest;  // UD only
    ibv_send_wr* wr = nullptr;      // the request it was built from
};
// Posts the `count` requests of the list `wr` all or none (the ibv_wr_* batch): builds every
// one into `built` (scratch kept by the caller, so a batch allocates nothing once it has
// grown), checks the send queue has room for them all, then posts them. 0, or what the first
// refused request failed with, nothing posted then.
int post_send_all(ibv_qp* ibqp, ibv_send_wr* wr, size_t count,
                  std::vector<BuiltSend>& built) noexcept;
// The part of a send WQE every QP type fills the same way from `wr`: id, flags, immediate
// data, and the data (SGE list, or inline data copied now); `total` is the length asked for.
// EINVAL for an SGE count outside 0..kMaxSge or inline data over kMaxInline.
int fill_send_wqe(const UroceQp& qp, const ibv_send_wr& wr, transport::SendWqe& w,
                  uint64_t& total) noexcept;
// ibv_attach_mcast / ibv_detach_mcast (ud_qp.cpp): UD QPs and IPv4-mapped multicast GIDs.
int attach_mcast(ibv_qp*, const ibv_gid*, uint16_t) noexcept;
int detach_mcast(ibv_qp*, const ibv_gid*, uint16_t) noexcept;
// The receive WQE in `wr`, or EINVAL (bad SGE count); shared by post_recv and post_srq_recv.
int to_recv_wqe(const ibv_recv_wr& wr, transport::RecvWqe& out) noexcept;

// Frees an object the application left when it closed its context, as the kernel frees what
// a closed uverbs file held: nothing waits for acknowledgements nobody will give. QPs and MRs
// go while the engine still runs (they leave its tables), CQs and PDs after it stopped.
void reclaim_qp(ContextState&, UroceQp*) noexcept;
void reclaim_mr(ContextState&, UroceMr*) noexcept;
void reclaim_cq(UroceCq*) noexcept;
void reclaim_srq(UroceSrq*) noexcept;
void reclaim_ah(UroceAh*) noexcept;
void reclaim_mw(ContextState&, UroceMw*) noexcept;
void reclaim_pd(UrocePd*) noexcept;
void reclaim_xrcd(UroceXrcd*) noexcept;

}  // namespace uroce::provider
