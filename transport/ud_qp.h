// An unreliable-datagram queue pair (IBA 9.8): single-packet SENDs (with or without
// immediate data) to any QP named per work request, no acknowledgements, no retries.
//
// Send: each WQE becomes one UD SEND Only packet with a DETH (the Q_Key, and this QP's number
// as the source), and completes once handed to the socket; a packet lost on the way is lost.
// A post in RTS of at most 1 KiB (kUnreliableBatchedBytes) waits if more of the same post
// list follows or an application thread busy-polls (held_posts.h), as an RC post does, for
// the end of the list or the next poll; the queued packets then leave together, as GSO
// trains per destination (transmit_batch.h), in post order. A larger one leaves at once
// (after those queued), alone: UD has no flow control (qp_common.h). Queued sends leave before the
// QP moves to SQD or changes its attributes, are flushed in ERR and discarded in RESET. A post
// in SQD waits, whatever its size, for the move back to RTS (as RC's and rxe's do).
//
// Receive: a packet whose Q_Key matches takes the next receive WQE (the QP's own or its SRQ's),
// which gets the 40-byte GRH area first (for RoCEv2 over IPv4: 20 zero bytes, then the packet's
// IPv4 header, as rxe writes it) and the payload after it; with no WQE posted the packet is dropped
// (rx_ud_no_wqe), with a wrong Q_Key too (rx_bad_qkey). No packet a peer sends can move the QP out
// of its state.
//
// Multicast: a destination that is an IPv4 multicast group gets the packet with BTH
// destination QP 0xFFFFFF and the destination's hop limit as TTL; the engine hands a
// group's datagrams to each QP attached to it (on_multicast), which takes them as above.
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
#include "transport/ring_queue.h"
#include "transport/shared_receive_queue.h"
#include "transport/transmit_batch.h"
#include "transport/udp_socket.h"
#include "transport/work_request.h"

namespace uroce::transport {

class Engine;

// The GRH area at the start of every UD receive buffer (IBA 11.4.1.2).
inline constexpr uint32_t kGrhBytes = 40;
// A remote Q_Key with this bit set asks for the sending QP's own Q_Key (IBA 10.2.5).
inline constexpr uint32_t kPrivilegedQkeyBit = 0x80000000u;

struct UdAttributes {
    uint32_t qkey = 0;
    uint32_t sq_psn = 0;
    uint32_t mtu = 1024;  // the port's MTU: the largest message
    bool sqd_notify = false;
};

// Where one UD SEND goes: the address handle's destination and the WR's remote QP and Q_Key.
struct UdDestination {
    IpAddress ip;
    uint32_t qpn = 0;
    uint32_t qkey = 0;
    // The IPv4 TTL or IPv6 hop limit of multicast packets (the AH's hop limit); unicast ones keep
    // the socket's.
    uint8_t hop_limit = 64;
    // The PD of the address handle, where the caller has one: a QP sends only through AHs of
    // its own PD (IBA 10.2.3); a request through another's fails (LocQpOpErr), as in rxe.
    std::optional<uint32_t> pd = std::nullopt;
};

// The largest path MTU the IBA has (IBV_MTU_4096): no datagram is longer.
inline constexpr uint32_t kLargestMtu = 4096;

class UdQp final : public QpCommon {
  public:
    UdQp(Engine& engine, uint32_t qpn, uint32_t pd, const QpCaps& caps,
         std::shared_ptr<CompletionQueue> send_cq, std::shared_ptr<CompletionQueue> recv_cq,
         void* user_handle, std::shared_ptr<SharedReceiveQueue> srq = nullptr);

    wire::Transport transport() const override { return wire::Transport::Ud; }

    UdAttributes attributes() const;
    // Applies `attrs` and moves to `next` (the provider checked the transition from
    // `expected`); EINVAL if the QP left `expected` meanwhile.
    int modify(const UdAttributes& attrs, QpState expected, QpState next);
    // 0 or an errno: EINVAL outside RTS/SQD/ERR or for a message longer than the MTU, ENOMEM
    // when SQD holds max_send_wr posts. Only Send and SendWithImm. `more`: another work
    // request of the same post list follows, and this one may wait for it.
    int post_send(const SendWqe& wqe, const UdDestination& dest, bool more = false);
    // How many more posts post_send takes before ENOMEM: only SQD holds posts back.
    size_t send_room() const;
    // EINVAL in RESET or with an SRQ, ENOMEM when full.
    int post_recv(const RecvWqe& wqe);
    Psns psns() const override;

    void on_packet(const wire::ParsedPacket& pkt, const IpAddress& src_ip) override;
    // A packet the socket of multicast `group` received (the engine checked its QPN).
    void on_multicast(const wire::ParsedPacket& pkt, const IpAddress& src_ip,
                      const IpAddress& group);

  private:
    // Takes a packet sent to dst_ip (this device, or a group) into the next receive WQE.
    void receive(const wire::ParsedPacket& pkt, const IpAddress& src_ip, const IpAddress& dst_ip);
    struct QueuedSend {
        SendWqe wqe;
        UdDestination dest;
    };
    // Whether a post just queued may wait for more (the rest of its list, the next poll).
    bool may_wait(const SendWqe& wqe, bool more);
    // Sends every queued post in order, completes them, and on a local error completes the
    // failed one with its status and moves the QP to ERR (which flushes those after it).
    void send_queued() override;
    // Builds `wqe`'s packet into `batch` (or sends it alone); the status its completion
    // carries if it fails here. The batch is pinned.
    WcStatus build(const SendWqe& wqe, const UdDestination& dest, TransmitBatch& batch);
    // Completes the oldest queued post with `status` and forgets it.
    void complete_front(WcStatus status);
    void complete_send(uint64_t wr_id, bool signaled, WcStatus status);
    // Moves to ERR and flushes every queued send and receive WQE.
    void enter_error();

    UdAttributes attrs_;
    uint32_t next_psn_ = 0;
    RingQueue<RecvWqe> rq_;
    RingQueue<QueuedSend> queued_;
};

}  // namespace uroce::transport
