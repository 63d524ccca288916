// abi57_check PROVIDER: loads liburoce-rdmav57.so where libibverbs.so.1 is the v57 stub
// (tests/abi/v57), then acts as v57's libibverbs would: reads the verbs_device_ops the
// provider registered, opens a device and a context through it, and calls ops through the
// table the provider handed to verbs_set_ops. Every offset and slot here is written down
// from rdma-core v57's driver.h (LP64), independently of uroce's verbs_abi.h, so a layout
// the provider gets wrong shows as a wrong value or a call that lands in the wrong op.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/abi/v57/stub57.h"

namespace {

int failures = 0;

void check(bool ok, const char* what) {
    std::printf("%s - %s\n", ok ? "ok" : "not ok", what);
    if (!ok) ++failures;
}

template <typename T>
T at(const void* base, size_t offset) {
    T v;
    std::memcpy(&v, static_cast<const unsigned char*>(base) + offset, sizeof(v));
    return v;
}

// verbs_device_ops (v57): name, two u32 ABI bounds, match_table, static_providers, then
// match_device, alloc_context, import_context, alloc_device, uninit_device.
constexpr size_t kOpsName = 0, kOpsMinAbi = 8, kOpsMaxAbi = 12, kOpsStaticProviders = 24,
                 kOpsMatchDevice = 32, kOpsAllocContext = 40, kOpsImportContext = 48,
                 kOpsAllocDevice = 56, kOpsUninitDevice = 64;
// verbs_sysfs_dev (992 bytes): the names libibverbs found in sysfs.
constexpr size_t kSysfsSize = 992, kSysfsIbdevName = 112, kSysfsIbdevPath = 176;
// verbs_device: ibv_device, then ops, refcount, list node, sysfs, core_support.
constexpr size_t kDevOps = sizeof(ibv_device), kDevSysfs = sizeof(ibv_device) + 32,
                 kDevCoreSupport = sizeof(ibv_device) + 40;
// verbs_context_ops slots (alphabetical, 76 entries in v57).
constexpr size_t kAllocPd = 5, kCreateCq = 15, kCreateQpEx = 20, kDeallocPd = 26, kDeregMr = 28,
                 kDestroyCq = 31, kDestroyQp = 34, kFreeContext = 39, kPollCq = 53, kQueryPort = 60,
                 kQueryQp = 61, kQueryQpDataInOrder = 62, kRegMr = 68;
// verbs_qp: v57's ibv_qp_ex is 360 bytes (wr_flush last), then u32 comp_mask and xrcd.
constexpr size_t kQpCompMask = 360, kQpXrcd = 368;
constexpr uint32_t kVerbsQpEx = 1 << 1;

template <typename Fn>
Fn slot(const void* table, size_t index) {
    return at<Fn>(table, index * sizeof(void*));
}

uint16_t free_udp_port() {
    const int s = socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    uint16_t port = 0;
    if (s >= 0 && bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
        getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0)
        port = ntohs(a.sin_port);
    if (s >= 0) close(s);
    return port;
}

}  // namespace

