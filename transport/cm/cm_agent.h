// The IB communication manager of one device context (IBA 12): the state of every connection
// this context sets up or accepts, the CM MADs that move it along, their retransmission, and
// the events its user (RDMA CM) acts on.
//
// The agent speaks in CM messages (cm_messages.h) and leaves their meaning to its user: it
// does not pick QPs, PSNs or private data, it moves each connection through the IBA states
//
//   active:  Idle -> ReqSent -> RepReceived -> Established -> DreqSent -> Timewait
//   passive: Idle -> ReqReceived -> RepSent -> Established -> DreqReceived -> Timewait
//
// and answers what the protocol answers by itself: a REQ for a service nobody listens on gets
// a REJ (invalid service ID) once it has waited `unmatched_hold` for a listener (CmTimers), a
// resent REQ gets the REP again, a resent REP the RTU again, a DREQ for a connection already
// gone a DREP, so a peer never waits for a context that forgot.
// A message that fits no connection or state is dropped and counted.
//
// The agent has no thread and no timer of its own: expire() resends what waited too long and
// gives up after the retries, next_deadline() says when its owner should call it next, and
// the clock is a function the owner passes in, so unit tests drive the agent with a fake one. Each
// call locks the agent; events are handed to the event handler after the lock is released, so a
// handler may call back in.
//
// This header is part of the transport and knows nothing of libibverbs.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "transport/cm/cm_messages.h"

namespace uroce::transport::cm {

using CmClock = std::chrono::steady_clock;

// Where the agent's MADs go: GsiQp over an engine, or a test's in-memory wire.
class MadSender {
  public:
    virtual ~MadSender() = default;
    virtual void send_mad(uint32_t dst_ip, std::span<const uint8_t, kMadBytes> mad) = 0;
};

struct CmTimers {
    // How long to wait for an answer before sending again: 4.096 us * 2^exponent, the
    // encoding REQ timeouts use (18: about 1.07 s). The same exponent goes into the REQs
    // this agent sends, so the peer knows how long we wait.
    uint8_t response_exponent = 18;
    // Sends after the first one before giving up (REQ, REP, DREQ, SIDR REQ).
    uint8_t max_retries = 15;
    // How long a closed connection's IDs stay reserved, so that late packets of the old
    // connection find nothing to disturb.
    CmClock::duration timewait = std::chrono::seconds(1);
    // How long a REQ or SIDR REQ for a service nobody listens on waits for a listener before
    // it is rejected (REJ invalid service ID, SIDR REP "not supported"). Common tools connect
    // a moment before their server listens (perftest -R listens again for its test connection
    // after a handshake, and its client, rejected, crashes): a REQ that arrives in that moment
    // is taken as if the network had delayed it. 0 rejects at once, as a kernel's CM does.
    CmClock::duration unmatched_hold = std::chrono::milliseconds(250);
};

CmClock::duration response_time(uint8_t exponent);

enum class CmState : uint8_t {
    ReqSent,
    ReqReceived,
    MraSent,  // passive: told the peer to wait longer (MRA) before the REP goes out
    RepSent,
    RepReceived,
    Established,
    DreqSent,
    DreqReceived,
    Timewait,
    SidrReqSent,
    SidrReqReceived,
};
const char* to_string(CmState s);

enum class CmEventType : uint8_t {
    ReqReceived,      // passive: a REQ for a listened service; `listener` says which
    RepReceived,      // active: the REP; answer with send_rtu() or send_rej()
    Established,      // an RTU arrived (passive), or notify_established() was called
    Rejected,         // the peer sent a REJ (reason in the message); the connection is gone
    Unreachable,      // REQ or REP sent max_retries + 1 times unanswered (REJ Timeout sent)
    DreqReceived,     // the peer disconnects; answer with send_drep()
    Disconnected,     // our DREQ was answered (DREP) or timed out; in Timewait now
    TimewaitExit,     // the connection is gone for good; its comm ID is free
    SidrReqReceived,  // passive: a SIDR REQ for a listened service; answer with send_sidr_rep()
    SidrRepReceived,  // active: the SIDR REP (status in the message)
    SidrTimeout,      // active: no SIDR REP after the retries
};
const char* to_string(CmEventType t);

struct CmEvent {
    CmEventType type;
    uint32_t comm_id = 0;          // our local comm ID (the request ID for SIDR)
    uint64_t listener = 0;         // ReqReceived / SidrReqReceived: the token given to listen()
    uint32_t peer_ip = 0;          // host order
    std::optional<CmMad> message;  // the message that caused the event, if one did
};

// What the agent dropped, and why; counted, never acted on.
struct CmAgentCounters {
    uint64_t rx_mads = 0;        // every MAD handed to on_mad()
    uint64_t rx_malformed = 0;   // not a CM MAD the agent decodes (cm_messages.h)
    uint64_t rx_unmatched = 0;   // for a comm ID the agent does not have (answered if IBA says so)
    uint64_t rx_unexpected = 0;  // a message the connection's state does not take
    uint64_t rx_duplicates = 0;  // a resent REQ/REP/DREQ, answered again
    uint64_t rx_held = 0;        // REQs and SIDR REQs that waited for a listener (unmatched_hold)
    uint64_t rx_left_to_other = 0;  // held, then left for the device's context that listens
    uint64_t tx_mads = 0;
    uint64_t tx_resends = 0;
    uint64_t rej_sent = 0;
};

class CmAgent {
  public:
    using EventHandler = std::function<void(const CmEvent&)>;
    using Clock = std::function<CmClock::time_point()>;

