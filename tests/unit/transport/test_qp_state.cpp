// The RC state table: which modify transitions the IBA allows.
#include <catch2/catch.hpp>
#include <set>
#include <string>
#include <utility>

#include "transport/qp_state.h"

using namespace uroce::transport;

namespace {

constexpr QpState kAll[] = {QpState::Reset, QpState::Init, QpState::Rtr, QpState::Rts,
                            QpState::Sqd,   QpState::Sqe,  QpState::Err};

}  // namespace

TEST_CASE("rc_transition_allowed, every pair", "[qp_state]") {
    using S = QpState;
    // IBA 10.3.1 as Linux applies it: any state to RESET, any but RESET to ERR, plus these.
    const std::set<std::pair<S, S>> allowed{
        {S::Reset, S::Init}, {S::Init, S::Init}, {S::Init, S::Rtr},
        {S::Rtr, S::Rts},    {S::Rts, S::Rts},   {S::Rts, S::Sqd},
        {S::Sqd, S::Sqd},    {S::Sqd, S::Rts},   {S::Sqe, S::Rts},
    };
    int checked = 0;
    for (S from : kAll) {
        for (S to : kAll) {
            const bool expected = to == S::Reset || (to == S::Err && from != S::Reset) ||
                                  allowed.count({from, to}) != 0;
            INFO(to_string(from) << " -> " << to_string(to));
            CHECK(rc_transition_allowed(from, to) == expected);
            ++checked;
        }
    }
    CHECK(checked == 49);
}

TEST_CASE("rc_transition_allowed, the usual paths", "[qp_state]") {
    using S = QpState;
    // Bring-up.
    CHECK(rc_transition_allowed(S::Reset, S::Init));
    CHECK(rc_transition_allowed(S::Init, S::Rtr));
    CHECK(rc_transition_allowed(S::Rtr, S::Rts));
    // No skipping ahead, no going back except to RESET.
    CHECK_FALSE(rc_transition_allowed(S::Reset, S::Rtr));
    CHECK_FALSE(rc_transition_allowed(S::Reset, S::Rts));
    CHECK_FALSE(rc_transition_allowed(S::Init, S::Rts));
    CHECK_FALSE(rc_transition_allowed(S::Rtr, S::Init));
    CHECK_FALSE(rc_transition_allowed(S::Rts, S::Rtr));
    CHECK_FALSE(rc_transition_allowed(S::Rts, S::Init));
    // RTR -> RTR is not a modify the IBA defines for RC.
    CHECK_FALSE(rc_transition_allowed(S::Rtr, S::Rtr));
    // ERR leaves only through RESET.
    CHECK(rc_transition_allowed(S::Err, S::Reset));
    CHECK(rc_transition_allowed(S::Err, S::Err));
    CHECK_FALSE(rc_transition_allowed(S::Err, S::Init));
    CHECK_FALSE(rc_transition_allowed(S::Err, S::Rts));
    // SQE recovers to RTS only.
    CHECK(rc_transition_allowed(S::Sqe, S::Rts));
    CHECK_FALSE(rc_transition_allowed(S::Sqe, S::Sqd));
    CHECK_FALSE(rc_transition_allowed(S::Sqe, S::Sqe));
    // Nothing enters SQE by a modify.
    for (S from : kAll) CHECK_FALSE(rc_transition_allowed(from, S::Sqe));
}

TEST_CASE("QpState names", "[qp_state]") {
    std::set<std::string> names;
    for (QpState s : kAll) names.insert(to_string(s));
    CHECK(names == std::set<std::string>{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"});
}
