// The per-byte work every RoCE provider in user space does for a stream of RDMA WRITEs or
// SENDs over UDP, without any of the protocol around it: what `uroce-udp-baseline
// gso-write-rc` and `gso-rc` add to `gso-write` and `gso`, so that tools/bench.sh can show how
// close uroce comes to the ceiling such a provider has on this machine.
//
// Sender: each message's payload copied from the application's buffer into packets laid out
// as on the wire (a 12-byte header, the first packet's longer by `first_extra` bytes: a
// WRITE's RETH; the payload; a 4-byte CRC-32 of the rest, computed with ISA-L as the ICRC is).
// Receiver: each packet's CRC checked and its payload copied into a region at the packet's
// place in the message. No ACKs, no PSNs, no retransmission, no locks: a lower bound on
// uroce's own cost.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "transport/page_aligned_buffer.h"

namespace uroce::bench {

class RoceStreamWork {
  public:
    static constexpr std::size_t kHeaderBytes = 12;  // a BTH
    static constexpr std::size_t kRethBytes = 16;    // a WRITE's first packet adds its RETH
    static constexpr std::size_t kCrcBytes = 4;      // the ICRC

    // Messages of `msg_bytes` in packets of `seg_bytes` (the first one `first_extra` larger),
    // each carrying seg_bytes - kHeaderBytes - kCrcBytes of payload: at least two packets.
    RoceStreamWork(std::size_t msg_bytes, std::size_t seg_bytes, std::size_t first_extra);

    std::size_t packets() const { return packets_; }
    // Bytes of a staged message: its packets back to back.
    std::size_t wire_bytes() const { return wire_bytes_; }

    // Copies `app` (msg_bytes) into packets at `out` (wire_bytes()) and signs each.
    void stage_into(std::span<const std::uint8_t> app, std::uint8_t* out) const;
    // The same into a buffer of its own, the first payload on a cache line; returns it.
    std::span<const std::uint8_t> stage(std::span<const std::uint8_t> app);

    // Takes one received packet of a staged message: checks its CRC and copies its payload
    // into the region; returns the payload's size. Nothing (and nothing copied) if the CRC is
    // wrong, the packet too short, or its index and length put it outside the message.
    std::optional<std::size_t> take(std::span<const std::uint8_t> packet);

    // The region the receiver copies into (msg_bytes).
    std::span<const std::uint8_t> region() const { return {region_.data(), msg_}; }

  private:
    std::size_t header_of(std::size_t index) const {
        return kHeaderBytes + (index == 0 ? first_extra_ : 0);
    }
    std::size_t stage_offset() const { return 64 - kHeaderBytes - first_extra_ % 64; }

    std::size_t msg_;
    std::size_t first_extra_;
    std::size_t payload_;
    std::size_t packets_;
    std::size_t wire_bytes_;
    transport::PageAlignedBuffer staged_;
    transport::PageAlignedBuffer region_;
};

}  // namespace uroce::bench