    // `comm_id_prefix`: the top 12 bits of every comm ID this agent hands out (the context's
    // device slot, so that QP1 traffic can be steered to the right context by comm ID).
    // `ca_guid`: the node GUID the device reports, written into REQs and REPs.
    CmAgent(MadSender& sender, uint16_t comm_id_prefix, uint64_t ca_guid, CmTimers timers,
            EventHandler on_event, Clock clock = &CmClock::now);
    CmAgent(const CmAgent&) = delete;
    CmAgent& operator=(const CmAgent&) = delete;

    // REQs and SIDR REQs for `service_id` raise ReqReceived / SidrReqReceived with
    // `listener`. 0, or EADDRINUSE when the service already has a listener here. REQs that
    // wait for this listener (unmatched_hold) are taken at the owner's next expire(), which
    // next_deadline() asks for at once.
    int listen(uint64_t service_id, uint64_t listener);
    void stop_listening(uint64_t service_id);

    // Active side. The agent fills in the local comm ID, CA GUID and its response timeout;
    // the rest (QPN, PSN, path, private data) is the caller's. Returns the comm ID, or 0
    // when all 2^20 of this agent's IDs are in use.
    uint32_t send_req(uint32_t peer_ip, CmReq req);
    uint32_t send_sidr_req(uint32_t peer_ip, CmSidrReq req);

    // Passive side and answers. Each returns 0, or EINVAL when `comm_id` is unknown or its
    // state does not allow the message (a REP only after a REQ, and so on).
    int send_rep(uint32_t comm_id, CmRep rep);
    int send_mra(uint32_t comm_id, uint8_t service_timeout);
    int send_rtu(uint32_t comm_id, std::span<const uint8_t> private_data = {});
    int send_rej(uint32_t comm_id, CmRejectReason reason,
                 std::span<const uint8_t> private_data = {});
    int send_dreq(uint32_t comm_id, std::span<const uint8_t> private_data = {});
    int send_drep(uint32_t comm_id, std::span<const uint8_t> private_data = {});
    int send_sidr_rep(uint32_t comm_id, CmSidrRep rep);
    // Forgets a REQ it reported (ReqReceived) without a word, as the kernel's CM resets one
    // its listener has no room for to idle: the peer's resend is taken as a new REQ.
    void abandon(uint32_t comm_id);
    // The QP received its first packet before the RTU (RTU lost): the connection is
    // established (IBA 12.9.7.4). EINVAL unless the connection waits for an RTU.
    int notify_established(uint32_t comm_id);
    // Forgets the connection as ib_destroy_cm_id does: an established one is disconnected
    // (DREQ, no event), a half-open one rejected (REJ; an unanswered SIDR REQ: SIDR REP
    // "rejected"), then its ID rests in timewait.
    void destroy(uint32_t comm_id);

    // A MAD that QP1 received from peer_ip (its whole UD payload).
    void on_mad(uint32_t peer_ip, std::span<const uint8_t> mad);
    // Resends what waited past its deadline, gives up what ran out of retries, ends
    // timewaits. Call it at next_deadline() or later.
    void expire();
    std::optional<CmClock::time_point> next_deadline() const;

    // `observer` runs (without the agent's lock) after every call that may have moved
    // next_deadline(): the owner re-arms its timer there. Set it before the agent is used.
    void set_deadline_observer(std::function<void()> observer);
    // `elsewhere(service_id)` says whether another context of the device listens on the
    // service (one this agent cannot hand a REQ to): a held REQ for it is then dropped at the
    // end of its hold instead of rejected, and the peer's resend reaches that listener. Runs
    // under the agent's lock. Set it before the agent is used.
    void set_listened_elsewhere(std::function<bool(uint64_t)> elsewhere);

