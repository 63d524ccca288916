// A reliable-connected queue pair: the IBA RC transport for one connection.
//
// The work splits the way the IBA (and the kernel's rxe) splits it:
//   - the requester turns send work requests into request packets, owns the PSN window,
//     and goes back to the oldest unacknowledged PSN when asked to (rc_requester.cpp);
//   - the completer reads ACKs, NAKs and READ responses, retires work requests in order
//     and writes their completions (rc_completer.cpp), and runs the retransmission timer
//     (rc_retransmit_timer.cpp);
//   - the responder executes incoming requests after the PSN, opcode-sequence and key
//     checks, and answers with NAKs (rc_responder.cpp), READ responses, executing the
//     requests held behind them in order (rc_read_responses.cpp), and coalesced ACKs
//     (rc_acks.cpp).
// Selective recovery bends go-back-N where the peer allows: the responder keeps requests that
// come after a lost one (early_requests.h), the requester resends the lost packet alone
// (rc_selective_resend.cpp); docs/selective-recovery.md.
// State changes, flushing and the timer live in rc_qp.cpp.
//
// Threads: the application's threads post work and modify the QP; the engine thread (or a
// polling application thread, see Engine::progress) delivers packets, and the engine thread
// runs timer expiries. One mutex per QP serialises all of them.
#pragma once

#include <event2/event.h>
#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "transport/completion_queue.h"
#include "transport/early_requests.h"
#include "transport/qp.h"
#include "transport/qp_common.h"
#include "transport/qp_counters.h"
#include "transport/qp_state.h"
#include "transport/responder_resources.h"
#include "transport/ring_queue.h"
#include "transport/rtt_estimator.h"
#include "transport/send_window.h"
#include "transport/shared_receive_queue.h"
#include "transport/spurious_resend.h"
#include "transport/timer_queue.h"
#include "transport/transmit_batch.h"
#include "transport/udp_socket.h"
#include "transport/work_request.h"
#include "uroce/wire.h"

namespace uroce::transport {

class Engine;

// Connection attributes, set by modify (the provider validates them first).
struct QpAttributes {
    uint32_t access = 0;  // Access bits the QP grants to remote requests
    IpAddress dst_ip;     // the peer's address
    uint32_t dest_qpn = 0;
    uint32_t mtu = 1024;   // path MTU in bytes
    uint32_t rq_psn = 0;   // first PSN expected from the peer
    uint32_t sq_psn = 0;   // first PSN this QP sends
    uint8_t timeout = 14;  // 4.096 us * 2^timeout; 0 waits forever
    uint8_t retry_cnt = 7;
    uint8_t rnr_retry = 7;       // 7 retries forever
    uint8_t min_rnr_timer = 12;  // IBA RNR timer code sent in our RNR NAKs
    uint8_t max_rd_atomic = 1;   // READs this QP may have outstanding
    uint8_t max_dest_rd_atomic = 1;
    bool sqd_notify = false;  // raise SqDrained when the send queue has drained in SQD
};

// The two halves of an XRC connection (IBA 9.8, "Extended Reliable Connected"): the
// initiator sends requests that each name an XRC SRQ on the far side (XRCETH) and takes only
// responses; the target takes only requests, and each goes into the XRC SRQ it names, which
// must be in the target's XRC domain. Apart from that both are RC, with XRC opcodes.
enum class XrcRole : uint8_t { None, Initiator, Target };

class RcQp final : public QpCommon {
  public:
    // READ response packets sent per step, before the QP's lock is let go (rc_read_responses.cpp):
    // one transmit batch's worth, one system call (16, one 64 KiB READ per call, until
    // 2026-12-01: ib_read_bw 6% slower). A longer READ goes on from the engine thread.
    static constexpr uint32_t kResponseBurst = TransmitBatch::kMaxPackets;
    // The IBA limits a message (the RETH DMA length) to 2^31 bytes.
    static constexpr uint64_t kMaxMessageBytes = 1ull << 31;

    // With `srq`, receive WQEs come from that shared receive queue (the QP has no receive
    // queue of its own, and post_recv fails with EINVAL). An XRC initiator has no receive
    // side, an XRC target no send queue and no CQs (its SRQs have theirs); `xrcd` is the
    // target's XRC domain.
    RcQp(Engine& engine, uint32_t qpn, uint32_t pd, const QpCaps& caps,
         std::shared_ptr<CompletionQueue> send_cq, std::shared_ptr<CompletionQueue> recv_cq,
         void* user_handle, std::shared_ptr<SharedReceiveQueue> srq = nullptr,
         XrcRole xrc_role = XrcRole::None, uint32_t xrcd = 0);
    // Closes the QP (see close()) and frees its timer.
    ~RcQp() override;

