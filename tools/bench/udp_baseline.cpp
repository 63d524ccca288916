// uroce-udp-baseline: what raw UDP (and, for comparison, TCP) can do on this machine, measured
// in one process with two threads, so that tools/bench.sh can put uroce's figures next to the
// kernel's own in the same run. Each mode prints one `key=value ...` line on stdout.
//
//   uroce-udp-baseline MODE [options]
//
// MODE: gso, gso-rc, gso-write, gso-write-rc, sendto, pps, rtt, rtt-ack, rtt-train, rtt-wake,
// gso-pingpong, tcp (see kUsage). Every loop is bounded in count and in time: receivers use socket
// timeouts or deadlines, so a lost datagram never hangs a mode.

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
#include "transport/page_aligned_buffer.h"
#include "uroce/crc32.h"

namespace {

// A page-aligned buffer of `n` bytes, each `fill`. The kernel copies datagrams with rep
// movsb, which on some CPUs (this project's AMD VMs) is several times slower when the
// destination lies a few bytes past the source within a page (transport/page_aligned_buffer.h):
// with malloc's buffers, where the heap put them decided the figures (gso-pingpong: 79 us per
// iteration with the receive buffer 16 bytes into a page, 26 us at 0).
struct Buffer {
    explicit Buffer(std::size_t n, char fill = 0) : bytes(std::max<std::size_t>(n, 1)), n_(n) {
        std::memset(bytes.data(), fill, n);
    }
    char* data() const { return reinterpret_cast<char*>(bytes.data()); }
    std::size_t size() const { return n_; }

    uroce::transport::PageAlignedBuffer bytes;
    std::size_t n_;
};

using Clock = std::chrono::steady_clock;

// The datagram rtt-ack sends before each message, and rtt-train behind it: the size of an RC
// ACK (BTH 12, AETH 4, ICRC 4), sequence number 0, which no message has.
constexpr std::size_t kAckBytes = 20;

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

struct Options {
    std::string mode;
    double seconds = 2.0;
    std::size_t size = 0;  // 0: the mode's default
    std::size_t seg = 4096 + 16;
    std::size_t msg = 65536;
    std::size_t write = 65536;
    std::uint64_t iters = 20000;
    std::uint64_t warmup = 1000;
    double timeout = 60.0;
    int buf = 4 << 20;
    std::string addr_a = "127.0.0.1";
    std::string addr_b = "127.0.0.1";
    std::string netns_a;
    std::string netns_b;
    int cpu_a = -1;  // -1: not pinned
    int cpu_b = -1;
};

[[noreturn]] void usage_error(const std::string& why) {
    std::fprintf(stderr, "uroce-udp-baseline: %s (--help for usage)\n", why.c_str());
    std::exit(2);
}

[[noreturn]] void die(const char* what) {
    std::fprintf(stderr, "uroce-udp-baseline: %s: %s\n", what, std::strerror(errno));
    std::exit(1);
}

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

// A file descriptor closed on scope exit.
class Fd {
  public:
    explicit Fd(int fd = -1) : fd_(fd) {}
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    Fd(Fd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
    Fd& operator=(Fd&& other) noexcept {
        std::swap(fd_, other.fd_);
        return *this;
    }
    ~Fd() {
        if (fd_ >= 0) ::close(fd_);
    }
    int get() const { return fd_; }

  private:
    int fd_;
};

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

// The two UDP sockets of a mode: A (sender / ping) and B (receiver / pong), each connected to
// the other.
struct UdpPair {
    Fd a;
    Fd b;
};

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

// ---- throughput: gso, sendto, pps ----

// The clock of a one-way stream (UDP or TCP): the CPU time at the start, when the sender
// stops (--seconds) and when everything stops whatever happens (at most --timeout).
struct StreamClock {
    double cpu0;
    Clock::time_point send_end;
    Clock::time_point hard_end;
    explicit StreamClock(const Options& o) : cpu0(cpu_seconds()) {
        const auto start = Clock::now();
        send_end = start + to_duration(o.seconds);
        hard_end = start + to_duration(std::min(o.timeout, o.seconds + 5.0));
    }
};

struct Tput {
    std::uint64_t sent_dgrams = 0;
    std::uint64_t sent_bytes = 0;
    std::uint64_t send_errors = 0;
    std::uint64_t rx_dgrams = 0;
    std::uint64_t rx_bytes = 0;  // the -rc modes: payload delivered into the region
    std::uint64_t rx_bad = 0;    // the -rc modes: packets whose CRC or place was wrong
    double rx_window_s = 0;      // first to last datagram received
    double cpu_s = 0;
};

// How the sender of a throughput mode hands its datagrams to the kernel.
enum class Stream {
    Plain,       // one datagram per sendto
    Gso,         // trains of equal --seg segments, as many as fit one send
    GsoWrite,    // per --msg message: [FIRST of --seg + 16, one --seg], then the rest in trains
    GsoWriteRc,  // the same, staged, signed, checked and copied out (roce_stream_work.h)
    GsoRc,       // Gso's trains of --msg byte SENDs' packets, staged, signed, checked, copied
};

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

// Where a ping-pong sends a 20-byte datagram (the ACK) with each message.
enum class AckDatagram { None, Before, Behind };

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

struct PingResult {
    std::vector<double> us;  // one figure per measured iteration that completed
    std::uint64_t lost = 0;  // iterations that timed out (measured and warm-up)
    bool complete = true;
};

PingResult run_pingpong(const Options& o, std::size_t msg, std::size_t seg, AckDatagram ack,
                        bool rc_work = false) {
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

// Nearest-rank percentile of sorted values.
double percentile(const std::vector<double>& sorted, double q) {
    if (sorted.empty()) return 0.0;
    auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size())));
    if (rank == 0) rank = 1;
    return sorted[std::min(rank, sorted.size()) - 1];
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

// ---- tcp ----

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

}  // namespace

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
