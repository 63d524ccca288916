// A network namespace for IPv6 tests: lo up with two addresses of a unique-local prefix.
//
// Loopback has only ::1, and two engines need two addresses (they share the RoCEv2 port), so
// the calling thread (and the threads it starts from now on, such as engine threads) moves
// into a namespace of its own where lo also holds fd00:7572::1 and fd00:7572::2 (nodad: usable
// at once). The destructor moves the thread back; the namespace goes with its last socket.
// Needs root (CAP_SYS_ADMIN); a test without it fails, saying so.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "tests/unit/transport/engine_pair.h"
#include "uroce/ip_address.h"

namespace uroce::transport::test {

class Ipv6Namespace {
  public:
    static IpAddress a() { return *IpAddress::parse("fd00:7572::1"); }
    static IpAddress b() { return *IpAddress::parse("fd00:7572::2"); }
    static Addresses addresses() { return Addresses{a(), b(), next_addresses().port}; }

    Ipv6Namespace() : original_(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC)) {
        REQUIRE(original_ >= 0);
        const int r = ::unshare(CLONE_NEWNET);
        INFO("unshare(CLONE_NEWNET): " << std::strerror(errno) << " (needs root)");
        REQUIRE(r == 0);
        // system()'s child runs in this thread's namespace.
        REQUIRE(std::system("ip link set lo up && "
                            "ip -6 addr add fd00:7572::1/128 dev lo nodad && "
                            "ip -6 addr add fd00:7572::2/128 dev lo nodad") == 0);
    }
    ~Ipv6Namespace() {
        if (original_ < 0) return;
        ::setns(original_, CLONE_NEWNET);
        ::close(original_);
    }
    Ipv6Namespace(const Ipv6Namespace&) = delete;
    Ipv6Namespace& operator=(const Ipv6Namespace&) = delete;

  private:
    int original_;
};

}  // namespace uroce::transport::test
