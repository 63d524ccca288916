// What the engine knows of a queue pair, whatever its transport: a QPN that packets are
// steered to, the BTH transport it speaks (RC, UC, UD), and how to stop it for good.
// RcQp (rc_qp.h) and UdQp (ud_qp.h) are the implementations.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>

#include "uroce/ip_address.h"
#include "uroce/wire.h"

namespace uroce::transport {

struct QpCaps {
    uint32_t max_send_wr = 0;
    uint32_t max_recv_wr = 0;
    uint32_t max_send_sge = 0;
    uint32_t max_recv_sge = 0;
    uint32_t max_inline_data = 0;
};

enum class AsyncEventType {
    QpFatal,
    QpAccessError,
    QpRequestError,
    CommEstablished,
    SqDrained,
    LastWqeReached,  // a QP on an SRQ entered ERR: it takes no more WQEs from the SRQ
};

class Qp {
  public:
    explicit Qp(uint32_t qpn) : qpn_(qpn) {}
    virtual ~Qp() = default;
    Qp(const Qp&) = delete;
    Qp& operator=(const Qp&) = delete;

    uint32_t qpn() const { return qpn_; }
    // The transport of the packets this QP takes (the top 3 bits of their opcode); the
    // engine drops others before they reach it.
    virtual wire::Transport transport() const = 0;

    // --- called by the engine thread (or a polling application thread) ---
    // One packet that passed the engine's checks (parse, ICRC, P_Key, transport, QPN).
    virtual void on_packet(const wire::ParsedPacket& pkt, const IpAddress& src_ip) = 0;
    // Consecutive packets for this QP from one source, as on_packet() one after the other.
    // A GRO train's packets come this way (packet_run.h): an implementation that takes a
    // lock per packet takes it once here.
    virtual void on_packets(std::span<const wire::ParsedPacket> pkts, const IpAddress& src_ip) {
        for (const wire::ParsedPacket& pkt : pkts) on_packet(pkt, src_ip);
    }
    // The packet on_packet() just took came marked ECN Congestion Experienced: the
    // notification point's cue (congestion.h). RC and UC answer with a CNP.
    virtual void on_ce_marked(const IpAddress& src_ip) { static_cast<void>(src_ip); }
    // A CNP naming this QP passed the engine's checks (parse, ICRC, P_Key): the reaction
    // point's cue (congestion.h). RC slows down.
    virtual void on_cnp(const IpAddress& src_ip) { static_cast<void>(src_ip); }
    // Sends the acknowledgement the last receive batch asked for, if any.
    virtual void flush_ack() {}
    // The engine's hold timer (engine_held_acks.cpp): flush_ack() if the ACK this QP holds
    // for its application's answer has waited since `cutoff` or longer, or none is held any
    // more. Returns when the ACK still held began waiting (after `cutoff`), or
    // time_point::max() when it was flushed.
    virtual std::chrono::steady_clock::time_point flush_ack_held_before(
        std::chrono::steady_clock::time_point cutoff) {
        static_cast<void>(cutoff);
        flush_ack();
        return std::chrono::steady_clock::time_point::max();
    }
    // At the end of a receive batch that delivered to this QP: flush_ack(), unless
    // `may_hold_ack` and the QP keeps its ACK for its application's answer
    // (engine_held_acks.cpp).
    virtual void finish_batch(bool may_hold_ack) {
        static_cast<void>(may_hold_ack);
        flush_ack();
    }
    // Runs the QP's timer now if it is due by `now` (a polling application thread does this
    // while the engine thread has handed it the socket: the engine thread would be woken
    // late, by up to a scheduler tick, on CPUs the pollers keep busy). Returns the QP's next
    // deadline, or time_point::max() when no timer is armed.
    virtual std::chrono::steady_clock::time_point run_due_timer(
        std::chrono::steady_clock::time_point now) {
        static_cast<void>(now);
        return std::chrono::steady_clock::time_point::max();
    }

    // Sends the posts it held for the next poll (held_posts.h).
    virtual void send_held() {}
    // On the engine thread, when the socket comes back to it: hands the engine's event loop
    // the timer a polling thread armed meanwhile (Engine::defer_timers).
    virtual void arm_deferred_timer() {}

    // Its turn in the line for the engine's flight budget (flight_budget.h) has come: it
    // sends what it can. Engine::run_flight_turns calls it, with no QP's mutex held.
    virtual void take_flight_turn() {}

    // Stops the QP for good: after this returns no packet, timer or async event reaches it
    // and it sends nothing more. Engine::detach() calls it.
    virtual void close() = 0;

  private:
    const uint32_t qpn_;
};

}  // namespace uroce::transport
