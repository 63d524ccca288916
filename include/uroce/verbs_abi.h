// The parts of libibverbs' private provider ABI that uroce uses, for either of the two
// private ABIs the provider can be built for (UROCE_VERBS_ABI, set per target by meson):
//   34: IBVERBS_PRIVATE_34, rdma-core v36 through v56 (liburoce-rdmav34.so);
//   57: IBVERBS_PRIVATE_57, rdma-core v57 and v58 (liburoce-rdmav57.so).
//
// Debian ships <infiniband/verbs.h> but not the provider header, so these declarations are
// written from the ABI's facts: the structure layouts and symbols those releases export.
// (v34 and v35 use the name IBVERBS_PRIVATE_34 with a different verbs_context_ops layout;
// v59 moves to IBVERBS_PRIVATE_59 with a longer one.) For a provider the two ABIs differ in
// two places only, both selected below: the name of the registration function, and where
// verbs_qp::comp_mask sits (after libibverbs' own ibv_qp_ex, which v44 and v45 lengthened;
// provider/qp_ex_layout.h places it at run time for the release that loaded the provider).
// meson.build refuses to build against a libibverbs outside the supported range, and the
// static_asserts at the bottom pin every offset this project relies on, per ABI, so a
// layout change fails the build, not the app.
#pragma once

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

// The provider targets set UROCE_VERBS_ABI; everything else (tests that build a context with
// the system's libibverbs) gets the system's ABI, which meson passes for the whole project.
#ifndef UROCE_VERBS_ABI
#ifdef UROCE_SYSTEM_VERBS_ABI
#define UROCE_VERBS_ABI UROCE_SYSTEM_VERBS_ABI
#else
#define UROCE_VERBS_ABI 34
#endif
#endif
#if UROCE_VERBS_ABI != 34 && UROCE_VERBS_ABI != 57
#error "UROCE_VERBS_ABI must be 34 or 57"
#endif

