// `uroce`: manages uroce devices and runs verbs programs against them.
//
//   uroce add NAME --ip ADDR [--mtu N] [--port P]   register a device
//   uroce del NAME                                  remove it
//   uroce list                                      one line per device
//   uroce env                                       export lines for SYSFS_PATH / RDMAV_DRIVERS
//                                                   / LD_PRELOAD
//   uroce stats [NAME] [--qp QPN] [--json]          the devices' counters (all processes)
//               [--watch [SECONDS] [--count N]]     and their QPs', or one QP's (stats_command.h)
//   uroce run -- CMD ARGS...                        exec CMD with that environment, RDMA
//                                                   netlink refused (netlink_filter.h)
//
// A user other than root has a registry of their own (registry.h) whose devices have no
// /dev node, since only root may make one: `uroce run` then execs CMD in a private user
// and mount namespace holding the nodes (rootless_namespace.h, private_dev.h).
//
// Exit status: 0 success, 2 usage error, 1 any other error (`run`: the
// command's own status, or 127/126 if it cannot be executed, like env(1)).

// g++ 12 at -O2 reports a false "potential null pointer dereference" inside
// libstdc++'s std::string as inlined into CLI11's detail::split(); the warning
// is about library code, so it is silenced for this file only.
#pragma GCC diagnostic ignored "-Wnull-dereference"

#include <unistd.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "kernel_rdma.h"
#include "netlink_filter.h"
#include "private_dev.h"
#include "registry.h"
#include "rootless_namespace.h"
#include "stats_command.h"
#include "uroce_tools_config.h"

namespace fs = std::filesystem;
namespace reg = uroce::registry;
using uroce::IpAddress;
namespace tools = uroce::tools;

namespace {

constexpr const char* kProviderFile = "liburoce" UROCE_PROVIDER_SUFFIX;
// libibverbs appends UROCE_PROVIDER_SUFFIX ("-rdmav34.so") to an RDMAV_DRIVERS entry that contains
// '/'.
constexpr const char* kProviderStem = "liburoce";

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

void print_error(const std::string& who, const std::string& msg) {
    std::fflush(stdout);
    fmt::print(stderr, "{}: error: {}\n", who, msg);
}

void print_warnings(const std::string& who, const std::vector<std::string>& warnings) {
    for (const auto& w : warnings) fmt::print(stderr, "{}: warning: {}\n", who, w);
}

// Single-quotes `s` for POSIX sh.
std::string shell_quote(const std::string& s) {
    std::string out = "'";
    for (char c : s) {
        if (c == '\'') {
            out += "'\\''";
        } else {
            out += c;
        }
    }
    out += '\'';
    return out;
}

struct ProviderLookup {
    std::optional<fs::path> dir;
    std::vector<fs::path> tried;
    bool from_env = false;
};

bool has_provider(const fs::path& dir) {
    std::error_code ec;
    return fs::is_regular_file(dir / kProviderFile, ec);
}

// Where a file of ours may be: `build_rel` from this executable's directory (a Meson build
// tree), the install directory `install_dir` relative to the executable (a relocated
// install), then `install_dir` itself.
std::vector<fs::path> near_executable(const fs::path& build_rel, const char* install_dir) {
    std::vector<fs::path> candidates;
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) {
        const fs::path exe_dir = exe.parent_path();
        candidates.push_back((exe_dir / build_rel).lexically_normal());
        const fs::path rel =
            fs::path(install_dir).lexically_relative(fs::path(UROCE_INSTALL_BINDIR));
        if (!rel.empty()) candidates.push_back((exe_dir / rel).lexically_normal());
    }
    candidates.push_back(fs::path(install_dir).lexically_normal());
    return candidates;
}

