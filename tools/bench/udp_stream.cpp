// uroce-udp-baseline's throughput modes: gso, gso-rc, gso-write, gso-write-rc, sendto, pps.
#include "udp_baseline.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "roce_stream_work.h"
#include "uroce/crc32.h"

namespace uroce::bench {
namespace {

// gso-rc stages this many messages back to back before it sends their packets, in trains
// that run across messages as uroce's SEND trains do.
constexpr std::size_t kRcBatchMessages = 15;

// Sends `len` bytes as trains of up to `train` bytes (GSO segments of the socket's
// UDP_SEGMENT); returns the bytes sent, or -1 (errno set) at the first send that failed.
ssize_t send_trains(int fd, const char* data, std::size_t len, std::size_t train) {
    std::size_t total = 0;
    while (total < len) {
        const ssize_t sent = ::send(fd, data + total, std::min(train, len - total), 0);
        if (sent < 0) return -1;
        total += static_cast<std::size_t>(sent);
    }
    return static_cast<ssize_t>(total);
}

// gso-write: sends one message's datagrams as uroce sends an RDMA WRITE of --msg bytes with a
// path MTU of --seg - 16 (BTH and ICRC): a first train of two segments whose first one is 16
// bytes larger (the RETH; GSO lets only the last segment differ, and only by being shorter),
// then trains of --seg segments for the rest. Returns the bytes sent, or -1 (errno set) at the
// first send that failed.
// The packets of one gso-write message: --msg bytes in payloads of --seg - 16, at least two.
std::size_t write_packets(const Options& o) {
    const std::size_t payload = o.seg - 16;
    return std::max<std::size_t>(2, (o.msg + payload - 1) / payload);
}

// `data`: the message's `staged` bytes, its packets back to back (gso-write-rc), or, with
// `staged` 0, any bytes, every train sent from their start (gso-write).
ssize_t send_write_pattern(int fd, const char* data, std::size_t staged, const Options& o) {
    const std::size_t packets = write_packets(o);
    const std::size_t per_train =
        std::max<std::size_t>(1, std::min<std::size_t>(64, 65507 / o.seg));
    // The first train, its segment size given per call (the socket's UDP_SEGMENT is --seg).
    ssize_t total =
        send_segments(fd, data, 2 * o.seg + 16, static_cast<std::uint16_t>(o.seg + 16), 0);
    if (total < 0) return -1;
    for (std::size_t left = packets - 2; left > 0;) {
        const std::size_t n = std::min(left, per_train);
        const char* from = staged != 0 ? data + total : data;
        // The message's last packet may be shorter: it ends the last train.
        const std::size_t len =
            staged != 0 && n == left ? staged - static_cast<std::size_t>(total) : n * o.seg;
        const ssize_t sent = ::send(fd, from, len, 0);
        if (sent < 0) return -1;
        total += sent;
        left -= n;
    }
    return total;
}

}  // namespace

Tput run_udp_tput(const Options& o, Stream stream) {
    UdpPair p = make_udp_pair(o);
    const bool gso = stream != Stream::Plain;
    std::size_t send_len = o.size;
    std::uint64_t dgrams_per_send = 1;
    const bool write_trains = stream == Stream::GsoWrite || stream == Stream::GsoWriteRc;
    if (write_trains) {
        dgrams_per_send = write_packets(o);
        send_len = 65536 + 4096;  // the buffer every train is cut from
        set_int(p.a.get(), IPPROTO_UDP, UDP_SEGMENT, static_cast<int>(o.seg),
                "setsockopt UDP_SEGMENT");
        set_int(p.b.get(), IPPROTO_UDP, UDP_GRO, 1, "setsockopt UDP_GRO");
    } else if (gso) {
        // Up to 64 segments (the kernel's UDP_MAX_SEGMENTS) in one IPv4 datagram's 65507 bytes.
        dgrams_per_send = std::min<std::uint64_t>(64, 65507 / o.seg);
        if (dgrams_per_send == 0) usage_error("--seg too large");
        send_len = o.seg * dgrams_per_send;
        set_int(p.a.get(), IPPROTO_UDP, UDP_SEGMENT, static_cast<int>(o.seg),
                "setsockopt UDP_SEGMENT");
        set_int(p.b.get(), IPPROTO_UDP, UDP_GRO, 1, "setsockopt UDP_GRO");
    }
    set_timeout(p.a.get(), SO_SNDTIMEO, std::chrono::milliseconds(200));
    set_timeout(p.b.get(), SO_RCVTIMEO, std::chrono::milliseconds(100));
    const sockaddr_in dest = [&] {
        sockaddr_in d = local_addr(p.b.get());
        d.sin_addr = make_addr(o.addr_b, 0).sin_addr;
        return d;
    }();

    Tput t;
    const bool rc_work = stream == Stream::GsoWriteRc || stream == Stream::GsoRc;
    // A WRITE's first packet carries its RETH; a SEND's packets are all alike.
    const std::size_t first_extra =
        stream == Stream::GsoWriteRc ? uroce::bench::RoceStreamWork::kRethBytes : 0;
    std::atomic<bool> sender_done{false};
    const StreamClock clock(o);
    const auto send_end = clock.send_end;
    const auto hard_end = clock.hard_end;

    pin_to(o.cpu_a);
    std::thread receiver([&] {
        pin_to(o.cpu_b);
        Buffer buf(65536 + 4096);
        std::optional<uroce::bench::RoceStreamWork> work;
        if (rc_work) work.emplace(o.msg, o.seg, first_extra);
        Clock::time_point first{}, last{};
        while (Clock::now() < hard_end) {
            std::size_t seg = 0;
            const ssize_t n = recv_gro(p.b.get(), buf.data(), buf.size(), 0, &seg);
            if (n < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ||
                    errno == ECONNREFUSED) {
                    if (sender_done.load()) break;  // sender finished and 100 ms of silence
                    continue;
                }
                die("recvmsg");
            }
            last = Clock::now();
            if (t.rx_dgrams == 0) first = last;
            const auto len = static_cast<std::size_t>(n);
            if (seg == 0) seg = std::max<std::size_t>(len, 1);
            if (!work) {
                t.rx_bytes += len;
                t.rx_dgrams += (len + seg - 1) / seg;
                continue;
            }
            // Each packet checked and copied out; only delivered payload counts.
            for (std::size_t off = 0; off < len; off += seg) {
                const auto* bytes = reinterpret_cast<const std::uint8_t*>(buf.data()) + off;
                const std::size_t plen = std::min(seg, len - off);
                if (const auto delivered = work->take(std::span(bytes, plen))) {
                    ++t.rx_dgrams;
                    t.rx_bytes += *delivered;
                } else {
                    ++t.rx_bad;
                }
            }
        }
        t.rx_window_s = seconds_between(first, last);
    });

