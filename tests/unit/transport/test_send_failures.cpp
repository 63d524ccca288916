// A packet the host cannot send never vanishes silently: a request larger than the IP MTU
// of its route fails at once with a local QP operation error (as rxe reports a send that
// fails for good) instead of being retransmitted until the retry counter runs out.
//
// The small MTU is real: the test runs its engines in a network namespace of its own whose
// loopback MTU is below the path MTU, so the kernel refuses the datagrams with EMSGSIZE.
// A namespace needs CAP_SYS_ADMIN (root), as the rest of the suite does.
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/uc_pair.h"
#include "transport/transmit_batch.h"

using namespace uroce::transport;
using namespace uroce::transport::test;
using namespace std::chrono_literals;

namespace {

// Moves the calling thread (and the threads it starts from now on) into a new network
// namespace whose loopback is up with the given MTU; the destructor moves it back.
class ScopedNetworkNamespace {
  public:
    explicit ScopedNetworkNamespace(int lo_mtu) {
        original_ = ::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
        REQUIRE(original_ >= 0);
        INFO("unshare(CLONE_NEWNET): " << std::strerror(errno) << " (needs root)");
        REQUIRE(::unshare(CLONE_NEWNET) == 0);
        const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        REQUIRE(fd >= 0);
        ifreq ifr{};
        std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
        ifr.ifr_mtu = lo_mtu;
        const bool mtu_set = ::ioctl(fd, SIOCSIFMTU, &ifr) == 0;
        ifr.ifr_flags = IFF_UP | IFF_LOOPBACK | IFF_RUNNING;
        const bool up = ::ioctl(fd, SIOCSIFFLAGS, &ifr) == 0;
        ::close(fd);
        REQUIRE(mtu_set);
        REQUIRE(up);
    }
    ~ScopedNetworkNamespace() {
        if (original_ >= 0) {
            ::setns(original_, CLONE_NEWNET);
            ::close(original_);
        }
    }
    ScopedNetworkNamespace(const ScopedNetworkNamespace&) = delete;
    ScopedNetworkNamespace& operator=(const ScopedNetworkNamespace&) = delete;

  private:
    int original_ = -1;
};

}  // namespace

TEST_CASE("A request larger than the route's IP MTU fails at once with LOC_QP_OP_ERR",
          "[send_failures]") {
    static_assert(kMtu == 1024);
    // 1024 payload bytes + headers (IP 20, UDP 8, BTH 12, ICRC 4) do not fit in 1000; ACKs
    // and small requests do.
    ScopedNetworkNamespace netns(1000);
    PairOptions o;
    o.mem_bytes = 128 * 1024;
    Pair p(o);
    p.connect();

    SECTION("a small WRITE still goes through") {
        fill(p.a.at(0), 256, 1);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, 256)},
                                           p.b.iova + 1000, p.b.keys.rkey)) == 0);
        const Completion c = p.wait_one(*p.a.scq);
        CHECK(c.status == WcStatus::Success);
        CHECK(first_mismatch(p.b.at(1000), 256, 1) == 256);
        CHECK(p.a.counters().tx_too_big.load() == 0);
    }

    SECTION("a WRITE of full-MTU packets fails without a retransmission") {
        fill(p.a.at(0), 4096, 2);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 2, {p.a.sge(0, 4096)},
                                           p.b.iova + 8192, p.b.keys.rkey)) == 0);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 3, {p.a.sge(0, 16)},
                                           p.b.iova + 16384, p.b.keys.rkey)) == 0);
        const auto done = p.wait(*p.a.scq, 2);
        REQUIRE(done.size() == 2);
        CHECK(done[0].wr_id == 2);
        CHECK(done[0].status == WcStatus::LocQpOpErr);
        CHECK(done[1].wr_id == 3);
        CHECK(done[1].status == WcStatus::WrFlushErr);
        CHECK(p.a.qp->state() == QpState::Err);
        CHECK(p.a.counters().tx_too_big.load() == 1);
        CHECK(p.a.counters().retransmit_timeouts.load() == 0);
        CHECK(all_bytes(p.b.at(8192), 4096 + 8192, kUntouched));
    }

    SECTION("a WRITE longer than a transmit batch fails once, nothing after it leaves") {
        // 80 packets: the batch is sent when full, its first train refused; the packets
        // after it must not fill a new batch (they are too big as well: tx_too_big says).
        constexpr uint32_t kLong = 80 * kMtu;
        static_assert(kLong / kMtu > TransmitBatch::kMaxPackets);
        fill(p.a.at(0), kLong, 3);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 7, {p.a.sge(0, kLong)}, p.b.iova,
                                           p.b.keys.rkey)) == 0);
        const Completion c = p.wait_one(*p.a.scq);
        CHECK(c.wr_id == 7);
        CHECK(c.status == WcStatus::LocQpOpErr);
        CHECK(p.a.qp->state() == QpState::Err);
        CHECK(p.a.counters().tx_too_big.load() == 1);
        CHECK(p.a.counters().retransmit_timeouts.load() == 0);
    }

    SECTION("a SEND of full-MTU packets (one GSO train) fails the same way") {
        // SEND FIRST is as long as a MIDDLE: the four packets form one train, which the
        // kernel refuses as a whole (EINVAL); sent one by one, the first one fails.
        fill(p.a.at(0), 4096, 4);
        REQUIRE(p.b.qp->post_recv(recv_wqe(5, {p.b.sge(8192, 4096)})) == 0);
        REQUIRE(p.a.qp->post_send(send_wqe(6, {p.a.sge(0, 4096)})) == 0);
        const Completion c = p.wait_one(*p.a.scq);
        CHECK(c.wr_id == 6);
        CHECK(c.status == WcStatus::LocQpOpErr);
        CHECK(p.a.qp->state() == QpState::Err);
        CHECK(p.a.counters().tx_gso_fallbacks.load() == 1);
        CHECK(p.a.counters().tx_too_big.load() == 1);
        // Refused alone too: the QP's path MTU is at fault, not GSO, which the engine's
        // other QPs keep.
        CHECK(p.a.engine->gso_enabled());
        CHECK(p.a.counters().retransmit_timeouts.load() == 0);
        CHECK(all_bytes(p.b.at(8192), 4096, kUntouched));
    }

    SECTION("a UC WRITE of full-MTU packets fails the same way, and its QP with it") {
        // UC sends each packet alone, with no retransmission to fall back on: a message the
        // host refuses must not complete as sent.
        UcPair uc(p);
        fill(p.a.at(0), 4096, 8);
        REQUIRE(uc.a->post_send(rdma_wqe(SendOpcode::RdmaWrite, 8, {p.a.sge(0, 256)},
                                         p.b.iova + 1000, p.b.keys.rkey)) == 0);
        REQUIRE(uc.a->post_send(rdma_wqe(SendOpcode::RdmaWrite, 9, {p.a.sge(0, 4096)},
                                         p.b.iova + 8192, p.b.keys.rkey)) == 0);
        REQUIRE(uc.a->post_send(rdma_wqe(SendOpcode::RdmaWrite, 10, {p.a.sge(0, 16)},
                                         p.b.iova + 16384, p.b.keys.rkey)) == 0);
        const auto done = p.wait(*p.a.scq, 3);
        REQUIRE(done.size() == 3);
        CHECK(done[0].wr_id == 8);
        CHECK(done[0].status == WcStatus::Success);
        CHECK(done[1].wr_id == 9);
        CHECK(done[1].status == WcStatus::LocQpOpErr);
        CHECK(done[2].wr_id == 10);
        CHECK(done[2].status == WcStatus::WrFlushErr);
        CHECK(uc.a->state() == QpState::Err);
        CHECK(p.a.counters().tx_too_big.load() == 1);
        // The small WRITE arrives (UC completes at the sender once sent); nothing of the
        // refused one or the flushed one does.
        const auto deadline = std::chrono::steady_clock::now() + kWait;
        while (!landed(p.b.at(1000), 256, 8) && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(1ms);
        CHECK(landed(p.b.at(1000), 256, 8));
        CHECK(all_bytes(p.b.at(8192), 4096 + 8192 + 16, kUntouched));
    }
}