// Records every distinct candidate in r.tried and the first one `found` accepts in r.dir.
template <class Found>
void pick_first(ProviderLookup& r, const std::vector<fs::path>& candidates, Found found) {
    for (const auto& c : candidates) {
        if (std::find(r.tried.begin(), r.tried.end(), c) != r.tried.end()) continue;
        r.tried.push_back(c);
        if (!r.dir && found(c)) r.dir = c;
    }
}

// UROCE_PROVIDER_DIR if set; otherwise next to this executable (Meson build
// tree <build>/tools/uroce -> <build>/provider, installed <prefix>/bin/uroce ->
// <prefix>/<libdir>/libibverbs), then the configured install directory.
ProviderLookup find_provider() {
    ProviderLookup r;
    const char* env = std::getenv("UROCE_PROVIDER_DIR");
    if (env != nullptr && *env != '\0') {
        r.from_env = true;
        fs::path dir = fs::absolute(env).lexically_normal();
        r.tried.push_back(dir);
        if (has_provider(dir)) r.dir = dir;
        return r;
    }
    // Meson build tree: <build>/tools/uroce -> <build>/provider.
    pick_first(r, near_executable("../provider", UROCE_INSTALL_PROVIDER_DIR), has_provider);
    return r;
}

// The preload library for `uroce env` users (no_rdma_netlink_preload.c): next
// to this executable (Meson build tree <build>/tools), in the install's libdir
// relative to the executable, then at the absolute install libdir.
ProviderLookup find_preload() {
    ProviderLookup r;
    pick_first(r, near_executable(".", UROCE_INSTALL_LIBDIR), [](const fs::path& dir) {
        std::error_code ec;
        return fs::is_regular_file(dir / UROCE_PRELOAD_FILE, ec);
    });
    return r;
}

// LD_PRELOAD with the preload library first and the entries of `current` (an
// inherited LD_PRELOAD, separated by spaces or colons) after it, without
// repeating it: evaluating `uroce env` twice changes nothing.
std::string ld_preload_value(const std::string& library, const char* current) {
    std::string out = library;
    const std::string cur = current != nullptr ? current : "";
    size_t pos = 0;
    while (pos < cur.size()) {
        size_t end = cur.find_first_of(" :", pos);
        if (end == std::string::npos) end = cur.size();
        const std::string entry = cur.substr(pos, end - pos);
        if (!entry.empty() && entry != library) out += " " + entry;
        pos = end + 1;
    }
    return out;
}

void warn_kernel_rdma(const std::string& who) {
    const std::string advice = tools::kernel_rdma_advice(tools::probe_kernel_rdma());
    if (!advice.empty()) print_warnings(who, {advice});
}

struct Environment {
    std::string sysfs_path;
    std::string rdmav_drivers;
    // Every registered device, and those without a node the caller can open (users other
    // than root only; root is warned instead).
    std::vector<std::string> devices;
    std::vector<std::string> nodeless;
};

bool is_root() {
    return ::geteuid() == 0;
}

// What `add` and `del` may leave out: only root makes /dev nodes.
reg::NodeMode node_mode() {
    return is_root() ? reg::NodeMode::Required : reg::NodeMode::Optional;
}

// The note for an empty registry of a user other than root whose UROCE_ROOT is unset, when
// root's registry has devices: that user's default is a registry of their own.
std::string shared_registry_hint(const reg::Registry& own) {
    const char* env = std::getenv("UROCE_ROOT");
    if (is_root() || (env != nullptr && *env != '\0')) return {};
    const reg::Registry shared{fs::path(reg::kDefaultRoot)};
    if (own.root() == shared.root() || shared.list().empty()) return {};
    return fmt::format(" ({} has devices: set UROCE_ROOT={} to use them)", shared.root().string(),
                       shared.root().string());
}

