// uroce-udp-baseline's parts: the options, sockets and clocks every mode shares, and each
// family of modes (throughput, ping-pong, TCP), one file each. udp_baseline.cpp lists the modes
// and runs the one asked for.
#pragma once

#include <netinet/in.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "transport/page_aligned_buffer.h"

namespace uroce::bench {

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

// Prints what is wrong and the usage, then exits with status 2.
[[noreturn]] void usage_error(const std::string& why);
// Prints `what` and errno's text, then exits with status 1.
[[noreturn]] void die(const char* what);
// rtt, rtt-ack, rtt-train and rtt-wake: ping-pongs of --size byte messages.
bool is_rtt(const Options& o);
// The command line (udp_baseline.cpp); exits with the usage on anything wrong.
Options parse_args(int argc, char** argv);

// ---- sockets and clocks (udp_sockets.cpp) ----

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
Fd socket_in(const std::string& netns, int type);
sockaddr_in make_addr(const std::string& ip, std::uint16_t port);
void bind_to(int fd, sockaddr_in addr);
sockaddr_in local_addr(int fd);
void connect_to(int fd, sockaddr_in addr);
void set_int(int fd, int level, int name, int value, const char* what);
void set_timeout(int fd, int name, std::chrono::microseconds t);
// Pins the calling thread to `cpu` (-1: leaves it alone).
void pin_to(int cpu);
double cpu_seconds();
double seconds_between(Clock::time_point a, Clock::time_point b);
std::chrono::nanoseconds to_duration(double s);
// One recvmsg with a UDP_GRO control message: returns the byte count (or -1 with errno) and
// sets *seg_size to the size of the coalesced segments (the whole read when not coalesced).
ssize_t recv_gro(int fd, void* buf, std::size_t len, int flags, std::size_t* seg_size);
// One send of `len` bytes cut into GSO segments of `gso` bytes, given for this call (0: the
// socket's UDP_SEGMENT, if any).
ssize_t send_segments(int fd, const char* data, std::size_t len, std::uint16_t gso, int flags);

// The two UDP sockets of a mode: A (sender / ping) and B (receiver / pong), each connected to
// the other.
struct UdpPair {
    Fd a;
    Fd b;
};

UdpPair make_udp_pair(const Options& o);

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

// ---- throughput: gso, sendto, pps (udp_stream.cpp) ----

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

Tput run_udp_tput(const Options& o, Stream stream);
void print_tput(const Options& o, const Tput& t, Stream stream);

// ---- ping-pong: rtt, gso-pingpong (udp_pingpong.cpp) ----

// Where a ping-pong sends a 20-byte datagram (the ACK) with each message.
enum class AckDatagram { None, Before, Behind };

struct PingResult {
    std::vector<double> us;  // one figure per measured iteration that completed
    std::uint64_t lost = 0;  // iterations that timed out (measured and warm-up)
    bool complete = true;
};

PingResult run_pingpong(const Options& o, std::size_t msg, std::size_t seg, AckDatagram ack,
                        bool rc_work = false);
PingResult run_wake_pingpong(const Options& o);
void print_pingpong(const Options& o, PingResult r, std::size_t msg, std::size_t seg);

// ---- tcp (tcp_stream.cpp) ----

void run_tcp(const Options& o);

}  // namespace uroce::bench
