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

#include "rc_verify.h"

namespace rc_verify {
namespace {

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

}  // namespace

const char* g_role = "rc_verify";

void logf(const char* fmt, ...) {
    std::fprintf(stdout, "%s: ", g_role);
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(stdout, fmt, ap);
    va_end(ap);
    std::fputc('\n', stdout);
    std::fflush(stdout);
}

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

}  // namespace rc_verify

using namespace rc_verify;

int main(int argc, char** argv) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    Options o = parse_options(argc, argv);
    return o.server.empty() ? run_server(o) : run_client(o);
}
