// Queue pair states (IBA 10.3.1) and which state changes a modify may ask for.
#pragma once

#include <cstdint>

namespace uroce::transport {

enum class QpState : uint8_t { Reset, Init, Rtr, Rts, Sqd, Sqe, Err };

const char* to_string(QpState s);

// True if the IBA allows a modify from `from` to `to` (Linux's table, for every QP type): any
// state may move to Reset, any but Reset to Err; the rest follow Reset -> Init -> Rtr -> Rts
// <-> Sqd, Sqe -> Rts.
bool rc_transition_allowed(QpState from, QpState to);

}  // namespace uroce::transport
