// Header parsing and building, checked against tshark's dissection of the kernel captures.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "captures.h"
#include "uroce/icrc.h"
#include "uroce/wire.h"

using namespace uroce::wire;
using uroce::IpAddress;
using wiretest::all_packets;
using wiretest::CapturedPacket;

namespace {

std::string hex(uint64_t v, int digits) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%0*llx", digits, static_cast<unsigned long long>(v));
    return buf;
}

// The fields of a parsed packet in the form the expectations below were written in (one
// extension header after another, in wire order, only those the opcode carries).
std::string describe(const ParsedPacket& p) {
    const Bth& b = p.h.bth;
    std::string s = "op=" + hex(b.opcode, 2) + " se=" + std::to_string(b.solicited) +
                    " m=" + std::to_string(b.migreq) + " pad=" + std::to_string(b.pad) +
                    " pkey=" + hex(b.pkey, 4) + " qp=" + hex(b.dest_qp, 6) +
                    " a=" + std::to_string(b.ack_req) + " psn=" + hex(b.psn, 6);
    const uint16_t hdrs = p.info->headers;
    if (hdrs & kHasDeth) s += " deth=" + hex(p.h.deth.qkey, 8) + "/" + hex(p.h.deth.src_qp, 6);
    if (hdrs & kHasReth) {
        s += " reth=" + hex(p.h.reth.va, 16) + "/" + hex(p.h.reth.rkey, 8) + "/" +
             std::to_string(p.h.reth.dma_len);
    }
    if (hdrs & kHasAtomicEth) {
        s += " atomic=" + hex(p.h.atomic.va, 16) + "/" + hex(p.h.atomic.rkey, 8) + "/" +
             hex(p.h.atomic.swap_add, 16) + "/" + hex(p.h.atomic.compare, 16);
    }
    if (hdrs & kHasAeth) s += " aeth=" + hex(p.h.aeth.syndrome, 2) + "/" + hex(p.h.aeth.msn, 6);
    if (hdrs & kHasAtomicAckEth) s += " aack=" + hex(p.h.atomic_ack, 16);
    if (hdrs & kHasImm) s += " imm=" + hex(p.h.imm, 8);
    if (hdrs & kHasIeth) s += " ieth=" + hex(p.h.ieth, 8);
    s += " len=" + std::to_string(p.payload.size());
    return s;
}

struct Expected {
    const char* capture;
    size_t frame;
    const char* fields;
};

