// Registers three devices with the real `uroce` command in a private registry before any
// test runs, points libibverbs at it, and removes them afterwards.

// GCC 12 with -fsanitize=address at -O2 warns of a maybe-uninitialized std::function inside
// libstdc++'s <regex>, which Catch's implementation instantiates here. Catch and libstdc++ are
// system headers already, but this middle-end warning ignores that for inlined code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define CATCH_CONFIG_RUNNER
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/integration/verbs_fixture.h"

namespace uroce::test {

namespace {
TestDevices g_devices;
}

const TestDevices& devices() {
    return g_devices;
}

}  // namespace uroce::test

int main(int argc, char** argv) {
    using namespace uroce::test;
    // Exit 77 is meson's "skipped"; the "skip - " line is what tools/test.sh reports (and
    // refuses in CI, see tests/allowed-skips.txt).
    if (::geteuid() != 0) {
        std::printf(
            "skip - integration tests: need root (uroce add makes /dev/infiniband nodes)\n");
        return 77;
    }
    char root_template[] = "/tmp/uroce-it-XXXXXX";
    if (!::mkdtemp(root_template)) return 2;
    ::setenv("UROCE_ROOT", root_template, 1);
    // Addresses in 127/8 that other test programs do not use, and names unique per process.
    const std::string tag = std::to_string(::getpid());
    const int octet = 100 + static_cast<int>(::getpid() % 100);
    g_devices.a = "it" + tag + "a";
    g_devices.b = "it" + tag + "b";
    g_devices.c = "it" + tag + "c";
    g_devices.ip_a = "127.1." + std::to_string(octet) + ".1";
    g_devices.ip_b = "127.1." + std::to_string(octet) + ".2";
    g_devices.ip_c = "127.1." + std::to_string(octet) + ".3";
    std::string out;
    for (auto [name, ip] : {std::pair{g_devices.a, g_devices.ip_a},
                            {g_devices.b, g_devices.ip_b},
                            {g_devices.c, g_devices.ip_c}}) {
        if (run_uroce({"add", name, "--ip", ip, "--mtu", "4096"}, &out) != 0) {
            std::fprintf(stderr, "uroce add failed: %s\n", out.c_str());
            return 2;
        }
    }
    if (run_uroce({"env"}, &out) != 0) {
        std::fprintf(stderr, "uroce env failed: %s\n", out.c_str());
        return 2;
    }
    // "export NAME='value'" lines.
    size_t pos = 0;
    while ((pos = out.find("export ", pos)) != std::string::npos) {
        const size_t eq = out.find('=', pos);
        const size_t q1 = out.find('\'', eq);
        const size_t q2 = out.find('\'', q1 + 1);
        ::setenv(out.substr(pos + 7, eq - pos - 7).c_str(), out.substr(q1 + 1, q2 - q1 - 1).c_str(),
                 1);
        pos = q2;
    }
    const int result = Catch::Session().run(argc, argv);
    for (const auto& name : {g_devices.a, g_devices.b, g_devices.c}) run_uroce({"del", name});
    ::rmdir(root_template);
    std::string rm = std::string("rm -rf '") + root_template + "'";
    [[maybe_unused]] int r = std::system(rm.c_str());
    return result;
}
