// Checking and applying ibv_modify_qp attributes for RC QPs.
#pragma once

#include <infiniband/verbs.h>

#include "transport/qp_state.h"
#include "transport/rc_qp.h"

namespace uroce::provider {

// 0 if `mask` and the values in `attr` form a valid modify of a QP in `current`; sets
// `next` to the state it moves to. EINVAL otherwise.
int check_modify(transport::QpState current, const ibv_qp_attr& attr, int mask,
                 transport::QpState& next);

// Copies the attributes named by `mask` into `stored`.
void merge_attributes(ibv_qp_attr& stored, const ibv_qp_attr& attr, int mask);

// The transport's view of the verbs attributes.
transport::QpAttributes to_transport(const ibv_qp_attr& attr, uint32_t port_mtu);

}  // namespace uroce::provider
