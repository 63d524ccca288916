// See packet_capture.h.
#include "transport/packet_capture.h"
#include "transport/app_memory_guard.h"
#include "transport/fork_gate.h"
#include "transport/timer_queue.h"

#include <pcap/pcap.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <vector>

namespace uroce::transport {
namespace {

constexpr size_t kEthBytes = 14;
constexpr size_t kIpBytes = 20;
constexpr size_t kIpv6Bytes = 40;
constexpr size_t kUdpBytes = 8;
constexpr size_t kFrameHeadBytes = kEthBytes + kIpBytes + kUdpBytes;
constexpr size_t kFrameHeadBytesV6 = kEthBytes + kIpv6Bytes + kUdpBytes;
// The largest UDP payload a frame holds: a 4096-byte MTU packet with every header, with room.
constexpr size_t kMaxUdpPayload = 8192;

void put16(uint8_t* p, uint16_t v) {
    p[0] = static_cast<uint8_t>(v >> 8);
    p[1] = static_cast<uint8_t>(v);
}
void put32(uint8_t* p, uint32_t v) {
    put16(p, static_cast<uint16_t>(v >> 16));
    put16(p + 2, static_cast<uint16_t>(v));
}

// 02:00 (locally administered, unicast) followed by the address's last four bytes (the
// IPv4 address itself).
void put_mac(uint8_t* p, const IpAddress& ip) {
    p[0] = 0x02;
    p[1] = 0x00;
    std::memcpy(p + 2, ip.bytes().data() + 12, 4);
}

// The Internet checksum's running sum of `len` bytes (big-endian 16-bit words).
uint32_t add_words(uint32_t sum, const uint8_t* p, size_t len) {
    for (size_t i = 0; i + 1 < len; i += 2) sum += uint32_t{p[i]} << 8 | p[i + 1];
    if (len & 1) sum += uint32_t{p[len - 1]} << 8;
    return sum;
}

uint16_t fold(uint32_t sum) {
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    return static_cast<uint16_t>(~sum);
}

uint16_t ipv4_checksum(const uint8_t* h) {
    return fold(add_words(0, h, kIpBytes));
}

// One writer per file in this process: contexts that name the same file share it.
std::mutex registry_mutex;
std::map<std::string, std::weak_ptr<PacketCapture>>& registry() {
    static auto* r = new std::map<std::string, std::weak_ptr<PacketCapture>>;  // never freed:
    return *r;  // engines may close after static destructors ran
}

// The captures fork() found open, held (with their locks) from its prepare handler until
// it returns, in the parent and in the child.
std::vector<std::shared_ptr<PacketCapture>>& forking() {
    static auto* v = new std::vector<std::shared_ptr<PacketCapture>>;  // never freed, as above
    return *v;
}

}  // namespace

void PacketCapture::before_fork() {
    // The child gets a copy of each stream's buffer, and its exit() flushes every stdio
    // stream: frames still buffered would reach the file twice. Flushed now, and no frame
    // written until the fork is done (an application thread that sends meanwhile waits).
    // Run with every engine's fork gate held (ForkGate::add_hooks): no engine callback is
    // in the middle of a frame, nor can one start and wait on these locks.
    registry_mutex.lock();
    for (auto& [path, weak] : registry())
        if (auto capture = weak.lock()) {
            capture->mutex_.lock();
            pcap_dump_flush(capture->dumper_);
            capture->unflushed_since_ns_ = 0;
            forking().push_back(std::move(capture));
        }
}

void PacketCapture::after_fork() {
    for (auto& capture : forking()) capture->mutex_.unlock();
    registry_mutex.unlock();
    forking().clear();  // may close a capture its engines let go of meanwhile
}

std::string PacketCapture::expand(const std::string& pattern) {
    std::string out;
    for (size_t i = 0; i < pattern.size(); ++i) {
        if (pattern[i] == '%' && i + 1 < pattern.size()) {
            if (pattern[i + 1] == 'p') {
                out += std::to_string(::getpid());
                ++i;
                continue;
            }
            if (pattern[i + 1] == '%') {
                out += '%';
                ++i;
                continue;
            }
        }
        out += pattern[i];
    }
    return out;
}

std::shared_ptr<PacketCapture> PacketCapture::open(const std::string& pattern, std::string& error,
                                                   int& err) {
    const std::string path = expand(pattern);
    if (path.empty()) {
        error = "empty file name";
        err = EINVAL;
        return nullptr;
    }
    static std::once_flag fork_hooks;
    std::call_once(fork_hooks, [] { ForkGate::add_hooks(&before_fork, &after_fork); });
    std::lock_guard lock(registry_mutex);
    auto& r = registry();
    if (auto it = r.find(path); it != r.end()) {
        if (auto existing = it->second.lock()) return existing;
        r.erase(it);
    }
    // Nanosecond timestamps: the packets of a train, or an answer and its ACK, leave within
    // a microsecond of each other, and a round trip between devices of one host takes a few.
    pcap_t* handle = pcap_open_dead_with_tstamp_precision(
        DLT_EN10MB, static_cast<int>(kFrameHeadBytesV6 + kMaxUdpPayload),
        PCAP_TSTAMP_PRECISION_NANO);
    if (!handle) {
        error = "libpcap could not make a capture handle";
        err = ENOMEM;
        return nullptr;
    }
    // Our own stream, to give it a buffer of kBufferBytes before libpcap writes the header.
    FILE* file = std::fopen(path.c_str(), "wb");
    if (!file) {
        err = errno != 0 ? errno : EIO;
        error = path + ": " + std::strerror(err);
        pcap_close(handle);
        return nullptr;
    }
    auto buffer = std::make_unique<char[]>(kBufferBytes);
    std::setvbuf(file, buffer.get(), _IOFBF, kBufferBytes);
    errno = 0;
    pcap_dumper_t* dumper = pcap_dump_fopen(handle, file);
    if (!dumper) {
        err = errno != 0 ? errno : EIO;
        error = path + ": " + pcap_geterr(handle);
        std::fclose(file);
        pcap_close(handle);
        return nullptr;
    }
    std::shared_ptr<PacketCapture> capture(
        new PacketCapture(path, handle, dumper, std::move(buffer)));
    r[path] = capture;
    return capture;
}

PacketCapture::PacketCapture(std::string path, pcap* handle, pcap_dumper* dumper,
                             std::unique_ptr<char[]> buffer)
    : path_(std::move(path)), handle_(handle), dumper_(dumper), buffer_(std::move(buffer)) {}

PacketCapture::~PacketCapture() {
    pcap_dump_close(dumper_);  // flushes and closes the stream, before its buffer goes
    pcap_close(handle_);
}

uint64_t PacketCapture::frames() const {
    std::lock_guard lock(mutex_);
    return frames_;
}

void PacketCapture::sent(const wire::IpFlow& flow, uint16_t identification, uint8_t ttl,
                         std::span<const iovec> udp_payload, uint8_t ecn) {
    write(flow, identification, ttl, udp_payload, ecn);
}

void PacketCapture::received(const wire::IpFlow& flow, std::span<const uint8_t> udp_payload,
                             uint16_t expected_identification, uint8_t ecn) {
    uint16_t id = expected_identification;
    wire::icrc_verify(flow, udp_payload, expected_identification, &id);
    const iovec one{const_cast<uint8_t*>(udp_payload.data()), udp_payload.size()};
    write(flow, id, 0, std::span(&one, 1), ecn);
}

void PacketCapture::write(const wire::IpFlow& flow, uint16_t identification, uint8_t ttl,
                          std::span<const iovec> udp_payload, uint8_t ecn) {
    std::array<uint8_t, kFrameHeadBytesV6 + kMaxUdpPayload> frame;
    const bool v6 = !flow.dst_ip.is_v4();
    const size_t head = v6 ? kFrameHeadBytesV6 : kFrameHeadBytes;
    size_t len = 0;
    for (const iovec& v : udp_payload) len += v.iov_len;
    // What fits is written (a frame's caplen may be shorter than its length); the lengths in
    // the headers stay the real ones.
    size_t at = head;
    for (const iovec& v : udp_payload) {
        const size_t n = std::min(v.iov_len, frame.size() - at);
        // The payload is application memory, whose pages may be gone (app_memory_guard.h):
        // the frame then keeps zeros there.
        if (n && !guarded_copy(frame.data() + at, v.iov_base, n))
            std::memset(frame.data() + at, 0, n);
        at += n;
    }
    uint8_t* eth = frame.data();
    put_mac(eth, flow.dst_ip);
    put_mac(eth + 6, flow.src_ip);
    uint8_t* udp = eth + head - kUdpBytes;
    put16(udp, flow.src_port);
    put16(udp + 2, flow.dst_port);
    put16(udp + 4, static_cast<uint16_t>(kUdpBytes + len));
    put16(udp + 6, 0);
    if (v6) {
        put16(eth + 12, 0x86dd);
        uint8_t* ip = eth + kEthBytes;
        // Version 6; DSCP and flow label 0 (the ICRC masks the traffic class and the label).
        put32(ip, 0x60000000 | uint32_t{ecn & 3u} << 20);
        put16(ip + 4, static_cast<uint16_t>(kUdpBytes + len));
        ip[6] = 17;  // UDP
        ip[7] = ttl ? ttl : 64;
        std::memcpy(ip + 8, flow.src_ip.bytes().data(), 16);
        std::memcpy(ip + 24, flow.dst_ip.bytes().data(), 16);
        // IPv6 forbids a zero UDP checksum (RFC 8200), and the kernel filled it in on the
        // wire: the pseudo-header (addresses, length, next header), then the datagram. A
        // frame cut short (caplen < len) gets the checksum of what it holds, never a
        // real one; such frames do not occur for RoCE's MTUs.
        uint32_t sum = add_words(0, ip + 8, 32);
        sum += static_cast<uint32_t>(kUdpBytes + len) + 17;
        sum = add_words(sum, udp, at - (head - kUdpBytes));
        uint16_t checksum = fold(sum);
        if (checksum == 0) checksum = 0xffff;
        put16(udp + 6, checksum);
    } else {
        put16(eth + 12, 0x0800);
        uint8_t* ip = eth + kEthBytes;
        ip[0] = 0x45;     // version 4, 20-byte header
        ip[1] = ecn & 3;  // DSCP 0 and the ECN field, both masked by the ICRC
        put16(ip + 2, static_cast<uint16_t>(kIpBytes + kUdpBytes + len));
        put16(ip + 4, identification);
        put16(ip + 6, 0x4000);  // DF, as every RoCEv2 packet uroce sends
        ip[8] = ttl ? ttl : 64;
        ip[9] = 17;  // UDP
        put16(ip + 10, 0);
        put32(ip + 12, flow.src_ip.v4());
        put32(ip + 16, flow.dst_ip.v4());
        put16(ip + 10, ipv4_checksum(ip));
        // No UDP checksum: IPv4 allows it, and the ICRC masks it anyway.
    }
    pcap_pkthdr hdr{};
    hdr.caplen = static_cast<bpf_u_int32>(at);
    hdr.len = static_cast<bpf_u_int32>(head + len);
    std::lock_guard lock(mutex_);
    // Under the lock: frames are in the file in the order of their timestamps.
    timespec now{};
    ::clock_gettime(CLOCK_REALTIME, &now);
    hdr.ts.tv_sec = now.tv_sec;
    hdr.ts.tv_usec = static_cast<suseconds_t>(now.tv_nsec);  // nanoseconds in such a file
    if (unflushed_since_ns_ == 0)
        unflushed_since_ns_ = std::max<int64_t>(1, TimerQueue::now_ns());  // 0 means none
    pcap_dump(reinterpret_cast<u_char*>(dumper_), &hdr, frame.data());
    ++frames_;
}

void PacketCapture::flush() {
    std::lock_guard lock(mutex_);
    pcap_dump_flush(dumper_);
    unflushed_since_ns_ = 0;
}

bool PacketCapture::flush_if_due() {
    std::lock_guard lock(mutex_);
    if (unflushed_since_ns_ == 0) return false;
    if (TimerQueue::now_ns() - unflushed_since_ns_ < kFlushAfterNanos) return true;
    pcap_dump_flush(dumper_);
    unflushed_since_ns_ = 0;
    return false;
}

}  // namespace uroce::transport
