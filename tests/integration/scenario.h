// Test scenarios in processes of their own.
//
// Some tests check behaviour whose failure leaves the process unusable: a use-after-free that
// hangs on a freed lock, an engine thread that can no longer be stopped, a child of fork()
// that never returns. Run there, the failure would hang the whole test binary until meson's
// timeout. Run with scenario_passes(), it ends as a failed check when its time limit kills it.
// Inside a scenario there is no Catch2: expect() prints one stderr line per failed expectation and
// counts it; the scenario returns the count, which becomes its exit status.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>

namespace uroce::test {

// Runs `body` in a child process; its return value is the child's exit status (an exception
// counts as 100). The child never returns into the test runner.
pid_t spawn(const std::function<int()>& body);

// The child's exit status, or -1 if it did not end within `limit` (it is then killed).
int wait_child(pid_t pid, std::chrono::milliseconds limit = std::chrono::seconds(20));

// 0 if `ok`; otherwise 1, after a stderr line naming `what`.
int expect(bool ok, const char* what);

// Runs `scenario` in a process of its own; true if it ended within `limit` and returned 0
// (otherwise a stderr line says how it ended).
bool scenario_passes(const std::function<int()>& scenario,
                     std::chrono::milliseconds limit = std::chrono::seconds(90));

}  // namespace uroce::test
