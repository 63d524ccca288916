// UD queue pairs: what modify_qp and post_send do differently for them (qp.cpp does the rest),
// and multicast attachment.
#include <arpa/inet.h>

#include <cerrno>
#include <cstring>

#include "provider/device_limits.h"
#include "provider/objects.h"
#include "provider/qp_modify.h"

namespace uroce::provider {

int modify_ud_qp(UroceQp& qp, const ibv_qp_attr& attr, int mask, transport::QpState current,
                 transport::QpState next) noexcept {
    (void)mask;
    transport::UdAttributes a;
    a.qkey = attr.qkey;
    a.sq_psn = attr.sq_psn;
    // A datagram is one packet: the port's MTU bounds it.
    a.mtu = to_uctx(qp.vqp.qp.context)->state->device->config.mtu;
    a.sqd_notify = attr.en_sqd_async_notify != 0;
    return qp.ud->modify(a, current, next);
}

int post_send_ud(UroceQp& qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) noexcept {
    ibv_context* ctx = qp.vqp.qp.context;
    for (; wr; wr = wr->next) {
        transport::SendWqe w;
        int err = 0;
        switch (wr->opcode) {
            case IBV_WR_SEND:
                w.opcode = transport::SendOpcode::Send;
                break;
            case IBV_WR_SEND_WITH_IMM:
                w.opcode = transport::SendOpcode::SendWithImm;
                break;
            default:
                err = EINVAL;  // UD carries SENDs only
                break;
        }
        const bool is_inline = wr->send_flags & IBV_SEND_INLINE;
        ibv_ah* ah = wr->wr.ud.ah;
        if (!err && (!ah || ah->context != ctx)) err = EINVAL;
        if (!err && (wr->num_sge < 0 || wr->num_sge > kMaxSge)) err = EINVAL;
        uint64_t total = 0;
        for (int i = 0; !err && i < wr->num_sge; ++i) total += wr->sg_list[i].length;
        if (!err && is_inline && total > kMaxInline) err = EINVAL;
        if (err) {
            *bad_wr = wr;
            return err;
        }
        w.wr_id = wr->wr_id;
        w.signaled = qp.sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
        w.solicited = wr->send_flags & IBV_SEND_SOLICITED;
        w.is_inline = is_inline;
        // Larger than the MTU is refused by the QP (EINVAL); keep the sum from wrapping.
        w.length = total > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(total);
        if (is_inline) {
            uint32_t off = 0;
            for (int i = 0; i < wr->num_sge; ++i) {
                std::memcpy(w.inline_data.data() + off,
                            reinterpret_cast<const void*>(wr->sg_list[i].addr),
                            wr->sg_list[i].length);
                off += wr->sg_list[i].length;
            }
        } else {
            w.sgl.count = static_cast<uint32_t>(wr->num_sge);
            for (int i = 0; i < wr->num_sge; ++i)
                w.sgl.sge[i] = {wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey};
        }
        w.imm = ntohl(wr->imm_data);
        const transport::UdDestination dest{to_uah(ah)->dst_ip, wr->wr.ud.remote_qpn & 0xffffff,
                                            wr->wr.ud.remote_qkey, to_uah(ah)->hop_limit};
        if (int e = qp.ud->post_send(w, dest)) {
            *bad_wr = wr;
            return e;
        }
    }
    return 0;
}

// The lid is not used: RoCE has no LIDs.
int attach_mcast(ibv_qp* ibqp, const ibv_gid* gid, uint16_t) noexcept {
    if (inherited(ibqp->context)) return EIO;
    UroceQp* qp = to_uqp(ibqp);
    uint32_t group = 0;
    // Only UD QPs have multicast, and only IPv4 (the engine refuses addresses not groups).
    if (!qp->ud || !gid || !gid_to_ipv4(*gid, group)) return EINVAL;
    try {
        return to_uctx(ibqp->context)->state->engine->attach_multicast(group, qp->ud);
    } catch (...) {
        return ENOMEM;
    }
}

int detach_mcast(ibv_qp* ibqp, const ibv_gid* gid, uint16_t) noexcept {
    if (inherited(ibqp->context)) return EIO;
    UroceQp* qp = to_uqp(ibqp);
    uint32_t group = 0;
    if (!qp->ud || !gid || !gid_to_ipv4(*gid, group)) return EINVAL;
    return to_uctx(ibqp->context)->state->engine->detach_multicast(group, ibqp->qp_num);
}

}  // namespace uroce::provider
