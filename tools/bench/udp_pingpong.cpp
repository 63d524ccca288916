// uroce-udp-baseline's ping-pong modes: rtt, rtt-ack, rtt-train, rtt-wake, gso-pingpong,
// gso-pingpong-rc.
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

// ---- ping-pong: rtt, gso-pingpong ----
//
// A message of `msg` bytes travels as segments of `seg` bytes (the last one shorter), sent in
// GSO batches of up to `per_send` segments (one plain datagram when msg <= seg). Every segment
// starts with the 8-byte sequence number of its message, so that a late segment of an earlier
// message is never counted for the current one.

// gso-pingpong-rc's per-byte work (the ICRC's share of it): a segment's last 4 bytes carry the
// CRC-32 of the bytes before them.
constexpr std::size_t kCrcBytes = 4;
// Where a staged message starts: 12 bytes (a BTH) before a cache line, as uroce's staging
// area puts a train's first payload on one.
constexpr std::size_t kStageOffset = 64 - 12;

struct Messenger {
    int fd;
    std::size_t msg;
    std::size_t seg;
    std::size_t per_send;
    bool ack_first;
    bool ack_behind;  // in the message's (last) GSO train
    bool rc_work;
    Buffer out;
    Buffer in;
    Buffer ack;
    Buffer stage;      // rc_work: the message as sent, each segment signed
    Buffer delivered;  // rc_work: where arriving segments are copied out to

    Messenger(int f, std::size_t m, std::size_t s, AckDatagram a, bool work = false)
        : fd(f),
          msg(m),
          seg(std::min(s, m)),
          per_send(std::max<std::size_t>(1, std::min<std::size_t>(64, 65507 / seg))),
          ack_first(a == AckDatagram::Before),
          ack_behind(a == AckDatagram::Behind),
          rc_work(work),
          out(m + (ack_behind ? kAckBytes : 0), 'p'),
          in(65536 + 4096),
          ack(kAckBytes, 0),
          stage(work ? m + kStageOffset + kAckBytes : 0),
          delivered(work ? 65536 + 4096 : 0) {}

    // rc_work: copies each segment of `out` into the staging area and signs it there.
    const char* staged() {
        char* base = stage.data() + kStageOffset;
        for (std::size_t off = 0; off < msg; off += seg) {
            const std::size_t len = std::min(seg, msg - off);
            std::memcpy(base + off, out.data() + off, len);
            if (len <= kCrcBytes) continue;
            const std::uint32_t crc = uroce::wire::crc32(
                0, std::span(reinterpret_cast<const std::uint8_t*>(base + off), len - kCrcBytes));
            std::memcpy(base + off + len - kCrcBytes, &crc, kCrcBytes);
        }
        return base;
    }

    // One non-blocking send (as GSO segments of `gso` bytes when not 0, else of the socket's
    // UDP_SEGMENT); false if the kernel refused it for now (counts as a loss).
    bool send_now(const char* data, std::size_t len, std::uint16_t gso = 0) const {
        if (send_segments(fd, data, len, gso, MSG_DONTWAIT) >= 0) return true;
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOBUFS && errno != ECONNREFUSED &&
            errno != EINTR) {
            die("send");
        }
        return false;
    }

    // Sends message `seq` (after the ACK datagram, with ack_first); false if the kernel
    // refused a part (counts as a loss).
    bool send(std::uint64_t seq) {
        if (ack_first && !send_now(ack.data(), ack.size())) return false;
        for (std::size_t off = 0; off < msg; off += seg) {
            std::memcpy(out.data() + off, &seq, std::min(sizeof seq, msg - off));
        }
        if (ack_behind && !rc_work) {                      // rtt-train: msg == seg >= kAckBytes
            std::memset(out.data() + msg, 0, kAckBytes);   // sequence number 0: the ACK
            return send_now(out.data(), msg + kAckBytes);  // one train: UDP_SEGMENT is msg
        }
        const char* from = rc_work ? staged() : out.data();
        bool ok = true;
        for (std::size_t off = 0; off < msg; off += seg * per_send) {
            const std::size_t len = std::min(seg * per_send, msg - off);
            if (rc_work && ack_behind && off + len == msg) {
                // The last train, the ACK as its closing segment: behind full segments, or
                // behind a last one alone in its train (its size the train's segment size);
                // after a short one (which must end its train) it goes first, alone.
                const std::size_t last = msg - (msg - 1) / seg * seg;
                if (last == seg || len == last) {
                    std::memset(stage.data() + kStageOffset + msg, 0, kAckBytes);
                    if (!send_now(from + off, len + kAckBytes, static_cast<std::uint16_t>(last)))
                        ok = false;
                    continue;
                }
                if (!send_now(ack.data(), ack.size())) ok = false;
            }
            if (!send_now(from + off, len)) ok = false;
        }
        return ok;
    }

    // One non-blocking read: calls on_segment(seq, bytes) for each segment it holds. Returns
    // false when nothing was there.
    template <typename F>
    bool poll_once(F&& on_segment) {
        std::size_t gso = 0;
        const ssize_t n = recv_gro(fd, in.data(), in.size(), MSG_DONTWAIT, &gso);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ||
                errno == ECONNREFUSED) {
                return false;
            }
            die("recvmsg");
        }
        const auto total = static_cast<std::size_t>(n);
        if (gso == 0) gso = total;
        for (std::size_t off = 0; off < total; off += gso) {
            const std::size_t len = std::min(gso, total - off);
            if (len < sizeof(std::uint64_t)) continue;  // too short to carry a sequence number
            std::uint64_t seq = 0;
            std::memcpy(&seq, in.data() + off, sizeof seq);
            if (seq == 0) continue;  // an ACK datagram: no message has number 0
            if (rc_work && len > kCrcBytes) {
                const auto* bytes = reinterpret_cast<const unsigned char*>(in.data() + off);
                std::uint32_t want = 0;
                std::memcpy(&want, bytes + len - kCrcBytes, kCrcBytes);
                if (uroce::wire::crc32(0, std::span(bytes, len - kCrcBytes)) != want)
                    continue;  // as lost
                std::memcpy(delivered.data() + off, bytes, len - kCrcBytes);
            }
            on_segment(seq, len);
        }
        return true;
    }
};

