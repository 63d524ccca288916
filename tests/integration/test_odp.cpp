// On-demand paging through the real libibverbs: what the device reports, regions registered
// with IBV_ACCESS_ON_DEMAND over memory never touched (the transfer faults the pages in),
// ibv_advise_mr prefetching them, and the answers to what is not offered.
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tests/integration/verbs_fixture.h"

using namespace uroce::test;

namespace {

constexpr int kOdp = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                     IBV_ACCESS_ON_DEMAND;

// Anonymous memory mapped and never touched: none of its pages is present yet.
struct Untouched {
    size_t size;
    uint8_t* p;
    explicit Untouched(size_t n) : size(n) {
        void* m = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        REQUIRE(m != MAP_FAILED);
        p = static_cast<uint8_t*>(m);
    }
    ~Untouched() { ::munmap(p, size); }
    Untouched(const Untouched&) = delete;
    Untouched& operator=(const Untouched&) = delete;

    // Pages present in memory now.
    size_t resident() const {
        const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
        std::vector<unsigned char> v((size + page - 1) / page);
        REQUIRE(::mincore(p, size, v.data()) == 0);
        size_t n = 0;
        for (unsigned char c : v) n += c & 1;
        return n;
    }
};

}  // namespace

TEST_CASE("ODP: the device reports on-demand paging on every transport, not implicit regions",
          "[odp]") {
    Endpoint e(devices().a);
    ibv_device_attr_ex a{};
    REQUIRE(ibv_query_device_ex(e.ctx, nullptr, &a) == 0);
    CHECK((a.odp_caps.general_caps & IBV_ODP_SUPPORT) != 0);
    CHECK((a.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT) == 0);
    const uint32_t all = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
                         IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
    CHECK(a.odp_caps.per_transport_caps.rc_odp_caps == all);
    CHECK(a.xrc_odp_caps == all);
    CHECK((a.odp_caps.per_transport_caps.ud_odp_caps & IBV_ODP_SUPPORT_SEND) != 0);
    CHECK((a.odp_caps.per_transport_caps.uc_odp_caps & IBV_ODP_SUPPORT_WRITE) != 0);

    // An implicit region (the whole address space) is refused.
    errno = 0;
    CHECK(ibv_reg_mr(e.pd, nullptr, SIZE_MAX, kOdp) == nullptr);
    CHECK(errno == EINVAL);
}

