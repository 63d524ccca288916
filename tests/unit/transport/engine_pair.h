// Test fixture for the RC engine without libibverbs: two Engines on two loopback
// addresses, one RcQp on each, memory registered straight in each engine's MemoryTable,
// plus small builders for work requests. Shared by the transport unit tests.
//
// Every wait is bounded in time and every loop in count. The test thread also calls
// Engine::progress() while it waits, so packets are received both there and on the engine
// threads.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/transport/scratch_dir.h"
#include "transport/completion_queue.h"
#include "transport/engine.h"
#include "transport/psn.h"
#include "transport/rc_qp.h"

namespace uroce::transport::test {

using namespace std::chrono_literals;

inline constexpr uint32_t kPd = 7;
inline constexpr uint32_t kMtu = 1024;
inline constexpr auto kWait = 20s;  // for things that take milliseconds when all is well

inline IpAddress ipv4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    return IpAddress::v4(a << 24 | b << 16 | c << 8 | d);
}

// Addresses unique to this process (third octet and port from the pid) and to each pair
// of engines it creates (fourth octet), so that concurrent test runs and consecutive test
// cases never share a socket address.
struct Addresses {
    IpAddress a;
    IpAddress b;
    uint16_t port;
};

inline Addresses next_addresses() {
    static std::atomic<uint32_t> pairs{0};
    const auto pid = static_cast<uint32_t>(::getpid());
    const uint32_t n = pairs.fetch_add(1) % 127;
    return {ipv4(127, 0, 1 + pid % 254, 2 * n + 1), ipv4(127, 0, 1 + pid % 254, 2 * n + 2),
            static_cast<uint16_t>(20000 + pid % 20000)};
}

inline uint8_t pattern(uint64_t seed, uint64_t i) {
    uint64_t x = (seed + 1) * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    x *= 0x94d049bb133111ebull;
    return static_cast<uint8_t>(x >> 56);
}

inline void fill(uint8_t* p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; ++i) p[i] = pattern(seed, i);
}

// Index of the first byte of p[0..n) that differs from the pattern, or n.
inline size_t first_mismatch(const uint8_t* p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; ++i)
        if (p[i] != pattern(seed, i)) return i;
    return n;
}

// Whether p[0..n) shows the pattern yet: a target that spins on its memory for a WRITE, as an
// RDMA application may, reads bytes while the engine writes them. Such a read races the write
// by design (nothing but the bytes tells it they came), so the ThreadSanitizer build's
// suppressions (tests/tsan.supp) name this function; checks after a completion use
// first_mismatch, which they do not name. Kept whole, so that it shows in every stack: not
// inlined, and (g++'s noipa) its reads not moved into the caller, which g++ does for a
// pointer only read through.
#if defined(__clang__)
#define UROCE_TEST_KEPT_WHOLE __attribute__((noinline))
#else
#define UROCE_TEST_KEPT_WHOLE __attribute__((noipa))
#endif
UROCE_TEST_KEPT_WHOLE inline bool landed(const uint8_t* p, size_t n, uint64_t seed) {
    return first_mismatch(p, n, seed) == n;
}

// The same for one byte: whether *p equals `value` yet.
UROCE_TEST_KEPT_WHOLE inline bool landed_byte(const uint8_t* p, uint8_t value) {
    return *p == value;
}

inline bool all_bytes(const uint8_t* p, size_t n, uint8_t value) {
    return std::all_of(p, p + n, [value](uint8_t b) { return b == value; });
}

inline constexpr uint8_t kUntouched = 0xee;

// An allocator that puts guard zones of a known pattern before and after every block. A
// Side's memory region uses it: an access that a broken bounds check lets run past the region
// lands in a guard zone, where the Pair's destructor finds it, instead of corrupting the
// test's heap (which can hang the binary rather than fail a check).
template <class T>
struct GuardedAllocator {
    using value_type = T;
    static constexpr size_t kGuard = 16 * 1024;
    static constexpr uint8_t kGuardByte = 0xa7;
    GuardedAllocator() = default;
    template <class U>
    GuardedAllocator(const GuardedAllocator<U>&) {}
    T* allocate(size_t n) {
        auto* raw = static_cast<uint8_t*>(::operator new(n * sizeof(T) + 2 * kGuard));
        std::memset(raw, kGuardByte, kGuard);
        std::memset(raw + kGuard + n * sizeof(T), kGuardByte, kGuard);
        return reinterpret_cast<T*>(raw + kGuard);
    }
    void deallocate(T* p, size_t) { ::operator delete(reinterpret_cast<uint8_t*>(p) - kGuard); }
    // Whether both guard zones of the block [p, p + n) still hold the pattern.
    static bool guards_intact(const T* p, size_t n) {
        const auto* before = reinterpret_cast<const uint8_t*>(p) - kGuard;
        const auto* after = reinterpret_cast<const uint8_t*>(p + n);
        auto intact = [](const uint8_t* g) {
            return std::all_of(g, g + kGuard, [](uint8_t b) { return b == kGuardByte; });
        };
        return intact(before) && intact(after);
    }
    template <class U>
    bool operator==(const GuardedAllocator<U>&) const {
        return true;
    }
};
using GuardedBytes = std::vector<uint8_t, GuardedAllocator<uint8_t>>;

