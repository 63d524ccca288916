// One device's protocol engine: its UDP socket, its queue pairs, its memory table and the
// thread that receives packets and runs timers.
//
// Packets go out from whichever thread has something to send (an application thread in
// post_send, or the engine thread answering a packet). Packets come in on the engine thread,
// which runs a libevent loop (socket and timers) until the engine is destroyed, or on an
// application thread that polls an empty CQ (progress()); a mutex keeps it to one at a time.
#pragma once

#include <event2/event.h>
#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "transport/congestion.h"
#include "transport/counters.h"
#include "transport/delay_line.h"
#include "transport/device_counters.h"
#include "transport/device_slots.h"
#include "transport/early_requests.h"
#include "transport/fault_plan.h"
#include "transport/flight_budget.h"
#include "transport/fork_gate.h"
#include "transport/held_posts.h"
#include "transport/kernel_resteer.h"
#include "transport/memory_table.h"
#include "transport/multicast_groups.h"
#include "transport/packet_capture.h"
#include "transport/packet_run.h"
#include "transport/poll_handoff.h"
#include "transport/qp_counters.h"
#include "transport/qpn_space.h"
#include "transport/qpn_steering.h"
#include "transport/rc_qp.h"
#include "transport/receive_batch.h"
#include "transport/resend_budget.h"
#include "transport/send_sockets.h"
#include "transport/spin_period.h"
#include "transport/timer_queue.h"
#include "transport/transmit_batch.h"
#include "transport/udp_socket.h"
#include "uroce/wire.h"

namespace uroce::transport {

class UdQp;

struct EngineConfig {
    IpAddress ip;
    uint16_t port = wire::kRoceV2Port;
    uint32_t mtu = 1024;              // the port's active MTU in bytes
    std::vector<FaultConfig> faults;  // UROCE_FAULTS' rules (fault_plan.h)
    // The device's slot table (device_slots.h), shared by every context of the device. Set:
    // this engine claims a slot, its QPNs carry it, and it shares ip:port with the device's
    // other contexts through QPN steering where that is available (else it must be alone on
    // ip:port). Empty: a device of its own (unit tests).
    std::string slot_table;
    // This host's uroce devices (the provider's device list): an RC answer to a peer on one
    // of them, on this host, may lead its ACK (Engine::answer_may_lead_ack).
    struct HostDevice {
        IpAddress ip;
        uint16_t port = 4791;
        std::string slot_table;
    };
    std::vector<HostDevice> host_devices;
    // The device's counters file (device_counters.h), used with a slot table: this engine
    // counts into its slot's block there, so the device's totals cover every context. Empty,
    // or a file that cannot be used: the engine counts privately.
    std::string counters_file;
    // RC requesters resend after an adaptive timeout measured from the round trip (at most
    // the QP's local ACK timeout; rtt_estimator.h), not only after the local ACK timeout.
    bool adaptive_retransmit = true;
    // Early resends and probes all QPs together may send at once (resend_budget.h); tests
    // set 0 to see what happens when the budget is spent.
    uint32_t resend_burst = ResendBudget::kBurst;
    // Selective recovery: RC responders keep SEND and WRITE packets that arrive ahead of a
    // lost one and run them once it comes (early_requests.h), up to early_request_bytes
    // across all QPs, and RC requesters answer a sequence NAK with the lost packet alone
    // while the peer is not known to drop such packets (rc_selective_resend.cpp). Off: both
    // go back N, as the IBA describes.
    bool selective_recovery = true;
    size_t early_request_bytes = size_t{32} << 20;
    // Batches of packets leave in one sendmsg as UDP GSO segments (transmit_batch.h).
    bool gso = true;
    // The socket takes trains of datagrams as one buffer (UDP_GRO), split here.
    bool gro = true;
    // Application threads that poll an empty CQ read the socket themselves (progress()),
    // and while they poll in a loop the engine thread leaves the socket to them
    // (poll_handoff.h). Off: only the engine thread reads.
    bool inline_progress = true;
    // While an application thread busy-polls (the socket is handed to it), an RC post that
    // does not fill a GSO train waits for the next poll, which sends all such posts as one
    // train per QP (held_posts.h). Off: every post sends at once.
    bool hold_posts = true;
    // An RC responder whose application answers (it posted send work within the last
    // answer_window_micros) keeps the ACK of a batch the engine thread read until that
    // application posts again, polls or arms a CQ, ack_hold_micros at most
    // (engine_held_acks.cpp). Off: every ACK leaves at the end of its batch.
    bool hold_acks = true;
    uint32_t ack_hold_micros = 1000;
    uint32_t answer_window_micros = 1000;
    // An RC QP that stops answering (destroyed, or to RESET or ERR) sends its last ACK again
    // if one left within this long, or within its local ACK timeout if that is longer
    // (RcQp::send_last_ack).
    uint32_t last_ack_repeat_micros = 1'000'000;
    // After a batch, the engine thread reads on for a moment (Engine::spin_after_batch)
    // instead of sleeping at once, if no application thread polls or waits for a CQ event.
    bool engine_spin = true;
    // ECN (congestion.h): every packet leaves ECN-capable (ECT(0)), so that a congested ECN
    // switch marks it CE instead of dropping it, and the peer's CNPs slow this side down;
    // packets that arrive CE-marked draw CNPs. Off: Not-ECT, and the ECN field of what
    // arrives is not read, as the kernel's rxe does.
    bool ecn_capable = false;
    // Non-empty: every packet sent and received is written to this pcap file (packet_capture.h;
    // "%p" becomes the process id).
    std::string pcap_path;
};

struct AsyncEvent {
    AsyncEventType type;
    void* qp_handle;  // RcQp::user_handle()
};

class Engine {
  public:
    // Binds the socket and starts the engine thread. Returns nullptr and sets `error`
    // (with an errno in `err`) on failure.
    static std::unique_ptr<Engine> create(const EngineConfig& config, std::string& error, int& err);
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // For a child of fork() that inherited this engine: closes the child's descriptors of the
    // engine's sockets, so that a device port held only by the parent is free again when the
    // parent lets it go, and touches nothing else. The engine thread, event loop and locks
    // are the parent's (the child has copies whose owners do not exist here: joining, freeing
    // or locking them could hang), so the caller must then leak the engine, not destroy it.
    void close_sockets_after_fork() noexcept;