// The variables libibverbs needs, or an error message.
std::optional<Environment> client_environment(const std::string& who) {
    ProviderLookup p = find_provider();
    if (!p.dir) {
        std::string tried;
        for (const auto& t : p.tried) tried += (tried.empty() ? "" : ", ") + t.string();
        print_error(who, fmt::format("the uroce provider {} was not found (looked in {}); {}",
                                     kProviderFile, tried,
                                     p.from_env ? "fix UROCE_PROVIDER_DIR"
                                                : "build or install it, or set "
                                                  "UROCE_PROVIDER_DIR to its directory"));
        return std::nullopt;
    }
    const std::string drivers = (*p.dir / kProviderStem).string();
    if (drivers.find_first_of(":;") != std::string::npos) {
        print_error(who, fmt::format("the provider path {} contains ':' or ';', which "
                                     "RDMAV_DRIVERS cannot express; move it elsewhere",
                                     p.dir->string()));
        return std::nullopt;
    }
    reg::Registry r(reg::root_from_env());
    std::vector<std::string> warnings;
    Environment env{r.sysfs_path().string(), drivers, {}, {}};
    const auto devices = r.list(&warnings);
    if (devices.empty()) {
        warnings.push_back(fmt::format(
            "no devices are registered in {}; add one with 'uroce add NAME --ip ADDR'{}",
            r.root().string(), shared_registry_hint(r)));
    }
    for (const auto& d : devices) {
        env.devices.push_back(d.config.name);
        if (reg::dev_node_usable(d.config.name)) continue;
        if (is_root()) {
            warnings.push_back(reg::missing_node_warning(d.config.name));
        } else {
            env.nodeless.push_back(d.config.name);
        }
    }
    print_warnings(who, warnings);
    return env;
}

// "device a has", "devices a and b have", "devices a, b and c have".
std::string devices_have(const std::vector<std::string>& names) {
    std::string out = names.size() == 1 ? "device " : "devices ";
    for (size_t i = 0; i < names.size(); ++i) {
        if (i > 0) out += i + 1 == names.size() ? " and " : ", ";
        out += names[i];
    }
    return out + (names.size() == 1 ? " has" : " have");
}

int cmd_add(const reg::DeviceConfig& cfg) {
    reg::Registry r(reg::root_from_env());
    std::vector<std::string> warnings = r.add(cfg, node_mode());
    // Without a node the device is usable only through `uroce run`'s namespace: say so now
    // if this host forbids that namespace, rather than at every run.
    if (!reg::dev_node_usable(cfg.name)) {
        if (const std::string refusal = tools::user_namespace_refusal(); !refusal.empty()) {
            warnings.push_back(fmt::format(
                "device '{}' has no {} node (only root can make one) and 'uroce run' cannot "
                "give its commands one in a private namespace: {}",
                cfg.name, reg::kDevDir, refusal));
        }
    }
    print_warnings("uroce add", warnings);
    warn_kernel_rdma("uroce add");
    return 0;
}

int cmd_del(const std::string& name) {
    reg::Registry r(reg::root_from_env());
    r.del(name, node_mode());
    return 0;
}

int cmd_list() {
    reg::Registry r(reg::root_from_env());
    std::vector<std::string> warnings;
    auto devices = r.list(&warnings);
    // A user other than root has no nodes (uroce run makes them), so only root is warned.
    if (is_root()) {
        for (const auto& d : devices) {
            if (!reg::dev_node_usable(d.config.name)) {
                warnings.push_back(reg::missing_node_warning(d.config.name));
            }
        }
    }
    size_t name_w = 4;
    for (const auto& d : devices) name_w = std::max(name_w, d.config.name.size());
    for (const auto& d : devices) {
        fmt::print("{:<{}}  {:<15}  {:>5}  {:>4}  {:<22}  {}\n", d.config.name, name_w,
                   reg::format_ip(d.config.ip), d.config.port, d.config.mtu,
                   reg::format_gid_short(d.config.ip), d.node_guid);
    }
    std::fflush(stdout);
    print_warnings("uroce list", warnings);
    warn_kernel_rdma("uroce list");
    return 0;
}

