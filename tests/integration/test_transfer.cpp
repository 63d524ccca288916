// Bulk data through the whole stack, verified byte for byte.
#include <arpa/inet.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <span>

#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;

namespace {

constexpr size_t kMsg = 1 << 20;
constexpr size_t kBatch = 8;  // messages in flight
constexpr size_t kBuf = kMsg * kBatch;
constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

// Moves `total` bytes with `op` from a to b (or, for READ, from b to a) and checks every
// byte. Returns the number of bytes verified.
size_t move_and_verify(Endpoint& a, Endpoint& b, ibv_wr_opcode op, size_t total, uint64_t seed) {
    Buffer src(op == IBV_WR_RDMA_READ ? b.pd : a.pd, kBuf, kAccess);
    Buffer dst(op == IBV_WR_RDMA_READ ? a.pd : b.pd, kBuf, kAccess);
    Buffer& local = op == IBV_WR_RDMA_READ ? dst : src;
    Buffer& remote = op == IBV_WR_RDMA_READ ? src : dst;
    size_t verified = 0;
    for (size_t round = 0; verified < total; ++round) {
        fill_pattern(src.bytes.data(), kBuf, seed + round);
        std::memset(dst.bytes.data(), 0, kBuf);
        for (size_t i = 0; i < kBatch; ++i) {
            if (op == IBV_WR_SEND) REQUIRE(post_recv_buf(b.qp, dst, i * kMsg, kMsg, 1000 + i) == 0);
            const int rc = op == IBV_WR_SEND
                               ? post_send_msg(a.qp, local, i * kMsg, kMsg, i)
                               : post_rdma(a.qp, op, local, i * kMsg, kMsg,
                                           remote.addr() + i * kMsg, remote.mr->rkey, i);
            REQUIRE(rc == 0);
        }
        auto wcs = wait_completions(a.cq, kBatch, std::chrono::seconds(120));
        REQUIRE(wcs.size() == kBatch);
        for (const auto& wc : wcs) {
            INFO("wr_id " << wc.wr_id << " status " << ibv_wc_status_str(wc.status));
            REQUIRE(wc.status == IBV_WC_SUCCESS);
        }
        if (op == IBV_WR_SEND) {
            auto rwcs = wait_completions(b.cq, kBatch, std::chrono::seconds(120));
            REQUIRE(rwcs.size() == kBatch);
            for (const auto& wc : rwcs) {
                REQUIRE(wc.status == IBV_WC_SUCCESS);
                REQUIRE(wc.opcode == IBV_WC_RECV);
                REQUIRE(wc.byte_len == kMsg);
            }
        }
        REQUIRE(std::memcmp(src.bytes.data(), dst.bytes.data(), kBuf) == 0);
        verified += kBuf;
    }
    return verified;
}

// Bytes each bulk test moves: 256 MiB, or $UROCE_TEST_BULK_MIB (meson sets it lower for
// sanitizer builds, whose every byte costs several times more), at least one batch per kind.
size_t bulk_bytes() {
    size_t mib = 256;
    if (const char* env = std::getenv("UROCE_TEST_BULK_MIB"); env && *env) {
        mib = std::strtoul(env, nullptr, 10);
    }
    return std::max(mib << 20, 3 * kBuf);
}

// WRITE, SEND and READ in the proportions 3:2:3 of `total`; returns the bytes verified.
size_t move_all_kinds(Endpoint& a, Endpoint& b, size_t total, uint64_t seed) {
    size_t moved = 0;
    moved += move_and_verify(a, b, IBV_WR_RDMA_WRITE, total / 8 * 3, seed);
    moved += move_and_verify(a, b, IBV_WR_SEND, total / 8 * 2, seed + 1);
    moved += move_and_verify(a, b, IBV_WR_RDMA_READ, total / 8 * 3, seed + 2);
    return moved;
}

void bulk(const QpOptions& opt) {
    Endpoint a(devices().a, opt), b(devices().b, opt);
    connect(a, b, opt);
    const size_t total = bulk_bytes();
    INFO("bulk bytes " << total);
    REQUIRE(move_all_kinds(a, b, total, 1) >= total);
    CHECK(counter(a.ctx, "rx_bad_icrc") == 0);
    CHECK(counter(b.ctx, "rx_bad_icrc") == 0);
    CHECK(a.state() == IBV_QPS_RTS);
    CHECK(b.state() == IBV_QPS_RTS);
}

// The pieces one after another. (Sized once and copied into: GCC 12 at -O3 reports a false
// -Warray-bounds for std::vector::insert of a range here.)
std::vector<uint8_t> concat(std::initializer_list<std::span<const uint8_t>> pieces) {
    size_t total = 0;
    for (auto p : pieces) total += p.size();
    std::vector<uint8_t> out(total);
    auto at = out.begin();
    for (auto p : pieces) at = std::copy(p.begin(), p.end(), at);
    return out;
}

}  // namespace

