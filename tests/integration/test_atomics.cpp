// RC atomics through the real libibverbs: Compare & Swap and Fetch & Add, their errors, and
// the replay cache that keeps a retried atomic from running twice under loss.
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <vector>

#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;

namespace {

constexpr int kAtomicAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                              IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

QpOptions atomic_options() {
    QpOptions o;
    o.access = kAtomicAccess;
    return o;
}

uint64_t u64_at(const Buffer& b, size_t offset) {
    uint64_t v = 0;
    std::memcpy(&v, b.bytes.data() + offset, 8);
    return v;
}

void set_u64(Buffer& b, size_t offset, uint64_t v) {
    std::memcpy(b.bytes.data() + offset, &v, 8);
}

ibv_wc one_completion(ibv_cq* cq) {
    const auto wcs = wait_completions(cq, 1);
    REQUIRE(wcs.size() == 1);
    return wcs[0];
}

}  // namespace

TEST_CASE("Atomics: compare & swap and fetch & add return the original value", "[atomic]") {
    const QpOptions opt = atomic_options();
    Endpoint a(devices().a, opt), b(devices().b, opt);
    connect(a, b, opt);
    Buffer local(a.pd, 64, kAtomicAccess);
    Buffer target(b.pd, 64, kAtomicAccess);
    set_u64(target, 8, 0x1111222233334444ull);
    set_u64(target, 16, 1000);
    std::memset(local.bytes.data(), 0xee, 64);

    // A compare that matches swaps.
    REQUIRE(post_atomic(a.qp, IBV_WR_ATOMIC_CMP_AND_SWP, local, 0, target.addr() + 8,
                        target.mr->rkey, 0x1111222233334444ull, 0xaaaabbbbccccddddull, 1) == 0);
    ibv_wc wc = one_completion(a.cq);
    CHECK(wc.status == IBV_WC_SUCCESS);
    CHECK(wc.opcode == IBV_WC_COMP_SWAP);
    CHECK(wc.byte_len == 8);
    CHECK(u64_at(local, 0) == 0x1111222233334444ull);
    CHECK(u64_at(target, 8) == 0xaaaabbbbccccddddull);
    // One that does not, does not, and still returns what it found.
    REQUIRE(post_atomic(a.qp, IBV_WR_ATOMIC_CMP_AND_SWP, local, 8, target.addr() + 8,
                        target.mr->rkey, 5, 6, 2) == 0);
    wc = one_completion(a.cq);
    CHECK(wc.status == IBV_WC_SUCCESS);
    CHECK(u64_at(local, 8) == 0xaaaabbbbccccddddull);
    CHECK(u64_at(target, 8) == 0xaaaabbbbccccddddull);
    // Fetch & add, wrapping at 2^64.
    REQUIRE(post_atomic(a.qp, IBV_WR_ATOMIC_FETCH_AND_ADD, local, 16, target.addr() + 16,
                        target.mr->rkey, 234, 0, 3) == 0);
    wc = one_completion(a.cq);
    CHECK(wc.status == IBV_WC_SUCCESS);
    CHECK(wc.opcode == IBV_WC_FETCH_ADD);
    CHECK(u64_at(local, 16) == 1000);
    CHECK(u64_at(target, 16) == 1234);
    REQUIRE(post_atomic(a.qp, IBV_WR_ATOMIC_FETCH_AND_ADD, local, 24, target.addr() + 16,
                        target.mr->rkey, ~uint64_t{0} - 1233, 0, 4) == 0);  // adds -1234
    wc = one_completion(a.cq);
    CHECK(wc.status == IBV_WC_SUCCESS);
    CHECK(u64_at(local, 24) == 1234);
    CHECK(u64_at(target, 16) == 0);
    // Nothing else in either buffer moved.
    CHECK(u64_at(target, 0) == 0);
    CHECK(u64_at(target, 24) == 0);
    CHECK(u64_at(local, 32) == 0xeeeeeeeeeeeeeeeeull);

    ibv_device_attr d{};
    REQUIRE(ibv_query_device(a.ctx, &d) == 0);
    CHECK(d.atomic_cap == IBV_ATOMIC_HCA);
}

