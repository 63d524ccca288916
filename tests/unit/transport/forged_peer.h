// Plays the remote end of a QP by hand, with no second engine and no socket: a test builds
// RoCEv2 packets (correct ICRC, any headers it likes) and hands them to the engine's receive
// path, and records every packet the engine sends (optionally losing chosen ones).
//
// This is how the unit tests act as a misbehaving or hostile peer: responses for PSNs never
// sent, out-of-order opcodes, wrong lengths, forged keys, spoofed sources.
#pragma once

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <vector>

#include "tests/unit/transport/engine_pair.h"
#include "transport/engine.h"
#include "transport/rc_qp.h"
#include "uroce/icrc.h"
#include "uroce/wire.h"

namespace uroce::transport::test {

// A whole RoCEv2 UDP payload (BTH .. ICRC) for headers `h` and `payload`, as a sender at
// flow.src_ip:flow.src_port would put it on the wire. The pad is computed here unless
// `pad_override` is given (for malformed-packet tests).
inline std::vector<uint8_t> forge_packet(const wire::Headers& h, std::span<const uint8_t> payload,
                                         const wire::IpFlow& flow,
                                         const wire::Ipv4Unseen& unseen = {},
                                         int pad_override = -1) {
    wire::Headers out = h;
    out.bth.pad =
        pad_override >= 0 ? static_cast<uint8_t>(pad_override) : wire::pad_for(payload.size());
    std::vector<uint8_t> pkt(wire::kMaxHeaderBytes);
    const size_t hlen = wire::build_headers(out, pkt.data());
    REQUIRE(hlen > 0);
    pkt.resize(hlen);
    pkt.insert(pkt.end(), payload.begin(), payload.end());
    pkt.insert(pkt.end(), out.bth.pad, 0);
    const uint32_t crc = wire::icrc(flow, unseen, std::span<const uint8_t>(pkt));
    for (int i = 0; i < 4; ++i) pkt.push_back(static_cast<uint8_t>(crc >> (8 * i)));
    return pkt;
}

// One packet an engine sent.
struct SentPacket {
    std::vector<uint8_t> bytes;
    IpAddress dst_ip;
    std::chrono::steady_clock::time_point when{};
    bool lost = false;

    // Parsed view; valid while this SentPacket lives.
    wire::ParsedPacket parsed() const {
        wire::ParsedPacket p;
        REQUIRE(wire::parse_packet(bytes, p) == wire::ParseError::None);
        return p;
    }
    uint8_t opcode() const { return parsed().h.bth.opcode; }
    uint32_t psn() const { return parsed().h.bth.psn; }
};

// Records what an engine sends from now until it is destroyed. `lose` decides, per packet,
// whether it is lost (not sent); it is still recorded, with `lost` set.
class TxRecorder {
  public:
    using LosePredicate = std::function<bool(const wire::ParsedPacket&)>;

    explicit TxRecorder(Engine& engine, LosePredicate lose = {}, bool send_for_real = true)
        : engine_(engine), lose_(std::move(lose)), send_(send_for_real) {
        engine_.set_transmit_filter([this](std::span<const uint8_t> bytes, const IpAddress& dst) {
            SentPacket s{{bytes.begin(), bytes.end()}, dst, std::chrono::steady_clock::now()};
            wire::ParsedPacket p;
            const bool parsed = wire::parse_packet(s.bytes, p) == wire::ParseError::None;
            const bool lost = parsed && lose_ && lose_(p);
            s.lost = lost;
            std::lock_guard lock(mutex_);
            sent_.push_back(std::move(s));
            if (lost) ++lost_;
            return send_ && !lost;
        });
    }
    ~TxRecorder() { engine_.set_transmit_filter({}); }
    TxRecorder(const TxRecorder&) = delete;
    TxRecorder& operator=(const TxRecorder&) = delete;

    std::vector<SentPacket> packets() const {
        std::lock_guard lock(mutex_);
        return sent_;
    }
    size_t count(const std::function<bool(const wire::ParsedPacket&)>& pred) const {
        size_t n = 0;
        for (const SentPacket& s : packets())
            if (pred(s.parsed())) ++n;
        return n;
    }
    // The packets with opcode `op`, in the order they were sent.
    std::vector<SentPacket> with_opcode(wire::Opcode op) const {
        std::vector<SentPacket> out;
        for (SentPacket& s : packets())
            if (s.opcode() == static_cast<uint8_t>(op)) out.push_back(std::move(s));
        return out;
    }
    size_t count_opcode(wire::Opcode op) const {
        return count([op](const wire::ParsedPacket& p) {
            return p.h.bth.opcode == static_cast<uint8_t>(op);
        });
    }
    size_t lost() const {
        std::lock_guard lock(mutex_);
        return lost_;
    }
    // How many packets went (or were lost), without copying them.
    size_t size() const {
        std::lock_guard lock(mutex_);
        return sent_.size();
    }
    void clear() {
        std::lock_guard lock(mutex_);
        sent_.clear();
        lost_ = 0;
    }

  private:
    Engine& engine_;
    LosePredicate lose_;
    bool send_;
    mutable std::mutex mutex_;
    std::vector<SentPacket> sent_;
    size_t lost_ = 0;
};

// A remote QP played by the test: it "lives" at `ip`:`port` with QP number `qpn` and talks
// to `local` (a QP of `engine`). inject() forges a packet from it to the local QP.
struct ForgedPeer {
    Engine& engine;
    IpAddress ip;
    uint16_t port;
    uint32_t qpn;
    uint32_t local_qpn;

    wire::Headers headers(wire::Opcode op, uint32_t psn) const {
        wire::Headers h;
        h.bth.opcode = static_cast<uint8_t>(op);
        h.bth.dest_qp = local_qpn;
        h.bth.psn = psn & wire::kPsnMask;
        return h;
    }
    wire::Headers ack(uint32_t psn, wire::AckType type = wire::AckType::Ack, uint8_t value = 0x1f,
                      uint32_t msn = 0) const {
        wire::Headers h = headers(wire::Opcode::RcAcknowledge, psn);
        h.aeth.syndrome = wire::Aeth::make(type, value);
        h.aeth.msn = msn;
        return h;
    }
    std::vector<uint8_t> forge(const wire::Headers& h,
                               std::span<const uint8_t> payload = {}) const {
        return forge_packet(h, payload,
                            wire::IpFlow{ip, engine.config().ip, port, engine.config().port});
    }
    void inject(const wire::Headers& h, std::span<const uint8_t> payload = {}) const {
        const auto pkt = forge(h, payload);
        engine.receive_datagram(pkt, ip, port);
    }
};

}  // namespace uroce::transport::test
