// The receive side of the CM agent: what each incoming CM message does to the connection it
// names (see cm_agent.h).
#include <type_traits>

#include "transport/cm/cm_agent.h"
#include "transport/cm/cm_agent_messages.h"

namespace uroce::transport::cm {

using namespace agent_messages;

CmAgent::Connection* CmAgent::addressed(uint32_t peer_ip, uint32_t our_id) {
    Connection* c = find(our_id);
    // A message naming our connection from another address is not from our peer: a forger
    // who guessed the comm ID must not be able to steer the connection.
    if (!c || c->peer_ip != peer_ip) return nullptr;
    return c;
}

void CmAgent::on_mad(uint32_t peer_ip, std::span<const uint8_t> bytes) {
    const NotifyOnExit notify{*this};
    Events out;
    {
        std::lock_guard lock(mutex_);
        ++counters_.rx_mads;
        CmMad mad;
        if (decode_cm_mad(bytes, mad) != CmDecodeError::None) {
            ++counters_.rx_malformed;
            return;
        }
        if (std::holds_alternative<CmReq>(mad.body)) {
            on_req(peer_ip, mad, out, true);
        } else if (std::holds_alternative<CmSidrReq>(mad.body)) {
            on_sidr_req(peer_ip, mad, out, true);
        } else {
            on_answer(peer_ip, mad, out);
        }
    }
    dispatch(out);
}

bool CmAgent::hold_unmatched(uint32_t peer_ip, const CmMad& mad, uint64_t service_id,
                             uint32_t peer_id) {
    for (const HeldRequest& h : held_) {
        if (h.peer_ip == peer_ip && h.peer_id == peer_id &&
            h.mad.body.index() == mad.body.index()) {
            ++counters_.rx_duplicates;
            return true;
        }
    }
    if (timers_.unmatched_hold <= CmClock::duration::zero() || held_.size() >= kMaxHeldRequests)
        return false;
    held_.push_back({peer_ip, peer_id, service_id, mad, clock_() + timers_.unmatched_hold});
    ++counters_.rx_held;
    return true;
}

void CmAgent::release_held(CmClock::time_point now, Events& out) {
    // Taken out first: on_req() may not touch held_ while it is walked.
    std::vector<HeldRequest> due;
    for (auto it = held_.begin(); it != held_.end();) {
        if (it->deadline <= now) {
            due.push_back(std::move(*it));
            it = held_.erase(it);
        } else {
            ++it;
        }
    }
    for (const HeldRequest& h : due) {
        if (!listeners_.contains(h.service_id) && listened_elsewhere_ &&
            listened_elsewhere_(h.service_id)) {
            // Its listener came up in another context: a REJ would end the connection the
            // peer's resend can still make. Say nothing.
            ++counters_.rx_left_to_other;
            continue;
        }
        if (std::holds_alternative<CmReq>(h.mad.body)) {
            on_req(h.peer_ip, h.mad, out, false);
        } else {
            on_sidr_req(h.peer_ip, h.mad, out, false);
        }
    }
}

void CmAgent::on_req(uint32_t peer_ip, const CmMad& mad, Events& out, bool may_hold) {
    const CmReq& req = std::get<CmReq>(mad.body);
    auto dup = by_peer_.find({peer_ip, req.local_comm_id});
    if (dup != by_peer_.end()) {
        Connection* c = find(dup->second);
        ++counters_.rx_duplicates;
        // Our answer was lost: send it again (MRA or REP). Still deciding: nothing to say.
        if (c && (c->state == CmState::MraSent || c->state == CmState::RepSent) && c->last_sent)
            send_once(c->peer_ip, *c->last_sent);
        return;
    }
    auto l = listeners_.find(req.service_id);
    if (l == listeners_.end() && may_hold &&
        hold_unmatched(peer_ip, mad, req.service_id, req.local_comm_id))
        return;
    const uint32_t id = l == listeners_.end() ? 0 : allocate_id();
    if (id == 0) {
        const auto reason =
            l == listeners_.end() ? CmRejectReason::InvalidServiceId : CmRejectReason::NoResources;
        if (l == listeners_.end()) ++counters_.rx_unmatched;
        send_reject(peer_ip, mad.header.transaction_id,
                    make_rej(0, req.local_comm_id, CmMessageKind::Req, reason));
        return;
    }
    Connection& c = connections_[id];
    c.local_id = id;
    c.remote_id = req.local_comm_id;
    c.peer_ip = peer_ip;
    c.state = CmState::ReqReceived;
    c.tid = mad.header.transaction_id;
    c.remote_qpn = req.local_qpn;
    c.listener = l->second;
    by_peer_[{peer_ip, c.remote_id}] = id;
    emit(out, c, CmEventType::ReqReceived, &mad);
}

void CmAgent::on_sidr_req(uint32_t peer_ip, const CmMad& mad, Events& out, bool may_hold) {
    const CmSidrReq& req = std::get<CmSidrReq>(mad.body);
    auto dup = by_peer_.find({peer_ip, req.request_id});
    if (dup != by_peer_.end()) {
        Connection* c = find(dup->second);
        ++counters_.rx_duplicates;
        if (c && c->state == CmState::Timewait && c->last_sent)
            send_once(c->peer_ip, *c->last_sent);
        return;
    }
    auto l = listeners_.find(req.service_id);
    if (l == listeners_.end() && may_hold &&
        hold_unmatched(peer_ip, mad, req.service_id, req.request_id))
        return;
    const uint32_t id = l == listeners_.end() ? 0 : allocate_id();
    if (id == 0) {
        CmSidrRep r;
        r.request_id = req.request_id;
        r.service_id = req.service_id;
        r.status = static_cast<uint8_t>(l == listeners_.end() ? SidrStatus::ServiceIdNotSupported
                                                              : SidrStatus::NoQp);
        send_once(peer_ip, with_tid(mad.header.transaction_id, r));
        ++counters_.rx_unmatched;
        return;
    }
    Connection& c = connections_[id];
    c.local_id = id;
    c.remote_id = req.request_id;
    c.peer_ip = peer_ip;
    c.state = CmState::SidrReqReceived;
    c.tid = mad.header.transaction_id;
    c.listener = l->second;
    by_peer_[{peer_ip, c.remote_id}] = id;
    emit(out, c, CmEventType::SidrReqReceived, &mad);
}

void CmAgent::on_answer(uint32_t peer_ip, const CmMad& mad, Events& out) {
    // Every message but REQ and SIDR REQ names our connection: REP, RTU, MRA, REJ, DREQ and
    // DREP in their remote comm ID field, SIDR REP in its request ID.
    const uint32_t our_id = std::visit(
        [](const auto& b) -> uint32_t {
            using B = std::decay_t<decltype(b)>;
            if constexpr (std::is_same_v<B, CmSidrRep>) {
                return b.request_id;
            } else if constexpr (requires { b.remote_comm_id; }) {
                return b.remote_comm_id;
            } else {
                return 0;
            }
        },
        mad.body);
    Connection* c = addressed(peer_ip, our_id);
    if (const auto* rej = std::get_if<CmRej>(&mad.body); !c && rej && our_id == 0) {
        // An active side that gives up on its REQ before it learnt our comm ID (REJ Timeout
        // from a destroyed or timed-out REQ) names the connection by its own comm ID, the
        // key a resent REQ finds it by (the kernel's CM looks it up the same way).
        if (auto p = by_peer_.find({peer_ip, rej->local_comm_id}); p != by_peer_.end())
            c = find(p->second);
    }
    if (!c) {
        ++counters_.rx_unmatched;
        // A DREQ for a connection we no longer know: answer it, so the peer leaves its
        // DREQ-sent state now rather than after its retries (IBA 12.9.6).
        if (const auto* d = std::get_if<CmDreq>(&mad.body))
            send_once(peer_ip, with_tid(mad.header.transaction_id,
                                        make_drep(d->remote_comm_id, d->local_comm_id)));
        return;
    }
    const auto unexpected = [this] { ++counters_.rx_unexpected; };
    // Once the peer's comm ID is known, a message must carry it too.
    const auto from_peer = [c](uint32_t their_id) {
        return c->remote_id == 0 || c->remote_id == their_id;
    };

    if (const auto* rep = std::get_if<CmRep>(&mad.body)) {
        if (c->state == CmState::ReqSent) {
            c->state = CmState::RepReceived;
            c->remote_id = rep->local_comm_id;
            c->remote_qpn = rep->local_qpn;
            c->awaiting = false;
            c->deadline.reset();
            emit(out, *c, CmEventType::RepReceived, &mad);
        } else if (c->state == CmState::RepReceived && from_peer(rep->local_comm_id)) {
            ++counters_.rx_duplicates;  // our user has not answered yet
        } else if (c->state == CmState::Established && from_peer(rep->local_comm_id) &&
                   c->last_sent && std::holds_alternative<CmRtu>(c->last_sent->body)) {
            ++counters_.rx_duplicates;  // our RTU was lost
            send_once(c->peer_ip, *c->last_sent);
        } else {
            unexpected();
        }
    } else if (const auto* rtu = std::get_if<CmRtu>(&mad.body)) {
        if (!from_peer(rtu->local_comm_id)) {
            unexpected();
        } else if (c->state == CmState::RepSent) {
            c->state = CmState::Established;
            c->awaiting = false;
            c->deadline.reset();
            emit(out, *c, CmEventType::Established, &mad);
        } else if (c->state == CmState::Established) {
            ++counters_.rx_duplicates;
        } else {
            unexpected();
        }
    } else if (const auto* mra = std::get_if<CmMra>(&mad.body)) {
        const bool req_mraed =
            c->state == CmState::ReqSent && mra->message_mraed == CmMessageKind::Req;
        const bool rep_mraed =
            c->state == CmState::RepSent && mra->message_mraed == CmMessageKind::Rep;
        if ((req_mraed || rep_mraed) && from_peer(mra->local_comm_id)) {
            // The peer needs longer: wait its service timeout on top of ours, without resending
            // (IBA 12.6.6); its answer, or nothing, comes after that.
            c->retries_left = 0;
            c->deadline = clock_() + response_time(mra->service_timeout) +
                          response_time(timers_.response_exponent);
        } else {
            unexpected();
        }
    } else if (const auto* rej = std::get_if<CmRej>(&mad.body)) {
        const bool setting_up = c->state == CmState::ReqSent || c->state == CmState::ReqReceived ||
                                c->state == CmState::MraSent || c->state == CmState::RepSent ||
                                c->state == CmState::RepReceived;
        // A REJ of our REQ may come before the peer had an ID of its own for us.
        if (setting_up && (c->state == CmState::ReqSent || from_peer(rej->local_comm_id))) {
            const Connection gone = *c;
            remove(c->local_id);
            emit(out, gone, CmEventType::Rejected, &mad);
        } else {
            unexpected();
        }
    } else if (const auto* dreq = std::get_if<CmDreq>(&mad.body)) {
        if (!from_peer(dreq->local_comm_id)) {
            unexpected();
        } else if (c->state == CmState::Established || c->state == CmState::RepSent ||
                   c->state == CmState::DreqSent) {
            // RepSent: our peer took its QP to RTS and is already leaving (the RTU was lost).
            // DreqSent: both sides disconnect at once; each answers the other's DREQ.
            c->state = CmState::DreqReceived;
            c->tid = mad.header.transaction_id;
            c->awaiting = false;
            c->deadline.reset();
            if (c->silent) {
                answer_dreq(*c, make_drep(c->local_id, c->remote_id), false);
            } else {
                emit(out, *c, CmEventType::DreqReceived, &mad);
            }
        } else if (c->state == CmState::DreqReceived) {
            ++counters_.rx_duplicates;  // our user has not answered yet
        } else if (c->state == CmState::Timewait) {
            ++counters_.rx_duplicates;  // our DREP was lost, or we never sent one
            send_once(c->peer_ip,
                      with_tid(mad.header.transaction_id, make_drep(c->local_id, c->remote_id)));
        } else {
            unexpected();
        }
    } else if (const auto* drep = std::get_if<CmDrep>(&mad.body)) {
        if (c->state == CmState::DreqSent && from_peer(drep->local_comm_id)) {
            enter_timewait(*c, true);
            emit(out, *c, CmEventType::Disconnected, &mad);
        } else if ((c->state == CmState::DreqReceived || c->state == CmState::Timewait) &&
                   from_peer(drep->local_comm_id)) {
            // The answer to our DREQ after we answered theirs: both sides are leaving.
            ++counters_.rx_duplicates;
        } else {
            unexpected();
        }
    } else if (std::holds_alternative<CmSidrRep>(mad.body)) {
        if (c->state == CmState::SidrReqSent) {
            const Connection done = *c;
            remove(c->local_id);
            emit(out, done, CmEventType::SidrRepReceived, &mad);
        } else {
            unexpected();
        }
    } else {
        unexpected();
    }
}

}  // namespace uroce::transport::cm
