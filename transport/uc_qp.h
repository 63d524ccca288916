// An unreliable-connected queue pair (IBA 9.7, UC rows): SEND and RDMA WRITE (with or without
// immediate data) to one peer QP, in PSN order, with no acknowledgements and no retries.
//
// Send: the WQE completes once the socket took its message's last packet. A post in RTS of at
// most 1 KiB (kUnreliableBatchedBytes) waits if more of its post list follows or an
// application thread busy-polls (held_posts.h), as an RC post does, for the end of the list
// or the next poll (a batch's worth leaves at once); the queued posts then leave together
// in order, as GSO trains. A larger post leaves at once (after those queued), packet by
// packet: UC has no flow control (qp_common.h). Queued posts leave before SQD or a change of
// attributes, are flushed in ERR and discarded in RESET. A post in SQD waits, whatever its
// size, for the move back to RTS (as RC's and rxe's do).
//
// Receive: packets are taken in PSN order; a gap (a
// lost packet) abandons the message in progress: a SEND's receive WQE is kept for the next
// message (never completed with part of one), a WRITE stops where it was, and nothing
// resumes until the first packet of a new message. A message the responder cannot take (no
// receive WQE, a bad rkey, a length that does not add up) is dropped the same way, silently,
// as UC has no NAKs; the QP goes on. Only a bad local receive buffer stops it (ERR).
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>

#include "transport/completion_queue.h"
#include "transport/qp.h"
#include "transport/qp_common.h"
#include "transport/qp_counters.h"
#include "transport/qp_state.h"
#include "transport/rc_qp.h"
#include "transport/ring_queue.h"
#include "transport/shared_receive_queue.h"
#include "transport/udp_socket.h"
#include "transport/work_request.h"

namespace uroce::transport {

class Engine;

class UcQp final : public QpCommon {
  public:
    UcQp(Engine& engine, uint32_t qpn, uint32_t pd, const QpCaps& caps,
         std::shared_ptr<CompletionQueue> send_cq, std::shared_ptr<CompletionQueue> recv_cq,
         void* user_handle, std::shared_ptr<SharedReceiveQueue> srq = nullptr);

    wire::Transport transport() const override { return wire::Transport::Uc; }

    // The RC attribute set; UC uses access (remote write only), the peer, MTU and PSNs.
    int modify(const QpAttributes& attrs, QpState expected, QpState next);
    // Send, SendWithImm, RdmaWrite, RdmaWriteWithImm; EINVAL for the rest or outside
    // RTS/SQD/ERR, ENOMEM when SQD holds max_send_wr posts. `more`: another work request of
    // the same post list follows, and this one may wait for it.
    int post_send(const SendWqe& wqe, bool more = false);
    // How many more posts post_send takes before ENOMEM: only SQD holds posts back.
    size_t send_room() const;
    int post_recv(const RecvWqe& wqe);
    Psns psns() const override;

    void on_packet(const wire::ParsedPacket& pkt, const IpAddress& src_ip) override;
    // The notification point (congestion.h); UC has no window to cut for a CNP.
    void on_ce_marked(const IpAddress& src_ip) override;

  private:
    // Whether a post just queued may wait for more (the rest of its list, the next poll).
    bool may_wait(const SendWqe& wqe, bool more);
    // Sends every queued post in order and completes them; a local error completes the
    // failed post with its status and moves the QP to ERR (which flushes those after it).
    void send_queued() override;
    // Completes the oldest queued post with `status` and forgets it.
    void complete_front(WcStatus status);
    // Gathers `wqe`'s packets into `batch` (pinned); the status of its completion if it
    // fails here.
    WcStatus send_message(const SendWqe& wqe, TransmitBatch& batch);
    bool gather(const SendWqe& wqe, uint32_t offset, uint32_t len, iovec* iov, size_t& niov);
    Completion send_completion(const SendWqe& wqe, WcStatus status) const;
    void complete_send(const SendWqe& wqe, WcStatus status);
    bool push(CompletionQueue& cq, const Completion& c);
    void on_request(const wire::ParsedPacket& pkt);
    // The message in progress is given up (its SEND keeps its receive WQE).
    void drop_message();
    void enter_error();

    QpAttributes attrs_;
    uint32_t next_psn_ = 0;
    bool got_first_packet_ = false;
    // requester: posts not sent yet (may_wait), and their packets
    RingQueue<SendWqe> queued_;
    uint32_t unsent_packets_ = 0;

    // responder
    RingQueue<RecvWqe> rq_;
    std::optional<RecvWqe> recv_;  // the WQE of the SEND in progress
    uint32_t epsn_ = 0;
    enum class InMessage { None, Send, Write } in_message_ = InMessage::None;
    uint32_t recv_offset_ = 0;
    uint64_t write_va_ = 0;
    uint32_t write_rkey_ = 0;
    uint32_t write_left_ = 0;
    uint32_t write_total_ = 0;
};

}  // namespace uroce::transport