TEST_CASE("Atomics: two connections adding to one counter lose no update", "[atomic]") {
    const QpOptions opt = atomic_options();
    Endpoint a1(devices().a, opt), b1(devices().b, opt);
    Endpoint a2(devices().c, opt), b2(devices().b, opt);
    connect(a1, b1, opt);
    connect(a2, b2, opt);
    // Both QPs of device b execute on one counter, registered once in each context.
    std::vector<uint64_t> counter_mem(1, 0);
    ibv_mr* mr1 = ibv_reg_mr(b1.pd, counter_mem.data(), 8, kAtomicAccess);
    ibv_mr* mr2 = ibv_reg_mr(b2.pd, counter_mem.data(), 8, kAtomicAccess);
    REQUIRE(mr1);
    REQUIRE(mr2);
    constexpr int kEach = 300;
    constexpr int kBatch = 100;
    Buffer l1(a1.pd, 8 * kEach, kAtomicAccess), l2(a2.pd, 8 * kEach, kAtomicAccess);
    const uint64_t addr = reinterpret_cast<uint64_t>(counter_mem.data());
    for (int base = 0; base < kEach; base += kBatch) {
        for (int i = base; i < base + kBatch; ++i) {
            REQUIRE(post_atomic(a1.qp, IBV_WR_ATOMIC_FETCH_AND_ADD, l1, 8 * i, addr, mr1->rkey, 1,
                                0, i) == 0);
            REQUIRE(post_atomic(a2.qp, IBV_WR_ATOMIC_FETCH_AND_ADD, l2, 8 * i, addr, mr2->rkey, 1,
                                0, i) == 0);
        }
        for (ibv_cq* cq : {a1.cq, a2.cq}) {
            const auto wcs = wait_completions(cq, kBatch);
            REQUIRE(wcs.size() == kBatch);
            for (const ibv_wc& wc : wcs) REQUIRE(wc.status == IBV_WC_SUCCESS);
        }
    }
    CHECK(counter_mem[0] == 2 * kEach);
    // Every original value was handed out exactly once.
    std::set<uint64_t> seen;
    for (int i = 0; i < kEach; ++i) {
        seen.insert(u64_at(l1, 8 * i));
        seen.insert(u64_at(l2, 8 * i));
    }
    CHECK(seen.size() == 2 * kEach);
    CHECK(*seen.rbegin() == 2 * kEach - 1);
    ibv_dereg_mr(mr1);
    ibv_dereg_mr(mr2);
}

TEST_CASE("Atomics: with 20% of packets lost, each atomic still runs exactly once",
          "[atomic][faults]") {
    ::setenv("UROCE_FAULTS", "drop=0.2,seed=21", 1);
    QpOptions opt = atomic_options();
    // ~17 ms: the adaptive timeout resends long before; the counted local ACK timeout only
    // has to outlast a loaded machine not running the peer for a few milliseconds (with
    // ~1 ms, 8 such stalls in a row failed 1 run in 260 with two busy loops beside it).
    opt.timeout = 12;
    Endpoint a(devices().a, opt), b(devices().b, opt);
    ::unsetenv("UROCE_FAULTS");
    connect(a, b, opt);
    constexpr int kOps = 400;
    Buffer local(a.pd, 8 * kOps, kAtomicAccess);
    Buffer target(b.pd, 8, kAtomicAccess);
    for (int base = 0; base < kOps; base += 50) {
        for (int i = base; i < base + 50; ++i)
            REQUIRE(post_atomic(a.qp, IBV_WR_ATOMIC_FETCH_AND_ADD, local, 8 * i, target.addr(),
                                target.mr->rkey, 1, 0, i) == 0);
        const auto wcs = wait_completions(a.cq, 50, std::chrono::seconds(60));
        REQUIRE(wcs.size() == 50);
        for (const ibv_wc& wc : wcs) REQUIRE(wc.status == IBV_WC_SUCCESS);
    }
    // Executed once each: a duplicate run twice would push the counter past kOps.
    CHECK(u64_at(target, 0) == kOps);
    // In order on one QP: the i-th atomic found i.
    for (int i = 0; i < kOps; ++i) CHECK(u64_at(local, 8 * i) == static_cast<uint64_t>(i));
    // The loss really happened and duplicates really reached the responder.
    CHECK(counter(a.ctx, "tx_dropped_fault") > 0);
    CHECK(counter(b.ctx, "tx_dropped_fault") > 0);
    CHECK(counter(b.ctx, "rx_duplicate") > 0);
}

