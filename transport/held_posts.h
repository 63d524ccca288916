// Work an application posted while it busy-polls, held for its next poll: one doorbell per
// poll instead of one per post.
//
// A NIC starts a WQE as soon as the doorbell rings, at the cost of a PCIe write. Here the
// "doorbell" is a sendmsg, several microseconds of kernel time, and a QP that sends each
// posted WQE on its own sends one datagram per message: perftest's message-rate test posts
// up to 128 WQEs per QP between two polls of its CQ, each a 64-byte SEND. When an
// application thread busy-polls this context's CQs (the socket is handed to the pollers,
// poll_handoff.h), an RC, UC or UD post that does not fill a train (TransmitBatch::kMaxPackets;
// UC and UD: of at most 1 KiB, qp_common.h) is only queued: the QP is noted here and the next poll
// of any CQ of the context, a moment later, sends what every noted QP holds, as one GSO train per
// QP. The receiver then reads one GRO buffer and sends one ACK per train instead of per message.
// An answer does not wait: an RC post to a QP that owes its peer an ACK and has nothing of its
// own in flight answers a request the peer waits on, and leaves at once with the ACK
// (RcQp::may_wait).
//
// The wait is bounded. A poller that stops polling (it turned to a completion channel,
// or to spinning on memory) leaves the socket to the engine thread within a watch
// period (PollHandoff::kWatchMicros; up to kMaxLongWatchMicros in a long park), and the hand-back
// sends what is held. An application that does not busy-poll never has its posts held.
//
// QPs are named by number, not held by pointer: a QP destroyed while noted is simply not
// found at the flush, and one that took its number since has at most its own queue pumped.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

namespace uroce::transport {

class HeldPosts {
  public:
    // Notes that QP `qpn` holds posted work for the next flush (it notes itself once until
    // then; see RcQp::post_send).
    void note(uint32_t qpn);
    // Hands each noted QP to `send` (which takes the QP's lock and pumps it), and forgets
    // them. Cheap when nothing is noted: one relaxed load. Safe from several threads at once
    // (each takes a disjoint share).
    void flush(const std::function<void(uint32_t qpn)>& send);
    bool empty() const { return !any_.load(std::memory_order_relaxed); }

  private:
    std::mutex mutex_;
    std::vector<uint32_t> noted_;  // guarded by mutex_
    std::atomic<bool> any_{false};
};

}  // namespace uroce::transport