    wire::Transport transport() const override {
        return xrc_role_ == XrcRole::None ? wire::Transport::Rc : wire::Transport::Xrc;
    }
    XrcRole xrc_role() const { return xrc_role_; }

    // --- called by the provider (application threads) ---
    QpAttributes attributes() const;
    // The requester's smoothed round trip (rtt_estimator.h), 0 before any sample: for
    // diagnostics and tests.
    uint64_t smoothed_rtt_us() const;
    // Whether the requester has learnt that its peer keeps nothing that follows a gap (it
    // goes back N at a sequence NAK then, rc_selective_resend.cpp): for diagnostics and tests.
    bool peer_keeps_nothing() const;
    // Applies `attrs` and moves to `next` (the provider has checked the transition from
    // `expected`). EINVAL if the QP left `expected` meanwhile (the transport moved it to ERR).
    int modify(const QpAttributes& attrs, QpState expected, QpState next);
    // 0, or an errno: EINVAL in a state that takes no work, ENOMEM when the queue is full.
    // `more`: further WQEs of the same ibv_post_send follow, and the last one (or ring())
    // sends them all at once. A post may also wait for the next poll of a busy-polling
    // application thread (held_posts.h), unless it fills a GSO train.
    int post_send(const SendWqe& wqe, bool more = false);
    // How many more WQEs post_send takes before ENOMEM (ibv_wr_complete checks a batch's
    // room before it posts any of it).
    size_t send_room() const;
    // In SQD with requests still in flight (ibv_query_qp's sq_draining); false once they are
    // done, when SQ_DRAINED is due.
    bool sq_draining() const;
    // Sends what posts with `more` left queued: after an ibv_post_send stopped early.
    void ring() override;
    int post_recv(const RecvWqe& wqe);
    Psns psns() const override;

    // Stops the QP for good: after this returns no packet, timer or async event reaches it
    // and it sends nothing more. Waits for a timer callback running on the engine thread.
    // Engine::detach() calls it; must not be called with the QP's mutex held.
    void close() override;

    // --- called by the engine thread ---
    void on_packet(const wire::ParsedPacket& pkt, const IpAddress& src_ip) override;
    void on_packets(std::span<const wire::ParsedPacket> pkts, const IpAddress& src_ip) override;
    // Congestion notification, both ends (congestion.h, rc_congestion.cpp).
    void on_ce_marked(const IpAddress& src_ip) override;
    void on_cnp(const IpAddress& src_ip) override;
    // Sends the ACK that packets of the last receive batch asked for, if any.
    void flush_ack() override;
    std::chrono::steady_clock::time_point flush_ack_held_before(
        std::chrono::steady_clock::time_point cutoff) override;
    // Keeps that ACK for the application's answer (engine_held_acks.cpp) when `may_hold_ack`
    // and answering(now).
    void finish_batch(bool may_hold_ack) override;
    // Sends the posts held for the next poll.
    void send_held() override;
    void arm_deferred_timer() override;
    std::chrono::steady_clock::time_point run_due_timer(
        std::chrono::steady_clock::time_point now) override;
    void take_flight_turn() override;
    const IpAddress& peer_ip() const { return attrs_.dst_ip; }

  private:
    struct SqEntry {
        SendWqe wqe;
        bool assigned = false;    // PSNs given out
        uint32_t psn = 0;         // first PSN
        uint32_t npkts = 0;       // PSNs the request consumes
        uint32_t read_bytes = 0;  // READ: bytes of the responses [0, read_pkts), in place
        uint32_t read_pkts = 0;   // READ: responses received in order (the first missing one)
        // READ: responses kept beyond the first missing one, in place: bit k is response
        // read_pkts + k (bit 0, the missing one, is never set).
        uint64_t read_kept = 0;
        uint32_t read_asked_end = 0;  // READ: the response its last request asked up to
        bool read_done = false;
        bool read_gap_retried = false;        // a missing response was already asked for again
        uint32_t read_retried_at = 0;         // read_pkts when it was
        WcStatus failed = WcStatus::Success;  // set when this request itself failed
    };

