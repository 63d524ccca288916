// ibv_query_device(_ex) and ibv_query_port: what uroce's device and port offer.
#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "provider/device_limits.h"
#include "provider/objects.h"
#include "uroce/path_mtu.h"

namespace uroce::provider {

ibv_mtu mtu_enum(uint32_t bytes) {
    return uroce::mtu_enum(bytes).value_or(IBV_MTU_4096);  // the registry allows no other value
}

uint32_t mtu_bytes(ibv_mtu mtu) {
    return 128u << static_cast<int>(mtu);
}

int query_device_ex(ibv_context* ibctx, const ibv_query_device_ex_input*, ibv_device_attr_ex* out,
                    size_t attr_size) noexcept {
    if (!out || attr_size < sizeof(ibv_device_attr)) return EINVAL;
    const DeviceConfig& cfg = to_uctx(ibctx)->state->device->config;
    ibv_device_attr_ex a{};
    ibv_device_attr& d = a.orig_attr;
    std::snprintf(d.fw_ver, sizeof d.fw_ver, "%s", "0.1.0");
    d.node_guid = htobe64(cfg.node_guid);
    d.sys_image_guid = d.node_guid;
    d.max_mr_size = kMaxMrSize;
    d.page_size_cap = 0xfffff000;
    d.vendor_id = kVendorId;
    d.vendor_part_id = kVendorPartId;
    d.hw_ver = 1;
    d.max_qp = kMaxQp;
    d.max_qp_wr = kMaxQpWr;
    d.device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SYS_IMAGE_GUID |
                         IBV_DEVICE_SRQ_RESIZE | IBV_DEVICE_MEM_WINDOW |
                         IBV_DEVICE_MEM_WINDOW_TYPE_2B | IBV_DEVICE_XRC;
    d.max_sge = kMaxSge;
    d.max_sge_rd = kMaxSge;
    d.max_cq = kMaxCq;
    d.max_cqe = kMaxCqe;
    d.max_mr = kMaxMr;
    d.max_pd = kMaxPd;
    d.max_srq = kMaxSrq;
    d.max_ah = kMaxAh;
    d.max_mw = kMaxMw;
    d.max_mcast_grp = kMaxMcastGroups;
    d.max_mcast_qp_attach = kMaxMcastQpAttach;
    d.max_total_mcast_qp_attach = kMaxMcastGroups * kMaxMcastQpAttach;
    d.max_srq_wr = kMaxSrqWr;
    d.max_srq_sge = kMaxSge;
    d.max_qp_rd_atom = kMaxRdAtomic;
    d.max_qp_init_rd_atom = kMaxRdAtomic;
    d.max_res_rd_atom = kMaxRdAtomic * kMaxQp;
    // Atomics run as CPU atomics on the target memory (transport/rc_atomics.cpp): atomic with
    // respect to every other atomic this device executes, as rxe reports.
    d.atomic_cap = IBV_ATOMIC_HCA;
    d.max_pkeys = 1;
    d.local_ca_ack_delay = 15;
    d.phys_port_cnt = 1;
    a.phys_port_cnt_ex = 1;
    // On-demand paging: every region is accessed by the CPU and never pinned (memory.cpp), on
    // every transport and operation; implicit regions are not offered.
    constexpr uint32_t kOdpAll = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV |
                                 IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ |
                                 IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
    a.odp_caps.general_caps = IBV_ODP_SUPPORT;
    a.odp_caps.per_transport_caps.rc_odp_caps = kOdpAll;
    a.odp_caps.per_transport_caps.uc_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV |
                                                IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_SRQ_RECV;
    a.odp_caps.per_transport_caps.ud_odp_caps =
        IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV;
    a.xrc_odp_caps = kOdpAll;
    // Completion timestamps are CLOCK_MONOTONIC nanoseconds (provider/cq_ex.cpp).
    a.completion_timestamp_mask = ~uint64_t{0};
    a.hca_core_clock = 1000000;  // kHz
    std::memcpy(out, &a, std::min(attr_size, sizeof a));
    if (attr_size > sizeof a)
        std::memset(reinterpret_cast<char*>(out) + sizeof a, 0, attr_size - sizeof a);
    return 0;
}

int query_port(ibv_context* ibctx, uint8_t port, ibv_port_attr* attr) noexcept {
    if (port != 1 || !attr) return EINVAL;
    const DeviceConfig& cfg = to_uctx(ibctx)->state->device->config;
    *attr = ibv_port_attr{};
    attr->state = IBV_PORT_ACTIVE;
    attr->max_mtu = IBV_MTU_4096;
    attr->active_mtu = mtu_enum(cfg.mtu);
    attr->gid_tbl_len = 1;
    attr->port_cap_flags = 0;
    attr->max_msg_sz = kMaxMessage;
    attr->bad_pkey_cntr = 0;
    attr->qkey_viol_cntr = 0;
    attr->pkey_tbl_len = 1;
    attr->lid = 0;
    attr->sm_lid = 0;
    attr->lmc = 0;
    attr->max_vl_num = 1;
    attr->sm_sl = 0;
    attr->subnet_timeout = 0;
    attr->init_type_reply = 0;
    attr->active_width = 2;   // 4x
    attr->active_speed = 32;  // EDR (25 Gb/s per lane)
    attr->phys_state = 5;     // LinkUp
    attr->link_layer = IBV_LINK_LAYER_ETHERNET;
    return 0;
}

}  // namespace uroce::provider
