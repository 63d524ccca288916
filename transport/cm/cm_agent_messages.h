// The messages the CM agent builds on its own (transaction IDs, REJs, DREPs), shared by its
// send side (cm_agent.cpp) and its receive side (cm_agent_receive.cpp). Internal to the agent.
#pragma once

#include <cstdint>

#include "transport/cm/cm_messages.h"

namespace uroce::transport::cm::agent_messages {

// The top half of the transaction IDs this agent starts (REQ, DREQ, SIDR REQ); the bottom
// half is the local comm ID. Answers (REP, RTU, MRA, REJ, DREP, SIDR REP) carry the
// transaction ID of the message they answer, as the kernel's CM does.
inline constexpr uint64_t kTidHigh = 0x00000001ull << 32;

inline CmMad with_tid(uint64_t tid, CmBody body) {
    MadHeader h;
    h.transaction_id = tid;
    return CmMad{h, std::move(body)};
}

inline CmRej make_rej(uint32_t local, uint32_t remote, CmMessageKind rejected,
                      CmRejectReason reason) {
    CmRej r;
    r.local_comm_id = local;
    r.remote_comm_id = remote;
    r.message_rejected = rejected;
    r.reason = static_cast<uint16_t>(reason);
    return r;
}

// The REJ Timeout the kernel sends when it gives up: its CA GUID as additional information.
inline CmRej make_rej_timeout(uint32_t local, uint32_t remote, uint64_t ca_guid) {
    // Neither a REQ nor a REP we received is rejected: "other".
    CmRej r = make_rej(local, remote, CmMessageKind::Other, CmRejectReason::Timeout);
    r.reject_info_length = 8;
    for (int i = 0; i < 8; ++i)
        r.additional_reject_info[i] = static_cast<uint8_t>(ca_guid >> (56 - 8 * i));
    return r;
}

inline CmDrep make_drep(uint32_t local, uint32_t remote) {
    CmDrep d;
    d.local_comm_id = local;
    d.remote_comm_id = remote;
    return d;
}

}  // namespace uroce::transport::cm::agent_messages
