// The engine at work: its loop, the receive path (a batch read from the socket, each packet
// checked and delivered to its QP or multicast group), the busy spin after a batch, and the
// QP table. Its creation and destruction: engine_setup.cpp.
#include "transport/engine.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "transport/app_memory_guard.h"
#include "transport/congestion.h"
#include "transport/train_order.h"
#include "transport/ud_qp.h"
#include "uroce/icrc.h"

namespace uroce::transport {

namespace {

// Datagrams handled per readable event before the loop gets to run timers.
constexpr size_t kRxBudget = 512;

// The engine whose receive batch this thread is reading (receive_from), if any: the batch
// gives the flight budget's turns at its end, so the QPs it makes room for need not wake the
// engine thread for them (a cross-CPU wake-up per batch, on the CPUs the pollers need).
thread_local const Engine* t_receiving = nullptr;

}  // namespace

CounterValues Engine::counters_since_start() const {
    CounterValues v = snapshot(*counters_);
#define UROCE_SINCE_START(name) v.name -= counters_at_start_.name;
    UROCE_COUNTERS(UROCE_SINCE_START)
#undef UROCE_SINCE_START
    return v;
}

void Engine::run() {
    // EVLOOP_NO_EXIT_ON_EMPTY: keep running while no timer is pending.
    event_base_loop(base_, EVLOOP_NO_EXIT_ON_EMPTY);
}

void Engine::set_async_handler(std::function<void(const AsyncEvent&)> handler) {
    std::lock_guard lock(async_mutex_);
    async_handler_ = std::move(handler);
}

void Engine::post_async(const AsyncEvent& ev) {
    std::lock_guard lock(async_mutex_);
    if (async_handler_) async_handler_(ev);
}

uint32_t Engine::allocate_qpn() {
    std::unique_lock lock(qps_mutex_);
    const uint32_t qpn =
        qpn_space_.allocate(QpnSpace::Kind::Qp, [this](uint32_t n) { return qps_.contains(n); });
    qps_.emplace(qpn, nullptr);
    return qpn;
}

uint32_t Engine::allocate_srqn() {
    std::unique_lock lock(qps_mutex_);
    const uint32_t srqn = qpn_space_.allocate(QpnSpace::Kind::XrcSrq,
                                              [this](uint32_t n) { return xrc_srqs_.contains(n); });
    xrc_srqs_.emplace(srqn, nullptr);
    return srqn;
}

void Engine::attach_xrc_srq(const std::shared_ptr<SharedReceiveQueue>& srq) {
    std::unique_lock lock(qps_mutex_);
    xrc_srqs_[srq->xrc().srqn] = srq;
}

void Engine::detach_xrc_srq(uint32_t srqn) {
    std::shared_ptr<SharedReceiveQueue> keep;  // freed outside the lock
    std::unique_lock lock(qps_mutex_);
    auto it = xrc_srqs_.find(srqn);
    if (it == xrc_srqs_.end()) return;
    keep = std::move(it->second);
    xrc_srqs_.erase(it);
    qpn_space_.release(QpnSpace::Kind::XrcSrq, srqn);
}

std::shared_ptr<SharedReceiveQueue> Engine::xrc_srq(uint32_t srqn) {
    std::shared_lock lock(qps_mutex_);
    auto it = xrc_srqs_.find(srqn);
    return it != xrc_srqs_.end() ? it->second : nullptr;
}

uint16_t Engine::slot_number() const {
    return qpn_space_.primary_number();
}

int Engine::claim_cm_service(uint64_t service_id) {
    return steering_ ? steering_->claim_cm_service(service_id) : 0;
}

bool Engine::cm_service_held_elsewhere(uint64_t service_id) const {
    return steering_ && steering_->cm_service_held_elsewhere(service_id);
}

void Engine::release_cm_service(uint64_t service_id) {
    if (steering_) steering_->release_cm_service(service_id);
}

void Engine::attach(const std::shared_ptr<Qp>& qp) {
    std::unique_lock lock(qps_mutex_);
    qps_[qp->qpn()] = qp;
    qp_count_.fetch_add(1, std::memory_order_relaxed);
}

void Engine::detach(uint32_t qpn) {
    std::shared_ptr<Qp> keep;
    {
        std::unique_lock lock(qps_mutex_);
        auto it = qps_.find(qpn);
        if (it == qps_.end()) return;
        keep = std::move(it->second);
        if (!keep) {
            qps_.erase(it);
            qpn_space_.release(QpnSpace::Kind::Qp, qpn);
            return;
        }
        // The entry stays, empty (no packet finds the QP), so that the number is not drawn
        // again before the QP's windows are gone (below).
        qp_count_.fetch_sub(1, std::memory_order_relaxed);
    }
    // Destroying a QP detaches it from its groups, as the kernel does.
    if (keep->transport() == wire::Transport::Ud) multicast_.detach_all(qpn);
    // Outside the table lock: closing waits for a timer callback that may be running. The
    // receive path may still hold a reference for a moment; a closed QP ignores what it gets.
    keep->close();
    // Closed, it binds nothing more. A type 2 window answers only to the QP it was bound on
    // (IBA 10.6.7.2): one bound on this QP must not answer to the next QP of this number.
    memory_.invalidate_windows_of(qpn);
    std::unique_lock lock(qps_mutex_);
    if (auto it = qps_.find(qpn); it != qps_.end() && !it->second) {
        qps_.erase(it);
        qpn_space_.release(QpnSpace::Kind::Qp, qpn);
    }
}

int Engine::attach_multicast(const IpAddress& group, const std::shared_ptr<UdQp>& qp) {
    if (!group.is_v4() || !group.is_multicast()) return EINVAL;  // IPv6 groups: not yet
    return multicast_.attach(base_, group, qp);
}

int Engine::detach_multicast(const IpAddress& group, uint32_t qpn) {
    return multicast_.detach(group, qpn);
}

void Engine::set_timer_hook(std::function<void(uint32_t)> hook) {
    std::lock_guard lock(hooks_mutex_);
    timer_hook_ = std::move(hook);
    has_timer_hook_.store(static_cast<bool>(timer_hook_), std::memory_order_release);
}

void Engine::set_spin_hook(std::function<void(int64_t, int64_t)> hook) {
    std::lock_guard lock(hooks_mutex_);
    spin_hook_ = std::move(hook);
    has_spin_hook_.store(static_cast<bool>(spin_hook_), std::memory_order_release);
}

void Engine::run_timer_hook(uint32_t qpn) {
    if (!has_timer_hook_.load(std::memory_order_acquire)) return;
    std::function<void(uint32_t)> hook;
    {
        std::lock_guard lock(hooks_mutex_);
        hook = timer_hook_;
    }
    if (hook) hook(qpn);
}

void Engine::set_transmit_filter(TransmitFilter filter) {
    std::lock_guard lock(filter_mutex_);
    transmit_filter_ = std::move(filter);
    has_transmit_filter_.store(static_cast<bool>(transmit_filter_), std::memory_order_release);
}

bool Engine::pass_filter(std::span<const iovec> iov, const IpAddress& dst_ip) {
    std::vector<uint8_t> packet;
    for (const iovec& v : iov)
        packet.insert(packet.end(), static_cast<const uint8_t*>(v.iov_base),
                      static_cast<const uint8_t*>(v.iov_base) + v.iov_len);
    std::lock_guard lock(filter_mutex_);
    return !transmit_filter_ || transmit_filter_(packet, dst_ip);
}

void Engine::receive_datagram(std::span<const uint8_t> udp_payload, const IpAddress& src_ip,
                              uint16_t src_port, bool send_acks, const IpAddress& group) {
    std::lock_guard lock(rx_mutex_);
    if (!group.is_unspecified()) {
        deliver_multicast(udp_payload, src_ip, src_port, group);
        return;
    }
    Qp* qp = deliver(udp_payload, src_ip, src_port);
    finish_run();
    if (qp && send_acks) qp->flush_ack();
    touched_.clear();
}

void Engine::on_readable(evutil_socket_t, short, void* arg) {
    auto* e = static_cast<Engine*>(arg);
    const auto pass = e->fork_gate_.pass();
    std::unique_lock lock(e->rx_mutex_, std::try_to_lock);
    // A polling thread is reading the socket: leave it to it rather than wait (and be woken
    // again for the next packet it reads anyway).
    if (!lock.owns_lock() && !e->handoff_->park_from_loop()) lock.lock();
    if (!lock.owns_lock()) return;
    e->batch_may_hold_acks_ = e->config_.hold_acks;
    const size_t datagrams = e->receive_batch();
    // Only with inline progress: without it, the polls that show a busy poller are not seen.
    if (e->config_.engine_spin && e->config_.inline_progress) e->spin_after_batch(datagrams);
    e->batch_may_hold_acks_ = false;
}

void Engine::spin_after_batch(size_t read) {
    int64_t now = PollHandoff::now_ns();
    if (spin_ended_idle_) {
        spin_ended_idle_ = false;
        spin_period_.on_wake(read);
    }
    if (!handoff_->quiet(now, kSpinQuietMicros * 1000)) return;
    const int64_t period = spin_period_.nanos();
    if (has_spin_hook_.load(std::memory_order_acquire)) {
        std::function<void(int64_t, int64_t)> hook;
        {
            std::lock_guard lock(hooks_mutex_);
            hook = spin_hook_;
        }
        if (hook) hook(now, period);
    }
    // The loop's timers (retransmissions, the fault injector's delays) wait at most
    // kSpinMaxMicros; a stream that goes on comes back here at once from the loop (below).
    const int64_t end = now + kSpinMaxMicros * 1000;
    // From the last packet read; a turn of the loop at the cap (nothing read) goes on from
    // the same one.
    if (read != 0) spin_idle_until_ns_ = now + period;
    const int64_t start = now;
    int64_t idle_ns = 0;  // in reads that found nothing
    for (int i = 0; i < 1'000'000 && now < spin_idle_until_ns_ && now < end; ++i) {
        const int64_t before_ns = now;
        const uint64_t before = counters_->rx_packets.load(std::memory_order_relaxed);
        receive_batch();
        now = PollHandoff::now_ns();
        const uint64_t got = counters_->rx_packets.load(std::memory_order_relaxed) - before;
        if (got != 0) {
            bump(counters_->rx_spin_packets, got);
            spin_idle_until_ns_ = now + period;
        } else {
            idle_ns += now - before_ns;
        }
        // A poll that began meanwhile has the socket from here.
        if (!handoff_->quiet(now, kSpinQuietMicros * 1000)) return;
    }
    spin_period_.on_turn(idle_ns, now - start);
    // Ended idle: the thread sleeps, and the batch that wakes it sets the next period.
    if (now >= spin_idle_until_ns_) {
        spin_ended_idle_ = true;
        return;
    }
    // Stopped by the cap while packets still came: once the loop has run its timers, spin
    // on, even if the next packet is not there yet (ib_read_lat's next request, a round trip
    // away), rather than sleep and wait tens of microseconds for a wake-up. Harmless if a
    // poller parks the socket meanwhile: on_readable then finds it busy, or not quiet.
    if (now >= end) event_active(rx_event_, EV_READ, 0);
}

void Engine::on_group_readable(const UdpSocket& socket, const IpAddress& group, void* arg) {
    auto* e = static_cast<Engine*>(arg);
    const auto pass = e->fork_gate_.pass();
    std::lock_guard lock(e->rx_mutex_);
    e->receive_from(socket, group);
}

void Engine::note_held_post(uint32_t qpn) {
    held_posts_.note(qpn);
    // Against the hand-back (PollHandoff::on_watch): either it sees this note, or the
    // caller's second hold_posts() sees the socket handed back.
    std::atomic_thread_fence(std::memory_order_seq_cst);
}

void Engine::note_deferred_timer(uint32_t qpn) {
    deferred_timers_.note(qpn);
    // Against the hand-back, as note_held_post.
    std::atomic_thread_fence(std::memory_order_seq_cst);
}

std::shared_ptr<Qp> Engine::qp_numbered(uint32_t qpn) const {
    std::shared_lock lock(qps_mutex_);
    auto it = qps_.find(qpn);
    return it != qps_.end() ? it->second : nullptr;
}

void Engine::note_capture_written() {
    if (capture_->flush_if_due() && !capture_timer_armed_.exchange(true))
        capture_timer_->arm_in(PacketCapture::kFlushAfterNanos);
}

void Engine::on_capture_due(void* arg) {
    auto* e = static_cast<Engine*>(arg);
    const auto pass = e->fork_gate_.pass();
    // Cleared first: a frame written from here on arms the timer again.
    e->capture_timer_armed_.store(false);
    e->capture_->flush();
}

void Engine::on_handed_back() {
    send_held_posts();
    // The ACKs the pollers held last (note_held_ack): sent if they waited long enough, the
    // timer set for the others.
    flush_overdue_held_acks(std::chrono::steady_clock::now());
    if (deferred_timers_.empty()) return;
    deferred_timers_.flush([this](uint32_t qpn) {
        if (auto qp = qp_numbered(qpn)) qp->arm_deferred_timer();
    });
}

void Engine::send_held_posts() {
    if (held_posts_.empty()) return;
    held_posts_.flush([this](uint32_t qpn) {
        if (auto qp = qp_numbered(qpn)) qp->send_held();
    });
}

void Engine::on_cq_poll(bool cq_empty) {
    send_held_posts();
    // A held ACK outlasts one poll that finds completions: the application takes what the
    // batch that held it delivered (ib_send_lat's requester polls its send CQ, then its
    // receive CQ, then answers), and its answer takes the ACK along. The next poll sends it.
    if (cq_empty || !held_ack_spared_.exchange(false, std::memory_order_relaxed)) flush_held_acks();
    if (cq_empty)
        progress();
    else if (config_.inline_progress)
        handoff_->on_poll();
}

void Engine::progress() {
    if (!config_.inline_progress) return;
    // Before the lock: parking may wait for nothing under it.
    const int64_t polled_ns = handoff_->on_poll();
    std::unique_lock lock(rx_mutex_, std::try_to_lock);
    if (!lock.owns_lock()) return;
    if (handoff_->parked()) run_due_timers(polled_ns);
    // Only holders of rx_mutex_ count rx_packets: the difference is what this thread read.
    const uint64_t before = counters_->rx_packets.load(std::memory_order_relaxed);
    // A poller polls again within microseconds: an ACK its batch holds for the answer
    // leaves with that answer, in one system call (RcQp::send_with_ack), or at the next poll
    // (on_cq_poll), whichever comes first (engine_held_acks.cpp). Parked or not: a poller
    // that has not polled long enough to park (ib_write_lat polls only between its post
    // and the ACK) would otherwise send the ACK alone just before the answer.
    batch_may_hold_acks_ = config_.hold_acks;
    {
        const PollHandoff::ReadingScope reading(*handoff_);
        receive_batch();
    }
    batch_may_hold_acks_ = false;
    if (const uint64_t read = counters_->rx_packets.load(std::memory_order_relaxed) - before)
        bump(counters_->rx_polled_packets, read);
}

void Engine::note_timer_deadline(std::chrono::steady_clock::time_point deadline) {
    const int64_t ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count();
    int64_t cur = next_timer_ns_.load(std::memory_order_relaxed);
    while (ns < cur && !next_timer_ns_.compare_exchange_weak(cur, ns, std::memory_order_relaxed)) {
    }
}

void Engine::run_due_timers(int64_t polled_ns) {
    // The poll's own clock reading, a moment old, says whether anything is due: most polls
    // then read the clock once, not twice.
    if (polled_ns != 0 && polled_ns < next_timer_ns_.load(std::memory_order_relaxed)) return;
    const auto now = std::chrono::steady_clock::now();
    const int64_t now_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
    if (now_ns < next_timer_ns_.load(std::memory_order_relaxed)) return;
    // Reset before reading the QPs: a QP that arms a timer after this lowers it again, and
    // one that armed before is read below (its deadline is set under its mutex).
    next_timer_ns_.store(kNoTimer, std::memory_order_relaxed);
    {
        // Copied out: a QP's timer takes its own mutex, never under qps_mutex_.
        std::shared_lock lock(qps_mutex_);
        for (const auto& [qpn, qp] : qps_)
            if (qp) timer_scan_.push_back(qp);
    }
    auto next = std::chrono::steady_clock::time_point::max();
    for (const auto& qp : timer_scan_) next = std::min(next, qp->run_due_timer(now));
    timer_scan_.clear();
    if (next != std::chrono::steady_clock::time_point::max()) note_timer_deadline(next);
}

size_t Engine::receive_batch() {
    return receive_from(socket_, IpAddress{});
}

size_t Engine::receive_from(const UdpSocket& socket, const IpAddress& group) {
    const Engine* const outer = t_receiving;
    t_receiving = this;
    ReceiveBatch& batch = *rx_;
    size_t handled = 0, datagrams = 0;
    while (handled < kRxBudget) {
        finish_run();  // its payloads are in the buffers the read overwrites
        const size_t got = socket.receive(batch);
        if (got == 0) break;
        datagrams += got;
        for (size_t i = 0; i < got; ++i) {
            const ReceiveBatch::Datagram& d = batch[i];
            // A GRO train: datagrams of segment_size bytes, the last one possibly shorter.
            const size_t step = d.segment_size ? d.segment_size : std::max<size_t>(d.length, 1);
            if (d.segment_size && d.length > d.segment_size) bump(counters_->rx_gro_datagrams);
            rx_ecn_ = d.ecn;
            // A train of requests closed by an ACK: the ACK first (train_order.h). Each
            // packet keeps its index, which its ICRC covers.
            size_t end = d.length;
            if (const size_t ack = closing_ack_at(std::span(d.data, d.length), step); ack != 0) {
                receive_read(std::span(d.data + ack, d.length - ack), d.src_ip, d.src_port, group,
                             static_cast<uint16_t>(ack / step));
                ++handled;
                end = ack;
            }
            uint16_t index = 0;
            // At least once: an empty datagram (or one cut short, length 0) is counted too.
            for (size_t off = 0; off == 0 || off < end; off += step, ++index, ++handled)
                receive_read(std::span(d.data + off, std::min(step, end - off)), d.src_ip,
                             d.src_port, group, index);
        }
        if (got < batch.capacity()) break;
    }
    finish_run();
    rx_ecn_ = 0;
    // ACK coalescing: one ACK per QP for everything this batch delivered (or held for the
    // answer: engine_held_acks.cpp).
    for (auto& qp : touched_) qp->finish_batch(batch_may_hold_acks_);
    touched_.clear();
    // The batch's ACKs made room: the QPs in line take it now, not a loop turn later.
    t_receiving = outer;
    if (flight_budget_.waiting() != 0) run_flight_turns();
    if (capture_ && handled > 0) note_capture_written();
    return datagrams;
}

void Engine::schedule_flight_turns() {
    if (t_receiving == this) return;  // the batch's end gives them
    // Activating an event that is already active does nothing.
    event_active(flight_turn_event_, 0, 0);
}

void Engine::on_flight_turns(evutil_socket_t, short, void* arg) {
    auto* e = static_cast<Engine*>(arg);
    const auto pass = e->fork_gate_.pass();
    e->run_flight_turns();
}

void Engine::run_flight_turns() {
    // One thread gives turns at a time: two (the engine thread's event, a poller's batch
    // end) would each take a QP from the line while there is room, before either QP settled
    // its charge, and overshoot the budget by a window. A thread turned away leaves its work
    // to the one giving turns (flight_turns_again_), which looks at the line once more.
    flight_turns_again_.store(true);
    while (flight_turns_again_.load()) {
        std::unique_lock lock(flight_turns_mutex_, std::try_to_lock);
        if (!lock.owns_lock()) return;
        flight_turns_again_.store(false);
        // Each QP in line once at most: one that finds no room goes back to the end of it.
        for (size_t n = flight_budget_.waiting(); n > 0; --n) {
            uint32_t qpn = 0;
            if (!flight_budget_.next_turn(qpn)) break;
            if (auto qp = qp_numbered(qpn)) qp->take_flight_turn();
        }
    }
}

bool Engine::resteered(std::span<const uint8_t> one, const IpAddress& src_ip, uint16_t src_port,
                       uint16_t index) {
    if (one.size() < wire::kBthBytes) return false;
    const uint32_t qpn = wire::bth_dest_qp(one);
    // Ours by its slot. QP1's (slot 0, held by no context) are steered by their content: they
    // go back too, and return here if they are ours.
    if (qpn == kMulticastQpn || qpn_space_.holds(static_cast<uint16_t>(DeviceSlots::slot_of(qpn))))
        return false;
    // The IPv4 identification its sender used, which the ICRC covers; a corrupted one is
    // refused here, as it would be there.
    uint16_t id = 0;
    const wire::IpFlow flow{src_ip, config_.ip, src_port, config_.port};
    if (wire::icrc_verify(flow, one, index, &id) == wire::IcrcCheck::Mismatch) return false;
    if (!resteer_->send(src_ip, src_port, config_.port, one, id, rx_ecn_)) return false;
    bump(counters_->rx_resteered);
    return true;
}

void Engine::receive_one(std::span<const uint8_t> one, const IpAddress& src_ip, uint16_t src_port,
                         const IpAddress& group, uint16_t index) {
    if (capture_ && !one.empty())
        capture_->received(wire::IpFlow{src_ip, group.is_unspecified() ? config_.ip : group,
                                        src_port, config_.port},
                           one, index, rx_ecn_);
    if (!group.is_unspecified()) {
        finish_run();
        deliver_multicast(one, src_ip, src_port, group);
        return;
    }
    deliver(one, src_ip, src_port, index);
}

bool Engine::accept(std::span<const uint8_t> datagram, const IpAddress& src_ip,
                    const IpAddress& dst_ip, uint16_t src_port, wire::ParsedPacket& pkt,
                    uint16_t expected_id) {
    bump(counters_->rx_packets);
    if (wire::parse_packet(datagram, pkt) != wire::ParseError::None) {
        bump(counters_->rx_malformed);
        return false;
    }
    const wire::IpFlow flow{src_ip, dst_ip, src_port, config_.port};
    switch (wire::icrc_verify(flow, datagram, expected_id)) {
        case wire::IcrcCheck::Exact:
            break;
        case wire::IcrcCheck::MatchesUnseenFields:
            bump(counters_->rx_icrc_unseen_fields);
            break;
        case wire::IcrcCheck::Mismatch:
            bump(counters_->rx_bad_icrc);
            return false;
    }
    // Only the default partition exists; the membership bit is not compared.
    if ((pkt.h.bth.pkey & 0x7fff) != 0x7fff) {
        bump(counters_->rx_bad_pkey);
        return false;
    }
    return true;
}

Qp* Engine::deliver(std::span<const uint8_t> datagram, const IpAddress& src_ip, uint16_t src_port,
                    uint16_t expected_id) {
    wire::ParsedPacket pkt;
    if (!accept(datagram, src_ip, config_.ip, src_port, pkt, expected_id)) return nullptr;
    // The multicast QPN arrives only through a group's socket.
    if (pkt.h.bth.dest_qp == kMulticastQpn) {
        bump(counters_->rx_bad_mcast_qpn);
        return nullptr;
    }
    Qp* qp = nullptr;
    std::shared_ptr<Qp> found;
    if (!touched_.empty() && touched_.back()->qpn() == pkt.h.bth.dest_qp) {
        // The QP of the packet before (a train's packets share one): no table lookup, no
        // reference taken. One detached since is closed, and ignores the packet as it would
        // a moment earlier.
        qp = touched_.back().get();
    } else {
        std::shared_lock lock(qps_mutex_);
        auto it = qps_.find(pkt.h.bth.dest_qp);
        if (it != qps_.end()) found = it->second;
        qp = found.get();
    }
    if (pkt.info->flags & wire::kCnp) {
        // Congestion notification: for the QP whose packets were marked (congestion.h).
        // It belongs to no transport, and to no receive batch's acknowledgements.
        finish_run();  // after the packets that came before it
        bump(counters_->rx_cnp);
        if (qp)
            qp->on_cnp(src_ip);
        else
            bump(counters_->rx_unknown_qp);
        return nullptr;
    }
    // A transport uroce has no QP of (RD), or not the one this QP speaks (a UD packet for an
    // RC QP): the QP never sees it.
    if ((pkt.h.bth.opcode >> 5) == static_cast<uint8_t>(wire::Transport::Rd) ||
        (qp && (pkt.h.bth.opcode >> 5) != static_cast<uint8_t>(qp->transport()))) {
        bump(counters_->rx_unsupported);
        return nullptr;
    }
    if (!qp) {
        bump(counters_->rx_unknown_qp);
        return nullptr;
    }
    // Remembered for the batch's ACK, and kept alive while run_ names it.
    if (found && std::find(touched_.begin(), touched_.end(), found) == touched_.end())
        touched_.push_back(std::move(found));
    if (!run_.joins(qp, src_ip)) finish_run();
    run_.add(*qp, src_ip, pkt);
    if (rx_ecn_ == kEcnCe) {
        // After the packet: the notification is a packet of its own, not on its path.
        finish_run();
        bump(counters_->rx_ce_marked);
        qp->on_ce_marked(src_ip);
    }
    return qp;
}

void Engine::deliver_multicast(std::span<const uint8_t> datagram, const IpAddress& src_ip,
                               uint16_t src_port, const IpAddress& group) {
    wire::ParsedPacket pkt;
    // The ICRC covers the destination address: the group's.
    if (!accept(datagram, src_ip, group, src_port, pkt)) return;
    if (pkt.h.bth.dest_qp != kMulticastQpn) {
        bump(counters_->rx_bad_mcast_qpn);
        return;
    }
    // Only UD has multicast.
    if ((pkt.h.bth.opcode >> 5) != static_cast<uint8_t>(wire::Transport::Ud)) {
        bump(counters_->rx_unsupported);
        return;
    }
    multicast_.members(group, members_);
    if (members_.empty()) {
        // The last QP left while the datagram was on its way.
        bump(counters_->rx_mcast_no_qp);
        return;
    }
    // Each QP takes its own copy, with its own Q_Key check and receive WQE.
    for (const auto& qp : members_) qp->on_multicast(pkt, src_ip, group);
    members_.clear();
}

}  // namespace uroce::transport
