// RDMA CM ports shared by the processes of a host (transport/cm/port_table.h): exclusive
// claims within a process and across processes, per address as the kernel's, freed when the
// holder lets go or dies.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <filesystem>
#include <set>
#include <vector>

#include "tests/unit/transport/scratch_dir.h"
#include "transport/cm/port_table.h"

using uroce::transport::cm::PortClaim;
using uroce::transport::cm::PortTable;

namespace {

std::string table_path() {
    return (uroce::transport::test::scratch_dir("uroce-ports") / "tcp").string();
}

}  // namespace

TEST_CASE("ports: a claimed port is exclusive until released", "[cm][ports]") {
    const PortTable table(table_path());
    int err = 0;
    auto a = table.claim(0, 7471, err);
    REQUIRE(a);
    CHECK(a->port() == 7471);
    CHECK_FALSE(table.claim(0, 7471, err));
    CHECK(err == EADDRINUSE);
    auto b = table.claim(0, 7472, err);  // the neighbour is another port
    CHECK(b);
    a.reset();
    CHECK(table.claim(0, 7471, err));
    CHECK_FALSE(table.claim(0, 0, err));
    CHECK(err == EINVAL);
    CHECK(table.claim(0, 65535, err));
}

TEST_CASE("ports: ephemeral ports are distinct and in range", "[cm][ports]") {
    const PortTable table(table_path());
    std::vector<std::unique_ptr<PortClaim>> held;
    std::set<uint16_t> ports;
    int err = 0;
    for (int i = 0; i < 200; ++i) {
        auto c = table.claim_ephemeral(0, err);
        REQUIRE(c);
        CHECK(c->port() >= PortTable::kEphemeralFirst);
        CHECK(c->port() <= PortTable::kEphemeralLast);
        ports.insert(c->port());
        held.push_back(std::move(c));
    }
    CHECK(ports.size() == 200);
    // A port taken explicitly is never handed out as an ephemeral one meanwhile.
    CHECK_FALSE(table.claim(0, *ports.begin(), err));
}

TEST_CASE("ports: a port held by another process, then freed by its death", "[cm][ports]") {
    const PortTable table(table_path());
    int to_parent[2];
    REQUIRE(::pipe(to_parent) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        int e = 0;
        auto c = table.claim(0, 9000, e);
        const char ok = c ? 1 : 0;
        if (::write(to_parent[1], &ok, 1) != 1) ::_exit(1);
        ::pause();
        ::_exit(0);
    }
    struct Reaper {
        pid_t pid;
        ~Reaper() {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, nullptr, 0);
        }
    } reaper{pid};
    char ok = 0;
    REQUIRE(::read(to_parent[0], &ok, 1) == 1);
    REQUIRE(ok == 1);
    int err = 0;
    CHECK_FALSE(table.claim(0, 9000, err));
    CHECK(err == EADDRINUSE);
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    CHECK(table.claim(0, 9000, err));
}

TEST_CASE("ports: one port on two addresses, but not on an address and on any", "[cm][ports]") {
    const PortTable table(table_path());
    constexpr uint32_t kA = 0x7f005c01, kB = 0x7f005c02;  // 127.0.92.1, 127.0.92.2
    int err = 0;
    auto a = table.claim(kA, 7471, err);
    REQUIRE(a);
    auto b = table.claim(kB, 7471, err);  // another address: free
    REQUIRE(b);
    CHECK_FALSE(table.claim(kA, 7471, err));  // the same address: taken
    CHECK(err == EADDRINUSE);
    CHECK_FALSE(table.claim(0, 7471, err));  // any address: overlaps both
    CHECK(err == EADDRINUSE);
    a.reset();
    b.reset();
    auto any = table.claim(0, 7471, err);
    REQUIRE(any);
    CHECK_FALSE(table.claim(kA, 7471, err));  // held on every address
    CHECK(err == EADDRINUSE);
    any.reset();
    CHECK(table.claim(kA, 7471, err));
    // Ephemeral ports for an address skip what that address holds.
    auto e = table.claim_ephemeral(kA, err);
    REQUIRE(e);
    CHECK_FALSE(table.claim(kA, e->port(), err));
    CHECK(table.claim(kB, e->port(), err));
}
