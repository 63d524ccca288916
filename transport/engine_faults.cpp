// The engine's side of UROCE_FAULTS (fault_plan.h): packets sent corrupted, twice or later,
// and the same for packets received, with the delay lines and their timer.
//
// Faults act where the wire meets the engine, so a capture (UROCE_PCAP) shows what crossed
// the wire at this end: a packet lost on the way out or in is not in it, a corrupted one is
// written corrupted, a duplicated one twice, a held-back one when it leaves or is handled.
#include <vector>

#include "transport/app_memory_guard.h"
#include "transport/congestion.h"
#include "transport/engine.h"
#include "transport/steady_clock.h"

namespace uroce::transport {

namespace {

uint64_t now_ns() {
    return static_cast<uint64_t>(steady_now_ns());
}

// A datagram too short for a BTH matches no rule limited to a QP or an opcode class.
constexpr uint32_t kNoQp = 0xffffffff;
constexpr uint8_t kNoOpcode = 0xff;  // no opcode uroce knows

}  // namespace

Engine::TransmitResult Engine::send_faulted(const FaultDecision& fault, QpCounters* qp,
                                            std::span<const iovec> packet, uint32_t bytes,
                                            const wire::IpFlow& flow, const UdpSocket& sock,
                                            uint8_t ttl) {
    if (qp) bump(qp->tx_faults);
    // A copy: the payload is the application's registered memory, never written here, and
    // may be reused before a held-back packet leaves.
    std::vector<uint8_t> copy(bytes);
    size_t at = 0;
    for (const iovec& v : packet) {
        if (v.iov_len > copy.size() - at ||
            !guarded_copy(copy.data() + at, v.iov_base, v.iov_len)) {
            // Its pages went away after the ICRC was computed (app_memory_guard.h).
            bump(counters_->app_memory_faults);
            return TransmitResult::Failed;
        }
        at += v.iov_len;
    }
    copy.resize(at);
    int copies = 1;
    // Marked as a congested switch would: the ICRC does not cover the ECN field.
    const uint8_t ecn = fault.ce ? kEcnCe : tx_ecn();
    if (fault.ce) bump(counters_->tx_ce_fault);
    if (fault.fault == Fault::Corrupt) {
        FaultInjector::corrupt(copy, fault.draw);  // after the ICRC: a bit flipped on the way
        bump(counters_->tx_corrupted_fault);
    } else if (fault.fault == Fault::Duplicate) {
        copies = 2;
        bump(counters_->tx_duplicated_fault);
    }
    if (fault.delay_us == 0) {
        TransmitResult result = TransmitResult::Sent;
        for (int i = 0; i < copies; ++i) {
            const TransmitResult r = send_copy(copy, flow, sock, ttl, ecn);
            if (i == 0) result = r;  // the copy is extra: its fate is not the packet's
        }
        return result;
    }
    if (fault.delayed) bump(counters_->tx_delayed_fault);
    if (fault.reordered) bump(counters_->tx_reordered_fault);
    TransmitResult result = TransmitResult::Sent;  // it leaves later, as far as the QP knows
    for (int i = 0; i < copies; ++i) {
        DelayLine::Packet p;
        p.bytes = i + 1 < copies ? copy : std::move(copy);
        p.peer_ip = flow.dst_ip;
        p.ttl = ttl;
        p.ecn = ecn;
        p.socket = &sock;
        if (!hold(tx_delayed_, fault.delay_us, std::move(p))) {
            bump(counters_->tx_dropped_fault);
            if (i == 0) result = TransmitResult::Lost;
        }
    }
    return result;
}

Engine::TransmitResult Engine::send_copy(std::span<const uint8_t> packet, const wire::IpFlow& flow,
                                         const UdpSocket& sock, uint8_t ttl, uint8_t ecn) {
    const iovec one{const_cast<uint8_t*>(packet.data()), packet.size()};
    // The socket gives every packet tx_ecn(); a control message only for another field (CE).
    const uint8_t other_ecn = ecn != tx_ecn() ? ecn : 0;
    const TransmitResult r = account_send(
        sock.send(flow.dst_ip, config_.port, std::span(&one, 1), ttl, 0, other_ecn), 1);
    if (capture_ && r == TransmitResult::Sent) {
        capture_->sent(flow, 0, ttl, std::span(&one, 1), ecn);
        note_capture_written();
    }
    return r;
}

void Engine::receive_read(std::span<uint8_t> one, const IpAddress& src_ip, uint16_t src_port,
                          const IpAddress& group, uint16_t index) {
    // The steering program saw only the first datagram of a merged buffer.
    if (index != 0 && resteer_ && group.is_unspecified() && resteered(one, src_ip, src_port, index))
        return;
    if (!faults_.enabled(FaultDirection::Rx)) {
        receive_one(one, src_ip, src_port, group, index);
        return;
    }
    const bool has_bth = one.size() >= wire::kBthBytes;
    const uint8_t opcode = has_bth ? one[0] : kNoOpcode;
    const uint32_t dest_qp = has_bth ? wire::bth_dest_qp(one) : kNoQp;
    const FaultDecision fault = faults_.next(FaultDirection::Rx, opcode, dest_qp);
    int copies = 1;
    switch (fault.fault) {
        case Fault::Drop:
            bump(counters_->rx_dropped_fault);
            return;
        case Fault::Corrupt:
            // The engine's own receive buffer: the next read overwrites it anyway.
            FaultInjector::corrupt(one, fault.draw);
            bump(counters_->rx_corrupted_fault);
            break;
        case Fault::Duplicate:
            copies = 2;
            bump(counters_->rx_duplicated_fault);
            break;
        case Fault::None:
            break;
    }
    // Taken as having arrived marked; the datagram's own mark comes back for the next one.
    const uint8_t arrived_ecn = rx_ecn_;
    if (fault.ce) {
        rx_ecn_ = kEcnCe;
        bump(counters_->rx_ce_fault);
    }
    if (fault.delay_us == 0) {
        for (int i = 0; i < copies; ++i) receive_one(one, src_ip, src_port, group, index);
        rx_ecn_ = arrived_ecn;
        return;
    }
    if (fault.delayed) bump(counters_->rx_delayed_fault);
    if (fault.reordered) bump(counters_->rx_reordered_fault);
    for (int i = 0; i < copies; ++i) {
        DelayLine::Packet p;
        p.bytes.assign(one.begin(), one.end());
        p.peer_ip = src_ip;
        p.peer_port = src_port;
        p.id = index;
        p.group = group;
        p.ecn = rx_ecn_;
        if (!hold(rx_delayed_, fault.delay_us, std::move(p))) bump(counters_->rx_dropped_fault);
    }
    rx_ecn_ = arrived_ecn;
}

bool Engine::hold(DelayLine& line, uint32_t delay_us, DelayLine::Packet p) {
    bool earliest = false;
    if (!line.push(now_ns() + uint64_t{delay_us} * 1000, std::move(p), earliest)) return false;
    if (earliest) arm_delay_timer();
    return true;
}

void Engine::arm_delay_timer() {
    // Under the lock, so that the last arming saw every packet pushed before it.
    std::lock_guard lock(delay_timer_mutex_);
    const std::optional<uint64_t> tx = tx_delayed_.next_due();
    const std::optional<uint64_t> rx = rx_delayed_.next_due();
    if (!tx && !rx) return;
    const uint64_t due = tx && rx ? std::min(*tx, *rx) : tx ? *tx : *rx;
    const uint64_t now = now_ns();
    const uint64_t wait_ns = due > now ? due - now : 0;
    delay_timer_->arm_in(static_cast<int64_t>(wait_ns));
}

void Engine::on_delay_due(void* arg) {
    auto* e = static_cast<Engine*>(arg);
    const auto pass = e->fork_gate_.pass();
    e->release_delayed();
}

void Engine::release_delayed() {
    const uint64_t now = now_ns();
    std::vector<DelayLine::Packet> due;
    tx_delayed_.take_due(now, due);
    for (const DelayLine::Packet& p : due)
        send_copy(p.bytes, wire::IpFlow{config_.ip, p.peer_ip, p.socket->port(), config_.port},
                  *p.socket, p.ttl, p.ecn);
    due.clear();
    {
        std::lock_guard lock(rx_mutex_);
        rx_delayed_.take_due(now, due);
        for (const DelayLine::Packet& p : due) {
            rx_ecn_ = p.ecn;
            receive_one(p.bytes, p.peer_ip, p.peer_port, p.group, p.id);
        }
        finish_run();
        rx_ecn_ = 0;
        for (auto& qp : touched_) qp->flush_ack();
        touched_.clear();
        if (capture_ && !due.empty()) note_capture_written();
    }
    arm_delay_timer();
}

}  // namespace uroce::transport
