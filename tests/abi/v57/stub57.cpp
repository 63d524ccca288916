// A stand-in for the libibverbs of rdma-core v57/v58 (private ABI 57) in tests/abi: it
// exports what liburoce-rdmav57.so imports, under the versions v57 exports them, and
// records what the provider hands over, for abi57_check to inspect. It does not include
// uroce's verbs_abi.h on purpose: the provider is checked against an independent view.
#include <infiniband/verbs.h>
#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include "tests/abi/v57/stub57.h"

namespace {
Stub57State g_state;
}

extern "C" {

[[gnu::visibility("default")]] Stub57State* uroce_stub57_state() {
    return &g_state;
}

[[gnu::visibility("default")]] void verbs_register_driver_57(const void* device_ops) {
    g_state.device_ops = device_ops;
    ++g_state.registrations;
}

// As libibverbs does: one zeroed allocation, the verbs_context at the offset given, with
// what the provider relies on (device, cmd_fd, extended ABI) filled in.
[[gnu::visibility("default")]] void* _verbs_init_and_alloc_context(ibv_device* device, int cmd_fd,
                                                                   size_t alloc_size,
                                                                   verbs_context* context_offset,
                                                                   uint32_t driver_id) {
    g_state.alloc_size = alloc_size;
    g_state.driver_id = driver_id;
    auto* base = static_cast<unsigned char*>(std::calloc(1, alloc_size));
    if (!base) return nullptr;
    auto* vctx =
        reinterpret_cast<verbs_context*>(base + reinterpret_cast<uintptr_t>(context_offset));
    vctx->sz = sizeof(*vctx);
    vctx->context.device = device;
    vctx->context.cmd_fd = cmd_fd;
    vctx->context.async_fd = -1;
    vctx->context.abi_compat = __VERBS_ABI_IS_EXTENDED;
    pthread_mutex_init(&vctx->context.mutex, nullptr);
    return base;
}

[[gnu::visibility("default")]] void verbs_uninit_context(verbs_context* vctx) {
    ++g_state.uninit_calls;
    if (vctx->context.async_fd >= 0) close(vctx->context.async_fd);
    close(vctx->context.cmd_fd);
}

[[gnu::visibility("default")]] void verbs_set_ops(verbs_context*, const void* context_ops) {
    g_state.context_ops = context_ops;
    ++g_state.set_ops_calls;
}

[[gnu::visibility("default")]] ibv_comp_channel* ibv_create_comp_channel(ibv_context*) {
    errno = EOPNOTSUPP;
    return nullptr;
}

[[gnu::visibility("default")]] int ibv_query_qp_data_in_order(ibv_qp*, ibv_wr_opcode, uint32_t) {
    return 0;
}
}
