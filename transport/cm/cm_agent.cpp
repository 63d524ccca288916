#include "transport/cm/cm_agent.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transport/random_source.h"

namespace uroce::transport::cm {

namespace {

// The top half of the transaction IDs this agent starts (REQ, DREQ, SIDR REQ); the bottom
// half is the local comm ID. Answers (REP, RTU, MRA, REJ, DREP, SIDR REP) carry the
// transaction ID of the message they answer, as the kernel's CM does.
constexpr uint64_t kTidHigh = 0x00000001ull << 32;
constexpr uint32_t kIdBits = 20;
constexpr uint32_t kIdMask = (1u << kIdBits) - 1;

template <size_t N>
bool copy_private(std::span<const uint8_t> from, std::array<uint8_t, N>& to) {
    if (from.size() > N) return false;
    std::fill(to.begin(), to.end(), 0);
    std::copy(from.begin(), from.end(), to.begin());
    return true;
}

}  // namespace

CmClock::duration response_time(uint8_t exponent) {
    // 4.096 us * 2^exponent, exponents above 31 treated as 31 (IBA caps the field at 5 bits).
    const uint64_t ns = 4096ull << std::min<uint8_t>(exponent, 31);
    return std::chrono::duration_cast<CmClock::duration>(std::chrono::nanoseconds(ns));
}

const char* to_string(CmState s) {
    switch (s) {
        case CmState::ReqSent:
            return "REQ sent";
        case CmState::ReqReceived:
            return "REQ received";
        case CmState::MraSent:
            return "MRA sent";
        case CmState::RepSent:
            return "REP sent";
        case CmState::RepReceived:
            return "REP received";
        case CmState::Established:
            return "established";
        case CmState::DreqSent:
            return "DREQ sent";
        case CmState::DreqReceived:
            return "DREQ received";
        case CmState::Timewait:
            return "timewait";
        case CmState::SidrReqSent:
            return "SIDR REQ sent";
        case CmState::SidrReqReceived:
            return "SIDR REQ received";
    }
    return "?";
}

const char* to_string(CmEventType t) {
    switch (t) {
        case CmEventType::ReqReceived:
            return "REQ received";
        case CmEventType::RepReceived:
            return "REP received";
        case CmEventType::Established:
            return "established";
        case CmEventType::Rejected:
            return "rejected";
        case CmEventType::Unreachable:
            return "unreachable";
        case CmEventType::DreqReceived:
            return "DREQ received";
        case CmEventType::Disconnected:
            return "disconnected";
        case CmEventType::TimewaitExit:
            return "timewait exit";
        case CmEventType::SidrReqReceived:
            return "SIDR REQ received";
        case CmEventType::SidrRepReceived:
            return "SIDR REP received";
        case CmEventType::SidrTimeout:
            return "SIDR timeout";
    }
    return "?";
}

CmAgent::CmAgent(MadSender& sender, uint16_t comm_id_prefix, uint64_t ca_guid, CmTimers timers,
                 EventHandler on_event, Clock clock)
    : sender_(sender),
      prefix_(static_cast<uint32_t>(comm_id_prefix & 0xfff) << kIdBits),
      ca_guid_(ca_guid),
      timers_(timers),
      on_event_(std::move(on_event)),
      clock_(std::move(clock)),
      next_id_(static_cast<uint32_t>(random_u64())) {}

int CmAgent::listen(uint64_t service_id, uint64_t listener) {
    std::lock_guard lock(mutex_);
    return listeners_.emplace(service_id, listener).second ? 0 : EADDRINUSE;
}

void CmAgent::stop_listening(uint64_t service_id) {
    std::lock_guard lock(mutex_);
    listeners_.erase(service_id);
}

uint32_t CmAgent::allocate_id() {
    // Random, so that a blind peer cannot guess the ID a DREQ or REJ must name; never 0.
    for (int attempt = 0; attempt < 64; ++attempt) {
        const uint32_t id = prefix_ | (static_cast<uint32_t>(random_u64()) & kIdMask);
        if ((id & kIdMask) != 0 && !connections_.contains(id)) return id;
    }
    // A crowded table: walk from where the last walk stopped.
    for (uint32_t n = 0; n <= kIdMask; ++n) {
        const uint32_t id = prefix_ | (next_id_++ & kIdMask);
        if ((id & kIdMask) != 0 && !connections_.contains(id)) return id;
    }
    return 0;
}

CmAgent::Connection* CmAgent::find(uint32_t comm_id) {
    auto it = connections_.find(comm_id);
    return it == connections_.end() ? nullptr : &it->second;
}

void CmAgent::send_once(uint32_t peer_ip, const CmMad& mad) {
    const auto bytes = encode_cm_mad(mad);
    ++counters_.tx_mads;
    sender_.send_mad(peer_ip, bytes);
}

void CmAgent::transmit(Connection& c, const CmMad& mad, bool await_answer) {
    send_once(c.peer_ip, mad);
    c.last_sent = mad;
    c.awaiting = await_answer;
    if (await_answer) {
        c.retries_left = timers_.max_retries;
        c.deadline = clock_() + response_time(timers_.response_exponent);
    } else {
        c.deadline.reset();
    }
}

void CmAgent::enter_timewait(Connection& c, bool report_exit) {
    c.state = CmState::Timewait;
    c.awaiting = false;
    c.report_exit = report_exit;
    c.deadline = clock_() + timers_.timewait;
}

void CmAgent::remove(uint32_t comm_id) {
    auto it = connections_.find(comm_id);
    if (it == connections_.end()) return;
    auto p = by_peer_.find({it->second.peer_ip, it->second.remote_id});
    if (p != by_peer_.end() && p->second == comm_id) by_peer_.erase(p);
    connections_.erase(it);
}

void CmAgent::emit(Events& out, const Connection& c, CmEventType type, const CmMad* cause) {
    if (c.silent) return;
    CmEvent ev{type, c.local_id, c.listener, c.peer_ip, std::nullopt};
    if (cause) ev.message = *cause;
    out.push_back(std::move(ev));
}

void CmAgent::dispatch(const Events& events) {
    for (const CmEvent& ev : events) on_event_(ev);
}

uint32_t CmAgent::send_req(uint32_t peer_ip, CmReq req) {
    const NotifyOnExit notify{*this};
    std::lock_guard lock(mutex_);
    const uint32_t id = allocate_id();
    if (id == 0) return 0;
    Connection& c = connections_[id];
    c.local_id = id;
    c.peer_ip = peer_ip;
    c.state = CmState::ReqSent;
    c.tid = kTidHigh | id;
    req.local_comm_id = id;
    req.local_ca_guid = ca_guid_;
    req.remote_cm_response_timeout = timers_.response_exponent;
    req.local_cm_response_timeout = timers_.response_exponent;
    req.max_cm_retries = std::min<uint8_t>(timers_.max_retries, 15);
    MadHeader h;
    h.transaction_id = c.tid;
    transmit(c, CmMad{h, req}, true);
    return id;
}

uint32_t CmAgent::send_sidr_req(uint32_t peer_ip, CmSidrReq req) {
    const NotifyOnExit notify{*this};
    std::lock_guard lock(mutex_);
    const uint32_t id = allocate_id();
    if (id == 0) return 0;
    Connection& c = connections_[id];
    c.local_id = id;
    c.peer_ip = peer_ip;
    c.state = CmState::SidrReqSent;
    c.tid = kTidHigh | id;
    req.request_id = id;
    MadHeader h;
    h.transaction_id = c.tid;
    transmit(c, CmMad{h, req}, true);
    return id;
}

int CmAgent::send_rep(uint32_t comm_id, CmRep rep) {
    const NotifyOnExit notify{*this};
    std::lock_guard lock(mutex_);
    Connection* c = find(comm_id);
    if (!c || (c->state != CmState::ReqReceived && c->state != CmState::MraSent)) return EINVAL;
    rep.local_comm_id = c->local_id;
    rep.remote_comm_id = c->remote_id;
    rep.local_ca_guid = ca_guid_;
    MadHeader h;
    h.transaction_id = c->tid;
    c->state = CmState::RepSent;
    transmit(*c, CmMad{h, rep}, true);
    return 0;
}

int CmAgent::send_mra(uint32_t comm_id, uint8_t service_timeout) {
    std::lock_guard lock(mutex_);
    Connection* c = find(comm_id);
    if (!c || c->state != CmState::ReqReceived) return EINVAL;
    CmMra m;
    m.local_comm_id = c->local_id;
    m.remote_comm_id = c->remote_id;
    m.message_mraed = CmMessageKind::Req;
    m.service_timeout = static_cast<uint8_t>(service_timeout & 0x1f);
    MadHeader h;
    h.transaction_id = c->tid;
    c->state = CmState::MraSent;
    transmit(*c, CmMad{h, m}, false);
    return 0;
}

int CmAgent::send_rtu(uint32_t comm_id, std::span<const uint8_t> private_data) {
    std::lock_guard lock(mutex_);
    Connection* c = find(comm_id);
    if (!c || c->state != CmState::RepReceived) return EINVAL;
    CmRtu r;
    if (!copy_private(private_data, r.private_data)) return EINVAL;
    r.local_comm_id = c->local_id;
    r.remote_comm_id = c->remote_id;
    MadHeader h;
    h.transaction_id = c->tid;
    c->state = CmState::Established;
    // Kept in last_sent: a resent REP (our RTU was lost) gets it again.
    transmit(*c, CmMad{h, r}, false);
    return 0;
}

int CmAgent::send_rej(uint32_t comm_id, CmRejectReason reason,
                      std::span<const uint8_t> private_data) {
    std::lock_guard lock(mutex_);
    Connection* c = find(comm_id);
    if (!c) return EINVAL;
    CmRej r;
    switch (c->state) {
        case CmState::ReqReceived:
        case CmState::MraSent:
            r.message_rejected = CmMessageKind::Req;
            break;
        case CmState::RepReceived:
            r.message_rejected = CmMessageKind::Rep;
            break;
        default:
            return EINVAL;
    }
    if (!copy_private(private_data, r.private_data)) return EINVAL;
    r.local_comm_id = c->local_id;
    r.remote_comm_id = c->remote_id;
    r.reason = static_cast<uint16_t>(reason);
    MadHeader h;
    h.transaction_id = c->tid;
    send_once(c->peer_ip, CmMad{h, r});
    ++counters_.rej_sent;
    remove(comm_id);
    return 0;
}

int CmAgent::send_dreq(uint32_t comm_id, std::span<const uint8_t> private_data) {
    const NotifyOnExit notify{*this};
    std::lock_guard lock(mutex_);
    Connection* c = find(comm_id);
    if (!c || c->state != CmState::Established) return EINVAL;
    CmDreq d;
    if (!copy_private(private_data, d.private_data)) return EINVAL;
    d.local_comm_id = c->local_id;
    d.remote_comm_id = c->remote_id;
    d.remote_qpn = c->remote_qpn;
    MadHeader h;
    h.transaction_id = kTidHigh | c->local_id;
    c->state = CmState::DreqSent;
    transmit(*c, CmMad{h, d}, true);
    return 0;
}

int CmAgent::send_drep(uint32_t comm_id, std::span<const uint8_t> private_data) {
    const NotifyOnExit notify{*this};
    std::lock_guard lock(mutex_);
    Connection* c = find(comm_id);
    if (!c || c->state != CmState::DreqReceived) return EINVAL;
    CmDrep d;
    if (!copy_private(private_data, d.private_data)) return EINVAL;
    d.local_comm_id = c->local_id;
    d.remote_comm_id = c->remote_id;
    MadHeader h;
    h.transaction_id = c->tid;
    transmit(*c, CmMad{h, d}, false);
    enter_timewait(*c, true);
    return 0;
}

int CmAgent::send_sidr_rep(uint32_t comm_id, CmSidrRep rep) {
    const NotifyOnExit notify{*this};
    std::lock_guard lock(mutex_);
    Connection* c = find(comm_id);
    if (!c || c->state != CmState::SidrReqReceived) return EINVAL;
    rep.request_id = c->remote_id;
    MadHeader h;
    h.transaction_id = c->tid;
    transmit(*c, CmMad{h, rep}, false);
    // Kept a while, quietly, so that a resent SIDR REQ gets the same answer.
    enter_timewait(*c, false);
    return 0;
}

int CmAgent::notify_established(uint32_t comm_id) {
    Events out;
    {
        std::lock_guard lock(mutex_);
        Connection* c = find(comm_id);
        if (!c || c->state != CmState::RepSent) return EINVAL;
        c->state = CmState::Established;
        c->awaiting = false;
        c->deadline.reset();
        emit(out, *c, CmEventType::Established, nullptr);
    }
    dispatch(out);
    return 0;
}

void CmAgent::destroy(uint32_t comm_id) {
    const NotifyOnExit notify{*this};
    std::lock_guard lock(mutex_);
    Connection* c = find(comm_id);
    if (!c) return;
    c->silent = true;
    MadHeader h;
    h.transaction_id = c->tid;
    switch (c->state) {
        case CmState::ReqSent:
        case CmState::ReqReceived:
        case CmState::MraSent:
        case CmState::RepSent:
        case CmState::RepReceived: {
            // IBA 12.9.7: abandoning a connection being set up rejects it; the active side
            // says Timeout, with its CA GUID as additional information, as the kernel does.
            CmRej r;
            r.local_comm_id = c->local_id;
            r.remote_comm_id = c->remote_id;
            const bool active = c->state == CmState::ReqSent || c->state == CmState::RepReceived;
            r.message_rejected = c->state == CmState::RepReceived ? CmMessageKind::Rep
                                 : c->state == CmState::RepSent   ? CmMessageKind::Other
                                 : active                         ? CmMessageKind::Other
                                                                  : CmMessageKind::Req;
            if (active) {
                r.reason = static_cast<uint16_t>(CmRejectReason::Timeout);
                r.reject_info_length = 8;
                for (int i = 0; i < 8; ++i)
                    r.additional_reject_info[i] = static_cast<uint8_t>(ca_guid_ >> (56 - 8 * i));
            } else {
                r.reason = static_cast<uint16_t>(CmRejectReason::ConsumerReject);
            }
            send_once(c->peer_ip, CmMad{h, r});
            ++counters_.rej_sent;
            remove(comm_id);
            return;
        }
        case CmState::Established: {
            CmDreq d;
            d.local_comm_id = c->local_id;
            d.remote_comm_id = c->remote_id;
            d.remote_qpn = c->remote_qpn;
            h.transaction_id = kTidHigh | c->local_id;
            c->state = CmState::DreqSent;
            transmit(*c, CmMad{h, d}, true);
            return;
        }
        case CmState::DreqReceived: {
            CmDrep d;
            d.local_comm_id = c->local_id;
            d.remote_comm_id = c->remote_id;
            transmit(*c, CmMad{h, d}, false);
            enter_timewait(*c, false);
            return;
        }
        case CmState::DreqSent:
        case CmState::Timewait:
            return;  // finishes on its own, silently now
        case CmState::SidrReqSent:
        case CmState::SidrReqReceived:
            remove(comm_id);
            return;
    }
}

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
            on_req(peer_ip, mad, out);
        } else if (std::holds_alternative<CmSidrReq>(mad.body)) {
            on_sidr_req(peer_ip, mad, out);
        } else {
            on_answer(peer_ip, mad, out);
        }
    }
    dispatch(out);
}

