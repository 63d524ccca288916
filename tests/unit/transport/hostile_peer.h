// A hostile requester for responder tests: the test plays the requester by hand (ForgedPeer)
// and reads back, decoded, what the responder under test sent (TxRecorder).
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/forged_peer.h"

namespace uroce::transport::test {

// What the responder sent, decoded.
struct Sent {
    uint8_t opcode;
    uint32_t psn;
    uint8_t syndrome;
    uint32_t msn;
    std::vector<uint8_t> payload;
    uint64_t atomic_ack;  // AtomicAckETH (Atomic Acknowledge only)
    bool is(wire::Opcode op) const { return opcode == static_cast<uint8_t>(op); }
    bool is_read_response() const { return opcode >= 0x0d && opcode <= 0x10; }
    bool is_nak(wire::NakCode code) const {
        return is(wire::Opcode::RcAcknowledge) &&
               syndrome == wire::Aeth::make(wire::AckType::Nak, static_cast<uint8_t>(code));
    }
    bool is_plain_ack() const {
        return is(wire::Opcode::RcAcknowledge) &&
               wire::Aeth{syndrome, 0}.type() == wire::AckType::Ack;
    }
};

inline std::vector<Sent> sent(const TxRecorder& rec) {
    std::vector<Sent> out;
    for (const SentPacket& s : rec.packets()) {
        const wire::ParsedPacket p = s.parsed();
        out.push_back(Sent{p.h.bth.opcode,
                           p.h.bth.psn,
                           p.h.aeth.syndrome,
                           p.h.aeth.msn,
                           {p.payload.begin(), p.payload.end()},
                           p.h.atomic_ack});
    }
    return out;
}

inline size_t read_responses(const TxRecorder& rec) {
    size_t n = 0;
    for (const Sent& s : sent(rec))
        if (s.is_read_response()) ++n;
    return n;
}

inline size_t naks(const TxRecorder& rec, wire::NakCode code, uint32_t psn) {
    size_t n = 0;
    for (const Sent& s : sent(rec))
        if (s.is_nak(code) && s.psn == psn) ++n;
    return n;
}

// A hostile-peer setup: a's QP is the responder under test; b is silent and the test speaks
// for it. What a sends is recorded, not sent.
struct Hostile {
    explicit Hostile(QpAttributes a_attrs = default_attributes(), const PairOptions& options = {})
        : p(options) {
        p.connect(a_attrs, default_attributes());
        fill(p.a.at(0), p.a.mem.size(), 1);
    }
    Pair p;
    TxRecorder b_out{*p.b.engine, {}, false};
    TxRecorder a_out{*p.a.engine, {}, false};
    ForgedPeer peer{*p.a.engine, p.b.ip, p.a.engine->config().port, p.b.qp->qpn(), p.a.qp->qpn()};

    wire::Headers read(uint32_t psn, uint64_t offset, uint32_t len) const {
        wire::Headers h = peer.headers(wire::Opcode::RcReadRequest, psn);
        h.bth.ack_req = true;
        h.reth = {p.a.iova + offset, p.a.keys.rkey, len};
        return h;
    }
    wire::Headers write(wire::Opcode op, uint32_t psn, uint64_t offset, uint32_t len,
                        bool ack_req = true) const {
        wire::Headers h = peer.headers(op, psn);
        h.bth.ack_req = ack_req;
        h.reth = {p.a.iova + offset, p.a.keys.rkey, len};
        return h;
    }
    // The responder refused with `code` at `psn`, went to ERR and said so with `event`.
    void check_refused(wire::NakCode code, uint32_t psn, AsyncEventType event) {
        CHECK(naks(a_out, code, psn) == 1);
        CHECK(p.a.qp->state() == QpState::Err);
        CHECK(has_event(p.a, event));
    }
};

inline std::vector<uint8_t> bytes(size_t n, uint64_t seed) {
    std::vector<uint8_t> v(n);
    fill(v.data(), n, seed);
    return v;
}

}  // namespace uroce::transport::test