    // requester (rc_requester.cpp)
    // Sends what the window allows, in one transmit batch; pump_window() does the work.
    void pump();
    // The pending ACK and, with `pump_too`, what the window allows, in one transmit batch: an
    // answer and the ACK it answers in one system call. The ACK goes right before the first
    // packet that completes something at the peer (the last of a SEND or of a WRITE with
    // immediate): a peer that waits for its send completion before the answer (ib_send_lat
    // -e: one event per wait, a send CQ of one entry) would otherwise take the answer's
    // event first, and later overrun its send CQ. The packets before that one complete
    // nothing and go first: a multi-packet answer's first train then carries the ACK as its
    // closing segment, and a receiver reads the ACK and the rest of the answer together,
    // not the ACK alone and then the answer (2026-12-01: a 64 KiB ping-pong between network
    // namespaces, 3 datagrams each way -> 2). A WRITE or READ answer completes nothing at
    // the peer and leads its ACK: the peer, polling for the ACK, has the data in memory when
    // the ACK's completion sends it to watch its memory (ib_write_lat). `answer_leads`
    // (leads_ack): the ACK goes after the whole answer, closing its last train, which only a
    // batch with a staging area can build.
    void send_with_ack(bool pump_too, bool answer_leads = false);
    // True if `wqe`, the one request waiting to be sent (of one packet or of several), may
    // leave before the ACK it carries: the peer takes a train's closing ACK first
    // (Engine::answer_may_lead_ack, asked at RTR), and the ACK can close the train of the
    // answer's last packet, the one that completes a receive at the peer.
    bool leads_ack(const SendWqe& wqe) const;
    // After a post: true if what is queued may wait (for the rest of the same
    // ibv_post_send, `more`, or for the next poll), false if it must be sent now.
    bool may_wait(const SendWqe& wqe, bool more);
    void pump_window();
    // Success, or why the request cannot go out: LocProtErr (a local key check failed),
    // LocQpOpErr (the socket refused the packet for good, e.g. larger than the IP MTU).
    // `ask_ack`: the packet asks for an ACK whatever its place.
    WcStatus send_request_packet(SqEntry& e, uint32_t pkt_index, bool ask_ack = false);
    WcStatus send_read_request(SqEntry& e);
    // Counts a request packet sent again (retransmitted_packets, device and QP).
    void count_request_resent();
    WcStatus send_atomic_request(SqEntry& e);
    WcStatus send_atomic_write_request(SqEntry& e);
    // BindMw / LocalInv: the memory table change, and the status their completion carries.
    WcStatus run_local_op(const SendWqe& wqe);
    // Every local key of `e`'s buffer allows local writes (READ and atomic results land there).
    bool local_buffer_writable(const SqEntry& e) const;
    // The atomic's AtomicAckETH has come: the original value goes to the local buffer.
    void on_atomic_ack(const wire::ParsedPacket& pkt);
    // The PSNs `wqe` takes: its packets at the path MTU (a READ's, its responses), at least
    // one; an atomic one.
    uint32_t packets_for(const SendWqe& wqe) const;
    // Why the requester resends: a loss a NAK, an RNR NAK or a timeout revealed, or a
    // tail-loss probe (counted in tail_probes, not as a selective resend).
    enum class Resend { Loss, Probe };
    // Go back N: everything from `psn` again. It leaves the poll handoff's park as it is: a
    // loss is no sign that the pollers will stop (poll_handoff.h).
    void rewind_to(uint32_t psn);
    // selective resends (rc_selective_resend.cpp)
    // A sequence NAK for `psn` that moves the requester back: it sends that packet and its
    // newest one again, alone, when the peer may keep what followed the lost one, and goes
    // back N otherwise.
    void on_sequence_nak(uint32_t psn);
    // Sends packet `psn` and the newest one sent, asking for an ACK; false (nothing sent) if
    // `psn` is not a SEND or WRITE packet.
    bool resend_selected(uint32_t psn, Resend why = Resend::Loss);
    // A sequence NAK's selective resend again, when no answer came (a probe, the adaptive
    // timeout) or the peer sent the same NAK again (its resent packet was lost): the oldest
    // unacknowledged packet and the newest. A few times per NAK (rc_selective_resend.cpp);
    // false (nothing sent) without a NAK, to a peer that keeps nothing, past that bound, or
    // when a selective resend is not possible: the caller goes back N.
    bool resend_selected_again();
    // What an answer acknowledging everything up to `acked` says of the peer.
    void judge_selective(uint32_t acked);
    // The sq_ index of the SEND or WRITE whose PSNs hold `psn` (the only requests a peer
    // keeps, and so the only ones resent alone), or -1.
    int64_t keepable_request_at(uint32_t psn) const;
    bool gather(const SqEntry& e, uint32_t offset, uint32_t len, std::span<iovec> iov,
                size_t& niov) const;

    // One packet on_packets() counted, mutex_ held: to the responder or the completer.
    void take_packet(const wire::ParsedPacket& pkt, const IpAddress& src_ip);

