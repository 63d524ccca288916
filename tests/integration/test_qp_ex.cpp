// ibv_create_qp_ex and the ibv_wr_* send API through the real libibverbs: every opcode in one
// batch with SGE lists and inline data, wr_abort, and the batch that fails as a whole.
#include <arpa/inet.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;

namespace {

constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                     IBV_ACCESS_REMOTE_ATOMIC;
constexpr uint64_t kRcOps = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
                            IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                            IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                            IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;

// Replaces `ep`'s RC QP by one made with ibv_create_qp_ex.
ibv_qp_ex* use_qp_ex(Endpoint& ep, uint64_t ops = kRcOps) {
    ibv_qp* qp = create_qp_ex(ep, IBV_QPT_RC, ops);
    REQUIRE(qp);
    ibv_destroy_qp(ep.qp);
    ep.qp = qp;
    ibv_qp_ex* qpx = ibv_qp_to_qp_ex(qp);
    REQUIRE(qpx);
    return qpx;
}

}  // namespace

TEST_CASE("qp_ex: every RC opcode in one batch, with SGE lists and inline data", "[qp_ex]") {
    QpOptions opt;
    opt.access = kAll;
    Endpoint a(devices().a, opt), b(devices().b, opt);
    ibv_qp_ex* qpx = use_qp_ex(a);
    connect(a, b, opt);
    Buffer src(a.pd, 8192, kAll), dst(b.pd, 8192, kAll);
    fill_pattern(src.bytes.data(), 4096, 12);
    uint64_t counter = 40;
    std::memcpy(dst.bytes.data() + 8000, &counter, 8);
    fill_pattern(dst.bytes.data() + 6000, 500, 13);
    REQUIRE(post_recv_buf(b.qp, dst, 0, 1024, 100) == 0);
    REQUIRE(post_recv_buf(b.qp, dst, 1024, 1024, 101) == 0);
    REQUIRE(post_recv_buf(b.qp, dst, 2048, 64, 102) == 0);
    const char inline_msg[] = "inline over uroce";

    ibv_wr_start(qpx);
    qpx->wr_id = 1;
    qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send(qpx);
    const ibv_sge two[2] = {{src.addr(), 100, src.mr->lkey}, {src.addr() + 500, 50, src.mr->lkey}};
    ibv_wr_set_sge_list(qpx, 2, two);
    qpx->wr_id = 2;
    ibv_wr_send_imm(qpx, htonl(0x1234));
    ibv_wr_set_inline_data(qpx, const_cast<char*>(inline_msg), sizeof inline_msg);
    qpx->wr_id = 3;
    ibv_wr_rdma_write(qpx, dst.mr->rkey, dst.addr() + 4096);
    ibv_wr_set_sge(qpx, src.mr->lkey, src.addr() + 1000, 700);
    qpx->wr_id = 4;
    ibv_wr_rdma_write_imm(qpx, dst.mr->rkey, dst.addr() + 5000, htonl(7));
    ibv_wr_set_sge(qpx, src.mr->lkey, src.addr() + 2000, 300);
    qpx->wr_id = 5;
    ibv_wr_rdma_read(qpx, dst.mr->rkey, dst.addr() + 6000);
    ibv_wr_set_sge(qpx, src.mr->lkey, src.addr() + 5000, 500);
    qpx->wr_id = 6;
    ibv_wr_atomic_fetch_add(qpx, dst.mr->rkey, dst.addr() + 8000, 2);
    ibv_wr_set_sge(qpx, src.mr->lkey, src.addr() + 7000, 8);
    qpx->wr_id = 7;
    ibv_wr_atomic_cmp_swp(qpx, dst.mr->rkey, dst.addr() + 8000, 42, 99);
    ibv_wr_set_sge(qpx, src.mr->lkey, src.addr() + 7008, 8);
    REQUIRE(ibv_wr_complete(qpx) == 0);

    const auto s = wait_completions(a.cq, 7);
    REQUIRE(s.size() == 7);
    for (size_t i = 0; i < 7; ++i) {
        CHECK(s[i].status == IBV_WC_SUCCESS);
        CHECK(s[i].wr_id == i + 1);
    }
    const auto r = wait_completions(b.cq, 3);
    REQUIRE(r.size() == 3);
    CHECK(r[0].byte_len == 150);
    CHECK(std::memcmp(dst.bytes.data(), src.bytes.data(), 100) == 0);
    CHECK(std::memcmp(dst.bytes.data() + 100, src.bytes.data() + 500, 50) == 0);
    CHECK(r[1].byte_len == sizeof inline_msg);
    CHECK(ntohl(r[1].imm_data) == 0x1234);
    CHECK(std::memcmp(dst.bytes.data() + 1024, inline_msg, sizeof inline_msg) == 0);
    CHECK(r[2].opcode == IBV_WC_RECV_RDMA_WITH_IMM);
    CHECK(ntohl(r[2].imm_data) == 7);
    CHECK(std::memcmp(dst.bytes.data() + 4096, src.bytes.data() + 1000, 700) == 0);
    CHECK(std::memcmp(dst.bytes.data() + 5000, src.bytes.data() + 2000, 300) == 0);
    CHECK(std::memcmp(src.bytes.data() + 5000, dst.bytes.data() + 6000, 500) == 0);
    uint64_t fetched = 0, swapped = 0;
    std::memcpy(&fetched, src.bytes.data() + 7000, 8);
    std::memcpy(&swapped, src.bytes.data() + 7008, 8);
    std::memcpy(&counter, dst.bytes.data() + 8000, 8);
    CHECK(fetched == 40);
    CHECK(swapped == 42);
    CHECK(counter == 99);
}

