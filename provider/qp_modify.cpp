// ibv_modify_qp: which attributes each state change requires and allows (IBA 11.2.5,
// table 91 "QP state transition properties", as Linux's ib_modify_qp_is_ok applies it for
// every kernel driver), the checks on their values, and the translation into the transport's
// attributes.
#include <arpa/inet.h>
#include <linux/capability.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <span>

#include "provider/device_limits.h"
#include "provider/objects.h"
#include "provider/qp_modify.h"

namespace uroce::provider {

namespace {

using transport::QpState;

QpState to_state(ibv_qp_state s, bool& ok) {
    ok = true;
    switch (s) {
        case IBV_QPS_RESET:
            return QpState::Reset;
        case IBV_QPS_INIT:
            return QpState::Init;
        case IBV_QPS_RTR:
            return QpState::Rtr;
        case IBV_QPS_RTS:
            return QpState::Rts;
        case IBV_QPS_SQD:
            return QpState::Sqd;
        case IBV_QPS_SQE:
            return QpState::Sqe;
        case IBV_QPS_ERR:
            return QpState::Err;
        default:
            ok = false;
            return QpState::Err;
    }
}

struct MaskRule {
    QpState from, to;
    int required;
    int optional;
};

constexpr int kAltPath = IBV_QP_ALT_PATH;

// RC rows of the IBA's transition table. Moves to RESET and ERR take no attributes.
constexpr MaskRule kRcRules[] = {
    {QpState::Reset, QpState::Init, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
    {QpState::Init, QpState::Init, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
    {QpState::Init, QpState::Rtr,
     IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
         IBV_QP_MIN_RNR_TIMER,
     kAltPath | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
    {QpState::Rtr, QpState::Rts,
     IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC,
     IBV_QP_CUR_STATE | kAltPath | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
         IBV_QP_PATH_MIG_STATE},
    {QpState::Rts, QpState::Rts, 0,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | kAltPath | IBV_QP_PATH_MIG_STATE |
         IBV_QP_MIN_RNR_TIMER},
    {QpState::Rts, QpState::Sqd, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY},
    {QpState::Sqd, QpState::Rts, 0,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | kAltPath | IBV_QP_MIN_RNR_TIMER |
         IBV_QP_PATH_MIG_STATE},
    {QpState::Sqd, QpState::Sqd, 0,
     IBV_QP_PORT | IBV_QP_AV | kAltPath | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX |
         IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
         IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC},
    {QpState::Sqe, QpState::Rts, 0, 0},  // an RC QP never enters SQE
};

// UC rows: RC's without what acknowledgements need (timers, retries, READ/atomic resources).
constexpr MaskRule kUcRules[] = {
    {QpState::Reset, QpState::Init, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
    {QpState::Init, QpState::Init, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
    {QpState::Init, QpState::Rtr, IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN,
     kAltPath | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
    {QpState::Rtr, QpState::Rts, IBV_QP_SQ_PSN,
     IBV_QP_CUR_STATE | kAltPath | IBV_QP_ACCESS_FLAGS | IBV_QP_PATH_MIG_STATE},
    {QpState::Rts, QpState::Rts, 0,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | kAltPath | IBV_QP_PATH_MIG_STATE},
    {QpState::Rts, QpState::Sqd, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY},
    {QpState::Sqd, QpState::Rts, 0,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | kAltPath | IBV_QP_PATH_MIG_STATE},
    {QpState::Sqd, QpState::Sqd, 0,
     IBV_QP_AV | kAltPath | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PATH_MIG_STATE},
    {QpState::Sqe, QpState::Rts, 0, IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS},
};

// XRC rows (IBA 11.2.5 for XRC, as Linux lays them out): the initiator needs no receive
// resources to reach RTR, the target no retry counts or READ credits to reach RTS. What a side
// does not use is dropped from the mask before these rows are read (ignored_attributes()).
constexpr int kRtsAttrs =
    IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
constexpr int kRtrRecvAttrs = IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
constexpr MaskRule kXrcInitiatorRules[] = {
    {QpState::Reset, QpState::Init, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
    {QpState::Init, QpState::Init, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
    {QpState::Init, QpState::Rtr, IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN,
     kAltPath | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
    {QpState::Rtr, QpState::Rts, IBV_QP_SQ_PSN | kRtsAttrs,
     IBV_QP_CUR_STATE | kAltPath | IBV_QP_ACCESS_FLAGS | IBV_QP_PATH_MIG_STATE},
    {QpState::Rts, QpState::Rts, 0,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | kAltPath | IBV_QP_PATH_MIG_STATE},
    {QpState::Rts, QpState::Sqd, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY},
    {QpState::Sqd, QpState::Rts, 0,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | kAltPath | IBV_QP_PATH_MIG_STATE},
    {QpState::Sqd, QpState::Sqd, 0,
     IBV_QP_PORT | IBV_QP_AV | kAltPath | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX |
         IBV_QP_PATH_MIG_STATE | kRtsAttrs},
    {QpState::Sqe, QpState::Rts, 0, 0},
};
constexpr MaskRule kXrcTargetRules[] = {
    {QpState::Reset, QpState::Init, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
    {QpState::Init, QpState::Init, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
    {QpState::Init, QpState::Rtr,
     IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | kRtrRecvAttrs,
     kAltPath | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
    {QpState::Rtr, QpState::Rts, IBV_QP_SQ_PSN | IBV_QP_TIMEOUT,
     IBV_QP_CUR_STATE | kAltPath | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
         IBV_QP_PATH_MIG_STATE},
    {QpState::Rts, QpState::Rts, 0,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | kAltPath | IBV_QP_PATH_MIG_STATE |
         IBV_QP_MIN_RNR_TIMER},
    {QpState::Rts, QpState::Sqd, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY},
    {QpState::Sqd, QpState::Rts, 0,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | kAltPath | IBV_QP_MIN_RNR_TIMER |
         IBV_QP_PATH_MIG_STATE},
    {QpState::Sqd, QpState::Sqd, 0,
     IBV_QP_PORT | IBV_QP_AV | IBV_QP_TIMEOUT | kAltPath | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX |
         IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE | IBV_QP_MAX_DEST_RD_ATOMIC},
    {QpState::Sqe, QpState::Rts, 0, 0},
};

// UD rows: no connection, so no address, PSN to expect, timers or access rights; a Q_Key.
constexpr MaskRule kUdRules[] = {
    {QpState::Reset, QpState::Init, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY, 0},
    {QpState::Init, QpState::Init, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY},
    {QpState::Init, QpState::Rtr, 0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY},
    {QpState::Rtr, QpState::Rts, IBV_QP_SQ_PSN, IBV_QP_CUR_STATE | IBV_QP_QKEY},
    {QpState::Rts, QpState::Rts, 0, IBV_QP_CUR_STATE | IBV_QP_QKEY},
    {QpState::Rts, QpState::Sqd, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY},
    {QpState::Sqd, QpState::Rts, 0, IBV_QP_CUR_STATE | IBV_QP_QKEY},
    {QpState::Sqd, QpState::Sqd, 0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY},
    {QpState::Sqe, QpState::Rts, 0, IBV_QP_CUR_STATE | IBV_QP_QKEY},
};

}  // namespace

bool gid_to_ip(const ibv_gid& gid, int family, IpAddress& ip) {
    const IpAddress a = IpAddress::from_bytes(gid.raw);
    if (a.family() != family || a.is_unspecified()) return false;
    ip = a;
    return true;
}

namespace {

// Whether the caller may give a QP a controlled Q_Key (bit 31, IBA 10.2.4), which reaches the
// services behind such keys (QP1's 0x80010000): Linux's ibv_modify_qp asks for CAP_NET_RAW of
// the calling thread (its netlink privileged-qkey mode has no counterpart here).
bool may_set_controlled_qkey() {
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[2]{};
    if (syscall(SYS_capget, &header, data) != 0) return false;
    return (data[CAP_NET_RAW / 32].effective & (1u << (CAP_NET_RAW % 32))) != 0;
}

}  // namespace

int ignored_attributes(ibv_qp_type type) {
    if (type == IBV_QPT_XRC_SEND) return kRtrRecvAttrs;
    if (type == IBV_QPT_XRC_RECV)
        return IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY;
    return 0;
}

int check_modify(ibv_qp_type type, QpState current, const ibv_qp_attr& attr, int mask, int family,
                 QpState& next) {
    // Before any other check, as Linux makes it.
    if ((mask & IBV_QP_QKEY) && (attr.qkey & 0x80000000u) && !may_set_controlled_qkey())
        return EPERM;
    bool ok = true;
    next = (mask & IBV_QP_STATE) ? to_state(attr.qp_state, ok) : current;
    if (!ok) return EINVAL;
    if ((mask & IBV_QP_CUR_STATE)) {
        QpState claimed = to_state(attr.cur_qp_state, ok);
        if (!ok || claimed != current) return EINVAL;
    }
    // CUR_STATE is taken only where a row lists it: no row from RESET or INIT does, nor any
    // move to RESET or ERR (Linux also checks the state it comes from; the rows imply it).
    if (!transport::rc_transition_allowed(current, next)) return EINVAL;
    const int attrs = mask & ~IBV_QP_STATE;
    if (next == QpState::Reset || next == QpState::Err) return attrs ? EINVAL : 0;
    std::span<const MaskRule> rules = kRcRules;
    if (type == IBV_QPT_UD) rules = kUdRules;
    if (type == IBV_QPT_UC) rules = kUcRules;
    if (type == IBV_QPT_XRC_SEND) rules = kXrcInitiatorRules;
    if (type == IBV_QPT_XRC_RECV) rules = kXrcTargetRules;
    for (const MaskRule& r : rules) {
        if (r.from != current || r.to != next) continue;
        if ((attrs & r.required) != r.required) return EINVAL;
        if (attrs & ~(r.required | r.optional)) return EINVAL;
        break;
    }
    // Values.
    if ((mask & IBV_QP_PKEY_INDEX) && attr.pkey_index != 0) return EINVAL;
    if ((mask & IBV_QP_PORT) && attr.port_num != 1) return EINVAL;
    // Only the remote rights mean something for a QP; the region-only flags (MW_BIND,
    // ZERO_BASED, ON_DEMAND, HUGETLB) are accepted and ignored, as the kernel's drivers do
    // (rdma-core's ODP tests pass the region's flags). Anything undefined is refused.
    if ((mask & IBV_QP_ACCESS_FLAGS) &&
        (attr.qp_access_flags &
         ~(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
           IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED |
           IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB)))
        return EINVAL;
    if (mask & IBV_QP_AV) {
        IpAddress ip;
        // RoCE carries every packet in UDP/IP: the address vector needs a GRH, whose GID is
        // of the device's family. A connection has one peer: a multicast group is no
        // destination for it.
        if (!attr.ah_attr.is_global || attr.ah_attr.grh.sgid_index != 0 ||
            !gid_to_ip(attr.ah_attr.grh.dgid, family, ip) || ip.is_multicast())
            return EINVAL;
        if (attr.ah_attr.port_num > 1) return EINVAL;
    }
    if (mask & IBV_QP_ALT_PATH) return EINVAL;  // no alternate paths on a single port
    if ((mask & IBV_QP_PATH_MTU) && (attr.path_mtu < IBV_MTU_256 || attr.path_mtu > IBV_MTU_4096))
        return EINVAL;
    if ((mask & IBV_QP_DEST_QPN) && attr.dest_qp_num > 0xffffff) return EINVAL;
    if ((mask & IBV_QP_RQ_PSN) && attr.rq_psn > 0xffffff) return EINVAL;
    if ((mask & IBV_QP_SQ_PSN) && attr.sq_psn > 0xffffff) return EINVAL;
    if ((mask & IBV_QP_MIN_RNR_TIMER) && attr.min_rnr_timer > 31) return EINVAL;
    if ((mask & IBV_QP_TIMEOUT) && attr.timeout > 31) return EINVAL;
    if ((mask & IBV_QP_RETRY_CNT) && attr.retry_cnt > 7) return EINVAL;
    if ((mask & IBV_QP_RNR_RETRY) && attr.rnr_retry > 7) return EINVAL;
    if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > kMaxRdAtomic) return EINVAL;
    if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > kMaxRdAtomic) return EINVAL;
    if ((mask & IBV_QP_PATH_MIG_STATE) && attr.path_mig_state != IBV_MIG_MIGRATED &&
        attr.path_mig_state != IBV_MIG_REARM && attr.path_mig_state != IBV_MIG_ARMED)
        return EINVAL;
    return 0;
}

transport::QpAttributes to_transport(const ibv_qp_attr& a, uint32_t port_mtu) {
    transport::QpAttributes t;
    if (a.qp_access_flags & IBV_ACCESS_REMOTE_WRITE) t.access |= transport::kRemoteWrite;
    if (a.qp_access_flags & IBV_ACCESS_REMOTE_READ) t.access |= transport::kRemoteRead;
    if (a.qp_access_flags & IBV_ACCESS_REMOTE_ATOMIC) t.access |= transport::kRemoteAtomic;
    t.dst_ip = IpAddress::from_bytes(a.ah_attr.grh.dgid.raw);  // checked by check_modify
    t.dest_qpn = a.dest_qp_num;
    // The path MTU is taken as the application sets it (both ends must agree on it, as they
    // segment and check by it); the port's MTU is only its default.
    t.mtu = a.path_mtu ? mtu_bytes(a.path_mtu) : port_mtu;
    t.rq_psn = a.rq_psn;
    t.sq_psn = a.sq_psn;
    t.timeout = a.timeout;
    t.retry_cnt = a.retry_cnt;
    t.rnr_retry = a.rnr_retry;
    t.min_rnr_timer = a.min_rnr_timer;
    t.max_rd_atomic = a.max_rd_atomic ? a.max_rd_atomic : 1;
    t.max_dest_rd_atomic = a.max_dest_rd_atomic;
    t.sqd_notify = a.en_sqd_async_notify != 0;
    return t;
}

}  // namespace uroce::provider
