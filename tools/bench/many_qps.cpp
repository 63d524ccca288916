// uroce-many-qps: thousands of connected RC QPs in one process, what they cost in memory, and
// traffic over every one of them, checked byte for byte. A plain verbs program: it sees uroce
// only through libibverbs, as an application does.
//
//   uroce-many-qps --dev-a NAME --dev-b NAME [--qps N] [--size BYTES] [--wr N] [--timeout S]
//
// Opens one context on each device, creates N RC QPs on each (one PD, one CQ per side),
// connects QP i of a to QP i of b, then
//   - every QP of a WRITEs `size` bytes (a pattern of its own) into its own slice of a region
//     of b, all posted at once, and
//   - every QP of b SENDs its slice back to a receive posted on its partner,
// and checks every byte that arrived. Prints one `key=value ...` line: the figures below, and
// `verified` (QPs whose data arrived intact both ways). Exit status 0 only if all of them did;
// 1 on any failure (a completion with an error, a timeout, a wrong byte), 2 on bad arguments.
//
// Memory: `heap_per_qp` is what the allocator handed out per QP created (mallinfo2: bytes in
// use, including large mmap'd blocks), `rss_per_qp` the growth of the resident set per QP;
// both measured across creating the QPs (`*_per_qp_connected`: up to RTS;
// `heap_per_qp_after_traffic`: after the traffic, the receive buffers not counted), over the
// 2 x N QPs of the two contexts. `heap_after_traffic_mb`, `rss_after_traffic_mb`: the whole
// process at the end, the registered regions (3 x N x size bytes) included.
#include <infiniband/verbs.h>
#include <malloc.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr char kUsage[] =
    "usage: uroce-many-qps --dev-a NAME --dev-b NAME [--qps N (10000, at most 65520)]\n"
    "                      [--size BYTES (4096)]\n"
    "                      [--wr N (4): send and receive queue depth per QP] [--timeout S "
    "(120)]\n";

// A CQ holds a completion of every QP (uroce's max_cqe is 65536).
constexpr unsigned long long kMaxQps = 65536 - 16;

struct Options {
    std::string dev_a, dev_b;
    size_t qps = 10000;
    size_t size = 4096;
    uint32_t wr = 4;
    int timeout_s = 120;
};

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

size_t heap_bytes() {
    const struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
}

