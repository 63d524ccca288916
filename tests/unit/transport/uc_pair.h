// A connected pair of UC QPs on a Pair's engines (engine_pair.h), for the UC tests and the
// send-failure tests that need an unreliable QP.
#pragma once

#include <catch2/catch.hpp>
#include <memory>
#include <tuple>

#include "tests/unit/transport/engine_pair.h"
#include "transport/uc_qp.h"

namespace uroce::transport::test {

// A connected pair of UC QPs on the pair's engines, detached again when the holder goes.
struct UcPair {
    Pair& p;
    std::shared_ptr<UcQp> a, b;
    explicit UcPair(Pair& pair) : p(pair) {
        const QpCaps caps{64, 64, kMaxSge, kMaxSge, kMaxInlineData};
        a = std::make_shared<UcQp>(*p.a.engine, p.a.engine->allocate_qpn(), kPd, caps, p.a.scq,
                                   p.a.rcq, &p.a);
        b = std::make_shared<UcQp>(*p.b.engine, p.b.engine->allocate_qpn(), kPd, caps, p.b.scq,
                                   p.b.rcq, &p.b);
        p.a.engine->attach(a);
        p.b.engine->attach(b);
        for (auto [qp, peer_ip, peer_qpn] :
             {std::tuple{a.get(), p.b.ip, b->qpn()}, std::tuple{b.get(), p.a.ip, a->qpn()}}) {
            QpAttributes at = default_attributes();
            at.dst_ip = peer_ip;
            at.dest_qpn = peer_qpn;
            REQUIRE(qp->modify(at, QpState::Reset, QpState::Init) == 0);
            REQUIRE(qp->modify(at, QpState::Init, QpState::Rtr) == 0);
            REQUIRE(qp->modify(at, QpState::Rtr, QpState::Rts) == 0);
        }
    }
    ~UcPair() {
        p.a.engine->detach(a->qpn());
        p.b.engine->detach(b->qpn());
    }
};

}  // namespace uroce::transport::test