int cmd_env() {
    auto env = client_environment("uroce env");
    if (!env) return kExitFailure;
    // A shell cannot be moved into a namespace by a program it runs: these devices stay
    // invisible to what it starts (libibverbs lists a device only if its node exists).
    if (!env->nodeless.empty()) {
        print_warnings("uroce env",
                       {fmt::format("{} no {} node (only root can make one), so programs started "
                                    "with these variables will not see {}; run them with 'uroce "
                                    "run -- CMD', which gives them the nodes in a private "
                                    "namespace",
                                    devices_have(env->nodeless), reg::kDevDir,
                                    env->nodeless.size() == 1 ? "it" : "them")});
    }
    fmt::print("export SYSFS_PATH={}\n", shell_quote(env->sysfs_path));
    fmt::print("export RDMAV_DRIVERS={}\n", shell_quote(env->rdmav_drivers));
    // `uroce run` refuses RDMA netlink with a seccomp filter; a shell that evaluates
    // these lines gets the same through the preload library.
    ProviderLookup preload = find_preload();
    if (!preload.dir) {
        std::string tried;
        for (const auto& t : preload.tried) tried += (tried.empty() ? "" : ", ") + t.string();
        print_warnings("uroce env",
                       {fmt::format("{} was not found (looked in {}), so no LD_PRELOAD line; "
                                    "on a kernel with RDMA support use 'uroce run'",
                                    UROCE_PRELOAD_FILE, tried)});
    } else {
        const std::string library = (*preload.dir / UROCE_PRELOAD_FILE).string();
        if (library.find_first_of(" :") != std::string::npos) {
            print_warnings("uroce env",
                           {fmt::format("the path {} contains ' ' or ':', which LD_PRELOAD "
                                        "cannot express, so no LD_PRELOAD line; move it elsewhere",
                                        library)});
        } else {
            fmt::print("export LD_PRELOAD={}\n",
                       shell_quote(ld_preload_value(library, std::getenv("LD_PRELOAD"))));
        }
    }
    std::fflush(stdout);
    warn_kernel_rdma("uroce env");
    return 0;
}

int cmd_run(const std::vector<std::string>& command, const std::string& pcap) {
    auto env = client_environment("uroce run");
    if (!env) return kExitFailure;
    if (::setenv("SYSFS_PATH", env->sysfs_path.c_str(), 1) != 0 ||
        ::setenv("RDMAV_DRIVERS", env->rdmav_drivers.c_str(), 1) != 0 ||
        (!pcap.empty() && ::setenv("UROCE_PCAP", pcap.c_str(), 1) != 0)) {
        print_error("uroce run", "cannot set the environment (out of memory)");
        return kExitFailure;
    }
    // Devices without nodes get them in a namespace of the command's own; the mounts need the
    // capabilities the namespace gives, which the exec then drops.
    if (!env->nodeless.empty()) {
        std::string failure = tools::enter_user_mount_namespace();
        if (failure.empty()) failure = tools::provide_dev_nodes(env->devices);
        if (!failure.empty()) {
            print_error("uroce run",
                        fmt::format("{} no {} node and only root can make one, so 'uroce run' "
                                    "makes {} in a private user and mount namespace, but {}",
                                    devices_have(env->nodeless), reg::kDevDir,
                                    env->nodeless.size() == 1 ? "it" : "them", failure));
            return kExitFailure;
        }
    }
    // Kernel RDMA devices are hidden from the command: libibverbs then reads the
    // registry even on a kernel with ib_core. The filter survives the exec.
    const std::string filter_error = tools::refuse_rdma_netlink();
    if (!filter_error.empty()) {
        print_warnings("uroce run",
                       {fmt::format("{}; on a kernel with RDMA support, libibverbs will not see "
                                    "uroce devices",
                                    filter_error)});
    }
    std::vector<char*> argv;
    argv.reserve(command.size() + 1);
    for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::fflush(stdout);
    ::execvp(argv[0], argv.data());
    int err = errno;
    print_error("uroce run", fmt::format("cannot execute '{}': {}", command[0],
                                         std::error_code(err, std::generic_category()).message()));
    return err == ENOENT ? 127 : 126;
}

