// How many request bytes the RC QPs of one engine may have in flight together, and whose
// turn it is when they have used that up.
//
// All the QPs of a context send through one socket, and what they send to a peer lands in
// that peer's one receive socket: more than it holds is dropped. Each QP's send window
// (send_window.h) takes a share of 2 MiB, but never less than 16 packets, and a message of
// one packet needs a packet whatever its share: 10,000 QPs posting a 4 KiB WRITE each put
// 40 MB on the way at once. The receiving socket dropped 3,800-10,000 of those packets per
// run, and the QPs recovered them with 900-5,900 local ACK timeouts per side (each one of a
// QP's retries) while the engine's resend budget held back 21,000-26,000 early resends
// (2026-12-07, docs/performance-log.md).
//
// So a QP sends a packet for the first time only while the engine's QPs together have less
// than kBytes unacknowledged, and only if no other QP waits for its turn; otherwise it waits
// in line (oldest first) and the engine gives it its turn when ACKs make room
// (Engine::run_flight_turns). Resends are never held: their bytes are still counted (a
// QP's charge is what it sent and was not acknowledged), and a QP whose timer resends from
// the oldest unacknowledged PSN (an early resend, the local ACK timeout) or that waits out
// an RNR NAK is charged nothing for what it sent before: that was lost or is late, and a QP
// whose peer went away must not hold the engine's traffic until its retries run out. While
// QPs wait in line, the QPs with no round trip measured make no early guess at a loss
// (rc_retransmit_timer.cpp): the path is full of the engine's own traffic.
//
// One QP alone never meets the limit: its window's ceiling is 1 MiB.
//
// Shared by every thread that sends for the engine's QPs; no lock on the way of a packet
// (two relaxed loads), a mutex for the line of waiting QPs.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>

namespace uroce::transport {

class FlightBudget {
  public:
    // What a peer's receive socket is assumed to hold with room to spare (uroce asks for 4
    // MiB; 4 KiB datagrams take about twice their size of it). The QPs' send windows share
    // 2 MiB (rc_requester.cpp): QPs that keep to their shares never wait (8 QPs streaming
    // at 256 KiB each waited with a budget of 2 MiB: ib_write_bw -q 8 5-8% slower).
    static constexpr int64_t kBytes = 3 * 1024 * 1024;

    explicit FlightBudget(int64_t bytes = kBytes) : bytes_(bytes) {}

    int64_t bytes() const { return bytes_; }
    // Bytes the QPs have in flight (their charges, change()).
    int64_t in_flight() const { return in_flight_.load(std::memory_order_relaxed); }
    // QPs waiting for their turn.
    size_t waiting() const { return waiting_count_.load(std::memory_order_relaxed); }

    // Whether a QP may send a packet for the first time, beyond `pending` bytes it sent
    // since it last settled its charge: there is room, and nobody waits in line unless it
    // is this QP's turn (`turn`: Engine::run_flight_turns called it). Room means the bytes
    // in flight before this packet are under the budget: a packet larger than what is left
    // (or a READ's responses) still goes, so that none waits for ever.
    bool admits(int64_t pending, bool turn) const {
        return in_flight() + pending < bytes_ && (turn || waiting() == 0);
    }
    // A QP's charge changed by `delta` bytes (negative: acknowledged, resent from the start,
    // or the QP stopped). True if QPs wait and there is room now: the caller has the engine
    // give them their turns (not with a QP's mutex held: that QP's pump takes its own).
    bool change(int64_t delta);
    // `qpn` waits in line (its QP keeps a flag so that it waits once). True if there is
    // room already (it was turned away only because others wait): the caller has the turns
    // given, or no ACK might come to do it.
    bool wait(uint32_t qpn);
    // The next QP in line, taken out of it, while there is room; false otherwise.
    bool next_turn(uint32_t& qpn);

  private:
    const int64_t bytes_;
    std::atomic<int64_t> in_flight_{0};
    std::atomic<size_t> waiting_count_{0};
    std::mutex mutex_;
    std::deque<uint32_t> waiting_;  // QPNs, oldest first
};

}  // namespace uroce::transport