// A socket buffer that is full (EAGAIN) never stalls the QP and never loses a message: the
// packet is counted (tx_dropped_full) and recovered like a loss on the wire. The buffer is
// made to fill for real: a token-bucket qdisc on the namespace's loopback holds packets (so
// they stay charged to the sending socket) and the QP's socket gets the smallest buffer the
// kernel allows.
TEST_CASE("A full socket buffer is counted and recovered, never a silent loss", "[send_failures]") {
    ScopedNetworkNamespace netns(65536);
    // The child of system() runs in this thread's namespace.
    REQUIRE(std::system("tc qdisc add dev lo root tbf rate 8kbit burst 1600 limit 1000000") == 0);
    Pair p;
    QpAttributes attrs = default_attributes();
    // ~268 ms: eight timeouts (retry_cnt 7), over 2 s, to lift the congestion (two
    // fork+execs of tc on a busy machine), which 67 ms left at about half a second.
    attrs.timeout = 16;
    p.connect(attrs, attrs);
    const int fd = p.a.engine->sender_for_qpn(p.a.qp->qpn()).fd();
    const int tiny = 1;  // rounded up to the kernel's minimum (a few KiB)
    REQUIRE(::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &tiny, sizeof tiny) == 0);

    constexpr uint32_t kLen = 32 * kMtu;
    fill(p.a.at(0), kLen, 9);
    SendWqe w =
        rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, kLen)}, p.b.iova + 4096, p.b.keys.rkey);
    w.signaled = true;
    REQUIRE(p.a.qp->post_send(w) == 0);
    const bool filled = p.wait_until([&] { return p.a.counters().tx_dropped_full.load() > 0; }, 5s);
    // Lift the congestion (its queued packets go with the qdisc) and restore the buffer.
    const int lifted = std::system("tc qdisc del dev lo root");
    const int normal = 4 << 20;
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &normal, sizeof normal);
    REQUIRE(filled);
    REQUIRE(lifted == 0);

    const Completion c = p.wait_one(*p.a.scq);
    CHECK(c.status == WcStatus::Success);
    CHECK(first_mismatch(p.b.at(4096), kLen, 9) == kLen);
    CHECK(p.a.qp->state() == QpState::Rts);
    CHECK(p.a.counters().retransmitted_packets.load() > 0);
    CHECK(p.a.counters().tx_too_big.load() == 0);
}
