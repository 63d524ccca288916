// rc_verify's verbs set-up and its data patterns (rc_verify.h).
#include <infiniband/verbs.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "rc_verify.h"
#include "uroce/path_mtu.h"

namespace rc_verify {
namespace {

uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

}  // namespace

ibv_mtu mtu_enum(int mtu) {
    return uroce::mtu_enum(static_cast<uint32_t>(mtu)).value_or(IBV_MTU_4096);
}

int mtu_bytes(ibv_mtu m) {
    return 128 << static_cast<int>(m);
}

const char* qp_state_name(ibv_qp_state s) {
    switch (s) {
        case IBV_QPS_RESET:
            return "RESET";
        case IBV_QPS_INIT:
            return "INIT";
        case IBV_QPS_RTR:
            return "RTR";
        case IBV_QPS_RTS:
            return "RTS";
        case IBV_QPS_SQD:
            return "SQD";
        case IBV_QPS_SQE:
            return "SQE";
        case IBV_QPS_ERR:
            return "ERR";
        default:
            return "UNKNOWN";
    }
}

// Fresh bytes for iteration `iter`: a different stream for every iteration and seed.
void fill_data(uint8_t* p, size_t n, uint64_t seed, uint64_t iter) {
    uint64_t state = mix64(seed ^ mix64(iter + 1));
    size_t i = 0;
    while (i < n) {
        state = mix64(state);
        for (int b = 0; b < 8 && i < n; ++b, ++i) p[i] = static_cast<uint8_t>(state >> (8 * b));
    }
}

// What a READ buffer holds before the READ lands: depends on the offset only, so untouched
// stretches are recognisable.
uint8_t canary(size_t off) {
    return static_cast<uint8_t>(0xc3 ^ (off * 37) ^ (off >> 8));
}

void fill_canary(uint8_t* p, size_t n) {
    for (size_t i = 0; i < n; ++i) p[i] = canary(i);
}

bool guard_intact(const uint8_t* p, size_t n) {
    for (size_t i = 0; i < n; ++i)
        if (p[i] != kGuardByte) return false;
    return true;
}

std::string gid_text(const ibv_gid& g) {
    char buf[INET6_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET6, g.raw, buf, sizeof buf);
    return buf;
}

void open_verbs(const Options& o, Verbs& v, unsigned send_wrs) {
    int num = 0;
    ibv_device** list = ibv_get_device_list(&num);
    if (list == nullptr || num == 0) die(kExitUsage, "no RDMA devices");
    ibv_device* dev = nullptr;
    for (int i = 0; i < num; ++i) {
        if (o.device.empty() || o.device == ibv_get_device_name(list[i])) {
            dev = list[i];
            break;
        }
    }
    if (dev == nullptr) die(kExitUsage, "device %s not found", o.device.c_str());
    v.ctx = ibv_open_device(dev);
    if (v.ctx == nullptr)
        die(kExitUsage, "ibv_open_device(%s): %s", ibv_get_device_name(dev), std::strerror(errno));
    std::string name = ibv_get_device_name(dev);
    ibv_free_device_list(list);
    if (ibv_query_device(v.ctx, &v.dev_attr) != 0) die(kExitUsage, "ibv_query_device failed");
    if (ibv_query_port(v.ctx, static_cast<uint8_t>(o.ib_port), &v.port_attr) != 0)
        die(kExitUsage, "ibv_query_port failed");
    if (ibv_query_gid(v.ctx, static_cast<uint8_t>(o.ib_port), o.gid_index, &v.gid) != 0)
        die(kExitUsage, "ibv_query_gid(%d) failed", o.gid_index);
    v.path_mtu = std::min(mtu_enum(o.mtu), v.port_attr.active_mtu);
    logf(
        "device %s port %d gid[%d] %s active_mtu %d path_mtu %d max_qp_rd_atom %d "
        "max_qp_init_rd_atom %d",
        name.c_str(), o.ib_port, o.gid_index, gid_text(v.gid).c_str(),
        mtu_bytes(v.port_attr.active_mtu), mtu_bytes(v.path_mtu), v.dev_attr.max_qp_rd_atom,
        v.dev_attr.max_qp_init_rd_atom);
    v.pd = ibv_alloc_pd(v.ctx);
    if (v.pd == nullptr) die(kExitUsage, "ibv_alloc_pd: %s", std::strerror(errno));
    if (!o.busy_poll) {
        v.channel = ibv_create_comp_channel(v.ctx);
        if (v.channel == nullptr)
            die(kExitUsage, "ibv_create_comp_channel: %s", std::strerror(errno));
    }
    int cqe = static_cast<int>(send_wrs) + 4;
    v.cq = ibv_create_cq(v.ctx, cqe, nullptr, v.channel, 0);
    if (v.cq == nullptr) die(kExitUsage, "ibv_create_cq(%d): %s", cqe, std::strerror(errno));
    ibv_qp_init_attr ia{};
    ia.send_cq = v.cq;
    ia.recv_cq = v.cq;
    ia.qp_type = IBV_QPT_RC;
    ia.sq_sig_all = 0;
    ia.cap.max_send_wr = send_wrs;
    ia.cap.max_recv_wr = 1;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    v.qp = ibv_create_qp(v.pd, &ia);
    if (v.qp == nullptr) die(kExitUsage, "ibv_create_qp: %s", std::strerror(errno));
    // The async fd is read without blocking (report_async_events).
    int fl = ::fcntl(v.ctx->async_fd, F_GETFL);
    if (fl >= 0) ::fcntl(v.ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
}

ibv_mr* reg(Verbs& v, void* p, size_t n, int access) {
    ibv_mr* mr = ibv_reg_mr(v.pd, p, n, access);
    if (mr == nullptr) die(kExitUsage, "ibv_reg_mr(%zu bytes): %s", n, std::strerror(errno));
    v.mrs.push_back(mr);
    return mr;
}

void connect_qp(const Options& o, Verbs& v, const PeerInfo& local, const PeerInfo& remote,
                int max_rd_atomic, int max_dest_rd_atomic) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = static_cast<uint8_t>(o.ib_port);
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    if (ibv_modify_qp(v.qp, &a,
                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0)
        die(kExitUsage, "modify_qp INIT: %s", std::strerror(errno));

    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = v.path_mtu;
    a.dest_qp_num = remote.qpn;
    a.rq_psn = remote.psn;
    a.max_dest_rd_atomic = static_cast<uint8_t>(max_dest_rd_atomic);
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = remote.gid;
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(o.gid_index);
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = static_cast<uint8_t>(o.ib_port);
    if (ibv_modify_qp(v.qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0)
        die(kExitUsage, "modify_qp RTR: %s", std::strerror(errno));

    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = local.psn;
    a.timeout = static_cast<uint8_t>(o.timeout);
    a.retry_cnt = static_cast<uint8_t>(o.retry);
    a.rnr_retry = static_cast<uint8_t>(o.rnr_retry);
    a.max_rd_atomic = static_cast<uint8_t>(max_rd_atomic);
    if (ibv_modify_qp(v.qp, &a,
                      IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                          IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC) != 0)
        die(kExitUsage, "modify_qp RTS: %s", std::strerror(errno));
    logf(
        "QP 0x%06x (psn 0x%06x) -> peer QP 0x%06x (psn 0x%06x) gid %s: RTS, max_rd_atomic %d, "
        "max_dest_rd_atomic %d, timeout %d, retry %d",
        local.qpn, local.psn, remote.qpn, remote.psn, gid_text(remote.gid).c_str(), max_rd_atomic,
        max_dest_rd_atomic, o.timeout, o.retry);
}

std::string qp_state_now(Verbs& v) {
    ibv_qp_attr a{};
    ibv_qp_init_attr ia{};
    if (ibv_query_qp(v.qp, &a, IBV_QP_STATE, &ia) != 0) return "query-failed";
    return qp_state_name(a.qp_state);
}

// Drains the async event queue without blocking; returns how many events there were.
unsigned report_async_events(Verbs& v) {
    unsigned n = 0;
    for (;;) {
        pollfd pfd{v.ctx->async_fd, POLLIN, 0};
        if (::poll(&pfd, 1, 0) <= 0) break;
        ibv_async_event ev{};
        if (ibv_get_async_event(v.ctx, &ev) != 0) break;
        logf("async event: %s", ibv_event_type_str(ev.event_type));
        ibv_ack_async_event(&ev);
        ++n;
    }
    return n;
}

void close_verbs(Verbs& v) {
    if (v.unacked_events > 0) ibv_ack_cq_events(v.cq, v.unacked_events);
    if (v.qp != nullptr && ibv_destroy_qp(v.qp) != 0) logf("ibv_destroy_qp failed");
    for (ibv_mr* mr : v.mrs) ibv_dereg_mr(mr);
    if (v.cq != nullptr) ibv_destroy_cq(v.cq);
    if (v.channel != nullptr) ibv_destroy_comp_channel(v.channel);
    if (v.pd != nullptr) ibv_dealloc_pd(v.pd);
    if (v.ctx != nullptr) ibv_close_device(v.ctx);
}

// Polls the CQ; when it is empty, waits up to `wait_ms` for a completion event (or spins,
// with --poll). Returns the number of completions (>= 0) or -1 on a poll error.
int poll_some(Verbs& v, bool busy, ibv_wc* wc, int max, int wait_ms) {
    int n = ibv_poll_cq(v.cq, max, wc);
    if (n != 0 || busy) return n;
    if (!v.armed) {
        if (ibv_req_notify_cq(v.cq, 0) != 0) return -1;
        v.armed = true;
        n = ibv_poll_cq(v.cq, max, wc);  // what arrived before the arming
        if (n != 0) return n;
    }
    pollfd pfd{v.channel->fd, POLLIN, 0};
    int r = ::poll(&pfd, 1, wait_ms);
    if (r > 0) {
        ibv_cq* ev_cq = nullptr;
        void* ev_ctx = nullptr;
        if (ibv_get_cq_event(v.channel, &ev_cq, &ev_ctx) == 0) {
            v.armed = false;
            if (++v.unacked_events >= 64) {
                ibv_ack_cq_events(v.cq, v.unacked_events);
                v.unacked_events = 0;
            }
        }
    }
    return ibv_poll_cq(v.cq, max, wc);
}

}  // namespace rc_verify
