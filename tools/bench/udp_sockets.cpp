// The sockets and clocks every uroce-udp-baseline mode shares (udp_baseline.h).
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

// A socket created in network namespace `netns` (empty: the current one). A socket stays in
// the namespace it was created in, so the threads that use it need not enter it.
Fd socket_in(const std::string& netns, int type) {
    if (netns.empty()) {
        Fd s(::socket(AF_INET, type | SOCK_CLOEXEC, 0));
        if (s.get() < 0) die("socket");
        return s;
    }
    const std::string path = netns.find('/') == std::string::npos ? "/run/netns/" + netns : netns;
    Fd self(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
    if (self.get() < 0) die("open /proc/thread-self/ns/net");
    Fd target(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (target.get() < 0) {
        std::fprintf(stderr, "uroce-udp-baseline: open %s: %s\n", path.c_str(),
                     std::strerror(errno));
        std::exit(1);
    }
    if (::setns(target.get(), CLONE_NEWNET) != 0) die("setns (enter the namespace)");
    Fd s(::socket(AF_INET, type | SOCK_CLOEXEC, 0));
    const int saved = errno;
    if (::setns(self.get(), CLONE_NEWNET) != 0) die("setns (back to the own namespace)");
    errno = saved;
    if (s.get() < 0) die("socket");
    return s;
}

sockaddr_in make_addr(const std::string& ip, std::uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    if (inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1) usage_error("bad address " + ip);
    return a;
}

void bind_to(int fd, sockaddr_in addr) {
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        std::fprintf(stderr, "uroce-udp-baseline: bind %s: %s\n", inet_ntoa(addr.sin_addr),
                     std::strerror(errno));
        std::exit(1);
    }
}

sockaddr_in local_addr(int fd) {
    sockaddr_in a{};
    socklen_t len = sizeof a;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) die("getsockname");
    return a;
}

void connect_to(int fd, sockaddr_in addr) {
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) die("connect");
}

void set_int(int fd, int level, int name, int value, const char* what) {
    if (::setsockopt(fd, level, name, &value, sizeof value) != 0) die(what);
}

void set_timeout(int fd, int name, std::chrono::microseconds t) {
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(t.count() / 1000000);
    tv.tv_usec = static_cast<suseconds_t>(t.count() % 1000000);
    if (::setsockopt(fd, SOL_SOCKET, name, &tv, sizeof tv) != 0) die("setsockopt timeout");
}

// Pins the calling thread to `cpu` (-1: leaves it alone).
void pin_to(int cpu) {
    if (cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (::sched_setaffinity(0, sizeof set, &set) != 0) die("sched_setaffinity");
}

double cpu_seconds() {
    rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    const auto tv = [](const timeval& t) {
        return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
    };
    return tv(ru.ru_utime) + tv(ru.ru_stime);
}

double seconds_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}

std::chrono::nanoseconds to_duration(double s) {
    return std::chrono::nanoseconds(static_cast<std::int64_t>(s * 1e9));
}

// One recvmsg with a UDP_GRO control message: returns the byte count (or -1 with errno) and
// sets *seg_size to the size of the coalesced segments (the whole read when not coalesced).
ssize_t recv_gro(int fd, void* buf, std::size_t len, int flags, std::size_t* seg_size) {
    iovec iov{buf, len};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(fd, &msg, flags);
    if (n < 0) return n;
    *seg_size = static_cast<std::size_t>(n);
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == IPPROTO_UDP && c->cmsg_type == UDP_GRO) {
            int gso = 0;
            std::memcpy(&gso, CMSG_DATA(c), sizeof gso);
            if (gso > 0) *seg_size = static_cast<std::size_t>(gso);
        }
    }
    return n;
}

// One send of `len` bytes cut into GSO segments of `gso` bytes, given for this call (0: the
// socket's UDP_SEGMENT, if any).
ssize_t send_segments(int fd, const char* data, std::size_t len, std::uint16_t gso, int flags) {
    iovec iov{const_cast<char*>(data), len};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(std::uint16_t))] = {};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    if (gso != 0) {
        m.msg_control = control;
        m.msg_controllen = sizeof control;
        cmsghdr* c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_UDP;
        c->cmsg_type = UDP_SEGMENT;
        c->cmsg_len = CMSG_LEN(sizeof gso);
        std::memcpy(CMSG_DATA(c), &gso, sizeof gso);
    }
    return ::sendmsg(fd, &m, flags);
}

UdpPair make_udp_pair(const Options& o) {
    UdpPair p{socket_in(o.netns_a, SOCK_DGRAM), socket_in(o.netns_b, SOCK_DGRAM)};
    for (int fd : {p.a.get(), p.b.get()}) {
        set_int(fd, SOL_SOCKET, SO_SNDBUF, o.buf, "setsockopt SO_SNDBUF");
        set_int(fd, SOL_SOCKET, SO_RCVBUF, o.buf, "setsockopt SO_RCVBUF");
    }
    bind_to(p.b.get(), make_addr(o.addr_b, 0));
    bind_to(p.a.get(), make_addr(o.addr_a, 0));
    sockaddr_in a = local_addr(p.a.get());
    sockaddr_in b = local_addr(p.b.get());
    a.sin_addr = make_addr(o.addr_a, 0).sin_addr;
    b.sin_addr = make_addr(o.addr_b, 0).sin_addr;
    connect_to(p.a.get(), b);
    connect_to(p.b.get(), a);
    return p;
}

}  // namespace uroce::bench
