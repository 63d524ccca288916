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

// g++ 12 at -O2 reports a false "potential null pointer dereference" in libstdc++'s
// std::string as inlined into CLI11, as in tools/uroce_main.cpp: silenced for this file.
#pragma GCC diagnostic ignored "-Wnull-dereference"

#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

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
    std::exit(1);
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
    Options o;
    CLI::App app{
        "uroce-recv-alignment: times recvmmsg of a loopback GSO train against the "
        "destination's offset in a page"};
    app.add_option("--seg", o.seg, "Segment size (4096 + BTH 12 + ICRC 4)")
        ->check(CLI::Range(64, 9000))
        ->capture_default_str();
    app.add_option("--count", o.count, "Segments per train; --seg x --count <= 65507")
        ->check(CLI::Range(1, 64))
        ->capture_default_str();
    app.add_option("--iters", o.iters, "Trains timed per offset")
        ->check(CLI::Range(1, 1000000))
        ->capture_default_str();
    app.add_option("--step", o.step, "Offsets tried: 0, N, 2N, ... below 64")
        ->check(CLI::Range(1, 64))
        ->capture_default_str();
    app.add_option("--shift", o.shift,
                   "Bytes of a datagram sent elsewhere before each train (0: none)")
        ->check(CLI::Range(0, 1400))
        ->capture_default_str();
    app.add_option("--timeout", o.timeout, "Seconds: bound on the whole run")
        ->check(CLI::Range(1.0, 3600.0))
        ->capture_default_str();
    CLI11_PARSE(app, argc, argv);
    if (o.seg * o.count > 65507) {
        std::fprintf(stderr, "uroce-recv-alignment: --seg x --count must be <= 65507\n");
        return 2;
    }
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