    // completer (rc_completer.cpp, rc_retransmit_timer.cpp)
    void on_response(const wire::ParsedPacket& pkt);
    void on_read_response(const wire::ParsedPacket& pkt);
    // Response `index` of READ `e`, whose opcode and length were checked, copied into the
    // READ's buffer at its place; false (the QP in ERR) if the buffer refused it.
    bool place_read_response(SqEntry& e, uint32_t index, std::span<const uint8_t> payload);
    // Sends READ request `e` again for the responses it lacks, from the first missing one to
    // the first kept one (read_kept) or the end; not again (read_gap_retried) until
    // responses to that request have come, or the timer clears the mark.
    void ask_again_for_read(SqEntry& e);
    // Every READ before the one that `psn` answers that still lacks responses: they were
    // lost (the responder answers in PSN order).
    void ask_again_for_reads_before(uint32_t psn);
    void ack_through(uint32_t psn);
    void retire_front(WcStatus status);
    void complete_send(const SqEntry& e, WcStatus status);
    // The completion `e` ends with, in `c`; false for a success that is not signaled.
    bool send_completion(const SqEntry& e, WcStatus status, Completion& c) const;
    void on_timer();
    // What the timer does when it is due at `now` (mutex_ held), on whichever thread.
    void fire_timer(std::chrono::steady_clock::time_point now);
    void arm_timer();
    void restart_timer();
    void cancel_timer();
    // The restart a READ's responses owe the timer, once per receive batch (mutex_ held).
    // True if the timer was restarted.
    bool restart_timer_if_progressed();
    // Arms the timer `us` after `now` (the caller's clock reading: arm_timer has one already).
    void start_timer(uint64_t us, std::chrono::steady_clock::time_point now);
    bool has_outstanding() const;
    // True if `psn` lies in [oldest unacknowledged PSN, highest PSN sent]: the only PSNs a
    // genuine response can carry.
    bool response_in_window(uint32_t psn) const;
    // An error NAK (not a sequence error) naming the first PSN of the READ or atomic at the
    // front, which lies before the window once some of the READ's responses came: a READ
    // that its responder stops part-way (the region went away) is failed so (rxe and uroce's
    // responder name the request's PSN), and must complete with that error, not time out.
    bool fails_front_read(const wire::ParsedPacket& pkt) const;
    // The outstanding request whose PSN range holds `psn`, or nullptr.
    SqEntry* entry_for_psn(uint32_t psn);
    uint32_t oldest_unacked() const;
    static void timer_trampoline(void* arg);

    // responder (rc_responder.cpp, rc_read_responses.cpp, rc_acks.cpp)
    // A request accepted in sequence but not executed yet: it came while READ responses
    // were still going out, and requests are executed in PSN order. `kept`: it came early
    // and was kept (early_requests.h), so the requester may not have sent it again yet.
    struct HeldRequest : StoredRequest {
        bool kept = false;
    };
    void on_request(const wire::ParsedPacket& pkt);
    // A request in sequence: executed, or held behind READ responses. False if refused
    // before its PSN was accepted (too many held).
    bool accept_in_sequence(const wire::ParsedPacket& pkt);
    void send_sequence_nak();  // for epsn_
    // Keeps a request that came `ahead` PSNs early (early_requests.h), if the engine does.
    void keep_early(const wire::ParsedPacket& pkt, uint32_t ahead);
    // Runs the kept requests that follow in sequence now that `filled` came.
    void run_early(const wire::ParsedPacket& filled);
    void on_duplicate(const wire::ParsedPacket& pkt);
    void execute_request(const wire::ParsedPacket& pkt);
    void execute_one(const wire::ParsedPacket& pkt);  // execute_request's work
    void execute_read(const wire::ParsedPacket& pkt);
    // CmpSwap / FetchAdd (rc_atomics.cpp): executed once, answered from the replay cache after.
    void execute_atomic(const wire::ParsedPacket& pkt);
    void execute_atomic_write(const wire::ParsedPacket& pkt);
    void on_duplicate_atomic(const wire::ParsedPacket& pkt);
    void send_atomic_ack(const ReadResource& r);
    bool length_ok(const wire::ParsedPacket& pkt, bool starts, bool ends) const;
    // Sends up to `budget` READ response packets, oldest READ first.
    void send_responses(uint32_t budget);
    // The first responses of the READs admitted since the last call (responses_due_), in
    // one transmit batch; then held requests, as on_responder_event.
    void send_due_responses();
    uint32_t responses_due_ = 0;  // READs admitted in this receive batch, not answered yet
    // Executes held requests while no READ response is waiting to go out.
    void run_held(uint32_t budget);
    void schedule_responder();
    void on_responder_event();
    static void responder_trampoline(evutil_socket_t, short, void* arg);
    // Makes the receive WQE of the message starting now current (from the QP's own queue or
    // its SRQ); false if there is none (the request gets an RNR NAK).
    bool acquire_recv();
    // XRC target: makes the XRC SRQ the request names current (xrc_srq_); false if it is no
    // XRC SRQ of this target's domain, or not the one of the message in progress. True for
    // other QPs.
    bool select_xrc_srq(const wire::ParsedPacket& pkt);
    // Where receive WQEs come from (nullptr: the QP's own queue) and the PD their buffers
    // and incoming rkeys are checked in: an XRC target's come with each request.
    SharedReceiveQueue* recv_srq() const { return xrc_srq_ ? xrc_srq_.get() : srq_.get(); }
    uint32_t responder_pd() const { return xrc_srq_ ? xrc_srq_->pd() : pd_; }
    // The CQ receive completions go to: an XRC SRQ has its own.
    CompletionQueue* recv_cq() const {
        return xrc_srq_ ? xrc_srq_->xrc().cq.get() : recv_cq_.get();
    }
    WcStatus scatter_to_recv(std::span<const uint8_t> data);
    void send_ack(uint32_t psn, uint8_t syndrome);
    // `by_hold_timer`: the engine's hold timer sends it (held_ack_timeouts, counted before
    // it leaves: its requester, and whoever reads the counters, may see the ACK at once).
    void send_pending_ack(bool by_hold_timer = false);
    // The pending ACK, or the one a cap holds back, naming everything executed: the QP stops
    // answering (destroyed, or moved to RESET or ERR by the application). Then that ACK once
    // more if an ACK left within EngineConfig::last_ack_repeat_micros (or the local ACK
    // timeout): if the one that named the peer's last request was lost, nothing of this QP
    // answers the resend it draws.
    void send_last_ack();
    // flush_ack() with mutex_ held.
    void flush_ack_locked(bool by_hold_timer);
    // A NAK of `code` for `psn`, counted; the QP's state is the caller's business.
    void send_error_nak(wire::NakCode code, uint32_t psn);
    // A NAK, the affiliated `event`, and the QP to ERR: a request the responder refuses.
    void responder_error(wire::NakCode code, uint32_t psn, AsyncEventType event);
    void complete_recv(WcStatus status, uint32_t byte_len, bool with_imm, uint32_t imm,
                       bool solicited, WcOpcode opcode, bool with_inv = false);