int main(int argc, char** argv) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);  // what passed stays visible if an op crashes
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s PROVIDER\n", argv[0]);
        return 2;
    }
    void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        std::printf("not ok - the provider loads against the v57 stub: %s\n", dlerror());
        return 1;
    }
    check(true, "the provider loads against a libibverbs exporting IBVERBS_PRIVATE_57");
    auto* state_fn = reinterpret_cast<Stub57State* (*)()>(dlsym(h, "uroce_stub57_state"));
    if (!state_fn) {
        std::printf("not ok - the v57 stub is the provider's libibverbs.so.1\n");
        return 1;
    }
    Stub57State& st = *state_fn();
    check(st.registrations == 1 && st.device_ops,
          "its constructor called verbs_register_driver_57 once");
    if (!st.device_ops) return 1;
    const void* ops = st.device_ops;
    const char* name = at<const char*>(ops, kOpsName);
    check(name && std::strcmp(name, "uroce") == 0, "verbs_device_ops.name is \"uroce\"");
    check(at<uint32_t>(ops, kOpsMinAbi) == 1 && at<uint32_t>(ops, kOpsMaxAbi) == 1,
          "verbs_device_ops ABI bounds are 1..1 (sysfs-only device)");
    check(at<void*>(ops, kOpsStaticProviders) == nullptr &&
              at<void*>(ops, kOpsImportContext) == nullptr,
          "static_providers and import_context are null");
    auto match_device = at<bool (*)(void*)>(ops, kOpsMatchDevice);
    auto alloc_context = at<void* (*)(ibv_device*, int, void*)>(ops, kOpsAllocContext);
    auto alloc_device = at<void* (*)(void*)>(ops, kOpsAllocDevice);
    auto uninit_device = at<void (*)(void*)>(ops, kOpsUninitDevice);
    check(match_device && alloc_context && alloc_device && uninit_device,
          "match_device, alloc_context, alloc_device, uninit_device are set");
    if (failures) return 1;

    // A device as `uroce add` leaves it: settings under <ibdev_path>/uroce.
    char dir_tmpl[] = "/tmp/uroce-abi57-XXXXXX";
    const char* dir = mkdtemp(dir_tmpl);
    const uint16_t port = free_udp_port();
    if (!dir || port == 0) {
        std::printf("not ok - a scratch device directory and a free UDP port\n");
        return 1;
    }
    const std::string udir = std::string(dir) + "/uroce";
    mkdir(udir.c_str(), 0700);
    std::ofstream(udir + "/ipv4") << "127.0.0.1\n";
    std::ofstream(udir + "/udp_port") << port << "\n";
    alignas(8) unsigned char sysfs[kSysfsSize] = {};
    std::snprintf(reinterpret_cast<char*>(sysfs + kSysfsIbdevName), 64, "uroce_abi57");
    std::snprintf(reinterpret_cast<char*>(sysfs + kSysfsIbdevPath), 256, "%s", dir);

    check(match_device(sysfs), "match_device (offset 32) accepts the device by its settings");
    void* vdev = alloc_device(sysfs);
    check(vdev != nullptr, "alloc_device (offset 56) returns a verbs_device");
    if (!vdev) return 1;
    check(at<uint64_t>(vdev, kDevCoreSupport) == 1,
          "verbs_device.core_support (offset ibv_device + 40) has the optional-MR-access bit");
    // What libibverbs fills in after alloc_device.
    auto* ibdev = static_cast<ibv_device*>(vdev);
    std::snprintf(ibdev->name, sizeof(ibdev->name), "uroce_abi57");
    std::snprintf(ibdev->ibdev_path, sizeof(ibdev->ibdev_path), "%s", dir);
    std::memcpy(static_cast<unsigned char*>(vdev) + kDevOps, &ops, sizeof(ops));
    void* sysfs_ptr = sysfs;
    std::memcpy(static_cast<unsigned char*>(vdev) + kDevSysfs, &sysfs_ptr, sizeof(sysfs_ptr));

    auto* vctx =
        static_cast<verbs_context*>(alloc_context(ibdev, open("/dev/null", O_RDWR), nullptr));
    check(vctx != nullptr, "alloc_context (offset 40) opens a context");
    if (!vctx) return 1;
    ibv_context* ctx = &vctx->context;
    check(st.alloc_size >= sizeof(verbs_context) && st.driver_id == 0,
          "_verbs_init_and_alloc_context got the provider's context size and driver id 0");
    check(st.set_ops_calls == 1 && st.context_ops, "verbs_set_ops got the ops table");
    if (!st.context_ops) return 1;
    const void* t = st.context_ops;

    ibv_port_attr pa{};
    check(slot<int (*)(ibv_context*, uint8_t, ibv_port_attr*)>(t, kQueryPort)(ctx, 1, &pa) == 0 &&
              pa.state == IBV_PORT_ACTIVE && pa.link_layer == IBV_LINK_LAYER_ETHERNET,
          "query_port (slot 60): port 1 active, Ethernet");
    ibv_pd* pd = slot<ibv_pd* (*)(ibv_context*)>(t, kAllocPd)(ctx);
    check(pd != nullptr, "alloc_pd (slot 5) returns a PD");
    if (pd) pd->context = ctx;  // as ibv_alloc_pd does
    ibv_cq* cq = slot<ibv_cq* (*)(ibv_context*, int, ibv_comp_channel*, int)>(t, kCreateCq)(
        ctx, 16, nullptr, 0);
    check(cq && cq->cqe >= 16, "create_cq (slot 15) returns a CQ of 16+ entries");
    if (cq) cq->context = ctx;  // as ibv_create_cq does
    if (!pd || !cq) return 1;
    ibv_qp_init_attr_ex qa{};
    qa.qp_type = IBV_QPT_RC;
    qa.send_cq = cq;
    qa.recv_cq = cq;
    qa.cap.max_send_wr = 4;
    qa.cap.max_recv_wr = 4;
    qa.cap.max_send_sge = 1;
    qa.cap.max_recv_sge = 1;
    qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    qa.pd = pd;
    qa.send_ops_flags = IBV_QP_EX_WITH_SEND;
    ibv_qp* qp = slot<ibv_qp* (*)(ibv_context*, ibv_qp_init_attr_ex*)>(t, kCreateQpEx)(ctx, &qa);
    check(qp && qp->context == ctx && qp->qp_type == IBV_QPT_RC,
          "create_qp_ex (slot 20) returns an RC QP");
    if (!qp) return 1;
    check(at<uint32_t>(qp, kQpCompMask) & kVerbsQpEx,
          "verbs_qp.comp_mask at offset 360 (after v57's ibv_qp_ex) says VERBS_QP_EX, as "
          "ibv_qp_to_qp_ex reads it");
    check(at<void*>(qp, kQpXrcd) == nullptr, "verbs_qp.xrcd at offset 368 is null");
    check(at<void*>(qp, 352) == nullptr, "the wr_flush slot (offset 352) is left null");
    ibv_wc wc{};
    check(slot<int (*)(ibv_cq*, int, ibv_wc*)>(t, kPollCq)(cq, 1, &wc) == 0,
          "poll_cq (slot 53) on the empty CQ returns 0");
    ibv_qp_attr qattr{};
    ibv_qp_init_attr qinit{};
    check(slot<int (*)(ibv_qp*, ibv_qp_attr*, int, ibv_qp_init_attr*)>(t, kQueryQp)(
              qp, &qattr, IBV_QP_STATE | IBV_QP_CAP, &qinit) == 0 &&
              qattr.qp_state == IBV_QPS_RESET && qinit.cap.max_send_wr >= 4,
          "query_qp (slot 61): the new QP is in RESET with its send queue");
    check(slot<void*>(t, kQueryQpDataInOrder) == nullptr,
          "query_qp_data_in_order (slot 62) is left to libibverbs' default (null)");
    static char buf[4096];
    ibv_mr* mr = slot<ibv_mr* (*)(ibv_pd*, void*, size_t, uint64_t, int)>(t, kRegMr)(
        pd, buf, sizeof(buf), reinterpret_cast<uintptr_t>(buf), IBV_ACCESS_LOCAL_WRITE);
    check(mr != nullptr, "reg_mr (slot 68) registers a buffer");
    if (mr) {
        mr->context = ctx;  // as ibv_reg_mr does
        mr->pd = pd;
        mr->addr = buf;
        mr->length = sizeof(buf);
        check(slot<int (*)(void*)>(t, kDeregMr)(mr) == 0, "dereg_mr (slot 28)");
    }
    check(slot<int (*)(ibv_qp*)>(t, kDestroyQp)(qp) == 0, "destroy_qp (slot 34)");
    check(slot<int (*)(ibv_cq*)>(t, kDestroyCq)(cq) == 0, "destroy_cq (slot 31)");
    check(slot<int (*)(ibv_pd*)>(t, kDeallocPd)(pd) == 0, "dealloc_pd (slot 26)");
    slot<void (*)(ibv_context*)>(t, kFreeContext)(ctx);
    check(st.uninit_calls == 1, "free_context (slot 39) ends in verbs_uninit_context");
    uninit_device(vdev);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    std::printf("%d failed\n", failures);
    return failures ? 1 : 0;
}