    const EngineConfig& config() const { return config_; }
    // The device slot this engine holds (the top 12 bits of its QPNs); 0 without a slot
    // table.
    uint16_t slot_number() const;
    // Makes this engine the receiver of QP1's REQs and SIDR REQs for `service_id` among the
    // device's contexts (QpnSteering::claim_cm_service). 0 at once for an engine alone on
    // its address; EADDRINUSE when another live context has the service.
    int claim_cm_service(uint64_t service_id);
    void release_cm_service(uint64_t service_id);
    // Whether another live context of the device receives `service_id`'s REQs; false for an
    // engine alone on its address.
    bool cm_service_held_elsewhere(uint64_t service_id) const;
    MemoryTable& memory() { return memory_; }
    // The live counters (the slot's block of the device's counters, or private ones).
    EngineCounters& counters() { return *counters_; }
    // What this engine counted since it was created (its block may hold earlier holders').
    CounterValues counters_since_start() const;
    // The counters of this engine's QP `qpn` (qp_counters.h).
    QpCounters& qp_counters(uint32_t qpn) { return qpn_space_.counters(qpn); }
    // How many device slots this engine holds: one, more once it has more QPs than one
    // slot numbers (qpn_space.h).
    unsigned slots_held() const { return qpn_space_.slots_held(); }
    event_base* base() { return base_; }
    // The engine's timers: QPs' retransmission timers, the CM's retries (timer_queue.h).
    TimerQueue& timers() { return *timers_; }
    // Bounds the early resends and tail-loss probes of all this engine's QPs together.
    ResendBudget& resend_budget() { return resend_budget_; }
    // Bounds what the RC QPs of this engine together have in flight (flight_budget.h).
    FlightBudget& flight_budget() { return flight_budget_; }
    // Has the engine thread give the QPs waiting for room in the flight budget their turns
    // (run_flight_turns); from any thread, a QP's mutex held or not.
    void schedule_flight_turns();
    // What RC responders may keep of packets that came early, all QPs together.
    EarlyRequestPool& early_request_pool() { return early_request_pool_; }
    // Held by the engine thread around every callback it runs (fork_gate.h): each callback
    // registered with base() takes it first.
    ForkGate& fork_gate() { return fork_gate_; }

