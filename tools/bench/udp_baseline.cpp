// uroce-udp-baseline: what raw UDP (and, for comparison, TCP) can do on this machine, measured
// in one process with two threads, so that tools/bench.sh can put uroce's figures next to the
// kernel's own in the same run. Each mode prints one `key=value ...` line on stdout.
//
//   uroce-udp-baseline MODE [options]
//
// MODE: gso, gso-rc, gso-write, gso-write-rc, sendto, pps, rtt, rtt-ack, rtt-train, rtt-wake,
// gso-pingpong, tcp (see kUsage). Every loop is bounded in count and in time: receivers use socket
// timeouts or deadlines, so a lost datagram never hangs a mode. This file: the options and
// main; the modes are in udp_stream.cpp, udp_pingpong.cpp and tcp_stream.cpp (udp_baseline.h).

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

#include "udp_baseline.h"

namespace uroce::bench {
namespace {

constexpr const char* kUsage =
    "usage: uroce-udp-baseline MODE [options]\n"
    "modes (each prints one line of key=value pairs on stdout):\n"
    "  gso           UDP with GSO (UDP_SEGMENT) on the sender, UDP_GRO on the receiver:\n"
    "                goodput, datagrams/s, loss, CPU seconds\n"
    "  gso-write     the same, in the trains a stream of --msg byte RDMA WRITEs takes: per\n"
    "                message a FIRST of --seg + 16 bytes (its RETH) with one --seg segment,\n"
    "                then the other --seg segments (a larger FIRST cannot join a train)\n"
    "  gso-write-rc  gso-write with the per-byte work of RoCE in user space: each message\n"
    "                copied into its packets and each signed (CRC-32, ISA-L, as the ICRC) by\n"
    "                the sender, each checked and its payload copied into a region by the\n"
    "                receiver; goodput counts delivered payload only\n"
    "  gso-rc        gso's trains carrying --msg byte SENDs (every packet --seg bytes, trains\n"
    "                across messages) with the same per-byte work as gso-write-rc\n"
    "  sendto        plain sendto/recv of --size byte datagrams: goodput, datagrams/s, CPU\n"
    "  pps           plain sendto/recv of 64-byte datagrams: packets/s received\n"
    "  rtt           busy-polled ping-pong of --size bytes: RTT p50/p99, half RTT p50\n"
    "  rtt-ack       the same, each message preceded by a 20-byte datagram, as an RC\n"
    "                responder's ACK precedes its answer\n"
    "  rtt-train     the same, each message (--size 20 or more, default 24) with a 20-byte\n"
    "                datagram behind it in one GSO train, read with GRO: an RC answer that\n"
    "                leads its ACK, as between uroce devices of one host\n"
    "  rtt-wake      the same ping-pong, but each side's application thread spins on memory\n"
    "                and a second thread of its own, blocked in recv, stores what came: what\n"
    "                a user-space provider's engine thread does for ib_write_lat, whose\n"
    "                application waits for the peer's WRITE by spinning on memory\n"
    "  gso-pingpong  busy-polled ping-pong of a --msg byte message carried both ways as GSO\n"
    "                segments of --seg bytes, received with GRO: microseconds per iteration\n"
    "  gso-pingpong-rc  the same with what an RC SEND adds per byte and per message: each\n"
    "                segment copied into a staging buffer and signed (CRC-32, ISA-L, as\n"
    "                the ICRC), checked and copied out on arrival; a 20-byte segment (the\n"
    "                ACK) closing each message's last train, as between uroce devices of\n"
    "                one host\n"
    "  tcp           one TCP stream of --write byte writes: goodput, CPU seconds\n"
    "options:\n"
    "  --seconds S       throughput modes: how long the sender sends (default 2)\n"
    "  --size N          datagram size: sendto 4096, pps 64, rtt 8 (rtt needs N >= 8)\n"
    "  --seg N           GSO segment size (default 4112 = 4096 + BTH 12 + ICRC 4)\n"
    "  --msg N           gso-pingpong and gso-write message size (default 65536)\n"
    "  --write N         tcp write size (default 65536)\n"
    "  --iters N         ping-pong modes: measured iterations (default 20000)\n"
    "  --warmup N        ping-pong modes: iterations before measuring (default 1000)\n"
    "  --timeout S       bound on any mode's loops; a ping-pong mode that reaches it prints\n"
    "                    what it measured with complete=0 (default 60)\n"
    "  --buf N           SO_SNDBUF/SO_RCVBUF of the UDP sockets (default 4194304)\n"
    "  --addr-a ADDR     IPv4 address of the sending/ping side (default 127.0.0.1)\n"
    "  --addr-b ADDR     IPv4 address of the receiving/pong side (default 127.0.0.1)\n"
    "  --netns-a NAME    create side A's socket in network namespace NAME (/run/netns/NAME,\n"
    "                    or a path containing '/'); needs CAP_SYS_ADMIN\n"
    "  --netns-b NAME    the same for side B\n"
    "  --cpus A,B        pin side A's thread to CPU A and side B's to CPU B (default: unpinned)\n"
    "  --help            this text\n";

std::uint64_t parse_uint(const std::string& opt, const std::string& text, std::uint64_t lo,
                         std::uint64_t hi) {
    if (text.empty() || text[0] < '0' || text[0] > '9') {
        usage_error(opt + ": not a number: '" + text + "'");
    }
    errno = 0;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
    if (errno != 0 || *end != '\0') usage_error(opt + ": not a number: '" + text + "'");
    if (v < lo || v > hi) {
        usage_error(opt + ": " + text + " is outside " + std::to_string(lo) + ".." +
                    std::to_string(hi));
    }
    return v;
}

double parse_seconds(const std::string& opt, const std::string& text) {
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (text.empty() || errno != 0 || *end != '\0' || !std::isfinite(v)) {
        usage_error(opt + ": not a number: '" + text + "'");
    }
    if (v <= 0.0 || v > 3600.0) usage_error(opt + ": " + text + " is outside (0, 3600]");
    return v;
}

}  // namespace

[[noreturn]] void usage_error(const std::string& why) {
    std::fprintf(stderr, "uroce-udp-baseline: %s (--help for usage)\n", why.c_str());
    std::exit(2);
}

[[noreturn]] void die(const char* what) {
    std::fprintf(stderr, "uroce-udp-baseline: %s: %s\n", what, std::strerror(errno));
    std::exit(1);
}

// rtt, rtt-ack, rtt-train and rtt-wake: ping-pongs of --size byte messages.
bool is_rtt(const Options& o) {
    return o.mode == "rtt" || o.mode == "rtt-ack" || o.mode == "rtt-train" || o.mode == "rtt-wake";
}

Options parse_args(int argc, char** argv) {
    Options o;
    std::vector<std::string> args(argv + 1, argv + argc);
    for (const auto& a : args) {
        if (a == "--help" || a == "-h") {
            std::fputs(kUsage, stdout);
            std::exit(0);
        }
    }
    if (args.empty()) usage_error("no mode given");
    o.mode = args[0];
    static constexpr std::string_view kModes[] = {
        "gso",     "gso-rc",    "gso-write",    "gso-write-rc",    "sendto", "pps",     "rtt",
        "rtt-ack", "rtt-train", "gso-pingpong", "gso-pingpong-rc", "tcp",    "rtt-wake"};
    if (std::find(std::begin(kModes), std::end(kModes), o.mode) == std::end(kModes)) {
        usage_error("unknown mode '" + o.mode + "'");
    }
    for (std::size_t i = 1; i < args.size(); ++i) {
        const std::string& opt = args[i];
        if (opt.rfind("--", 0) != 0) usage_error("unexpected argument '" + opt + "'");
        if (i + 1 >= args.size()) usage_error(opt + " needs a value");
        const std::string& v = args[++i];
        if (opt == "--seconds") {
            o.seconds = parse_seconds(opt, v);
        } else if (opt == "--timeout") {
            o.timeout = parse_seconds(opt, v);
        } else if (opt == "--size") {
            o.size = parse_uint(opt, v, 1, 65507);
        } else if (opt == "--seg") {
            o.seg = parse_uint(opt, v, 8, 65507);
        } else if (opt == "--msg") {
            o.msg = parse_uint(opt, v, 8, 1 << 24);
        } else if (opt == "--write") {
            o.write = parse_uint(opt, v, 1, 1 << 24);
        } else if (opt == "--iters") {
            o.iters = parse_uint(opt, v, 1, 100000000);
        } else if (opt == "--warmup") {
            o.warmup = parse_uint(opt, v, 0, 100000000);
        } else if (opt == "--buf") {
            o.buf = static_cast<int>(parse_uint(opt, v, 4096, 1 << 30));
        } else if (opt == "--addr-a" || opt == "--addr-b") {
            in_addr tmp{};
            if (inet_pton(AF_INET, v.c_str(), &tmp) != 1) {
                usage_error(opt + ": not an IPv4 address: '" + v + "'");
            }
            (opt == "--addr-a" ? o.addr_a : o.addr_b) = v;
        } else if (opt == "--cpus") {
            const auto comma = v.find(',');
            if (comma == std::string::npos) usage_error("--cpus: want A,B, got '" + v + "'");
            o.cpu_a = static_cast<int>(parse_uint(opt, v.substr(0, comma), 0, CPU_SETSIZE - 1));
            o.cpu_b = static_cast<int>(parse_uint(opt, v.substr(comma + 1), 0, CPU_SETSIZE - 1));
        } else if (opt == "--netns-a") {
            o.netns_a = v;
        } else if (opt == "--netns-b") {
            o.netns_b = v;
        } else {
            usage_error("unknown option '" + opt + "'");
        }
    }
    const bool rtt = is_rtt(o);
    if (o.size == 0) o.size = o.mode == "pps" ? 64 : o.mode == "rtt-train" ? 24 : rtt ? 8 : 4096;
    if (rtt && o.size < 8) usage_error(o.mode + ": --size must be at least 8");
    // GSO lets only the last segment of a train differ, and only by being shorter.
    if (o.mode == "rtt-train" && (o.size < kAckBytes || o.size + kAckBytes > 65507))
        usage_error("rtt-train: --size must be 20 (the ACK's size) to 65487 bytes");
    if (o.mode == "gso-pingpong-rc" && o.seg <= 16)
        usage_error("gso-pingpong-rc: --seg must exceed 16 bytes (a header and a CRC)");
    if ((o.mode == "gso-write" || o.mode == "gso-write-rc") &&
        (o.seg <= 16 || 2 * o.seg + 16 > 65507)) {
        usage_error(o.mode +
                    ": --seg must leave room for a payload, and two segments "
                    "(the first 16 bytes larger) must fit 65507 bytes");
    }
    // Its first train is two whole packets.
    if (o.mode == "gso-write-rc" && o.msg < 2 * (o.seg - 16))
        usage_error("gso-write-rc: --msg must fill two packets of --seg - 16 bytes");
    // Its trains run across messages: every packet --seg bytes.
    if (o.mode == "gso-rc" &&
        (o.seg <= 16 || o.msg < 2 * (o.seg - 16) || o.msg % (o.seg - 16) != 0))
        usage_error("gso-rc: --msg must be a multiple of --seg - 16 bytes, at least two");
    return o;
}

}  // namespace uroce::bench