// rtt-wake: each side is an application thread that spins on a word of memory and a receiver
// thread blocked in recv that stores the sequence number of each datagram into that word, as a
// provider's engine thread stores a WRITE's payload. The application threads send; only the
// receiver threads read. On a machine whose CPUs the two spinning applications keep busy, the
// receiver's wake-up is most of each half round trip: the floor of ib_write_lat for any
// provider that is not in the kernel.
class WakeSide {
  public:
    WakeSide(int fd, std::size_t size, std::atomic<bool>& stop, Clock::time_point hard_end)
        : fd_(fd), out_(size, 'w') {
        set_timeout(fd, SO_RCVTIMEO, std::chrono::milliseconds(20));
        receiver_ = std::thread([this, &stop, hard_end, size] {
            Buffer in(std::max<std::size_t>(size, 64));
            while (!stop.load(std::memory_order_relaxed) && Clock::now() < hard_end) {
                const ssize_t n = ::recv(fd_, in.data(), in.size(), 0);
                if (n < static_cast<ssize_t>(sizeof(std::uint64_t))) continue;  // timeout, runt
                std::uint64_t seq = 0;
                std::memcpy(&seq, in.data(), sizeof seq);
                if (seq > seen_.load(std::memory_order_relaxed))
                    seen_.store(seq, std::memory_order_release);
            }
        });
    }
    ~WakeSide() { receiver_.join(); }
    WakeSide(const WakeSide&) = delete;
    WakeSide& operator=(const WakeSide&) = delete;

    // Spins until a datagram numbered `seq` or later came, at most until `give_up`.
    bool wait_for(std::uint64_t seq, Clock::time_point give_up) const {
        for (std::uint64_t i = 0;; ++i) {
            if (seen_.load(std::memory_order_acquire) >= seq) return true;
            if ((i & 1023) == 0 && Clock::now() >= give_up) return false;
        }
    }
    void send(std::uint64_t seq) {
        std::memcpy(out_.data(), &seq, sizeof seq);
        if (::send(fd_, out_.data(), out_.size(), MSG_DONTWAIT) < 0 && errno != EAGAIN &&
            errno != EWOULDBLOCK && errno != ENOBUFS && errno != ECONNREFUSED && errno != EINTR) {
            die("send");
        }
    }

  private:
    const int fd_;
    Buffer out_;
    std::atomic<std::uint64_t> seen_{0};
    std::thread receiver_;
};

// Nearest-rank percentile of sorted values.
double percentile(const std::vector<double>& sorted, double q) {
    if (sorted.empty()) return 0.0;
    auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size())));
    if (rank == 0) rank = 1;
    return sorted[std::min(rank, sorted.size()) - 1];
}

}  // namespace