    // rc_qp.cpp
    // Every completion goes through here. A completion that finds its CQ full is lost, so
    // the QP cannot go on as if the application had seen it: it enters ERR with
    // IBV_EVENT_QP_FATAL (the CQ raises IBV_EVENT_CQ_ERR), and a receive completion's
    // request is answered with a remote operational error NAK instead of an ACK, so that
    // the requester never reports success for a message whose completion was lost.
    // Returns false if the completion was lost.
    bool push_completion(CompletionQueue& cq, const Completion& c);
    void enter_error();
    void flush_all();
    // False if the packet can never be sent (see Engine::TransmitResult::Failed). Joins
    // tx_batch_ when one is open (its failures show at the flush).
    bool transmit(const wire::Headers& h, std::span<const iovec> payload, uint32_t payload_len);
    // The batch the requester or the responder is filling (on its stack), or nullptr:
    // packets sent meanwhile go out together (transmit_batch.h).
    TransmitBatch* tx_batch_ = nullptr;
    // Where pump_window() puts a pending ACK among the packets it pumps (send_with_ack):
    // right before the first one that completes something at the peer, or after them all
    // (then before the batch's flush, in the train of the last one).
    enum class AckInPump : uint8_t { No, BeforeCompletion, AtEnd };
    AckInPump ack_in_pump_ = AckInPump::No;
    // Sends what tx_batch_ holds. The requester's packets carry the index of their sq_
    // entry as tag: one that can never be sent marks that entry failed; false then.
    bool flush_tx_batch();
    // The memory table's read lock for the caller's scope; with a batch open, the batch's
    // pin instead (held until its flush, which the payload needs anyway) and an empty lock:
    // the thread never holds the read lock twice.
    MemoryTable::ReadLock lock_memory() const;
    // The opcode `op` names in this QP's transport (XRC opcodes are RC's plus 0xa0).
    uint8_t opcode(wire::Opcode op) const { return static_cast<uint8_t>(op) | opcode_base_; }

    const uint32_t qpn_;  // qpn(), kept here for the hot paths
    const XrcRole xrc_role_;
    const uint32_t xrcd_;
    const uint8_t opcode_base_;

    QpAttributes attrs_;

