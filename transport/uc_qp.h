// An unreliable-connected queue pair (IBA 9.7, UC rows): SEND and RDMA WRITE (with or without
// immediate data) to one peer QP, in PSN order, with no acknowledgements and no retries.
//
// Send: every packet of a message goes out when it is posted (in RTS), and the WQE completes
// once the socket took its last packet. Receive: packets are taken in PSN order; a gap (a
// lost packet) abandons the message in progress: a SEND's receive WQE is kept for the next
// message (never completed with part of one), a WRITE stops where it was, and nothing
// resumes until the first packet of a new message. A message the responder cannot take (no
// receive WQE, a bad rkey, a length that does not add up) is dropped the same way, silently,
// as UC has no NAKs; the QP goes on. Only a bad local receive buffer stops it (ERR).
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>

#include "transport/completion_queue.h"
#include "transport/qp.h"
#include "transport/qp_common.h"
#include "transport/qp_counters.h"
#include "transport/qp_state.h"
#include "transport/rc_qp.h"
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
    // RTS/SQD/ERR, ENOMEM when the send queue is full.
    int post_send(const SendWqe& wqe);
    int post_recv(const RecvWqe& wqe);

    void on_packet(const wire::ParsedPacket& pkt, const IpAddress& src_ip) override;
    // The notification point (congestion.h); UC has no window to cut for a CNP.
    void on_ce_marked(const IpAddress& src_ip) override;

  private:
    WcStatus send_message(const SendWqe& wqe);
    bool gather(const SendWqe& wqe, uint32_t offset, uint32_t len, iovec* iov, size_t& niov);
    void complete_send(const SendWqe& wqe, WcStatus status);
    bool push(CompletionQueue& cq, const Completion& c);
    void on_request(const wire::ParsedPacket& pkt);
    // The message in progress is given up (its SEND keeps its receive WQE).
    void drop_message();
    void enter_error();

    QpAttributes attrs_;
    uint32_t next_psn_ = 0;
    bool got_first_packet_ = false;

    // responder
    std::deque<RecvWqe> rq_;
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
