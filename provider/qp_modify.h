// Checking and applying ibv_modify_qp attributes (RC and UD QPs).
#pragma once

#include <infiniband/verbs.h>

#include "transport/qp_state.h"
#include "transport/rc_qp.h"

namespace uroce::provider {

// 0 if `mask` and the values in `attr` form a valid modify of a QP in `current`; sets
// `next` to the state it moves to. EINVAL otherwise.
int check_modify(ibv_qp_type type, transport::QpState current, const ibv_qp_attr& attr, int mask,
                 transport::QpState& next);

// The IPv4 address of an IPv4-mapped GID (::ffff:a.b.c.d), the only GID form this version
// routes; false for any other GID or 0.0.0.0.
bool gid_to_ipv4(const ibv_gid& gid, uint32_t& ip);

// Copies the attributes named by `mask` into `stored`.
void merge_attributes(ibv_qp_attr& stored, const ibv_qp_attr& attr, int mask);

// The transport's view of the verbs attributes.
transport::QpAttributes to_transport(const ibv_qp_attr& attr, uint32_t port_mtu);

}  // namespace uroce::provider
