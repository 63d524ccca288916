// Which packet of a GRO train the engine takes first (train_order.h): an ACK that closes a
// train of requests one of which completes a receive, nothing else.
#include <catch2/catch.hpp>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "transport/train_order.h"
#include "uroce/wire.h"

using namespace uroce;
using uroce::transport::closing_ack_at;

namespace {

constexpr size_t kStep = 32;

uint8_t op(wire::Opcode o) {
    return static_cast<uint8_t>(o);
}

// A train of packets of kStep bytes whose first bytes (the BTH's opcode) are `opcodes`; the
// last packet `last_bytes` long.
std::vector<uint8_t> train(std::initializer_list<uint8_t> opcodes, size_t last_bytes = 20) {
    std::vector<uint8_t> t;
    size_t n = 0;
    for (uint8_t o : opcodes) {
        const size_t bytes = ++n == opcodes.size() ? last_bytes : kStep;
        const size_t at = t.size();
        t.resize(at + bytes, 0xee);
        t[at] = o;
    }
    return t;
}

}  // namespace

TEST_CASE("train order: an ACK that closes a train of requests is taken first", "[train_order]") {
    const uint8_t ack = op(wire::Opcode::RcAcknowledge);
    CHECK(closing_ack_at(train({op(wire::Opcode::RcSendOnly), ack}), kStep) == kStep);
    CHECK(closing_ack_at(train({op(wire::Opcode::RcWriteFirst), op(wire::Opcode::RcWriteMiddle),
                                op(wire::Opcode::RcWriteLastImm), ack}),
                         kStep) == 3 * kStep);
    CHECK(closing_ack_at(train({op(wire::Opcode::RcWriteOnlyImm), ack}), kStep) == kStep);
    CHECK(closing_ack_at(train({op(wire::Opcode::RcSendOnlyImm), ack}), kStep) == kStep);
    CHECK(closing_ack_at(train({op(wire::Opcode::RcSendOnlyInv), ack}), kStep) == kStep);
    // The rest of a SEND whose last packet completes; and requests that complete nothing
    // beside one that does.
    CHECK(closing_ack_at(train({op(wire::Opcode::RcSendMiddle), op(wire::Opcode::RcSendLast), ack}),
                         kStep) == 2 * kStep);
    CHECK(closing_ack_at(
              train({op(wire::Opcode::RcReadRequest), op(wire::Opcode::RcSendOnly), ack}), kStep) ==
          2 * kStep);
    // XRC's ACK after XRC requests.
    CHECK(closing_ack_at(
              train({static_cast<uint8_t>(wire::kXrcOpcodeBase | op(wire::Opcode::RcSendOnly)),
                     static_cast<uint8_t>(wire::kXrcOpcodeBase | ack)}),
              kStep) == kStep);
    // Requests of other QPs of the peer (GRO merges a flow's datagrams, and a device's QPs
    // may share the flow): theirs are other PSN spaces still.
    CHECK(closing_ack_at(train({0x24 /* UC SEND Only */, ack}), kStep) == kStep);
    CHECK(closing_ack_at(train({0x64 /* UD SEND Only */, ack}), kStep) == kStep);
    // The last packet as long as the others.
    CHECK(closing_ack_at(train({op(wire::Opcode::RcSendOnly), ack}, kStep), kStep) == kStep);
}

TEST_CASE("train order: anything else is taken in wire order", "[train_order]") {
    const uint8_t ack = op(wire::Opcode::RcAcknowledge);
    // One packet, or an ACK that closes nothing.
    CHECK(closing_ack_at(train({ack}), kStep) == 0);
    CHECK(closing_ack_at(train({op(wire::Opcode::RcSendOnly)}), kStep) == 0);
    // The last packet is not an ACK.
    CHECK(closing_ack_at(train({op(wire::Opcode::RcSendOnly), op(wire::Opcode::RcSendOnly)}),
                         kStep) == 0);
    CHECK(
        closing_ack_at(train({op(wire::Opcode::RcSendOnly), op(wire::Opcode::RcAtomicAcknowledge)}),
                       kStep) == 0);
    // A response before the ACK: its data is acknowledged by the ACK too.
    CHECK(closing_ack_at(train({op(wire::Opcode::RcReadResponseOnly), ack}), kStep) == 0);
    CHECK(closing_ack_at(
              train({op(wire::Opcode::RcSendOnly), op(wire::Opcode::RcReadResponseLast), ack}),
              kStep) == 0);
    CHECK(closing_ack_at(train({ack, ack}), kStep) == 0);
    // Requests that complete nothing at the receiver: a WRITE's data is in memory before the
    // ACK's completion (ib_write_lat then watches that memory).
    CHECK(closing_ack_at(train({op(wire::Opcode::RcWriteOnly), ack}), kStep) == 0);
    CHECK(closing_ack_at(train({op(wire::Opcode::RcWriteFirst), op(wire::Opcode::RcWriteMiddle),
                                op(wire::Opcode::RcWriteLast), ack}),
                         kStep) == 0);
    CHECK(closing_ack_at(train({op(wire::Opcode::RcReadRequest), ack}), kStep) == 0);
    CHECK(closing_ack_at(
              train({op(wire::Opcode::RcSendFirst), op(wire::Opcode::RcSendMiddle), ack}), kStep) ==
          0);
    CHECK(closing_ack_at(train({op(wire::Opcode::RcFetchAdd), ack}), kStep) == 0);
    // An opcode uroce does not know is no request.
    CHECK(closing_ack_at(train({0x18 /* reserved */, ack}), kStep) == 0);
    // No segment size (not a train), or a datagram no longer than one segment.
    CHECK(closing_ack_at(train({op(wire::Opcode::RcSendOnly), ack}), 0) == 0);
    CHECK(closing_ack_at(train({op(wire::Opcode::RcSendOnly)}, kStep), kStep) == 0);
}
