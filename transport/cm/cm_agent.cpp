#include "transport/cm/cm_agent.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transport/cm/cm_agent_messages.h"
#include "transport/random_source.h"

namespace uroce::transport::cm {

using namespace agent_messages;

namespace {

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
    const NotifyOnExit notify{*this};
    std::lock_guard lock(mutex_);
    if (!listeners_.emplace(service_id, listener).second) return EADDRINUSE;
    // Requests that came just before the listener: due now, taken on the owner's thread
    // (its expire()), as a REQ from the wire is, not inside this call and its caller's locks.
    const auto now = clock_();
    for (HeldRequest& h : held_)
        if (h.service_id == service_id) h.deadline = std::min(h.deadline, now);
    return 0;
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

void CmAgent::send_reject(uint32_t peer_ip, uint64_t tid, const CmRej& rej) {
    send_once(peer_ip, with_tid(tid, rej));
    ++counters_.rej_sent;
}

void CmAgent::start_disconnect(Connection& c, CmDreq dreq) {
    dreq.local_comm_id = c.local_id;
    dreq.remote_comm_id = c.remote_id;
    dreq.remote_qpn = c.remote_qpn;
    c.state = CmState::DreqSent;
    transmit(c, with_tid(kTidHigh | c.local_id, dreq), true);
}

void CmAgent::answer_dreq(Connection& c, const CmDrep& drep, bool report_exit) {
    CmDrep d = drep;
    d.local_comm_id = c.local_id;
    d.remote_comm_id = c.remote_id;
    transmit(c, with_tid(c.tid, d), false);
    enter_timewait(c, report_exit);
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

CmAgent::Connection* CmAgent::open_active(uint32_t peer_ip, CmState state) {
    const uint32_t id = allocate_id();
    if (id == 0) return nullptr;
    Connection& c = connections_[id];
    c.local_id = id;
    c.peer_ip = peer_ip;
    c.state = state;
    c.tid = kTidHigh | id;
    return &c;
}

uint32_t CmAgent::send_req(uint32_t peer_ip, CmReq req) {
    const NotifyOnExit notify{*this};
    std::lock_guard lock(mutex_);
    Connection* c = open_active(peer_ip, CmState::ReqSent);
    if (!c) return 0;
    req.local_comm_id = c->local_id;
    req.local_ca_guid = ca_guid_;
    req.remote_cm_response_timeout = timers_.response_exponent;
    req.local_cm_response_timeout = timers_.response_exponent;
    req.max_cm_retries = std::min<uint8_t>(timers_.max_retries, 15);
    transmit(*c, with_tid(c->tid, req), true);
    return c->local_id;
}

uint32_t CmAgent::send_sidr_req(uint32_t peer_ip, CmSidrReq req) {
    const NotifyOnExit notify{*this};
    std::lock_guard lock(mutex_);
    Connection* c = open_active(peer_ip, CmState::SidrReqSent);
    if (!c) return 0;
    req.request_id = c->local_id;
    transmit(*c, with_tid(c->tid, req), true);
    return c->local_id;
}

int CmAgent::send_rep(uint32_t comm_id, CmRep rep) {
    const NotifyOnExit notify{*this};
    std::lock_guard lock(mutex_);
    Connection* c = find(comm_id);
    if (!c || (c->state != CmState::ReqReceived && c->state != CmState::MraSent)) return EINVAL;
    rep.local_comm_id = c->local_id;
    rep.remote_comm_id = c->remote_id;
    rep.local_ca_guid = ca_guid_;
    c->state = CmState::RepSent;
    transmit(*c, with_tid(c->tid, rep), true);
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
    c->state = CmState::MraSent;
    transmit(*c, with_tid(c->tid, m), false);
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
    c->state = CmState::Established;
    // Kept in last_sent: a resent REP (our RTU was lost) gets it again.
    transmit(*c, with_tid(c->tid, r), false);
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
        case CmState::RepSent:
            // The passive side gives up before the RTU (as destroy() does): no message of
            // the peer's is rejected.
            r.message_rejected = CmMessageKind::Other;
            break;
        default:
            return EINVAL;
    }
    if (!copy_private(private_data, r.private_data)) return EINVAL;
    r.local_comm_id = c->local_id;
    r.remote_comm_id = c->remote_id;
    r.reason = static_cast<uint16_t>(reason);
    send_reject(c->peer_ip, c->tid, r);
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
    start_disconnect(*c, d);
    return 0;
}

int CmAgent::send_drep(uint32_t comm_id, std::span<const uint8_t> private_data) {
    const NotifyOnExit notify{*this};
    std::lock_guard lock(mutex_);
    Connection* c = find(comm_id);
    if (!c || c->state != CmState::DreqReceived) return EINVAL;
    CmDrep d;
    if (!copy_private(private_data, d.private_data)) return EINVAL;
    answer_dreq(*c, d, true);
    return 0;
}

int CmAgent::send_sidr_rep(uint32_t comm_id, CmSidrRep rep) {
    const NotifyOnExit notify{*this};
    std::lock_guard lock(mutex_);
    Connection* c = find(comm_id);
    if (!c || c->state != CmState::SidrReqReceived) return EINVAL;
    rep.request_id = c->remote_id;
    transmit(*c, with_tid(c->tid, rep), false);
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

void CmAgent::abandon(uint32_t comm_id) {
    std::lock_guard lock(mutex_);
    if (const Connection* c = find(comm_id); c && c->state == CmState::ReqReceived) remove(comm_id);
}

void CmAgent::destroy(uint32_t comm_id) {
    const NotifyOnExit notify{*this};
    std::lock_guard lock(mutex_);
    Connection* c = find(comm_id);
    if (!c) return;
    c->silent = true;
    switch (c->state) {
        case CmState::ReqSent:
        case CmState::ReqReceived:
        case CmState::MraSent:
        case CmState::RepSent:
        case CmState::RepReceived: {
            // IBA 12.9.7: abandoning a connection being set up rejects it: the active side
            // says Timeout (with its CA GUID, as the kernel does), the passive side that its
            // consumer rejects.
            const bool active = c->state == CmState::ReqSent || c->state == CmState::RepReceived;
            CmRej r = active ? make_rej_timeout(c->local_id, c->remote_id, ca_guid_)
                             : make_rej(c->local_id, c->remote_id, CmMessageKind::Req,
                                        CmRejectReason::ConsumerReject);
            if (c->state == CmState::RepReceived) r.message_rejected = CmMessageKind::Rep;
            if (c->state == CmState::RepSent) r.message_rejected = CmMessageKind::Other;
            send_reject(c->peer_ip, c->tid, r);
            remove(comm_id);
            return;
        }
        case CmState::Established:
            start_disconnect(*c, CmDreq{});
            return;
        case CmState::DreqReceived:
            answer_dreq(*c, make_drep(c->local_id, c->remote_id), false);
            return;
        case CmState::DreqSent:
        case CmState::Timewait:
            return;  // finishes on its own, silently now
        case CmState::SidrReqSent:
            remove(comm_id);
            return;
        case CmState::SidrReqReceived: {
            // Unanswered: the requester hears "rejected" now (as the kernel's CM says it),
            // not silence until its retries run out; kept a while to say it again.
            CmSidrRep r;
            r.request_id = c->remote_id;
            r.status = static_cast<uint8_t>(SidrStatus::Rejected);
            transmit(*c, with_tid(c->tid, r), false);
            enter_timewait(*c, false);
            return;
        }
    }
}

void CmAgent::expire() {
    const NotifyOnExit notify{*this};
    Events out;
    {
        std::lock_guard lock(mutex_);
        const auto now = clock_();
        release_held(now, out);
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
                    send_reject(c->peer_ip, c->tid,
                                make_rej_timeout(c->local_id, c->remote_id, ca_guid_));
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
    for (const HeldRequest& h : held_)
        if (!next || h.deadline < *next) next = h.deadline;
    return next;
}

void CmAgent::set_deadline_observer(std::function<void()> observer) {
    deadline_observer_ = std::move(observer);
}

void CmAgent::set_listened_elsewhere(std::function<bool(uint64_t)> elsewhere) {
    listened_elsewhere_ = std::move(elsewhere);
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
