// Small helpers shared by the comp_channel tests: bounded waiting and signal handlers.
#pragma once

#include <signal.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace uroce::test {

// Polls `done` every millisecond until it returns true or `limit` passes.
template <typename Predicate>
bool wait_until(Predicate done, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done()) {
        if (std::chrono::steady_clock::now() >= deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
}

inline std::atomic<int> g_signals_seen{0};
inline void count_signal(int) {
    g_signals_seen.fetch_add(1);
}

// Installs count_signal for `signo` (with or without SA_RESTART) for the scope's lifetime.
class ScopedHandler {
  public:
    ScopedHandler(int signo, bool restart) : signo_(signo) {
        struct sigaction action {};
        action.sa_handler = count_signal;
        sigemptyset(&action.sa_mask);
        action.sa_flags = restart ? SA_RESTART : 0;
        sigaction(signo_, &action, &previous_);
    }
    ~ScopedHandler() { sigaction(signo_, &previous_, nullptr); }
    ScopedHandler(const ScopedHandler&) = delete;
    ScopedHandler& operator=(const ScopedHandler&) = delete;

  private:
    int signo_;
    struct sigaction previous_ {};
};

}  // namespace uroce::test