// Written from `tshark -T fields` (the BTH fields, the raw bytes of each extension header
// tshark decoded, the UDP length) for the first eight packets of each opcode in each capture
// and each capture's last packet. The payload length is the UDP length less 8, the header
// bytes tshark saw, the pad count and the ICRC.
constexpr Expected kExpected[] = {
    {"rc_atomic_cas", 1,
     "op=13 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=eb28d7 "
     "atomic=0000557e44361000/0000022e/0000000000000000/0000000000000000 len=0"},
    {"rc_atomic_cas", 2,
     "op=12 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=eb28d7 aeth=1f/000001 aack=55c36b3bce5665f0 "
     "len=0"},
    {"rc_atomic_cas", 3,
     "op=13 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=eb28d8 "
     "atomic=0000557e44361040/0000022e/0000000000000000/0000000000000000 len=0"},
    {"rc_atomic_cas", 4,
     "op=13 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=eb28d9 "
     "atomic=0000557e44361080/0000022e/0000000000000000/0000000000000000 len=0"},
    {"rc_atomic_cas", 5,
     "op=12 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=eb28d8 aeth=1f/000002 aack=f86270a1f738a731 "
     "len=0"},
    {"rc_atomic_cas", 6,
     "op=12 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=eb28d9 aeth=1f/000003 aack=dafedd1980316cf7 "
     "len=0"},
    {"rc_atomic_cas", 7,
     "op=13 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=eb28da "
     "atomic=0000557e443610c0/0000022e/0000000000000000/0000000000000000 len=0"},
    {"rc_atomic_cas", 8,
     "op=12 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=eb28da aeth=1f/000004 aack=5bb6e9815b195dbc "
     "len=0"},
    {"rc_atomic_cas", 9,
     "op=13 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=eb28db "
     "atomic=0000557e44361100/0000022e/0000000000000000/0000000000000000 len=0"},
    {"rc_atomic_cas", 10,
     "op=12 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=eb28db aeth=1f/000005 aack=babc931572ec6e82 "
     "len=0"},
    {"rc_atomic_fadd", 1,
     "op=14 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=22c9d7 "
     "atomic=0000555b120c5000/000002fc/0000000000000001/0000000000000000 len=0"},
    {"rc_atomic_fadd", 2,
     "op=12 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=22c9d7 aeth=1f/000001 aack=742e1501db312932 "
     "len=0"},
    {"rc_atomic_fadd", 3,
     "op=14 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=22c9d8 "
     "atomic=0000555b120c5040/000002fc/0000000000000001/0000000000000000 len=0"},
    {"rc_atomic_fadd", 4,
     "op=12 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=22c9d8 aeth=1f/000002 aack=e7f0f8fd2483d569 "
     "len=0"},
    {"rc_atomic_fadd", 5,
     "op=14 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=22c9d9 "
     "atomic=0000555b120c5080/000002fc/0000000000000001/0000000000000000 len=0"},
    {"rc_atomic_fadd", 6,
     "op=14 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=22c9da "
     "atomic=0000555b120c50c0/000002fc/0000000000000001/0000000000000000 len=0"},
    {"rc_atomic_fadd", 7,
     "op=14 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=22c9db "
     "atomic=0000555b120c5100/000002fc/0000000000000001/0000000000000000 len=0"},
    {"rc_atomic_fadd", 8,
     "op=12 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=22c9d9 aeth=1f/000003 aack=bd8893d87d685ba6 "
     "len=0"},
    {"rc_atomic_fadd", 9,
     "op=12 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=22c9da aeth=1f/000004 aack=468c3b3d3aeb285e "
     "len=0"},
    {"rc_atomic_fadd", 10,
     "op=12 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=22c9db aeth=1f/000005 aack=79b0c1cff671a1e3 "
     "len=0"},
    {"rc_read", 1,
     "op=0c se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=06ae43 reth=000055b3b58cb710/00000265/10000 "
     "len=0"},
    {"rc_read", 2,
     "op=0d se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=06ae43 aeth=1f/000001 len=1024"},
    {"rc_read", 3, "op=0e se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=06ae44 len=1024"},
    {"rc_read", 4, "op=0e se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=06ae45 len=1024"},
    {"rc_read", 5, "op=0e se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=06ae46 len=1024"},
    {"rc_read", 6,
     "op=0c se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=06ae4d reth=000055b3b58cb710/00000265/10000 "
     "len=0"},
    {"rc_read", 7,
     "op=0c se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=06ae57 reth=000055b3b58cb710/00000265/10000 "
     "len=0"},
    {"rc_read", 8,
     "op=0c se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=06ae61 reth=000055b3b58cb710/00000265/10000 "
     "len=0"},
    {"rc_read", 9,
     "op=0c se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=06ae6b reth=000055b3b58cb710/00000265/10000 "
     "len=0"},
    {"rc_read", 10, "op=0e se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=06ae47 len=1024"},
    {"rc_read", 11, "op=0e se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=06ae48 len=1024"},
    {"rc_read", 12, "op=0e se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=06ae49 len=1024"},
    {"rc_read", 13, "op=0e se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=06ae4a len=1024"},
    {"rc_read", 14, "op=0e se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=06ae4b len=1024"},
    {"rc_read", 15,
     "op=0f se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=06ae4c aeth=1f/000001 len=784"},
    {"rc_read", 16,
     "op=0d se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=06ae4d aeth=1f/000002 len=1024"},
    {"rc_read", 25,
     "op=0f se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=06ae56 aeth=1f/000002 len=784"},
    {"rc_read", 26,
     "op=0d se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=06ae57 aeth=1f/000003 len=1024"},
    {"rc_read", 35,
     "op=0f se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=06ae60 aeth=1f/000003 len=784"},
    {"rc_read", 36,
     "op=0d se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=06ae61 aeth=1f/000004 len=1024"},
    {"rc_read", 45,
     "op=0f se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=06ae6a aeth=1f/000004 len=784"},
    {"rc_read", 46,
     "op=0d se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=06ae6b aeth=1f/000005 len=1024"},
    {"rc_read", 55,
     "op=0f se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=06ae74 aeth=1f/000005 len=784"},
    {"rc_send_10000", 1, "op=00 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=72e329 len=1024"},
    {"rc_send_10000", 2, "op=01 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=72e32a len=1024"},
    {"rc_send_10000", 3, "op=01 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=72e32b len=1024"},
    {"rc_send_10000", 4, "op=01 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=72e32c len=1024"},
    {"rc_send_10000", 5, "op=01 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=72e32d len=1024"},
    {"rc_send_10000", 6, "op=01 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=72e32e len=1024"},
    {"rc_send_10000", 7, "op=01 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=72e32f len=1024"},
    {"rc_send_10000", 8, "op=01 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=72e330 len=1024"},
    {"rc_send_10000", 9, "op=01 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=72e331 len=1024"},
    {"rc_send_10000", 10, "op=02 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=72e332 len=784"},
    {"rc_send_10000", 11,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=72e332 aeth=1f/000001 len=0"},
    {"rc_send_10000", 12, "op=00 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=2be368 len=1024"},
    {"rc_send_10000", 21, "op=02 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=2be371 len=784"},
    {"rc_send_10000", 22,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=2be371 aeth=1f/000001 len=0"},
    {"rc_send_10000", 23, "op=00 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=72e333 len=1024"},
    {"rc_send_10000", 32, "op=02 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=72e33c len=784"},
    {"rc_send_10000", 33,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=72e33c aeth=1f/000002 len=0"},
    {"rc_send_10000", 34, "op=00 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=2be372 len=1024"},
    {"rc_send_10000", 43, "op=02 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=2be37b len=784"},
    {"rc_send_10000", 44,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=2be37b aeth=1f/000002 len=0"},
    {"rc_send_10000", 45, "op=00 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=72e33d len=1024"},
    {"rc_send_10000", 54, "op=02 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=72e346 len=784"},
    {"rc_send_10000", 55,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=72e346 aeth=1f/000003 len=0"},
    {"rc_send_10000", 56, "op=00 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=2be37c len=1024"},
    {"rc_send_10000", 65, "op=02 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=2be385 len=784"},
    {"rc_send_10000", 66,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=2be385 aeth=1f/000003 len=0"},
    {"rc_send_64", 1, "op=04 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=d3e54a len=64"},
    {"rc_send_64", 2,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=d3e54a aeth=1f/000001 len=0"},
    {"rc_send_64", 3, "op=04 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=d5c098 len=64"},
    {"rc_send_64", 4,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=d5c098 aeth=1f/000001 len=0"},
    {"rc_send_64", 5, "op=04 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=d3e54b len=64"},
    {"rc_send_64", 6,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=d3e54b aeth=1f/000002 len=0"},
    {"rc_send_64", 7, "op=04 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=d5c099 len=64"},
    {"rc_send_64", 8,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=d5c099 aeth=1f/000002 len=0"},
    {"rc_send_64", 9, "op=04 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=d3e54c len=64"},
    {"rc_send_64", 10,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=d3e54c aeth=1f/000003 len=0"},
    {"rc_send_64", 11, "op=04 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=d5c09a len=64"},
    {"rc_send_64", 12,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=d5c09a aeth=1f/000003 len=0"},
    {"rc_write", 1,
     "op=06 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=972810 reth=000055cb75d4d710/000002c4/10000 "
     "len=1024"},
    {"rc_write", 2, "op=07 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=972811 len=1024"},
    {"rc_write", 3, "op=07 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=972812 len=1024"},
    {"rc_write", 4, "op=07 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=972813 len=1024"},
    {"rc_write", 5, "op=07 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=972814 len=1024"},
    {"rc_write", 6, "op=07 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=972815 len=1024"},
    {"rc_write", 7, "op=07 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=972816 len=1024"},
    {"rc_write", 8, "op=07 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=972817 len=1024"},
    {"rc_write", 9, "op=07 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=972818 len=1024"},
    {"rc_write", 10, "op=08 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=972819 len=784"},
    {"rc_write", 11,
     "op=06 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=97281a reth=000055cb75d4d710/000002c4/10000 "
     "len=1024"},
    {"rc_write", 20, "op=08 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=972823 len=784"},
    {"rc_write", 21,
     "op=06 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=972824 reth=000055cb75d4d710/000002c4/10000 "
     "len=1024"},
    {"rc_write", 30, "op=08 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=97282d len=784"},
    {"rc_write", 31,
     "op=06 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=97282e reth=000055cb75d4d710/000002c4/10000 "
     "len=1024"},
    {"rc_write", 40, "op=08 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=972837 len=784"},
    {"rc_write", 41,
     "op=06 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=972838 reth=000055cb75d4d710/000002c4/10000 "
     "len=1024"},
    {"rc_write", 50, "op=08 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=972841 len=784"},
    {"rc_write", 51,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=972819 aeth=1f/000001 len=0"},
    {"rc_write", 52,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=972823 aeth=1f/000002 len=0"},
    {"rc_write", 53,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=97282d aeth=1f/000003 len=0"},
    {"rc_write", 54,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=972837 aeth=1f/000004 len=0"},
    {"rc_write", 55,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=972841 aeth=1f/000005 len=0"},
    {"rc_write_imm", 1,
     "op=06 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=0012ed reth=000055a484e263a0/000002cc/10000 "
     "len=1024"},
    {"rc_write_imm", 2, "op=07 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=0012ee len=1024"},
    {"rc_write_imm", 3, "op=07 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=0012ef len=1024"},
    {"rc_write_imm", 4, "op=07 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=0012f0 len=1024"},
    {"rc_write_imm", 5, "op=07 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=0012f1 len=1024"},
    {"rc_write_imm", 6, "op=07 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=0012f2 len=1024"},
    {"rc_write_imm", 7, "op=07 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=0012f3 len=1024"},
    {"rc_write_imm", 8, "op=07 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=0012f4 len=1024"},
    {"rc_write_imm", 9, "op=07 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=0012f5 len=1024"},
    {"rc_write_imm", 10,
     "op=09 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=0012f6 imm=00001000 len=784"},
    {"rc_write_imm", 11,
     "op=06 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=0012f7 reth=000055a484e263a0/000002cc/10000 "
     "len=1024"},
    {"rc_write_imm", 20,
     "op=09 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=001300 imm=00001001 len=784"},
    {"rc_write_imm", 21, "op=00 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=001301 len=1024"},
    {"rc_write_imm", 22, "op=01 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=001302 len=1024"},
    {"rc_write_imm", 23, "op=01 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=001303 len=1024"},
    {"rc_write_imm", 24, "op=01 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=001304 len=1024"},
    {"rc_write_imm", 25, "op=01 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=001305 len=1024"},
    {"rc_write_imm", 26, "op=01 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=001306 len=1024"},
    {"rc_write_imm", 27, "op=01 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=001307 len=1024"},
    {"rc_write_imm", 28, "op=01 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=001308 len=1024"},
    {"rc_write_imm", 29, "op=01 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=001309 len=1024"},
    {"rc_write_imm", 30,
     "op=03 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=00130a imm=00002000 len=784"},
    {"rc_write_imm", 31, "op=00 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=00130b len=1024"},
    {"rc_write_imm", 40,
     "op=03 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=001314 imm=00002001 len=784"},
    {"rc_write_imm", 41,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=0012f6 aeth=1f/000001 len=0"},
    {"rc_write_imm", 42,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=001300 aeth=1f/000002 len=0"},
    {"rc_write_imm", 43,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=00130a aeth=1f/000003 len=0"},
    {"rc_write_imm", 44,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=001314 aeth=1f/000004 len=0"},
    {"rc_write_rdmacm", 1,
     "op=64 se=0 m=0 pad=0 pkey=ffff qp=000001 a=1 psn=000000 deth=80010000/000001 len=256"},
    {"rc_write_rdmacm", 2,
     "op=64 se=0 m=0 pad=0 pkey=ffff qp=000001 a=1 psn=000000 deth=80010000/000001 len=256"},
    {"rc_write_rdmacm", 3,
     "op=64 se=0 m=0 pad=0 pkey=ffff qp=000001 a=1 psn=000001 deth=80010000/000001 len=256"},
    {"rc_write_rdmacm", 4, "op=04 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=168009 len=16"},
    {"rc_write_rdmacm", 5,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=168009 aeth=1f/000001 len=0"},
    {"rc_write_rdmacm", 6, "op=04 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=3d3f2a len=16"},
    {"rc_write_rdmacm", 7,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=3d3f2a aeth=1f/000001 len=0"},
    {"rc_write_rdmacm", 8, "op=04 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=16800a len=4"},
    {"rc_write_rdmacm", 9,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=16800a aeth=1f/000002 len=0"},
    {"rc_write_rdmacm", 10, "op=04 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=3d3f2b len=4"},
    {"rc_write_rdmacm", 11,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=3d3f2b aeth=1f/000002 len=0"},
    {"rc_write_rdmacm", 12, "op=04 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=16800b len=4"},
    {"rc_write_rdmacm", 13,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=16800b aeth=1f/000003 len=0"},
    {"rc_write_rdmacm", 14, "op=04 se=0 m=0 pad=0 pkey=ffff qp=000011 a=1 psn=3d3f2c len=4"},
    {"rc_write_rdmacm", 15,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=3d3f2c aeth=1f/000003 len=0"},
    {"rc_write_rdmacm", 16, "op=04 se=0 m=0 pad=2 pkey=ffff qp=000011 a=1 psn=16800c len=2"},
    {"rc_write_rdmacm", 17,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=16800c aeth=1f/000004 len=0"},
    {"rc_write_rdmacm", 18, "op=04 se=0 m=0 pad=2 pkey=ffff qp=000011 a=1 psn=3d3f2d len=2"},
    {"rc_write_rdmacm", 19,
     "op=11 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=3d3f2d aeth=1f/000004 len=0"},
    {"rc_write_rdmacm", 24,
     "op=64 se=0 m=0 pad=0 pkey=ffff qp=000001 a=1 psn=000002 deth=80010000/000001 len=256"},
    {"rc_write_rdmacm", 25,
     "op=64 se=0 m=0 pad=0 pkey=ffff qp=000001 a=1 psn=000001 deth=80010000/000001 len=256"},
    {"rc_write_rdmacm", 26,
     "op=64 se=0 m=0 pad=0 pkey=ffff qp=000001 a=1 psn=000003 deth=80010000/000001 len=256"},
    {"rc_write_rdmacm", 43,
     "op=0a se=0 m=0 pad=0 pkey=ffff qp=000012 a=1 psn=675837 reth=00005580c732d000/00000371/1024 "
     "len=1024"},
    {"rc_write_rdmacm", 44,
     "op=0a se=0 m=0 pad=0 pkey=ffff qp=000012 a=1 psn=675838 reth=00005580c732d400/00000371/1024 "
     "len=1024"},
    {"rc_write_rdmacm", 45,
     "op=0a se=0 m=0 pad=0 pkey=ffff qp=000012 a=1 psn=675839 reth=00005580c732d800/00000371/1024 "
     "len=1024"},
    {"rc_write_rdmacm", 46,
     "op=0a se=0 m=0 pad=0 pkey=ffff qp=000012 a=1 psn=67583a reth=00005580c732dc00/00000371/1024 "
     "len=1024"},
    {"rc_write_rdmacm", 47,
     "op=0a se=0 m=0 pad=0 pkey=ffff qp=000012 a=1 psn=67583b reth=00005580c732d000/00000371/1024 "
     "len=1024"},
    {"rc_write_rdmacm", 81,
     "op=64 se=0 m=0 pad=0 pkey=ffff qp=000001 a=1 psn=000004 deth=80010000/000001 len=256"},
    {"rc_write_rdmacm", 82,
     "op=64 se=0 m=0 pad=0 pkey=ffff qp=000001 a=1 psn=000002 deth=80010000/000001 len=256"},
    {"rc_write_rdmacm", 86,
     "op=64 se=0 m=0 pad=0 pkey=ffff qp=000001 a=1 psn=000004 deth=80010000/000001 len=256"},
    {"uc_send", 1, "op=20 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=e2a476 len=1024"},
    {"uc_send", 2, "op=21 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=e2a477 len=1024"},
    {"uc_send", 3, "op=21 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=e2a478 len=1024"},
    {"uc_send", 4, "op=22 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=e2a479 len=1024"},
    {"uc_send", 5, "op=20 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=b8ea36 len=1024"},
    {"uc_send", 6, "op=21 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=b8ea37 len=1024"},
    {"uc_send", 7, "op=21 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=b8ea38 len=1024"},
    {"uc_send", 8, "op=22 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=b8ea39 len=1024"},
    {"uc_send", 9, "op=20 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=e2a47a len=1024"},
    {"uc_send", 10, "op=21 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=e2a47b len=1024"},
    {"uc_send", 11, "op=21 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=e2a47c len=1024"},
    {"uc_send", 12, "op=22 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=e2a47d len=1024"},
    {"uc_send", 13, "op=20 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=b8ea3a len=1024"},
    {"uc_send", 14, "op=21 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=b8ea3b len=1024"},
    {"uc_send", 15, "op=21 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=b8ea3c len=1024"},
    {"uc_send", 16, "op=22 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=b8ea3d len=1024"},
    {"uc_send", 17, "op=20 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=e2a47e len=1024"},
    {"uc_send", 20, "op=22 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=e2a481 len=1024"},
    {"uc_send", 21, "op=20 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=b8ea3e len=1024"},
    {"uc_send", 24, "op=22 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=b8ea41 len=1024"},
    {"uc_write", 1,
     "op=26 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=03ca1c reth=0000565353797710/0000026f/10000 "
     "len=1024"},
    {"uc_write", 2, "op=27 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=03ca1d len=1024"},
    {"uc_write", 3, "op=27 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=03ca1e len=1024"},
    {"uc_write", 4, "op=27 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=03ca1f len=1024"},
    {"uc_write", 5, "op=27 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=03ca20 len=1024"},
    {"uc_write", 6, "op=27 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=03ca21 len=1024"},
    {"uc_write", 7, "op=27 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=03ca22 len=1024"},
    {"uc_write", 8, "op=27 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=03ca23 len=1024"},
    {"uc_write", 9, "op=27 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=03ca24 len=1024"},
    {"uc_write", 10, "op=28 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=03ca25 len=784"},
    {"uc_write", 11,
     "op=26 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=03ca26 reth=0000565353797710/0000026f/10000 "
     "len=1024"},
    {"uc_write", 20, "op=28 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=03ca2f len=784"},
    {"uc_write", 21,
     "op=26 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=03ca30 reth=0000565353797710/0000026f/10000 "
     "len=1024"},
    {"uc_write", 30, "op=28 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=03ca39 len=784"},
    {"uc_write", 31,
     "op=26 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=03ca3a reth=0000565353797710/0000026f/10000 "
     "len=1024"},
    {"uc_write", 40, "op=28 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=03ca43 len=784"},
    {"uc_write", 41,
     "op=26 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=03ca44 reth=0000565353797710/0000026f/10000 "
     "len=1024"},
    {"uc_write", 50, "op=28 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=03ca4d len=784"},
    {"ud_send", 1,
     "op=64 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=b387d8 deth=11111111/000011 len=1024"},
    {"ud_send", 2,
     "op=64 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=f50208 deth=11111111/000011 len=1024"},
    {"ud_send", 3,
     "op=64 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=b387d9 deth=11111111/000011 len=1024"},
    {"ud_send", 4,
     "op=64 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=f50209 deth=11111111/000011 len=1024"},
    {"ud_send", 5,
     "op=64 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=b387da deth=11111111/000011 len=1024"},
    {"ud_send", 6,
     "op=64 se=0 m=0 pad=0 pkey=ffff qp=000011 a=0 psn=f5020a deth=11111111/000011 len=1024"},
};

// The names Wireshark's Info column gives. Those of opcodes the captures hold were read from
// `tshark -r <capture>`; the rest from tshark's dissection of packets built by build_headers.
// (For UC RDMA Write First, Wireshark runs the name into the "QP=" that follows it.)
constexpr std::pair<uint8_t, const char*> kWiresharkNames[] = {
    {0x00, "RC Send First"},
    {0x01, "RC Send Middle"},
    {0x02, "RC Send Last"},
    {0x03, "RC Send Last Immediate"},
    {0x04, "RC Send Only"},
    {0x05, "RC Send Only Immediate"},
    {0x06, "RC RDMA Write First"},
    {0x07, "RC RDMA Write Middle"},
    {0x08, "RC RDMA Write Last"},
    {0x09, "RC RDMA Write Last Immediate"},
    {0x0a, "RC RDMA Write Only"},
    {0x0b, "RC RDMA Write Only Immediate"},
    {0x0c, "RC RDMA Read Request"},
    {0x0d, "RC RDMA Read Response First"},
    {0x0e, "RC RDMA Read Response Middle"},
    {0x0f, "RC RDMA Read Response Last"},
    {0x10, "RC RDMA Read Response Only"},
    {0x11, "RC Acknowledge"},
    {0x12, "RC Atomic Acknowledge"},
    {0x13, "RC Compare Swap"},
    {0x14, "RC Fetch Add"},
    {0x16, "RC Send Last Invalidate"},
    {0x17, "RC Send Only Invalidate"},
    {0x20, "UC Send First"},
    {0x21, "UC Send Middle"},
    {0x22, "UC Send Last"},
    {0x23, "UC Send Last Immediate"},
    {0x24, "UC Send Only"},
    {0x25, "UC Send Only Immediate"},
    {0x26, "UC RDMA Write First"},
    {0x27, "UC RDMA Write Middle"},
    {0x28, "UC RDMA Write Last"},
    {0x29, "UC RDMA Write Last Immediate"},
    {0x2a, "UC RDMA Write Only"},
    {0x2b, "UC RDMA Write Only Immediate"},
    {0x64, "UD Send Only"},
    {0x65, "UD Send Only Immediate"},
    // Wireshark 4.0 has no XRC rows (it shows "Unknown OpCode"): these follow its RC names.
    {0xa0, "XRC Send First"},
    {0xa1, "XRC Send Middle"},
    {0xa2, "XRC Send Last"},
    {0xa3, "XRC Send Last Immediate"},
    {0xa4, "XRC Send Only"},
    {0xa5, "XRC Send Only Immediate"},
    {0xa6, "XRC RDMA Write First"},
    {0xa7, "XRC RDMA Write Middle"},
    {0xa8, "XRC RDMA Write Last"},
    {0xa9, "XRC RDMA Write Last Immediate"},
    {0xaa, "XRC RDMA Write Only"},
    {0xab, "XRC RDMA Write Only Immediate"},
    {0xac, "XRC RDMA Read Request"},
    {0xad, "XRC RDMA Read Response First"},
    {0xae, "XRC RDMA Read Response Middle"},
    {0xaf, "XRC RDMA Read Response Last"},
    {0xb0, "XRC RDMA Read Response Only"},
    {0xb1, "XRC Acknowledge"},
    {0xb2, "XRC Atomic Acknowledge"},
    {0xb3, "XRC Compare Swap"},
    {0xb4, "XRC Fetch Add"},
    {0xb6, "XRC Send Last Invalidate"},
    {0xb7, "XRC Send Only Invalidate"},
    {0x81, "CNP"},
};

// Opcodes newer than Debian 12's Wireshark 4.0, which shows them as "Unknown OpCode": named
// after the IBA's own name for them.
constexpr std::pair<uint8_t, const char*> kNamesWiresharkLacks[] = {
    {0x1d, "RC Atomic Write"},
};

constexpr Opcode kAllOpcodes[] = {
    Opcode::RcSendFirst,
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
    Opcode::Cnp,
};

// Extension header sizes, computed independently of the table's header_bytes.
size_t extension_bytes(uint16_t headers) {
    size_t n = 0;
    const std::pair<uint16_t, size_t> sizes[] = {
        {kHasReth, 16}, {kHasAeth, 4},       {kHasImm, 4},          {kHasIeth, 4},
        {kHasDeth, 8},  {kHasAtomicEth, 28}, {kHasAtomicAckEth, 8}, {kHasXrceth, 4},
    };
    for (const auto& [bit, bytes] : sizes) {
        if (headers & bit) n += bytes;
    }
    return n;
}

uint32_t le32(const uint8_t* p) {
    return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

// A packet as uroce would send it: headers, payload, zero pad, ICRC (id 0, DF).
std::vector<uint8_t> make_packet(const Headers& h, std::span<const uint8_t> payload) {
    std::vector<uint8_t> pkt(kMaxHeaderBytes);
    const size_t n = build_headers(h, pkt.data());
    REQUIRE(n != 0);
    pkt.resize(n);
    pkt.insert(pkt.end(), payload.begin(), payload.end());
    pkt.insert(pkt.end(), h.bth.pad, uint8_t{0});
    const uint32_t crc =
        icrc(IpFlow{IpAddress::v4(0x0a000001), IpAddress::v4(0x0a000002), 0xc000, kRoceV2Port},
             Ipv4Unseen{}, pkt);
    for (int i = 0; i < 4; ++i) pkt.push_back(static_cast<uint8_t>(crc >> (8 * i)));
    return pkt;
}

Headers headers_for(Opcode op, uint8_t pad = 0) {
    Headers h;
    h.bth.opcode = static_cast<uint8_t>(op);
    h.bth.pad = pad;
    h.bth.dest_qp = 0x12;
    h.bth.psn = 0x345678;
    return h;
}

// Checks that a successful parse of `buf` is self-consistent.
void check_consistent(std::span<const uint8_t> buf, const ParsedPacket& p) {
    REQUIRE(p.info != nullptr);
    REQUIRE(p.info == opcode_info(p.h.bth.opcode));
    REQUIRE(p.h.bth.tver == 0);
    REQUIRE(p.info->header_bytes + p.payload.size() + p.h.bth.pad + kIcrcBytes == buf.size());
    REQUIRE(p.payload.data() == buf.data() + p.info->header_bytes);
    if (!(p.info->headers & kHasPayload)) REQUIRE(p.payload.empty());
    REQUIRE(p.icrc == le32(buf.data() + buf.size() - 4));
}

}  // namespace

TEST_CASE("the opcode table covers every Opcode and names rows as Wireshark does",
          "[wire][opcode]") {
    for (Opcode op : kAllOpcodes) {
        CAPTURE(static_cast<int>(op));
        REQUIRE(opcode_info(static_cast<uint8_t>(op)) != nullptr);
    }

    std::set<int> named;
    using Names = std::span<const std::pair<uint8_t, const char*>>;
    for (const Names list : {Names(kWiresharkNames), Names(kNamesWiresharkLacks)}) {
        for (const auto& [op, name] : list) {
            CAPTURE(static_cast<int>(op));
            const OpcodeInfo* info = opcode_info(op);
            REQUIRE(info != nullptr);
            CHECK(std::string(info->name) == name);
            named.insert(op);
        }
    }

    // Rows exist exactly for the named opcodes, and each is self-consistent.
    for (int op = 0; op < 256; ++op) {
        CAPTURE(op);
        const OpcodeInfo* info = opcode_info(static_cast<uint8_t>(op));
        REQUIRE((info != nullptr) == (named.count(op) == 1));
        if (info == nullptr) continue;
        CHECK(info->header_bytes == kBthBytes + extension_bytes(info->headers));
        CHECK(info->header_bytes <= kMaxHeaderBytes);
        if (op == 0x81) {
            // The RoCEv2 CNP belongs to no transport and no message.
            CHECK(info->flags == kCnp);
            continue;
        }
        const uint16_t place = info->flags & (kFirst | kMiddle | kLast | kOnly);
        CHECK((place == kFirst || place == kMiddle || place == kLast || place == kOnly));
        CHECK(((info->flags & kRequest) != 0) != ((info->flags & kResponse) != 0));
        const char* prefix[] = {"RC ", "UC ", "RD ", "UD ", "", "XRC "};
        REQUIRE((op >> 5) < 6);
        CHECK(std::string(info->name).rfind(prefix[op >> 5], 0) == 0);
        // XRC requests carry an XRCETH; nothing else does.
        CHECK(((info->headers & kHasXrceth) != 0) == ((op >> 5) == 5 && (info->flags & kRequest)));
    }

    // Spot checks of the semantics the engine relies on.
    const OpcodeInfo* write_first = opcode_info(0x06);
    CHECK(write_first->headers == (kHasReth | kHasPayload));
    CHECK(write_first->flags == (kFirst | kRequest | kWrite));
    const OpcodeInfo* read_req = opcode_info(0x0c);
    CHECK(read_req->headers == kHasReth);
    CHECK((read_req->flags & (kRequest | kRead)) == (kRequest | kRead));
    const OpcodeInfo* read_last = opcode_info(0x0f);
    CHECK(read_last->headers == (kHasAeth | kHasPayload));
    CHECK((read_last->flags & (kLast | kResponse | kRead)) == (kLast | kResponse | kRead));
    const OpcodeInfo* ack = opcode_info(0x11);
    CHECK(ack->headers == kHasAeth);
    CHECK((ack->flags & (kResponse | kAck)) == (kResponse | kAck));
    const OpcodeInfo* atomic_ack = opcode_info(0x12);
    CHECK(atomic_ack->headers == (kHasAeth | kHasAtomicAckEth));
    CHECK(atomic_ack->header_bytes == 24);
    CHECK(opcode_info(0x13)->header_bytes == 40);
    CHECK(opcode_info(0x0b)->headers == (kHasReth | kHasImm | kHasPayload));
    CHECK(opcode_info(0x17)->headers == (kHasIeth | kHasPayload));
    CHECK(opcode_info(0x65)->headers == (kHasDeth | kHasImm | kHasPayload));
    // XRC: the RC row plus an XRCETH on requests, straight after the BTH.
    CHECK(opcode_info(0xa6)->headers == (kHasXrceth | kHasReth | kHasPayload));
    CHECK(opcode_info(0xb3)->header_bytes == 44);
    CHECK(opcode_info(0xb1)->headers == kHasAeth);
    for (uint8_t op : {0x15, 0x18, 0x1f, 0x2c, 0x40, 0x55, 0x66, 0x80, 0xb5, 0xb8, 0xff}) {
        CAPTURE(static_cast<int>(op));
        CHECK(opcode_info(op) == nullptr);
    }
}

TEST_CASE("every captured packet parses", "[wire][parse][captures]") {
    const auto& packets = all_packets();
    // The captures the README describes, with their packet counts.
    const std::map<std::string, size_t> known = {
        {"rc_atomic_cas", 10}, {"rc_atomic_fadd", 10},  {"rc_read", 55},
        {"rc_send_10000", 66}, {"rc_send_64", 12},      {"rc_write", 55},
        {"rc_write_imm", 44},  {"rc_write_rdmacm", 86}, {"uc_send", 24},
        {"uc_write", 50},      {"ud_send", 6},
    };
    std::map<std::string, size_t> counts;
    for (const auto& p : packets) ++counts[p.capture];
    for (const auto& [name, n] : known) {
        CAPTURE(name);
        CHECK(counts[name] == n);
    }

    std::set<int> opcodes_seen;
    for (const CapturedPacket& cp : packets) {
        CAPTURE(cp.capture, cp.frame);
        ParsedPacket p;
        REQUIRE(parse_packet(cp.udp, p) == ParseError::None);
        check_consistent(cp.udp, p);
        opcodes_seen.insert(p.h.bth.opcode);
        // The kernel sends zero pad bytes.
        for (size_t i = 0; i < p.h.bth.pad; ++i) CHECK(p.payload.data()[p.payload.size() + i] == 0);
    }
    // The captures exercise every extension header type.
    CHECK(opcodes_seen == std::set<int>{0x00, 0x01, 0x02, 0x03, 0x04, 0x06, 0x07, 0x08, 0x09,
                                        0x0a, 0x0c, 0x0d, 0x0e, 0x0f, 0x11, 0x12, 0x13, 0x14,
                                        0x20, 0x21, 0x22, 0x26, 0x27, 0x28, 0x64});
}

TEST_CASE("captured fields decode to what tshark shows", "[wire][parse][captures]") {
    for (const Expected& e : kExpected) {
        CAPTURE(e.capture, e.frame);
        const CapturedPacket& cp = wiretest::find_packet(e.capture, e.frame);
        ParsedPacket p;
        REQUIRE(parse_packet(cp.udp, p) == ParseError::None);
        CHECK(describe(p) == e.fields);
    }

    // A few fields by name, as a reader would look them up in `tshark -V`.
    ParsedPacket p;
    REQUIRE(parse_packet(wiretest::find_packet("rc_atomic_cas", 1).udp, p) == ParseError::None);
    CHECK(p.h.bth.psn == 15411415);
    CHECK(p.h.bth.ack_req);
    CHECK(p.h.atomic.va == 0x0000557e44361000);
    CHECK(p.h.atomic.rkey == 0x22e);
    // tshark prints the ICRC bytes as one big-endian number: 0xdcaa2de8.
    CHECK(p.icrc == 0xe82daadc);

    REQUIRE(parse_packet(wiretest::find_packet("rc_atomic_cas", 2).udp, p) == ParseError::None);
    CHECK(p.h.aeth.type() == AckType::Ack);
    CHECK(p.h.aeth.value() == kAethInvalidCredits);
    CHECK(p.h.aeth.msn == 1);
    CHECK(p.h.atomic_ack == 6179901018291463664u);

    REQUIRE(parse_packet(wiretest::find_packet("rc_write_imm", 10).udp, p) == ParseError::None);
    CHECK(p.h.bth.opcode == static_cast<uint8_t>(Opcode::RcWriteLastImm));
    CHECK(p.h.imm == 0x1000);

    REQUIRE(parse_packet(wiretest::find_packet("ud_send", 1).udp, p) == ParseError::None);
    CHECK(p.h.deth.qkey == 0x11111111);
    CHECK(p.h.deth.src_qp == 0x11);
    CHECK(p.payload.size() == 1024);

    REQUIRE(parse_packet(wiretest::find_packet("rc_write_rdmacm", 1).udp, p) == ParseError::None);
    CHECK(p.h.bth.dest_qp == 1);  // CM MADs go to QP1
    CHECK(p.h.deth.qkey == 0x80010000);

    REQUIRE(parse_packet(wiretest::find_packet("rc_write_rdmacm", 16).udp, p) == ParseError::None);
    CHECK(p.h.bth.pad == 2);
    CHECK(p.payload.size() == 2);
}

TEST_CASE("build_headers reproduces every captured packet", "[wire][build][captures]") {
    for (const CapturedPacket& cp : all_packets()) {
        CAPTURE(cp.capture, cp.frame);
        ParsedPacket p;
        REQUIRE(parse_packet(cp.udp, p) == ParseError::None);

        std::array<uint8_t, kMaxHeaderBytes + 8> out;
        out.fill(0xa5);
        const size_t n = build_headers(p.h, out.data());
        REQUIRE(n == p.info->header_bytes);
        CHECK(std::equal(out.begin(), out.begin() + static_cast<long>(n), cp.udp.begin()));
        CHECK(std::all_of(out.begin() + static_cast<long>(n), out.end(),
                          [](uint8_t b) { return b == 0xa5; }));

        // Headers, payload and zero pad as separate pieces, plus our ICRC, give back the
        // whole UDP payload.
        const std::array<uint8_t, 3> zeros{};
        const std::span<const uint8_t> pieces[] = {
            std::span<const uint8_t>(out.data(), n), p.payload,
            std::span<const uint8_t>(zeros.data(), p.h.bth.pad)};
        const uint32_t crc = icrc(cp.flow, cp.unseen, pieces);
        std::vector<uint8_t> rebuilt(out.begin(), out.begin() + static_cast<long>(n));
        rebuilt.insert(rebuilt.end(), p.payload.begin(), p.payload.end());
        rebuilt.insert(rebuilt.end(), p.h.bth.pad, uint8_t{0});
        for (int i = 0; i < 4; ++i) rebuilt.push_back(static_cast<uint8_t>(crc >> (8 * i)));
        CHECK(rebuilt == cp.udp);
    }
}

TEST_CASE("every opcode round-trips through build_headers and parse_packet",
          "[wire][build][parse]") {
    std::mt19937_64 rng(4791);
    for (int op = 0; op < 256; ++op) {
        const OpcodeInfo* info = opcode_info(static_cast<uint8_t>(op));
        if (info == nullptr) continue;
        for (size_t len : {0u, 1u, 2u, 3u, 4u, 5u, 255u, 1024u}) {
            if (!(info->headers & kHasPayload) && len != 0) continue;
            CAPTURE(op, len);
            Headers h;
            h.bth.opcode = static_cast<uint8_t>(op);
            h.bth.solicited = rng() & 1;
            h.bth.migreq = rng() & 1;
            h.bth.pad = pad_for(len);
            h.bth.pkey = static_cast<uint16_t>(rng());
            h.bth.fecn = rng() & 1;
            h.bth.becn = rng() & 1;
            h.bth.dest_qp = static_cast<uint32_t>(rng()) & kQpnMask;
            h.bth.ack_req = rng() & 1;
            h.bth.psn = static_cast<uint32_t>(rng()) & kPsnMask;
            h.reth = {rng(), static_cast<uint32_t>(rng()), static_cast<uint32_t>(rng())};
            h.aeth = {static_cast<uint8_t>(rng()), static_cast<uint32_t>(rng()) & 0xffffff};
            h.imm = static_cast<uint32_t>(rng());
            h.ieth = static_cast<uint32_t>(rng());
            h.deth = {static_cast<uint32_t>(rng()), static_cast<uint32_t>(rng()) & kQpnMask};
            h.atomic = {rng(), static_cast<uint32_t>(rng()), rng(), rng()};
            h.atomic_ack = rng();
            h.xrc_srqn = static_cast<uint32_t>(rng()) & kQpnMask;

            std::vector<uint8_t> payload(len);
            for (auto& b : payload) b = static_cast<uint8_t>(rng());
            const std::vector<uint8_t> pkt = make_packet(h, payload);
            REQUIRE((pkt.size() & 3) == 0);

            ParsedPacket p;
            REQUIRE(parse_packet(pkt, p) == ParseError::None);
            check_consistent(pkt, p);
            CHECK(p.info == info);
            CHECK(std::equal(p.payload.begin(), p.payload.end(), payload.begin(), payload.end()));
            const Bth& b = p.h.bth;
            CHECK(b.opcode == h.bth.opcode);
            CHECK(b.solicited == h.bth.solicited);
            CHECK(b.migreq == h.bth.migreq);
            CHECK(b.pad == h.bth.pad);
            CHECK(b.pkey == h.bth.pkey);
            CHECK(b.fecn == h.bth.fecn);
            CHECK(b.becn == h.bth.becn);
            CHECK(b.dest_qp == h.bth.dest_qp);
            CHECK(b.ack_req == h.bth.ack_req);
            CHECK(b.psn == h.bth.psn);
            // Carried headers come back; the others stay at their defaults.
            const Headers none;
            const auto carried = [&](uint16_t bit) { return (info->headers & bit) != 0; };
            CHECK(p.h.reth.va == (carried(kHasReth) ? h.reth.va : none.reth.va));
            CHECK(p.h.reth.rkey == (carried(kHasReth) ? h.reth.rkey : none.reth.rkey));
            CHECK(p.h.reth.dma_len == (carried(kHasReth) ? h.reth.dma_len : none.reth.dma_len));
            CHECK(p.h.aeth.syndrome == (carried(kHasAeth) ? h.aeth.syndrome : none.aeth.syndrome));
            CHECK(p.h.aeth.msn == (carried(kHasAeth) ? h.aeth.msn : none.aeth.msn));
            CHECK(p.h.imm == (carried(kHasImm) ? h.imm : none.imm));
            CHECK(p.h.ieth == (carried(kHasIeth) ? h.ieth : none.ieth));
            CHECK(p.h.deth.qkey == (carried(kHasDeth) ? h.deth.qkey : none.deth.qkey));
            CHECK(p.h.deth.src_qp == (carried(kHasDeth) ? h.deth.src_qp : none.deth.src_qp));
            CHECK(p.h.atomic.va == (carried(kHasAtomicEth) ? h.atomic.va : none.atomic.va));
            CHECK(p.h.atomic.rkey == (carried(kHasAtomicEth) ? h.atomic.rkey : none.atomic.rkey));
            CHECK(p.h.atomic.swap_add ==
                  (carried(kHasAtomicEth) ? h.atomic.swap_add : none.atomic.swap_add));
            CHECK(p.h.atomic.compare ==
                  (carried(kHasAtomicEth) ? h.atomic.compare : none.atomic.compare));
            CHECK(p.h.atomic_ack == (carried(kHasAtomicAckEth) ? h.atomic_ack : none.atomic_ack));
            CHECK(p.h.xrc_srqn == (carried(kHasXrceth) ? h.xrc_srqn : none.xrc_srqn));
            // The XRCETH sits straight after the BTH: its reserved byte, then the SRQ number.
            if (carried(kHasXrceth)) {
                CHECK(pkt[kBthBytes] == 0);
                CHECK((uint32_t{pkt[kBthBytes + 1]} << 16 | uint32_t{pkt[kBthBytes + 2]} << 8 |
                       pkt[kBthBytes + 3]) == h.xrc_srqn);
            }

            // Our own packets verify exactly.
            CHECK(icrc_verify(IpFlow{IpAddress::v4(0x0a000001), IpAddress::v4(0x0a000002), 0xc000,
                                     kRoceV2Port},
                              pkt) == IcrcCheck::Exact);
        }
    }
}

TEST_CASE("build_headers masks fields to their wire widths", "[wire][build]") {
    Headers h = headers_for(Opcode::RcWriteOnly);
    h.bth.dest_qp = 0xff123456;
    h.bth.psn = 0xffabcdef;
    h.bth.pad = 0xff;   // only two bits on the wire
    h.bth.tver = 0xf0;  // only four bits on the wire
    std::array<uint8_t, kMaxHeaderBytes> out{};
    REQUIRE(build_headers(h, out.data()) == kBthBytes + kRethBytes);
    CHECK(out[1] == 0x70);  // MigReq (default) | pad 3 | TVer 0
    CHECK(out[4] == 0);
    CHECK((out[5] == 0x12 && out[6] == 0x34 && out[7] == 0x56));
    CHECK(out[8] == 0);
    CHECK((out[9] == 0xab && out[10] == 0xcd && out[11] == 0xef));

    Headers unknown;
    unknown.bth.opcode = 0x15;
    out.fill(0x5a);
    CHECK(build_headers(unknown, out.data()) == 0);
}

TEST_CASE("every ParseError is produced by some input", "[wire][parse][errors]") {
    std::map<ParseError, int> produced;
    const auto parse = [&](std::span<const uint8_t> buf) {
        ParsedPacket p;
        p.info = opcode_info(0);  // must be reset on error
        p.h.reth.rkey = 0x5eed;   // and whatever the caller left in it
        const ParseError e = parse_packet(buf, p);
        ++produced[e];
        if (e == ParseError::None) {
            check_consistent(buf, p);
        } else {
            // Nothing half-parsed is left: not the BTH read before the error was found.
            CHECK(p.info == nullptr);
            CHECK(p.payload.empty());
            CHECK(p.h.bth.opcode == 0);
            CHECK(p.h.bth.dest_qp == 0);
            CHECK(p.h.reth.rkey == 0);
        }
        return e;
    };

    const std::vector<uint8_t> payload(6, 0x42);
    const std::vector<uint8_t> send_only = make_packet(headers_for(Opcode::RcSendOnly, 2), payload);
    CHECK(parse(send_only) == ParseError::None);

    SECTION("too short for a BTH and an ICRC") {
        CHECK(parse({}) == ParseError::TooShort);
        CHECK(parse(std::span(send_only).first(kBthBytes + kIcrcBytes - 1)) ==
              ParseError::TooShort);
    }
    SECTION("too short for the opcode's extension headers") {
        std::vector<uint8_t> pkt = make_packet(headers_for(Opcode::RcWriteOnly), {});
        REQUIRE(pkt.size() == kBthBytes + kRethBytes + kIcrcBytes);
        CHECK(parse(pkt) == ParseError::None);
        pkt.erase(pkt.begin() + kBthBytes, pkt.begin() + kBthBytes + 1);
        CHECK(parse(pkt) == ParseError::TooShort);
        // Exactly BTH + ICRC with an opcode that needs more.
        pkt.resize(kBthBytes + kIcrcBytes);
        CHECK(parse(pkt) == ParseError::TooShort);
    }
    SECTION("unknown opcodes") {
        for (uint8_t op : {0x15, 0x18, 0x2c, 0x40, 0x80, 0xb5, 0xc0, 0xff}) {
            std::vector<uint8_t> pkt = send_only;
            pkt[0] = op;
            CAPTURE(static_cast<int>(op));
            CHECK(parse(pkt) == ParseError::UnknownOpcode);
        }
    }
    SECTION("transport header version other than 0") {
        for (uint8_t tver = 1; tver < 16; ++tver) {
            std::vector<uint8_t> pkt = send_only;
            pkt[1] = static_cast<uint8_t>((pkt[1] & 0xf0) | tver);
            CHECK(parse(pkt) == ParseError::BadVersion);
        }
    }
    SECTION("pad larger than what follows the headers") {
        Headers h = headers_for(Opcode::RcSendOnly, 3);
        std::vector<uint8_t> pkt = make_packet(h, {});  // 3 pad bytes, no payload
        CHECK(parse(pkt) == ParseError::None);
        pkt.erase(pkt.begin() + kBthBytes);  // now only 2 bytes for a pad of 3
        CHECK(parse(pkt) == ParseError::PadTooLarge);

        // An ACK with a pad count and nothing after the AETH.
        std::vector<uint8_t> ack = make_packet(headers_for(Opcode::RcAcknowledge), {});
        ack[1] |= 0x10;
        CHECK(parse(ack) == ParseError::PadTooLarge);
    }
    SECTION("payload on opcodes that carry none") {
        for (Opcode op : {Opcode::RcAcknowledge, Opcode::RcReadRequest, Opcode::RcAtomicAcknowledge,
                          Opcode::RcCompareSwap}) {
            CAPTURE(static_cast<int>(op));
            std::vector<uint8_t> pkt = make_packet(headers_for(op), {});
            CHECK(parse(pkt) == ParseError::None);
            pkt.insert(pkt.begin() + opcode_info(static_cast<uint8_t>(op))->header_bytes, 4, 0);
            CHECK(parse(pkt) == ParseError::PayloadNotAllowed);
        }
    }

    // Every value has a distinct name.
    std::set<std::string> names;
    for (ParseError e :
         {ParseError::None, ParseError::TooShort, ParseError::UnknownOpcode, ParseError::BadVersion,
          ParseError::PadTooLarge, ParseError::PayloadNotAllowed}) {
        REQUIRE(to_string(e) != nullptr);
        names.insert(to_string(e));
    }
    CHECK(names.size() == 6);
}

TEST_CASE("truncated and mangled packets never crash", "[wire][parse][errors]") {
    // One packet of each opcode the captures hold, plus the longest.
    std::map<int, const CapturedPacket*> samples;
    const CapturedPacket* longest = nullptr;
    for (const CapturedPacket& cp : all_packets()) {
        samples.emplace(cp.udp[0], &cp);
        if (longest == nullptr || cp.udp.size() > longest->udp.size()) longest = &cp;
    }
    samples.emplace(-1, longest);

    size_t parsed_ok = 0;
    for (const auto& [op, cp] : samples) {
        CAPTURE(cp->capture, cp->frame);
        for (size_t len = 0; len <= cp->udp.size(); ++len) {
            CAPTURE(len);
            // An exact-size copy, so the sanitizer build catches any read past the end.
            const std::vector<uint8_t> buf(cp->udp.begin(),
                                           cp->udp.begin() + static_cast<long>(len));
            ParsedPacket p;
            const ParseError e = parse_packet(buf, p);
            if (e == ParseError::None) {
                check_consistent(buf, p);
                ++parsed_ok;
            } else {
                CHECK((e == ParseError::TooShort || e == ParseError::PadTooLarge ||
                       e == ParseError::PayloadNotAllowed));
            }
        }
    }
    CHECK(parsed_ok > 0);  // truncating payload-carrying packets leaves valid shorter ones

    // Random bytes of random lengths.
    std::mt19937 rng(17);
    for (int i = 0; i < 20000; ++i) {
        std::vector<uint8_t> buf(rng() % 80);
        for (auto& b : buf) b = static_cast<uint8_t>(rng());
        if (!buf.empty() && (rng() & 1)) buf[0] = static_cast<uint8_t>(rng() % 0x18);
        if (buf.size() > 1 && (rng() & 1)) buf[1] &= 0xf0;
        ParsedPacket p;
        if (parse_packet(buf, p) == ParseError::None) check_consistent(buf, p);
    }
}
