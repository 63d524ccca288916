// Hands a datagram that reached the wrong context of a shared device back to the kernel,
// whose steering (qpn_steering.h) then takes it to the right one.
//
// A receive path that merges datagrams (GRO: a NIC's, or a veth with NAPI) merges those of one
// UDP flow arriving back to back into one buffer before the socket lookup, and the steering
// program sees a buffer, not datagrams: it hands the whole buffer to the context of its first
// datagram's QPN. One UDP flow (one peer QP's source port, or several peer QPs whose ports
// hash alike: send_sockets.h) can carry datagrams for QPs of several contexts of a device, so
// a context finds, after the first datagram of a buffer, some for another context's slot. The
// sender cannot rule this out (64 source ports for 4095 slots, and senders that are not
// uroce), so the receiver puts each such datagram back: it sends it, unchanged, with its
// original source address and port, to the device's address through a raw socket. That copy
// travels through the loopback device, which merges nothing, and arrives alone: the program
// steers it by its own QPN. A datagram that arrives alone is never sent back (it was steered
// by itself), so nothing circles.
//
// Needs CAP_NET_RAW, as root has (sharing a device needs root anyway); without it the socket
// cannot be opened and the datagram is refused as before (rx_unknown_qp).
#pragma once

#include <cstdint>
#include <span>

#include "uroce/ip_address.h"

namespace uroce::transport {

class KernelResteer {
  public:
    // Opens the raw socket for `local`'s family, in the caller's network namespace (the
    // device's: a raw socket sends in the namespace it was made in).
    explicit KernelResteer(const IpAddress& local);
    ~KernelResteer();
    KernelResteer(const KernelResteer&) = delete;
    KernelResteer& operator=(const KernelResteer&) = delete;

    bool usable() const { return fd_ >= 0; }
    // Sends `udp_payload` as a UDP datagram from src:src_port to the local address's
    // `dst_port`, with IPv4 identification `identification` (what the sender's IPv4 header
    // had, which the ICRC covers), DF set, and ECN field `ecn`. False if the kernel refused it.
    bool send(const IpAddress& src, uint16_t src_port, uint16_t dst_port,
              std::span<const uint8_t> udp_payload, uint16_t identification, uint8_t ecn) const;

  private:
    IpAddress local_;
    int fd_ = -1;
};

}  // namespace uroce::transport
