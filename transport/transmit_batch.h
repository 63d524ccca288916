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
// next. A train also ends at 64 packets or 65,507 bytes (a 64 KiB SEND needs two). A batch
// holds up to kMaxTrains trains to the same destination, handed to the kernel in one
// sendmmsg: a 64 KiB WRITE, or a window of them, is one system call, not two per message
// (a call costs 1-2 us on a paravirtualised guest, whatever it carries). When Linux cuts a
// train into datagrams it numbers their IPv4 identifications 0, 1, 2, ... (each train of a
// sendmmsg afresh); the ICRC covers the identification, so packet k of a train carries the
// ICRC for identification k (docs/wire-format.md).
//
// The payload stays where it is (iovecs into registered memory, no copy) until the flush:
// a batch pins the memory table (its read lock) from the first such packet on, so no region
// can be deregistered under it. The owner flushes before anything that needs the memory
// table itself, and before it lets go of the QP's mutex.
//
// Lives on the stack of the sending function: sized for 64 packets, about 14 KiB.
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
    static constexpr size_t kMaxIov = 512;
    static constexpr size_t kMaxTrains = 8;
    static constexpr uint32_t kNoTag = 0xffffffff;

    // Packets sent by the flush are counted in `qp_counters` (tx_packets, tx_payload_bytes),
    // if given.
    TransmitBatch(Engine& engine, QpCounters* qp_counters) noexcept
        : engine_(engine), qp_counters_(qp_counters) {}
    // Sends what is left (Engine::flush).
    ~TransmitBatch();
    TransmitBatch(const TransmitBatch&) = delete;
    TransmitBatch& operator=(const TransmitBatch&) = delete;

    bool empty() const { return count_ == 0; }
    size_t size() const { return count_; }

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

  private:
    friend class Engine;

    struct Packet {
        uint16_t first_iov;
        uint16_t niov;  // header, payload pieces, pad, ICRC
        uint32_t bytes;
        uint32_t payload_len;
        uint32_t tag;
    };
    // Packets first .. first + count - 1, one GSO send (or one datagram).
    struct Train {
        uint16_t first = 0;
        uint16_t count = 0;
        uint32_t segment_bytes = 0;  // the size of its first packet: the GSO segment size
        uint32_t bytes = 0;
        bool closed = false;  // a shorter packet came: it must stay the last
    };
    // Where the next packet would go: a new train or the last one, and its index there
    // (the IPv4 identification Linux gives it, which its ICRC covers).
    struct Slot {
        bool new_train = false;
        uint16_t index_in_train = 0;
    };

    // Where a packet of `bytes` bytes in `niov` pieces, from `from` to `dst_ip`, would go;
    // false if the batch must be sent first. Changes nothing: add() does, once the packet
    // is built.
    bool place(const UdpSocket& from, const IpAddress& dst_ip, uint32_t bytes, size_t niov,
               Slot& slot) const;
    // Adds the packet place() gave `slot`, whose `niov` pieces are at iov_[niov_].
    void add(const UdpSocket& from, const IpAddress& dst_ip, const Slot& slot, uint32_t bytes,
             uint16_t niov, uint32_t payload_len);
    // Train t's pieces: its packets' iovecs, which are contiguous.
    std::span<const iovec> train_iov(size_t t) const;
    // Forgets the packets (sent or dropped); the pin stays.
    void clear() noexcept;
    void unpin() noexcept;

    Engine& engine_;
    QpCounters* const qp_counters_;
    const UdpSocket* from_ = nullptr;
    IpAddress dst_ip_;
    uint32_t tag_ = kNoTag;
    uint32_t failed_tag_ = kNoTag;
    MemoryTable::ReadLock pin_;
    size_t count_ = 0;
    size_t niov_ = 0;
    size_t ntrains_ = 0;
    std::array<Train, kMaxTrains> trains_;
    std::array<Packet, kMaxPackets> packets_;
    std::array<std::array<uint8_t, wire::kMaxHeaderBytes>, kMaxPackets> headers_;
    std::array<std::array<uint8_t, 4>, kMaxPackets> icrcs_;
    std::array<iovec, kMaxIov> iov_;
};

}  // namespace uroce::transport