TEST_CASE("Atomics: what is refused, and how", "[atomic]") {
    QpOptions opt = atomic_options();
    SECTION("post: misaligned target, a result buffer that is not 8 bytes, inline") {
        Endpoint a(devices().a, opt), b(devices().b, opt);
        connect(a, b, opt);
        Buffer local(a.pd, 64, kAtomicAccess);
        Buffer target(b.pd, 64, kAtomicAccess);
        CHECK(post_atomic(a.qp, IBV_WR_ATOMIC_FETCH_AND_ADD, local, 0, target.addr() + 4,
                          target.mr->rkey, 1, 0, 1) == EINVAL);
        CHECK(post_atomic(a.qp, IBV_WR_ATOMIC_FETCH_AND_ADD, local, 0, target.addr(),
                          target.mr->rkey, 1, 0, 1, 4) == EINVAL);
        CHECK(post_atomic(a.qp, IBV_WR_ATOMIC_CMP_AND_SWP, local, 0, target.addr(), target.mr->rkey,
                          1, 0, 1, 16) == EINVAL);
        ibv_sge sge{local.addr(), 8, local.mr->lkey};
        ibv_send_wr wr{};
        wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.send_flags = IBV_SEND_INLINE;
        wr.wr.atomic.remote_addr = target.addr();
        wr.wr.atomic.rkey = target.mr->rkey;
        ibv_send_wr* bad = nullptr;
        CHECK(ibv_post_send(a.qp, &wr, &bad) == EINVAL);
        ibv_wc wc{};
        CHECK(ibv_poll_cq(a.cq, 1, &wc) == 0);
        CHECK(u64_at(target, 0) == 0);
    }
    SECTION("the responder's QP does not allow remote atomics") {
        QpOptions no_atomic = opt;
        no_atomic.access =
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        Endpoint a(devices().a, opt), b(devices().b, no_atomic);
        to_rts(a, b.qp->qp_num, b.gid, opt);
        to_rts(b, a.qp->qp_num, a.gid, no_atomic);
        Buffer local(a.pd, 64, kAtomicAccess);
        Buffer target(b.pd, 64, kAtomicAccess);
        set_u64(target, 0, 7);
        REQUIRE(post_atomic(a.qp, IBV_WR_ATOMIC_FETCH_AND_ADD, local, 0, target.addr(),
                            target.mr->rkey, 1, 0, 1) == 0);
        const ibv_wc wc = one_completion(a.cq);
        CHECK(wc.status == IBV_WC_REM_ACCESS_ERR);
        CHECK(u64_at(target, 0) == 7);
    }
    SECTION("the target region does not allow remote atomics") {
        Endpoint a(devices().a, opt), b(devices().b, opt);
        connect(a, b, opt);
        Buffer local(a.pd, 64, kAtomicAccess);
        Buffer target(b.pd, 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        set_u64(target, 0, 7);
        REQUIRE(post_atomic(a.qp, IBV_WR_ATOMIC_CMP_AND_SWP, local, 0, target.addr(),
                            target.mr->rkey, 7, 8, 1) == 0);
        const ibv_wc wc = one_completion(a.cq);
        CHECK(wc.status == IBV_WC_REM_ACCESS_ERR);
        CHECK(u64_at(target, 0) == 7);
    }
    SECTION("the target runs past the end of its region") {
        Endpoint a(devices().a, opt), b(devices().b, opt);
        connect(a, b, opt);
        Buffer local(a.pd, 64, kAtomicAccess);
        Buffer target(b.pd, 64, kAtomicAccess);
        REQUIRE(post_atomic(a.qp, IBV_WR_ATOMIC_FETCH_AND_ADD, local, 0, target.addr() + 64,
                            target.mr->rkey, 1, 0, 1) == 0);
        const ibv_wc wc = one_completion(a.cq);
        CHECK(wc.status == IBV_WC_REM_ACCESS_ERR);
    }
    SECTION("the local result buffer is not writable") {
        Endpoint a(devices().a, opt), b(devices().b, opt);
        connect(a, b, opt);
        Buffer local(a.pd, 64, 0);  // no LOCAL_WRITE
        Buffer target(b.pd, 64, kAtomicAccess);
        REQUIRE(post_atomic(a.qp, IBV_WR_ATOMIC_FETCH_AND_ADD, local, 0, target.addr(),
                            target.mr->rkey, 1, 0, 1) == 0);
        const ibv_wc wc = one_completion(a.cq);
        CHECK(wc.status == IBV_WC_LOC_PROT_ERR);
        CHECK(u64_at(target, 0) == 0);  // never asked
    }
}
