// rc_verify's parts (rc_verify.cpp says what the tool does): options and logging, the data
// patterns, the out-of-band TCP exchange, the verbs set-up, and the two roles.
#pragma once

#include <infiniband/verbs.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rc_verify {

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

// The role logging names ("rc_verify client" / "rc_verify server").
extern const char* g_role;

void logf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
[[noreturn]] void die(int code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
double seconds_since(Clock::time_point t);
// The command line; exits with kExitUsage on anything wrong.
Options parse_options(int argc, char** argv);

// ---- data patterns and guards (rc_verify_verbs.cpp) ----

// Fresh bytes for iteration `iter`: a different stream for every iteration and seed.
void fill_data(uint8_t* p, size_t n, uint64_t seed, uint64_t iter);
// What a READ buffer holds before the READ lands: depends on the offset only, so untouched
// stretches are recognisable.
uint8_t canary(size_t off);
void fill_canary(uint8_t* p, size_t n);
bool guard_intact(const uint8_t* p, size_t n);

// ---- TCP out of band (rc_verify_oob.cpp) ----

// One line-oriented TCP connection (the out-of-band exchange); closes its fd.
class LineChannel {
  public:
    explicit LineChannel(int fd) : fd_(fd) {}
    ~LineChannel();
    LineChannel(const LineChannel&) = delete;
    LineChannel& operator=(const LineChannel&) = delete;

    bool send_line(const std::string& s);
    // 1: a line; 0: timeout; -1: peer closed or error.
    int recv_line(std::string& out, int timeout_ms);
    // Waits up to `seconds` for a line (heartbeats and all).
    bool recv_line_within(std::string& out, double seconds);

  private:
    int fd_;
    std::string buf_;
};

int tcp_listen_accept(int port, double wait_s);
int tcp_connect(const std::string& host, int port, double wait_s);

struct PeerInfo {
    uint32_t qpn = 0;
    uint32_t psn = 0;
    ibv_gid gid{};
    uint32_t rkey = 0;
    uint64_t addr = 0;
    uint64_t len = 0;
    int rd_atomic = 0;
};

std::string format_peer(const PeerInfo& p);
bool parse_peer(const std::string& line, PeerInfo& p);

// ---- verbs set-up (rc_verify_verbs.cpp) ----

ibv_mtu mtu_enum(int mtu);
int mtu_bytes(ibv_mtu m);
const char* qp_state_name(ibv_qp_state s);
std::string gid_text(const ibv_gid& g);

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

void open_verbs(const Options& o, Verbs& v, unsigned send_wrs);
ibv_mr* reg(Verbs& v, void* p, size_t n, int access);
void connect_qp(const Options& o, Verbs& v, const PeerInfo& local, const PeerInfo& remote,
                int max_rd_atomic, int max_dest_rd_atomic);
std::string qp_state_now(Verbs& v);
// Drains the async event queue without blocking; returns how many events there were.
unsigned report_async_events(Verbs& v);
void close_verbs(Verbs& v);
// Polls the CQ; when it is empty, waits up to `wait_ms` for a completion event (or spins,
// with --poll). Returns the number of completions (>= 0) or -1 on a poll error.
int poll_some(Verbs& v, bool busy, ibv_wc* wc, int max, int wait_ms);

// ---- the two roles (rc_verify_client.cpp, rc_verify_server.cpp): exit statuses ----

int run_client(const Options& o);
int run_server(const Options& o);

}  // namespace rc_verify
