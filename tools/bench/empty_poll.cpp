// uroce-empty-poll: what one poll of an empty CQ costs a busy-polling application.
//
// A busy poller (perftest, ibv_rc_pingpong, UCX) calls ibv_poll_cq in a loop, and nearly
// every call finds nothing: the engine then reads the device socket (Engine::on_cq_poll ->
// progress), which returns nothing. That read is the loop's period, so it bounds how soon a
// poller sees what arrives, and it is CPU time the engine thread and the peer do not get on
// a small machine. This program creates one engine on --ip (no traffic), calls
// on_cq_poll(true) --polls times in each of --rounds rounds and prints the median nanoseconds
// per poll, and the same for a bare recvmmsg of one empty socket (the floor: the system
// call alone). Both run on one thread; no root needed. A tool, not a test.

// g++ 12 at -O2 reports a false "potential null pointer dereference" in libstdc++'s
// std::string as inlined into CLI11, as in tools/uroce_main.cpp: silenced for this file.
#pragma GCC diagnostic ignored "-Wnull-dereference"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "transport/engine.h"
#include "transport/receive_batch.h"

using namespace uroce::transport;

namespace {

template <typename F>
double median_ns(unsigned rounds, unsigned polls, F&& poll) {
    std::vector<double> per;
    for (unsigned r = 0; r < rounds; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        for (unsigned i = 0; i < polls; ++i) poll();
        const auto t1 = std::chrono::steady_clock::now();
        per.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / polls);
    }
    std::sort(per.begin(), per.end());
    return per[per.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"uroce-empty-poll: nanoseconds per poll of an empty CQ"};
    std::string ip_text = "127.0.213.77";
    unsigned polls = 200000, rounds = 5;
    uint16_t port = 0;
    app.add_option("--ip", ip_text, "the engine's address (loopback by default)");
    app.add_option("--port", port, "its UDP port (0: a free one)");
    app.add_option("--polls", polls, "polls per round")->check(CLI::Range(1u, 100000000u));
    app.add_option("--rounds", rounds, "rounds (the median is printed)")
        ->check(CLI::Range(1u, 1000u));
    CLI11_PARSE(app, argc, argv);

    const auto ip = uroce::IpAddress::parse(ip_text);
    if (!ip) {
        std::fprintf(stderr, "uroce-empty-poll: not an IP address: %s\n", ip_text.c_str());
        return 2;
    }
    EngineConfig config;
    config.ip = *ip;
    config.port = port;
    std::string error;
    int err = 0;
    auto engine = Engine::create(config, error, err);
    if (!engine) {
        std::fprintf(stderr, "uroce-empty-poll: %s\n", error.c_str());
        return 1;
    }
    const double engine_ns = median_ns(rounds, polls, [&] { engine->on_cq_poll(true); });

    const int fd = ::socket(ip->family(), SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_storage sa{};
    const socklen_t len = ip->to_sockaddr(0, sa);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&sa), len) != 0) {
        std::fprintf(stderr, "uroce-empty-poll: cannot bind a plain socket\n");
        return 1;
    }
    ReceiveBatch batch(16, 4096);
    const double bare_ns = median_ns(rounds, polls, [&] { (void)batch.read(fd); });
    ::close(fd);
    std::printf("empty_poll_ns=%.1f bare_recvmmsg_ns=%.1f polls=%u rounds=%u\n", engine_ns, bare_ns,
                polls, rounds);
    return 0;
}