struct Side {
    IpAddress ip;
    std::unique_ptr<Engine> engine;
    std::shared_ptr<CompletionQueue> scq;
    std::shared_ptr<CompletionQueue> rcq;
    std::shared_ptr<RcQp> qp;
    GuardedBytes mem;   // the registered region, between guard zones
    uint64_t iova = 0;  // remote address of mem[0]
    MemoryKeys keys;

    uint64_t addr(size_t offset) { return reinterpret_cast<uint64_t>(mem.data() + offset); }
    uint8_t* at(size_t offset) { return mem.data() + offset; }
    Sge sge(size_t offset, uint32_t length) { return Sge{addr(offset), length, keys.lkey}; }
    EngineCounters& counters() { return engine->counters(); }

    // Affiliated asynchronous events, recorded on the engine thread.
    std::mutex events_mutex;
    std::vector<AsyncEvent> events;
    std::vector<AsyncEvent> async_events() {
        std::lock_guard lock(events_mutex);
        return events;
    }
};

struct PairOptions {
    size_t mem_bytes = 64 * 1024;
    FaultConfig faults_a;
    FaultConfig faults_b;
    // More fault rules of a and b, after faults_a / faults_b (fault_plan.h).
    std::vector<FaultConfig> rules_a, rules_b;
    uint32_t cq_capacity = 1024;
    QpCaps caps{512, 512, kMaxSge, kMaxSge, kMaxInlineData};
    // The engines' addresses and port; unset: next_addresses().
    std::optional<Addresses> addresses;
    // EngineConfig::gso / gro of a and b.
    bool gso_a = true, gso_b = true;
    bool gro_a = true, gro_b = true;
    // EngineConfig::inline_progress of a and b.
    bool inline_a = true, inline_b = true;
    // EngineConfig::hold_posts of both.
    bool hold_posts = true;
    // EngineConfig::engine_spin of both.
    bool engine_spin = true;
    // EngineConfig::hold_acks, ack_hold_micros and answer_window_micros of both.
    bool hold_acks = true;
    uint32_t ack_hold_micros = 1000;
    uint32_t answer_window_micros = 1000;
    // EngineConfig::last_ack_repeat_micros of both.
    uint32_t last_ack_repeat_micros = 1'000'000;
    // EngineConfig::adaptive_retransmit of both: off leaves only the local ACK timeout.
    bool adaptive = true;
    // ... and of a alone, where `adaptive` is on: false leaves a only its local ACK timeout
    // (b probes, a never does).
    bool adaptive_a = true;
    // EngineConfig::ecn_capable of both: every packet leaves ECT(0).
    bool ecn = false;
    // EngineConfig::resend_burst of both.
    uint32_t resend_burst = ResendBudget::kBurst;
    // EngineConfig::selective_recovery and early_request_bytes of both.
    bool selective = true;
    size_t early_bytes = size_t{32} << 20;
    // EngineConfig::pcap_path of a and b (empty: no capture).
    std::string pcap_a, pcap_b;
    // a and b each a device of its own (a slot table in a scratch directory), both listed as
    // this host's devices (EngineConfig::host_devices): an RC answer from one to the other
    // may lead its ACK (Engine::answer_may_lead_ack).
    bool host_peers = false;
    // a and b two contexts of one device: one address and port, one slot table, QPN
    // steering (device sharing: root).
    bool shared_device = false;
};

inline QpAttributes default_attributes() {
    QpAttributes a;
    a.access = kRemoteWrite | kRemoteRead;
    a.mtu = kMtu;
    a.timeout = 14;  // 67 ms
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.min_rnr_timer = 1;  // 10 us
    a.max_rd_atomic = 1;
    a.max_dest_rd_atomic = 1;
    return a;
}