    std::optional<CmState> state(uint32_t comm_id) const;
    CmAgentCounters counters() const;

  private:
    struct Connection {
        uint32_t local_id = 0;
        uint32_t remote_id = 0;  // the peer's comm ID (request ID for SIDR), 0 until known
        uint32_t peer_ip = 0;
        CmState state = CmState::ReqSent;
        uint64_t tid = 0;         // of the exchange this connection answers or started
        uint32_t remote_qpn = 0;  // the peer's QPN, from its REQ or REP: DREQs name it
        uint64_t listener = 0;
        bool silent = false;      // destroyed by its user: still answers the peer, reports nothing
        bool report_exit = true;  // timewait ends with TimewaitExit
        std::optional<CmMad> last_sent;  // resent on timeout, or when the peer repeats itself
        bool awaiting = false;           // last_sent waits for an answer
        uint8_t retries_left = 0;
        std::optional<CmClock::time_point> deadline;
    };
    using Events = std::vector<CmEvent>;

    // Under mutex_.
    uint32_t allocate_id();
    // A new connection we start (REQ or SIDR REQ), with a fresh comm ID; nullptr if none.
    Connection* open_active(uint32_t peer_ip, CmState state);
    Connection* find(uint32_t comm_id);
    void transmit(Connection& c, const CmMad& mad, bool await_answer);
    void send_once(uint32_t peer_ip, const CmMad& mad);
    void enter_timewait(Connection& c, bool report_exit);
    void send_reject(uint32_t peer_ip, uint64_t tid, const CmRej& rej);
    // DREQ (naming the connection's IDs and the peer's QP) with retries; DreqSent.
    void start_disconnect(Connection& c, CmDreq dreq);
    // DREP (with the DREQ's transaction ID), then timewait.
    void answer_dreq(Connection& c, const CmDrep& drep, bool report_exit);
    void remove(uint32_t comm_id);
    void emit(Events& out, const Connection& c, CmEventType type, const CmMad* cause);
    // `may_hold`: a REQ for a service nobody listens on waits for a listener
    // (hold_unmatched) rather than being rejected at once.
    void on_req(uint32_t peer_ip, const CmMad& mad, Events& out, bool may_hold);
    void on_sidr_req(uint32_t peer_ip, const CmMad& mad, Events& out, bool may_hold);
    // Keeps a REQ or SIDR REQ nobody listens for until unmatched_hold has passed; false when
    // it must be answered now (holding is off, or too many wait). A resent one already held
    // is dropped (true).
    bool hold_unmatched(uint32_t peer_ip, const CmMad& mad, uint64_t service_id, uint32_t peer_id);
    // Held requests whose time is up: to their listener if one came, else rejected.
    void release_held(CmClock::time_point now, Events& out);
    // The connection a message names by our comm ID, if it came from that connection's peer.
    Connection* addressed(uint32_t peer_ip, uint32_t our_id);
    void on_answer(uint32_t peer_ip, const CmMad& mad, Events& out);
    void dispatch(const Events& events);
    // Declared first in a public call: tells the observer once the call's lock is released.
    struct NotifyOnExit {
        const CmAgent& agent;
        ~NotifyOnExit() {
            if (agent.deadline_observer_) agent.deadline_observer_();
        }
    };

    MadSender& sender_;
    const uint32_t prefix_;  // already shifted into the top 12 bits
    const uint64_t ca_guid_;
    const CmTimers timers_;
    const EventHandler on_event_;
    const Clock clock_;
    std::function<void()> deadline_observer_;
    std::function<bool(uint64_t)> listened_elsewhere_;

    mutable std::mutex mutex_;
    std::unordered_map<uint32_t, Connection> connections_;  // by our comm ID
    // Passive connections by (peer IP, peer comm ID): a resent REQ finds its connection.
    std::map<std::pair<uint32_t, uint32_t>, uint32_t> by_peer_;
    std::unordered_map<uint64_t, uint64_t> listeners_;  // service ID -> token
    // REQs and SIDR REQs waiting for a listener (unmatched_hold), oldest first.
    struct HeldRequest {
        uint32_t peer_ip;
        uint32_t peer_id;  // the peer's comm ID (request ID for SIDR): a resend is the same
        uint64_t service_id;
        CmMad mad;
        CmClock::time_point deadline;
    };
    // Bounds what a peer can make the agent keep by sending REQs for unheard-of services.
    static constexpr size_t kMaxHeldRequests = 64;
    std::vector<HeldRequest> held_;
    uint32_t next_id_;
    CmAgentCounters counters_;
};

}  // namespace uroce::transport::cm
