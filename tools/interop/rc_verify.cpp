// rc_verify: checks that RDMA READs between two RC peers never complete successfully with
// wrong data. A development tool for interop runs against other RoCE implementations (the
// Linux kernel's rxe in particular); see README.md beside this file. Not run by the tests.
//
// Two roles over one RC QP each:
//   server (no address given): registers a region of DEPTH x SIZE bytes with guard bytes on
//     both sides (inside the registered memory, outside the advertised range), hands out its
//     address and rkey, and is otherwise passive: it answers WRITEs and READs, watches its
//     async events, and at the end checks its guards and reports its QP state.
//   client (server address given): N iterations of "RDMA WRITE SIZE fresh pseudo-random bytes
//     into the server's region, then RDMA READ them back into a buffer pre-filled with a
//     canary pattern"; every byte of every successful READ is compared with what was written,
//     the guards around every READ buffer are checked, and the completions are counted by
//     status. A READ that completes with IBV_WC_SUCCESS but wrong data is the failure this
//     tool exists to catch.
//
// Out of band (TCP, text lines): both sides send
//   "RCV1 <qpn> <psn> <gid:32 hex> <rkey> <addr> <len> <max_dest_rd_atomic>\n"
// then "READY\n" once their QP is in RTS. During the run the client sends "P <pairs>\n"
// about once a second (the server's proof of life), then "DONE <summary>\n"; the server
// answers "SERVER <summary>\n". Every wait is bounded: --stall seconds without a completion
// (client) or a message (server), --oob-wait seconds to connect.
//
// Exit status: 0 every pair completed with SUCCESS and correct data and all guards held;
// 1 a READ completed SUCCESS with wrong data, or a guard byte changed; 3 the run did not
// complete (error completions, a stall, a peer that went away) but no wrong data was seen;
// 2 usage or setup error.
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

#include "uroce/path_mtu.h"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitWrongData = 1;
constexpr int kExitUsage = 2;
constexpr int kExitIncomplete = 3;

constexpr uint8_t kGuardByte = 0x6b;
constexpr int kMaxRdAtomic = 16;
constexpr int kMaxReportedProblems = 10;

using Clock = std::chrono::steady_clock;

struct Options {
    std::string device;
    std::string server;  // empty: server role
    int gid_index = 0;
    int ib_port = 1;
    size_t size = 64;
    uint64_t iters = 1000;
    unsigned depth = 1;
    int tcp_port = 18600;
    int mtu = 1024;
    int timeout = 14;
    int retry = 7;
    int rnr_retry = 7;
    double stall_s = 30;
    double oob_wait_s = 300;
    uint64_t seed = 1;
    long long psn = -1;
    size_t guard = 64;
    bool busy_poll = false;
    bool verbose = false;
    uint64_t self_test = 0;  // every Nth successful READ is spoiled before the check
};

const char* g_role = "rc_verify";

void logf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void logf(const char* fmt, ...) {
    std::fprintf(stdout, "%s: ", g_role);
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(stdout, fmt, ap);
    va_end(ap);
    std::fputc('\n', stdout);
    std::fflush(stdout);
}

[[noreturn]] void die(int code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
[[noreturn]] void die(int code, const char* fmt, ...) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: error: ", g_role);
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(stderr, fmt, ap);
    va_end(ap);
    std::fputc('\n', stderr);
    std::exit(code);
}

double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

void usage(FILE* out) {
    std::fputs(
        "usage: rc_verify [options]            server (passive target)\n"
        "       rc_verify [options] SERVER_IP  client (WRITE + READ-back pairs)\n"
        "  -d, --dev NAME       device (default: the first one)\n"
        "  -g, --gid INDEX      GID index (default 0)\n"
        "  -i, --ib-port N      port number (default 1)\n"
        "  -s, --size BYTES     message size (default 64; suffix k/m allowed)\n"
        "  -n, --iters N        WRITE+READ pairs (client; default 1000)\n"
        "  -q, --depth N        pairs in flight (client; default 1)\n"
        "  -p, --port PORT      TCP port of the out-of-band exchange (default 18600)\n"
        "      --mtu BYTES      path MTU 256..4096 (default 1024; capped at the port's)\n"
        "      --timeout EXP    QP local ACK timeout exponent 0..31 (default 14)\n"
        "      --retry N        QP retry count 0..7 (default 7)\n"
        "      --rnr-retry N    QP RNR retry count 0..7 (default 7)\n"
        "      --stall SEC      give up after SEC seconds without progress (default 30)\n"
        "      --oob-wait SEC   how long to wait for the TCP peer (default 300)\n"
        "      --seed N         data seed (client; default 1)\n"
        "      --psn N          first PSN of this side (default random); e.g. 16777200 to wrap\n"
        "      --guard BYTES    guard bytes around each buffer (default 64)\n"
        "      --poll           busy-poll the CQ instead of waiting on a completion channel\n"
        "  -v, --verbose        print every error completion and every wrong READ\n"
        "      --self-test N    checks the checker: before every Nth READ's check, put the canary\n"
        "                       back (odd multiples: the last quarter; even: all of it); the\n"
        "                       run must then report those READs as wrong and exit 1\n",
        out);
}

