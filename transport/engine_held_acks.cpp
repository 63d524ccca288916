// ACKs held for the answer: an RC responder's ACK that waits for its application's next post.
//
// A request-response application over WRITEs (ib_write_lat; any protocol whose answer is a
// WRITE into the peer's memory) has each side post a WRITE, poll its send CQ until the ACK
// comes, then spin on memory for the peer's WRITE. Sent at the end of the batch that read
// the request, the ACK reaches the requester before the answer, which then lands while
// that application spins on memory, not on its CQ: only its engine thread can read it, and
// on a host whose CPUs the applications keep busy that thread waits for one (median 97-123
// us, p99 about 2 ms for `ib_write_lat -s 8` on 2 vCPUs). Held until the application's next
// post, the ACK leaves behind the answer (RcQp::post_send) while the requester still polls
// for it, in one GSO train that a UDP_GRO reader takes whole, so the requester's own poll
// reads the answer with the ACK: typical 7-9 us, p99 0.1-0.3 ms.
//
// The engine thread's batches hold, and so do the batches of a polling thread, parked or
// not (Engine::progress): a poller polls again within microseconds, and an application that
// answers posts before that poll, so the ACK leaves with the answer in one system call
// (RcQp::send_with_ack; a post held for the next poll keeps the ACK with it).
// ib_send_lat saves a sendmsg per message that way. Only for a QP in a request-response
// exchange (RcQp::answering: its application posted send work within the last
// answer_window_micros and has at most one request in flight; ib_write_bw's receiver never
// posts, and both ways, ib_write_bw -b, each side streams; and whose local ACK timeout is
// at least 4 x ack_hold_micros: the peer's is most likely the same, and it must not run
// out of retries), never for a duplicate whose ACK went out (the requester resent: it is
// waiting; a duplicate whose ACK has not gone out yet, a probe, changes nothing, once: a
// second one sends it), and not longer than EngineConfig::ack_hold_micros: a timer of the
// engine's, set for the first ACK held, sends those held that long, never one held since
// (sent a moment before its answer, it would undo the hold), and is set again for the
// oldest one left. The application's next CQ poll or arm sends them too: a thread that
// polls (or turns to a completion channel) may not post again soon, and its peer may be
// the one waiting. While the pollers have the socket (poll_handoff.h) the timer waits for
// the hand-back, as the QPs' own timers do: a poller's next poll comes first.
#include "transport/engine.h"
#include "transport/local_addresses.h"

namespace uroce::transport {

void Engine::note_held_ack(uint32_t qpn) {
    held_acks_.note(qpn);
    bump(counters_->tx_held_acks);  // after the note: a poll that sees the count finds the QP
    // A poller of a parked socket sends what it holds at its next poll, microseconds away;
    // its polls stop only for a post (which takes the ACK along), an arm (which sends it) or
    // the hand-back, which sets the timer then (on_handed_back). Set now, the timer would
    // put a timerfd_settime between the request and the application's answer, and its
    // expiry would wake the engine thread beside the pollers every ack_hold_micros, for
    // nothing: ib_write_lat -s 8 had 2-5 times as many iterations over 20 us. As a QP's own
    // timers (Engine::defer_timers), and against the hand-back as they are.
    if (defer_timers()) {
        std::atomic_thread_fence(std::memory_order_seq_cst);
        if (defer_timers()) return;
    }
    // From the engine thread or a poller (batch_may_hold_acks_): arming the timer wakes
    // nobody (timer_queue.h).
    if (!held_acks_timer_->pending())
        held_acks_timer_->arm_in(int64_t{config_.ack_hold_micros} * 1000);
}

void Engine::flush_held_acks() {
    if (held_acks_.empty()) return;
    held_acks_.flush([this](uint32_t qpn) {
        if (auto qp = qp_numbered(qpn)) qp->flush_ack();
    });
}

void Engine::on_held_acks_due(void* arg) {
    auto* e = static_cast<Engine*>(arg);
    const auto pass = e->fork_gate_.pass();
    e->flush_overdue_held_acks(std::chrono::steady_clock::now());
}

void Engine::flush_overdue_held_acks(std::chrono::steady_clock::time_point now) {
    if (held_acks_.empty()) return;
    // The timer was armed for the first ACK held since it last ran; the polls since may
    // have sent that one and held others, a moment ago: those wait for their own deadline.
    const auto hold = std::chrono::microseconds(config_.ack_hold_micros);
    const auto cutoff = now - hold;
    auto oldest = std::chrono::steady_clock::time_point::max();
    young_held_acks_.clear();
    // The QPs count what they send (held_ack_timeouts), before it leaves.
    held_acks_.flush([&](uint32_t qpn) {
        auto qp = qp_numbered(qpn);
        if (!qp) return;
        const auto since = qp->flush_ack_held_before(cutoff);
        if (since == std::chrono::steady_clock::time_point::max()) return;
        young_held_acks_.push_back(qpn);
        oldest = std::min(oldest, since);
    });
    // Noted again after the flush (which runs until the list is empty); a poll meanwhile
    // that missed them sends them at the next one, or their answer does.
    for (const uint32_t qpn : young_held_acks_) held_acks_.note(qpn);
    if (oldest != std::chrono::steady_clock::time_point::max())
        held_acks_timer_->arm_at(
            std::chrono::duration_cast<std::chrono::nanoseconds>((oldest + hold).time_since_epoch())
                .count());
}

bool Engine::answer_may_lead_ack(const IpAddress& dst) {
    if (!reads_whole_ || !gso_enabled()) return false;
    std::lock_guard lock(host_peers_mutex_);
    for (HostPeer& d : host_peers_) {
        if (d.ip != dst || d.port != config_.port) continue;
        if (!d.local) d.local = is_local_address(dst);
        if (!*d.local) return false;
        const auto split = d.table.read(kSplitReadersValue);
        return split && *split == 0;
    }
    return false;
}

}  // namespace uroce::transport
