// A client for rdma-core's ibv_rc_pingpong server that checks every byte.
//
// ibv_rc_pingpong's own -c check looks at one byte per page, on the client only, in a buffer
// it also sends from, so a run of it proves completions, not data. This program speaks the
// server's out-of-band exchange (TCP: "LLLL:QQQQQQ:PPPPPP:GID" both ways, then "done") and then
// plays the client's part: each iteration it sends a message of fresh pseudo-random bytes and
// receives the server's reply. The server receives into its one buffer and sends that same
// buffer back, so the reply must equal the message byte for byte: the bytes crossed the wire
// twice, through the server's receive and send paths. Guard bytes around the receive buffer
// (inside the registered region) must stay untouched.
//
// usage: pingpong_verify -d DEVICE -p TCP_PORT -s SIZE -n ITERS [-m MTU] [-l LINGER_MS] SERVER_IP
// -l keeps the QP alive that long after the last reply, so that under injected loss the server
// can still have its last message acknowledged (ibv_rc_pingpong's client has no such grace).
// Exit 0 when every reply matched; 1 with the first mismatch (iteration, offset) otherwise.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "uroce/path_mtu.h"

namespace {

constexpr size_t kGuard = 64;
constexpr uint8_t kGuardByte = 0xa5;
constexpr auto kIterationLimit = std::chrono::seconds(30);
// sizeof "0000:000000:000000:" plus 32 hex digits of GID plus the NUL.
constexpr size_t kMsgBytes = 4 + 1 + 6 + 1 + 6 + 1 + 32 + 1;

struct Options {
    std::string device;
    std::string server;
    int port = 18515;
    size_t size = 4096;
    long iters = 1000;
    int mtu = 1024;
    int linger_ms = 0;
};

[[noreturn]] void fail(const std::string& what) {
    std::fprintf(stderr, "pingpong_verify: %s\n", what.c_str());
    std::exit(1);
}

ibv_mtu mtu_enum(int mtu) {
    const auto e = uroce::mtu_enum(static_cast<uint32_t>(mtu));
    if (!e) fail("bad MTU " + std::to_string(mtu));
    return *e;
}

// The message bytes of iteration `iter`: different in every byte position and iteration.
void fill_message(uint8_t* p, size_t n, long iter) {
    uint64_t x = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(iter + 1) + 0x2545f4914f6cdd1dull;
    for (size_t i = 0; i < n; ++i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = static_cast<uint8_t>(x >> 24);
    }
}

struct Dest {
    unsigned lid = 0, qpn = 0, psn = 0;
    ibv_gid gid{};
};

std::string to_wire(const Dest& d) {
    char msg[kMsgBytes];
    int n = std::snprintf(msg, sizeof msg, "%04x:%06x:%06x:", d.lid, d.qpn, d.psn);
    for (int i = 0; i < 16; ++i)
        n += std::snprintf(msg + n, sizeof msg - static_cast<size_t>(n), "%02x", d.gid.raw[i]);
    return std::string(msg, kMsgBytes);  // with the NUL, as the server reads it
}

Dest from_wire(const char* msg) {
    Dest d;
    char gid[33] = {};
    if (std::sscanf(msg, "%x:%x:%x:%32s", &d.lid, &d.qpn, &d.psn, gid) != 4 ||
        std::strlen(gid) != 32)
        fail("cannot parse the server's address message");
    for (int i = 0; i < 16; ++i) {
        const char byte[3] = {gid[2 * i], gid[2 * i + 1], 0};
        d.gid.raw[i] = static_cast<uint8_t>(std::strtoul(byte, nullptr, 16));
    }
    return d;
}

bool write_all(int fd, const void* p, size_t n) {
    return ::write(fd, p, n) == static_cast<ssize_t>(n);
}

bool read_all(int fd, void* p, size_t n) {
    auto* b = static_cast<uint8_t*>(p);
    for (size_t got = 0; got < n;) {
        const ssize_t r = ::read(fd, b + got, n - got);
        if (r <= 0) return false;
        got += static_cast<size_t>(r);
    }
    return true;
}

// The client's side of ibv_rc_pingpong's exchange.
Dest exchange(const Options& o, const Dest& mine) {
    int fd = -1;
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(o.port));
    if (::inet_pton(AF_INET, o.server.c_str(), &sa.sin_addr) != 1) fail("bad server address");
    for (int attempt = 0; attempt < 50 && fd < 0; ++attempt) {
        fd = ::socket(AF_INET, SOCK_STREAM, 0);
        if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
            ::close(fd);
            fd = -1;
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
    }
    if (fd < 0) fail("Couldn't connect to " + o.server + ":" + std::to_string(o.port));
    const std::string msg = to_wire(mine);
    char reply[kMsgBytes];
    if (!write_all(fd, msg.data(), msg.size()) || !read_all(fd, reply, sizeof reply) ||
        !write_all(fd, "done", sizeof "done"))
        fail("address exchange with the server failed");
    ::close(fd);
    reply[kMsgBytes - 1] = 0;
    return from_wire(reply);
}