void CmAgent::on_req(uint32_t peer_ip, const CmMad& mad, Events& out) {
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
    if (l == listeners_.end()) {
        CmRej r;
        r.local_comm_id = 0;
        r.remote_comm_id = req.local_comm_id;
        r.message_rejected = CmMessageKind::Req;
        r.reason = static_cast<uint16_t>(CmRejectReason::InvalidServiceId);
        MadHeader h;
        h.transaction_id = mad.header.transaction_id;
        send_once(peer_ip, CmMad{h, r});
        ++counters_.rej_sent;
        ++counters_.rx_unmatched;
        return;
    }
    const uint32_t id = allocate_id();
    if (id == 0) {
        CmRej r;
        r.remote_comm_id = req.local_comm_id;
        r.message_rejected = CmMessageKind::Req;
        r.reason = static_cast<uint16_t>(CmRejectReason::NoResources);
        MadHeader h;
        h.transaction_id = mad.header.transaction_id;
        send_once(peer_ip, CmMad{h, r});
        ++counters_.rej_sent;
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

void CmAgent::on_sidr_req(uint32_t peer_ip, const CmMad& mad, Events& out) {
    const CmSidrReq& req = std::get<CmSidrReq>(mad.body);
    auto dup = by_peer_.find({peer_ip, req.request_id});
    if (dup != by_peer_.end()) {
        Connection* c = find(dup->second);
        ++counters_.rx_duplicates;
        if (c && c->state == CmState::Timewait && c->last_sent)
            send_once(c->peer_ip, *c->last_sent);
        return;
    }
    MadHeader h;
    h.transaction_id = mad.header.transaction_id;
    auto l = listeners_.find(req.service_id);
    const uint32_t id = l == listeners_.end() ? 0 : allocate_id();
    if (id == 0) {
        CmSidrRep r;
        r.request_id = req.request_id;
        r.service_id = req.service_id;
        r.status = static_cast<uint8_t>(l == listeners_.end() ? SidrStatus::ServiceIdNotSupported
                                                              : SidrStatus::NoQp);
        send_once(peer_ip, CmMad{h, r});
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
    if (!c) {
        ++counters_.rx_unmatched;
        // A DREQ for a connection we no longer know: answer it, so the peer leaves its
        // DREQ-sent state now rather than after its retries (IBA 12.9.6).
        if (const auto* d = std::get_if<CmDreq>(&mad.body)) {
            CmDrep r;
            r.local_comm_id = d->remote_comm_id;
            r.remote_comm_id = d->local_comm_id;
            MadHeader h;
            h.transaction_id = mad.header.transaction_id;
            send_once(peer_ip, CmMad{h, r});
        }
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
                CmDrep r;
                r.local_comm_id = c->local_id;
                r.remote_comm_id = c->remote_id;
                MadHeader h;
                h.transaction_id = c->tid;
                transmit(*c, CmMad{h, r}, false);
                enter_timewait(*c, false);
            } else {
                emit(out, *c, CmEventType::DreqReceived, &mad);
            }
        } else if (c->state == CmState::DreqReceived) {
            ++counters_.rx_duplicates;  // our user has not answered yet
        } else if (c->state == CmState::Timewait) {
            ++counters_.rx_duplicates;  // our DREP was lost, or we never sent one
            CmDrep r;
            r.local_comm_id = c->local_id;
            r.remote_comm_id = c->remote_id;
            MadHeader h;
            h.transaction_id = mad.header.transaction_id;
            send_once(c->peer_ip, CmMad{h, r});
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

void CmAgent::expire() {
    const NotifyOnExit notify{*this};
    Events out;
    {
        std::lock_guard lock(mutex_);
        const auto now = clock_();
        std::vector<uint32_t> due;
        for (auto& [id, c] : connections_)
            if (c.deadline && *c.deadline <= now) due.push_back(id);
        for (uint32_t id : due) {
            Connection* c = find(id);
            if (!c) continue;
            if (c->state == CmState::Timewait) {
                const Connection gone = *c;
                remove(id);
                if (gone.report_exit) emit(out, gone, CmEventType::TimewaitExit, nullptr);
                continue;
            }
            if (c->awaiting && c->retries_left > 0 && c->last_sent) {
                --c->retries_left;
                ++counters_.tx_resends;
                send_once(c->peer_ip, *c->last_sent);
                c->deadline = now + response_time(timers_.response_exponent);
                continue;
            }
            // Out of retries (or out of the time an MRA granted).
            switch (c->state) {
                case CmState::ReqSent:
                case CmState::RepSent: {
                    CmRej r;
                    r.local_comm_id = c->local_id;
                    r.remote_comm_id = c->remote_id;
                    // Neither a REQ nor a REP we received is being rejected: "other".
                    r.message_rejected = CmMessageKind::Other;
                    r.reason = static_cast<uint16_t>(CmRejectReason::Timeout);
                    r.reject_info_length = 8;
                    for (int i = 0; i < 8; ++i)
                        r.additional_reject_info[i] =
                            static_cast<uint8_t>(ca_guid_ >> (56 - 8 * i));
                    MadHeader h;
                    h.transaction_id = c->tid;
                    send_once(c->peer_ip, CmMad{h, r});
                    ++counters_.rej_sent;
                    const Connection gone = *c;
                    remove(id);
                    emit(out, gone, CmEventType::Unreachable, nullptr);
                    break;
                }
                case CmState::DreqSent:
                    // No DREP: the peer is gone or deaf; leave anyway (IBA 12.9.6).
                    enter_timewait(*c, true);
                    emit(out, *c, CmEventType::Disconnected, nullptr);
                    break;
                case CmState::SidrReqSent: {
                    const Connection gone = *c;
                    remove(id);
                    emit(out, gone, CmEventType::SidrTimeout, nullptr);
                    break;
                }
                default:
                    c->deadline.reset();
                    break;
            }
        }
    }
    dispatch(out);
}

std::optional<CmClock::time_point> CmAgent::next_deadline() const {
    std::lock_guard lock(mutex_);
    std::optional<CmClock::time_point> next;
    for (const auto& [id, c] : connections_)
        if (c.deadline && (!next || *c.deadline < *next)) next = c.deadline;
    return next;
}

void CmAgent::set_deadline_observer(std::function<void()> observer) {
    deadline_observer_ = std::move(observer);
}

std::optional<CmState> CmAgent::state(uint32_t comm_id) const {
    std::lock_guard lock(mutex_);
    auto it = connections_.find(comm_id);
    if (it == connections_.end()) return std::nullopt;
    return it->second.state;
}

CmAgentCounters CmAgent::counters() const {
    std::lock_guard lock(mutex_);
    return counters_;
}

}  // namespace uroce::transport::cm