// Takes `qp` from RESET through INIT and RTR to RTS with `attrs`.
inline void bring_up(RcQp& qp, const QpAttributes& attrs) {
    REQUIRE(qp.modify(attrs, QpState::Reset, QpState::Init) == 0);
    REQUIRE(qp.modify(attrs, QpState::Init, QpState::Rtr) == 0);
    REQUIRE(qp.modify(attrs, QpState::Rtr, QpState::Rts) == 0);
}

// Two engines, one QP each, not yet connected.
class Pair {
  public:
    explicit Pair(const PairOptions& opt = {}) {
        Addresses addrs = opt.addresses ? *opt.addresses : next_addresses();
        std::vector<EngineConfig::HostDevice> host;
        if (opt.shared_device) {
            addrs.b = addrs.a;
            host = {{addrs.a, addrs.port, (scratch_dir("uroce-shared") / "slots").string()}};
        } else if (opt.host_peers) {
            const auto dir = scratch_dir("uroce-pair");
            host = {{addrs.a, addrs.port, (dir / "a-slots").string()},
                    {addrs.b, addrs.port, (dir / "b-slots").string()}};
        }
        setup(a, addrs.a, addrs.port, opt.faults_a, opt.rules_a, opt, 0x100000000000ull, opt.gso_a,
              opt.gro_a, opt.inline_a, opt.adaptive && opt.adaptive_a, opt.pcap_a, host);
        setup(b, addrs.b, addrs.port, opt.faults_b, opt.rules_b, opt, 0x200000000000ull, opt.gso_b,
              opt.gro_b, opt.inline_b, opt.adaptive, opt.pcap_b, host);
    }

    ~Pair() {
        // Nothing was written outside the registered regions (GuardedAllocator).
        for (Side* s : {&a, &b})
            CHECK(GuardedAllocator<uint8_t>::guards_intact(s->mem.data(), s->mem.capacity()));
        // QPs go before their engines: their timers belong to the engines' event bases.
        for (Side* s : {&a, &b}) {
            if (s->engine && s->qp) s->engine->detach(s->qp->qpn());
            s->qp.reset();
        }
        for (Side* s : {&a, &b}) s->engine.reset();
    }
    Pair(const Pair&) = delete;
    Pair& operator=(const Pair&) = delete;

    // RESET -> INIT -> RTR -> RTS on both sides; `pa` and `pb` are the attributes of a and b
    // (addresses and QP numbers are filled in here).
    void connect(QpAttributes pa, QpAttributes pb) {
        pa.dst_ip = b.ip;
        pa.dest_qpn = b.qp->qpn();
        pb.dst_ip = a.ip;
        pb.dest_qpn = a.qp->qpn();
        // What one side sends first is what the other expects first.
        pb.rq_psn = pa.sq_psn;
        pa.rq_psn = pb.sq_psn;
        for (auto [s, attrs] : {std::pair{&a, pa}, std::pair{&b, pb}}) {
            REQUIRE(s->qp->modify(attrs, QpState::Reset, QpState::Init) == 0);
            REQUIRE(s->qp->state() == QpState::Init);
            REQUIRE(s->qp->modify(attrs, QpState::Init, QpState::Rtr) == 0);
            REQUIRE(s->qp->state() == QpState::Rtr);
        }
        for (auto [s, attrs] : {std::pair{&a, pa}, std::pair{&b, pb}}) {
            REQUIRE(s->qp->modify(attrs, QpState::Rtr, QpState::Rts) == 0);
            REQUIRE(s->qp->state() == QpState::Rts);
        }
    }
    void connect() { connect(default_attributes(), default_attributes()); }

    // What a poll of an empty CQ does, on both engines: sends the posts held for it
    // (held_posts.h) and receives on this thread whatever has arrived.
    void progress() {
        for (Side* s : {&a, &b}) s->engine->on_cq_poll(true);
    }

    // Polls `cq` until `n` completions have arrived or `timeout` has passed.
    std::vector<Completion> wait(CompletionQueue& cq, size_t n,
                                 std::chrono::milliseconds timeout = kWait) {
        std::vector<Completion> out;
        std::vector<Completion> buf(64);
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        for (long iter = 0; out.size() < n && iter < 10'000'000; ++iter) {
            const size_t want = std::min(buf.size(), n - out.size());
            const size_t got = cq.poll(std::span(buf.data(), want));
            out.insert(out.end(), buf.begin(), buf.begin() + static_cast<ptrdiff_t>(got));
            if (got > 0) continue;
            if (std::chrono::steady_clock::now() > deadline) break;
            progress();
            std::this_thread::sleep_for(50us);
        }
        return out;
    }

