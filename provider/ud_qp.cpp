// UD queue pairs: what modify_qp and post_send do differently for them (qp.cpp does the rest),
// and multicast attachment.
#include <cerrno>

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

int build_ud_wqe(const UroceQp& qp, const ibv_send_wr& wr, transport::SendWqe& w,
                 transport::UdDestination& dest) noexcept {
    ibv_context* ctx = qp.vqp.qp.context;
    switch (wr.opcode) {
        case IBV_WR_SEND:
            w.opcode = transport::SendOpcode::Send;
            break;
        case IBV_WR_SEND_WITH_IMM:
            w.opcode = transport::SendOpcode::SendWithImm;
            break;
        default:
            return EINVAL;  // UD carries SENDs only
    }
    ibv_ah* ah = wr.wr.ud.ah;
    if (!ah || ah->context != ctx) return EINVAL;
    uint64_t total = 0;
    if (int err = fill_send_wqe(qp, wr, w, total)) return err;
    // A datagram is one packet: larger than the port's MTU is refused (the QP checks it too).
    if (total > to_uctx(ctx)->state->device->config.mtu) return EINVAL;
    // An AH of another PD of this context is taken here and fails when its turn comes, as in
    // rxe (the QP checks it).
    dest =
        transport::UdDestination{to_uah(ah)->dst_ip, wr.wr.ud.remote_qpn & 0xffffff,
                                 wr.wr.ud.remote_qkey, to_uah(ah)->hop_limit, to_upd(ah->pd)->id};
    return 0;
}

int post_send_ud(UroceQp& qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) noexcept {
    ibv_context* ctx = qp.vqp.qp.context;
    auto& engine = *to_uctx(ctx)->state->engine;
    // WQEs queued with `more` go out with the last one, or here when a WQE is refused.
    auto refuse = [&](ibv_send_wr* bad, int err) {
        qp.ud->ring();
        engine.note_post();
        *bad_wr = bad;
        return err;
    };
    for (; wr; wr = wr->next) {
        transport::SendWqe w;
        transport::UdDestination dest;
        if (int err = build_ud_wqe(qp, *wr, w, dest)) return refuse(wr, err);
        if (int e = qp.ud->post_send(w, dest, wr->next != nullptr)) return refuse(wr, e);
    }
    engine.note_post();
    return 0;
}

// The lid is not used: RoCE has no LIDs.
int attach_mcast(ibv_qp* ibqp, const ibv_gid* gid, uint16_t) noexcept {
    if (inherited(ibqp->context)) return EIO;
    UroceQp* qp = to_uqp(ibqp);
    IpAddress group;
    // Only UD QPs have multicast, and only IPv4 (the engine refuses addresses not groups).
    if (!qp->ud || !gid || !gid_to_ip(*gid, AF_INET, group)) return EINVAL;
    try {
        return to_uctx(ibqp->context)->state->engine->attach_multicast(group, qp->ud);
    } catch (...) {
        return ENOMEM;
    }
}

int detach_mcast(ibv_qp* ibqp, const ibv_gid* gid, uint16_t) noexcept {
    if (inherited(ibqp->context)) return EIO;
    UroceQp* qp = to_uqp(ibqp);
    IpAddress group;
    if (!qp->ud || !gid || !gid_to_ip(*gid, AF_INET, group)) return EINVAL;
    return to_uctx(ibqp->context)->state->engine->detach_multicast(group, ibqp->qp_num);
}

}  // namespace uroce::provider