#ifdef __cplusplus
#include <atomic>
extern "C" {
#else
#include <stdatomic.h>
#endif

// A node of rdma-core's intrusive doubly-linked list (ccan/list).
struct uroce_list_node {
    struct uroce_list_node* next;
    struct uroce_list_node* prev;
};

enum {
    VERBS_MATCH_SENTINEL = 0,
    VERBS_MATCH_PCI = 1,
    VERBS_MATCH_MODALIAS = 2,
    VERBS_MATCH_DRIVER_ID = 3,
};

struct verbs_match_ent {
    void* driver_data;
    union {
        const char* modalias;
        uint64_t driver_id;
    } u;
    uint16_t vendor;
    uint16_t device;
    uint8_t kind;
};

// What libibverbs found in sysfs for one device; handed to match_device and alloc_device.
struct verbs_sysfs_dev {
    struct uroce_list_node entry;
    void* provider_data;
    const struct verbs_match_ent* match;
    unsigned int flags;
    char sysfs_name[IBV_SYSFS_NAME_MAX];
    dev_t sysfs_cdev;
    char ibdev_name[IBV_SYSFS_NAME_MAX];
    char ibdev_path[IBV_SYSFS_PATH_MAX];
    char modalias[512];
    uint64_t node_guid;
    uint32_t driver_id;
    enum ibv_node_type node_type;
    int ibdev_idx;
    uint32_t num_ports;
    uint32_t abi_ver;
    struct timespec time_created;
};

struct verbs_device;

struct verbs_device_ops {
    const char* name;
    uint32_t match_min_abi_version;
    uint32_t match_max_abi_version;
    const struct verbs_match_ent* match_table;
    const struct verbs_device_ops** static_providers;
    bool (*match_device)(struct verbs_sysfs_dev* sysfs_dev);
    struct verbs_context* (*alloc_context)(struct ibv_device* device, int cmd_fd,
                                           void* private_data);
    struct verbs_context* (*import_context)(struct ibv_device* device, int cmd_fd);
    struct verbs_device* (*alloc_device)(struct verbs_sysfs_dev* sysfs_dev);
    void (*uninit_device)(struct verbs_device* device);
};

struct verbs_device {
    struct ibv_device device;  // must be first
    const struct verbs_device_ops* ops;
#ifdef __cplusplus
    std::atomic<int> refcount;
#else
    atomic_int refcount;
#endif
    struct uroce_list_node entry;
    struct verbs_sysfs_dev* sysfs;
    uint64_t core_support;
};

// verbs_device::core_support bit: the provider accepts the optional MR access flags
// (IBV_ACCESS_RELAXED_ORDERING and friends) instead of having the library strip them.
enum { UROCE_CORE_SUPPORT_OPTIONAL_MR_ACCESS = 1 << 0 };

enum uroce_mr_type {
    UROCE_MR_TYPE_MR = 0,
    UROCE_MR_TYPE_NULL_MR = 1,
    UROCE_MR_TYPE_IMPORTED_MR = 2,
    UROCE_MR_TYPE_DMABUF_MR = 3,
};

// libibverbs reads mr_type and access behind every ibv_mr a provider returns.
struct verbs_mr {
    struct ibv_mr ibv_mr;
    enum uroce_mr_type mr_type;
    int access;
};

struct verbs_xrcd {
    struct ibv_xrcd xrcd;
    uint32_t comp_mask;
    uint32_t handle;
};

enum { VERBS_QP_XRCD = 1 << 0, VERBS_QP_EX = 1 << 1 };

// libibverbs finds comp_mask right after its own ibv_qp_ex (ibv_qp_to_qp_ex, a function of
// the library, reads it), so the slot follows the ibv_qp_ex of the release the provider is
// loaded by. ABI 34 spans three layouts: v36-v43 (comp_mask at 344), v44 (352: it appended
// wr_atomic_write) and v45-v56 (360: wr_flush). Both builds lay verbs_qp out as v45 does,
// reserving the wr_flush slot unless the headers already have it
// (UROCE_IBV_QP_EX_HAS_WR_FLUSH, from meson); for an older libibverbs the provider also writes
// comp_mask where that release reads it, into a slot its ibv_qp_ex does not have
// (provider/qp_ex_layout.h). uroce never offers IBV_QP_EX_WITH_FLUSH; the slot stays null
// unless it holds that copy.
#if !defined(UROCE_IBV_QP_EX_HAS_WR_FLUSH)
#define UROCE_QP_EX_FLUSH_SLOT 1
#else
#define UROCE_QP_EX_FLUSH_SLOT 0
#endif

#if UROCE_QP_EX_FLUSH_SLOT
// ibv_qp_ex as v45 and later lay it out, on headers that predate wr_flush.
struct uroce_qp_ex_v45 {
    struct ibv_qp_ex v44;
    void (*wr_flush)(struct ibv_qp_ex*, uint32_t, uint64_t, size_t, uint8_t, uint8_t);
};
#endif

struct verbs_qp {
    union {
        struct ibv_qp qp;
        struct ibv_qp_ex qp_ex;
#if UROCE_QP_EX_FLUSH_SLOT
        struct uroce_qp_ex_v45 qp_ex_v45;
#endif
    };
    uint32_t comp_mask;
    struct verbs_xrcd* xrcd;
};

struct verbs_cq {
    union {
        struct ibv_cq cq;
        struct ibv_cq_ex cq_ex;
    };
};

// Every operation a provider can supply, alphabetical, exactly as libibverbs lays it out.
// A null entry keeps libibverbs' default (which fails with EOPNOTSUPP).
struct verbs_context_ops {
    int (*advise_mr)(struct ibv_pd*, enum ibv_advise_mr_advice, uint32_t, struct ibv_sge*,
                     uint32_t);
    struct ibv_dm* (*alloc_dm)(struct ibv_context*, struct ibv_alloc_dm_attr*);
    struct ibv_mw* (*alloc_mw)(struct ibv_pd*, enum ibv_mw_type);
    struct ibv_mr* (*alloc_null_mr)(struct ibv_pd*);
    struct ibv_pd* (*alloc_parent_domain)(struct ibv_context*, struct ibv_parent_domain_init_attr*);
    struct ibv_pd* (*alloc_pd)(struct ibv_context*);
    struct ibv_td* (*alloc_td)(struct ibv_context*, struct ibv_td_init_attr*);
    void (*async_event)(struct ibv_context*, struct ibv_async_event*);
    int (*attach_counters_point_flow)(struct ibv_counters*, struct ibv_counter_attach_attr*,
                                      struct ibv_flow*);
    int (*attach_mcast)(struct ibv_qp*, const union ibv_gid*, uint16_t);
    int (*bind_mw)(struct ibv_qp*, struct ibv_mw*, struct ibv_mw_bind*);
    int (*close_xrcd)(struct ibv_xrcd*);
    void (*cq_event)(struct ibv_cq*);
    struct ibv_ah* (*create_ah)(struct ibv_pd*, struct ibv_ah_attr*);
    struct ibv_counters* (*create_counters)(struct ibv_context*, struct ibv_counters_init_attr*);
    struct ibv_cq* (*create_cq)(struct ibv_context*, int, struct ibv_comp_channel*, int);
    struct ibv_cq_ex* (*create_cq_ex)(struct ibv_context*, struct ibv_cq_init_attr_ex*);
    struct ibv_flow* (*create_flow)(struct ibv_qp*, struct ibv_flow_attr*);
    struct ibv_flow_action* (*create_flow_action_esp)(struct ibv_context*,
                                                      struct ibv_flow_action_esp_attr*);
    struct ibv_qp* (*create_qp)(struct ibv_pd*, struct ibv_qp_init_attr*);
    struct ibv_qp* (*create_qp_ex)(struct ibv_context*, struct ibv_qp_init_attr_ex*);
    struct ibv_rwq_ind_table* (*create_rwq_ind_table)(struct ibv_context*,
                                                      struct ibv_rwq_ind_table_init_attr*);
    struct ibv_srq* (*create_srq)(struct ibv_pd*, struct ibv_srq_init_attr*);
    struct ibv_srq* (*create_srq_ex)(struct ibv_context*, struct ibv_srq_init_attr_ex*);
    struct ibv_wq* (*create_wq)(struct ibv_context*, struct ibv_wq_init_attr*);
    int (*dealloc_mw)(struct ibv_mw*);
    int (*dealloc_pd)(struct ibv_pd*);
    int (*dealloc_td)(struct ibv_td*);
    int (*dereg_mr)(struct verbs_mr*);
    int (*destroy_ah)(struct ibv_ah*);
    int (*destroy_counters)(struct ibv_counters*);
    int (*destroy_cq)(struct ibv_cq*);
    int (*destroy_flow)(struct ibv_flow*);
    int (*destroy_flow_action)(struct ibv_flow_action*);
    int (*destroy_qp)(struct ibv_qp*);
    int (*destroy_rwq_ind_table)(struct ibv_rwq_ind_table*);
    int (*destroy_srq)(struct ibv_srq*);
    int (*destroy_wq)(struct ibv_wq*);
    int (*detach_mcast)(struct ibv_qp*, const union ibv_gid*, uint16_t);
    void (*free_context)(struct ibv_context*);
    int (*free_dm)(struct ibv_dm*);
    int (*get_srq_num)(struct ibv_srq*, uint32_t*);
    struct ibv_dm* (*import_dm)(struct ibv_context*, uint32_t);
    struct ibv_mr* (*import_mr)(struct ibv_pd*, uint32_t);
    struct ibv_pd* (*import_pd)(struct ibv_context*, uint32_t);
    int (*modify_cq)(struct ibv_cq*, struct ibv_modify_cq_attr*);
    int (*modify_flow_action_esp)(struct ibv_flow_action*, struct ibv_flow_action_esp_attr*);
    int (*modify_qp)(struct ibv_qp*, struct ibv_qp_attr*, int);
    int (*modify_qp_rate_limit)(struct ibv_qp*, struct ibv_qp_rate_limit_attr*);
    int (*modify_srq)(struct ibv_srq*, struct ibv_srq_attr*, int);
    int (*modify_wq)(struct ibv_wq*, struct ibv_wq_attr*);
    struct ibv_qp* (*open_qp)(struct ibv_context*, struct ibv_qp_open_attr*);
    struct ibv_xrcd* (*open_xrcd)(struct ibv_context*, struct ibv_xrcd_init_attr*);
    int (*poll_cq)(struct ibv_cq*, int, struct ibv_wc*);
    int (*post_recv)(struct ibv_qp*, struct ibv_recv_wr*, struct ibv_recv_wr**);
    int (*post_send)(struct ibv_qp*, struct ibv_send_wr*, struct ibv_send_wr**);
    int (*post_srq_ops)(struct ibv_srq*, struct ibv_ops_wr*, struct ibv_ops_wr**);
    int (*post_srq_recv)(struct ibv_srq*, struct ibv_recv_wr*, struct ibv_recv_wr**);
    int (*query_device_ex)(struct ibv_context*, const struct ibv_query_device_ex_input*,
                           struct ibv_device_attr_ex*, size_t);
    int (*query_ece)(struct ibv_qp*, struct ibv_ece*);
    int (*query_port)(struct ibv_context*, uint8_t, struct ibv_port_attr*);
    int (*query_qp)(struct ibv_qp*, struct ibv_qp_attr*, int, struct ibv_qp_init_attr*);
    int (*query_qp_data_in_order)(struct ibv_qp*, enum ibv_wr_opcode, uint32_t);
    int (*query_rt_values)(struct ibv_context*, struct ibv_values_ex*);
    int (*query_srq)(struct ibv_srq*, struct ibv_srq_attr*);
    int (*read_counters)(struct ibv_counters*, uint64_t*, uint32_t, uint32_t);
    struct ibv_mr* (*reg_dm_mr)(struct ibv_pd*, struct ibv_dm*, uint64_t, size_t, unsigned int);
    struct ibv_mr* (*reg_dmabuf_mr)(struct ibv_pd*, uint64_t, size_t, uint64_t, int, int);
    struct ibv_mr* (*reg_mr)(struct ibv_pd*, void*, size_t, uint64_t, int);
    int (*req_notify_cq)(struct ibv_cq*, int);
    int (*rereg_mr)(struct verbs_mr*, int, struct ibv_pd*, void*, size_t, int);
    int (*resize_cq)(struct ibv_cq*, int);
    int (*set_ece)(struct ibv_qp*, struct ibv_ece*);
    void (*unimport_dm)(struct ibv_dm*);
    void (*unimport_mr)(struct ibv_mr*);
    void (*unimport_pd)(struct ibv_pd*);
};

// Symbols libibverbs exports under IBVERBS_PRIVATE_<ABI>. The registration function carries
// the ABI number in its name (verbs_register_driver_34 / _57); one declaration under our own
// name binds to the right one.
#define UROCE_ABI_STR2(x) #x
#define UROCE_ABI_STR(x) UROCE_ABI_STR2(x)
void uroce_verbs_register_driver(const struct verbs_device_ops* ops) __asm__(
    "verbs_register_driver_" UROCE_ABI_STR(UROCE_VERBS_ABI));
void* _verbs_init_and_alloc_context(struct ibv_device* device, int cmd_fd, size_t alloc_size,
                                    struct verbs_context* context_offset, uint32_t driver_id);
void verbs_uninit_context(struct verbs_context* context);
void verbs_set_ops(struct verbs_context* vctx, const struct verbs_context_ops* ops);
int ibv_read_ibdev_sysfs_file(char* buf, size_t size, struct verbs_sysfs_dev* sysfs_dev,
                              const char* fnfmt, ...) __attribute__((format(printf, 4, 5)));

// rdma-core's "unknown driver" id (enum rdma_driver_id), which a sysfs-only device carries.
enum { UROCE_RDMA_DRIVER_UNKNOWN = 0 };

#ifdef __cplusplus
}  // extern "C"
#endif

