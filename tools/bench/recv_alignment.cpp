// uroce-recv-alignment: how fast the kernel copies a received GSO train into user memory,
// against where in a page the destination starts.
//
// The engine's receive buffers start on a page (transport/page_aligned_buffer.h) because, on
// the AMD CPUs this project is benchmarked on, the copy under recvmmsg ran about 7 times
// slower for some offsets of the destination against the source. This program shows whether
// a machine has that trait: one thread sends trains of --count segments of --seg bytes over
// loopback (UDP_SEGMENT), the other reads each one with recvmmsg (UDP_GRO) into a buffer
// --step, 2 x --step, ... bytes into a page, and times the call. --shift N sends an N-byte
// datagram to a third socket before each train, which moves where the kernel puts the train's
// bytes (as uroce's ACKs and small packets do between its trains).
//
// Prints one `offset=K ...` line per offset, then `slowest_over_fastest=R`. Every wait is
// bounded by --timeout: a train that does not come within 200 ms, or comes cut, counts in
// `missed`. A tool, not a test: nothing runs it in `meson test`.

#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kUsage =
    "usage: uroce-recv-alignment [options]\n"
    "  --seg N       segment size (default 4112 = 4096 + BTH 12 + ICRC 4)\n"
    "  --count N     segments per train, N x seg <= 65507 (default 15)\n"
    "  --iters N     trains timed per offset (default 500)\n"
    "  --step N      offsets tried: 0, N, 2N, ... below 64 (default 4)\n"
    "  --shift N     bytes of a datagram sent elsewhere before each train (default 12; 0: none)\n"
    "  --timeout S   bound on the whole run (default 30)\n";

struct Options {
    size_t seg = 4112;
    size_t count = 15;
    size_t iters = 500;
    size_t step = 4;
    size_t shift = 12;
    double timeout = 30;
};

[[noreturn]] void fail(const std::string& why) {
    std::fprintf(stderr, "uroce-recv-alignment: %s\n", why.c_str());
    std::exit(2);
}

size_t number(const char* opt, const char* v, size_t lo, size_t hi) {
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v, &end, 10);
    if (!*v || *end || n < lo || n > hi)
        fail(std::string(opt) + ": want " + std::to_string(lo) + ".." + std::to_string(hi));
    return static_cast<size_t>(n);
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--help") {
            std::fputs(kUsage, stdout);
            std::exit(0);
        }
        if (i + 1 >= argc) fail(a + ": missing value (--help)");
        const char* v = argv[++i];
        if (a == "--seg") {
            o.seg = number("--seg", v, 64, 9000);
        } else if (a == "--count") {
            o.count = number("--count", v, 1, 64);
        } else if (a == "--iters") {
            o.iters = number("--iters", v, 1, 1000000);
        } else if (a == "--step") {
            o.step = number("--step", v, 1, 64);
        } else if (a == "--shift") {
            o.shift = number("--shift", v, 0, 1400);
        } else if (a == "--timeout") {
            o.timeout = static_cast<double>(number("--timeout", v, 1, 3600));
        } else {
            fail("unknown option " + a + " (--help)");
        }
    }
    if (o.seg * o.count > 65507) fail("--seg x --count must be <= 65507");
    return o;
}

// A UDP socket on 127.0.0.1, an ephemeral port; its port in `port`.
int loopback_socket(uint16_t& port) {
    const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) fail(std::string("socket: ") + std::strerror(errno));
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), len) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0)
        fail(std::string("bind: ") + std::strerror(errno));
    port = ntohs(sa.sin_port);
    return fd;
}

sockaddr_in loopback(uint16_t port) {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons(port);
    return sa;
}

struct Timing {
    std::vector<double> us;
    size_t missed = 0;
};

}  // namespace

