// See stats_command.h.

// g++ 12 at -O2 reports a false "potential null pointer dereference" inside libstdc++'s
// std::string as inlined into CLI11's detail::split() (as in uroce_main.cpp).
#pragma GCC diagnostic ignored "-Wnull-dereference"

#include "stats_command.h"

#include <poll.h>
#include <unistd.h>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <ctime>
#include <limits>
#include <vector>

#include "registry.h"
#include "stats_report.h"

namespace fs = std::filesystem;
namespace reg = uroce::registry;

namespace uroce::tools {
namespace {

constexpr double kMinInterval = 0.01;     // seconds: below that a report never finishes
constexpr double kMaxInterval = 86400.0;  // a day

volatile sig_atomic_t g_stop = 0;

void on_stop_signal(int) {
    g_stop = 1;
}

struct Snapshot {
    std::vector<DeviceReport> devices;
    QpReport qp;  // with StatsOptions::qpn
};

fs::path counters_file(const reg::Registry& r, const std::string& name) {
    return r.sysfs_path() / "class" / "infiniband" / name / "uroce" / "counters";
}

Snapshot take(const StatsOptions& o) {
    reg::Registry r(reg::root_from_env());
    std::vector<std::string> names;
    for (const auto& d : r.list()) {
        if (o.name.empty() || d.config.name == o.name) names.push_back(d.config.name);
    }
    std::sort(names.begin(), names.end());
    if (!o.name.empty() && names.empty())
        throw reg::Error(reg::Error::Kind::Failure, fmt::format("no device '{}'", o.name));
    Snapshot s;
    std::string why;
    if (o.qpn) {
        if (!read_qp_report(o.name, counters_file(r, o.name), *o.qpn, s.qp, why))
            throw reg::Error(reg::Error::Kind::Failure, why);
        return s;
    }
    for (const auto& name : names) {
        DeviceReport d;
        if (!read_device_report(name, counters_file(r, name), true, d, why))
            throw reg::Error(reg::Error::Kind::Failure, why);
        s.devices.push_back(std::move(d));
    }
    return s;
}

const DeviceReport* same_device(const Snapshot* before, const std::string& name) {
    if (!before) return nullptr;
    for (const auto& d : before->devices) {
        if (d.name == name) return &d;
    }
    return nullptr;
}

std::string render(const StatsOptions& o, const Snapshot& now, const Snapshot* before) {
    if (o.qpn)
        return o.json ? qp_json(o.name, now.qp) + "\n"
                      : qp_text(now.qp, before ? &before->qp : nullptr);
    if (!o.name.empty()) {
        const DeviceReport& d = now.devices.front();
        return o.json ? device_json(d) + "\n" : device_text(d, same_device(before, d.name));
    }
    std::string out;
    if (o.json) {
        out = "{\"devices\":[";
        for (size_t i = 0; i < now.devices.size(); ++i)
            out += (i ? "," : "") + device_json(now.devices[i]);
        return out + "]}\n";
    }
    for (size_t i = 0; i < now.devices.size(); ++i) {
        const DeviceReport& d = now.devices[i];
        out += (i ? "\ndevice " : "device ") + d.name + "\n";
        out += device_text(d, same_device(before, d.name));
    }
    return out;
}

// Writes all of `text` to stdout; false if the reader has gone (EPIPE). Other errors throw.
bool write_out(const std::string& text) {
    size_t done = 0;
    while (done < text.size()) {
        const ssize_t n = ::write(STDOUT_FILENO, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EPIPE) return false;
        if (n < 0)
            throw reg::Error(reg::Error::Kind::Failure,
                             fmt::format("cannot write: {}", std::strerror(errno)));
        done += static_cast<size_t>(n);
    }
    return true;
}

// Sleeps until `deadline` or a stop signal; SIGINT and SIGTERM are blocked outside this
// wait, so one that comes while a report is read or printed ends the next wait at once.
void wait_until(std::chrono::steady_clock::time_point deadline, const sigset_t& unblocked) {
    while (!g_stop) {
        const auto left = deadline - std::chrono::steady_clock::now();
        if (left <= std::chrono::nanoseconds(0)) return;
        const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
        const timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
        ::ppoll(nullptr, 0, &ts, &unblocked);
    }
}

std::string header(size_t report, std::chrono::steady_clock::duration since_previous, bool first) {
    const auto now = std::chrono::system_clock::now();
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch());
    std::string h = fmt::format("# report {} at {:%Y-%m-%d %H:%M:%S}.{:03d}", report,
                                fmt::gmtime(std::chrono::system_clock::to_time_t(now)),
                                static_cast<int>(ms.count() % 1000));
    if (!first)
        h += fmt::format(", growth (+N) over {:.3f} s",
                         std::chrono::duration<double>(since_previous).count());
    return h + "\n";
}

CLI::Validator interval_validator() {
    return CLI::Validator(
        [](std::string& value) -> std::string {
            double v = 0;
            try {
                size_t used = 0;
                v = std::stod(value, &used);
                if (used != value.size()) v = std::numeric_limits<double>::quiet_NaN();
            } catch (const std::exception&) {
                v = std::numeric_limits<double>::quiet_NaN();
            }
            if (!(v >= kMinInterval && v <= kMaxInterval))
                return fmt::format("'{}' is not an interval; use seconds from {} to {}", value,
                                   kMinInterval, kMaxInterval);
            return {};
        },
        "SECONDS", "interval");
}

}  // namespace

