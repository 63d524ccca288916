#include "tests/integration/verbs_fixture.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "uroce/uroce.h"

namespace uroce::test {

int run_uroce(const std::vector<std::string>& args, std::string* out) {
    const char* exe = std::getenv("UROCE_EXE");
    if (!exe) throw std::runtime_error("UROCE_EXE is not set (run through meson test)");
    std::string cmd = std::string("'") + exe + "'";
    for (const auto& a : args) cmd += " '" + a + "'";
    cmd += " 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return -1;
    std::array<char, 512> buf{};
    std::string text;
    while (std::fgets(buf.data(), buf.size(), p)) text += buf.data();
    const int status = ::pclose(p);
    if (out) *out = text;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

ibv_context* open_device(const std::string& name) {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (!list) throw std::runtime_error("ibv_get_device_list failed");
    ibv_context* ctx = nullptr;
    for (int i = 0; i < n; ++i)
        if (name == ibv_get_device_name(list[i])) ctx = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    if (!ctx) throw std::runtime_error("cannot open device " + name);
    return ctx;
}

int open_errno_with_env(const std::string& name, const char* var, const char* value) {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (!list) throw std::runtime_error("ibv_get_device_list failed");
    ibv_device* dev = nullptr;
    for (int i = 0; i < n; ++i)
        if (name == ibv_get_device_name(list[i])) dev = list[i];
    int err = ENODEV;
    if (dev) {
        ::setenv(var, value, 1);
        errno = 0;
        ibv_context* ctx = ibv_open_device(dev);
        err = ctx ? 0 : errno;
        ::unsetenv(var);
        if (ctx) ibv_close_device(ctx);
    }
    ibv_free_device_list(list);
    return err;
}

namespace {

// A function the provider exports (uroce/uroce.h), found in the loaded provider.
void* provider_symbol(const char* symbol) {
    const char* drv = std::getenv("RDMAV_DRIVERS");
    const std::string path = std::string(drv ? drv : "") + UROCE_PROVIDER_SUFFIX;
    void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    void* fn = h ? ::dlsym(h, symbol) : nullptr;
    if (!fn) throw std::runtime_error(std::string(symbol) + " not found in the provider");
    return fn;
}

}  // namespace

uint64_t counter(ibv_context* ctx, const char* name) {
    static auto fn = reinterpret_cast<uroce_read_counter_fn>(provider_symbol("uroce_read_counter"));
    uint64_t v = 0;
    if (fn(ctx, name, &v) != 0) throw std::runtime_error(std::string("no counter ") + name);
    return v;
}

bool wait_counter(ibv_context* ctx, const char* name, uint64_t want) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (counter(ctx, name) < want) {
        if (std::chrono::steady_clock::now() >= end) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
}

uint64_t qp_counter(ibv_qp* qp, const char* name) {
    static auto fn =
        reinterpret_cast<uroce_read_qp_counter_fn>(provider_symbol("uroce_read_qp_counter"));
    uint64_t v = 0;
    if (fn(qp, name, &v) != 0) throw std::runtime_error(std::string("no QP counter ") + name);
    return v;
}

uint64_t device_counter(ibv_context* ctx, const char* name) {
    static auto fn = reinterpret_cast<uroce_read_device_counter_fn>(
        provider_symbol("uroce_read_device_counter"));
    uint64_t v = 0;
    if (fn(ctx, name, &v) != 0) throw std::runtime_error(std::string("no device counter ") + name);
    return v;
}

Endpoint::Endpoint(const std::string& device, const QpOptions& opt, bool with_channel) {
    ctx = open_device(device);
    pd = ibv_alloc_pd(ctx);
    if (with_channel) channel = ibv_create_comp_channel(ctx);
    cq = ibv_create_cq(ctx, 4096, nullptr, channel, 0);
    ibv_qp_init_attr init{};
    init.send_cq = cq;
    init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = opt.max_send_wr;
    init.cap.max_recv_wr = opt.max_recv_wr;
    init.cap.max_send_sge = 4;
    init.cap.max_recv_sge = 4;
    if (pd && cq) qp = ibv_create_qp(pd, &init);
    if (!pd || !cq || !qp || (with_channel && !channel))
        throw std::runtime_error("cannot create endpoint objects on " + device);
    if (ibv_query_gid(ctx, 1, 0, &gid) != 0) throw std::runtime_error("ibv_query_gid failed");
}

Endpoint::~Endpoint() {
    if (qp) ibv_destroy_qp(qp);
    if (cq) ibv_destroy_cq(cq);
    if (channel) ibv_destroy_comp_channel(channel);
    if (pd) ibv_dealloc_pd(pd);
    if (ctx) ibv_close_device(ctx);
}

ibv_qp* create_qp_ex(Endpoint& ep, ibv_qp_type type, uint64_t ops, uint32_t depth, uint32_t sges) {
    ibv_qp_init_attr_ex attr{};
    attr.send_cq = attr.recv_cq = ep.cq;
    attr.qp_type = type;
    attr.cap.max_send_wr = attr.cap.max_recv_wr = depth;
    attr.cap.max_send_sge = attr.cap.max_recv_sge = sges;
    attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    attr.pd = ep.pd;
    attr.send_ops_flags = ops;
    return ibv_create_qp_ex(ep.ctx, &attr);
}

ibv_qp_state Endpoint::state() {
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    if (ibv_query_qp(qp, &attr, IBV_QP_STATE, &init) != 0) return IBV_QPS_UNKNOWN;
    return attr.qp_state;
}

void to_rts(Endpoint& local, uint32_t remote_qpn, const ibv_gid& remote_gid, const QpOptions& opt) {
    to_rts(local.qp, remote_qpn, remote_gid, opt);
}

void to_rts(ibv_qp* qp, uint32_t remote_qpn, const ibv_gid& remote_gid, const QpOptions& opt) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = opt.access & ~IBV_ACCESS_LOCAL_WRITE;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        throw std::runtime_error("INIT failed");
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = opt.mtu;
    a.dest_qp_num = remote_qpn;
    a.rq_psn = 0x123;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = opt.min_rnr_timer;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = remote_gid;
    a.ah_attr.grh.sgid_index = 0;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        throw std::runtime_error("RTR failed");
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0x123;
    a.timeout = opt.timeout;
    a.retry_cnt = opt.retry_cnt;
    a.rnr_retry = opt.rnr_retry;
    a.max_rd_atomic = 16;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                          IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
        throw std::runtime_error("RTS failed");
}

void connect(Endpoint& a, Endpoint& b, const QpOptions& opt) {
    to_rts(a, b.qp->qp_num, b.gid, opt);
    to_rts(b, a.qp->qp_num, a.gid, opt);
}

std::vector<ibv_wc> wait_completions(ibv_cq* cq, size_t n, std::chrono::milliseconds limit) {
    std::vector<ibv_wc> out;
    const auto end = std::chrono::steady_clock::now() + limit;
    while (out.size() < n && std::chrono::steady_clock::now() < end) {
        ibv_wc wc[16];
        const int got = ibv_poll_cq(cq, 16, wc);
        if (got < 0) break;
        out.insert(out.end(), wc, wc + got);
        if (got == 0) std::this_thread::yield();
    }
    return out;
}

bool wait_readable(int fd, std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            end - std::chrono::steady_clock::now());
        pollfd p{fd, POLLIN, 0};
        const int n = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
        if (n == 1) return (p.revents & POLLIN) != 0;
        if (n == 0 || errno != EINTR) return false;
    }
}

