// The oldest libibverbs this provider can run on.
//
// libibverbs v34 and v35 export the same private ABI name (IBVERBS_PRIVATE_34) as v36-v56,
// but their verbs_context_ops lack `query_qp_data_in_order` (added in v36): every op after
// it sits one slot earlier, so such a libibverbs would call reg_mr through the slot of
// req_notify_cq. The name of the private ABI cannot tell them apart; the public symbol
// version that arrived with that op can. Holding the address of ibv_query_qp_data_in_order
// (IBVERBS_1.14) makes the dynamic loader refuse this module on anything older, before a
// single op is called: dlopen fails with "version `IBVERBS_1.14' not found", which
// libibverbs prints as a warning naming this driver. (v57 and later renamed the private
// ABI, so verbs_register_driver_34 is missing there and the loader refuses as well; the ABI
// 57 build needs IBVERBS_1.14 too, which every libibverbs exporting IBVERBS_PRIVATE_57 has.)
#include <infiniband/verbs.h>

namespace uroce::provider {

// Never called; `used` keeps the reference (and so the version requirement) in the binary.
[[gnu::used]] int (*const kRequiresIbverbs114)(ibv_qp*, ibv_wr_opcode,
                                               uint32_t) = &ibv_query_qp_data_in_order;

}  // namespace uroce::provider