TEST_CASE(
    "qp_ex: many inline requests in one batch each carry their own bytes; a setter called "
    "twice replaces the first; batches reuse the QP's storage",
    "[qp_ex]") {
    Endpoint a(devices().a), b(devices().b);
    ibv_qp_ex* qpx = use_qp_ex(a);
    connect(a, b);
    Buffer src(a.pd, 4096, IBV_ACCESS_LOCAL_WRITE), dst(b.pd, 64 * 256, IBV_ACCESS_LOCAL_WRITE);
    fill_pattern(src.bytes.data(), 4096, 21);
    constexpr uint32_t kSends = 48;  // the inline copies grow past several reallocations
    for (int round = 0; round < 2; ++round) {
        std::memset(dst.bytes.data(), 0, dst.bytes.size());
        for (uint32_t i = 0; i < kSends; ++i)
            REQUIRE(post_recv_buf(b.qp, dst, i * 256, 256, 1000 + i) == 0);
        std::vector<std::vector<uint8_t>> sent(kSends);
        ibv_wr_start(qpx);
        for (uint32_t i = 0; i < kSends; ++i) {
            qpx->wr_id = i;
            qpx->wr_flags = IBV_SEND_SIGNALED;
            ibv_wr_send(qpx);
            std::vector<uint8_t> bytes(1 + (i * 37 + static_cast<uint32_t>(round) * 11) % 256);
            fill_pattern(bytes.data(), bytes.size(), static_cast<uint8_t>(i + 40 * round));
            if (i % 4 == 1) {
                // Inline data, then an SGE: the SGE is the request's (sent inline all the
                // same, as the flag stays), the copy is left unused.
                ibv_wr_set_inline_data(qpx, bytes.data(), bytes.size());
                ibv_wr_set_sge(qpx, src.mr->lkey, src.addr() + i, 100);
                bytes.assign(src.bytes.begin() + i, src.bytes.begin() + i + 100);
            } else if (i % 4 == 2) {
                // An SGE, then inline data: the copy is the request's.
                ibv_wr_set_sge(qpx, src.mr->lkey, src.addr(), 200);
                ibv_wr_set_inline_data(qpx, bytes.data(), bytes.size());
            } else if (i % 4 == 3) {
                // Two SGE lists: the second one only.
                const ibv_sge first[2] = {{src.addr(), 10, src.mr->lkey},
                                          {src.addr() + 20, 10, src.mr->lkey}};
                ibv_wr_set_sge_list(qpx, 2, first);
                ibv_wr_set_sge(qpx, src.mr->lkey, src.addr() + 3000, 64);
                bytes.assign(src.bytes.begin() + 3000, src.bytes.begin() + 3064);
            } else {
                // Inline data twice: the second copy only.
                std::vector<uint8_t> other(255, 0xee);
                ibv_wr_set_inline_data(qpx, other.data(), other.size());
                ibv_wr_set_inline_data(qpx, bytes.data(), bytes.size());
            }
            sent[i] = bytes;
            std::fill(bytes.begin(), bytes.end(), 0);  // inline data is copied at once
        }
        REQUIRE(ibv_wr_complete(qpx) == 0);
        const auto s = wait_completions(a.cq, kSends);
        REQUIRE(s.size() == kSends);
        const auto r = wait_completions(b.cq, kSends);
        REQUIRE(r.size() == kSends);
        for (uint32_t i = 0; i < kSends; ++i) {
            CHECK(s[i].status == IBV_WC_SUCCESS);
            CHECK(s[i].wr_id == i);
            CHECK(r[i].status == IBV_WC_SUCCESS);
            CHECK(r[i].wr_id == 1000 + i);
            CHECK(r[i].byte_len == sent[i].size());
            CHECK(std::memcmp(dst.bytes.data() + i * 256, sent[i].data(), sent[i].size()) == 0);
        }
    }
}

