// Packets that UROCE_FAULTS' `delay` and `reorder` hold back, each until its time comes.
//
// Each packet is a copy (its bytes may be an application's memory, or the engine's receive
// buffer, which the next read overwrites) with where it goes or came from. Packets leave in
// the order of their due times, and packets due at the same time in the order they came:
// a fixed delay keeps the order, jitter and `reorder` change it. The line is bounded: a
// packet that finds it full is lost (the caller counts it as a dropped fault).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "uroce/ip_address.h"

namespace uroce::transport {

class UdpSocket;

class DelayLine {
  public:
    static constexpr size_t kMaxPackets = 16384;

    struct Packet {
        std::vector<uint8_t> bytes;         // the UDP payload: BTH .. ICRC
        IpAddress peer_ip;                  // tx: the destination; rx: the source
        uint16_t peer_port = 0;             // rx: the source port
        uint16_t id = 0;                    // rx: the IPv4 identification its ICRC likely covers
        IpAddress group;                    // rx: the multicast group it came through, or ::
        uint8_t ttl = 0;                    // tx: the TTL to send with (0: the socket's)
        uint8_t ecn = 0;                    // the ECN field it is sent with / arrived with
        const UdpSocket* socket = nullptr;  // tx: the socket to send it from
    };

    // Holds `p` until `due_ns` (steady clock). False if the line is full (p is dropped).
    // `earliest` says whether p is now the first to leave (the caller re-arms its timer).
    bool push(uint64_t due_ns, Packet p, bool& earliest);
    // Moves every packet due at `now_ns` into `out`, in leaving order.
    void take_due(uint64_t now_ns, std::vector<Packet>& out);
    // When the first packet is due, if any.
    std::optional<uint64_t> next_due() const;
    size_t size() const;

  private:
    mutable std::mutex mutex_;
    std::multimap<uint64_t, Packet> packets_;  // a multimap keeps insertion order on ties
};

}  // namespace uroce::transport