size_t rss_bytes() {
    FILE* f = std::fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long size = 0, resident = 0;
    const int got = std::fscanf(f, "%lu %lu", &size, &resident);
    std::fclose(f);
    return got == 2 ? resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

[[noreturn]] void fail(const std::string& what) {
    std::fprintf(stderr, "uroce-many-qps: %s\n", what.c_str());
    std::exit(1);
}

uint8_t pattern(size_t qp, size_t i) {
    return static_cast<uint8_t>((qp * 131 + i * 7 + (qp >> 8)) & 0xff);
}

// One side: a context on one device, its PD, one CQ and N QPs, and a registered region of
// N slices.
struct Side {
    ibv_context* ctx = nullptr;
    ibv_pd* pd = nullptr;
    ibv_cq* cq = nullptr;
    std::vector<ibv_qp*> qps;
    std::vector<uint8_t> region;
    ibv_mr* mr = nullptr;
    ibv_gid gid{};
    ibv_mtu mtu = IBV_MTU_1024;

    void open(const std::string& name, size_t n, size_t size) {
        int count = 0;
        ibv_device** list = ibv_get_device_list(&count);
        if (!list) fail("no device list");
        for (int i = 0; i < count && !ctx; ++i)
            if (name == ibv_get_device_name(list[i])) ctx = ibv_open_device(list[i]);
        ibv_free_device_list(list);
        if (!ctx) fail("cannot open device " + name);
        ibv_port_attr port{};
        if (ibv_query_port(ctx, 1, &port) != 0) fail("ibv_query_port failed on " + name);
        mtu = port.active_mtu;
        if (ibv_query_gid(ctx, 1, 0, &gid) != 0) fail("ibv_query_gid failed on " + name);
        pd = ibv_alloc_pd(ctx);
        // Room for one completion of every QP at once (each phase reaps its own before the
        // next posts).
        cq = pd ? ibv_create_cq(ctx, static_cast<int>(n + 16), nullptr, nullptr, 0) : nullptr;
        if (!pd || !cq) fail("cannot create PD/CQ on " + name);
        region.assign(n * size, 0);
        mr = ibv_reg_mr(pd, region.data(), region.size(),
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        if (!mr) fail("cannot register " + std::to_string(region.size()) + " bytes on " + name);
    }
    void create_qps(size_t n, uint32_t wr) {
        qps.reserve(n);
        for (size_t i = 0; i < n; ++i) {
            ibv_qp_init_attr init{};
            init.send_cq = cq;
            init.recv_cq = cq;
            init.qp_type = IBV_QPT_RC;
            init.cap.max_send_wr = wr;
            init.cap.max_recv_wr = wr;
            init.cap.max_send_sge = 1;
            init.cap.max_recv_sge = 1;
            ibv_qp* qp = ibv_create_qp(pd, &init);
            if (!qp)
                fail("ibv_create_qp failed after " + std::to_string(i) +
                     " QPs: " + std::strerror(errno));
            qps.push_back(qp);
        }
    }
    void close() {
        for (ibv_qp* qp : qps) ibv_destroy_qp(qp);
        if (mr) ibv_dereg_mr(mr);
        if (cq) ibv_destroy_cq(cq);
        if (pd) ibv_dealloc_pd(pd);
        if (ctx) ibv_close_device(ctx);
    }
};

void to_rts(ibv_qp* qp, uint32_t remote_qpn, const ibv_gid& remote_gid, ibv_mtu mtu) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        fail("INIT failed");
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = mtu;
    a.dest_qp_num = remote_qpn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = remote_gid;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        fail("RTR failed");
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
        fail("RTS failed");
}

// Polls `cq` until `n` completions arrived, each successful and counted per QP index in
// `done` (wr_id = index), or the deadline passed.
void collect(ibv_cq* cq, size_t n, std::vector<uint8_t>& done, Clock::time_point deadline,
             const char* what) {
    std::vector<ibv_wc> wcs(64);
    size_t got = 0;
    while (got < n) {
        const int k = ibv_poll_cq(cq, static_cast<int>(wcs.size()), wcs.data());
        if (k < 0) fail(std::string("ibv_poll_cq failed during ") + what);
        for (int i = 0; i < k; ++i) {
            if (wcs[i].status != IBV_WC_SUCCESS)
                fail(std::string(what) + ": QP " + std::to_string(wcs[i].wr_id) +
                     " completed with " + ibv_wc_status_str(wcs[i].status));
            if (wcs[i].wr_id >= done.size()) fail(std::string(what) + ": unknown wr_id");
            ++done[wcs[i].wr_id];
        }
        got += static_cast<size_t>(k);
        if (k == 0 && Clock::now() > deadline)
            fail(std::string(what) + ": " + std::to_string(got) + " of " + std::to_string(n) +
                 " completions before the timeout");
    }
}

bool parse(int argc, char** argv, Options& o) {
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (i + 1 >= argc) return false;
        const char* v = argv[++i];
        char* end = nullptr;
        const unsigned long long n = std::strtoull(v, &end, 10);
        const bool number = end && *end == '\0' && *v != '\0';
        if (arg == "--dev-a")
            o.dev_a = v;
        else if (arg == "--dev-b")
            o.dev_b = v;
        else if (arg == "--qps" && number && n > 0 && n <= kMaxQps)
            o.qps = n;
        else if (arg == "--size" && number && n > 0 && n <= (1u << 20))
            o.size = n;
        else if (arg == "--wr" && number && n > 0 && n <= 16384)
            o.wr = static_cast<uint32_t>(n);
        else if (arg == "--timeout" && number && n > 0 && n <= 3600)
            o.timeout_s = static_cast<int>(n);
        else
            return false;
    }
    return !o.dev_a.empty() && !o.dev_b.empty();
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    if (!parse(argc, argv, o)) {
        std::fputs(kUsage, stderr);
        return 2;
    }
    const size_t n = o.qps;
    const auto deadline = Clock::now() + std::chrono::seconds(o.timeout_s);
    Side a, b;
    a.open(o.dev_a, n, o.size);
    b.open(o.dev_b, n, o.size);

    const size_t heap0 = heap_bytes(), rss0 = rss_bytes();
    auto t = Clock::now();
    a.create_qps(n, o.wr);
    b.create_qps(n, o.wr);
    const double create_s = seconds_since(t);
    const size_t heap1 = heap_bytes(), rss1 = rss_bytes();
    t = Clock::now();
    for (size_t i = 0; i < n; ++i) {
        to_rts(a.qps[i], b.qps[i]->qp_num, b.gid, b.mtu);
        to_rts(b.qps[i], a.qps[i]->qp_num, a.gid, a.mtu);
    }
    const double connect_s = seconds_since(t);
    const size_t heap2 = heap_bytes(), rss2 = rss_bytes();

    // a -> b: every QP WRITEs its pattern into its slice of b's region.
    for (size_t q = 0; q < n; ++q)
        for (size_t i = 0; i < o.size; ++i) a.region[q * o.size + i] = pattern(q, i);
    std::vector<uint8_t> written(n, 0);
    t = Clock::now();
    for (size_t q = 0; q < n; ++q) {
        ibv_sge sge{reinterpret_cast<uint64_t>(&a.region[q * o.size]),
                    static_cast<uint32_t>(o.size), a.mr->lkey};
        ibv_send_wr wr{};
        ibv_send_wr* bad = nullptr;
        wr.wr_id = q;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(&b.region[q * o.size]);
        wr.wr.rdma.rkey = b.mr->rkey;
        if (ibv_post_send(a.qps[q], &wr, &bad) != 0)
            fail("WRITE post failed on QP " + std::to_string(q));
    }
    collect(a.cq, n, written, deadline, "WRITE");
    const double write_s = seconds_since(t);

    // b -> a: every QP of b SENDs its slice back into a receive on its partner.
    std::vector<uint8_t> back(n * o.size, 0);
    const int local_write = IBV_ACCESS_LOCAL_WRITE;  // an int: clang refuses an enum here
    ibv_mr* back_mr = ibv_reg_mr(a.pd, back.data(), back.size(), local_write);
    if (!back_mr) fail("cannot register the receive buffers");
    for (size_t q = 0; q < n; ++q) {
        ibv_sge sge{reinterpret_cast<uint64_t>(&back[q * o.size]), static_cast<uint32_t>(o.size),
                    back_mr->lkey};
        ibv_recv_wr wr{};
        ibv_recv_wr* bad = nullptr;
        wr.wr_id = q;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        if (ibv_post_recv(a.qps[q], &wr, &bad) != 0)
            fail("receive post failed on QP " + std::to_string(q));
    }
    std::vector<uint8_t> sent(n, 0), received(n, 0);
    t = Clock::now();
    for (size_t q = 0; q < n; ++q) {
        ibv_sge sge{reinterpret_cast<uint64_t>(&b.region[q * o.size]),
                    static_cast<uint32_t>(o.size), b.mr->lkey};
        ibv_send_wr wr{};
        ibv_send_wr* bad = nullptr;
        wr.wr_id = q;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED;
        if (ibv_post_send(b.qps[q], &wr, &bad) != 0)
            fail("SEND post failed on QP " + std::to_string(q));
    }
    collect(b.cq, n, sent, deadline, "SEND");
    collect(a.cq, n, received, deadline, "receive");
    const double send_s = seconds_since(t);
    const size_t heap3 = heap_bytes(), rss3 = rss_bytes();

    size_t verified = 0;
    for (size_t q = 0; q < n; ++q) {
        bool ok = written[q] == 1 && sent[q] == 1 && received[q] == 1;
        for (size_t i = 0; ok && i < o.size; ++i)
            ok = b.region[q * o.size + i] == pattern(q, i) && back[q * o.size + i] == pattern(q, i);
        verified += ok;
    }
    const size_t back_bytes = back.size();  // the receive buffers: not the QPs' own state
    ibv_dereg_mr(back_mr);
    a.close();
    b.close();

    const double qps_total = 2.0 * static_cast<double>(n);
    const auto per_qp = [qps_total](size_t after, size_t before) {
        return after > before ? static_cast<double>(after - before) / qps_total : 0.0;
    };
    std::printf(
        "qps=%zu qps_total=%zu size=%zu wr=%u create_s=%.3f connect_s=%.3f write_s=%.3f "
        "send_s=%.3f heap_per_qp=%.0f rss_per_qp=%.0f heap_per_qp_connected=%.0f "
        "rss_per_qp_connected=%.0f heap_per_qp_after_traffic=%.0f heap_after_traffic_mb=%.1f "
        "rss_after_traffic_mb=%.1f verified=%zu\n",
        n, 2 * n, o.size, o.wr, create_s, connect_s, write_s, send_s, per_qp(heap1, heap0),
        per_qp(rss1, rss0), per_qp(heap2, heap0), per_qp(rss2, rss0),
        per_qp(heap3 - back_bytes, heap0), static_cast<double>(heap3) / 1e6,
        static_cast<double>(rss3) / 1e6, verified);
    if (verified != n) {
        std::fprintf(stderr, "uroce-many-qps: %zu of %zu QPs carried their data intact\n", verified,
                     n);
        return 1;
    }
    return 0;
}