TEST_CASE("qp_ex: wr_abort sends nothing; a bad request fails its whole batch", "[qp_ex]") {
    Endpoint a(devices().a), b(devices().b);
    ibv_qp_ex* qpx = use_qp_ex(a, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE);
    connect(a, b);
    Buffer src(a.pd, 4096, IBV_ACCESS_LOCAL_WRITE), dst(b.pd, 4096, IBV_ACCESS_LOCAL_WRITE);
    REQUIRE(post_recv_buf(b.qp, dst, 0, 4096, 1) == 0);
    const uint64_t sent = counter(a.ctx, "tx_packets");
    ibv_wr_start(qpx);
    qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send(qpx);
    ibv_wr_set_sge(qpx, src.mr->lkey, src.addr(), 64);
    ibv_wr_abort(qpx);
    // An opcode the QP was not created for, or too many SGEs: nothing of the batch goes.
    ibv_wr_start(qpx);
    ibv_wr_send(qpx);
    ibv_wr_set_sge(qpx, src.mr->lkey, src.addr(), 64);
    ibv_wr_rdma_read(qpx, 1, 0);
    CHECK(ibv_wr_complete(qpx) == EINVAL);
    std::vector<ibv_sge> many(17, ibv_sge{src.addr(), 1, src.mr->lkey});
    ibv_wr_start(qpx);
    ibv_wr_send(qpx);
    ibv_wr_set_sge_list(qpx, many.size(), many.data());
    CHECK(ibv_wr_complete(qpx) == EINVAL);
    std::vector<char> big(1000, 'x');
    ibv_wr_start(qpx);
    ibv_wr_send(qpx);
    ibv_wr_set_inline_data(qpx, big.data(), big.size());
    CHECK(ibv_wr_complete(qpx) == EINVAL);
    ibv_wc wc{};
    CHECK(ibv_poll_cq(a.cq, 1, &wc) == 0);
    CHECK(ibv_poll_cq(b.cq, 1, &wc) == 0);
    CHECK(counter(a.ctx, "tx_packets") == sent);
    // The QP still works.
    ibv_wr_start(qpx);
    qpx->wr_id = 9;
    qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send(qpx);
    ibv_wr_set_sge(qpx, src.mr->lkey, src.addr(), 64);
    REQUIRE(ibv_wr_complete(qpx) == 0);
    CHECK(wait_completions(a.cq, 1).size() == 1);
    CHECK(wait_completions(b.cq, 1).size() == 1);
}

