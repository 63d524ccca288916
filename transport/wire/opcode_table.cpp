// The one opcode table: which extension headers each opcode carries and what it means to
// the transport. parse_packet() and build_headers() read nothing else, so supporting a new
// opcode is a new row here.
//
// Flag conventions (for the engine's benefit; wire.h only names them):
//  - kFirst/kMiddle/kLast/kOnly give the packet's place in its message. Single-packet
//    operations (READ request, atomics, ACKs) are kOnly.
//  - kRequest marks packets a requester sends, kResponse those a responder sends.
//  - kRead is on the READ request and on every READ response packet.
//  - kAtomicWrite is on ATOMIC WRITE alone: a request with a RETH and 8 bytes of payload
//    that takes a responder resource like a READ or an atomic, yet is answered by an ACK.
//  - kCnp is on the RoCEv2 CNP alone (opcode 0x81, transport bits 100): it belongs to no
//    transport and no message; its 16 reserved bytes are read as payload.
//  - kAck is on the packets whose whole purpose is to acknowledge (Acknowledge and Atomic
//    Acknowledge). READ responses First/Last/Only also carry an AETH, which the engine can
//    see from `headers & kHasAeth`.
#include <array>

#include "uroce/wire.h"

namespace uroce::wire {
namespace {

constexpr uint8_t header_bytes_for(uint16_t headers) {
    size_t n = kBthBytes;
    if (headers & kHasReth) n += kRethBytes;
    if (headers & kHasAeth) n += kAethBytes;
    if (headers & kHasImm) n += kImmBytes;
    if (headers & kHasIeth) n += kIethBytes;
    if (headers & kHasDeth) n += kDethBytes;
    if (headers & kHasXrceth) n += kXrcethBytes;
    if (headers & kHasAtomicEth) n += kAtomicEthBytes;
    if (headers & kHasAtomicAckEth) n += kAtomicAckEthBytes;
    return static_cast<uint8_t>(n);
}

struct Row {
    uint8_t opcode;
    const char* name;
    uint16_t headers;
    uint16_t flags;
};

constexpr uint16_t P = kHasPayload;
constexpr uint16_t X = kHasXrceth;

// The SEND and RDMA WRITE rows are the same for RC and UC (UC has no READ, atomics or
// ACKs); only the transport bits of the opcode and the name prefix differ.
constexpr Row kRows[] = {
    // Reliable Connection.
    {0x00, "RC Send First", P, kFirst | kRequest | kSend},
    {0x01, "RC Send Middle", P, kMiddle | kRequest | kSend},
    {0x02, "RC Send Last", P, kLast | kRequest | kSend},
    {0x03, "RC Send Last Immediate", kHasImm | P, kLast | kRequest | kSend},
    {0x04, "RC Send Only", P, kOnly | kRequest | kSend},
    {0x05, "RC Send Only Immediate", kHasImm | P, kOnly | kRequest | kSend},
    {0x06, "RC RDMA Write First", kHasReth | P, kFirst | kRequest | kWrite},
    {0x07, "RC RDMA Write Middle", P, kMiddle | kRequest | kWrite},
    {0x08, "RC RDMA Write Last", P, kLast | kRequest | kWrite},
    {0x09, "RC RDMA Write Last Immediate", kHasImm | P, kLast | kRequest | kWrite},
    {0x0a, "RC RDMA Write Only", kHasReth | P, kOnly | kRequest | kWrite},
    {0x0b, "RC RDMA Write Only Immediate", kHasReth | kHasImm | P, kOnly | kRequest | kWrite},
    {0x0c, "RC RDMA Read Request", kHasReth, kOnly | kRequest | kRead},
    {0x0d, "RC RDMA Read Response First", kHasAeth | P, kFirst | kResponse | kRead},
    {0x0e, "RC RDMA Read Response Middle", P, kMiddle | kResponse | kRead},
    {0x0f, "RC RDMA Read Response Last", kHasAeth | P, kLast | kResponse | kRead},
    {0x10, "RC RDMA Read Response Only", kHasAeth | P, kOnly | kResponse | kRead},
    {0x11, "RC Acknowledge", kHasAeth, kOnly | kResponse | kAck},
    {0x12, "RC Atomic Acknowledge", kHasAeth | kHasAtomicAckEth,
     kOnly | kResponse | kAtomic | kAck},
    {0x13, "RC Compare Swap", kHasAtomicEth, kOnly | kRequest | kAtomic},
    {0x14, "RC Fetch Add", kHasAtomicEth, kOnly | kRequest | kAtomic},
    {0x16, "RC Send Last Invalidate", kHasIeth | P, kLast | kRequest | kSend},
    {0x17, "RC Send Only Invalidate", kHasIeth | P, kOnly | kRequest | kSend},
    {0x1d, "RC Atomic Write", kHasReth | P, kOnly | kRequest | kAtomicWrite},

    // Unreliable Connection.
    {0x20, "UC Send First", P, kFirst | kRequest | kSend},
    {0x21, "UC Send Middle", P, kMiddle | kRequest | kSend},
    {0x22, "UC Send Last", P, kLast | kRequest | kSend},
    {0x23, "UC Send Last Immediate", kHasImm | P, kLast | kRequest | kSend},
    {0x24, "UC Send Only", P, kOnly | kRequest | kSend},
    {0x25, "UC Send Only Immediate", kHasImm | P, kOnly | kRequest | kSend},
    {0x26, "UC RDMA Write First", kHasReth | P, kFirst | kRequest | kWrite},
    {0x27, "UC RDMA Write Middle", P, kMiddle | kRequest | kWrite},
    {0x28, "UC RDMA Write Last", P, kLast | kRequest | kWrite},
    {0x29, "UC RDMA Write Last Immediate", kHasImm | P, kLast | kRequest | kWrite},
    {0x2a, "UC RDMA Write Only", kHasReth | P, kOnly | kRequest | kWrite},
    {0x2b, "UC RDMA Write Only Immediate", kHasReth | kHasImm | P, kOnly | kRequest | kWrite},

    // Unreliable Datagram (the IB CM's MADs on QP1 travel this way too).
    {0x64, "UD Send Only", kHasDeth | P, kOnly | kRequest | kSend},
    {0x65, "UD Send Only Immediate", kHasDeth | kHasImm | P, kOnly | kRequest | kSend},

    // Extended Reliable Connection: RC's rows with an XRCETH on every request. Responses
    // (ACKs, READ responses, atomic ACKs) carry none: they go back to one initiator QP.
    {0xa0, "XRC Send First", X | P, kFirst | kRequest | kSend},
    {0xa1, "XRC Send Middle", X | P, kMiddle | kRequest | kSend},
    {0xa2, "XRC Send Last", X | P, kLast | kRequest | kSend},
    {0xa3, "XRC Send Last Immediate", X | kHasImm | P, kLast | kRequest | kSend},
    {0xa4, "XRC Send Only", X | P, kOnly | kRequest | kSend},
    {0xa5, "XRC Send Only Immediate", X | kHasImm | P, kOnly | kRequest | kSend},
    {0xa6, "XRC RDMA Write First", X | kHasReth | P, kFirst | kRequest | kWrite},
    {0xa7, "XRC RDMA Write Middle", X | P, kMiddle | kRequest | kWrite},
    {0xa8, "XRC RDMA Write Last", X | P, kLast | kRequest | kWrite},
    {0xa9, "XRC RDMA Write Last Immediate", X | kHasImm | P, kLast | kRequest | kWrite},
    {0xaa, "XRC RDMA Write Only", X | kHasReth | P, kOnly | kRequest | kWrite},
    {0xab, "XRC RDMA Write Only Immediate", X | kHasReth | kHasImm | P, kOnly | kRequest | kWrite},
    {0xac, "XRC RDMA Read Request", X | kHasReth, kOnly | kRequest | kRead},
    {0xad, "XRC RDMA Read Response First", kHasAeth | P, kFirst | kResponse | kRead},
    {0xae, "XRC RDMA Read Response Middle", P, kMiddle | kResponse | kRead},
    {0xaf, "XRC RDMA Read Response Last", kHasAeth | P, kLast | kResponse | kRead},
    {0xb0, "XRC RDMA Read Response Only", kHasAeth | P, kOnly | kResponse | kRead},
    {0xb1, "XRC Acknowledge", kHasAeth, kOnly | kResponse | kAck},
    {0xb2, "XRC Atomic Acknowledge", kHasAeth | kHasAtomicAckEth,
     kOnly | kResponse | kAtomic | kAck},
    {0xb3, "XRC Compare Swap", X | kHasAtomicEth, kOnly | kRequest | kAtomic},
    {0xb4, "XRC Fetch Add", X | kHasAtomicEth, kOnly | kRequest | kAtomic},
    {0xb6, "XRC Send Last Invalidate", X | kHasIeth | P, kLast | kRequest | kSend},
    {0xb7, "XRC Send Only Invalidate", X | kHasIeth | P, kOnly | kRequest | kSend},

    // RoCEv2 congestion notification.
    {0x81, "CNP", P, kCnp},
};

constexpr std::array<OpcodeInfo, 256> make_table() {
    std::array<OpcodeInfo, 256> t{};
    for (const Row& r : kRows) {
        t[r.opcode] = OpcodeInfo{r.name, r.headers, r.flags, header_bytes_for(r.headers)};
    }
    return t;
}

constexpr std::array<OpcodeInfo, 256> kTable = make_table();

// A row's opcode must say the same transport as its name, each opcode may appear once, every
// row must say where its packet sits in a message, XRC requests (and only they) carry an
// XRCETH, XRC rows mirror RC's, and build_headers() must fit its output in kMaxHeaderBytes.
constexpr bool rows_are_consistent() {
    constexpr const char* kPrefix[] = {"RC ", "UC ", "RD ", "UD ", nullptr, "XRC"};
    std::array<bool, 256> seen{};
    for (const Row& r : kRows) {
        if (seen[r.opcode]) return false;
        seen[r.opcode] = true;
        if (r.flags & kCnp) {
            if (r.opcode != static_cast<uint8_t>(Opcode::Cnp) || r.flags != kCnp) return false;
            continue;
        }
        const uint8_t transport = r.opcode >> 5;
        if (transport >= 6 || kPrefix[transport] == nullptr) return false;
        const char* want = kPrefix[transport];
        for (int i = 0; i < 3; ++i) {
            if (r.name[i] != want[i]) return false;
        }
        const bool xrc = transport == static_cast<uint8_t>(Transport::Xrc);
        if (((r.headers & kHasXrceth) != 0) != (xrc && (r.flags & kRequest))) return false;
        if (xrc) {
            bool mirrored = false;
            for (const Row& rc : kRows) {
                if (rc.opcode == operation_of(r.opcode))
                    mirrored = rc.flags == r.flags &&
                               (rc.headers | kHasXrceth) == (r.headers | kHasXrceth);
            }
            if (!mirrored) return false;
        }
        const uint16_t place = r.flags & (kFirst | kMiddle | kLast | kOnly);
        if (place == 0 || (place & (place - 1)) != 0) return false;
        if (((r.flags & kRequest) != 0) == ((r.flags & kResponse) != 0)) return false;
        if (header_bytes_for(r.headers) > kMaxHeaderBytes) return false;
    }
    return true;
}
static_assert(rows_are_consistent());

// Every value of the Opcode enum has a row.
constexpr bool covers_enum() {
    for (Opcode op : {Opcode::RcSendFirst,
                      Opcode::RcSendMiddle,
                      Opcode::RcSendLast,
                      Opcode::RcSendLastImm,
                      Opcode::RcSendOnly,
                      Opcode::RcSendOnlyImm,
                      Opcode::RcWriteFirst,
                      Opcode::RcWriteMiddle,
                      Opcode::RcWriteLast,
                      Opcode::RcWriteLastImm,
                      Opcode::RcWriteOnly,
                      Opcode::RcWriteOnlyImm,
                      Opcode::RcReadRequest,
                      Opcode::RcReadResponseFirst,
                      Opcode::RcReadResponseMiddle,
                      Opcode::RcReadResponseLast,
                      Opcode::RcReadResponseOnly,
                      Opcode::RcAcknowledge,
                      Opcode::RcAtomicAcknowledge,
                      Opcode::RcCompareSwap,
                      Opcode::RcFetchAdd,
                      Opcode::RcSendLastInv,
                      Opcode::RcSendOnlyInv,
                      Opcode::RcAtomicWrite,
                      Opcode::Cnp}) {
        if (kTable[static_cast<uint8_t>(op)].name == nullptr) return false;
    }
    return true;
}
static_assert(covers_enum());

}  // namespace

const OpcodeInfo* opcode_info(uint8_t opcode) {
    const OpcodeInfo& row = kTable[opcode];
    return row.name != nullptr ? &row : nullptr;
}

}  // namespace uroce::wire
