#include "transport/qp_state.h"

namespace uroce::transport {

const char* to_string(QpState s) {
    switch (s) {
        case QpState::Reset:
            return "RESET";
        case QpState::Init:
            return "INIT";
        case QpState::Rtr:
            return "RTR";
        case QpState::Rts:
            return "RTS";
        case QpState::Sqd:
            return "SQD";
        case QpState::Sqe:
            return "SQE";
        case QpState::Err:
            return "ERR";
    }
    return "?";
}

bool rc_transition_allowed(QpState from, QpState to) {
    if (to == QpState::Reset) return true;
    if (to == QpState::Err) return from != QpState::Reset;  // a RESET QP has nothing to flush
    switch (from) {
        case QpState::Reset:
            return to == QpState::Init;
        case QpState::Init:
            return to == QpState::Init || to == QpState::Rtr;
        case QpState::Rtr:
            return to == QpState::Rts;
        case QpState::Rts:
            return to == QpState::Rts || to == QpState::Sqd;
        case QpState::Sqd:
            return to == QpState::Sqd || to == QpState::Rts;
        case QpState::Sqe:
            return to == QpState::Rts;
        case QpState::Err:
            return false;
    }
    return false;
}

}  // namespace uroce::transport