    // Called on the engine thread (or a posting thread) for affiliated asynchronous events.
    void set_async_handler(std::function<void(const AsyncEvent&)> handler);
    void post_async(const AsyncEvent& ev);

    // A QPN drawn at random (24 bits, never 0 or 1, none in use), so that a blind attacker
    // cannot guess it; it stays reserved until detach(). Past 4096 QPs the engine claims a
    // further device slot (qpn_space.h). Throws std::bad_alloc when none is free.
    uint32_t allocate_qpn();
    void attach(const std::shared_ptr<Qp>& qp);
    // Removes the QP from the table and from its multicast groups and closes it
    // (RcQp::close): once this returns, no packet, timer or async event reaches it.
    void detach(uint32_t qpn);
    // Attaches the UD QP `qp` to the IPv4 multicast group `group` (host order): each datagram
    // sent to the group with destination QP 0xFFFFFF reaches it, as every other QP of this
    // engine attached there. 0 or an errno (multicast_groups.h).
    int attach_multicast(const IpAddress& group, const std::shared_ptr<UdQp>& qp);
    // EINVAL if `qpn` is not attached to `group`.
    int detach_multicast(const IpAddress& group, uint32_t qpn);
    // XRC SRQs, by the number XRC requests name in their XRCETH. allocate_srqn() draws a
    // number as allocate_qpn() does (unique on the device); attach_xrc_srq() makes the SRQ
    // findable; detach_xrc_srq() ends that and frees the number. Throws std::bad_alloc
    // when no number is free.
    uint32_t allocate_srqn();
    void attach_xrc_srq(const std::shared_ptr<SharedReceiveQueue>& srq);
    void detach_xrc_srq(uint32_t srqn);
    // The attached XRC SRQ numbered `srqn`, or nullptr.
    std::shared_ptr<SharedReceiveQueue> xrc_srq(uint32_t srqn);
    // QPs attached now (read without the table lock: a hint for sizing send windows).
    uint32_t qp_count() const { return qp_count_.load(std::memory_order_relaxed); }

    // Receives and handles whatever packets are waiting, on the caller's thread, unless
    // another thread is already doing so. Called by pollers that found nothing: on a busy
    // machine this saves the wake-up of the engine thread (tens of microseconds to
    // milliseconds when the polling threads occupy every core); polls in a loop take the
    // socket from the engine thread altogether (poll_handoff.h). Does nothing with
    // inline_progress off.
    void progress();
    // What every CQ poll of the provider (ibv_poll_cq, ibv_start_poll) does before it takes
    // completions: sends the posts held for it and the ACKs held for an answer (all but those
    // a batch held since the last poll, when this one finds completions: they wait for one
    // poll more), then, if the CQ was empty, progress();
    // a poll that found completions reads nothing but still counts towards a busy poll
    // (PollHandoff::on_poll).
    void on_cq_poll(bool cq_empty);
    // A QP armed a timer due at `deadline` (its mutex held): polling threads run it once it
    // is due (Qp::run_due_timer), while the socket is handed to them.
    void note_timer_deadline(std::chrono::steady_clock::time_point deadline);
    // The engine thread has left the socket to polling threads (PollHandoff).
    bool socket_parked() const { return handoff_ && handoff_->parked(); }

