// The guard around the engine's accesses to application memory (app_memory_guard.h): a fault
// inside a guarded access ends that access only; any other fault still reaches the handler
// that was there before, or the default action.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <cstring>
#include <thread>
#include <vector>

#include "transport/app_memory_guard.h"

using namespace uroce::transport;

namespace {

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

// Two pages, the second unmapped again: [first, first + kPage) is memory, the page after is
// not (and nothing else maps there while the test runs: it stays reserved PROT_NONE).
struct HalfMapped {
    uint8_t* first = nullptr;
    HalfMapped() {
        void* p =
            mmap(nullptr, 2 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        REQUIRE(p != MAP_FAILED);
        first = static_cast<uint8_t*>(p);
        REQUIRE(mprotect(first + kPage, kPage, PROT_NONE) == 0);
    }
    ~HalfMapped() { munmap(first, 2 * kPage); }
    uint8_t* gone() const { return first + kPage; }
};

// Runs `body` in a child process; returns its wait status.
template <class F>
int in_child(F body) {
    const pid_t pid = fork();
    if (pid == 0) {
        body();
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

void touch(volatile uint8_t* p) {
    *p = 1;
}

// Where a child is: its SIGSEGV handler exits with 40 + this, so the exit status tells which
// fault reached it.
volatile sig_atomic_t g_stage = 0;
void exit_with_stage(int) {
    _exit(40 + g_stage);
}

}  // namespace

TEST_CASE("A guarded copy into a page that is gone fails; the next ones work", "[app_memory]") {
    REQUIRE(install_app_memory_guard());
    HalfMapped m;
    std::vector<uint8_t> src(2 * kPage, 0x5a);
    REQUIRE(guarded_copy(m.first, src.data(), kPage));
    CHECK(m.first[0] == 0x5a);
    CHECK(m.first[kPage - 1] == 0x5a);
    // Running into the second page: cut short, the process goes on.
    std::memset(m.first, 0, kPage);
    CHECK_FALSE(guarded_copy(m.first + kPage / 2, src.data(), kPage));
    // Again: the landing unblocked SIGSEGV (still blocked, this fault would kill the test).
    CHECK_FALSE(guarded_copy(m.gone(), src.data(), 16));
    CHECK_FALSE(guarded_copy(src.data(), m.gone(), 16));
    CHECK(guarded_copy(m.first, src.data() + 1, 64));
    CHECK(m.first[63] == 0x5a);
    CHECK(guarded_probe(m.first, kPage));
    CHECK_FALSE(guarded_probe(m.first + kPage - 1, 2));
    CHECK_FALSE(guarded_probe(m.gone() + 100, 1));
    CHECK(guarded_probe(m.gone(), 0));
}

TEST_CASE("A guarded copy from a file page past the file's end fails (SIGBUS)", "[app_memory]") {
    REQUIRE(install_app_memory_guard());
    FILE* f = tmpfile();
    REQUIRE(f);
    REQUIRE(ftruncate(fileno(f), static_cast<off_t>(kPage)) == 0);
    void* p = mmap(nullptr, 2 * kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fileno(f), 0);
    REQUIRE(p != MAP_FAILED);
    auto* bytes = static_cast<uint8_t*>(p);
    uint8_t buf[64] = {1, 2, 3};
    CHECK(guarded_copy(bytes, buf, sizeof buf));
    CHECK(bytes[2] == 3);
    CHECK_FALSE(guarded_copy(bytes + kPage, buf, sizeof buf));
    CHECK_FALSE(guarded_probe(bytes + kPage, 1));
    munmap(p, 2 * kPage);
    fclose(f);
}

TEST_CASE("Guarded accesses land on the thread that faulted", "[app_memory]") {
    REQUIRE(install_app_memory_guard());
    HalfMapped m;
    std::vector<int> failed(4, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            uint8_t src[32] = {};
            for (int i = 0; i < 200; ++i) {
                failed[t] += guarded_copy(m.gone() + 64 * t, src, sizeof src) ? 0 : 1;
                failed[t] += guarded_copy(m.first + 64 * t, src, sizeof src) ? 0 : 100000;
            }
        });
    for (auto& t : threads) t.join();
    for (int f : failed) CHECK(f == 200);
}

TEST_CASE("A fault outside a guarded access reaches the handler installed before", "[app_memory]") {
    // Default action: the child dies of SIGSEGV, as without the guard.
    int status = in_child([] {
        signal(SIGSEGV, SIG_DFL);
        if (!install_app_memory_guard()) _exit(3);
        HalfMapped m;
        touch(m.gone());
        _exit(4);
    });
    CHECK(WIFSIGNALED(status));
    if (WIFSIGNALED(status)) CHECK(WTERMSIG(status) == SIGSEGV);

    // The application's own handler, installed first, still gets its faults.
    status = in_child([] {
        // An SA_SIGINFO handler, as most are (the next child has a plain one).
        struct sigaction sa {};
        sa.sa_sigaction = [](int, siginfo_t*, void*) { _exit(40 + g_stage); };
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGSEGV, &sa, nullptr) != 0) _exit(7);
        if (!install_app_memory_guard()) _exit(3);
        HalfMapped m;
        uint8_t b[8] = {};
        g_stage = 1;
        if (guarded_copy(m.gone(), b, sizeof b)) _exit(5);  // the guard's own: landed
        g_stage = 2;
        touch(m.gone());
        _exit(4);
    });
    CHECK(WIFEXITED(status));
    if (WIFEXITED(status)) CHECK(WEXITSTATUS(status) == 42);

    // A handler installed after the guard replaces it; the next install puts the guard back
    // in front of it, and it still gets the faults that are not the guard's.
    status = in_child([] {
        signal(SIGSEGV, SIG_DFL);
        if (!install_app_memory_guard()) _exit(3);
        signal(SIGSEGV, exit_with_stage);
        if (!install_app_memory_guard()) _exit(6);
        HalfMapped m;
        uint8_t b[8] = {};
        g_stage = 1;
        if (guarded_copy(m.gone(), b, sizeof b)) _exit(5);
        g_stage = 3;
        touch(m.gone());
        _exit(4);
    });
    CHECK(WIFEXITED(status));
    if (WIFEXITED(status)) CHECK(WEXITSTATUS(status) == 43);
}

TEST_CASE("A SIGSEGV someone sends is not taken for a fault of a guarded access", "[app_memory]") {
    const int status = in_child([] {
        signal(SIGSEGV, exit_with_stage);
        g_stage = 4;
        if (!install_app_memory_guard()) _exit(3);
        // Sent from inside a guarded access: not a fault of it, so not landed there.
        if (!guarded_access([](void*) { raise(SIGSEGV); }, nullptr)) _exit(5);
        _exit(4);
    });
    CHECK(WIFEXITED(status));
    if (WIFEXITED(status)) CHECK(WEXITSTATUS(status) == 44);
}