bool parse_u64(const char* s, uint64_t& out) {
    if (s == nullptr || *s == '\0') return false;
    char* end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(s, &end, 0);
    if (errno != 0 || end == s) return false;
    uint64_t mult = 1;
    if (*end == 'k' || *end == 'K') {
        mult = 1024;
        ++end;
    } else if (*end == 'm' || *end == 'M') {
        mult = 1024 * 1024;
        ++end;
    }
    if (*end != '\0') return false;
    if (v > UINT64_MAX / mult) return false;
    out = v * mult;
    return true;
}

uint64_t need_u64(const char* opt, const char* s, uint64_t lo, uint64_t hi) {
    uint64_t v = 0;
    if (!parse_u64(s, v) || v < lo || v > hi) {
        std::fprintf(stderr, "rc_verify: bad value for %s: '%s' (%" PRIu64 "..%" PRIu64 ")\n", opt,
                     s ? s : "", lo, hi);
        std::exit(kExitUsage);
    }
    return v;
}

double need_seconds(const char* opt, const char* s) {
    char* end = nullptr;
    double v = std::strtod(s, &end);
    if (end == s || *end != '\0' || !(v > 0) || v > 86400) {
        std::fprintf(stderr, "rc_verify: bad value for %s: '%s'\n", opt, s);
        std::exit(kExitUsage);
    }
    return v;
}

Options parse_options(int argc, char** argv) {
    enum {
        kOptMtu = 1000,
        kOptTimeout,
        kOptRetry,
        kOptRnrRetry,
        kOptStall,
        kOptOobWait,
        kOptSeed,
        kOptPsn,
        kOptGuard,
        kOptPoll,
        kOptSelfTest,
    };
    static const option longopts[] = {
        {"dev", required_argument, nullptr, 'd'},
        {"gid", required_argument, nullptr, 'g'},
        {"ib-port", required_argument, nullptr, 'i'},
        {"size", required_argument, nullptr, 's'},
        {"iters", required_argument, nullptr, 'n'},
        {"depth", required_argument, nullptr, 'q'},
        {"port", required_argument, nullptr, 'p'},
        {"mtu", required_argument, nullptr, kOptMtu},
        {"timeout", required_argument, nullptr, kOptTimeout},
        {"retry", required_argument, nullptr, kOptRetry},
        {"rnr-retry", required_argument, nullptr, kOptRnrRetry},
        {"stall", required_argument, nullptr, kOptStall},
        {"oob-wait", required_argument, nullptr, kOptOobWait},
        {"seed", required_argument, nullptr, kOptSeed},
        {"psn", required_argument, nullptr, kOptPsn},
        {"guard", required_argument, nullptr, kOptGuard},
        {"poll", no_argument, nullptr, kOptPoll},
        {"self-test", required_argument, nullptr, kOptSelfTest},
        {"verbose", no_argument, nullptr, 'v'},
        {"help", no_argument, nullptr, 'h'},
        {nullptr, 0, nullptr, 0},
    };
    Options o;
    int c = 0;
    while ((c = getopt_long(argc, argv, "d:g:i:s:n:q:p:vh", longopts, nullptr)) != -1) {
        switch (c) {
            case 'd':
                o.device = optarg;
                break;
            case 'g':
                o.gid_index = static_cast<int>(need_u64("-g", optarg, 0, 65535));
                break;
            case 'i':
                o.ib_port = static_cast<int>(need_u64("-i", optarg, 1, 255));
                break;
            case 's':
                o.size = need_u64("-s", optarg, 1, 1ull << 30);
                break;
            case 'n':
                o.iters = need_u64("-n", optarg, 1, 1ull << 40);
                break;
            case 'q':
                o.depth = static_cast<unsigned>(need_u64("-q", optarg, 1, 256));
                break;
            case 'p':
                o.tcp_port = static_cast<int>(need_u64("-p", optarg, 1, 65535));
                break;
            case kOptMtu:
                o.mtu = static_cast<int>(need_u64("--mtu", optarg, 256, 4096));
                break;
            case kOptTimeout:
                o.timeout = static_cast<int>(need_u64("--timeout", optarg, 0, 31));
                break;
            case kOptRetry:
                o.retry = static_cast<int>(need_u64("--retry", optarg, 0, 7));
                break;
            case kOptRnrRetry:
                o.rnr_retry = static_cast<int>(need_u64("--rnr-retry", optarg, 0, 7));
                break;
            case kOptStall:
                o.stall_s = need_seconds("--stall", optarg);
                break;
            case kOptOobWait:
                o.oob_wait_s = need_seconds("--oob-wait", optarg);
                break;
            case kOptSeed:
                o.seed = need_u64("--seed", optarg, 0, UINT64_MAX);
                break;
            case kOptPsn:
                o.psn = static_cast<long long>(need_u64("--psn", optarg, 0, 0xffffff));
                break;
            case kOptGuard:
                o.guard = need_u64("--guard", optarg, 0, 1 << 20);
                break;
            case kOptPoll:
                o.busy_poll = true;
                break;
            case kOptSelfTest:
                o.self_test = need_u64("--self-test", optarg, 1, UINT64_MAX);
                break;
            case 'v':
                o.verbose = true;
                break;
            case 'h':
                usage(stdout);
                std::exit(kExitOk);
            default:
                usage(stderr);
                std::exit(kExitUsage);
        }
    }
    if (optind + 1 == argc) {
        o.server = argv[optind];
    } else if (optind != argc) {
        usage(stderr);
        std::exit(kExitUsage);
    }
    if (o.mtu != 256 && o.mtu != 512 && o.mtu != 1024 && o.mtu != 2048 && o.mtu != 4096) {
        std::fprintf(stderr, "rc_verify: --mtu must be 256, 512, 1024, 2048 or 4096\n");
        std::exit(kExitUsage);
    }
    if (static_cast<uint64_t>(o.size) * o.depth > (1ull << 31)) {
        std::fprintf(stderr, "rc_verify: SIZE x DEPTH above 2 GiB\n");
        std::exit(kExitUsage);
    }
    return o;
}