    // Posts held for the next poll (held_posts.h). hold_posts(): an application thread busy-
    // polls now, so a post may wait for its next poll. A QP that held a post notes itself
    // (note_held_post), then asks hold_posts() again: false means the pollers left meanwhile
    // and it must send at once. send_held_posts() runs at every CQ poll and when the socket
    // is handed back: each noted QP pumps (Qp::send_held).
    bool hold_posts() const { return config_.hold_posts && socket_parked(); }
    // QP timers armed by a polling thread while the socket is parked. Arming one that becomes
    // the earliest sets the engine's timerfd (10-60 us in a guest that traps on it), and its
    // expiry wakes the engine thread, on a CPU the pollers need: once per post of a
    // ping-pong. The pollers run due timers themselves (run_due_timer), so the QP only
    // notes itself (note_deferred_timer), then asks defer_timers() again: false means the
    // socket came back meanwhile and it adds the event itself. The hand-back hands every
    // noted QP's timer to the loop (Qp::arm_deferred_timer).
    bool defer_timers() const {
        return socket_parked() && std::this_thread::get_id() != thread_.get_id();
    }
    void note_deferred_timer(uint32_t qpn);
    // An application thread armed a CQ for a completion event (PollHandoff::on_arm).
    void note_cq_armed() {
        flush_held_acks();
        if (handoff_) handoff_->on_arm();
    }
    // ACKs held for the answer (engine_held_acks.cpp). A QP whose ACK waits notes itself
    // once (engine thread only); flush_held_acks() sends what every noted QP holds.
    void note_held_ack(uint32_t qpn);
    // True if an RC answer to `dst` may leave before the ACK it carries, in one GSO train:
    // `dst` is a uroce device of this host (EngineConfig::host_devices, and an address of
    // this network namespace: the kernel hands the train whole to its socket), this engine
    // sends and reads trains (GSO and GRO on), and no context of that device reads without
    // GRO (kSplitReadersValue: those get the train cut, and could take the answer before
    // the ACK, which a requester must see first: train_order.h). Asked at RTR: one pread of
    // the peer's table (the first time for a device, also its opening and an address check).
    bool answer_may_lead_ack(const IpAddress& dst);
    // The slot table's shared value that counts a device's contexts reading without GRO.
    static constexpr unsigned kSplitReadersValue = 3;
    // A batch held an ACK: the next CQ poll that finds completions leaves it held (on_cq_poll).
    void spare_held_acks() { held_ack_spared_.store(true, std::memory_order_relaxed); }
    void flush_held_acks();
    // The hold timer's part (engine thread): sends the ACKs held ack_hold_micros or longer
    // by `now`, and sets the timer for the oldest one left.
    void flush_overdue_held_acks(std::chrono::steady_clock::time_point now);
    // Whether the hold timer is set (for tests).
    bool held_acks_timer_pending() const { return held_acks_timer_->pending(); }
    // A CQ poll returned completions (PollHandoff::on_completions).
    void note_completions_taken() {
        if (handoff_) handoff_->on_completions();
    }
    // An application thread posted send work (PollHandoff::on_post).
    void note_post() {
        if (handoff_) handoff_->on_post();
    }
    void note_held_post(uint32_t qpn);
    void send_held_posts();
    uint64_t socket_handbacks() const { return handoff_ ? handoff_->handbacks() : 0; }
    int64_t socket_watch_micros() const { return handoff_ ? handoff_->watch_micros() : 0; }

    // Seam for tests and fuzzing: handles one UDP payload (BTH .. ICRC) exactly as if the
    // socket had delivered it from src_ip:src_port, then sends the ACKs it asked for (unless
    // `send_acks` is false: they stay pending, as in the middle of a receive batch). With
    // `group` set, as if the socket of that multicast group had received it.
    void receive_datagram(std::span<const uint8_t> udp_payload, const IpAddress& src_ip,
                          uint16_t src_port, bool send_acks = true, const IpAddress& group = {});

    // Sees every packet the engine is about to send (the whole UDP payload, ICRC included)
    // after the fault injector let it through; returning false drops it (counted as
    // tx_dropped_filter). For tests that play a peer or lose chosen packets. Pass an empty
    // function to remove it.
    using TransmitFilter =
        std::function<bool(std::span<const uint8_t> udp_payload, const IpAddress& dst_ip)>;
    void set_transmit_filter(TransmitFilter filter);

    // The socket a QP sends from: bound to the UDP source port derived from its QPN, or the
    // main socket if that port cannot be bound (counted in tx_sport_fallback). Valid as long
    // as the engine; a QP looks it up once, not per packet.
    const UdpSocket& sender_for_qpn(uint32_t qpn);

    // What became of a packet handed to transmit().
    enum class TransmitResult {
        Sent,
        // Dropped on purpose (fault injector, transmit filter), because the socket buffer
        // was full (tx_dropped_full) or another send error (tx_errors, e.g. no route for a
        // moment): like a loss on the wire, retransmission recovers it or runs out.
        Lost,
        // Refused for good: larger than the path's IP MTU (tx_too_big), or headers that
        // cannot be built (tx_errors). Sending it again would fail the same way.
        Failed,
        // Appended to a batch: what becomes of it is known at the flush.
        Queued,
    };

