// The parts every queue pair has, whatever its transport: the engine it lives on and the
// socket it sends from, its counters, the protection domain and capabilities it was created
// with, where its completions go and where its receive WQEs may come from, and its state
// under one mutex. RcQp, UcQp and UdQp add their protocol on top.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>

#include "transport/completion_queue.h"
#include "transport/congestion.h"
#include "transport/qp.h"
#include "transport/qp_counters.h"
#include "transport/qp_state.h"
#include "transport/shared_receive_queue.h"
#include "transport/transmit_batch.h"
#include "transport/udp_socket.h"
#include "transport/work_request.h"
#include "uroce/wire.h"

namespace uroce::transport {

class Engine;

class QpCommon : public Qp {
  public:
    // `user_handle` is what the QP's asynchronous events name (the provider's ibv_qp).
    // The QP's counters block is zeroed (it may hold a destroyed QP's figures) and marked
    // with its QPN.
    QpCommon(Engine& engine, uint32_t qpn, uint32_t pd, const QpCaps& caps,
             std::shared_ptr<CompletionQueue> send_cq, std::shared_ptr<CompletionQueue> recv_cq,
             void* user_handle, std::shared_ptr<SharedReceiveQueue> srq);

    uint32_t pd() const { return pd_; }
    void* user_handle() const { return user_handle_; }
    const QpCaps& caps() const { return caps_; }
    const std::shared_ptr<SharedReceiveQueue>& srq() const { return srq_; }
    QpState state() const;
    // Nothing more reaches the QP (packets are counted as for no QP). UC and UD have no
    // timers and nothing in flight, so there is nothing to wait for; RcQp does more.
    void close() override;
    // Sends what posts with `more` left queued (a post list the provider refused halfway),
    // unless the next poll will. UC and UD; RcQp has its own.
    virtual void ring();
    // Sends what waited for the next poll (held_posts.h); a closed QP sends nothing.
    void send_held() override;
    // The PSNs in use, for ibv_query_qp (mlx5 and rxe report these, not those the
    // application set): the next a new request takes, once the QP reached RTS, and the next
    // it expects, once it reached RTR (never for UD). Unset before that and after RESET.
    struct Psns {
        std::optional<uint32_t> send;
        std::optional<uint32_t> expected;
    };
    virtual Psns psns() const = 0;

  protected:
    // Counts a packet delivered to the QP; false (counted as for no QP) once it is closed.
    // Caller holds mutex_.
    bool count_received(const wire::ParsedPacket& pkt);
    // The same for several, with one update of each counter.
    bool count_received(std::span<const wire::ParsedPacket> pkts);
    // Queues an affiliated asynchronous event naming this QP.
    void post_async(AsyncEventType type);
    // The notification point (congestion.h): a packet from `src_ip` arrived CE-marked. If it
    // came from this QP's peer (`peer_ip`; a spoofed source gets no CNP, so CNPs cannot be
    // aimed at a third host) and the QP is connected, peer QP `peer_qpn` gets a CNP, unless
    // this QP sent one less than kCnpInterval ago. Caller holds mutex_.
    void answer_ce_mark(const IpAddress& src_ip, const IpAddress& peer_ip, uint32_t peer_qpn);
    // Whether a post that fills no train may wait for the next poll of a thread that busy-
    // polls (held_posts.h); if so the QP is noted for that poll (once, until send_held clears
    // held_noted_). Counted as tx_held_posts. Caller holds mutex_.
    bool hold_for_poll();
    // UC and UD: sends every queued post (ring, send_held). Caller holds mutex_.
    virtual void send_queued() {}
    // What send_batched() did: posts 0 .. sent-1 left whole; `failed` is the status of post
    // `sent` if it failed here (it and those after it did not leave), else Success.
    struct BatchOutcome {
        size_t sent = 0;
        WcStatus failed = WcStatus::Success;
    };
    // The unreliable transports (UC, UD) have no flow control: nothing tells a sender that
    // the receiving engine fell behind, whose UDP receive buffer then drops what does not
    // fit. In trains their larger packets left faster than the receiving engine took them
    // (ib_send_bw -c UD -s 4096 -n 20000: 3,187 of 20,000 datagrams dropped there, and
    // perftest's server waited for them forever); one by one they never did. So only
    // messages of at most kUnreliableBatchedBytes wait for more (held_posts.h) and join
    // trains, which is what message rate needs; larger ones leave at once, packet by packet.
    static constexpr uint32_t kUnreliableBatchedBytes = 1024;
    static bool batched(const SendWqe& wqe) { return wqe.length <= kUnreliableBatchedBytes; }
    // Sends `n` queued posts of an unreliable QP through one TransmitBatch (GSO trains, a
    // sendmmsg per batch's worth), in order:
    // build(i, batch) gathers post i's packets into it (the batch pins the memory table) and
    // returns its status; the first that fails ends the run. A packet the kernel refuses for
    // good fails its post with LocQpOpErr. Caller holds mutex_.
    BatchOutcome send_batched(size_t n,
                              const std::function<WcStatus(size_t i, TransmitBatch& batch)>& build);

    Engine& engine_;
    const UdpSocket& sender_;  // bound to this QP's UDP source port (Engine::sender_for_qpn)
    QpCounters& qp_counters_;
    const uint32_t pd_;
    const QpCaps caps_;
    const std::shared_ptr<CompletionQueue> send_cq_;
    const std::shared_ptr<CompletionQueue> recv_cq_;
    void* const user_handle_;
    const std::shared_ptr<SharedReceiveQueue> srq_;

    // Guards everything below and all of the derived QP's protocol state.
    mutable std::mutex mutex_;
    bool closed_ = false;
    QpState state_ = QpState::Reset;
    CnpPacer cnp_pacer_;
    bool held_noted_ = false;  // the engine knows this QP waits for a poll (HeldPosts::note)
    // Whether the derived QP's send and expected PSNs are in use (psns()).
    bool send_psn_live_ = false;
    bool expected_psn_live_ = false;
};

}  // namespace uroce::transport
