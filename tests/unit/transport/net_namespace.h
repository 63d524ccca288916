// Network namespaces of a test's own, for engines that need addresses loopback lacks.
//
// NetNamespace moves the calling thread (and the threads it starts from now on, such as engine
// threads) into a new network namespace and runs `setup` there (an `ip` command line: the
// child of system() runs in this thread's namespace). The destructor moves the thread back;
// the namespace goes with its last socket. Needs root (CAP_SYS_ADMIN); a test without it
// fails, saying so.
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

class NetNamespace {
  public:
    explicit NetNamespace(const char* setup)
        : original_(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC)) {
        REQUIRE(original_ >= 0);
        const int r = ::unshare(CLONE_NEWNET);
        INFO("unshare(CLONE_NEWNET): " << std::strerror(errno) << " (needs root)");
        REQUIRE(r == 0);
        INFO("namespace setup: " << setup);
        REQUIRE(std::system(setup) == 0);
    }
    ~NetNamespace() {
        if (original_ < 0) return;
        ::setns(original_, CLONE_NEWNET);
        ::close(original_);
    }
    NetNamespace(const NetNamespace&) = delete;
    NetNamespace& operator=(const NetNamespace&) = delete;

  private:
    int original_;
};

// lo up with two unique-local IPv6 addresses (nodad: usable at once), fd00:7572::1 and ::2:
// two engines need two addresses (they share the RoCEv2 port), and loopback has only ::1.
class Ipv6Namespace : public NetNamespace {
  public:
    static IpAddress a() { return *IpAddress::parse("fd00:7572::1"); }
    static IpAddress b() { return *IpAddress::parse("fd00:7572::2"); }
    static Addresses addresses() { return Addresses{a(), b(), next_addresses().port}; }

    Ipv6Namespace()
        : NetNamespace(
              "ip link set lo up && "
              "ip -6 addr add fd00:7572::1/128 dev lo nodad && "
              "ip -6 addr add fd00:7572::2/128 dev lo nodad") {}
};

// A veth pair, va (10.9.0.1) and vb (10.9.0.2), and lo. Both ends are local addresses of one
// namespace: vb must accept packets from a local source (accept_local).
class VethNamespace : public NetNamespace {
  public:
    static constexpr IpAddress kA = IpAddress::v4(0x0a090001), kB = IpAddress::v4(0x0a090002);

    VethNamespace()
        : NetNamespace(
              "ip link set lo up && ip link add va type veth peer name vb && "
              "ip addr add 10.9.0.1/24 dev va && ip addr add 10.9.0.2/24 dev vb && "
              "ip link set va up && ip link set vb up && "
              "sysctl -qw net.ipv4.conf.all.rp_filter=0 "
              "net.ipv4.conf.vb.rp_filter=0 net.ipv4.conf.vb.accept_local=1") {}
};

}  // namespace uroce::transport::test