    // Seam for tests: the receive buffers, `receive_buffer(i)` for i < receive_buffers().
    size_t receive_buffers() const { return rx_->capacity(); }
    const uint8_t* receive_buffer(size_t i) const { return rx_->buffer(i); }

    // Seam for tests: `hook` runs on the engine thread at the start of every QP timer
    // callback, before the callback takes the QP's lock (empty: none). Lets a test hold a
    // callback in flight while it destroys the QP.
    void set_timer_hook(std::function<void(uint32_t qpn)> hook);
    void run_timer_hook(uint32_t qpn);
    // Seam for tests: `hook` runs on the engine thread each time it starts to read on after
    // a batch (spin_after_batch), with the time (PollHandoff::now_ns) at which it found the
    // application quiet and the spin's period (spin_period.h), before its first read (empty:
    // none). A datagram the hook sends there is read by the spin, whatever the scheduler does
    // meanwhile.
    void set_spin_hook(std::function<void(int64_t now_ns, int64_t period_ns)> hook);
    // The engine thread reads on after a batch only if no application thread of this
    // context polled, posted or armed a CQ for this long (spin_after_batch).
    static constexpr int64_t kSpinQuietMicros = 1000;
    // A spin ends when no packet came for its period (spin_period.h); it lets the loop run its
    // timers after kSpinMaxMicros, then goes on.
    static constexpr int64_t kSpinMaxMicros = 200;

    // Builds the headers, pad and ICRC around `payload` and sends the packet from `from`
    // (unless the fault injector or the transmit filter drops it), with IPv4 TTL `ttl` (0:
    // the socket's). Never waits: the caller holds a QP's mutex.
    //
    // With a `batch` (and GSO on, and ttl 0) the packet joins it (Queued), after the batch
    // was flushed if the packet could not join it; `payload` must then stay valid until the
    // flush (TransmitBatch::pin). `qp`: the counters of the QP sending it, which count the
    // faults injected into it (tx_faults); nullptr for a packet of no QP's (QP1's MADs).
    TransmitResult transmit(const wire::Headers& h, std::span<const iovec> payload,
                            uint32_t payload_len, const IpAddress& dst_ip, const UdpSocket& from,
                            uint8_t ttl = 0, TransmitBatch* batch = nullptr,
                            QpCounters* qp = nullptr);
    // Sends what `batch` holds and empties it: one sendmsg for a train (a GSO send if it
    // holds several packets), one sendmmsg for several trains.
    // Failed if a packet of it can never be sent (batch.failed_tag() says which); Lost if
    // the socket dropped them (full buffer, an error that may pass); else Sent. A path
    // that refuses GSO turns GSO off for this engine (tx_gso_fallbacks) and the packets go
    // out one by one.
    TransmitResult flush(TransmitBatch& batch);
    // GSO on: the configuration asked for it and no path has refused it yet.
    bool gso_enabled() const { return gso_.load(std::memory_order_relaxed); }
    // Some UROCE_FAULTS rule may send a packet travelling `direction` alone, outside any GSO
    // train (corrupted, twice, late or marked CE; a rule that only loses packets never does).
    bool faults_single_out(FaultDirection direction) const {
        return faults_.singles_out(direction);
    }

