// Driver registration, device discovery and contexts.
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/netlink.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>

#include "provider/cm_host.h"
#include "provider/comp_channel.h"
#include "provider/device_limits.h"
#include "provider/objects.h"
#include "provider/ucma.h"

namespace uroce::provider {

void print_counters(const ContextState& st, const char* device) noexcept;

namespace {

// An on/off environment variable: unset or empty leaves `value`; "on"/"1" and "off"/"0"
// set it; anything else is refused with a message (false).
bool env_switch(const char* name, bool& value) {
    const char* v = std::getenv(name);
    if (!v || !*v) return true;
    if (std::strcmp(v, "on") == 0 || std::strcmp(v, "1") == 0) {
        value = true;
    } else if (std::strcmp(v, "off") == 0 || std::strcmp(v, "0") == 0) {
        value = false;
    } else {
        std::fprintf(stderr, "uroce: %s: '%s' is neither 'on' nor 'off'\n", name, v);
        return false;
    }
    return true;
}

// The device's settings, which `uroce add` writes beside the sysfs files libibverbs reads.
bool read_setting(const char* ibdev_path, const char* name, std::string& out) {
    std::ifstream f(std::string(ibdev_path) + "/uroce/" + name);
    if (!f) return false;
    std::getline(f, out);
    return !out.empty();
}

bool load_config(const char* ibdev_path, DeviceConfig& cfg) {
    std::string ip, port, mtu, guid;
    // One of the two: the device's address and thus its family.
    const bool v4 = read_setting(ibdev_path, "ipv4", ip);
    if (!v4 && !read_setting(ibdev_path, "ipv6", ip)) return false;
    const auto address = IpAddress::parse(ip);
    if (!address || address->is_v4() != v4 || address->is_unspecified()) return false;
    cfg.ip = *address;
    if (read_setting(ibdev_path, "udp_port", port)) {
        const long p = std::strtol(port.c_str(), nullptr, 10);
        if (p < 1 || p > 65535) return false;
        cfg.udp_port = static_cast<uint16_t>(p);
    }
    if (read_setting(ibdev_path, "mtu", mtu)) {
        const long m = std::strtol(mtu.c_str(), nullptr, 10);
        if (m != 256 && m != 512 && m != 1024 && m != 2048 && m != 4096) return false;
        cfg.mtu = static_cast<uint32_t>(m);
    }
    std::ifstream g(std::string(ibdev_path) + "/node_guid");
    if (g && std::getline(g, guid)) {
        unsigned a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        if (std::sscanf(guid.c_str(), "%x:%x:%x:%x", &a0, &a1, &a2, &a3) == 4)
            cfg.node_guid = (uint64_t{a0} << 48) | (uint64_t{a1} << 32) | (uint64_t{a2} << 16) | a3;
    }
    return true;
}

bool match_device(verbs_sysfs_dev* sysfs_dev) {
    // A uroce device is one whose registry entry carries our settings; the name is the
    // user's choice, so it cannot be matched by pattern.
    std::string ip;
    return read_setting(sysfs_dev->ibdev_path, "ipv4", ip) ||
           read_setting(sysfs_dev->ibdev_path, "ipv6", ip);
}

verbs_device* alloc_device(verbs_sysfs_dev* sysfs_dev) {
    auto* dev = static_cast<UroceDevice*>(std::calloc(1, sizeof(UroceDevice)));
    if (!dev) return nullptr;
    if (!load_config(sysfs_dev->ibdev_path, dev->config)) {
        std::fprintf(stderr, "uroce: %s: unreadable settings under %s/uroce\n",
                     sysfs_dev->ibdev_name, sysfs_dev->ibdev_path);
        std::free(dev);
        return nullptr;
    }
    dev->vdev.core_support = UROCE_CORE_SUPPORT_OPTIONAL_MR_ACCESS;
    // librdmacm lists devices before it opens its rdma_cm fd: both the address and the
    // redirection must be in place by then (ucma.h).
    cm_host_note_device(sysfs_dev->ibdev_name, sysfs_dev->ibdev_path, dev->config);
    static_cast<void>(ucma::hook_install());
    return &dev->vdev;
}

void uninit_device(verbs_device* vdev) {
    std::free(reinterpret_cast<UroceDevice*>(vdev));
}

void destroy_state(ContextState* st) {
    if (!st) return;
    if (const char* v = std::getenv("UROCE_STATS");
        st->engine && v && *v && std::strcmp(v, "0") != 0)
        print_counters(*st, st->device->vdev.device.name);
    // What the application left behind goes with the context, as the kernel frees what a
    // closed uverbs file held. QPs leave the engine before it stops, as on destroy; then
    // MRs (no access is under way once they are out of the memory table).
    if (st->engine) {
        for (UroceQp* qp : st->live_qps.take_all()) reclaim_qp(*st, qp);
        for (UroceMw* mw : st->live_mws.take_all()) reclaim_mw(*st, mw);
        for (UroceMr* mr : st->live_mrs.take_all()) reclaim_mr(*st, mr);
    }
    st->engine.reset();  // stops the engine thread first: it may post async events
    for (UroceSrq* srq : st->live_srqs.take_all()) reclaim_srq(srq);
    for (UroceAh* ah : st->live_ahs.take_all()) reclaim_ah(ah);
    for (UroceCq* cq : st->live_cqs.take_all()) reclaim_cq(cq);
    for (UrocePd* pd : st->live_pds.take_all()) reclaim_pd(pd);
    for (UroceXrcd* x : st->live_xrcds.take_all()) reclaim_xrcd(x);
    if (st->cmd_fd >= 0) cmd_fd_unregister(st->cmd_fd);
    delete st;
}

verbs_context* alloc_context(ibv_device* ibdev, int cmd_fd, void*) {
    auto* dev = reinterpret_cast<UroceDevice*>(ibdev);
    auto* ctx = reinterpret_cast<UroceContext*>(_verbs_init_and_alloc_context(
        ibdev, cmd_fd, sizeof(UroceContext), reinterpret_cast<verbs_context*>(0),
        UROCE_RDMA_DRIVER_UNKNOWN));
    if (!ctx) return nullptr;
    int err = 0;
    auto* st = new (std::nothrow) ContextState;
    if (!st) {
        err = ENOMEM;
        goto fail;
    }
    ctx->state = st;
    st->device = dev;
    {
        transport::EngineConfig ec;
        ec.ip = dev->config.ip;
        ec.port = dev->config.udp_port;
        ec.mtu = dev->config.mtu;
        // Every context of the device, in any process, shares this table (device_slots.h).
        ec.slot_table = std::string(ibdev->ibdev_path) + "/uroce/slots";
        ec.counters_file = std::string(ibdev->ibdev_path) + "/uroce/counters";
        ec.host_devices = host_devices();
        if (const char* spec = std::getenv("UROCE_FAULTS"); spec && *spec) {
            std::string why;
            auto faults = transport::parse_fault_plan(spec, why);
            if (!faults) {
                std::fprintf(stderr, "uroce: UROCE_FAULTS: %s\n", why.c_str());
                err = EINVAL;
                goto fail;
            }
            ec.faults = *faults;
        }
        // UROCE_RETRANSMIT=ack-timeout: resend only after the IBA local ACK timeout (to
        // compare, or to reproduce what a peer without adaptive retransmission sees).
        if (const char* mode = std::getenv("UROCE_RETRANSMIT"); mode && *mode) {
            if (std::strcmp(mode, "adaptive") == 0) {
                ec.adaptive_retransmit = true;
            } else if (std::strcmp(mode, "ack-timeout") == 0) {
                ec.adaptive_retransmit = false;
            } else {
                std::fprintf(stderr,
                             "uroce: UROCE_RETRANSMIT: '%s' is neither 'adaptive' nor "
                             "'ack-timeout'\n",
                             mode);
                err = EINVAL;
                goto fail;
            }
        }
        // UROCE_GSO=off / UROCE_GRO=off: one sendmsg / one read per packet, as before
        // batching (to compare, or for a capture on lo, which shows a GSO train as one frame).
        // UROCE_INLINE_PROGRESS=off: only the engine thread reads the socket, never a thread
        // that polls a CQ. UROCE_HOLD_POSTS=off: every post sends at once, even while a
        // thread busy-polls (held_posts.h). UROCE_ENGINE_SPIN=off: the engine thread sleeps
        // as soon as the socket is empty (Engine::spin_after_batch). UROCE_HOLD_ACKS=off:
        // every ACK leaves at the end of its receive batch (engine_held_acks.cpp).
        // UROCE_ECN=on: packets leave ECN-capable, ECT(0) (congestion.h).
        // UROCE_SELECTIVE=off: RC goes back N in both roles, as the IBA describes
        // (early_requests.h, rc_selective_resend.cpp).
        if (!env_switch("UROCE_GSO", ec.gso) || !env_switch("UROCE_GRO", ec.gro) ||
            !env_switch("UROCE_SELECTIVE", ec.selective_recovery) ||
            !env_switch("UROCE_INLINE_PROGRESS", ec.inline_progress) ||
            !env_switch("UROCE_HOLD_POSTS", ec.hold_posts) ||
            !env_switch("UROCE_ENGINE_SPIN", ec.engine_spin) ||
            !env_switch("UROCE_HOLD_ACKS", ec.hold_acks) ||
            !env_switch("UROCE_ECN", ec.ecn_capable)) {
            err = EINVAL;
            goto fail;
        }
        // UROCE_PCAP=FILE: every packet of this context into FILE ("%p": the process id),
        // without root and one frame per RoCE packet (packet_capture.h).
        if (const char* pcap = std::getenv("UROCE_PCAP"); pcap && *pcap) ec.pcap_path = pcap;
        std::string why;
        try {
            st->engine = transport::Engine::create(ec, why, err);
        } catch (const std::bad_alloc&) {
            err = ENOMEM;
        }
        if (!st->engine) {
            std::fprintf(stderr, "uroce: %s: %s\n", ibdev->name, why.c_str());
            if (!err) err = ENOMEM;
            goto fail;
        }
    }
    {
        const int fd = st->async_events.open();
        if (fd < 0) {
            err = errno;
            goto fail;
        }
        ctx->vctx.context.async_fd = fd;
    }
    ctx->vctx.context.num_comp_vectors = kNumCompVectors;
    // ibv_create_comp_channel talks to cmd_fd behind the provider's back; the hook answers
    // it in this process. Without the hook, channel creation fails with a clear errno and
    // one stderr line says why (comp_channel.h); everything else works.
    if (comp_channel_attach(cmd_fd) == 0) st->cmd_fd = cmd_fd;
    static_cast<void>(ucma::hook_install());
    st->engine->set_async_handler([ctx](const transport::AsyncEvent& ev) {
        ibv_event_type type = IBV_EVENT_QP_FATAL;
        switch (ev.type) {
            case transport::AsyncEventType::QpFatal:
                type = IBV_EVENT_QP_FATAL;
                break;
            case transport::AsyncEventType::QpAccessError:
                type = IBV_EVENT_QP_ACCESS_ERR;
                break;
            case transport::AsyncEventType::QpRequestError:
                type = IBV_EVENT_QP_REQ_ERR;
                break;
            case transport::AsyncEventType::CommEstablished:
                type = IBV_EVENT_COMM_EST;
                break;
            case transport::AsyncEventType::SqDrained:
                type = IBV_EVENT_SQ_DRAINED;
                break;
            case transport::AsyncEventType::LastWqeReached:
                type = IBV_EVENT_QP_LAST_WQE_REACHED;
                break;
        }
        post_async_event(ctx, type, reinterpret_cast<uint64_t>(ev.qp_handle));
    });
    verbs_set_ops(&ctx->vctx, &kContextOps);
    return &ctx->vctx;

fail:
    destroy_state(ctx->state);
    ctx->state = nullptr;
    verbs_uninit_context(&ctx->vctx);
    std::free(ctx);
    errno = err;
    return nullptr;
}

}  // namespace

namespace {

// The tally of the object an event names, or nullptr for unaffiliated events.
AsyncEventTally* tally_for(ibv_event_type type, uint64_t element) {
    switch (type) {
        case IBV_EVENT_CQ_ERR:
            return &to_ucq(reinterpret_cast<ibv_cq*>(element))->events;
        case IBV_EVENT_QP_FATAL:
        case IBV_EVENT_QP_REQ_ERR:
        case IBV_EVENT_QP_ACCESS_ERR:
        case IBV_EVENT_COMM_EST:
        case IBV_EVENT_SQ_DRAINED:
        case IBV_EVENT_PATH_MIG:
        case IBV_EVENT_PATH_MIG_ERR:
        case IBV_EVENT_QP_LAST_WQE_REACHED:
            return &to_uqp(reinterpret_cast<ibv_qp*>(element))->events;
        case IBV_EVENT_SRQ_LIMIT_REACHED:
        case IBV_EVENT_SRQ_ERR:
            return &to_usrq(reinterpret_cast<ibv_srq*>(element))->events;
        default:
            return nullptr;
    }
}

}  // namespace

void post_async_event(UroceContext* ctx, ibv_event_type type, uint64_t element) noexcept {
    ctx->state->async_events.post(type, element, tally_for(type, element));
}

void async_event(ibv_context* ibctx, ibv_async_event* ev) noexcept {
    if (inherited(ibctx)) return;
    // libibverbs calls this right after reading the record: count the delivery, so that
    // destroying the object waits for its acknowledgement.
    to_uctx(ibctx)->state->async_events.delivered(
        tally_for(ev->event_type, reinterpret_cast<uint64_t>(ev->element.qp)));
}

void free_context(ibv_context* ibctx) noexcept {
    auto* ctx = to_uctx(ibctx);
    if (inherited(ibctx)) {
        // A child of fork() closes its copy: only its descriptors of the sockets go; the
        // engine, its objects and locks are the parent's (fork_guard.h) and are left as they
        // are. The device slot stays the parent's (device_slots.h).
        ContextState* st = ctx->state;
        if (st->engine) st->engine.release()->close_sockets_after_fork();
        if (st->cmd_fd >= 0) cmd_fd_unregister(st->cmd_fd);
        ctx->state = nullptr;  // left to the process image, with everything it holds
        verbs_uninit_context(&ctx->vctx);
        std::free(ctx);
        return;
    }
    destroy_state(ctx->state);
    ctx->state = nullptr;
    verbs_uninit_context(&ctx->vctx);
    std::free(ctx);
}

namespace {

const verbs_match_ent kMatchTable[] = {{nullptr, {nullptr}, 0, 0, VERBS_MATCH_SENTINEL}};

const verbs_device_ops kDeviceOps = {
    .name = "uroce",
    .match_min_abi_version = 1,
    .match_max_abi_version = 1,
    .match_table = kMatchTable,
    .static_providers = nullptr,
    .match_device = match_device,
    .alloc_context = alloc_context,
    .import_context = nullptr,
    .alloc_device = alloc_device,
    .uninit_device = uninit_device,
};

// Whether this process cannot open RDMA netlink (no kernel RDMA, or refused by `uroce run`'s
// filter or `uroce env`'s preload library). libibverbs asked the same just before it loaded
// us, so the call loads no module that libibverbs did not load already.
bool rdma_netlink_refused() noexcept {
    const int fd = ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_RDMA);
    if (fd < 0) return true;
    ::close(fd);
    return false;
}

__attribute__((constructor)) void register_driver() {
    fork_guard_install();
    // An installed provider (uroce.driver) is loaded into every verbs program that sees a
    // device, kernel RDMA hosts included. There libibverbs lists only the kernel's devices
    // and librdmacm must keep the kernel's rdma_cm, so the redirection waits for a uroce
    // device (alloc_device).
    if (rdma_netlink_refused()) static_cast<void>(ucma::hook_install());
    uroce_verbs_register_driver(&kDeviceOps);
}

}  // namespace

bool is_uroce_context(ibv_context* c) noexcept {
    return c && c->device && reinterpret_cast<verbs_device*>(c->device)->ops == &kDeviceOps;
}

}  // namespace uroce::provider
