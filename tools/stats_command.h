// `uroce stats [NAME] [--qp QPN] [--json] [--watch [SECONDS] [--count N]]`: the counters of
// every device of the registry (or of NAME), and of every QP ever created on it, as counted by
// every context in every process (stats_report.h); once, or again every SECONDS until
// interrupted, with what each counter grew since the report before.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace CLI {
class App;
}

namespace uroce::tools {

struct StatsOptions {
    std::string name;             // empty: every device
    std::optional<uint32_t> qpn;  // one QP of `name` instead
    bool json = false;
    std::optional<double> watch;    // seconds between reports
    std::optional<uint64_t> count;  // reports before stopping (with `watch`)
};

// Adds the `stats` subcommand to `app`, filling `options` when parsed.
CLI::App* add_stats_command(CLI::App& app, StatsOptions& options);

// Runs it: 0, or throws registry::Error (an unknown device, an unreadable counters file).
// A closed stdout, SIGINT or SIGTERM end a watch quietly with 0.
int run_stats(const StatsOptions& options);

}  // namespace uroce::tools