  private:
    // Asks the transmit filter about the packet gathered from `iov`.
    bool pass_filter(std::span<const iovec> iov, const IpAddress& dst_ip);
    // Counts the outcome `err` (UdpSocket::send) of sending `packets` packets.
    TransmitResult account_send(int err, uint64_t packets);
    // flush() without letting go of the batch's pin: for a flush in the middle of
    // transmit(), whose packet was gathered under the pin and will be sent after.
    TransmitResult send_batch(TransmitBatch& batch);
    // Sends train `t` of `batch` in a sendmsg of its own, as a GSO send if it holds several
    // packets; counts and captures what went out.
    TransmitResult send_train(TransmitBatch& batch, size_t t);
    // Counts and captures train `t`, which a sendmmsg took.
    void train_sent(TransmitBatch& batch, size_t t);
    // Adds packets first .. first + count - 1 to the sending QP's counters.
    void count_qp_sent(const TransmitBatch& batch, size_t first, size_t count);
    // send_train() when GSO failed: each packet of train `t` alone, its ICRC recomputed for
    // identification 0; `sent` counts those that went out.
    TransmitResult send_one_by_one(TransmitBatch& batch, size_t t, size_t& sent);
    // Checks one received UDP payload and adds it to run_ for its QP (handing over what
    // run_ held for another); returns that QP, which touched_ keeps alive until the batch
    // ends. `expected_id`: the IPv4 identification its ICRC most likely covers (the
    // segment's index in a GRO train, icrc_verify). The caller ends with finish_run().
    Qp* deliver(std::span<const uint8_t> datagram, const IpAddress& src_ip, uint16_t src_port,
                uint16_t expected_id = 0);
    // Hands what run_ holds to its QP (packet_run.h).
    void finish_run() { run_.hand_over(); }
    // Checks one datagram the socket of multicast `group` received and hands it to every
    // QP attached to the group.
    void deliver_multicast(std::span<const uint8_t> datagram, const IpAddress& src_ip,
                           uint16_t src_port, const IpAddress& group);
    // The checks every received datagram passes (parse, ICRC against dst_ip, P_Key, not a
    // CNP), counting what fails; false: dropped.
    bool accept(std::span<const uint8_t> datagram, const IpAddress& src_ip, const IpAddress& dst_ip,
                uint16_t src_port, wire::ParsedPacket& pkt, uint16_t expected_id = 0);

    Engine(const EngineConfig& config, std::unique_ptr<DeviceSlot> slot,
           std::unique_ptr<QpnSteering> steering, std::unique_ptr<DeviceCounters> counters);
    static void on_readable(evutil_socket_t fd, short what, void* arg);
    static void on_group_readable(const UdpSocket& socket, const IpAddress& group, void* arg);
    // Both return the datagrams read (a GRO train is one).
    size_t receive_batch();
    // Spin-then-block, on the engine thread after a batch (rx_mutex_ held) that read `read`
    // datagrams: reads on while packets keep coming, until none came for the spin's period
    // (spin_period.h: short for request and answer, long while a peer streams; at most
    // kSpinMaxMicros at a time: the loop then runs its timers and the spin goes on), and only
    // while no application thread of this context polled, posted or armed a CQ within
    // kSpinQuietMicros. A peer that answers within a round trip (the READ requests of
    // ib_read_lat, a stream's next train) is then read without a wake-up, which costs tens
    // of microseconds on a VM. Not beside a thread that polls (it reads the socket itself, and
    // a spinning engine thread would take its CPU) nor one that waits for a completion event
    // (it needs a CPU the moment the engine thread wakes it).
    void spin_after_batch(size_t read);
    // Reads and delivers what `socket` holds (`group` 0: the device's socket).
    size_t receive_from(const UdpSocket& socket, const IpAddress& group);
    void run();
    // What the QP number space asks of this engine: slots, their routes, counter tables.
    QpnSpace::Hooks qpn_space_hooks(bool device_counters);

