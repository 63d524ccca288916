#include "transport/app_memory_guard.h"

#include <setjmp.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>

namespace uroce::transport {

namespace {

// The handlers that were there before ours ([0] SIGSEGV, [1] SIGBUS), in two generations: an
// install writes the one the handler does not read, then flips g_current.
struct Previous {
    struct sigaction of[2];
};
Previous g_previous[2];
std::atomic<int> g_current{0};
std::mutex g_install_mutex;

// Where a fault inside guarded_access() of this thread lands. Initial-exec: the handler must
// not be the first to touch a thread's TLS (the general model may allocate it there).
__attribute__((tls_model("initial-exec"))) thread_local sigjmp_buf* t_landing = nullptr;

void on_fault(int sig, siginfo_t* info, void* context) {
    // Only a fault (si_code > 0), not a signal someone sent, ends a guarded access.
    if (sigjmp_buf* landing = t_landing; landing && info && info->si_code > 0) {
        t_landing = nullptr;
        siglongjmp(*landing, 1);
    }
    const struct sigaction& prev =
        g_previous[g_current.load(std::memory_order_acquire)].of[sig == SIGBUS ? 1 : 0];
    if (prev.sa_flags & SA_SIGINFO) {
        prev.sa_sigaction(sig, info, context);
        return;
    }
    if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
        prev.sa_handler(sig);
        return;
    }
    // The default action: a real fault happens again when this returns; a signal someone
    // sent (si_code <= 0) is sent again, and is delivered as this handler returns.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
    if (info && info->si_code <= 0) raise(sig);
}

bool ours(const struct sigaction& sa) {
    return (sa.sa_flags & SA_SIGINFO) && sa.sa_sigaction == on_fault;
}

}  // namespace

bool install_app_memory_guard() noexcept {
    std::lock_guard lock(g_install_mutex);
    struct sigaction now[2];
    if (sigaction(SIGSEGV, nullptr, &now[0]) != 0 || sigaction(SIGBUS, nullptr, &now[1]) != 0)
        return false;
    if (ours(now[0]) && ours(now[1])) return true;
    // First time, or someone installed a handler since (a test framework's, per test case):
    // that one becomes the handler ours hands other faults to.
    const int next = 1 - g_current.load(std::memory_order_relaxed);
    for (int i = 0; i < 2; ++i)
        if (!ours(now[i]))
            g_previous[next].of[i] = now[i];
        else
            g_previous[next].of[i] = g_previous[1 - next].of[i];
    g_current.store(next, std::memory_order_release);
    struct sigaction sa {};
    sa.sa_sigaction = on_fault;
    // SA_ONSTACK: a thread of the application that overflows its stack still reaches the
    // handler it installed on an alternate stack, through ours.
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGSEGV, &sa, nullptr) == 0 && sigaction(SIGBUS, &sa, nullptr) == 0;
}

bool guarded_access(void (*fn)(void*), void* arg) noexcept {
    sigjmp_buf landing;
    // No signal mask saved (that is a system call per access): the landing unblocks what
    // the kernel blocked for the handler instead.
    if (sigsetjmp(landing, 0) != 0) {
        sigset_t blocked;
        sigemptyset(&blocked);
        sigaddset(&blocked, SIGSEGV);
        sigaddset(&blocked, SIGBUS);
        pthread_sigmask(SIG_UNBLOCK, &blocked, nullptr);
        return false;
    }
    t_landing = &landing;
    // The handler reads t_landing: the compiler keeps the accesses of fn between the stores.
    std::atomic_signal_fence(std::memory_order_seq_cst);
    fn(arg);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    t_landing = nullptr;
    return true;
}

bool guarded_copy(void* dst, const void* src, size_t n) noexcept {
    struct Copy {
        void* dst;
        const void* src;
        size_t n;
    } c{dst, src, n};
    return guarded_access(
        [](void* p) {
            const auto* what = static_cast<const Copy*>(p);
            std::memcpy(what->dst, what->src, what->n);
        },
        &c);
}

bool guarded_probe(const void* addr, size_t n) noexcept {
    if (n == 0) return true;
    struct Probe {
        const volatile uint8_t* first;
        size_t n;
    } probe{static_cast<const volatile uint8_t*>(addr), n};
    return guarded_access(
        [](void* p) {
            const auto* what = static_cast<const Probe*>(p);
            static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
            const uintptr_t begin = reinterpret_cast<uintptr_t>(what->first);
            const uintptr_t last = begin + what->n - 1;
            // One byte of each page the range touches.
            for (uintptr_t at = begin;; at = (at & ~(page - 1)) + page) {
                (void)*reinterpret_cast<const volatile uint8_t*>(at);
                if ((at & ~(page - 1)) == (last & ~(page - 1))) break;
            }
        },
        &probe);
}

}  // namespace uroce::transport