ibv_mtu mtu_enum(int mtu) {
    return uroce::mtu_enum(static_cast<uint32_t>(mtu)).value_or(IBV_MTU_4096);
}

int mtu_bytes(ibv_mtu m) {
    return 128 << static_cast<int>(m);
}

const char* qp_state_name(ibv_qp_state s) {
    switch (s) {
        case IBV_QPS_RESET:
            return "RESET";
        case IBV_QPS_INIT:
            return "INIT";
        case IBV_QPS_RTR:
            return "RTR";
        case IBV_QPS_RTS:
            return "RTS";
        case IBV_QPS_SQD:
            return "SQD";
        case IBV_QPS_SQE:
            return "SQE";
        case IBV_QPS_ERR:
            return "ERR";
        default:
            return "UNKNOWN";
    }
}

// ---------------------------------------------------------------- data patterns

uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// Fresh bytes for iteration `iter`: a different stream for every iteration and seed.
void fill_data(uint8_t* p, size_t n, uint64_t seed, uint64_t iter) {
    uint64_t state = mix64(seed ^ mix64(iter + 1));
    size_t i = 0;
    while (i < n) {
        state = mix64(state);
        for (int b = 0; b < 8 && i < n; ++b, ++i) p[i] = static_cast<uint8_t>(state >> (8 * b));
    }
}

// What a READ buffer holds before the READ lands: depends on the offset only, so untouched
// stretches are recognisable.
uint8_t canary(size_t off) {
    return static_cast<uint8_t>(0xc3 ^ (off * 37) ^ (off >> 8));
}

void fill_canary(uint8_t* p, size_t n) {
    for (size_t i = 0; i < n; ++i) p[i] = canary(i);
}

bool guard_intact(const uint8_t* p, size_t n) {
    for (size_t i = 0; i < n; ++i)
        if (p[i] != kGuardByte) return false;
    return true;
}

// ---------------------------------------------------------------- TCP out of band

class LineChannel {
  public:
    explicit LineChannel(int fd) : fd_(fd) {}
    ~LineChannel() {
        if (fd_ >= 0) ::close(fd_);
    }
    LineChannel(const LineChannel&) = delete;
    LineChannel& operator=(const LineChannel&) = delete;

