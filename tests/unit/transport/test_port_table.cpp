// RDMA CM ports shared by the processes of a host (transport/cm/port_table.h): exclusive
// claims within a process and across processes, freed when the holder lets go or dies.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <filesystem>
#include <set>
#include <vector>

#include "transport/cm/port_table.h"

using uroce::transport::cm::PortClaim;
using uroce::transport::cm::PortTable;

namespace {

std::string table_path() {
    static int n = 0;
    auto dir = std::filesystem::temp_directory_path() /
               ("uroce-ports-" + std::to_string(::getpid()) + "-" + std::to_string(++n));
    std::filesystem::create_directories(dir);
    return (dir / "tcp").string();
}

}  // namespace

TEST_CASE("ports: a claimed port is exclusive until released", "[cm][ports]") {
    const PortTable table(table_path());
    int err = 0;
    auto a = table.claim(7471, err);
    REQUIRE(a);
    CHECK(a->port() == 7471);
    CHECK_FALSE(table.claim(7471, err));
    CHECK(err == EADDRINUSE);
    auto b = table.claim(7472, err);  // the neighbour is another port
    CHECK(b);
    a.reset();
    CHECK(table.claim(7471, err));
    CHECK_FALSE(table.claim(0, err));
    CHECK(err == EINVAL);
    CHECK(table.claim(65535, err));
}

TEST_CASE("ports: ephemeral ports are distinct and in range", "[cm][ports]") {
    const PortTable table(table_path());
    std::vector<std::unique_ptr<PortClaim>> held;
    std::set<uint16_t> ports;
    int err = 0;
    for (int i = 0; i < 200; ++i) {
        auto c = table.claim_ephemeral(err);
        REQUIRE(c);
        CHECK(c->port() >= PortTable::kEphemeralFirst);
        CHECK(c->port() <= PortTable::kEphemeralLast);
        ports.insert(c->port());
        held.push_back(std::move(c));
    }
    CHECK(ports.size() == 200);
    // A port taken explicitly is never handed out as an ephemeral one meanwhile.
    CHECK_FALSE(table.claim(*ports.begin(), err));
}

TEST_CASE("ports: a port held by another process, then freed by its death", "[cm][ports]") {
    const PortTable table(table_path());
    int to_parent[2];
    REQUIRE(::pipe(to_parent) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        int e = 0;
        auto c = table.claim(9000, e);
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
    CHECK_FALSE(table.claim(9000, err));
    CHECK(err == EADDRINUSE);
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    CHECK(table.claim(9000, err));
}