TEST_CASE("qp_ex: what ibv_create_qp_ex refuses", "[qp_ex]") {
    Endpoint a(devices().a);
    errno = 0;
    CHECK(create_qp_ex(a, IBV_QPT_RC, IBV_QP_EX_WITH_TSO) == nullptr);
    CHECK(errno == EOPNOTSUPP);
    errno = 0;
    CHECK(create_qp_ex(a, IBV_QPT_UD, IBV_QP_EX_WITH_RDMA_WRITE) == nullptr);
    CHECK(errno == EOPNOTSUPP);
    ibv_qp_init_attr_ex attr{};
    attr.send_cq = attr.recv_cq = a.cq;
    attr.qp_type = IBV_QPT_RC;
    attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
    attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
    attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
    attr.pd = a.pd;
    attr.create_flags = IBV_QP_CREATE_SCATTER_FCS;
    errno = 0;
    CHECK(ibv_create_qp_ex(a.ctx, &attr) == nullptr);
    CHECK(errno == EOPNOTSUPP);
    // A UD QP can take the send API too (SEND, with wr_set_ud_addr for the destination).
    ibv_qp* ud = create_qp_ex(a, IBV_QPT_UD, IBV_QP_EX_WITH_SEND);
    REQUIRE(ud);
    CHECK(ibv_qp_to_qp_ex(ud) != nullptr);
    CHECK(ibv_destroy_qp(ud) == 0);
}