    EngineConfig config_;
    // Declared before the socket, so they outlive it: the slots are not handed to another
    // context while this socket may still receive their packets. The QP number space (with
    // the slots and the QP counter tables) comes before steering_, so the further slots it
    // routed are still held when it unroutes them.
    QpnSpace qpn_space_;
    std::unique_ptr<QpnSteering> steering_;
    // Before everything that counts, so it outlives it.
    std::unique_ptr<DeviceCounters> device_counters_;
    EngineCounters own_counters_;
    EngineCounters* counters_;
    CounterValues counters_at_start_;
    UdpSocket socket_;
    SendSockets send_sockets_;
    // With steering: puts back a datagram of a merged buffer that is another context's
    // (kernel_resteer.h). Null without steering or without CAP_NET_RAW.
    std::unique_ptr<KernelResteer> resteer_;
    FaultPlan faults_;
    std::shared_ptr<PacketCapture> capture_;  // UROCE_PCAP; null: no capture
    // Sends a packet the fault injector corrupts (a copy with one bit flipped), duplicates
    // or holds back (engine_faults.cpp).
    // `qp`: the sending QP's counters (tx_faults), or null.
    TransmitResult send_faulted(const FaultDecision& fault, QpCounters* qp,
                                std::span<const iovec> packet, uint32_t bytes,
                                const wire::IpFlow& flow, const UdpSocket& sock, uint8_t ttl);
    // Sends one packet built in full (a faulted copy) with ECN field `ecn`, writes it to the
    // capture.
    TransmitResult send_copy(std::span<const uint8_t> packet, const wire::IpFlow& flow,
                             const UdpSocket& sock, uint8_t ttl, uint8_t ecn);
    // The ECN field the sockets give every packet (EngineConfig::ecn_capable).
    uint8_t tx_ecn() const { return config_.ecn_capable ? kEcnEct0 : 0; }
    // Puts `p` in `line` for `delay_us` and makes sure the delay timer fires in time;
    // false (counted as a dropped fault by the caller) when the line is full.
    bool hold(DelayLine& line, uint32_t delay_us, DelayLine::Packet p);
    // Sends and delivers what the delay lines hold that is due, then re-arms the timer.
    static void on_delay_due(void* arg);
    // After frames were written to the capture: flushes it if its oldest frame waited long
    // enough, else has the capture timer flush it then (PacketCapture::flush_if_due).
    void note_capture_written();
    static void on_capture_due(void* arg);
    void release_delayed();
    void arm_delay_timer();
    // A datagram (or a GRO segment) read from a socket: the receive-side faults, then
    // receive_one(). `index` is its position in its GRO train.
    void receive_read(std::span<uint8_t> one, const IpAddress& src_ip, uint16_t src_port,
                      const IpAddress& group, uint16_t index);
    // True if `one`, not the first datagram of its buffer (`index` > 0), is for a slot this
    // context does not hold, and went back to the kernel's steering (kernel_resteer.h).
    bool resteered(std::span<const uint8_t> one, const IpAddress& src_ip, uint16_t src_port,
                   uint16_t index);
    // Writes a received datagram to the capture and hands it to its QP (or group),
    // remembering the QP for the batch's ACK.
    void receive_one(std::span<const uint8_t> one, const IpAddress& src_ip, uint16_t src_port,
                     const IpAddress& group, uint16_t index);
    DelayLine tx_delayed_, rx_delayed_;
    std::unique_ptr<TimerQueue::Timer> delay_timer_;    // fires when the first held packet is due
    std::unique_ptr<TimerQueue::Timer> capture_timer_;  // flushes the capture's last frames
    std::atomic<bool> capture_timer_armed_{false};
    std::mutex delay_timer_mutex_;  // orders re-arming against the callback's reading
    // Writes packets first .. first + count - 1 of a batch, one train that left, to the
    // capture.
    void capture_sent(const TransmitBatch& batch, size_t first, size_t count);
    MemoryTable memory_;
    ResendBudget resend_budget_{config_.resend_burst};
    FlightBudget flight_budget_;
    event* flight_turn_event_ = nullptr;  // run_flight_turns on the engine thread
    std::mutex flight_turns_mutex_;       // held by the one thread giving turns
    std::atomic<bool> flight_turns_again_{false};
    // Gives the QPs in the flight budget's line their turns, oldest first, while there is
    // room: at the end of each receive batch (the ACKs that made room) and on
    // flight_turn_event_. No QP's mutex held.
    void run_flight_turns();
    static void on_flight_turns(evutil_socket_t, short, void* arg);
    EarlyRequestPool early_request_pool_{config_.selective_recovery ? config_.early_request_bytes
                                                                    : 0};
    ForkGate fork_gate_;  // outlives the engine thread (joined in ~Engine)
    event_base* base_ = nullptr;
    std::unique_ptr<TimerQueue> timers_;  // every timer of the engine; freed before base_
    event* rx_event_ = nullptr;
    event* stop_event_ = nullptr;           // activated to end the loop, even before it started
    std::unique_ptr<PollHandoff> handoff_;  // uses rx_event_ and base_: freed before them
    // The engine thread's alone (spin_after_batch): its spin, whether it ended idle (the
    // thread then sleeps, and the next batch is a wake-up's: at start too), and until when
    // it reads on, kept over the loop's turns at the cap.
    SpinPeriod spin_period_;
    bool spin_ended_idle_ = true;
    int64_t spin_idle_until_ns_ = 0;
    HeldPosts held_posts_;
    HeldPosts deferred_timers_;  // QPs whose timer waits for the hand-back (defer_timers)
    HeldPosts held_acks_;        // QPs whose ACK waits for their application's answer
    std::atomic<bool> held_ack_spared_{false};            // spare_held_acks() since the last poll
    std::unique_ptr<TimerQueue::Timer> held_acks_timer_;  // ack_hold_micros after the first
    std::vector<uint32_t> young_held_acks_;  // flush_overdue_held_acks' (engine thread only)
    static void on_held_acks_due(void* arg);
    // The batch being read is the engine thread's: its ACKs may wait (guarded by rx_mutex_).
    bool batch_may_hold_acks_ = false;
    // At the hand-back: the held posts go out, the deferred timers go to the loop.
    void on_handed_back();
    // The QP of that number, or null (destroyed meanwhile).
    std::shared_ptr<Qp> qp_numbered(uint32_t qpn) const;
    std::thread thread_;

