// A packet capture written by the provider itself (UROCE_PCAP): every RoCEv2 packet an
// engine sends or receives, one frame each, as tcpdump on the wire would show it.
//
// Why not tcpdump: it needs root, and on lo it shows a GSO train as one frame of up to 64
// KiB (the kernel cuts trains only where a device needs it). Here each packet is written with
// Ethernet, IPv4 or IPv6, and UDP headers rebuilt from what the engine knows: the addresses and
// ports, DF set, and the IPv4 identification its ICRC was computed for (k for the k-th
// packet of a train, 0 for a packet sent alone; for a received packet, the identification
// that explains its ICRC). So every frame carries a correct ICRC, whatever the batching.
// The MAC addresses are made up (02:00 + the IPv4 address, or the IPv6 address's last four
// bytes): loopback and UDP have none. IPv6 frames carry their UDP checksum, which IPv6 requires.
//
// Files are written with libpcap's writer (classic pcap, Ethernet link type, nanosecond
// timestamps of the system clock, taken as each frame is written). Engines of one process
// that name the same file share one writer; "%p" in the name becomes the process id, so
// several processes can each have their own file.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "uroce/icrc.h"

struct pcap;
struct pcap_dumper;

namespace uroce::transport {

class PacketCapture {
  public:
    // The writer for `pattern` ("%p": the process id, "%%": a percent sign), opened
    // (truncated) on first use in this process, shared afterwards. nullptr with `error` set
    // (and errno-like `err`) if the file cannot be written.
    static std::shared_ptr<PacketCapture> open(const std::string& pattern, std::string& error,
                                               int& err);
    // `pattern` with "%p" and "%%" replaced.
    static std::string expand(const std::string& pattern);

    ~PacketCapture();
    PacketCapture(const PacketCapture&) = delete;
    PacketCapture& operator=(const PacketCapture&) = delete;

    // A packet this host sent: the UDP payload is the concatenation of `udp_payload` (BTH
    // .. ICRC), its ICRC computed for `identification`; `ttl` 0 stands for the default 64.
    // `ecn` is the ECN field it left with (congestion.h).
    void sent(const wire::IpFlow& flow, uint16_t identification, uint8_t ttl,
              std::span<const iovec> udp_payload, uint8_t ecn = 0);
    // A packet this host received. `expected_identification` is the receiver's guess (see
    // icrc_verify); the frame gets the identification that explains the ICRC, or the
    // guess if none does (a corrupted packet shows as such). `ecn` is the ECN field it came
    // with, as the socket reported it.
    void received(const wire::IpFlow& flow, std::span<const uint8_t> udp_payload,
                  uint16_t expected_identification, uint8_t ecn = 0);

    // Frames reach the file when the stream's buffer (kBufferBytes) fills, at flush(), at a
    // flush_if_due() that finds the oldest of them kFlushAfterNanos old or older, and when
    // the last engine using the file closes. A flush per send or receive batch, and a write
    // per frame (libpcap's stream, whose default buffer is smaller than a frame), took a 4
    // KiB ibv_rc_pingpong from 10.5 to 20.2 us an iteration (now 13.7-14.9) and ib_write_bw
    // -s 65536 to 834-890 MiB/s (now 1,776-2,058; 642-650 with a 1 MiB buffer, 1,624-1,746
    // with 64 KiB), captures on both sides.
    // A capture read while the program runs lags by at most kFlushAfterNanos.
    static constexpr size_t kBufferBytes = 1 << 18;
    static constexpr int64_t kFlushAfterNanos = 10'000'000;
    // Hands what was written to the file.
    void flush();
    // Flushes if the oldest frame not yet handed to the file is kFlushAfterNanos old;
    // returns true if frames still wait (the caller then has flush() called that much
    // later: Engine::note_capture_written). The engine calls it after each send and
    // receive batch.
    bool flush_if_due();

    // Frames written so far.
    uint64_t frames() const;
    const std::string& path() const { return path_; }

  private:
    // fork()'s handlers (registered at the first open): every open capture flushed and held
    // still across the fork, so that the child inherits no buffered frame.
    static void before_fork();
    static void after_fork();
    PacketCapture(std::string path, pcap* handle, pcap_dumper* dumper,
                  std::unique_ptr<char[]> buffer);
    void write(const wire::IpFlow& flow, uint16_t identification, uint8_t ttl,
               std::span<const iovec> udp_payload, uint8_t ecn);

    const std::string path_;
    mutable std::mutex mutex_;
    pcap* handle_;
    pcap_dumper* dumper_;
    const std::unique_ptr<char[]> buffer_;  // the stream's buffer (setvbuf)
    uint64_t frames_ = 0;
    int64_t unflushed_since_ns_ = 0;  // TimerQueue::now_ns() of the oldest unflushed frame; 0: none
};

}  // namespace uroce::transport
