// See scenario.h.
#include "tests/integration/scenario.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

namespace uroce::test {

pid_t spawn(const std::function<int()>& body) {
    const pid_t pid = ::fork();
    if (pid == 0) {
        int status = 100;
        try {
            status = body();
        } catch (...) {
        }
        ::_exit(status);
    }
    return pid;
}

int wait_child(pid_t pid, std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    int status = 0;
    while (std::chrono::steady_clock::now() < end) {
        if (::waitpid(pid, &status, WNOHANG) == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    return -1;
}

int expect(bool ok, const char* what) {
    if (!ok) std::fprintf(stderr, "scenario: failed: %s\n", what);
    return ok ? 0 : 1;
}

bool scenario_passes(const std::function<int()>& scenario, std::chrono::milliseconds limit) {
    const int status = wait_child(spawn(scenario), limit);
    if (status == -1)
        std::fprintf(stderr, "scenario: killed after %lld ms\n",
                     static_cast<long long>(limit.count()));
    else if (status != 0)
        std::fprintf(stderr, "scenario: exit status %d\n", status);
    return status == 0;
}

}  // namespace uroce::test
