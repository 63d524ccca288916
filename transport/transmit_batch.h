// Packets of one QP on their way to one destination, sent together.
//
// A QP that has several packets to send (the packets of a long message, a window's worth of
// retransmissions, a run of READ responses) opens a batch; Engine::transmit() appends each
// packet to it instead of sending it, and Engine::flush() hands them all to the kernel as
// trains of UDP GSO segments (UDP_SEGMENT). Per packet the kernel's UDP/IP stack then runs
// once per train, not once per packet, which is most of what a packet costs; on loopback
// and veth a train even reaches the receiver whole, and a receiver with UDP_GRO takes it in
// one read (Engine, UdpSocket::enable_gro).
//
// GSO requires every segment but the last to have the same size, so a train holds packets
// of the size of its first one, then at most one shorter packet that closes it: a WRITE's
// FIRST (it carries the RETH) starts a train of its own, its MIDDLEs and its LAST fill the
// next. A train also ends at 64 packets or 65,507 bytes (a 64 KiB SEND needs two), and where
// the destination QPN's device slot changes (device_slots.h): a receiving host's steering
// (qpn_steering.h) hands a whole train to the context that owns its first packet's QPN, so
// a UD QP's posts to QPs of two contexts of one device must not share a train. A batch
// holds up to kMaxTrains trains to the same destination, handed to the kernel in one
// sendmmsg: a 64 KiB WRITE, or a window of them, is one system call, not two per message
// (a call costs 1-2 us on a paravirtualised guest, whatever it carries). When Linux cuts a
// train into datagrams it numbers their IPv4 identifications 0, 1, 2, ... (each train of a
// sendmmsg afresh); the ICRC covers the identification, so packet k of a train carries the
// ICRC for identification k (docs/wire-format.md).
//
// Each packet is built whole (header, payload, pad, ICRC) in the sending thread's staging
// area, back to back, so that a train is one buffer and one iovec. The kernel copies a train
// into its socket buffer with `rep movsb`, which on AMD CPUs is about half as fast when
// source and destination are misaligned relative to each other; gathered from a header
// buffer, registered memory and an ICRC buffer they are, differently for every packet (a
// 4112-byte packet shifts the next payload by 16 bytes): a 15-packet train took 9.6-10.3 us
// to send that way, 5.4-6.0 from one buffer, 7.8 counting the copy into it
// (docs/performance-log.md). The ICRC is computed from the payload where it is, before the
// copy: a CRC over the copy waits for the copy's stores.
//
// A batch opened while the thread's staging area is taken (one batch inside another), or
// when it cannot be allocated, is not used: Engine::transmit() sends each packet alone.
// A batch also pins the memory table (its read lock) from the caller's pin() to the flush,
// as the caller gathers payload from registered memory under it.
//
// Lives on the stack of the sending function (about 3 KiB); the thread's staging area
// (kStageBytes) is allocated at its first batch and kept until the thread ends.
#pragma once

#include <sys/uio.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "transport/memory_table.h"
#include "transport/udp_socket.h"
#include "uroce/wire.h"

namespace uroce::transport {

class Engine;
class UdpSocket;
struct QpCounters;

class TransmitBatch {
  public:
    // Linux takes at most 64 segments per GSO send (UDP_MAX_SEGMENTS; 128 in newer kernels)
    // and an IPv4 UDP payload of at most 65,507 bytes per train. A batch holds at most
    // kMaxPackets packets in all, in at most kMaxTrains trains.
    static constexpr size_t kMaxPackets = 64;
    static constexpr size_t kMaxBytes = 65507;
    static constexpr size_t kMaxTrains = 8;
    static constexpr uint32_t kNoTag = 0xffffffff;
    // Room for kMaxPackets packets of the largest path MTU (4096) with their headers, and
    // for the gap before each train that puts its first payload on a cache line (Slot).
    static constexpr size_t kStageBytes =
        kMaxPackets * (wire::kMaxHeaderBytes + 4096 + 8) + kMaxTrains * 64;

    // Packets sent by the flush are counted in `qp_counters` (tx_packets, tx_payload_bytes),
    // if given.
    TransmitBatch(Engine& engine, QpCounters* qp_counters) noexcept;
    // Sends what is left (Engine::flush).
    ~TransmitBatch();
    TransmitBatch(const TransmitBatch&) = delete;
    TransmitBatch& operator=(const TransmitBatch&) = delete;

