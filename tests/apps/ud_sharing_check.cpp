// A UD QP of one device sends post lists alternately to the QPs of two contexts of another
// device, which share that device (docs/device-sharing.md); every datagram must reach its own
// context, byte for byte (in any order: one put back into the steering comes late).
//
// The two devices are in two network namespaces joined by a veth pair whose receiving end
// merges datagrams (GRO): the datagrams of one post list all leave from the sending QP's UDP
// source port, so they are one UDP flow, and the receiving kernel may merge a datagram for
// one context with the next one, for the other context, into one buffer, which the device's
// steering program hands to the context of the first.
//
// usage: ud_sharing_check SEND_NETNS SEND_DEVICE RECV_NETNS RECV_DEVICE ROUNDS [MAX_ROUNDS]
// (namespaces as paths: /run/netns/NAME). After ROUNDS lists it goes on, up to MAX_ROUNDS,
// until a context has read a merged buffer: whether the kernel merges depends on when its
// NAPI thread runs, and a busy machine may let a few hundred lists through unmerged.
// One process: it enters the sending namespace to open the sending device, then the
// receiving one to open the receiving device twice (a socket stays in the namespace it was
// made in). Prints the rounds sent and one line per context (datagrams received,
// rx_unknown_qp, rx_gro_datagrams) and exits 0 only if every datagram reached its own
// context intact and none was counted unknown; 1 otherwise; 2 on a setup error.
#include <dlfcn.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <link.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "uroce/uroce.h"

namespace {

constexpr uint32_t kQkey = 0x11111111;
constexpr uint32_t kLen = 200;  // every datagram of a list the same size: GRO merges them
constexpr uint32_t kGrh = 40;
constexpr uint32_t kSlot = kGrh + kLen;  // one receive buffer
constexpr int kList = 16;                // a post list: 8 datagrams to each context, alternately
constexpr auto kWait = std::chrono::seconds(5);

[[noreturn]] void fail_setup(const std::string& what) {
    std::fprintf(stderr, "ud_sharing_check: %s\n", what.c_str());
    std::exit(2);
}

void enter(const char* netns) {
    const int fd = ::open(netns, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) fail_setup(std::string("cannot enter ") + netns);
    ::close(fd);
}

ibv_context* open_device(const char* name) {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    ibv_context* ctx = nullptr;
    for (int i = 0; list && i < n && !ctx; ++i)
        if (std::strcmp(ibv_get_device_name(list[i]), name) == 0) ctx = ibv_open_device(list[i]);
    if (list) ibv_free_device_list(list);
    if (!ctx) fail_setup(std::string("cannot open ") + name);
    return ctx;
}

uroce_read_counter_fn find_read_counter() {
    void* handle = nullptr;
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* out) {
            if (std::strstr(info->dlpi_name, "liburoce-rdmav") == nullptr) return 0;
            *static_cast<void**>(out) = ::dlopen(info->dlpi_name, RTLD_NOW | RTLD_NOLOAD);
            return 1;
        },
        &handle);
    void* fn = handle ? ::dlsym(handle, "uroce_read_counter") : nullptr;
    if (!fn) fail_setup("uroce_read_counter not found: not a uroce device?");
    return reinterpret_cast<uroce_read_counter_fn>(fn);
}

struct End {
    ibv_context* ctx;
    ibv_pd* pd;
    ibv_cq* cq;
    ibv_qp* qp;
    ibv_mr* mr;
    std::vector<uint8_t> buf;
    ibv_gid gid{};