PingResult run_pingpong(const Options& o, std::size_t msg, std::size_t seg, AckDatagram ack,
                        bool rc_work) {
    UdpPair p = make_udp_pair(o);
    const bool use_gso = msg > seg || ack == AckDatagram::Behind;
    if (use_gso) {
        for (int fd : {p.a.get(), p.b.get()}) {
            set_int(fd, IPPROTO_UDP, UDP_SEGMENT, static_cast<int>(seg), "setsockopt UDP_SEGMENT");
            set_int(fd, IPPROTO_UDP, UDP_GRO, 1, "setsockopt UDP_GRO");
        }
    }
    const auto start = Clock::now();
    const auto hard_end = start + to_duration(o.timeout);
    // A message not back within this long is counted lost and the next one sent.
    const auto per_iter = std::chrono::milliseconds(200);
    std::atomic<bool> stop{false};

    pin_to(o.cpu_a);
    std::thread pong([&] {
        pin_to(o.cpu_b);
        Messenger m(p.b.get(), msg, seg, ack, rc_work);
        std::uint64_t cur = 0;
        std::size_t got = 0;
        while (!stop.load(std::memory_order_relaxed) && Clock::now() < hard_end) {
            std::uint64_t reply = 0;
            bool have_reply = false;
            m.poll_once([&](std::uint64_t seq, std::size_t len) {
                if (seq > cur) {
                    cur = seq;
                    got = 0;
                }
                if (seq == cur) {
                    got += len;
                    if (got >= msg) {
                        reply = cur;
                        have_reply = true;
                        got = 0;
                        ++cur;  // a duplicate of this message must not be answered twice
                    }
                }
            });
            if (have_reply) m.send(reply);
        }
    });

    PingResult r;
    r.us.reserve(o.iters);
    Messenger m(p.a.get(), msg, seg, ack, rc_work);
    const std::uint64_t total = o.warmup + o.iters;
    for (std::uint64_t i = 0; i < total; ++i) {
        const std::uint64_t seq = i + 1;  // the pong side starts at 0, waiting for 1
        const auto t0 = Clock::now();
        if (t0 >= hard_end) {
            r.complete = false;
            break;
        }
        std::size_t got = 0;
        bool done = false;
        if (m.send(seq)) {
            const auto give_up = std::min(hard_end, t0 + per_iter);
            while (!done) {
                m.poll_once([&](std::uint64_t s, std::size_t len) {
                    if (s == seq) {
                        got += len;
                        if (got >= msg) done = true;
                    }
                });
                if (!done && Clock::now() >= give_up) break;
            }
        }
        const auto t1 = Clock::now();
        if (!done) {
            ++r.lost;
            continue;
        }
        if (i >= o.warmup) {
            r.us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        }
    }
    stop.store(true);
    pong.join();
    return r;
}

PingResult run_wake_pingpong(const Options& o) {
    UdpPair p = make_udp_pair(o);
    const auto hard_end = Clock::now() + to_duration(o.timeout);
    const auto per_iter = std::chrono::milliseconds(200);
    std::atomic<bool> stop{false};
    PingResult r;
    r.us.reserve(o.iters);
    {
        WakeSide a(p.a.get(), o.size, stop, hard_end);
        WakeSide b(p.b.get(), o.size, stop, hard_end);
        pin_to(o.cpu_a);
        std::thread pong([&] {
            pin_to(o.cpu_b);
            // Answers each number once it came; a lost one is resent by the ping side's next.
            for (std::uint64_t want = 1; !stop.load(std::memory_order_relaxed); ++want) {
                while (!b.wait_for(want, std::min(hard_end, Clock::now() + per_iter))) {
                    if (stop.load(std::memory_order_relaxed) || Clock::now() >= hard_end) return;
                }
                b.send(want);
            }
        });
        const std::uint64_t total = o.warmup + o.iters;
        for (std::uint64_t i = 0; i < total; ++i) {
            const std::uint64_t seq = i + 1;
            const auto t0 = Clock::now();
            if (t0 >= hard_end) {
                r.complete = false;
                break;
            }
            a.send(seq);
            const bool done = a.wait_for(seq, std::min(hard_end, t0 + per_iter));
            const auto t1 = Clock::now();
            if (!done) {
                // The pong side waits for this number: lost, and the run cannot go on in step.
                ++r.lost;
                r.complete = false;
                break;
            }
            if (i >= o.warmup) {
                r.us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
            }
        }
        stop.store(true);
        pong.join();
    }
    return r;
}

void print_pingpong(const Options& o, PingResult r, std::size_t msg, std::size_t seg) {
    std::sort(r.us.begin(), r.us.end());
    const double p50 = percentile(r.us, 0.50);
    std::printf("mode=%s", o.mode.c_str());
    const bool rtt = is_rtt(o);
    if (rtt) {
        std::printf(" size=%zu", msg);
    } else {
        std::printf(" msg=%zu seg=%zu", msg, seg);
    }
    const char* what = rtt ? "rtt" : "iter";
    std::printf(" iters=%zu lost=%llu complete=%d %s_min_us=%.2f %s_p50_us=%.2f %s_p99_us=%.2f",
                r.us.size(), static_cast<unsigned long long>(r.lost), r.complete ? 1 : 0, what,
                r.us.empty() ? 0.0 : r.us.front(), what, p50, what, percentile(r.us, 0.99));
    std::printf(" %s_p999_us=%.2f", what, percentile(r.us, 0.999));
    // The mean, as ibv_rc_pingpong reports its time per iteration: outliers count in full.
    double sum = 0;
    for (double v : r.us) sum += v;
    std::printf(" %s_mean_us=%.2f", what,
                r.us.empty() ? 0.0 : sum / static_cast<double>(r.us.size()));
    if (rtt) std::printf(" half_rtt_p50_us=%.3f", p50 / 2);
    std::printf("\n");
}

}  // namespace uroce::bench