// Layout checks: LP64 offsets as rdma-core v36..v56 (ABI 34) and v57..v58 (ABI 57) define
// them; all but verbs_qp's are the same for both. If one of these fails, the installed
// headers do not have the layout this file describes.
#if defined(__LP64__)
#define UROCE_ABI_CHECK(cond) static_assert(cond, #cond)
UROCE_ABI_CHECK(sizeof(struct verbs_match_ent) == 24);
UROCE_ABI_CHECK(offsetof(struct verbs_sysfs_dev, sysfs_name) == 36);
UROCE_ABI_CHECK(offsetof(struct verbs_sysfs_dev, sysfs_cdev) == 104);
UROCE_ABI_CHECK(offsetof(struct verbs_sysfs_dev, ibdev_name) == 112);
UROCE_ABI_CHECK(offsetof(struct verbs_sysfs_dev, ibdev_path) == 176);
UROCE_ABI_CHECK(offsetof(struct verbs_sysfs_dev, modalias) == 432);
UROCE_ABI_CHECK(offsetof(struct verbs_sysfs_dev, node_guid) == 944);
UROCE_ABI_CHECK(offsetof(struct verbs_sysfs_dev, abi_ver) == 968);
UROCE_ABI_CHECK(sizeof(struct verbs_sysfs_dev) == 992);
UROCE_ABI_CHECK(sizeof(struct verbs_device_ops) == 72);
UROCE_ABI_CHECK(offsetof(struct verbs_device_ops, alloc_context) == 40);
UROCE_ABI_CHECK(offsetof(struct verbs_device_ops, alloc_device) == 56);
UROCE_ABI_CHECK(offsetof(struct verbs_device, ops) == sizeof(struct ibv_device));
UROCE_ABI_CHECK(offsetof(struct verbs_device, sysfs) == sizeof(struct ibv_device) + 32);
UROCE_ABI_CHECK(sizeof(struct verbs_device) == sizeof(struct ibv_device) + 48);
UROCE_ABI_CHECK(sizeof(struct verbs_context_ops) == 76 * sizeof(void*));
UROCE_ABI_CHECK(offsetof(struct verbs_context_ops, create_qp) == 19 * sizeof(void*));
UROCE_ABI_CHECK(offsetof(struct verbs_context_ops, poll_cq) == 53 * sizeof(void*));
UROCE_ABI_CHECK(offsetof(struct verbs_context_ops, query_device_ex) == 58 * sizeof(void*));
UROCE_ABI_CHECK(offsetof(struct verbs_context_ops, query_qp_data_in_order) == 62 * sizeof(void*));
UROCE_ABI_CHECK(offsetof(struct verbs_context_ops, unimport_pd) == 75 * sizeof(void*));
UROCE_ABI_CHECK(offsetof(struct verbs_mr, mr_type) == sizeof(struct ibv_mr));
UROCE_ABI_CHECK(sizeof(struct verbs_mr) == sizeof(struct ibv_mr) + 8);
// Both ABIs as built here: v45's layout, ibv_qp_ex 360 bytes (v44's 352, wr_atomic_write
// last, then wr_flush); v44 reads comp_mask at 352 (the wr_flush slot), v36-v43 at 344 (the
// wr_atomic_write slot).
#if UROCE_QP_EX_FLUSH_SLOT
UROCE_ABI_CHECK(offsetof(struct ibv_qp_ex, wr_atomic_write) + 8 == sizeof(struct ibv_qp_ex));
UROCE_ABI_CHECK(offsetof(struct uroce_qp_ex_v45, wr_flush) == 352);
#endif
UROCE_ABI_CHECK(offsetof(struct ibv_qp_ex, wr_atomic_write) == 344);
UROCE_ABI_CHECK(offsetof(struct verbs_qp, comp_mask) == 360);
UROCE_ABI_CHECK(offsetof(struct verbs_qp, xrcd) == 368);
UROCE_ABI_CHECK(sizeof(struct verbs_qp) == 376);
#undef UROCE_ABI_CHECK
#endif
