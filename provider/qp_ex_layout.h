// Where the loaded libibverbs reads verbs_qp::comp_mask.
//
// ibv_qp_to_qp_ex(), a function of libibverbs, tells whether a QP has the ibv_wr_* API by
// reading comp_mask right after the library's own struct ibv_qp_ex, which grew within
// ABI 34: 344 bytes in rdma-core v36-v43, 352 in v44 (wr_atomic_write), 360 from v45
// (wr_flush). The provider is one binary for all of them, so it learns the release at run
// time from the library's file name (rdma-core installs libibverbs.so.1.<n>.<release>.<x>,
// e.g. libibverbs.so.1.14.44.0) and, for v44 and older, writes comp_mask also where that
// release reads it: into the wr_flush or wr_atomic_write slot of uroce's v45-shaped
// ibv_qp_ex, which such a release's applications cannot call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "uroce/verbs_abi.h"

namespace uroce::provider {

// The comp_mask offset for the libibverbs file `file_name` (a path or a base name); the
// layout the provider was built with (offsetof(verbs_qp, comp_mask)) when the name says
// nothing (not rdma-core's naming, or a release outside ABI 34).
size_t comp_mask_offset_for(std::string_view file_name);

// The comp_mask offset of the libibverbs this process loaded (found once, among the loaded
// objects).
size_t loaded_comp_mask_offset();

// Sets `bits` in vqp.comp_mask and, where the loaded libibverbs reads it elsewhere, there
// too. Call after the ibv_qp_ex function pointers are filled in.
void set_qp_comp_mask(verbs_qp& vqp, uint32_t bits);

}  // namespace uroce::provider
