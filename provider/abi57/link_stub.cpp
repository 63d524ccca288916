// What liburoce-rdmav57.so is linked against when the system's libibverbs exports ABI 34:
// a libibverbs.so.1 that defines, under the versions rdma-core v57/v58 export them, exactly
// the symbols the provider imports. The linker records those versions in the provider
// (IBVERBS_PRIVATE_57 for the private ones); at run time the real libibverbs supplies them.
// Never loaded, never installed: the bodies only have to exist. The provider is linked with
// -z defs (b_lundef, the default), so an import missing here (a new libibverbs call) fails
// the build, not the load.
#define UROCE_VERBS_ABI 57
#include "uroce/verbs_abi.h"

extern "C" {
[[gnu::visibility("default")]] ibv_comp_channel* ibv_create_comp_channel(ibv_context*) {
    return nullptr;
}
[[gnu::visibility("default")]] int ibv_query_qp_data_in_order(ibv_qp*, ibv_wr_opcode, uint32_t) {
    return 0;
}
[[gnu::visibility("default")]] void uroce_verbs_register_driver(const verbs_device_ops*) {}
[[gnu::visibility("default")]] void* _verbs_init_and_alloc_context(ibv_device*, int, size_t,
                                                                   verbs_context*, uint32_t) {
    return nullptr;
}
[[gnu::visibility("default")]] void verbs_uninit_context(verbs_context*) {}
[[gnu::visibility("default")]] void verbs_set_ops(verbs_context*, const verbs_context_ops*) {}
}
