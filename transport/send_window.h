// How many request packets an RC requester may have unacknowledged: its send window.
//
// The window starts at its ceiling (the QP's byte budget over its path MTU, see
// rc_requester.cpp) and stays there while nothing is lost. A loss the peer reveals (a PSN
// sequence NAK) or a retransmission timeout halves it, once per flight: losses of packets
// sent before the cut belong to the flight that caused it and cut nothing more. It then
// grows back by kGrowthPackets for every window's worth of packets acknowledged, up to the
// ceiling (additive increase, multiplicative decrease).
//
// Why: IBA's go-back-N resends everything after a lost packet, so a loss costs about one
// window. A large window keeps a fast path busy with few ACKs (256 packets of 4 KiB instead
// of 64, with an ACK per half window instead of per message: ib_write_bw and ib_send_bw over
// loopback gained a fifth to a quarter) but under random loss it resends far more than it
// delivers; a window that shrinks under loss keeps both.
//
// A peer known to keep what follows a loss (early_requests.h, rc_selective_resend.cpp) is
// repaired with two packets, whatever the window: for it a loss's cut only brakes, and its
// floor is kKeepingMinPackets, not kMinPackets (a CNP's cut keeps kMinPackets: it is the
// only brake congestion has). Under 1% random loss, halving to 16 packets held a 64 KiB WRITE
// stream near that floor, at about half its lossless rate; a floor of 64 made it a fifth
// faster, and no slower under 5% (2026-12-07, docs/performance-log.md).
//
// The window also sets how often the requester asks for an ACK (ack_interval): twice per
// window, so the ACK for the first half comes back while the second is in flight.
//
// Plain state of one QP, guarded by its mutex; no clock, no I/O.
#pragma once

#include <cstdint>

namespace uroce::transport {

class SendWindow {
  public:
    // Never fewer packets in flight than this.
    static constexpr uint32_t kMinPackets = 16;
    // Nor than this, once the peer is known to keep what follows a loss (the window before
    // it adapted to loss); never above the ceiling.
    static constexpr uint32_t kKeepingMinPackets = 64;
    // Packets added per window's worth acknowledged without loss.
    static constexpr uint32_t kGrowthPackets = 4;

    // The most packets the window may hold (at least kMinPackets). The first call after
    // construction or reset() opens the window to it; later calls only ever lower the
    // window to a lower ceiling (more QPs sharing the engine's budget).
    void set_ceiling(uint32_t packets);
    uint32_t packets() const { return packets_; }
    uint32_t ceiling() const { return ceiling_; }
    // Ask for an ACK at least once per this many request packets.
    uint32_t ack_interval() const { return packets_ / 2; }

    // `packets` more were acknowledged; `una_psn` is now the oldest unacknowledged PSN.
    void on_acknowledged(uint32_t packets, uint32_t una_psn);
    // A loss of `lost_psn` showed (a sequence NAK, a retransmission timeout) while
    // `sent_high` is the PSN after the newest packet sent so far (not the end of the message
    // under way: one longer than the window would be a single flight). Returns true if the
    // window was cut (false: the packet was sent before the last cut, whose flight is still
    // being repaired).
    bool on_loss(uint32_t lost_psn, uint32_t sent_high);
    // A congestion notification (a CNP) for the flight whose oldest packet is `oldest_psn`:
    // cut as a loss is, once per flight, but down to kMinPackets whatever the peer keeps
    // (the cut is the only brake a CNP has).
    bool on_congestion(uint32_t oldest_psn, uint32_t sent_high);
    // The loss that cut the window from `packets_before` was none after all (the resend it
    // answered proved needless, spurious_resend.h): the window is that size again (never
    // above the ceiling, never smaller than now) and the cut's flight is over.
    void undo_cut(uint32_t packets_before);
    // The peer was found to keep what follows a loss: a loss's floor rises to
    // kKeepingMinPackets, and a smaller window rises to it the first time. Until reset().
    void set_peer_keeps();
    uint32_t floor() const;
    // Back to the state of a new QP (a QP moved to RESET).
    void reset();

  private:
    bool cut(uint32_t psn, uint32_t sent_high, uint32_t floor_packets);

    bool opened_ = false;
    bool peer_keeps_ = false;
    uint32_t ceiling_ = kMinPackets;
    uint32_t packets_ = kMinPackets;
    uint32_t credit_ = 0;        // packets acknowledged towards the next growth
    bool recovering_ = false;    // a cut's flight is not all acknowledged yet
    uint32_t recovery_psn_ = 0;  // the first PSN to be sent after the cut
};

}  // namespace uroce::transport