TEST_CASE("ODP: WRITE, READ and SEND through regions whose pages are not there yet", "[odp]") {
    Endpoint a(devices().a);
    Endpoint b(devices().b);
    connect(a, b);
    constexpr size_t kSize = 1 << 20;
    Untouched src(kSize);
    Untouched dst(kSize);
    ibv_mr* smr = ibv_reg_mr(a.pd, src.p, kSize, kOdp);
    REQUIRE(smr);
    ibv_mr* dmr = ibv_reg_mr(b.pd, dst.p, kSize, kOdp);
    REQUIRE(dmr);
    CHECK(dst.resident() == 0);  // registration touched nothing

    fill_pattern(src.p, kSize, 9);
    ibv_sge sge{reinterpret_cast<uint64_t>(src.p), static_cast<uint32_t>(kSize), smr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(dst.p);
    wr.wr.rdma.rkey = dmr->rkey;
    ibv_send_wr* bad = nullptr;
    REQUIRE(ibv_post_send(a.qp, &wr, &bad) == 0);
    auto wc = wait_completions(a.cq, 1);
    REQUIRE(wc.size() == 1);
    CHECK(wc[0].status == IBV_WC_SUCCESS);
    CHECK(std::memcmp(src.p, dst.p, kSize) == 0);

    // READ it back into other untouched pages of a.
    Untouched back(kSize);
    ibv_mr* bmr = ibv_reg_mr(a.pd, back.p, kSize, kOdp);
    REQUIRE(bmr);
    sge = {reinterpret_cast<uint64_t>(back.p), static_cast<uint32_t>(kSize), bmr->lkey};
    wr.wr_id = 2;
    wr.opcode = IBV_WR_RDMA_READ;
    REQUIRE(ibv_post_send(a.qp, &wr, &bad) == 0);
    wc = wait_completions(a.cq, 1);
    REQUIRE(wc.size() == 1);
    CHECK(wc[0].status == IBV_WC_SUCCESS);
    CHECK(std::memcmp(back.p, src.p, kSize) == 0);

    // A SEND into a receive buffer whose pages are not there yet.
    Untouched rbuf(64 * 1024);
    ibv_mr* rmr = ibv_reg_mr(b.pd, rbuf.p, rbuf.size, kOdp);
    REQUIRE(rmr);
    ibv_sge rsge{reinterpret_cast<uint64_t>(rbuf.p), 64 * 1024, rmr->lkey};
    ibv_recv_wr rwr{};
    rwr.wr_id = 3;
    rwr.sg_list = &rsge;
    rwr.num_sge = 1;
    ibv_recv_wr* rbad = nullptr;
    REQUIRE(ibv_post_recv(b.qp, &rwr, &rbad) == 0);
    sge = {reinterpret_cast<uint64_t>(src.p), 40000, smr->lkey};
    wr.wr_id = 4;
    wr.opcode = IBV_WR_SEND;
    REQUIRE(ibv_post_send(a.qp, &wr, &bad) == 0);
    wc = wait_completions(b.cq, 1);
    REQUIRE(wc.size() == 1);
    CHECK(wc[0].status == IBV_WC_SUCCESS);
    CHECK(wc[0].byte_len == 40000);
    CHECK(std::memcmp(rbuf.p, src.p, 40000) == 0);
    REQUIRE(wait_completions(a.cq, 1).size() == 1);

    for (ibv_mr* m : {smr, dmr, bmr, rmr}) CHECK(ibv_dereg_mr(m) == 0);
}

TEST_CASE("ODP: ibv_advise_mr prefetches the pages it names and refuses bad ranges", "[odp]") {
    Endpoint e(devices().a);
    constexpr size_t kSize = 256 * 1024;
    Untouched mem(kSize);
    ibv_mr* rw = ibv_reg_mr(e.pd, mem.p, kSize, kOdp);
    REQUIRE(rw);
    const int read_only = IBV_ACCESS_ON_DEMAND;  // no local write
    ibv_mr* ro = ibv_reg_mr(e.pd, mem.p, kSize, read_only);
    REQUIRE(ro);
    REQUIRE(mem.resident() == 0);

    ibv_sge half{reinterpret_cast<uint64_t>(mem.p), kSize / 2, rw->lkey};
    CHECK(ibv_advise_mr(e.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, 0, &half, 1) == 0);
    CHECK(mem.resident() == 0);  // NO_FAULT faults nothing in
    CHECK(ibv_advise_mr(e.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &half,
                        1) == 0);
    // This kernel has MADV_POPULATE_WRITE (5.14+): the first half is there now, the rest not.
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    CHECK(mem.resident() == kSize / 2 / page);
    ibv_sge all{reinterpret_cast<uint64_t>(mem.p), kSize, ro->lkey};
    CHECK(ibv_advise_mr(e.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &all, 1) == 0);
    CHECK(mem.resident() == kSize / page);

    // Refused, with nothing done: a write prefetch of a region without local write, a range
    // past the region, a key that is no key, another PD, unknown flags, no range.
    CHECK(ibv_advise_mr(e.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, 0, &all, 1) == EINVAL);
    ibv_sge past{reinterpret_cast<uint64_t>(mem.p) + 4096, kSize, rw->lkey};
    CHECK(ibv_advise_mr(e.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &past, 1) == EINVAL);
    ibv_sge nokey{reinterpret_cast<uint64_t>(mem.p), 64, rw->lkey ^ 0x5a5a00};
    CHECK(ibv_advise_mr(e.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &nokey, 1) == EINVAL);
    ibv_pd* other = ibv_alloc_pd(e.ctx);
    REQUIRE(other);
    CHECK(ibv_advise_mr(other, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &half, 1) == EINVAL);
    CHECK(ibv_dealloc_pd(other) == 0);
    CHECK(ibv_advise_mr(e.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0x80, &half, 1) == EINVAL);
    CHECK(ibv_advise_mr(e.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &half, 0) == EINVAL);
    CHECK(ibv_advise_mr(e.pd, static_cast<ibv_advise_mr_advice>(77), 0, &half, 1) == EOPNOTSUPP);

    CHECK(ibv_dereg_mr(ro) == 0);
    CHECK(ibv_dereg_mr(rw) == 0);
}

TEST_CASE("ODP: a QP takes region-only access flags and ignores them, not undefined ones",
          "[odp]") {
    Endpoint e(devices().a);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB;
    const int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    a.qp_access_flags |= 1 << 20;
    CHECK(ibv_modify_qp(e.qp, &a, mask) == EINVAL);
    a.qp_access_flags &= ~(1 << 20);
    CHECK(ibv_modify_qp(e.qp, &a, mask) == 0);
    CHECK(e.state() == IBV_QPS_INIT);
}

// ibv_reg_mr(3): IBV_ACCESS_HUGETLB is the application's promise that an on-demand region is
// backed by huge pages (rdma-core's ODP tests register their huge-page regions with it). It is
// a hint uroce has no use for: the region registers and works like any other.
TEST_CASE("ODP: a region registered with IBV_ACCESS_HUGETLB takes a WRITE", "[odp]") {
    Endpoint a(devices().a);
    Endpoint b(devices().b);
    connect(a, b);
    constexpr size_t kSize = 1 << 16;
    Buffer src(a.pd, kSize, IBV_ACCESS_LOCAL_WRITE);
    fill_pattern(src.bytes.data(), kSize, 31);
    Untouched dst(kSize);
    ibv_mr* dmr = ibv_reg_mr(b.pd, dst.p, kSize, kOdp | IBV_ACCESS_HUGETLB);
    REQUIRE(dmr);
    constexpr int kLocalWrite = IBV_ACCESS_LOCAL_WRITE;  // an int: ibv_reg_mr's macro masks it
    ibv_mr* rereg = ibv_reg_mr(b.pd, dst.p, kSize, kLocalWrite);
    REQUIRE(rereg);
    CHECK(ibv_rereg_mr(rereg, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                       kOdp | IBV_ACCESS_HUGETLB) == 0);
    REQUIRE(post_rdma(a.qp, IBV_WR_RDMA_WRITE, src, 0, kSize, reinterpret_cast<uint64_t>(dst.p),
                      dmr->rkey, 1) == 0);
    const auto wc = wait_completions(a.cq, 1);
    REQUIRE(wc.size() == 1);
    CHECK(wc[0].status == IBV_WC_SUCCESS);
    CHECK(std::memcmp(dst.p, src.bytes.data(), kSize) == 0);
    CHECK(ibv_dereg_mr(rereg) == 0);
    CHECK(ibv_dereg_mr(dmr) == 0);
}
