// QP1, the General Services Interface (IBA 13.5.1), as far as connection management needs
// it: management datagrams sent as UD SEND Only packets to QP1 of the peer with the GSI Q_Key,
// and the ones that arrive for QP1 handed to a receiver.
//
// A GsiQp is attached to an engine at QPN 1. It takes only what a CM MAD can be: a UD SEND
// Only (no immediate) carrying the GSI Q_Key and at least a whole MAD; anything else is
// dropped and counted. Packets look like the kernel's: migration bit clear, AckReq set, a
// PSN counting the QP's sends.
//
// This header is part of the transport and knows nothing of libibverbs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <shared_mutex>
#include <span>

#include "transport/cm/cm_messages.h"
#include "transport/qp.h"

namespace uroce::transport {
class Engine;
class UdpSocket;
}  // namespace uroce::transport

namespace uroce::transport::cm {

struct GsiCounters {
    std::atomic<uint64_t> rx_mads{0};
    std::atomic<uint64_t> rx_dropped{0};  // wrong opcode, Q_Key or size
    std::atomic<uint64_t> tx_mads{0};
    std::atomic<uint64_t> tx_lost{0};  // the engine could not send (or a fault dropped it)
};

class GsiQp final : public Qp {
  public:
    // Gets every accepted MAD (its first kMadBytes bytes) with the sender's address, on the
    // engine's receive thread.
    using Receiver = std::function<void(uint32_t src_ip, std::span<const uint8_t> mad)>;

    GsiQp(Engine& engine, Receiver receiver);

    wire::Transport transport() const override { return wire::Transport::Ud; }
    void on_packet(const wire::ParsedPacket& pkt, const IpAddress& src_ip) override;
    // After it returns no receiver call is running or will start; send_mad() sends nothing.
    // Not from inside the receiver.
    void close() override;

    // Sends one MAD to QP1 at dst_ip (host order). Safe from any thread.
    void send_mad(uint32_t dst_ip, std::span<const uint8_t, kMadBytes> mad);

    const GsiCounters& counters() const { return counters_; }

  private:
    Engine& engine_;
    const UdpSocket& sender_;
    Receiver receiver_;
    std::shared_mutex receiving_;  // held shared while the receiver runs; close() waits on it
    std::mutex send_mutex_;        // the PSN
    uint32_t next_psn_ = 0;
    std::atomic<bool> closed_{false};
    GsiCounters counters_;
};

}  // namespace uroce::transport::cm
