// RoCEv2 wire format: the IBA transport headers carried in a UDP datagram to port 4791.
//
// A RoCEv2 UDP payload is   BTH | extension headers | payload | pad | ICRC
// and every field is big-endian on the wire. One table (opcode_info) says which
// extension headers each opcode carries; parse_packet() and build_headers() are
// driven by it, so adding an opcode means adding a table row, not a switch arm.
//
// This header is part of the transport and knows nothing of libibverbs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace uroce::wire {

inline constexpr uint16_t kRoceV2Port = 4791;
inline constexpr size_t kBthBytes = 12;
inline constexpr size_t kRethBytes = 16;
inline constexpr size_t kAethBytes = 4;
inline constexpr size_t kImmBytes = 4;
inline constexpr size_t kIethBytes = 4;
inline constexpr size_t kDethBytes = 8;
inline constexpr size_t kXrcethBytes = 4;
inline constexpr size_t kAtomicEthBytes = 28;
inline constexpr size_t kAtomicAckEthBytes = 8;
inline constexpr size_t kIcrcBytes = 4;
inline constexpr size_t kCnpReservedBytes = 16;
// Largest header stack any opcode carries (BTH + RETH + ImmDt) rounded up.
inline constexpr size_t kMaxHeaderBytes = 64;
inline constexpr uint32_t kPsnMask = 0xffffff;
inline constexpr uint32_t kQpnMask = 0xffffff;

// IBA opcodes (BTH byte 0): transport in the top three bits, operation in the low five.
enum class Opcode : uint8_t {
    RcSendFirst = 0x00,
    RcSendMiddle = 0x01,
    RcSendLast = 0x02,
    RcSendLastImm = 0x03,
    RcSendOnly = 0x04,
    RcSendOnlyImm = 0x05,
    RcWriteFirst = 0x06,
    RcWriteMiddle = 0x07,
    RcWriteLast = 0x08,
    RcWriteLastImm = 0x09,
    RcWriteOnly = 0x0a,
    RcWriteOnlyImm = 0x0b,
    RcReadRequest = 0x0c,
    RcReadResponseFirst = 0x0d,
    RcReadResponseMiddle = 0x0e,
    RcReadResponseLast = 0x0f,
    RcReadResponseOnly = 0x10,
    RcAcknowledge = 0x11,
    RcAtomicAcknowledge = 0x12,
    RcCompareSwap = 0x13,
    RcFetchAdd = 0x14,
    // IBA 1.5's ATOMIC WRITE: a RETH and 8 bytes of payload, stored at once at the
    // responder, answered by a plain Acknowledge.
    RcAtomicWrite = 0x1d,
    RcSendLastInv = 0x16,
    RcSendOnlyInv = 0x17,
    UdSendOnly = 0x64,
    UdSendOnlyImm = 0x65,
    // RoCEv2 congestion notification packet (Annex A17.9.2): BTH, 16 reserved bytes, ICRC.
    Cnp = 0x81,
};

// Which extension headers follow the BTH, in wire order: RETH/DETH/AtomicETH come first,
// then AETH/AtomicAckETH, then ImmDt/IETH.
enum HeaderBit : uint16_t {
    kHasReth = 1u << 0,
    kHasAeth = 1u << 1,
    kHasImm = 1u << 2,
    kHasIeth = 1u << 3,
    kHasDeth = 1u << 4,
    kHasAtomicEth = 1u << 5,
    kHasAtomicAckEth = 1u << 6,
    kHasPayload = 1u << 7,  // the opcode may carry payload bytes
    kHasXrceth = 1u << 8,   // XRC requests: the destination XRC SRQ, right after the BTH
};

// What an opcode means to the transport.
enum OpcodeFlag : uint16_t {
    kFirst = 1u << 0,  // first packet of a multi-packet message
    kMiddle = 1u << 1,
    kLast = 1u << 2,
    kOnly = 1u << 3,      // single-packet message
    kRequest = 1u << 4,   // sent by a requester (consumes responder PSNs)
    kResponse = 1u << 5,  // sent by a responder (ACK, READ response, atomic ACK)
    kSend = 1u << 6,
    kWrite = 1u << 7,
    kRead = 1u << 8,  // READ request or READ response
    kAtomic = 1u << 9,
    kAck = 1u << 10,
    kCnp = 1u << 11,          // congestion notification: neither request nor response
    kAtomicWrite = 1u << 12,  // ATOMIC WRITE: a responder resource, answered by an ACK
};

// The top three bits of the opcode (4 is the CNP's, which belongs to no transport).
enum class Transport : uint8_t { Rc = 0, Uc = 1, Rd = 2, Ud = 3, Xrc = 5 };