    End(const char* device, size_t bytes) : ctx(open_device(device)), buf(bytes) {
        pd = ibv_alloc_pd(ctx);
        cq = pd ? ibv_create_cq(ctx, 4 * kList, nullptr, nullptr, 0) : nullptr;
        // An int: ibv_reg_mr's macro masks the access with another enum type (clang rejects
        // the mix).
        const int access = IBV_ACCESS_LOCAL_WRITE;
        mr = pd ? ibv_reg_mr(pd, buf.data(), buf.size(), access) : nullptr;
        ibv_qp_init_attr init{};
        init.send_cq = init.recv_cq = cq;
        init.qp_type = IBV_QPT_UD;
        init.cap.max_send_wr = init.cap.max_recv_wr = 2 * kList;
        init.cap.max_send_sge = init.cap.max_recv_sge = 1;
        qp = cq && mr ? ibv_create_qp(pd, &init) : nullptr;
        if (!qp || ibv_query_gid(ctx, 1, 0, &gid) != 0) fail_setup("cannot create a UD QP");
        ibv_qp_attr a{};
        a.qp_state = IBV_QPS_INIT;
        a.port_num = 1;
        a.qkey = kQkey;
        bool ok = ibv_modify_qp(qp, &a,
                                IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0;
        a = {};
        a.qp_state = IBV_QPS_RTR;
        ok = ok && ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0;
        a = {};
        a.qp_state = IBV_QPS_RTS;
        ok = ok && ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0;
        if (!ok) fail_setup("cannot bring a UD QP to RTS");
    }
    void post_recvs(int count) {
        for (int i = 0; i < count; ++i) {
            ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()) + i * kSlot, kSlot, mr->lkey};
            ibv_recv_wr wr{};
            ibv_recv_wr* bad = nullptr;
            wr.wr_id = static_cast<uint64_t>(i);
            wr.sg_list = &sge;
            wr.num_sge = 1;
            if (ibv_post_recv(qp, &wr, &bad) != 0) fail_setup("ibv_post_recv failed");
        }
    }
};

