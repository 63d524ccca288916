// Parsing and building of the IBA transport headers. Both directions walk the same
// per-header step table in wire order, guided by the opcode's HeaderBit set, so neither
// knows about individual opcodes.
#include "uroce/wire.h"

namespace uroce::wire {
namespace {

// Big-endian loads and stores. Byte-at-a-time so they work on any alignment; the compiler
// turns them into a load and a bswap.
uint32_t load24(const uint8_t* p) {
    return uint32_t{p[0]} << 16 | uint32_t{p[1]} << 8 | p[2];
}
uint32_t load32(const uint8_t* p) {
    return uint32_t{p[0]} << 24 | load24(p + 1);
}
uint64_t load64(const uint8_t* p) {
    return uint64_t{load32(p)} << 32 | load32(p + 4);
}

void store16(uint8_t* p, uint32_t v) {
    p[0] = static_cast<uint8_t>(v >> 8);
    p[1] = static_cast<uint8_t>(v);
}
void store24(uint8_t* p, uint32_t v) {
    p[0] = static_cast<uint8_t>(v >> 16);
    store16(p + 1, v);
}
void store32(uint8_t* p, uint32_t v) {
    p[0] = static_cast<uint8_t>(v >> 24);
    store24(p + 1, v);
}
void store64(uint8_t* p, uint64_t v) {
    store32(p, static_cast<uint32_t>(v >> 32));
    store32(p + 4, static_cast<uint32_t>(v));
}

// BTH layout: opcode | SE M Pad(2) TVer(4) | P_Key(16) | F B resv6 | DestQP(24) |
// A resv7 | PSN(24). Reserved bits are ignored on receive and sent as zero.
void read_bth(const uint8_t* p, Bth& b) {
    b.opcode = p[0];
    b.solicited = (p[1] & 0x80) != 0;
    b.migreq = (p[1] & 0x40) != 0;
    b.pad = static_cast<uint8_t>(p[1] >> 4 & 3);
    b.tver = p[1] & 0x0f;
    b.pkey = static_cast<uint16_t>(p[2] << 8 | p[3]);
    b.fecn = (p[4] & 0x80) != 0;
    b.becn = (p[4] & 0x40) != 0;
    b.dest_qp = load24(p + 5);
    b.ack_req = (p[8] & 0x80) != 0;
    b.psn = load24(p + 9);
}

void write_bth(const Bth& b, uint8_t* p) {
    p[0] = b.opcode;
    p[1] = static_cast<uint8_t>((b.solicited ? 0x80 : 0) | (b.migreq ? 0x40 : 0) |
                                (b.pad & 3) << 4 | (b.tver & 0x0f));
    store16(p + 2, b.pkey);
    p[4] = static_cast<uint8_t>((b.fecn ? 0x80 : 0) | (b.becn ? 0x40 : 0));
    store24(p + 5, b.dest_qp & kQpnMask);
    p[8] = b.ack_req ? 0x80 : 0;
    store24(p + 9, b.psn & kPsnMask);
}

// One extension header: how big it is and how to move it between wire and Headers.
struct Step {
    uint16_t bit;
    uint8_t bytes;
    void (*read)(const uint8_t*, Headers&);
    void (*write)(const Headers&, uint8_t*);
};

// IBA order of the extension headers. No row carries two from the same group (DETH, RETH
// and AtomicETH never meet in the RC/UC/UD/XRC opcodes), so this one order serves every
// opcode. The XRCETH comes first, straight after the BTH.
constexpr Step kSteps[] = {
    {kHasXrceth, kXrcethBytes, [](const uint8_t* p, Headers& h) { h.xrc_srqn = load24(p + 1); },
     [](const Headers& h, uint8_t* p) {
         p[0] = 0;  // reserved
         store24(p + 1, h.xrc_srqn & kQpnMask);
     }},
    {kHasDeth, kDethBytes,
     [](const uint8_t* p, Headers& h) {
         h.deth.qkey = load32(p);
         h.deth.src_qp = load24(p + 5);  // byte 4 is reserved
     },
     [](const Headers& h, uint8_t* p) {
         store32(p, h.deth.qkey);
         p[4] = 0;
         store24(p + 5, h.deth.src_qp & kQpnMask);
     }},
    {kHasReth, kRethBytes,
     [](const uint8_t* p, Headers& h) {
         h.reth.va = load64(p);
         h.reth.rkey = load32(p + 8);
         h.reth.dma_len = load32(p + 12);
     },
     [](const Headers& h, uint8_t* p) {
         store64(p, h.reth.va);
         store32(p + 8, h.reth.rkey);
         store32(p + 12, h.reth.dma_len);
     }},
    {kHasAtomicEth, kAtomicEthBytes,
     [](const uint8_t* p, Headers& h) {
         h.atomic.va = load64(p);
         h.atomic.rkey = load32(p + 8);
         h.atomic.swap_add = load64(p + 12);
         h.atomic.compare = load64(p + 20);
     },
     [](const Headers& h, uint8_t* p) {
         store64(p, h.atomic.va);
         store32(p + 8, h.atomic.rkey);
         store64(p + 12, h.atomic.swap_add);
         store64(p + 20, h.atomic.compare);
     }},
    {kHasAeth, kAethBytes,
     [](const uint8_t* p, Headers& h) {
         h.aeth.syndrome = p[0];
         h.aeth.msn = load24(p + 1);
     },
     [](const Headers& h, uint8_t* p) {
         p[0] = h.aeth.syndrome;
         store24(p + 1, h.aeth.msn & 0xffffff);
     }},
    {kHasAtomicAckEth, kAtomicAckEthBytes,
     [](const uint8_t* p, Headers& h) { h.atomic_ack = load64(p); },
     [](const Headers& h, uint8_t* p) { store64(p, h.atomic_ack); }},
    {kHasImm, kImmBytes, [](const uint8_t* p, Headers& h) { h.imm = load32(p); },
     [](const Headers& h, uint8_t* p) { store32(p, h.imm); }},
    {kHasIeth, kIethBytes, [](const uint8_t* p, Headers& h) { h.ieth = load32(p); },
     [](const Headers& h, uint8_t* p) { store32(p, h.ieth); }},
};

}  // namespace

const char* to_string(ParseError e) {
    switch (e) {
        case ParseError::None:
            return "none";
        case ParseError::TooShort:
            return "packet too short";
        case ParseError::UnknownOpcode:
            return "unknown opcode";
        case ParseError::BadVersion:
            return "bad BTH transport header version";
        case ParseError::PadTooLarge:
            return "pad count exceeds payload";
        case ParseError::PayloadNotAllowed:
            return "payload on an opcode that carries none";
    }
    return "invalid ParseError";
}

namespace {

ParseError parse_into(std::span<const uint8_t> udp_payload, ParsedPacket& out) {
    const size_t len = udp_payload.size();
    const uint8_t* p = udp_payload.data();
    if (len < kBthBytes + kIcrcBytes) return ParseError::TooShort;

    // Straight into `out`, which starts zeroed: no second Headers to clear and copy.
    Headers& h = out.h;
    read_bth(p, h.bth);
    // A different version may lay out even the opcode differently, so check it first.
    if (h.bth.tver != 0) return ParseError::BadVersion;
    const OpcodeInfo* info = opcode_info(h.bth.opcode);
    if (info == nullptr) return ParseError::UnknownOpcode;
    if (len < info->header_bytes + kIcrcBytes) return ParseError::TooShort;

    size_t off = kBthBytes;
    for (const Step& s : kSteps) {
        if (info->headers & s.bit) {
            s.read(p + off, h);
            off += s.bytes;
        }
    }

    // What is between the headers and the ICRC is payload followed by pad.
    const size_t rest = len - off - kIcrcBytes;
    if (!(info->headers & kHasPayload) && rest != 0) return ParseError::PayloadNotAllowed;
    if (h.bth.pad > rest) return ParseError::PadTooLarge;

    const uint8_t* icrc = p + len - kIcrcBytes;
    out.info = info;
    out.payload = udp_payload.subspan(off, rest - h.bth.pad);
    out.icrc = uint32_t{icrc[0]} | uint32_t{icrc[1]} << 8 | uint32_t{icrc[2]} << 16 |
               uint32_t{icrc[3]} << 24;
    return ParseError::None;
}

}  // namespace

ParseError parse_packet(std::span<const uint8_t> udp_payload, ParsedPacket& out) {
    out = ParsedPacket{};
    const ParseError e = parse_into(udp_payload, out);
    if (e != ParseError::None) out = ParsedPacket{};  // nothing half-parsed is left
    return e;
}

size_t build_headers(const Headers& h, uint8_t* out) {
    const OpcodeInfo* info = opcode_info(h.bth.opcode);
    if (info == nullptr) return 0;
    write_bth(h.bth, out);
    size_t off = kBthBytes;
    for (const Step& s : kSteps) {
        if (info->headers & s.bit) {
            s.write(h, out + off);
            off += s.bytes;
        }
    }
    return off;
}

}  // namespace uroce::wire
