// The verbs view of a QP's attributes (what ibv_query_qp reports) and how a modify changes it.
#pragma once

#include <infiniband/verbs.h>

namespace uroce::provider {

// Copies the attributes named by `mask` into `stored`.
void merge_attributes(ibv_qp_attr& stored, const ibv_qp_attr& attr, int mask);

// The attributes `stored` becomes by a checked modify to state `next`: those `mask` names
// replace the stored ones, and a move to RESET brings back a new QP's defaults (capabilities
// kept, `port_mtu`).
ibv_qp_attr modified_attributes(const ibv_qp_attr& stored, const ibv_qp_attr& attr, int mask,
                                ibv_qp_state next, ibv_mtu port_mtu);

// A checked modify of a QP whose attributes are `stored`: `apply(const ibv_qp_attr&)`, the
// transport's move, is given modified_attributes(), and `stored` takes them only if it
// returns 0. The transport refuses a move when it moved the QP to ERR on its own after the
// check; ibv_query_qp must not then report attributes that were never applied.
template <typename Apply>
int modify_attributes(ibv_qp_attr& stored, const ibv_qp_attr& attr, int mask, ibv_qp_state next,
                      ibv_mtu port_mtu, Apply&& apply) {
    const ibv_qp_attr updated = modified_attributes(stored, attr, mask, next, port_mtu);
    const int err = apply(updated);
    if (err == 0) stored = updated;
    return err;
}

}  // namespace uroce::provider