// Polls `cq` until `want` completions or kWait has passed (a lost datagram never completes).
std::vector<ibv_wc> poll_for(ibv_cq* cq, int want) {
    std::vector<ibv_wc> got;
    const auto end = std::chrono::steady_clock::now() + kWait;
    while (static_cast<int>(got.size()) < want && std::chrono::steady_clock::now() < end) {
        ibv_wc wc[kList];
        const int n = ibv_poll_cq(cq, kList, wc);
        if (n > 0)
            got.insert(got.end(), wc, wc + n);
        else
            std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return got;
}

uint8_t pattern(int round, int i, uint32_t k) {
    return static_cast<uint8_t>(round * 131 + i * 31 + k * 7 + 1);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 6 && argc != 7) {
        std::fprintf(stderr,
                     "usage: ud_sharing_check SEND_NETNS SEND_DEVICE RECV_NETNS RECV_DEVICE "
                     "ROUNDS [MAX_ROUNDS]\n");
        return 2;
    }
    const int min_rounds = std::atoi(argv[5]);
    const int max_rounds = argc == 7 ? std::atoi(argv[6]) : min_rounds;
    if (min_rounds < 1 || max_rounds < min_rounds) fail_setup("bad ROUNDS or MAX_ROUNDS");
    enter(argv[1]);
    End a(argv[2], kLen * kList);
    enter(argv[3]);
    End b1(argv[4], kSlot * kList), b2(argv[4], kSlot * kList);
    if (b1.qp->qp_num >> 12 == b2.qp->qp_num >> 12) fail_setup("the two contexts share a slot");
    const uroce_read_counter_fn read_counter = find_read_counter();

    ibv_ah_attr attr{};
    attr.is_global = 1;
    attr.grh.dgid = b1.gid;
    attr.grh.hop_limit = 64;
    attr.port_num = 1;
    ibv_ah* ah = ibv_create_ah(a.pd, &attr);
    if (!ah) fail_setup("cannot create an address handle");

    End* to[2] = {&b1, &b2};
    uint64_t received[2] = {0, 0}, wrong[2] = {0, 0};
    bool lost = false;
    int rounds = 0;
    const auto merged = [&] {
        uint64_t total = 0;
        for (End* end : to) {
            uint64_t gro = 0;
            read_counter(end->ctx, "rx_gro_datagrams", &gro);
            total += gro;
        }
        return total > 0;
    };
    for (int r = 0; r < max_rounds && !lost && (r < min_rounds || !merged()); ++r, ++rounds) {
        b1.post_recvs(kList / 2);
        b2.post_recvs(kList / 2);
        ibv_sge sges[kList];
        ibv_send_wr wrs[kList];
        for (int i = 0; i < kList; ++i) {
            for (uint32_t k = 0; k < kLen; ++k) a.buf[i * kLen + k] = pattern(r, i, k);
            sges[i] = {reinterpret_cast<uintptr_t>(a.buf.data()) + i * kLen, kLen, a.mr->lkey};
            wrs[i] = ibv_send_wr{};
            wrs[i].wr_id = static_cast<uint64_t>(i);
            wrs[i].opcode = IBV_WR_SEND;
            wrs[i].sg_list = &sges[i];
            wrs[i].num_sge = 1;
            wrs[i].send_flags = IBV_SEND_SIGNALED;
            wrs[i].wr.ud.ah = ah;
            wrs[i].wr.ud.remote_qpn = to[i % 2]->qp->qp_num;  // message i: receive i / 2
            wrs[i].wr.ud.remote_qkey = kQkey;
            wrs[i].next = i + 1 < kList ? &wrs[i + 1] : nullptr;
        }
        ibv_send_wr* bad = nullptr;
        if (ibv_post_send(a.qp, wrs, &bad) != 0) fail_setup("ibv_post_send failed");
        if (poll_for(a.cq, kList).size() != static_cast<size_t>(kList))
            fail_setup("the sends did not complete");
        for (int c = 0; c < 2; ++c) {
            const std::vector<ibv_wc> got = poll_for(to[c]->cq, kList / 2);
            // A datagram put back into the steering (kernel_resteer.h) arrives after those
            // behind it: each buffer must hold one of the context's messages of this round,
            // each message once, in any order.
            bool seen[kList / 2] = {};
            for (const ibv_wc& wc : got) {
                const int j = static_cast<int>(wc.wr_id);
                const uint8_t* in = to[c]->buf.data() + j * kSlot + kGrh;
                bool ok = wc.status == IBV_WC_SUCCESS && wc.byte_len == kSlot &&
                          wc.src_qp == a.qp->qp_num;
                int m = 0;
                for (; ok && m < kList / 2; ++m) {
                    uint32_t k = 0;
                    while (k < kLen && in[k] == pattern(r, 2 * m + c, k)) ++k;
                    if (k == kLen) break;
                }
                ok = ok && m < kList / 2 && !seen[m];
                if (ok) seen[m] = true;
                ++(ok ? received[c] : wrong[c]);
            }
            // A datagram lost leaves a receive posted on a buffer the next round reuses:
            // stop after this round.
            if (got.size() != static_cast<size_t>(kList / 2)) lost = true;
        }
    }
    bool ok = true;
    const uint64_t want = static_cast<uint64_t>(rounds) * (kList / 2);
    std::printf("%d rounds\n", rounds);
    for (int c = 0; c < 2; ++c) {
        uint64_t unknown = 0, gro = 0;
        read_counter(to[c]->ctx, "rx_unknown_qp", &unknown);
        read_counter(to[c]->ctx, "rx_gro_datagrams", &gro);
        std::printf(
            "context %d: %llu of %llu datagrams received intact, %llu wrong, "
            "rx_unknown_qp %llu, rx_gro_datagrams %llu\n",
            c + 1, static_cast<unsigned long long>(received[c]),
            static_cast<unsigned long long>(want), static_cast<unsigned long long>(wrong[c]),
            static_cast<unsigned long long>(unknown), static_cast<unsigned long long>(gro));
        ok = ok && received[c] == want && wrong[c] == 0 && unknown == 0;
    }
    std::fflush(stdout);
    // Exits without tearing down: the contexts close with the process.
    std::_Exit(ok ? 0 : 1);
}
