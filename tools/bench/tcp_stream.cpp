// uroce-udp-baseline's tcp mode: one TCP stream, for comparison.
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

namespace uroce::bench {

void run_tcp(const Options& o) {
    Fd listener = socket_in(o.netns_b, SOCK_STREAM);
    set_int(listener.get(), SOL_SOCKET, SO_REUSEADDR, 1, "setsockopt SO_REUSEADDR");
    bind_to(listener.get(), make_addr(o.addr_b, 0));
    if (::listen(listener.get(), 1) != 0) die("listen");
    sockaddr_in dest = local_addr(listener.get());
    dest.sin_addr = make_addr(o.addr_b, 0).sin_addr;

    Fd client = socket_in(o.netns_a, SOCK_STREAM);
    bind_to(client.get(), make_addr(o.addr_a, 0));
    set_timeout(client.get(), SO_SNDTIMEO, std::chrono::milliseconds(200));
    connect_to(client.get(), dest);
    pollfd pfd{listener.get(), POLLIN, 0};
    if (::poll(&pfd, 1, 2000) != 1) {
        std::fprintf(stderr, "uroce-udp-baseline: tcp: no connection to accept\n");
        std::exit(1);
    }
    Fd server(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (server.get() < 0) die("accept");
    set_timeout(server.get(), SO_RCVTIMEO, std::chrono::milliseconds(200));

    std::uint64_t sent = 0, rx = 0;
    double window = 0;
    std::atomic<bool> sender_done{false};
    const StreamClock clock(o);
    const auto send_end = clock.send_end;
    const auto hard_end = clock.hard_end;

    pin_to(o.cpu_a);
    std::thread receiver([&] {
        pin_to(o.cpu_b);
        Buffer buf(256 * 1024);
        Clock::time_point first{}, last{};
        while (Clock::now() < hard_end) {
            const ssize_t n = ::recv(server.get(), buf.data(), buf.size(), 0);
            if (n == 0) break;  // EOF: the sender is done
            if (n < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
                    if (sender_done.load()) break;
                    continue;
                }
                die("recv");
            }
            last = Clock::now();
            if (rx == 0) first = last;
            rx += static_cast<std::uint64_t>(n);
        }
        window = seconds_between(first, last);
    });

    Buffer buf(o.write, 't');
    while (Clock::now() < send_end) {
        const ssize_t n = ::send(client.get(), buf.data(), buf.size(), MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
            die("send");
        }
        sent += static_cast<std::uint64_t>(n);
    }
    ::shutdown(client.get(), SHUT_WR);
    sender_done.store(true);
    receiver.join();
    const double cpu = cpu_seconds() - clock.cpu0;
    if (window <= 0) window = o.seconds;
    const double gb = static_cast<double>(rx) / 1e9;
    std::printf(
        "mode=tcp write=%zu seconds=%.3f sent_bytes=%llu rx_bytes=%llu rx_window_s=%.4f "
        "goodput_Bps=%.0f cpu_s=%.3f cpu_s_per_gb=%.4f\n",
        o.write, o.seconds, static_cast<unsigned long long>(sent),
        static_cast<unsigned long long>(rx), window, static_cast<double>(rx) / window, cpu,
        gb > 0 ? cpu / gb : 0.0);
}

}  // namespace uroce::bench