    // requester / completer
    RingQueue<SqEntry> sq_;   // no reference into it across post_send()
    size_t send_index_ = 0;   // sq_ entry being transmitted
    uint32_t send_pkt_ = 0;   // its next packet
    uint32_t next_psn_ = 0;   // PSN the next new request gets
    uint32_t una_psn_ = 0;    // oldest PSN not yet acknowledged
    uint32_t sent_high_ = 0;  // PSN after the highest request packet sent
    uint32_t reads_outstanding_ = 0;
    // The newest PSN a READ response acknowledged implicitly (the one before it): the
    // front READ, completing after responses to later READs came, acknowledges through it.
    uint32_t read_implied_ack_ = 0;
    bool read_implied_valid_ = false;
    // The packets that may be unacknowledged (send_window.h); window_una_ is una_psn_ as
    // the window last saw it (pump_window counts what was acknowledged since).
    SendWindow window_;
    uint32_t window_una_ = 0;
    // Request packets sent since the last one that asked for an ACK.
    uint32_t unrequested_ = 0;
    // Whether pump_window() goes on after the last packet of sq_[send_index_] (or would
    // wait: the packet must ask for an ACK).
    bool goes_on_after_current() const;
    // A loss shown by a NAK or a timeout: the window shrinks (once per flight). True if it did.
    bool note_window_loss(uint32_t lost_psn);
    // The engine's flight budget (flight_budget.h, rc_flight.cpp). The QP's charge is what
    // it sent and was not acknowledged, from flight_from_ when that is later than the
    // oldest unacknowledged PSN (a resend from the start charges nothing for what went
    // before it), at most its window's ceiling of packets, in bytes of its path MTU; 0 out
    // of RTS and SQD.
    int64_t flight_bytes() const;
    // What a packet of `e` sent for the first time adds to the charge (a READ request: its
    // responses).
    int64_t flight_bytes_of(const SqEntry& e) const;
    // Whether a packet of `e` may go for the first time; if not, the QP waits in line.
    bool flight_admits(const SqEntry& e);
    // Brings the engine's count to flight_bytes(), and has the engine give turns if that
    // made room for QPs in line.
    void settle_flight();
    // What was sent before `sent_high_` is charged no more: a resend from the start (the
    // timer's go-back-N, an RNR NAK's wait) finds it lost, or late.
    void forget_flight() { flight_from_ = sent_high_; }
    // A packet sent now would leave the budget full: it asks for an ACK.
    bool flight_fills() const;
    int64_t flight_charge_ = 0;   // what the engine's count holds for this QP
    int64_t flight_pending_ = 0;  // added by packets sent since the last settle_flight()
    uint32_t flight_from_ = 0;
    bool flight_waiting_ = false;  // in the engine's line
    bool flight_turn_ = false;     // take_flight_turn() is pumping
    int retries_left_ = 7;
    int rnr_retries_left_ = 7;
    bool rnr_wait_ = false;  // the timer is an RNR back-off, not a retransmission timeout
    uint32_t rnr_psn_ = 0;
    bool timer_armed_ = false;
    // A response moved the front READ on in this receive batch: the timer restarts once,
    // at the batch's end (finish_batch, flush_ack), not at each response (a clock read and
    // a timer update per packet, a tenth of a READ stream's requester), and a timer that
    // comes due before then restarts instead of resending.
    bool progress_restart_due_ = false;
    uint32_t last_rewind_psn_ = 0xffffffff;
    // The timer's event waits for the hand-back (start_timer, Engine::defer_timers); the QP
    // is noted with the engine until then.
    bool timer_deferred_ = false;
    void add_timer_event(std::chrono::steady_clock::time_point deadline);
    // Packets of the posts queued since the last pump (may_wait()): a train's worth goes at
    // once.
    uint32_t unpumped_packets_ = 0;
    std::unique_ptr<TimerQueue::Timer> timer_;
    std::chrono::steady_clock::time_point timer_deadline_{};
    // Two deadlines share the timer: the IBA local ACK timeout, whose expiry counts a retry
    // (retry_cnt of them fail the QP, as the application configured), and the adaptive
    // timeout (rtt_estimator.h), usually much shorter, which resends without counting.
    bool ack_deadline_set_ = false;
    std::chrono::steady_clock::time_point ack_deadline_{};
    RttEstimator rtt_;
    unsigned rto_backoff_ = 0;  // adaptive timeouts since the last progress
    // A third use of the timer, sooner than both: the tail-loss probe. When nothing has been
    // acknowledged for about two round trips, the last packet sent goes again, alone and
    // asking for an ACK: if the tail of a burst (or its ACK) was lost, that repairs it for
    // one packet; a loss earlier in the burst gets the responder's NAK. Twice per stall at
    // most, armed again only after progress. To a peer known to keep nothing (or with
    // selective recovery off) the second, after twice the wait, goes back N from the oldest
    // unacknowledged packet, and so does a probe armed after a sequence NAK's rewind: such a
    // responder NAKs a sequence error once and then drops every later packet silently until
    // the PSN it asked for comes (rxe), so when that NAK is lost, or the resend it asked
    // for, a probe of the last packet is never answered, and everything from that PSN on
    // must go again anyway. With a second probe of the last packet alone, each such loss
    // waited for the adaptive timeout (at least 1 ms): 23 times in a 71 ms `ib_write_bw` of
    // 300 x 64 KiB under 5% loss. uroce's responder (selective recovery) does answer a probe
    // of its newest packet ahead of a gap, with its NAK again, so the first probe finds a
    // lost NAK: to a peer not known to keep nothing, the second probe without a NAK is the
    // last packet alone again (a silent peer is then most likely one off the CPU, and a
    // go-back-N resent the window for nothing). To a peer that keeps or may keep
    // (below), the probe after a NAK's resend is a selective resend of the packet the NAK
    // named (the oldest unacknowledged: the NAK acknowledged all before it) and the last one
    // (resend_selected_again). Not the probes without a NAK: the packet the peer waits for
    // is unknown then, and the oldest unacknowledged one, which it may well have (it ACKs
    // only what asks for an ACK), draws a duplicate's ACK for that packet alone.
    bool probe_armed_ = false;                     // the timer stands for the probe
    static constexpr unsigned kMaxTailProbes = 2;  // then the retransmission timeout
    unsigned probes_sent_ = 0;                     // since the last progress
    uint32_t probe_psn_ = 0;                       // the packet probed (sent with AckReq)
    // send_tail_probe's pump is under way: the probe goes whatever the send window. It
    // stands for a packet already in flight, and a window cut after that packet went can
    // hold fewer than are in flight: the probe then waited, a go-back-N stood "under way",
    // and the next wait was the early resend's, at least 1 ms (most of the 24 early resends
    // of an ib_write_bw -n 2000 under 5% loss, 2026-12-06).
    bool probe_in_pump_ = false;
    bool nak_resent_ = false;  // a sequence NAK rewound the requester; no progress since
    // Selective resends (rc_selective_resend.cpp): whether the peer keeps requests that
    // come after a lost one (early_requests.h), learnt from its answers.
    enum class PeerKeeps : uint8_t { Unknown, Yes, No };
    PeerKeeps peer_keeps_ = PeerKeeps::Unknown;
    uint8_t keep_strikes_ = 0;  // answers that showed nothing kept, while Unknown
    // Selective resends in a row to a keeping peer, each answered by a NAK for the packet
    // after the one it resent: bounded, so that a peer that stopped keeping (its budget
    // spent) is repaired by going back N rather than one packet per round trip.
    uint8_t selective_chain_ = 0;
    bool selective_open_ = false;    // a selective resend waits for its answer
    uint8_t selective_retries_ = 0;  // repeats of a NAK's selective resend (no answer)
    uint32_t selective_psn_ = 0;     // the missing packet it sent again
    uint32_t selective_tail_ = 0;    // the newest packet it sent with it
    // The PSN after the newest packet a go-back-N sent again (pump_window): an answer to a
    // selective resend proves no keeping if a go-back-N had already sent the packet after
    // the resent one again (a late NAK, after the timer's resend), which the peer then
    // took in sequence (judge_selective).
    uint32_t goback_high_ = 0;
    bool tail_probe_possible() const;
    // The front request is a READ still lacking responses, and no go-back-N is under way:
    // the probe then asks for that READ's missing responses alone (probe_front_read). A
    // lost request for them, or a lost response at the end of their run, shows nowhere
    // else: without the probe each cost the adaptive timeout, at least 1 ms (ib_read_bw
    // under 5% loss, 2026-12-06).
    bool read_probe_possible() const;
    void probe_front_read();
    // The next packet to go is one sent before: a go-back-N is under way.
    bool resending() const;
    // 4.096 us * 2^timeout, as the IBA defines the local ACK timeout (0: none).
    uint64_t local_ack_timeout_us() const { return (4096ull << attrs_.timeout) / 1000; }
    // The probe that goes back N (above): counted as a probe (tail_probes), not as an
    // adaptive timeout; it doubles no later wait.
    void resend_unacknowledged();
    // Something was acknowledged: retries, backoff and the probe start afresh.
    void note_progress();
    void send_tail_probe();
    // Resends the timer made that the responder's duplicate ACKs may prove needless
    // (spurious_resend.h); when the timer's current wait began.
    SpuriousResendCheck spurious_;
    std::chrono::steady_clock::time_point timer_started_{};
    // The timer resends at `now` (a probe, the probe that goes back N, a timeout), up to
    // the newest packet sent: the resend may turn out needless.
    void note_timer_resend(std::chrono::steady_clock::time_point now);
    // An ACK for `psn` that acknowledged nothing new: if it proves the timer's resends
    // needless, the window cut and the short wait are undone.
    void on_stale_ack(uint32_t psn);
    bool rtt_timing_ = false;  // a packet sent once is being timed (Karn: never a resent one)
    uint32_t rtt_psn_ = 0;
    std::chrono::steady_clock::time_point rtt_sent_{};
    void start_rtt_timing(uint32_t psn);
    void take_rtt_sample(uint32_t psn);  // a response for `psn` arrived