TEST_CASE("bulk RDMA WRITE, SEND and READ arrive intact", "[transfer]") {
    QpOptions opt;
    bulk(opt);
}

TEST_CASE("bulk data arrives intact with 5% of packets dropped on both sides",
          "[transfer][faults]") {
    ::setenv("UROCE_FAULTS", "drop=0.05,seed=11", 1);
    QpOptions opt;
    opt.timeout = 10;  // ~4 ms: keeps the test short; recovery is what is under test
    Endpoint a(devices().a, opt), b(devices().b, opt);
    ::unsetenv("UROCE_FAULTS");
    connect(a, b, opt);
    const size_t total = bulk_bytes();
    INFO("bulk bytes " << total);
    REQUIRE(move_all_kinds(a, b, total, 4) >= total);
    // The loss really happened and was repaired by the protocol.
    CHECK(counter(a.ctx, "tx_dropped_fault") > 0);
    CHECK(counter(b.ctx, "tx_dropped_fault") > 0);
    CHECK(counter(a.ctx, "retransmitted_packets") > 0);
    CHECK(counter(b.ctx, "rx_out_of_sequence") > 0);
    CHECK(counter(a.ctx, "rx_bad_icrc") == 0);
}

TEST_CASE("Small, inline, multi-SGE and immediate-data messages", "[transfer]") {
    Endpoint a(devices().a), b(devices().b);
    connect(a, b);
    Buffer src(a.pd, 65536, kAccess), dst(b.pd, 65536, kAccess);
    fill_pattern(src.bytes.data(), src.bytes.size(), 42);

    SECTION("inline send up to max_inline_data, buffer reusable at once") {
        ibv_qp_attr attr{};
        ibv_qp_init_attr init{};
        REQUIRE(ibv_query_qp(a.qp, &attr, IBV_QP_CAP, &init) == 0);
        const uint32_t max_inline = attr.cap.max_inline_data;
        REQUIRE(max_inline >= 64);
        REQUIRE(post_recv_buf(b.qp, dst, 0, 4096, 7) == 0);
        std::vector<uint8_t> tmp(src.bytes.begin(), src.bytes.begin() + max_inline);
        ibv_sge sge{reinterpret_cast<uint64_t>(tmp.data()), max_inline, 0};
        ibv_send_wr wr{};
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
        ibv_send_wr* bad = nullptr;
        REQUIRE(ibv_post_send(a.qp, &wr, &bad) == 0);
        std::fill(tmp.begin(), tmp.end(), 0);  // must not matter any more
        REQUIRE(wait_completions(a.cq, 1).at(0).status == IBV_WC_SUCCESS);
        auto r = wait_completions(b.cq, 1);
        REQUIRE(r.size() == 1);
        CHECK(r[0].byte_len == max_inline);
        CHECK(std::memcmp(dst.bytes.data(), src.bytes.data(), max_inline) == 0);
        // One byte more than advertised is refused.
        std::vector<uint8_t> big(max_inline + 1);
        sge = {reinterpret_cast<uint64_t>(big.data()), max_inline + 1, 0};
        CHECK(ibv_post_send(a.qp, &wr, &bad) == EINVAL);
        CHECK(bad == &wr);
    }

    SECTION("multi-SGE send gathers and scatters in order") {
        ibv_sge rs[3] = {{dst.addr() + 100, 10, dst.mr->lkey},
                         {dst.addr() + 2000, 3000, dst.mr->lkey},
                         {dst.addr() + 9000, 5000, dst.mr->lkey}};
        ibv_recv_wr rwr{};
        rwr.sg_list = rs;
        rwr.num_sge = 3;
        ibv_recv_wr* rbad = nullptr;
        REQUIRE(ibv_post_recv(b.qp, &rwr, &rbad) == 0);
        ibv_sge ss[2] = {{src.addr() + 1, 4000, src.mr->lkey},
                         {src.addr() + 30000, 3000, src.mr->lkey}};
        ibv_send_wr wr{};
        wr.sg_list = ss;
        wr.num_sge = 2;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED;
        ibv_send_wr* bad = nullptr;
        REQUIRE(ibv_post_send(a.qp, &wr, &bad) == 0);
        REQUIRE(wait_completions(a.cq, 1).at(0).status == IBV_WC_SUCCESS);
        auto r = wait_completions(b.cq, 1);
        REQUIRE(r.size() == 1);
        REQUIRE(r[0].byte_len == 7000);
        const auto sent = concat({{src.bytes.data() + 1, 4000}, {src.bytes.data() + 30000, 3000}});
        const auto got = concat({{dst.bytes.data() + 100, 10},
                                 {dst.bytes.data() + 2000, 3000},
                                 {dst.bytes.data() + 9000, 3990}});
        CHECK(got == sent);
    }

    SECTION("SEND and RDMA WRITE with immediate deliver the immediate") {
        REQUIRE(post_recv_buf(b.qp, dst, 0, 4096, 1) == 0);
        REQUIRE(post_recv_buf(b.qp, dst, 4096, 4096, 2) == 0);
        ibv_sge sge{src.addr(), 3000, src.mr->lkey};
        ibv_send_wr wr{};
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND_WITH_IMM;
        wr.imm_data = htonl(0xdeadbeef);
        wr.send_flags = IBV_SEND_SIGNALED;
        ibv_send_wr* bad = nullptr;
        REQUIRE(ibv_post_send(a.qp, &wr, &bad) == 0);
        wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        wr.imm_data = htonl(0x01020304);
        wr.wr.rdma.remote_addr = dst.addr() + 20000;
        wr.wr.rdma.rkey = dst.mr->rkey;
        sge.length = 10000;
        REQUIRE(ibv_post_send(a.qp, &wr, &bad) == 0);
        REQUIRE(wait_completions(a.cq, 2).size() == 2);
        auto r = wait_completions(b.cq, 2);
        REQUIRE(r.size() == 2);
        CHECK(r[0].opcode == IBV_WC_RECV);
        CHECK((r[0].wc_flags & IBV_WC_WITH_IMM));
        CHECK(ntohl(r[0].imm_data) == 0xdeadbeef);
        CHECK(r[0].byte_len == 3000);
        CHECK(r[1].opcode == IBV_WC_RECV_RDMA_WITH_IMM);
        CHECK(ntohl(r[1].imm_data) == 0x01020304);
        CHECK(r[1].byte_len == 10000);
        CHECK(std::memcmp(dst.bytes.data() + 20000, src.bytes.data(), 10000) == 0);
    }

    SECTION("unsignaled requests are retired by a later signaled one") {
        for (int i = 0; i < 50; ++i)
            REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, i * 100, 100, dst.addr() + i * 100,
                              dst.mr->rkey, i, i == 49) == 0);
        auto wcs = wait_completions(a.cq, 1);
        REQUIRE(wcs.size() == 1);
        CHECK(wcs[0].wr_id == 49);
        CHECK(wcs[0].opcode == IBV_WC_RDMA_WRITE);
        CHECK(wait_completions(a.cq, 1, std::chrono::milliseconds(100)).empty());
        CHECK(std::memcmp(dst.bytes.data(), src.bytes.data(), 5000) == 0);
    }

    SECTION("zero-length RDMA WRITE with rkey 0 completes (UCX's flush)") {
        ibv_send_wr wr{};
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.send_flags = IBV_SEND_SIGNALED;
        ibv_send_wr* bad = nullptr;
        REQUIRE(ibv_post_send(a.qp, &wr, &bad) == 0);
        auto wcs = wait_completions(a.cq, 1);
        REQUIRE(wcs.size() == 1);
        CHECK(wcs[0].status == IBV_WC_SUCCESS);
    }
}
