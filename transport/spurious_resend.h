// Whether a resend the RC requester's timer made was needless: the responder had the
// packets all along and only its ACK was late (a peer whose thread was off the CPU, a slow
// host such as the kernel's rxe under QEMU), rather than lost.
//
// The timer resends when no ACK comes for a while: a tail-loss probe, the probe that goes
// back N, an adaptive timeout (which also halves the send window, once a round trip has been
// measured: before, its wait is only a guess). A late ACK then arrives for the packets as
// first sent, and the responder, which now gets them a second time,
// answers the duplicates with ACKs of their own (uroce names the newest duplicate, rxe its
// newest packet). An ACK that names the newest PSN resent after the requester has already
// seen it acknowledged can only have been drawn by a duplicate of it, and a responder that
// had that packet had every one before it: the resend was not needed (the idea of TCP's
// D-SACK, RFC 3708, with the responder's duplicate ACK as the report). A lost packet or a
// lost ACK never produces one: a resend that repairs something is answered by an ACK that
// acknowledges something new.
//
// The requester then undoes what the timer did (Eifel response, RFC 4015): the send window
// goes back to its size before the cut, and the round trip the late ACK took (at least the
// wait that expired plus the time from the resend to that ACK) becomes a sample of the RTT
// estimate, as it would have been had the ACK come before the timer: the next waits are
// long enough for this peer. Without it, every resend of a lossless `ib_write_bw` between
// two processes of a 2-vCPU VM was of this kind, and each adaptive timeout among them
// halved the window for nothing (docs/performance-log.md).
//
// Plain state of one QP, guarded by its mutex; no I/O. Times are given by the caller.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

namespace uroce::transport {

class SpuriousResendCheck {
  public:
    using Clock = std::chrono::steady_clock;

    // What the requester undoes when a resend proved needless.
    struct Verdict {
        uint64_t late_rtt_us = 0;    // the round trip the late ACK took (an RTT sample)
        uint32_t window_before = 0;  // the send window before the episode's cut (0: no cut)
    };

    bool armed() const { return armed_; }

    // The timer resent packets up to PSN `to` - 1, the newest sent, at `now` after waiting
    // `waited_us` without an ACK (`una` is the oldest unacknowledged PSN). The first resend
    // of a stall starts an episode; later ones while nothing new was acknowledged join it.
    void on_timer_resend(uint32_t to, uint32_t una, uint64_t waited_us, Clock::time_point now);
    // The timer's resend halved the send window, which held `window_before` packets: the
    // first cut of the episode is the one undone.
    void on_window_cut(uint32_t window_before);
    // Something new was acknowledged at `now`: `una` is the oldest PSN still unacknowledged.
    void on_progress(uint32_t una, Clock::time_point now);
    // A loss showed for real (a PSN sequence NAK): the episode's resends were needed.
    void on_loss() { armed_ = false; }
    // An ACK for `psn` that acknowledged nothing new arrived, `una` being the oldest PSN not
    // yet acknowledged: a verdict if it reports a duplicate of the newest packet resent (the
    // episode ends), nothing otherwise.
    std::optional<Verdict> on_stale_ack(uint32_t psn, uint32_t una);
    // A QP moved to RESET.
    void reset() { *this = SpuriousResendCheck{}; }

  private:
    Clock::time_point resent_at_{};  // the first resend
    Clock::time_point acked_at_{};   // the first ACK that acknowledged something after it
    uint32_t waited_us_ = 0;         // the first resend's expired wait
    uint32_t to_ = 0;                // the PSN after the newest resent
    uint32_t window_before_ = 0;
    bool armed_ = false;
    bool acked_ = false;
};

}  // namespace uroce::transport