// XRC opcodes are the RC ones with the transport bits 101: same operation, same headers,
// plus an XRCETH on requests.
inline constexpr uint8_t kXrcOpcodeBase = 0xa0;
// The operation bits of an opcode (the RC opcode for RC and XRC).
inline constexpr uint8_t operation_of(uint8_t opcode) {
    return opcode & 0x1f;
}

struct OpcodeInfo {
    const char* name;      // as Wireshark names it, e.g. "RC Send Only"
    uint16_t headers;      // HeaderBit set
    uint16_t flags;        // OpcodeFlag set
    uint8_t header_bytes;  // BTH plus every extension header
};

// The row for an opcode, or nullptr for an opcode uroce does not implement.
const OpcodeInfo* opcode_info(uint8_t opcode);

struct Bth {
    uint8_t opcode = 0;
    bool solicited = false;
    bool migreq = true;  // senders set MigReq (rxe does too); receivers ignore it
    uint8_t pad = 0;     // 0..3 pad bytes before the ICRC
    uint8_t tver = 0;
    uint16_t pkey = 0xffff;
    bool fecn = false;
    bool becn = false;
    uint32_t dest_qp = 0;  // 24 bits
    bool ack_req = false;
    uint32_t psn = 0;  // 24 bits
};

struct Reth {
    uint64_t va = 0;
    uint32_t rkey = 0;
    uint32_t dma_len = 0;
};

// AETH syndrome: top two bits say ACK / RNR NAK / NAK, the low five carry credits,
// the RNR timer code, or the NAK code.
enum class AckType : uint8_t { Ack = 0, RnrNak = 1, Reserved = 2, Nak = 3 };
enum class NakCode : uint8_t {
    PsnSequenceError = 0,
    InvalidRequest = 1,
    RemoteAccessError = 2,
    RemoteOperationalError = 3,
    InvalidRdRequest = 4,
};
inline constexpr uint8_t kAethInvalidCredits = 0x1f;

struct Aeth {
    uint8_t syndrome = 0;
    uint32_t msn = 0;  // 24 bits

    AckType type() const { return static_cast<AckType>(syndrome >> 5); }
    uint8_t value() const { return syndrome & 0x1f; }
    static uint8_t make(AckType t, uint8_t value) {
        return static_cast<uint8_t>((static_cast<uint8_t>(t) << 5) | (value & 0x1f));
    }
};

struct Deth {
    uint32_t qkey = 0;
    uint32_t src_qp = 0;
};

struct AtomicEth {
    uint64_t va = 0;
    uint32_t rkey = 0;
    uint64_t swap_add = 0;
    uint64_t compare = 0;
};

// Every header a packet can carry; which ones are meaningful is said by `info`.
struct Headers {
    Bth bth;
    Reth reth;
    Aeth aeth;
    uint32_t imm = 0;   // ImmDt, host order (the value as the application sees it, in network order
                        // on the wire)
    uint32_t ieth = 0;  // invalidated rkey
    Deth deth;
    uint32_t xrc_srqn = 0;  // XRCETH: the XRC SRQ the request is for (24 bits)
    AtomicEth atomic;
    uint64_t atomic_ack = 0;
};

struct ParsedPacket {
    Headers h;
    const OpcodeInfo* info = nullptr;
    std::span<const uint8_t> payload;  // without pad and ICRC
    uint32_t icrc = 0;                 // as carried in the last four bytes
};

enum class ParseError {
    None = 0,
    TooShort,           // shorter than BTH + ICRC, or than the opcode's headers
    UnknownOpcode,      // no table row
    BadVersion,         // BTH TVer != 0
    PadTooLarge,        // pad exceeds the payload
    PayloadNotAllowed,  // payload bytes on an opcode that carries none
};
const char* to_string(ParseError e);

// Parse a RoCEv2 UDP payload (BTH .. ICRC). Does not check the ICRC: see icrc.h.
ParseError parse_packet(std::span<const uint8_t> udp_payload, ParsedPacket& out);

// Write BTH and the extension headers that `h.bth.opcode` carries into `out`
// (at least kMaxHeaderBytes). Returns the number of bytes written, or 0 if the
// opcode has no table row. The pad count in h.bth.pad is written as given.
size_t build_headers(const Headers& h, uint8_t* out);

// The destination QP of a packet's BTH (bytes 5-7), read without parsing the rest (steering
// and fault decisions before the parser runs). `udp_payload` holds at least kBthBytes.
inline uint32_t bth_dest_qp(std::span<const uint8_t> udp_payload) {
    return uint32_t{udp_payload[5]} << 16 | uint32_t{udp_payload[6]} << 8 | udp_payload[7];
}

// Pad bytes needed after `payload_len` bytes so the packet is 4-byte aligned.
inline constexpr uint8_t pad_for(size_t payload_len) {
    return static_cast<uint8_t>((4 - (payload_len & 3)) & 3);
}

}  // namespace uroce::wire