    bool send_line(const std::string& s) {
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

    // 1: a line; 0: timeout; -1: peer closed or error.
    int recv_line(std::string& out, int timeout_ms) {
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

    // Waits up to `seconds` for a line (heartbeats and all).
    bool recv_line_within(std::string& out, double seconds) {
        auto start = Clock::now();
        for (;;) {
            double left = seconds - seconds_since(start);
            if (left <= 0) return false;
            int r = recv_line(out, static_cast<int>(std::min(left, 1.0) * 1000) + 1);
            if (r == 1) return true;
            if (r < 0) return false;
        }
    }

  private:
    int fd_;
    std::string buf_;
};

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

// ---------------------------------------------------------------- verbs setup

struct PeerInfo {
    uint32_t qpn = 0;
    uint32_t psn = 0;
    ibv_gid gid{};
    uint32_t rkey = 0;
    uint64_t addr = 0;
    uint64_t len = 0;
    int rd_atomic = 0;
};

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

std::string gid_text(const ibv_gid& g) {
    char buf[INET6_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET6, g.raw, buf, sizeof buf);
    return buf;
}

struct Verbs {
    ibv_context* ctx = nullptr;
    ibv_pd* pd = nullptr;
    ibv_comp_channel* channel = nullptr;
    ibv_cq* cq = nullptr;
    ibv_qp* qp = nullptr;
    ibv_device_attr dev_attr{};
    ibv_port_attr port_attr{};
    ibv_gid gid{};
    ibv_mtu path_mtu = IBV_MTU_1024;
    std::vector<ibv_mr*> mrs;
    bool armed = false;
    unsigned unacked_events = 0;
};

void open_verbs(const Options& o, Verbs& v, unsigned send_wrs) {
    int num = 0;
    ibv_device** list = ibv_get_device_list(&num);
    if (list == nullptr || num == 0) die(kExitUsage, "no RDMA devices");
    ibv_device* dev = nullptr;
    for (int i = 0; i < num; ++i) {
        if (o.device.empty() || o.device == ibv_get_device_name(list[i])) {
            dev = list[i];
            break;
        }
    }
    if (dev == nullptr) die(kExitUsage, "device %s not found", o.device.c_str());
    v.ctx = ibv_open_device(dev);
    if (v.ctx == nullptr)
        die(kExitUsage, "ibv_open_device(%s): %s", ibv_get_device_name(dev), std::strerror(errno));
    std::string name = ibv_get_device_name(dev);
    ibv_free_device_list(list);
    if (ibv_query_device(v.ctx, &v.dev_attr) != 0) die(kExitUsage, "ibv_query_device failed");
    if (ibv_query_port(v.ctx, static_cast<uint8_t>(o.ib_port), &v.port_attr) != 0)
        die(kExitUsage, "ibv_query_port failed");
    if (ibv_query_gid(v.ctx, static_cast<uint8_t>(o.ib_port), o.gid_index, &v.gid) != 0)
        die(kExitUsage, "ibv_query_gid(%d) failed", o.gid_index);
    v.path_mtu = std::min(mtu_enum(o.mtu), v.port_attr.active_mtu);
    logf(
        "device %s port %d gid[%d] %s active_mtu %d path_mtu %d max_qp_rd_atom %d "
        "max_qp_init_rd_atom %d",
        name.c_str(), o.ib_port, o.gid_index, gid_text(v.gid).c_str(),
        mtu_bytes(v.port_attr.active_mtu), mtu_bytes(v.path_mtu), v.dev_attr.max_qp_rd_atom,
        v.dev_attr.max_qp_init_rd_atom);
    v.pd = ibv_alloc_pd(v.ctx);
    if (v.pd == nullptr) die(kExitUsage, "ibv_alloc_pd: %s", std::strerror(errno));
    if (!o.busy_poll) {
        v.channel = ibv_create_comp_channel(v.ctx);
        if (v.channel == nullptr)
            die(kExitUsage, "ibv_create_comp_channel: %s", std::strerror(errno));
    }
    int cqe = static_cast<int>(send_wrs) + 4;
    v.cq = ibv_create_cq(v.ctx, cqe, nullptr, v.channel, 0);
    if (v.cq == nullptr) die(kExitUsage, "ibv_create_cq(%d): %s", cqe, std::strerror(errno));
    ibv_qp_init_attr ia{};
    ia.send_cq = v.cq;
    ia.recv_cq = v.cq;
    ia.qp_type = IBV_QPT_RC;
    ia.sq_sig_all = 0;
    ia.cap.max_send_wr = send_wrs;
    ia.cap.max_recv_wr = 1;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    v.qp = ibv_create_qp(v.pd, &ia);
    if (v.qp == nullptr) die(kExitUsage, "ibv_create_qp: %s", std::strerror(errno));
    // The async fd is read without blocking (report_async_events).
    int fl = ::fcntl(v.ctx->async_fd, F_GETFL);
    if (fl >= 0) ::fcntl(v.ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
}

ibv_mr* reg(Verbs& v, void* p, size_t n, int access) {
    ibv_mr* mr = ibv_reg_mr(v.pd, p, n, access);
    if (mr == nullptr) die(kExitUsage, "ibv_reg_mr(%zu bytes): %s", n, std::strerror(errno));
    v.mrs.push_back(mr);
    return mr;
}

void connect_qp(const Options& o, Verbs& v, const PeerInfo& local, const PeerInfo& remote,
                int max_rd_atomic, int max_dest_rd_atomic) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = static_cast<uint8_t>(o.ib_port);
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    if (ibv_modify_qp(v.qp, &a,
                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0)
        die(kExitUsage, "modify_qp INIT: %s", std::strerror(errno));

    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = v.path_mtu;
    a.dest_qp_num = remote.qpn;
    a.rq_psn = remote.psn;
    a.max_dest_rd_atomic = static_cast<uint8_t>(max_dest_rd_atomic);
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = remote.gid;
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(o.gid_index);
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = static_cast<uint8_t>(o.ib_port);
    if (ibv_modify_qp(v.qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0)
        die(kExitUsage, "modify_qp RTR: %s", std::strerror(errno));

    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = local.psn;
    a.timeout = static_cast<uint8_t>(o.timeout);
    a.retry_cnt = static_cast<uint8_t>(o.retry);
    a.rnr_retry = static_cast<uint8_t>(o.rnr_retry);
    a.max_rd_atomic = static_cast<uint8_t>(max_rd_atomic);
    if (ibv_modify_qp(v.qp, &a,
                      IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                          IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC) != 0)
        die(kExitUsage, "modify_qp RTS: %s", std::strerror(errno));
    logf(
        "QP 0x%06x (psn 0x%06x) -> peer QP 0x%06x (psn 0x%06x) gid %s: RTS, max_rd_atomic %d, "
        "max_dest_rd_atomic %d, timeout %d, retry %d",
        local.qpn, local.psn, remote.qpn, remote.psn, gid_text(remote.gid).c_str(), max_rd_atomic,
        max_dest_rd_atomic, o.timeout, o.retry);
}

std::string qp_state_now(Verbs& v) {
    ibv_qp_attr a{};
    ibv_qp_init_attr ia{};
    if (ibv_query_qp(v.qp, &a, IBV_QP_STATE, &ia) != 0) return "query-failed";
    return qp_state_name(a.qp_state);
}

// Drains the async event queue without blocking; returns how many events there were.
unsigned report_async_events(Verbs& v) {
    unsigned n = 0;
    for (;;) {
        pollfd pfd{v.ctx->async_fd, POLLIN, 0};
        if (::poll(&pfd, 1, 0) <= 0) break;
        ibv_async_event ev{};
        if (ibv_get_async_event(v.ctx, &ev) != 0) break;
        logf("async event: %s", ibv_event_type_str(ev.event_type));
        ibv_ack_async_event(&ev);
        ++n;
    }
    return n;
}

void close_verbs(Verbs& v) {
    if (v.unacked_events > 0) ibv_ack_cq_events(v.cq, v.unacked_events);
    if (v.qp != nullptr && ibv_destroy_qp(v.qp) != 0) logf("ibv_destroy_qp failed");
    for (ibv_mr* mr : v.mrs) ibv_dereg_mr(mr);
    if (v.cq != nullptr) ibv_destroy_cq(v.cq);
    if (v.channel != nullptr) ibv_destroy_comp_channel(v.channel);
    if (v.pd != nullptr) ibv_dealloc_pd(v.pd);
    if (v.ctx != nullptr) ibv_close_device(v.ctx);
}

// Polls the CQ; when it is empty, waits up to `wait_ms` for a completion event (or spins,
// with --poll). Returns the number of completions (>= 0) or -1 on a poll error.
int poll_some(Verbs& v, bool busy, ibv_wc* wc, int max, int wait_ms) {
    int n = ibv_poll_cq(v.cq, max, wc);
    if (n != 0 || busy) return n;
    if (!v.armed) {
        if (ibv_req_notify_cq(v.cq, 0) != 0) return -1;
        v.armed = true;
        n = ibv_poll_cq(v.cq, max, wc);  // what arrived before the arming
        if (n != 0) return n;
    }
    pollfd pfd{v.channel->fd, POLLIN, 0};
    int r = ::poll(&pfd, 1, wait_ms);
    if (r > 0) {
        ibv_cq* ev_cq = nullptr;
        void* ev_ctx = nullptr;
        if (ibv_get_cq_event(v.channel, &ev_cq, &ev_ctx) == 0) {
            v.armed = false;
            if (++v.unacked_events >= 64) {
                ibv_ack_cq_events(v.cq, v.unacked_events);
                v.unacked_events = 0;
            }
        }
    }
    return ibv_poll_cq(v.cq, max, wc);
}

// ---------------------------------------------------------------- client

struct Problem {
    uint64_t iter;
    std::string what;
};

struct ClientStats {
    uint64_t pairs_posted = 0;
    uint64_t pairs_done = 0;  // both completions seen, whatever their status
    uint64_t pairs_ok = 0;    // both SUCCESS and the READ's data right
    std::map<std::string, uint64_t> write_status;
    std::map<std::string, uint64_t> read_status;
    uint64_t read_wrong = 0;            // SUCCESS with wrong data, any kind
    uint64_t read_wrong_untouched = 0;  // ... every byte still the canary
    uint64_t read_wrong_tail = 0;       // ... a correct head, then an untouched tail
    uint64_t read_wrong_other = 0;
    uint64_t guard_bad = 0;
    uint64_t out_of_order = 0;
    bool stalled = false;
    bool error_seen = false;
    std::vector<Problem> problems;
};

std::string status_summary(const std::map<std::string, uint64_t>& m) {
    if (m.empty()) return "none";
    std::string s;
    for (const auto& [k, n] : m) {
        if (!s.empty()) s += ",";
        std::string name = k;  // one word, so that RESULT lines split on spaces
        std::replace(name.begin(), name.end(), ' ', '_');
        s += name + "=" + std::to_string(n);
    }
    return s;
}

// Compares a successful READ's buffer with the data written; classifies what is wrong.
// Returns true when the data and both guards are right.
bool check_read(const Options& o, ClientStats& st, uint64_t iter, const uint8_t* want,
                const uint8_t* slot_buf) {
    const uint8_t* lo_guard = slot_buf;
    const uint8_t* got = slot_buf + o.guard;
    const uint8_t* hi_guard = got + o.size;
    bool ok = true;
    if (!guard_intact(lo_guard, o.guard) || !guard_intact(hi_guard, o.guard)) {
        ok = false;
        ++st.guard_bad;
        if (st.problems.size() < kMaxReportedProblems)
            st.problems.push_back({iter, "guard bytes around the READ buffer changed"});
    }
    if (std::memcmp(got, want, o.size) == 0) return ok;
    ++st.read_wrong;
    size_t first = o.size, last = 0, mismatches = 0, canaries = 0, all_canary = 1;
    for (size_t i = 0; i < o.size; ++i) {
        if (got[i] != canary(i)) all_canary = 0;
        if (got[i] != want[i]) {
            ++mismatches;
            if (got[i] == canary(i)) ++canaries;
            first = std::min(first, i);
            last = i;
        }
    }
    // A correct head followed by a tail that is still entirely canary.
    bool tail_untouched = !all_canary && first < o.size;
    for (size_t i = first; tail_untouched && i < o.size; ++i)
        if (got[i] != canary(i) && got[i] != want[i]) tail_untouched = false;
    const char* kind = "other";
    if (all_canary) {
        ++st.read_wrong_untouched;
        kind = "untouched (all canary)";
    } else if (tail_untouched && last == o.size - 1) {
        ++st.read_wrong_tail;
        kind = "correct head, untouched tail";
    } else {
        ++st.read_wrong_other;
    }
    char msg[256];
    std::snprintf(msg, sizeof msg,
                  "READ SUCCESS with wrong data: %s; %zu of %zu bytes wrong (%zu still canary), "
                  "first at %zu, last at %zu",
                  kind, mismatches, o.size, canaries, first, last);
    if (st.problems.size() < kMaxReportedProblems || o.verbose) st.problems.push_back({iter, msg});
    if (o.verbose) logf("pair %" PRIu64 ": %s", iter, msg);
    return false;
}

int run_client(const Options& o) {
    g_role = "rc_verify client";
    Verbs v;
    const unsigned depth = o.depth;
    open_verbs(o, v, 2 * depth);

    const size_t slot_bytes = o.size + 2 * o.guard;
    std::vector<uint8_t> src(o.size * depth);
    std::vector<uint8_t> dst(slot_bytes * depth);
    ibv_mr* src_mr = reg(v, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
    ibv_mr* dst_mr = reg(v, dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);

    std::random_device rd;
    PeerInfo local;
    local.qpn = v.qp->qp_num;
    local.psn = o.psn >= 0 ? static_cast<uint32_t>(o.psn) : (rd() & 0xffffff);
    local.gid = v.gid;
    local.rd_atomic =
        std::min({static_cast<int>(depth), kMaxRdAtomic, v.dev_attr.max_qp_init_rd_atom});

    LineChannel oob(tcp_connect(o.server, o.tcp_port, o.oob_wait_s));
    if (!oob.send_line(format_peer(local))) die(kExitIncomplete, "TCP send failed");
    std::string line;
    PeerInfo remote;
    if (!oob.recv_line_within(line, o.oob_wait_s) || !parse_peer(line, remote))
        die(kExitIncomplete, "no valid peer information from the server (got '%s')", line.c_str());
    if (remote.len < o.size * depth)
        die(kExitUsage, "server region is %" PRIu64 " bytes, need %zu (same -s/-q on both sides?)",
            remote.len, o.size * depth);
    int max_rd_atomic = std::max(1, std::min(local.rd_atomic, remote.rd_atomic));
    connect_qp(o, v, local, remote, max_rd_atomic,
               std::min(kMaxRdAtomic, std::max(1, v.dev_attr.max_qp_rd_atom)));
    if (!oob.send_line("READY")) die(kExitIncomplete, "TCP send failed");
    if (!oob.recv_line_within(line, o.oob_wait_s) || line != "READY")
        die(kExitIncomplete, "server not ready (got '%s')", line.c_str());

    logf("%" PRIu64 " pairs of WRITE %zu B + READ %zu B, %u in flight, seed %" PRIu64
         ", stall limit %.0f s",
         o.iters, o.size, o.size, depth, o.seed, o.stall_s);

    ClientStats st;
    std::vector<uint64_t> slot_iter(depth, 0);
    std::vector<int> slot_pending(depth, 0);  // completions still expected per slot
    std::vector<bool> slot_ok(depth, false);  // no error status, no wrong byte so far
    uint64_t next_iter = 0;
    uint64_t expected_seq = 0;  // completions arrive in posting order: 2*iter, 2*iter+1
    uint64_t outstanding = 0;
    auto start = Clock::now();
    auto last_progress = start;
    auto last_beat = start;

    auto post_pair = [&](unsigned slot) -> bool {
        uint64_t iter = next_iter;
        uint8_t* s = src.data() + slot * o.size;
        uint8_t* d = dst.data() + slot * slot_bytes;
        fill_data(s, o.size, o.seed, iter);
        std::memset(d, kGuardByte, o.guard);
        fill_canary(d + o.guard, o.size);
        std::memset(d + o.guard + o.size, kGuardByte, o.guard);

        ibv_sge wsge{reinterpret_cast<uintptr_t>(s), static_cast<uint32_t>(o.size), src_mr->lkey};
        ibv_sge rsge{reinterpret_cast<uintptr_t>(d + o.guard), static_cast<uint32_t>(o.size),
                     dst_mr->lkey};
        ibv_send_wr rwr{};
        rwr.wr_id = 2 * iter + 1;
        rwr.sg_list = &rsge;
        rwr.num_sge = 1;
        rwr.opcode = IBV_WR_RDMA_READ;
        rwr.send_flags = IBV_SEND_SIGNALED;
        rwr.wr.rdma.remote_addr = remote.addr + slot * o.size;
        rwr.wr.rdma.rkey = remote.rkey;
        ibv_send_wr wwr{};
        wwr.wr_id = 2 * iter;
        wwr.sg_list = &wsge;
        wwr.num_sge = 1;
        wwr.opcode = IBV_WR_RDMA_WRITE;
        wwr.send_flags = IBV_SEND_SIGNALED;
        wwr.wr.rdma.remote_addr = remote.addr + slot * o.size;
        wwr.wr.rdma.rkey = remote.rkey;
        wwr.next = &rwr;
        ibv_send_wr* bad = nullptr;
        int rc = ibv_post_send(v.qp, &wwr, &bad);
        if (rc != 0) {
            logf("ibv_post_send failed at pair %" PRIu64 ": %s", iter, std::strerror(rc));
            // If only the READ failed to post, the WRITE is still outstanding.
            if (bad == &rwr) {
                ++outstanding;
                slot_iter[slot] = iter;
                slot_ok[slot] = false;
                slot_pending[slot] = 1;
                ++next_iter;
                ++st.pairs_posted;
            }
            return false;
        }
        slot_iter[slot] = iter;
        slot_ok[slot] = true;
        slot_pending[slot] = 2;
        outstanding += 2;
        ++next_iter;
        ++st.pairs_posted;
        return true;
    };

    bool posting = true;
    for (unsigned s = 0; s < depth && next_iter < o.iters; ++s) {
        if (!post_pair(s)) {
            posting = false;
            st.error_seen = true;
            break;
        }
    }

    ibv_wc wc[32];
    while (outstanding > 0) {
        int n = poll_some(v, o.busy_poll, wc, 32, 200);
        if (n < 0) {
            logf("ibv_poll_cq failed");
            st.error_seen = true;
            break;
        }
        auto now = Clock::now();
        if (n > 0) last_progress = now;
        for (int i = 0; i < n; ++i) {
            const ibv_wc& w = wc[i];
            uint64_t iter = w.wr_id / 2;
            bool is_read = (w.wr_id & 1) != 0;
            unsigned slot = static_cast<unsigned>(iter % depth);
            std::string status = ibv_wc_status_str(w.status);
            (is_read ? st.read_status : st.write_status)[status]++;
            --outstanding;
            if (w.wr_id != expected_seq) ++st.out_of_order;
            expected_seq = w.wr_id + 1;
            if (w.status != IBV_WC_SUCCESS) {
                slot_ok[slot] = false;
                if (!st.error_seen || o.verbose)
                    logf("pair %" PRIu64 " %s: %s (vendor_err 0x%x)", iter,
                         is_read ? "READ" : "WRITE", status.c_str(), w.vendor_err);
                if (!st.error_seen && st.problems.size() < kMaxReportedProblems)
                    st.problems.push_back(
                        {iter, std::string(is_read ? "READ " : "WRITE ") + status});
                st.error_seen = true;
                posting = false;
            } else if (is_read) {
                if (w.opcode != IBV_WC_RDMA_READ) ++st.out_of_order;
                if (slot_iter[slot] != iter) die(kExitUsage, "internal: slot bookkeeping");
                if (o.self_test != 0 && (iter + 1) % o.self_test == 0) {
                    uint8_t* got = dst.data() + slot * slot_bytes + o.guard;
                    size_t from = ((iter + 1) / o.self_test) % 2 == 1 ? o.size - o.size / 4 : 0;
                    for (size_t b = from; b < o.size; ++b) got[b] = canary(b);
                }
                if (!check_read(o, st, iter, src.data() + slot * o.size,
                                dst.data() + slot * slot_bytes))
                    slot_ok[slot] = false;
            } else if (w.opcode != IBV_WC_RDMA_WRITE) {
                ++st.out_of_order;
            }
            if (--slot_pending[slot] == 0) {
                ++st.pairs_done;
                if (slot_ok[slot]) ++st.pairs_ok;
                if (posting && next_iter < o.iters && !post_pair(slot)) {
                    posting = false;
                    st.error_seen = true;
                }
            }
        }
        if (seconds_since(last_beat) >= 1.0) {
            last_beat = now;
            oob.send_line("P " + std::to_string(st.pairs_done));
        }
        if (std::chrono::duration<double>(now - last_progress).count() > o.stall_s) {
            logf("no completion for %.0f s with %" PRIu64 " work requests outstanding: giving up",
                 o.stall_s, outstanding);
            st.stalled = true;
            break;
        }
    }
    double elapsed = seconds_since(start);
    unsigned async = report_async_events(v);
    std::string qp_state = qp_state_now(v);

    char summary[512];
    std::snprintf(summary, sizeof summary,
                  "pairs=%" PRIu64 " posted=%" PRIu64 " done=%" PRIu64 " ok=%" PRIu64
                  " read_success_wrong_data=%" PRIu64 " guard_bad=%" PRIu64 " stalled=%d",
                  o.iters, st.pairs_posted, st.pairs_done, st.pairs_ok, st.read_wrong, st.guard_bad,
                  st.stalled ? 1 : 0);
    oob.send_line(std::string("DONE ") + summary);
    std::string server_line = "(no answer)";
    if (oob.recv_line_within(line, 10) && line.rfind("SERVER ", 0) == 0)
        server_line = line.substr(7);
    // Only a server that answered can report its guards; silence is an incomplete run.
    bool server_answered = server_line != "(no answer)";
    bool server_guard_bad = server_answered && server_line.find("guard_bad=0") == std::string::npos;

    for (const auto& p : st.problems)
        logf("problem at pair %" PRIu64 ": %s", p.iter, p.what.c_str());
    logf("elapsed %.2f s (%.1f pairs/s)", elapsed,
         elapsed > 0 ? static_cast<double>(st.pairs_done) / elapsed : 0.0);
    logf("WRITE completions: %s", status_summary(st.write_status).c_str());
    logf("READ completions: %s", status_summary(st.read_status).c_str());
    logf("READ SUCCESS with wrong data: %" PRIu64 " (untouched %" PRIu64 ", untouched tail %" PRIu64
         ", other %" PRIu64 ")",
         st.read_wrong, st.read_wrong_untouched, st.read_wrong_tail, st.read_wrong_other);
    logf("guard violations (client READ buffers): %" PRIu64 "; completions out of order: %" PRIu64,
         st.guard_bad, st.out_of_order);
    logf("QP state at end: %s; async events: %u", qp_state.c_str(), async);
    logf("server: %s", server_line.c_str());
    std::printf(
        "RESULT role=client size=%zu depth=%u %s wc_write=%s wc_read=%s wrong_untouched=%" PRIu64
        " wrong_tail=%" PRIu64 " wrong_other=%" PRIu64 " out_of_order=%" PRIu64
        " qp=%s async=%u elapsed=%.2f"
        " server={%s}\n",
        o.size, depth, summary, status_summary(st.write_status).c_str(),
        status_summary(st.read_status).c_str(), st.read_wrong_untouched, st.read_wrong_tail,
        st.read_wrong_other, st.out_of_order, qp_state.c_str(), async, elapsed,
        server_line.c_str());
    std::fflush(stdout);
    close_verbs(v);

    if (st.read_wrong > 0 || st.guard_bad > 0 || server_guard_bad) return kExitWrongData;
    if (st.stalled || st.error_seen || st.pairs_ok != o.iters || st.out_of_order > 0 ||
        !server_answered)
        return kExitIncomplete;
    return kExitOk;
}

// ---------------------------------------------------------------- server

int run_server(const Options& o) {
    g_role = "rc_verify server";
    Verbs v;
    open_verbs(o, v, 2);
    const size_t region = o.size * o.depth;
    std::vector<uint8_t> buf(region + 2 * o.guard);
    std::memset(buf.data(), kGuardByte, o.guard);
    fill_canary(buf.data() + o.guard, region);
    std::memset(buf.data() + o.guard + region, kGuardByte, o.guard);
    // The guards are inside the registered memory, outside the range handed out: a responder
    // that writes past the addressed range lands on them.
    ibv_mr* mr = reg(v, buf.data(), buf.size(),
                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);

    std::random_device rd;
    PeerInfo local;
    local.qpn = v.qp->qp_num;
    local.psn = o.psn >= 0 ? static_cast<uint32_t>(o.psn) : (rd() & 0xffffff);
    local.gid = v.gid;
    local.rkey = mr->rkey;
    local.addr = reinterpret_cast<uintptr_t>(buf.data() + o.guard);
    local.len = region;
    local.rd_atomic = std::min(kMaxRdAtomic, std::max(1, v.dev_attr.max_qp_rd_atom));

    LineChannel oob(tcp_listen_accept(o.tcp_port, o.oob_wait_s));
    std::string line;
    PeerInfo remote;
    if (!oob.recv_line_within(line, o.oob_wait_s) || !parse_peer(line, remote))
        die(kExitIncomplete, "no valid peer information from the client (got '%s')", line.c_str());
    if (!oob.send_line(format_peer(local))) die(kExitIncomplete, "TCP send failed");
    connect_qp(o, v, local, remote,
               std::max(1, std::min({kMaxRdAtomic, v.dev_attr.max_qp_init_rd_atom})),
               local.rd_atomic);
    if (!oob.recv_line_within(line, o.oob_wait_s) || line != "READY")
        die(kExitIncomplete, "client not ready (got '%s')", line.c_str());
    if (!oob.send_line("READY")) die(kExitIncomplete, "TCP send failed");
    logf("serving %zu bytes at 0x%" PRIx64 " rkey 0x%x", region, local.addr, local.rkey);

    // Passive: the responder needs nothing from us. Watch the client's heartbeats and our
    // async events until the client is done.
    auto last = Clock::now();
    unsigned async = 0;
    std::string done;
    bool finished = false;
    uint64_t client_pairs = 0;
    while (!finished) {
        int r = oob.recv_line(line, 500);
        async += report_async_events(v);
        if (r < 0) {
            logf("client went away");
            break;
        }
        if (r == 1) {
            last = Clock::now();
            if (line.rfind("P ", 0) == 0) {
                client_pairs = std::strtoull(line.c_str() + 2, nullptr, 10);
            } else if (line.rfind("DONE ", 0) == 0) {
                done = line.substr(5);
                finished = true;
            }
        } else if (seconds_since(last) > o.stall_s + 10) {
            logf("no word from the client for %.0f s (last count %" PRIu64 " pairs)",
                 o.stall_s + 10, client_pairs);
            break;
        }
    }
    bool guards_ok =
        guard_intact(buf.data(), o.guard) && guard_intact(buf.data() + o.guard + region, o.guard);
    std::string qp_state = qp_state_now(v);
    async += report_async_events(v);
    char summary[256];
    std::snprintf(summary, sizeof summary, "guard_bad=%d qp=%s async=%u", guards_ok ? 0 : 1,
                  qp_state.c_str(), async);
    if (finished) oob.send_line(std::string("SERVER ") + summary);
    logf("client: %s", finished ? done.c_str() : "(no DONE)");
    std::printf("RESULT role=server size=%zu depth=%u %s\n", o.size, o.depth, summary);
    std::fflush(stdout);
    close_verbs(v);
    if (!guards_ok) return kExitWrongData;
    return finished ? kExitOk : kExitIncomplete;
}

}  // namespace

int main(int argc, char** argv) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    Options o = parse_options(argc, argv);
    return o.server.empty() ? run_server(o) : run_client(o);
}