    Completion wait_one(CompletionQueue& cq, std::chrono::milliseconds timeout = kWait) {
        auto v = wait(cq, 1, timeout);
        REQUIRE(v.size() == 1);
        return v[0];
    }

    // True if `pred` became true within `timeout`.
    bool wait_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout = kWait) {
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        for (long iter = 0; iter < 10'000'000; ++iter) {
            if (pred()) return true;
            if (std::chrono::steady_clock::now() > deadline) return false;
            progress();
            std::this_thread::sleep_for(50us);
        }
        return pred();
    }

    // Waits a little and checks that nothing more arrives on `cq`.
    bool stays_empty(CompletionQueue& cq, std::chrono::milliseconds how_long = 50ms) {
        wait_until([] { return false; }, how_long);
        return cq.depth() == 0;
    }

    Side a;
    Side b;

  private:
    static void setup(Side& s, const IpAddress& ip, uint16_t port, const FaultConfig& faults,
                      const std::vector<FaultConfig>& more_faults, const PairOptions& opt,
                      uint64_t iova, bool gso, bool gro, bool inline_progress, bool adaptive,
                      const std::string& pcap,
                      const std::vector<EngineConfig::HostDevice>& host_devices) {
        s.ip = ip;
        EngineConfig config;
        config.host_devices = host_devices;
        for (const auto& d : host_devices)
            if (d.ip == ip) config.slot_table = d.slot_table;
        config.ip = ip;
        config.port = port;
        config.mtu = kMtu;
        config.faults = {faults};
        config.faults.insert(config.faults.end(), more_faults.begin(), more_faults.end());
        config.gso = gso;
        config.gro = gro;
        config.inline_progress = inline_progress;
        config.adaptive_retransmit = adaptive;
        config.ecn_capable = opt.ecn;
        config.hold_posts = opt.hold_posts;
        config.engine_spin = opt.engine_spin;
        config.hold_acks = opt.hold_acks;
        config.ack_hold_micros = opt.ack_hold_micros;
        config.answer_window_micros = opt.answer_window_micros;
        config.last_ack_repeat_micros = opt.last_ack_repeat_micros;
        config.resend_burst = opt.resend_burst;
        config.selective_recovery = opt.selective;
        config.early_request_bytes = opt.early_bytes;
        config.pcap_path = pcap;
        std::string error;
        int err = 0;
        s.engine = Engine::create(config, error, err);
        INFO("Engine::create: " << error << " (errno " << err << ")");
        REQUIRE(s.engine);
        s.engine->set_async_handler([&s](const AsyncEvent& ev) {
            std::lock_guard lock(s.events_mutex);
            s.events.push_back(ev);
        });
        s.scq = std::make_shared<CompletionQueue>(opt.cq_capacity, nullptr, nullptr);
        s.rcq = std::make_shared<CompletionQueue>(opt.cq_capacity, nullptr, nullptr);
        s.qp = std::make_shared<RcQp>(*s.engine, s.engine->allocate_qpn(), kPd, opt.caps, s.scq,
                                      s.rcq, &s);
        s.engine->attach(s.qp);
        s.mem.assign(opt.mem_bytes, kUntouched);
        s.iova = iova;
        s.keys = s.engine->memory().add(kPd, s.addr(0), s.mem.size(), iova,
                                        kLocalWrite | kRemoteWrite | kRemoteRead);
    }
};

inline uint32_t total(std::initializer_list<Sge> sges) {
    uint32_t n = 0;
    for (const Sge& s : sges) n += s.length;
    return n;
}

inline SgeList sgl(std::initializer_list<Sge> sges) {
    SgeList l;
    for (const Sge& s : sges) l.sge[l.count++] = s;
    return l;
}

inline SendWqe send_wqe(uint64_t wr_id, std::initializer_list<Sge> sges) {
    SendWqe w;
    w.wr_id = wr_id;
    w.opcode = SendOpcode::Send;
    w.sgl = sgl(sges);
    w.length = total(sges);
    return w;
}

inline SendWqe rdma_wqe(SendOpcode op, uint64_t wr_id, std::initializer_list<Sge> sges,
                        uint64_t remote_addr, uint32_t rkey) {
    SendWqe w = send_wqe(wr_id, sges);
    w.opcode = op;
    w.remote_addr = remote_addr;
    w.rkey = rkey;
    return w;
}

inline RecvWqe recv_wqe(uint64_t wr_id, std::initializer_list<Sge> sges) {
    RecvWqe r;
    r.wr_id = wr_id;
    r.sgl = sgl(sges);
    return r;
}

