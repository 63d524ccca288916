// RoCEv2 congestion notification (IBA Annex A17.9.3), both ends of it (docs/congestion.md).
//
// A switch whose queue grows marks the packets passing through it Congestion Experienced
// (the ECN field of their IP header) instead of dropping them. The receiving QP, the
// notification point, tells the sending QP with a CNP: a BTH of opcode 0x81 naming that QP,
// with BECN set, and 16 reserved bytes. The sending QP, the reaction point, slows down.
//
// uroce's notification point: an RC or UC QP that takes a CE-marked packet from its peer
// sends the peer's QP a CNP, at most one per kCnpInterval (a NIC's DCQCN default paces
// them too: one per QP per few tens of microseconds is all a reaction point needs). Its
// reaction point: an RC QP that takes a CNP from its peer halves its send window, once per
// flight, as a loss does (send_window.h); the window grows back as ACKs come. UC has no
// window: its CNPs are counted only.
//
// Both ends need UROCE_ECN=on (EngineConfig::ecn_capable): packets then leave ECT(0), as a
// NIC's with DCQCN do, and the ECN field of what arrives is read. Off (the default), uroce
// neither marks nor reads the field, as the kernel's rxe. UROCE_FAULTS' `ce` marks packets CE
// on their way out, as a switch would, or (dir=rx) takes them as having arrived marked.
#pragma once

#include <chrono>
#include <cstdint>

#include "uroce/wire.h"

namespace uroce::transport {

// The ECN field's values (RFC 3168): ECN-capable transport (0), Congestion Experienced.
inline constexpr uint8_t kEcnEct0 = 2;
inline constexpr uint8_t kEcnCe = 3;

// When a QP may send its next CNP. Plain state of one QP, guarded by its mutex.
class CnpPacer {
  public:
    using Clock = std::chrono::steady_clock;
    static constexpr std::chrono::microseconds kCnpInterval{50};

    // True if a CNP may leave at `now`; the next one may then leave kCnpInterval later.
    bool take(Clock::time_point now) {
        if (now < next_) return false;
        next_ = now + kCnpInterval;
        return true;
    }

  private:
    Clock::time_point next_ = Clock::time_point::min();  // the first is never held back
};

// The headers of a CNP to `dest_qp` (its 16 reserved bytes are the payload, zeros).
inline wire::Headers cnp_headers(uint32_t dest_qp) {
    wire::Headers h;
    h.bth.opcode = static_cast<uint8_t>(wire::Opcode::Cnp);
    h.bth.migreq = false;
    h.bth.becn = true;
    h.bth.dest_qp = dest_qp & wire::kQpnMask;
    h.bth.psn = 0;
    return h;
}

}  // namespace uroce::transport
