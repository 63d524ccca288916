// The per-byte work every RoCE provider in user space does for a stream of RDMA WRITEs over
// UDP, without any of the protocol around it: what `uroce-udp-baseline gso-write-rc` adds to
// `gso-write`, so that tools/bench.sh can show how close uroce comes to the ceiling such a
// provider has on this machine.
//
// Sender: each message's payload copied from the application's buffer into packets laid out
// as on the wire (a 12-byte header, 28 for the first packet with its RETH; the payload; a
// 4-byte CRC-32 of the rest, computed with ISA-L as the ICRC is). Receiver: each packet's CRC
// checked and its payload copied into a region at the packet's place in the message. No
// ACKs, no PSNs, no retransmission, no locks: a lower bound on uroce's own cost.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "transport/page_aligned_buffer.h"

namespace uroce::bench {

class WriteStreamWork {
  public:
    static constexpr std::size_t kHeaderBytes = 12;  // a BTH
    static constexpr std::size_t kRethBytes = 16;    // the first packet's RETH
    static constexpr std::size_t kCrcBytes = 4;      // the ICRC

    // Messages of `msg_bytes` in packets of `seg_bytes` (the first one kRethBytes larger), each
    // carrying seg_bytes - kHeaderBytes - kCrcBytes of payload: at least two packets.
    WriteStreamWork(std::size_t msg_bytes, std::size_t seg_bytes);

    std::size_t packets() const { return packets_; }
    std::size_t payload_per_packet() const { return payload_; }
    // Bytes of the staged message: its packets back to back.
    std::size_t wire_bytes() const { return wire_bytes_; }

    // Copies `app` (msg_bytes) into the staged packets and signs each; returns them.
    std::span<const std::uint8_t> stage(std::span<const std::uint8_t> app);

    // Takes one received packet of a staged message: checks its CRC and copies its payload
    // into the region; returns the payload's size. Nothing (and nothing copied) if the CRC,
    // the packet's index or its length is wrong.
    std::optional<std::size_t> take(std::span<const std::uint8_t> packet);

    // The region the receiver copies into (msg_bytes).
    std::span<const std::uint8_t> region() const { return {region_.data(), msg_}; }

  private:
    std::size_t msg_;
    std::size_t payload_;
    std::size_t packets_;
    std::size_t wire_bytes_;
    transport::PageAlignedBuffer staged_;
    transport::PageAlignedBuffer region_;
};

}  // namespace uroce::bench