// Polls `e` as a busy poller polls an empty CQ (Engine::on_cq_poll), back to back, until
// `done` or `limit` has passed.
template <typename Done>
bool busy_poll(Engine& e, Done done, std::chrono::milliseconds limit = kWait) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    for (long i = 0; i < 2'000'000'000L; ++i) {
        if (done()) return true;
        e.on_cq_poll(true);
        if ((i & 255) == 0 && std::chrono::steady_clock::now() > deadline) return false;
    }
    return done();
}

// True once `pred` holds, within `timeout`; polls nothing (the engine threads read).
inline bool eventually(const std::function<bool()>& pred,
                       std::chrono::milliseconds timeout = kWait) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!pred()) {
        if (std::chrono::steady_clock::now() > deadline) return false;
        std::this_thread::sleep_for(50us);
    }
    return true;
}

// An engine for `config`; fails the test if it cannot be made.
inline std::unique_ptr<Engine> make_engine(const EngineConfig& config) {
    std::string error;
    int err = 0;
    auto e = Engine::create(config, error, err);
    INFO("Engine::create: " << error << " (errno " << err << ")");
    REQUIRE(e);
    return e;
}

// Runs `body` once with `e`'s socket parked by busy polls and `e`'s engine thread held still
// (its fork gate), so that nothing but the test's own polls reads the socket. Parking and
// taking the gate are two steps: a test thread held off the CPU for a watch period between
// them (an ASan build on a loaded machine) finds the socket handed back, and tries again.
template <class Body>
void parked_and_gated(Engine& e, Body body) {
    for (int attempt = 0; attempt < 100; ++attempt) {
        REQUIRE(busy_poll(e, [&] { return e.socket_parked(); }));
        const auto gate = e.fork_gate().pass();
        if (!e.socket_parked()) continue;
        body();
        return;
    }
    FAIL("the socket was handed back before the fork gate was taken, 100 times");
}

// ACKs held for the application's answer up to `hold_micros` (by default never released by
// time), the QPs within the answer window for the whole test however slow the machine, and
// no adaptive retransmission: only what a test does releases a held ACK.
inline PairOptions holding_acks(uint32_t hold_micros = 60'000'000) {
    PairOptions o;
    o.ack_hold_micros = hold_micros;
    o.answer_window_micros = 60'000'000;
    o.adaptive = false;
    return o;
}

// Inside parked_and_gated(b): a SENDs `len` bytes of pattern `seed` (from a's memory at 0)
// into a receive posted on b at offset `at`; b's polls read it (its ACK may then be held for
// b's answer). Checks the completion and the data.
inline void polled_request(Pair& p, uint64_t seed, uint32_t at = 4096, uint32_t len = 64) {
    REQUIRE(p.b.engine->socket_parked());
    REQUIRE(p.b.qp->post_recv(recv_wqe(seed, {p.b.sge(at, len)})) == 0);
    fill(p.a.at(0), len, seed);
    REQUIRE(p.a.qp->post_send(send_wqe(seed, {p.a.sge(0, len)})) == 0);
    Completion c;
    REQUIRE(busy_poll(*p.b.engine, [&] { return p.b.rcq->poll(std::span(&c, 1)) == 1; }));
    CHECK(c.wr_id == seed);
    CHECK(c.status == WcStatus::Success);
    CHECK(first_mismatch(p.b.at(at), len, seed) == len);
}

// Inside parked_and_gated(b): b posts a WRITE of `len` bytes (its memory at `from`, pattern
// `wr_id`) to a's memory at offset `to`, which b's next poll sends; with a's engine thread
// held still by its fork gate, a reads nothing, so the WRITE stays in flight while `body`
// runs. b's posts then wait for b's next poll even where they answer a request of a's (an
// answer with nothing in flight leaves at once: RcQp::may_wait).
template <class Body>
void with_b_write_in_flight(Pair& p, uint64_t wr_id, uint32_t from, uint32_t to, uint32_t len,
                            Body body) {
    const auto a_gate = p.a.engine->fork_gate().pass();
    fill(p.b.at(from), len, wr_id);
    REQUIRE(p.b.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, wr_id, {p.b.sge(from, len)},
                                       p.a.iova + to, p.a.keys.rkey)) == 0);
    body();
}

inline bool has_event(Side& s, AsyncEventType type) {
    for (const AsyncEvent& e : s.async_events())
        if (e.type == type && e.qp_handle == &s) return true;
    return false;
}

}  // namespace uroce::transport::test