    bool empty() const { return count_ == 0; }
    size_t size() const { return count_; }
    // False when the thread's staging area was not to be had: packets then go alone.
    bool usable() const { return stage_ != nullptr; }

    // Where a train whose first packet has `header_bytes` of headers starts in the staging
    // area, the first `used` bytes taken: the first offset from `used` on that puts its
    // payload on a cache line (Slot says why).
    static uint32_t train_offset(size_t used, uint32_t header_bytes) {
        return static_cast<uint32_t>((used + header_bytes + 63) / 64 * 64 - header_bytes);
    }

    // The caller's mark for the packets it appends from now on (e.g. the index of the work
    // request they belong to): failed_tag() names the first packet the flush could not send.
    void set_tag(uint32_t tag) { tag_ = tag; }
    // Set by a flush that returned Failed: the tag of the first packet that can never be
    // sent; kNoTag otherwise. Stays until clear_failure().
    uint32_t failed_tag() const { return failed_tag_; }
    void clear_failure() { failed_tag_ = kNoTag; }

    // Holds the memory table's read lock until the flush (for payloads that point into
    // registered memory). Does nothing if it is held already.
    void pin(const MemoryTable& memory);

    // While set, packets leave alone, after what the batch holds (a large message of an
    // unreliable transport: QpCommon::kUnreliableBatchedBytes says why).
    void set_alone(bool alone) { alone_ = alone; }

  private:
    friend class Engine;

    struct Packet {
        uint32_t offset;  // in the staging area
        uint32_t bytes;
        uint32_t payload_len;
        uint32_t tag;
    };
    // Packets first .. first + count - 1, one GSO send (or one datagram).
    struct Train {
        uint16_t first = 0;
        uint16_t count = 0;
        uint32_t segment_bytes = 0;  // the size of its first packet: the GSO segment size
        uint32_t qpn_slot = 0;       // DeviceSlots::slot_of its packets' destination QPN
        bool closed = false;         // a shorter packet came: it must stay the last
        iovec whole{};               // its packets, back to back in the staging area
    };
    // Where the next packet would go: a new train or the last one, its index there (the
    // IPv4 identification Linux gives it, which its ICRC covers), and its offset in the
    // staging area. A train starts where its first payload begins on a cache line, as a
    // payload gathered from registered memory usually does: a lone 4 KiB packet sent from
    // the staging area with its payload 12 bytes into a line took the kernel twice as long
    // to copy as from the application's page-aligned buffer (ibv_rc_pingpong -s 4096, path
    // MTU 4096: 30 us per iteration against 26).
    struct Slot {
        bool new_train = false;
        uint16_t index_in_train = 0;
        uint32_t offset = 0;
    };

    // Where a packet of `bytes` bytes, `header_bytes` of them headers, from `from` to
    // `dst_qpn` at `dst_ip` would go; false if the batch must be sent first. Changes
    // nothing: add() does, once the packet is built at at(slot).
    bool place(const UdpSocket& from, const IpAddress& dst_ip, uint32_t dst_qpn, uint32_t bytes,
               uint32_t header_bytes, Slot& slot) const;
    uint8_t* at(const Slot& slot) const { return stage_ + slot.offset; }
    // Adds the packet place() gave `slot`, built at at(slot).
    void add(const UdpSocket& from, const IpAddress& dst_ip, uint32_t dst_qpn, const Slot& slot,
             uint32_t bytes, uint32_t payload_len);
    iovec packet_iov(size_t i) const { return {stage_ + packets_[i].offset, packets_[i].bytes}; }
    uint8_t* packet_data(size_t i) const { return stage_ + packets_[i].offset; }
    std::span<const iovec> train_iov(size_t t) const { return {&trains_[t].whole, 1}; }
    // Forgets the packets (sent or dropped); the pin stays.
    void clear() noexcept;
    void unpin() noexcept;

    Engine& engine_;
    QpCounters* const qp_counters_;
    const UdpSocket* from_ = nullptr;
    IpAddress dst_ip_;
    uint32_t tag_ = kNoTag;
    uint32_t failed_tag_ = kNoTag;
    bool alone_ = false;
    MemoryTable::ReadLock pin_;
    size_t count_ = 0;
    size_t ntrains_ = 0;
    std::array<Train, kMaxTrains> trains_;
    std::array<Packet, kMaxPackets> packets_;
    uint8_t* stage_ = nullptr;  // the thread's staging area, while this batch holds it
    size_t stage_used_ = 0;
};

}  // namespace uroce::transport