// ibv_post_send stops at the first request it refuses, after queueing those before it; a batch
// of ibv_wr_* requests goes whole or not at all, whichever of its requests is refused.
TEST_CASE("qp_ex: a batch is all or nothing while another thread posts to the QP",
          "[qp_ex][threads]") {
    // Batches of 60 WRITEs on a queue of 64 while a second thread posts single WRITEs: a
    // batch whose room check another post overtakes must still post nothing. Every accepted
    // request completes once; no request of a refused batch ever runs.
    QpOptions opt;
    opt.access = kAll;
    Endpoint a(devices().a, opt), b(devices().b, opt);
    ibv_qp_ex* qpx = use_qp_ex(a);
    connect(a, b, opt);
    Buffer src(a.pd, 4096, kAll), dst(b.pd, 4096, kAll);
    constexpr uint64_t kBatch = 60;
    constexpr uint64_t kSingle = uint64_t{1} << 40;  // wr_ids of the second thread's posts
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> singles_accepted{0};
    std::thread other([&] {
        for (uint64_t i = 0; !stop.load() && i < 50000; ++i) {
            if (post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, 8, dst.addr(), dst.mr->rkey,
                          kSingle + i) == 0)
                singles_accepted.fetch_add(1);
            else
                std::this_thread::sleep_for(std::chrono::microseconds(5));
        }
    });
    std::set<uint64_t> accepted_batches, refused_batches, seen;
    uint64_t completions = 0, bad_status = 0;
    // Until the CQ is empty: the queue's 64 entries free as their completions arrive, so the
    // CQ fills only as fast as this empties it.
    auto poll = [&] {
        ibv_wc wcs[32];
        for (int n = 32; n == 32;) {
            n = ibv_poll_cq(a.cq, 32, wcs);
            for (int i = 0; i < n; ++i) {
                ++completions;
                if (wcs[i].status != IBV_WC_SUCCESS) ++bad_status;
                if (wcs[i].wr_id < kSingle) seen.insert(wcs[i].wr_id);
            }
        }
    };
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (uint64_t batch = 0; accepted_batches.size() < 500 && batch < 20000 &&
                             std::chrono::steady_clock::now() < deadline;
         ++batch) {
        ibv_wr_start(qpx);
        qpx->wr_flags = IBV_SEND_SIGNALED;
        for (uint64_t i = 0; i < kBatch; ++i) {
            qpx->wr_id = batch * kBatch + i;
            ibv_wr_rdma_write(qpx, dst.mr->rkey, dst.addr() + 8);
            ibv_wr_set_sge(qpx, src.mr->lkey, src.addr() + 8, 8);
        }
        const int rc = ibv_wr_complete(qpx);
        REQUIRE((rc == 0 || rc == ENOMEM));
        (rc == 0 ? accepted_batches : refused_batches).insert(batch);
        poll();
        if (rc != 0) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    stop = true;
    other.join();
    const uint64_t expected = accepted_batches.size() * kBatch + singles_accepted.load();
    for (int i = 0; i < 100000 && completions < expected; ++i) {
        poll();
        if (completions < expected) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    poll();
    INFO(accepted_batches.size() << " batches accepted, " << refused_batches.size() << " refused, "
                                 << singles_accepted.load() << " singles");
    CHECK(completions == expected);
    CHECK(bad_status == 0);
    // A refused batch ran none of its requests; an accepted one all.
    size_t strays = 0;
    for (const uint64_t id : seen) strays += !accepted_batches.contains(id / kBatch);
    CHECK(strays == 0);
    CHECK(seen.size() == accepted_batches.size() * kBatch);
    CHECK(!accepted_batches.empty());
}

TEST_CASE("qp_ex: a batch a check of post_send refuses part-way sends nothing", "[qp_ex]") {
    QpOptions opt;
    opt.access = kAll;
    Endpoint a(devices().a, opt), b(devices().b, opt);
    ibv_qp_ex* qpx = use_qp_ex(a);  // 64 send queue entries
    connect(a, b, opt);
    Buffer src(a.pd, 4096, kAll), dst(b.pd, 4096, kAll);
    fill_pattern(src.bytes.data(), 64, 21);
    REQUIRE(post_recv_buf(b.qp, dst, 0, 1024, 1) == 0);
    const uint64_t sent = counter(a.ctx, "tx_packets");
    SECTION("an atomic at a misaligned address after a good SEND") {
        ibv_wr_start(qpx);
        qpx->wr_id = 1;
        qpx->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_send(qpx);
        ibv_wr_set_sge(qpx, src.mr->lkey, src.addr(), 64);
        qpx->wr_id = 2;
        ibv_wr_atomic_fetch_add(qpx, dst.mr->rkey, dst.addr() + 4, 1);
        ibv_wr_set_sge(qpx, src.mr->lkey, src.addr() + 1024, 8);
        CHECK(ibv_wr_complete(qpx) == EINVAL);
    }
    SECTION("more requests than the send queue holds") {
        // b takes one SEND; the others would wait for receives (RNR), holding their entries.
        ibv_wr_start(qpx);
        qpx->wr_flags = IBV_SEND_SIGNALED;
        for (uint64_t i = 0; i < 66; ++i) {
            qpx->wr_id = 10 + i;
            ibv_wr_send(qpx);
            ibv_wr_set_sge(qpx, src.mr->lkey, src.addr(), 64);
        }
        CHECK(ibv_wr_complete(qpx) == ENOMEM);
    }
    // The batch failed: none of it may run (the caller is entitled to reuse its buffers).
    CHECK(counter(a.ctx, "tx_packets") == sent);
    // A request posted next is the first the QP runs and the one the receive takes.
    ibv_wr_start(qpx);
    qpx->wr_id = 99;
    qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send(qpx);
    ibv_wr_set_sge(qpx, src.mr->lkey, src.addr(), 16);
    REQUIRE(ibv_wr_complete(qpx) == 0);
    const auto s = wait_completions(a.cq, 1);
    REQUIRE(s.size() == 1);
    CHECK(s[0].wr_id == 99);
    const auto r = wait_completions(b.cq, 1);
    REQUIRE(r.size() == 1);
    CHECK(r[0].byte_len == 16);
    ibv_wc wc{};
    CHECK(ibv_poll_cq(a.cq, 1, &wc) == 0);
}