    Buffer buf(send_len, 'x');
    std::optional<uroce::bench::RoceStreamWork> work;
    if (rc_work) work.emplace(o.msg, o.seg, first_extra);
    Buffer app(rc_work ? o.msg : 0, 'w');  // the application's message, staged for every send
    const auto app_bytes = std::span(reinterpret_cast<const std::uint8_t*>(app.data()), app.size());
    // gso-rc: kRcBatchMessages staged messages, their packets back to back.
    Buffer batch(stream == Stream::GsoRc ? kRcBatchMessages * work->wire_bytes() : 0);
    if (stream == Stream::GsoRc) dgrams_per_send = kRcBatchMessages * work->packets();
    while (Clock::now() < send_end) {
        ssize_t n = 0;
        if (stream == Stream::GsoRc) {
            auto* out = reinterpret_cast<std::uint8_t*>(batch.data());
            for (std::size_t k = 0; k < kRcBatchMessages; ++k)
                work->stage_into(app_bytes, out + k * work->wire_bytes());
            n = send_trains(p.a.get(), batch.data(), batch.size(), send_len);
        } else if (work) {
            const auto staged = work->stage(app_bytes);
            n = send_write_pattern(p.a.get(), reinterpret_cast<const char*>(staged.data()),
                                   staged.size(), o);
        } else if (write_trains) {
            n = send_write_pattern(p.a.get(), buf.data(), 0, o);
        } else {
            n = gso ? ::send(p.a.get(), buf.data(), buf.size(), 0)
                    : ::sendto(p.a.get(), buf.data(), buf.size(), 0,
                               reinterpret_cast<const sockaddr*>(&dest), sizeof dest);
        }
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS || errno == EINTR ||
                errno == ECONNREFUSED) {
                ++t.send_errors;
                continue;
            }
            die("send");
        }
        t.sent_bytes += static_cast<std::uint64_t>(n);
        t.sent_dgrams += dgrams_per_send;
    }
    sender_done.store(true);
    receiver.join();
    t.cpu_s = cpu_seconds() - clock.cpu0;
    return t;
}

void print_tput(const Options& o, const Tput& t, Stream stream) {
    const double window = t.rx_window_s > 0 ? t.rx_window_s : o.seconds;
    const double goodput = static_cast<double>(t.rx_bytes) / window;
    const double dps = static_cast<double>(t.rx_dgrams) / window;
    const double loss = t.sent_dgrams == 0
                            ? 0.0
                            : 100.0 *
                                  (static_cast<double>(t.sent_dgrams) -
                                   static_cast<double>(std::min(t.rx_dgrams, t.sent_dgrams))) /
                                  static_cast<double>(t.sent_dgrams);
    const double gb = static_cast<double>(t.rx_bytes) / 1e9;
    std::printf("mode=%s", o.mode.c_str());
    if (stream == Stream::GsoWrite || stream == Stream::GsoWriteRc || stream == Stream::GsoRc) {
        std::printf(" seg=%zu msg=%zu", o.seg, o.msg);
    } else if (stream == Stream::Gso) {
        std::printf(" seg=%zu segs_per_send=%zu", o.seg, std::min<std::size_t>(64, 65507 / o.seg));
    } else {
        std::printf(" size=%zu", o.size);
    }
    std::printf(
        " seconds=%.3f sent_dgrams=%llu sent_bytes=%llu send_errors=%llu rx_dgrams=%llu "
        "rx_bytes=%llu rx_window_s=%.4f goodput_Bps=%.0f rx_dgrams_per_s=%.0f loss_pct=%.3f "
        "cpu_s=%.3f cpu_s_per_gb=%.4f rx_bad=%llu\n",
        o.seconds, static_cast<unsigned long long>(t.sent_dgrams),
        static_cast<unsigned long long>(t.sent_bytes),
        static_cast<unsigned long long>(t.send_errors),
        static_cast<unsigned long long>(t.rx_dgrams), static_cast<unsigned long long>(t.rx_bytes),
        window, goodput, dps, loss, t.cpu_s, gb > 0 ? t.cpu_s / gb : 0.0,
        static_cast<unsigned long long>(t.rx_bad));
}

}  // namespace uroce::bench