CLI::App* add_stats_command(CLI::App& app, StatsOptions& o) {
    auto* stats = app.add_subcommand(
        "stats",
        "Print the counters of every device (or NAME), all contexts in all processes, and of "
        "every QP ever created on it");
    auto* name =
        stats->add_option("NAME", o.name, "Device name (default: every device of the registry)")
            ->check(CLI::Validator([](std::string& value) { return reg::check_name(value); },
                                   "NAME", "device name"));
    stats
        ->add_option("--qp", o.qpn,
                     "One QP's counters instead (QPN, decimal or 0x hex); a destroyed QP's "
                     "last figures until its number is used again")
        ->option_text("QPN")
        ->needs(name);
    stats->add_flag("--json", o.json,
                    "One JSON document per report: {\"device\":..,\"counters\":{..},\"qps\":[..]}, "
                    "{\"devices\":[..]} without NAME");
    auto* watch = stats
                      ->add_option("--watch", o.watch,
                                   "Report again every SECONDS (default 1, fractions allowed) "
                                   "until interrupted, with each counter's growth")
                      ->expected(0, 1)
                      ->default_str("1")
                      ->option_text("[SECONDS]")
                      ->check(interval_validator());
    stats->add_option("--count", o.count, "Stop after N reports (1 to 10^9)")
        ->option_text("N")
        ->needs(watch)
        ->check(CLI::Range(uint64_t{1}, uint64_t{1000000000}));
    stats->footer(
        "Text: the device's counters as NAME VALUE lines, then one line per QP,\n"
        "'qp 0xQPN NAME=VALUE ...'; without NAME each device starts with 'device NAME'.\n"
        "With --watch each report starts with a '# report N' line and every value is followed\n"
        "by its growth since the report before (+N); on a terminal the screen is cleared first.");
    return stats;
}

int run_stats(const StatsOptions& o) {
    // A reader that goes away (`uroce stats --watch | head`) ends the command quietly.
    std::signal(SIGPIPE, SIG_IGN);
    if (!o.watch) {
        const Snapshot s = take(o);
        for (const auto& d : s.devices)
            for (const auto& w : d.warnings) fmt::print(stderr, "uroce stats: warning: {}\n", w);
        write_out(render(o, s, nullptr));
        return 0;
    }
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, nullptr);  // no SA_RESTART: the wait below returns at once
    ::sigaction(SIGTERM, &sa, nullptr);
    sigset_t stop_signals, unblocked;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    ::sigprocmask(SIG_BLOCK, &stop_signals, &unblocked);
    sigdelset(&unblocked, SIGINT);
    sigdelset(&unblocked, SIGTERM);

    const bool clear = !o.json && ::isatty(STDOUT_FILENO);
    const auto interval = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(*o.watch));
    std::optional<Snapshot> before;
    auto taken_before = std::chrono::steady_clock::now();
    auto next = taken_before;
    for (uint64_t report = 1; !g_stop && (!o.count || report <= *o.count); ++report) {
        if (report > 1) wait_until(next, unblocked);
        if (g_stop) break;
        const auto taken = std::chrono::steady_clock::now();
        Snapshot now = take(o);
        if (report == 1) {
            for (const auto& d : now.devices)
                for (const auto& w : d.warnings)
                    fmt::print(stderr, "uroce stats: warning: {}\n", w);
        }
        std::string text = clear ? "\033[H\033[2J" : "";
        if (!o.json) text += header(report, taken - taken_before, report == 1);
        text += render(o, now, before ? &*before : nullptr);
        if (!o.json && !clear) text += "\n";  // reports apart in a log
        if (!write_out(text)) break;
        before = std::move(now);
        taken_before = taken;
        // The next report one interval after this one, or now if this one took longer.
        next = std::max(next + interval, std::chrono::steady_clock::now());
    }
    return 0;
}

}  // namespace uroce::tools