    // Runs the timers that are due, on a polling thread (progress(), with rx_mutex_ held:
    // one scanning thread at a time, and QP mutexes taken under it as the receive path does).
    // `polled_ns`: the time the poll read (PollHandoff::on_poll), or 0.
    void run_due_timers(int64_t polled_ns);
    // No deadline earlier than this is armed (it may be earlier than every armed one: a
    // stale hint costs one scan). Nanoseconds of steady_clock.
    static constexpr int64_t kNoTimer = INT64_MAX;
    std::atomic<int64_t> next_timer_ns_{kNoTimer};
    std::vector<std::shared_ptr<Qp>> timer_scan_;  // guarded by rx_mutex_
    mutable std::shared_mutex qps_mutex_;
    // QPN -> QP; a null entry is a QPN allocated but not yet attached.
    std::unordered_map<uint32_t, std::shared_ptr<Qp>> qps_;
    std::atomic<uint32_t> qp_count_{0};
    // XRC SRQ number -> SRQ (null while reserved); guarded by qps_mutex_.
    std::unordered_map<uint32_t, std::shared_ptr<SharedReceiveQueue>> xrc_srqs_;

    std::mutex filter_mutex_;
    TransmitFilter transmit_filter_;
    std::mutex hooks_mutex_;  // guards timer_hook_ and spin_hook_
    std::function<void(uint32_t)> timer_hook_;
    std::atomic<bool> has_timer_hook_{false};
    std::function<void(int64_t, int64_t)> spin_hook_;
    std::atomic<bool> has_spin_hook_{false};
    std::atomic<bool> has_transmit_filter_{false};

    std::mutex async_mutex_;
    std::function<void(const AsyncEvent&)> async_handler_;

    // Its sockets' read events belong to base_: ~Engine closes them before freeing it.
    MulticastGroups multicast_;

    std::atomic<bool> gso_;
    bool reads_whole_ = false;    // the socket reads with UDP_GRO
    bool counted_split_ = false;  // this context counts in kSplitReadersValue
    // config_.host_devices, as answer_may_lead_ack asks about them: whether the address is
    // this namespace's (asked once), and the device's table, kept open.
    struct HostPeer {
        IpAddress ip;
        uint16_t port;
        std::optional<bool> local;
        SharedValueReader table;
    };
    std::mutex host_peers_mutex_;
    std::vector<HostPeer> host_peers_;  // guarded by host_peers_mutex_
    std::mutex rx_mutex_;               // one receiver at a time; guards rx_, touched_, members_
    // Buffers of 64 KiB with GRO, of a datagram's worth without.
    std::unique_ptr<ReceiveBatch> rx_;
    std::vector<std::shared_ptr<Qp>> touched_;
    PacketRun run_;  // packets deliver() gathered for one QP; under rx_mutex_
    std::vector<std::shared_ptr<UdQp>> members_;  // of the group being delivered to
    // The ECN field of the datagram being delivered (congestion.h); under rx_mutex_.
    uint8_t rx_ecn_ = 0;
};

}  // namespace uroce::transport
