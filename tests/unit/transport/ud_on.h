// UD QPs for the unit tests: a QP in RTS on one side of a Pair, a SEND WQE, and the check of
// the IPv4 header in a GRH area.
#pragma once

#include <catch2/catch.hpp>
#include <memory>

#include "tests/unit/transport/engine_pair.h"
#include "transport/ud_qp.h"

namespace uroce::transport::test {

inline constexpr uint32_t kQkey = 0x11111111;

// A UD QP on side `s` (beside its RC QP), detached again when the holder goes.
struct UdOn {
    Side& side;
    std::shared_ptr<UdQp> qp;
    UdOn(Side& s, uint32_t qkey = kQkey, std::shared_ptr<SharedReceiveQueue> srq = nullptr,
         uint32_t mtu = kMtu)
        : side(s) {
        qp = std::make_shared<UdQp>(*s.engine, s.engine->allocate_qpn(), kPd,
                                    QpCaps{64, 64, kMaxSge, kMaxSge, kMaxInlineData}, s.scq, s.rcq,
                                    &s, std::move(srq));
        s.engine->attach(qp);
        UdAttributes a;
        a.qkey = qkey;
        a.mtu = mtu;
        REQUIRE(qp->modify(a, QpState::Reset, QpState::Init) == 0);
        REQUIRE(qp->modify(a, QpState::Init, QpState::Rtr) == 0);
        REQUIRE(qp->modify(a, QpState::Rtr, QpState::Rts) == 0);
    }
    ~UdOn() { side.engine->detach(qp->qpn()); }
    UdDestination to(const UdOn& other, uint32_t qkey = kQkey) const {
        return UdDestination{other.side.ip, other.qp->qpn(), qkey};
    }
};

inline SendWqe ud_send(uint64_t wr_id, Side& s, size_t offset, uint32_t len) {
    return send_wqe(wr_id, {s.sge(offset, len)});
}

// The one's-complement sum of an IPv4 header: 0xffff when its checksum is right.
inline uint16_t ipv4_checksum(const uint8_t* h) {
    uint32_t sum = 0;
    for (int i = 0; i < 20; i += 2) sum += (uint32_t{h[i]} << 8) | h[i + 1];
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    return static_cast<uint16_t>(sum);
}

}  // namespace uroce::transport::test
