// See qp_attributes.h.
#include "provider/qp_attributes.h"

namespace uroce::provider {

void merge_attributes(ibv_qp_attr& stored, const ibv_qp_attr& a, int mask) {
    if (mask & IBV_QP_PKEY_INDEX) stored.pkey_index = a.pkey_index;
    if (mask & IBV_QP_PORT) stored.port_num = a.port_num;
    if (mask & IBV_QP_ACCESS_FLAGS) stored.qp_access_flags = a.qp_access_flags;
    if (mask & IBV_QP_AV) stored.ah_attr = a.ah_attr;
    if (mask & IBV_QP_PATH_MTU) stored.path_mtu = a.path_mtu;
    if (mask & IBV_QP_DEST_QPN) stored.dest_qp_num = a.dest_qp_num;
    if (mask & IBV_QP_RQ_PSN) stored.rq_psn = a.rq_psn;
    if (mask & IBV_QP_SQ_PSN) stored.sq_psn = a.sq_psn;
    if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) stored.max_dest_rd_atomic = a.max_dest_rd_atomic;
    if (mask & IBV_QP_MAX_QP_RD_ATOMIC) stored.max_rd_atomic = a.max_rd_atomic;
    if (mask & IBV_QP_MIN_RNR_TIMER) stored.min_rnr_timer = a.min_rnr_timer;
    if (mask & IBV_QP_TIMEOUT) stored.timeout = a.timeout;
    if (mask & IBV_QP_RETRY_CNT) stored.retry_cnt = a.retry_cnt;
    if (mask & IBV_QP_RNR_RETRY) stored.rnr_retry = a.rnr_retry;
    if (mask & IBV_QP_PATH_MIG_STATE) stored.path_mig_state = a.path_mig_state;
    // The notification belongs to the one move to SQD that asks for it, not to later ones.
    stored.en_sqd_async_notify = (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) ? a.en_sqd_async_notify : 0;
    if (mask & IBV_QP_QKEY) stored.qkey = a.qkey;
}

ibv_qp_attr modified_attributes(const ibv_qp_attr& stored, const ibv_qp_attr& attr, int mask,
                                ibv_qp_state next, ibv_mtu port_mtu) {
    ibv_qp_attr a = stored;
    merge_attributes(a, attr, mask);
    if (next == IBV_QPS_RESET) {
        // Back to the defaults a new QP has.
        a = ibv_qp_attr{};
        a.cap = stored.cap;
        a.path_mtu = port_mtu;
        a.port_num = 1;
    }
    a.qp_state = next;
    a.cur_qp_state = next;
    a.sq_draining = next == IBV_QPS_SQD;
    return a;
}

}  // namespace uroce::provider