namespace {

// Runs `read` (one libibverbs event read on `fd`) once `fd` is readable within `limit`, with
// O_NONBLOCK set for the call, so that a poll() that lied cannot turn into a hang either.
template <typename Read>
int read_event_within(int fd, std::chrono::milliseconds limit, Read read) {
    if (!wait_readable(fd, limit)) {
        errno = ETIMEDOUT;
        return -1;
    }
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) return -1;
    const int rc = read();
    const int saved = errno;
    ::fcntl(fd, F_SETFL, flags);
    errno = saved;
    return rc;
}

}  // namespace

int get_cq_event_within(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context,
                        std::chrono::milliseconds limit) {
    return read_event_within(channel->fd, limit,
                             [&] { return ibv_get_cq_event(channel, cq, cq_context); });
}

int get_async_event_within(ibv_context* ctx, ibv_async_event* event,
                           std::chrono::milliseconds limit) {
    return read_event_within(ctx->async_fd, limit, [&] { return ibv_get_async_event(ctx, event); });
}

Buffer::Buffer(ibv_pd* pd, size_t size, int access) : bytes(size) {
    mr = ibv_reg_mr(pd, bytes.data(), size, access);
    if (!mr) throw std::runtime_error("ibv_reg_mr failed");
}

Buffer::~Buffer() {
    if (mr) ibv_dereg_mr(mr);
}