Options parse(int argc, char** argv) {
    Options o;
    int c;
    while ((c = ::getopt(argc, argv, "d:p:s:n:m:l:")) != -1) {
        switch (c) {
            case 'd':
                o.device = optarg;
                break;
            case 'p':
                o.port = std::atoi(optarg);
                break;
            case 's':
                o.size = std::strtoul(optarg, nullptr, 0);
                break;
            case 'n':
                o.iters = std::atol(optarg);
                break;
            case 'm':
                o.mtu = std::atoi(optarg);
                break;
            case 'l':
                o.linger_ms = std::atoi(optarg);
                break;
            default:
                fail(
                    "usage: pingpong_verify -d DEV -p PORT -s SIZE -n ITERS [-m MTU] [-l MS] "
                    "SERVER");
        }
    }
    if (optind != argc - 1 || o.device.empty() || o.size == 0 || o.iters <= 0)
        fail("usage: pingpong_verify -d DEV -p PORT -s SIZE -n ITERS [-m MTU] [-l MS] SERVER");
    o.server = argv[optind];
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    const Options o = parse(argc, argv);

    int num = 0;
    ibv_device** list = ibv_get_device_list(&num);
    ibv_device* dev = nullptr;
    for (int i = 0; list && i < num; ++i)
        if (o.device == ibv_get_device_name(list[i])) dev = list[i];
    if (!dev) fail("device " + o.device + " not found");
    ibv_context* ctx = ibv_open_device(dev);
    if (!ctx) fail("cannot open " + o.device);
    ibv_pd* pd = ibv_alloc_pd(ctx);
    ibv_cq* cq = pd ? ibv_create_cq(ctx, 16, nullptr, nullptr, 0) : nullptr;
    std::vector<uint8_t> sendbuf(o.size);
    std::vector<uint8_t> arena(kGuard + o.size + kGuard, kGuardByte);  // guard | receive | guard
    uint8_t* recvbuf = arena.data() + kGuard;
    ibv_mr* smr = cq ? ibv_reg_mr(pd, sendbuf.data(), sendbuf.size(), 0) : nullptr;
    // An int, not the enum: libibverbs' ibv_reg_mr macro ANDs it with another enum type,
    // which clang refuses.
    constexpr int kLocalWrite = IBV_ACCESS_LOCAL_WRITE;
    ibv_mr* rmr = smr ? ibv_reg_mr(pd, arena.data(), arena.size(), kLocalWrite) : nullptr;
    ibv_qp_init_attr init{};
    init.send_cq = cq;
    init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = 2;
    init.cap.max_recv_wr = 2;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    ibv_qp* qp = rmr ? ibv_create_qp(pd, &init) : nullptr;
    if (!qp) fail("cannot create PD, CQ, MRs or QP");

    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        fail("INIT failed");
    Dest mine;
    mine.qpn = qp->qp_num;
    mine.psn = static_cast<unsigned>(::getpid() * 2654435761u) & 0xffffff;
    if (ibv_query_gid(ctx, 1, 0, &mine.gid)) fail("ibv_query_gid failed");
    const Dest peer = exchange(o, mine);

    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = mtu_enum(o.mtu);
    a.dest_qp_num = peer.qpn;
    a.rq_psn = peer.psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = peer.gid;
    a.ah_attr.grh.sgid_index = 0;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        fail("RTR failed");
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = mine.psn;
    a.max_rd_atomic = 1;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
        fail("RTS failed");

    bool last_send_unacknowledged_at_end = false;
    for (long iter = 0; iter < o.iters; ++iter) {
        fill_message(sendbuf.data(), o.size, iter);
        std::memset(recvbuf, 0, o.size);
        ibv_sge rsge{reinterpret_cast<uint64_t>(recvbuf), static_cast<uint32_t>(o.size), rmr->lkey};
        ibv_recv_wr rwr{};
        rwr.wr_id = 1;
        rwr.sg_list = &rsge;
        rwr.num_sge = 1;
        ibv_recv_wr* bad_r = nullptr;
        if (ibv_post_recv(qp, &rwr, &bad_r)) fail("ibv_post_recv failed");
        ibv_sge ssge{reinterpret_cast<uint64_t>(sendbuf.data()), static_cast<uint32_t>(o.size),
                     smr->lkey};
        ibv_send_wr swr{};
        swr.wr_id = 2;
        swr.sg_list = &ssge;
        swr.num_sge = 1;
        swr.opcode = IBV_WR_SEND;
        swr.send_flags = IBV_SEND_SIGNALED;
        ibv_send_wr* bad_s = nullptr;
        if (ibv_post_send(qp, &swr, &bad_s)) fail("ibv_post_send failed");

        bool sent = false, received = false, last_send_unacknowledged = false;
        uint32_t byte_len = 0;
        const auto deadline = std::chrono::steady_clock::now() + kIterationLimit;
        while (!(sent && received)) {
            ibv_wc wc[2];
            const int n = ibv_poll_cq(cq, 2, wc);
            if (n < 0) fail("ibv_poll_cq failed");
            for (int i = 0; i < n; ++i) {
                // ibv_rc_pingpong's server leaves as soon as its last reply is acknowledged,
                // with no closing handshake: if the ACK of our last message is lost, nobody is
                // left to answer its retransmissions. The reply itself proves the server
                // received that message (it replies only after receiving), so on the last
                // iteration alone, retry-exceeded on the send is that race, not a failure.
                if (iter == o.iters - 1 && wc[i].wr_id == 2 &&
                    wc[i].status == IBV_WC_RETRY_EXC_ERR) {
                    sent = true;
                    last_send_unacknowledged = true;
                    continue;
                }
                if (wc[i].status != IBV_WC_SUCCESS)
                    fail("iteration " + std::to_string(iter) + ": completion status " +
                         ibv_wc_status_str(wc[i].status));
                if (wc[i].wr_id == 2) sent = true;
                if (wc[i].wr_id == 1) {
                    received = true;
                    byte_len = wc[i].byte_len;
                }
            }
            if (n == 0 && std::chrono::steady_clock::now() > deadline)
                fail("iteration " + std::to_string(iter) + ": no reply");
        }
        if (byte_len != o.size)
            fail("iteration " + std::to_string(iter) + ": reply of " + std::to_string(byte_len) +
                 " bytes, sent " + std::to_string(o.size));
        if (std::memcmp(recvbuf, sendbuf.data(), o.size) != 0) {
            size_t at = 0;
            while (recvbuf[at] == sendbuf[at]) ++at;
            char detail[96];
            std::snprintf(detail, sizeof detail, ": byte %zu is 0x%02x, sent 0x%02x", at,
                          recvbuf[at], sendbuf[at]);
            fail("iteration " + std::to_string(iter) + detail);
        }
        for (size_t i = 0; i < kGuard; ++i)
            if (arena[i] != kGuardByte || arena[kGuard + o.size + i] != kGuardByte)
                fail("iteration " + std::to_string(iter) +
                     ": guard bytes around the receive "
                     "buffer changed");
        last_send_unacknowledged_at_end = last_send_unacknowledged;
    }
    if (last_send_unacknowledged_at_end)
        std::printf(
            "pingpong_verify: the server left before acknowledging the last message "
            "(its reply proves delivery)\n");
    std::printf(
        "pingpong_verify: %ld iterations of %zu bytes: every reply equals its message "
        "(%llu bytes checked)\n",
        o.iters, o.size, static_cast<unsigned long long>(o.iters) * o.size);

    // The transport answers retransmissions on its own thread; nothing to do but wait.
    std::this_thread::sleep_for(std::chrono::milliseconds(o.linger_ms));
    ibv_destroy_qp(qp);
    ibv_dereg_mr(rmr);
    ibv_dereg_mr(smr);
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    return 0;
}