// CLI11 validator for NAME.
CLI::Validator name_validator() {
    return CLI::Validator([](std::string& value) { return reg::check_name(value); }, "NAME",
                          "device name");
}

CLI::Validator ip_validator() {
    return CLI::Validator(
        [](std::string& value) {
            IpAddress ip;
            return reg::parse_ip(value, ip);
        },
        "IP", "IPv4 or IPv6 address");
}

// Parses a decimal integer in [lo, hi] (CLI11's own checks would report
// "abc" as out of range).
bool parse_int(const std::string& text, long lo, long hi, long& out) {
    if (text.empty() || text.size() > 9) return false;
    for (char c : text) {
        if (c < '0' || c > '9') return false;
    }
    out = std::stol(text);
    return out >= lo && out <= hi;
}

CLI::Validator mtu_validator() {
    return CLI::Validator(
        [](std::string& value) -> std::string {
            long mtu = 0;
            if (!parse_int(value, 1, 1 << 20, mtu)) {
                return fmt::format(
                    "'{}' is not a supported MTU; use one of 256, 512, 1024, "
                    "2048, 4096",
                    value);
            }
            return reg::check_mtu(static_cast<int>(mtu));
        },
        "MTU", "path MTU");
}

CLI::Validator port_validator() {
    return CLI::Validator(
        [](std::string& value) -> std::string {
            long port = 0;
            if (!parse_int(value, 1, 65535, port)) {
                return fmt::format("'{}' is not a UDP port; use a number in 1..65535", value);
            }
            return {};
        },
        "PORT", "UDP port");
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{
        "uroce: manage devices of the uroce user-space RoCEv2 provider.\n"
        "Devices live in a fake sysfs tree under $UROCE_ROOT plus one node\n"
        "/dev/infiniband/uverbs_uroce_NAME each; 'uroce run' or 'uroce env' point libibverbs at\n"
        "them. Only root makes nodes: for other users 'uroce run' makes them in a private user\n"
        "and mount namespace."};
    app.name("uroce");
    app.require_subcommand(1);
    app.set_version_flag("--version", UROCE_VERSION);
    app.footer(
        "Environment:\n"
        "  UROCE_ROOT          registry directory (default /run/uroce for root; for other\n"
        "                      users $XDG_RUNTIME_DIR/uroce, else ~/.cache/uroce)\n"
        "  UROCE_PROVIDER_DIR  directory holding liburoce" UROCE_PROVIDER_SUFFIX
        " (default: found next to\n"
        "                      this program, else the install location)\n"
        "Exit status: 0 success, 1 error, 2 usage error.\n"
        "Run 'uroce COMMAND --help' for the options of a command.");

    reg::DeviceConfig cfg;
    std::string ip_text;
    auto* add =
        app.add_subcommand("add", "Register a device (as root, also its /dev/infiniband node)");
    add->add_option("NAME", cfg.name, "Device name: letters, digits and '_', 1 to 31 characters")
        ->required()
        ->check(name_validator());
    add->add_option("--ip", ip_text, "IPv4 or IPv6 address the device sends from and listens on")
        ->required()
        ->check(ip_validator());
    add->add_option("--mtu", cfg.mtu, "Path MTU: 256, 512, 1024, 2048 or 4096")
        ->capture_default_str()
        ->check(mtu_validator());
    add->add_option("--port", cfg.port, "UDP port (1..65535, not 49152..49215)")
        ->capture_default_str()
        ->check(port_validator());

    std::string del_name;
    auto* del = app.add_subcommand("del", "Remove a device and its /dev node");
    del->add_option("NAME", del_name, "Device name")->required()->check(name_validator());

    auto* list =
        app.add_subcommand("list", "List devices, one per line: NAME IPV4 PORT MTU GID NODE_GUID");

    auto* env = app.add_subcommand(
        "env",
        "Print 'export SYSFS_PATH=...', 'export RDMAV_DRIVERS=...' and 'export LD_PRELOAD=...' "
        "for a shell");
    env->footer(
        "For a user other than root, devices have no /dev/infiniband node: programs started\n"
        "with these variables do not see them (a shell cannot enter 'uroce run''s namespace).");

    tools::StatsOptions stats_options;
    auto* stats = tools::add_stats_command(app, stats_options);

    std::vector<std::string> command;
    auto* run = app.add_subcommand(
        "run", "Run a command with SYSFS_PATH and RDMAV_DRIVERS set: uroce run -- CMD ARGS...");
    std::string run_pcap;
    run->add_option("--pcap", run_pcap,
                    "Capture every RoCE packet of the command's uroce contexts into FILE "
                    "(UROCE_PCAP; '%p' in FILE becomes each process's id)")
        ->option_text("FILE");
    run->add_option("command", command, "Command and its arguments (put '--' before them)")
        ->required();
    run->footer(
        "The command (and its children) cannot open RDMA netlink sockets: libibverbs then\n"
        "lists uroce devices even on a kernel with RDMA support, and hides the kernel's own\n"
        "RDMA devices. The command runs with no_new_privs: setuid programs gain nothing.\n"
        "SYSFS_PATH and RDMAV_DRIVERS are ignored by libibverbs in setuid programs.\n"
        "For a user other than root whose devices have no /dev node, the command runs in a\n"
        "private user and mount namespace where /dev/infiniband holds them (as that user,\n"
        "without capabilities); where the host forbids that, uroce run says so and exits 1.\n"
        "Exit status: that of the command; 127 (not found) or 126 if it cannot be run.");

    // An unknown first word would otherwise be reported as a missing subcommand.
    if (argc > 1 && argv[1][0] != '-') {
        const std::string first = argv[1];
        bool known = false;
        for (const auto* sub : app.get_subcommands({})) known = known || sub->get_name() == first;
        if (!known) {
            print_error("uroce",
                        fmt::format("unknown command '{}'; commands are add, del, list, env, "
                                    "stats, run (see 'uroce --help')",
                                    first));
            return kExitUsage;
        }
    }

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
        std::string who = "uroce";
        std::string hint = "uroce --help";
        auto subs = app.get_subcommands();
        if (!subs.empty()) {
            who += " " + subs.front()->get_name();
            hint = who + " --help";
        }
        std::string msg = e.what();
        if (subs.empty() && e.get_exit_code() == static_cast<int>(CLI::ExitCodes::RequiredError)) {
            msg = "a command is required: add, del, list, env, stats or run";
        }
        if (!subs.empty() && subs.front() == run &&
            e.get_exit_code() == static_cast<int>(CLI::ExitCodes::ExtrasError)) {
            msg += "; put '--' before the command: uroce run -- CMD ARGS...";
        }
        print_error(who, fmt::format("{} (see '{}')", msg, hint));
        return kExitUsage;
    }

    const std::string who = "uroce " + app.get_subcommands().front()->get_name();
    try {
        if (add->parsed()) {
            reg::parse_ip(ip_text, cfg.ip);
            return cmd_add(cfg);
        }
        if (del->parsed()) return cmd_del(del_name);
        if (list->parsed()) return cmd_list();
        if (env->parsed()) return cmd_env();
        if (stats->parsed()) return tools::run_stats(stats_options);
        if (run->parsed()) return cmd_run(command, run_pcap);
    } catch (const reg::Error& e) {
        print_error(who, e.what());
        return e.kind() == reg::Error::Kind::Usage ? kExitUsage : kExitFailure;
    } catch (const std::exception& e) {
        print_error(who, e.what());
        return kExitFailure;
    }
    return kExitFailure;
}
