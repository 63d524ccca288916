// rc_verify's out-of-band exchange: text lines over one TCP connection (rc_verify.h).
#include <infiniband/verbs.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "rc_verify.h"

namespace rc_verify {

LineChannel::~LineChannel() {
    if (fd_ >= 0) ::close(fd_);
}

bool LineChannel::send_line(const std::string& s) {
    std::string line = s + "\n";
    size_t off = 0;
    while (off < line.size()) {
        ssize_t n = ::send(fd_, line.data() + off, line.size() - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        off += static_cast<size_t>(n);
    }
    return true;
}

int LineChannel::recv_line(std::string& out, int timeout_ms) {
    for (;;) {
        size_t nl = buf_.find('\n');
        if (nl != std::string::npos) {
            out = buf_.substr(0, nl);
            buf_.erase(0, nl + 1);
            return 1;
        }
        if (buf_.size() > 4096) return -1;
        pollfd pfd{fd_, POLLIN, 0};
        int r = ::poll(&pfd, 1, timeout_ms);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) return 0;
        char tmp[512];
        ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        buf_.append(tmp, static_cast<size_t>(n));
    }
}

bool LineChannel::recv_line_within(std::string& out, double seconds) {
    auto start = Clock::now();
    for (;;) {
        double left = seconds - seconds_since(start);
        if (left <= 0) return false;
        int r = recv_line(out, static_cast<int>(std::min(left, 1.0) * 1000) + 1);
        if (r == 1) return true;
        if (r < 0) return false;
    }
}

int tcp_listen_accept(int port, double wait_s) {
    int ls = ::socket(AF_INET, SOCK_STREAM, 0);
    if (ls < 0) die(kExitUsage, "socket: %s", std::strerror(errno));
    int one = 1;
    ::setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
        die(kExitUsage, "bind TCP port %d: %s", port, std::strerror(errno));
    if (::listen(ls, 1) != 0) die(kExitUsage, "listen: %s", std::strerror(errno));
    logf("waiting for the client on TCP port %d (up to %.0f s)", port, wait_s);
    pollfd pfd{ls, POLLIN, 0};
    int r = ::poll(&pfd, 1, static_cast<int>(wait_s * 1000));
    if (r <= 0) die(kExitIncomplete, "no client within %.0f s", wait_s);
    int s = ::accept(ls, nullptr, nullptr);
    if (s < 0) die(kExitUsage, "accept: %s", std::strerror(errno));
    ::close(ls);
    ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return s;
}

int tcp_connect(const std::string& host, int port, double wait_s) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    std::string service = std::to_string(port);
    int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
    if (rc != 0) die(kExitUsage, "%s: %s", host.c_str(), gai_strerror(rc));
    auto start = Clock::now();
    int last_errno = 0;
    for (;;) {
        int s = ::socket(AF_INET, SOCK_STREAM, 0);
        if (s < 0) die(kExitUsage, "socket: %s", std::strerror(errno));
        if (::connect(s, res->ai_addr, res->ai_addrlen) == 0) {
            ::freeaddrinfo(res);
            int one = 1;
            ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            return s;
        }
        last_errno = errno;
        ::close(s);
        if (seconds_since(start) > wait_s) break;
        ::usleep(250 * 1000);
    }
    ::freeaddrinfo(res);
    die(kExitIncomplete, "cannot connect to %s:%d within %.0f s: %s", host.c_str(), port, wait_s,
        std::strerror(last_errno));
}

std::string format_peer(const PeerInfo& p) {
    char gid[33];
    for (int i = 0; i < 16; ++i) std::snprintf(gid + 2 * i, 3, "%02x", p.gid.raw[i]);
    char line[256];
    std::snprintf(line, sizeof line, "RCV1 %u %u %s %u %" PRIu64 " %" PRIu64 " %d", p.qpn, p.psn,
                  gid, p.rkey, p.addr, p.len, p.rd_atomic);
    return line;
}

bool parse_peer(const std::string& line, PeerInfo& p) {
    char gid[64] = {};
    unsigned long long addr = 0, len = 0;
    unsigned qpn = 0, psn = 0, rkey = 0;
    int rd = 0;
    if (std::sscanf(line.c_str(), "RCV1 %u %u %40s %u %llu %llu %d", &qpn, &psn, gid, &rkey, &addr,
                    &len, &rd) != 7)
        return false;
    if (std::strlen(gid) != 32) return false;
    for (int i = 0; i < 16; ++i) {
        unsigned v = 0;
        if (std::sscanf(gid + 2 * i, "%2x", &v) != 1) return false;
        p.gid.raw[i] = static_cast<uint8_t>(v);
    }
    p.qpn = qpn;
    p.psn = psn & 0xffffff;
    p.rkey = rkey;
    p.addr = addr;
    p.len = len;
    p.rd_atomic = rd;
    return true;
}

}  // namespace rc_verify
