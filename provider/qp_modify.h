// Checking and applying ibv_modify_qp attributes (RC, UC, UD and XRC QPs).
#pragma once

#include <infiniband/verbs.h>

#include "transport/qp_state.h"
#include "transport/rc_qp.h"

namespace uroce::provider {

// The attributes a QP of `type` does not use, which modify_qp drops from the mask before
// anything else, as Linux's uverbs does: an XRC initiator's responder resources and RNR
// timer, an XRC target's retry counts and READ credits (applications pass RC's full set).
int ignored_attributes(ibv_qp_type type);

// 0 if `mask` and the values in `attr` form a valid modify of a QP in `current` on a device
// whose address is of `family` (AF_INET, AF_INET6); sets `next` to the state it moves to.
// EINVAL otherwise.
int check_modify(ibv_qp_type type, transport::QpState current, const ibv_qp_attr& attr, int mask,
                 int family, transport::QpState& next);

// The address a RoCEv2 GID holds, if it is one a device of `family` reaches: an
// IPv4-mapped GID (::ffff:a.b.c.d) for AF_INET, any other for AF_INET6. False for the other
// family and for an unspecified address (::, 0.0.0.0).
bool gid_to_ip(const ibv_gid& gid, int family, IpAddress& ip);

// The transport's view of the verbs attributes.
transport::QpAttributes to_transport(const ibv_qp_attr& attr, uint32_t port_mtu);

}  // namespace uroce::provider