using namespace uroce::bench;

int main(int argc, char** argv) {
    const Options o = parse_args(argc, argv);
    if (o.mode == "gso") {
        print_tput(o, run_udp_tput(o, Stream::Gso), Stream::Gso);
    } else if (o.mode == "gso-write") {
        print_tput(o, run_udp_tput(o, Stream::GsoWrite), Stream::GsoWrite);
    } else if (o.mode == "gso-write-rc") {
        print_tput(o, run_udp_tput(o, Stream::GsoWriteRc), Stream::GsoWriteRc);
    } else if (o.mode == "gso-rc") {
        print_tput(o, run_udp_tput(o, Stream::GsoRc), Stream::GsoRc);
    } else if (o.mode == "sendto" || o.mode == "pps") {
        print_tput(o, run_udp_tput(o, Stream::Plain), Stream::Plain);
    } else if (o.mode == "rtt-wake") {
        print_pingpong(o, run_wake_pingpong(o), o.size, o.size);
    } else if (is_rtt(o)) {
        const AckDatagram ack = o.mode == "rtt-ack"     ? AckDatagram::Before
                                : o.mode == "rtt-train" ? AckDatagram::Behind
                                                        : AckDatagram::None;
        print_pingpong(o, run_pingpong(o, o.size, o.size, ack), o.size, o.size);
    } else if (o.mode == "gso-pingpong") {
        print_pingpong(o, run_pingpong(o, o.msg, o.seg, AckDatagram::None), o.msg, o.seg);
    } else if (o.mode == "gso-pingpong-rc") {
        print_pingpong(o, run_pingpong(o, o.msg, o.seg, AckDatagram::Behind, true), o.msg, o.seg);
    } else {
        run_tcp(o);
    }
    std::fflush(stdout);
    return 0;
}