    // responder
    RingQueue<RecvWqe> rq_;  // the QP's own receive queue (unused with an SRQ)
    uint32_t epsn_ = 0;      // expected request PSN
    uint32_t msn_ = 0;       // message sequence number
    bool nak_sent_ = false;  // a sequence NAK for epsn_ is out
    // The newest PSN that arrived ahead of epsn_ since the sequence NAK (read only while
    // nak_sent_; not live after an RNR NAK): a copy of it draws the NAK again (on_request).
    uint32_t newest_ahead_ = 0;
    bool newest_ahead_live_ = false;
    bool ack_pending_ = false;
    // When the last plain ACK left (time_point::min(): none since RTR): send_last_ack() sends
    // it again if that was recently.
    std::chrono::steady_clock::time_point last_ack_sent_ =
        std::chrono::steady_clock::time_point::min();
    bool ack_held_noted_ = false;    // the engine knows this QP holds its ACK (note_held_ack)
    bool answer_leads_ack_ = false;  // Engine::answer_may_lead_ack for the peer, at RTR
    // When the pending ACK was first held for the answer (time_point::min(): it is not
    // held). The engine's hold timer sends it ack_hold_micros after that, not sooner: an ACK
    // held a moment ago would leave just before its answer.
    std::chrono::steady_clock::time_point ack_held_since_ =
        std::chrono::steady_clock::time_point::min();
    bool ack_now_ = false;  // the pending ACK answers a duplicate: never held
    // A duplicate came while the pending ACK had not gone out: the next one sends it
    // (on_duplicate). Cleared when an ACK leaves.
    bool probe_absorbed_ = false;
    // No ACK is pending any more (it went out, a NAK replaced it, the QP was reset or
    // failed): what qualified it (ack_now_, probe_absorbed_) goes with it.
    void forget_pending_ack();
    // The application is in a request-response exchange: it posted send work within
    // EngineConfig::answer_window_micros and has at most one request in flight; and the
    // QP's local ACK timeout (0: none) is at least 4 x EngineConfig::ack_hold_micros.
    bool answering(std::chrono::steady_clock::time_point now) const;
    std::chrono::steady_clock::time_point last_post_{};  // of send work (the answer window)
    enum class InMessage { None, Send, Write } in_message_ = InMessage::None;
    // The receive WQE of the message in progress, taken off rq_ or the SRQ when the message
    // needed it; completed, or flushed if the QP fails first, never dropped.
    std::optional<RecvWqe> recv_;
    // XRC target: the XRC SRQ of the request being executed and of the message in progress
    // (and of recv_, if set); let go when no message is open.
    std::shared_ptr<SharedReceiveQueue> xrc_srq_;
    uint32_t recv_offset_ = 0;
    uint64_t write_va_ = 0;
    uint32_t write_rkey_ = 0;
    uint32_t write_left_ = 0;
    uint32_t write_total_ = 0;
    bool got_first_packet_ = false;
    // responder: READ resources, paced responses, held requests, ACK coalescing
    ReadResources reads_;
    std::deque<HeldRequest> held_;
    event* responder_event_ = nullptr;  // continues responses/held requests on the engine thread
    uint32_t ack_psn_ = 0;        // newest executed SEND/WRITE PSN: the only PSN an ACK may name
    uint32_t executing_psn_ = 0;  // the request packet execute_one() runs (or ran last)
    uint32_t ack_msn_ = 0;        // MSN after that packet
    // The newest SEND/WRITE packet that came again since the last ACK, while no new packet
    // came (kNoResentPsn: none): the pending ACK names it instead of ack_psn_. A requester
    // that goes back N resends in order; acknowledging what it has not resent yet completes
    // a request while it is still resending it. The kernel's rxe (Debian 12's 6.1) then
    // stops: the rest of that request never goes out, its timer is not re-armed, and the
    // next request never leaves (ibv_rc_pingpong -s 65536 against rxe in QEMU, 1 run in 6;
    // docs/performance-log.md). The MSN stays ack_msn_: the messages this QP has completed.
    static constexpr uint32_t kNoResentPsn = 0xffffffff;
    uint32_t resent_high_ = kNoResentPsn;
    // Requests that came ahead of a lost one (early_requests.h), run when it comes.
    EarlyRequests early_;
    // A kept request is running: run_early() drains the store, or run_held() reached one.
    bool draining_early_ = false;
    // After kept requests ran: the newest SEND/WRITE PSN the requester has sent since
    // (kNoResentPsn: none ran, or it has caught up). An ACK names nothing newer, for the same
    // reason as resent_high_: the kernel's rxe, going back N, stops if an ACK completes a
    // request it is still resending; a requester that sends only the missing packet and its
    // newest one (rc_selective_resend.cpp) learns at once what the kept ones covered. Never
    // a READ's or an atomic's PSN: an ACK naming one would complete it at a requester that
    // lost its response (rxe completes a one-packet READ so, with no data).
    uint32_t early_ack_cap_ = kNoResentPsn;
};

}  // namespace uroce::transport