int main(int argc, char** argv) {
    const Options o = parse(argc, argv);
    uint16_t rx_port = 0, sink_port = 0, tx_port = 0;
    const int rx = loopback_socket(rx_port);
    const int sink = loopback_socket(sink_port);  // takes the --shift datagrams, never read
    const int tx = loopback_socket(tx_port);
    const int one = 1, seg = static_cast<int>(o.seg);
    if (::setsockopt(rx, IPPROTO_UDP, UDP_GRO, &one, sizeof one) != 0 ||
        ::setsockopt(tx, IPPROTO_UDP, UDP_SEGMENT, &seg, sizeof seg) != 0)
        fail(std::string("UDP_GRO / UDP_SEGMENT: ") + std::strerror(errno));
    const sockaddr_in rx_addr = loopback(rx_port), sink_addr = loopback(sink_port);
    const size_t train = o.seg * o.count;

    // Destinations: one page-aligned area with room for a train at every offset.
    constexpr size_t kPage = 4096;
    auto* area = static_cast<uint8_t*>(::operator new (2 * 65536 + kPage, std::align_val_t{kPage}));
    std::vector<uint8_t> out(train, 0x5a), small(std::max<size_t>(o.shift, 1), 0x11);

    const auto end = Clock::now() + std::chrono::duration<double>(o.timeout);
    std::atomic<uint64_t> sent{0}, taken{0};
    std::atomic<bool> stop{false};
    std::vector<size_t> offsets;
    for (size_t off = 0; off < 64; off += o.step) offsets.push_back(off);
    const uint64_t total = offsets.size() * o.iters;

    std::thread sender([&] {
        for (uint64_t i = 0; i < total && !stop.load(); ++i) {
            while (taken.load() < i && !stop.load() && Clock::now() < end) {
            }
            if (o.shift > 0)
                ::sendto(tx, small.data(), o.shift, MSG_DONTWAIT,
                         reinterpret_cast<const sockaddr*>(&sink_addr), sizeof sink_addr);
            ::sendto(tx, out.data(), train, MSG_DONTWAIT,
                     reinterpret_cast<const sockaddr*>(&rx_addr), sizeof rx_addr);
            sent.store(i + 1);
        }
    });

    std::vector<Timing> timings(offsets.size());
    uint64_t i = 0;
    for (size_t k = 0; k < offsets.size(); ++k) {
        uint8_t* dst = area + offsets[k];
        for (size_t n = 0; n < o.iters; ++n, ++i) {
            bool got = false;
            auto give_up = Clock::time_point::max();  // set once the train is on its way
            while (!got && Clock::now() < end) {
                iovec iov{dst, 65536};
                mmsghdr m{};
                m.msg_hdr.msg_iov = &iov;
                m.msg_hdr.msg_iovlen = 1;
                alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
                m.msg_hdr.msg_control = control;
                m.msg_hdr.msg_controllen = sizeof control;
                const auto t0 = Clock::now();
                const int r = ::recvmmsg(rx, &m, 1, MSG_DONTWAIT, nullptr);
                const auto t1 = Clock::now();
                if (r != 1) {
                    if (sent.load() > i) {
                        if (give_up == Clock::time_point::max())
                            give_up = t1 + std::chrono::milliseconds(200);
                        else if (t1 > give_up)
                            break;  // never came: dropped by the kernel
                    }
                    continue;
                }
                got = true;
                if (m.msg_len == train)
                    timings[k].us.push_back(
                        std::chrono::duration<double, std::micro>(t1 - t0).count());
                else
                    ++timings[k].missed;
            }
            if (!got) ++timings[k].missed;
            taken.store(i + 1);
        }
    }
    stop.store(true);
    sender.join();
    ::operator delete (area, std::align_val_t{kPage});
    for (int fd : {rx, sink, tx}) ::close(fd);

    double fastest = 0, slowest = 0;
    for (size_t k = 0; k < offsets.size(); ++k) {
        auto& us = timings[k].us;
        std::sort(us.begin(), us.end());
        const double p50 = us.empty() ? 0 : us[us.size() / 2];
        std::printf("offset=%zu trains=%zu missed=%zu min_us=%.2f p50_us=%.2f gbps_p50=%.2f\n",
                    offsets[k], us.size(), timings[k].missed, us.empty() ? 0 : us.front(), p50,
                    p50 > 0 ? static_cast<double>(train) / p50 / 1e3 : 0);
        if (p50 > 0) {
            fastest = fastest == 0 ? p50 : std::min(fastest, p50);
            slowest = std::max(slowest, p50);
        }
    }
    std::printf("bytes_per_train=%zu shift=%zu slowest_over_fastest=%.2f\n", train, o.shift,
                fastest > 0 ? slowest / fastest : 0);
    return Clock::now() < end ? 0 : 1;
}
