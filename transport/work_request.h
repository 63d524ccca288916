// Work requests and completions as the transport sees them: the verbs structures translated
// into plain values, with no libibverbs types.
#pragma once

#include <array>
#include <cstdint>

namespace uroce::transport {

inline constexpr uint32_t kMaxSge = 16;
inline constexpr uint32_t kMaxInlineData = 256;

struct Sge {
    uint64_t addr = 0;
    uint32_t length = 0;
    uint32_t lkey = 0;
};

struct SgeList {
    std::array<Sge, kMaxSge> sge{};
    uint32_t count = 0;

    uint64_t total_length() const {
        uint64_t n = 0;
        for (uint32_t i = 0; i < count; ++i) n += sge[i].length;
        return n;
    }
};

enum class SendOpcode : uint8_t {
    Send,
    SendWithImm,
    RdmaWrite,
    RdmaWriteWithImm,
    RdmaRead,
    AtomicCmpSwap,   // 8 bytes at remote_addr: if equal to compare_add, becomes swap
    AtomicFetchAdd,  // 8 bytes at remote_addr: compare_add is added
    SendWithInv,     // a SEND whose last packet invalidates `rkey` at the responder
    BindMw,          // local: binds a memory window (`bind`)
    LocalInv,        // local: invalidates the type 2 window `rkey`
    AtomicWrite,     // 8 bytes (the WQE's data, `length` 8) stored at remote_addr at once
};

// Executed by the QP itself, in send queue order; nothing goes on the wire.
inline bool is_local_op(SendOpcode op) {
    return op == SendOpcode::BindMw || op == SendOpcode::LocalInv;
}

// False for a WRITE and a READ, which complete nothing at the responder; true for every
// other request (a SEND or a WRITE with immediate completes a receive there; an atomic is
// counted too, to be safe).
inline bool may_complete_at_peer(SendOpcode op) {
    return op != SendOpcode::RdmaWrite && op != SendOpcode::RdmaRead;
}

// What a memory window bind asks for (IBV_WR_BIND_MW, ibv_bind_mw).
struct MwBind {
    uint32_t mw_rkey = 0;   // the window's current rkey
    uint32_t new_rkey = 0;  // the rkey it has once bound
    uint32_t mr_lkey = 0;
    uint64_t addr = 0;
    uint64_t length = 0;
    uint32_t access = 0;  // memory_table.h Access bits
};

inline bool is_atomic(SendOpcode op) {
    return op == SendOpcode::AtomicCmpSwap || op == SendOpcode::AtomicFetchAdd;
}
// True for the opcodes that take a responder resource (max_rd_atomic / max_dest_rd_atomic):
// READs and atomics, answered by responses of their own (READ responses, Atomic
// Acknowledge), and ATOMIC WRITE, answered by a plain ACK.
inline bool takes_responder_resource(SendOpcode op) {
    return op == SendOpcode::RdmaRead || is_atomic(op) || op == SendOpcode::AtomicWrite;
}
// A responder-resource request that an ACK covering its PSN completes (no response data).
inline bool completed_by_ack(SendOpcode op) {
    return op == SendOpcode::AtomicWrite;
}

enum class WcStatus : uint8_t {
    Success,
    LocLenErr,
    LocQpOpErr,
    LocProtErr,
    WrFlushErr,
    BadResp,
    RemInvReqErr,
    RemAccessErr,
    RemOpErr,
    RetryExcErr,
    RnrRetryExcErr,
    GeneralErr,
    MwBindErr,
};

enum class WcOpcode : uint8_t {
    Send,
    RdmaWrite,
    RdmaRead,
    CompSwap,
    FetchAdd,
    BindMw,
    LocalInv,
    Recv,
    RecvRdmaWithImm,
    AtomicWrite,
};

struct SendWqe {
    uint64_t wr_id = 0;
    SendOpcode opcode = SendOpcode::Send;
    bool signaled = true;
    bool solicited = false;
    bool fence = false;
    bool is_inline = false;
    SgeList sgl;  // unless is_inline
    std::array<uint8_t, kMaxInlineData> inline_data{};
    uint32_t length = 0;  // total message length
    uint64_t remote_addr = 0;
    uint32_t rkey = 0;
    uint32_t imm = 0;          // ImmDt as carried on the wire (host order)
    uint32_t remote_srqn = 0;  // XRC initiator: the XRC SRQ the request is for (XRCETH)
    // Atomics: the original 8 bytes land in the first SGE (8 bytes, not inline).
    uint64_t compare_add = 0;
    uint64_t swap = 0;
    MwBind bind;  // BindMw
};

struct RecvWqe {
    uint64_t wr_id = 0;
    SgeList sgl;
};

struct Completion {
    uint64_t wr_id = 0;
    WcStatus status = WcStatus::Success;
    WcOpcode opcode = WcOpcode::Send;
    uint32_t byte_len = 0;
    uint32_t qp_num = 0;
    uint32_t src_qp = 0;
    bool with_imm = false;
    bool solicited = false;
    uint32_t imm = 0;           // host order, as parsed from ImmDt
    bool with_grh = false;      // UD: the buffer starts with the 40-byte GRH area
    bool with_inv = false;      // a SEND with invalidate: `imm` holds the invalidated rkey
    uint64_t timestamp_ns = 0;  // CLOCK_MONOTONIC when the completion entered its CQ
};

const char* to_string(WcStatus s);

}  // namespace uroce::transport