VanishingRegion::VanishingRegion(ibv_pd* pd, size_t bytes, int access) : size(bytes) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
    base = static_cast<uint8_t*>(p);
    std::memset(base, 0x11, size);
    mr = ibv_reg_mr(pd, base, size, access);
    if (!mr) {
        munmap(base, size);
        throw std::runtime_error("ibv_reg_mr failed");
    }
}

VanishingRegion::~VanishingRegion() {
    // The region outlived its pages: deregistering it must still work.
    if (ibv_dereg_mr(mr) != 0) std::fprintf(stderr, "VanishingRegion: ibv_dereg_mr failed\n");
    munmap(base, size);
}

void VanishingRegion::vanish() {
    if (mmap(base, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != base)
        throw std::runtime_error("mmap MAP_FIXED failed");
}

int post_rdma_at(ibv_qp* qp, ibv_wr_opcode op, uint64_t addr, uint32_t len, uint32_t lkey,
                 uint64_t remote_addr, uint32_t rkey, uint64_t wr_id, bool signaled) {
    ibv_sge sge{addr, len, lkey};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(qp, &wr, &bad);
}

int post_rdma(ibv_qp* qp, ibv_wr_opcode op, const Buffer& local, size_t offset, size_t len,
              uint64_t remote_addr, uint32_t rkey, uint64_t wr_id, bool signaled) {
    return post_rdma_at(qp, op, local.addr() + offset, static_cast<uint32_t>(len), local.mr->lkey,
                        remote_addr, rkey, wr_id, signaled);
}

int post_send_msg(ibv_qp* qp, const Buffer& local, size_t offset, size_t len, uint64_t wr_id,
                  bool signaled) {
    return post_rdma(qp, IBV_WR_SEND, local, offset, len, 0, 0, wr_id, signaled);
}

int post_atomic(ibv_qp* qp, ibv_wr_opcode op, const Buffer& local, size_t offset,
                uint64_t remote_addr, uint32_t rkey, uint64_t compare_add, uint64_t swap,
                uint64_t wr_id, uint32_t length) {
    ibv_sge sge{local.addr() + offset, length, local.mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = op;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.atomic.remote_addr = remote_addr;
    wr.wr.atomic.rkey = rkey;
    wr.wr.atomic.compare_add = compare_add;
    wr.wr.atomic.swap = swap;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(qp, &wr, &bad);
}

int post_recv_at(ibv_qp* qp, uint64_t addr, uint32_t len, uint32_t lkey, uint64_t wr_id) {
    ibv_sge sge{addr, len, lkey};
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return ibv_post_recv(qp, &wr, &bad);
}

int post_recv_buf(ibv_qp* qp, const Buffer& local, size_t offset, size_t len, uint64_t wr_id) {
    return post_recv_at(qp, local.addr() + offset, static_cast<uint32_t>(len), local.mr->lkey,
                        wr_id);
}

void fill_pattern(uint8_t* p, size_t n, uint64_t seed) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; ++i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = static_cast<uint8_t>(x);
    }
}

bool bytes_landed(const uint8_t* at, const uint8_t* want, size_t n) {
    const volatile uint8_t* v = at;
    for (size_t k = 0; k < n; ++k)
        if (v[k] != want[k]) return false;
    return true;
}

}  // namespace uroce::test
