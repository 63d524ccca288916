// Test scaffolding for the integration tests: real devices made by the real `uroce` command,
// the real libibverbs loading the real provider, real UDP on loopback.
#pragma once

#include <infiniband/verbs.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace uroce::test {

// Devices registered for this test process (see test_main.cpp).
struct TestDevices {
    std::string a, b, c;           // names
    std::string ip_a, ip_b, ip_c;  // their addresses
    uint16_t port = 4791;
};
const TestDevices& devices();

// Runs `uroce ARGS` and returns its exit status (output discarded unless `out` is given).
int run_uroce(const std::vector<std::string>& args, std::string* out = nullptr);

ibv_context* open_device(const std::string& name);
// Opens the device `name` with the environment variable `var` set to `value` for the call
// only, closes it again, and returns 0 if it opened, else ibv_open_device's errno.
int open_errno_with_env(const std::string& name, const char* var, const char* value);

// Reads one of the provider's counters (uroce_read_counter through dlsym).
uint64_t counter(ibv_context* ctx, const char* name);
// Waits (at most 5 s) until counter `name` of ctx reaches `want`; false if it did not. For
// packets another engine thread counts: it may run later than the test thread reads.
bool wait_counter(ibv_context* ctx, const char* name, uint64_t want);
// Reads a counter of the whole device of `ctx`: every context, every process
// (uroce_read_device_counter).
uint64_t device_counter(ibv_context* ctx, const char* name);
// Reads a counter of one QP (uroce_read_qp_counter).
uint64_t qp_counter(ibv_qp* qp, const char* name);

struct QpOptions {
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    uint8_t timeout = 14;
    uint8_t retry_cnt = 7;
    uint8_t rnr_retry = 7;
    uint8_t min_rnr_timer = 1;
    uint32_t max_send_wr = 256;
    uint32_t max_recv_wr = 256;
    ibv_mtu mtu = IBV_MTU_4096;
};

// One side of a connection: context, PD, CQ (shared by send and receive), RC QP.
struct Endpoint {
    ibv_context* ctx = nullptr;
    ibv_pd* pd = nullptr;
    ibv_cq* cq = nullptr;
    ibv_qp* qp = nullptr;
    ibv_comp_channel* channel = nullptr;
    ibv_gid gid{};

    explicit Endpoint(const std::string& device, const QpOptions& opt = {},
                      bool with_channel = false);
    ~Endpoint();
    Endpoint(const Endpoint&) = delete;
    Endpoint& operator=(const Endpoint&) = delete;

    ibv_qp_state state();
};

// A QP of `type` on `ep`'s PD and CQ made by ibv_create_qp_ex with the ibv_wr_* operations
// `ops` (IBV_QP_EX_WITH_...), `depth` send and receive WRs, `sges` SGEs each; nullptr (errno
// set) if refused. The caller destroys it.
ibv_qp* create_qp_ex(Endpoint& ep, ibv_qp_type type, uint64_t ops, uint32_t depth = 64,
                     uint32_t sges = 4);

// INIT -> RTR -> RTS on both sides, each pointing at the other.
void connect(Endpoint& a, Endpoint& b, const QpOptions& opt = {});
void to_rts(Endpoint& local, uint32_t remote_qpn, const ibv_gid& remote_gid, const QpOptions& opt);
void to_rts(ibv_qp* qp, uint32_t remote_qpn, const ibv_gid& remote_gid, const QpOptions& opt);

// Polls until `n` completions arrived or `limit` passed; returns what arrived.
std::vector<ibv_wc> wait_completions(ibv_cq* cq, size_t n,
                                     std::chrono::milliseconds limit = std::chrono::seconds(20));

// Bounded event waits. ibv_get_cq_event and ibv_get_async_event block without a time limit:
// one missing event would hang the whole test binary. These poll() the fd for at most
// `limit`, then read with the fd non-blocking (its flags restored after), so they never block
// longer than `limit`. They return what the libibverbs call returns, or -1 with errno
// ETIMEDOUT when nothing arrived in time.
constexpr std::chrono::milliseconds kEventLimit = std::chrono::seconds(5);
bool wait_readable(int fd, std::chrono::milliseconds limit);
int get_cq_event_within(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context,
                        std::chrono::milliseconds limit = kEventLimit);
int get_async_event_within(ibv_context* ctx, ibv_async_event* event,
                           std::chrono::milliseconds limit = kEventLimit);

// A registered buffer.
struct Buffer {
    std::vector<uint8_t> bytes;
    ibv_mr* mr = nullptr;
    Buffer(ibv_pd* pd, size_t size, int access);
    ~Buffer();
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    uint64_t addr() const { return reinterpret_cast<uint64_t>(bytes.data()); }
};

// A registered region of whole pages that can lose them while registered. vanish() replaces
// them with an inaccessible reservation: to uroce that is what munmap() is (a fault on
// access, app_memory_guard.h), and nothing else of the process can be mapped there while the
// test runs. The destructor deregisters the region, then unmaps the range.
struct VanishingRegion {
    uint8_t* base = nullptr;
    size_t size = 0;
    ibv_mr* mr = nullptr;
    VanishingRegion(ibv_pd* pd, size_t bytes, int access);  // bytes: a multiple of the page
    ~VanishingRegion();
    VanishingRegion(const VanishingRegion&) = delete;
    VanishingRegion& operator=(const VanishingRegion&) = delete;
    void vanish();
    uint64_t addr() const { return reinterpret_cast<uint64_t>(base); }
};

int post_rdma(ibv_qp* qp, ibv_wr_opcode op, const Buffer& local, size_t offset, size_t len,
              uint64_t remote_addr, uint32_t rkey, uint64_t wr_id, bool signaled = true);
int post_send_msg(ibv_qp* qp, const Buffer& local, size_t offset, size_t len, uint64_t wr_id,
                  bool signaled = true);
int post_recv_buf(ibv_qp* qp, const Buffer& local, size_t offset, size_t len, uint64_t wr_id);
// The same at any address and key (memory that is not a Buffer, as a VanishingRegion).
int post_rdma_at(ibv_qp* qp, ibv_wr_opcode op, uint64_t addr, uint32_t len, uint32_t lkey,
                 uint64_t remote_addr, uint32_t rkey, uint64_t wr_id, bool signaled = true);
int post_recv_at(ibv_qp* qp, uint64_t addr, uint32_t len, uint32_t lkey, uint64_t wr_id);
// A signaled Compare & Swap or Fetch & Add whose result lands at `offset` in `local`.
int post_atomic(ibv_qp* qp, ibv_wr_opcode op, const Buffer& local, size_t offset,
                uint64_t remote_addr, uint32_t rkey, uint64_t compare_add, uint64_t swap,
                uint64_t wr_id, uint32_t length = 8);

void fill_pattern(uint8_t* p, size_t n, uint64_t seed);

// Whether at[0..n) equals want[0..n) yet, read through volatile: a poll of memory a WRITE
// lands in with no completion on this side, as an RDMA target may spin on its memory. Its
// reads race the provider's copy by design; the ThreadSanitizer build's suppressions
// (tests/tsan.supp) name this function.
bool bytes_landed(const uint8_t* at, const uint8_t* want, size_t n);

}  // namespace uroce::test
