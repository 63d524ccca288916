// See stats_report.h.
#include "stats_report.h"

#include <fmt/format.h>
#include <algorithm>
#include <charconv>
#include <system_error>

namespace fs = std::filesystem;
namespace tr = uroce::transport;

namespace uroce::tools {
namespace {

constexpr std::string_view kQpTablePrefix = "counters.qp.";

// The slot of a QP table file name ("counters.qp.SLOT"), or nothing for any other name.
std::optional<uint32_t> table_slot(const std::string& file_name) {
    if (file_name.size() <= kQpTablePrefix.size() || !file_name.starts_with(kQpTablePrefix))
        return std::nullopt;
    const char* first = file_name.data() + kQpTablePrefix.size();
    const char* last = file_name.data() + file_name.size();
    uint32_t slot = 0;
    const auto [end, ec] = std::from_chars(first, last, slot);
    if (ec != std::errc() || end != last) return std::nullopt;
    return slot;
}

// What `now` grew since `before`; a counter that went down (its block was taken by a new QP
// of the same number) counts from zero again.
uint64_t growth(uint64_t now, uint64_t before) {
    return now >= before ? now - before : now;
}

}  // namespace

bool read_device_report(const std::string& name, const fs::path& counters_file, bool with_qps,
                        DeviceReport& out, std::string& error) {
    out = DeviceReport{};
    out.name = name;
    std::error_code ec;
    if (!fs::exists(counters_file, ec)) return true;  // never opened: nothing counted yet
    if (!tr::DeviceCounters::read_totals(counters_file.string(), out.device, error)) return false;
    if (!with_qps) return true;
    for (const auto& entry : fs::directory_iterator(counters_file.parent_path(), ec)) {
        const auto slot = table_slot(entry.path().filename().string());
        if (!slot) continue;
        std::vector<tr::QpCounterTable::Entry> qps;
        std::string why;
        if (!tr::QpCounterTable::read_all(entry.path().string(), qps, why)) {
            out.warnings.push_back(why + " (skipped)");
            continue;
        }
        for (const auto& q : qps) out.qps.push_back(QpReport{q.qpn, q.values});
    }
    if (ec) {
        error =
            fmt::format("cannot list {}: {}", counters_file.parent_path().string(), ec.message());
        return false;
    }
    std::sort(out.qps.begin(), out.qps.end(),
              [](const QpReport& a, const QpReport& b) { return a.qpn < b.qpn; });
    return true;
}

bool read_qp_report(const std::string& name, const fs::path& counters_file, uint32_t qpn,
                    QpReport& out, std::string& error) {
    out = QpReport{qpn, {}};
    // The QP's block is in its context's slot file (QPN = slot << 12 | index).
    const std::string file = tr::QpCounterTable::path_for_slot(counters_file.string(), qpn >> 12);
    // Written as the listings write QPNs (0x and six digits), so one can be searched for the other.
    const std::string never = fmt::format("no QP {} was ever created on '{}'", qpn_hex(qpn), name);
    std::error_code ec;
    if (qpn >> 12 == 0 || !fs::exists(file, ec)) {
        error = never;
        return false;
    }
    bool owned = false;
    if (!tr::QpCounterTable::read(file, qpn, out.values, owned, error)) return false;
    if (!owned) {
        error = never;
        return false;
    }
    return true;
}

std::string qpn_hex(uint32_t qpn) {
    return fmt::format("{:#08x}", qpn);
}

std::string device_text(const DeviceReport& r, const DeviceReport* previous) {
    std::string out;
    auto it = std::back_inserter(out);
#define UROCE_TEXT(n)                                                                              \
    if (previous)                                                                                  \
        fmt::format_to(it, "{} {} +{}\n", #n, r.device.n, growth(r.device.n, previous->device.n)); \
    else                                                                                           \
        fmt::format_to(it, "{} {}\n", #n, r.device.n);
    UROCE_COUNTERS(UROCE_TEXT)
#undef UROCE_TEXT
    for (const QpReport& q : r.qps) {
        const QpReport* before = nullptr;
        if (previous) {  // both lists are by QPN
            const auto at =
                std::lower_bound(previous->qps.begin(), previous->qps.end(), q.qpn,
                                 [](const QpReport& p, uint32_t qpn) { return p.qpn < qpn; });
            if (at != previous->qps.end() && at->qpn == q.qpn) before = &*at;
        }
        fmt::format_to(it, "qp {}", qpn_hex(q.qpn));
#define UROCE_QP_TEXT(n)                                                            \
    if (previous)                                                                   \
        fmt::format_to(it, " {}={}(+{})", #n, q.values.n,                           \
                       before ? growth(q.values.n, before->values.n) : q.values.n); \
    else                                                                            \
        fmt::format_to(it, " {}={}", #n, q.values.n);
        UROCE_QP_COUNTERS(UROCE_QP_TEXT)
#undef UROCE_QP_TEXT
        out += '\n';
    }
    return out;
}

std::string qp_text(const QpReport& q, const QpReport* previous) {
    std::string out;
    auto it = std::back_inserter(out);
#define UROCE_QP_LINE(n)                                                                           \
    if (previous)                                                                                  \
        fmt::format_to(it, "{} {} +{}\n", #n, q.values.n, growth(q.values.n, previous->values.n)); \
    else                                                                                           \
        fmt::format_to(it, "{} {}\n", #n, q.values.n);
    UROCE_QP_COUNTERS(UROCE_QP_LINE)
#undef UROCE_QP_LINE
    return out;
}

std::string json_string(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
        const auto u = static_cast<unsigned char>(c);
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (u < 0x20) {
            out += fmt::format("\\u{:04x}", u);
        } else {
            out += c;
        }
    }
    return out + "\"";
}

namespace {

std::string qp_counters_json(const tr::QpCounterValues& v) {
    std::string out = "{";
    auto it = std::back_inserter(out);
    const char* sep = "";
#define UROCE_QP_JSON(n)                             \
    fmt::format_to(it, "{}\"{}\":{}", sep, #n, v.n); \
    sep = ",";
    UROCE_QP_COUNTERS(UROCE_QP_JSON)
#undef UROCE_QP_JSON
    return out + "}";
}

}  // namespace

std::string device_json(const DeviceReport& r) {
    std::string out = "{\"device\":" + json_string(r.name) + ",\"counters\":{";
    auto it = std::back_inserter(out);
    const char* sep = "";
#define UROCE_JSON(n)                                       \
    fmt::format_to(it, "{}\"{}\":{}", sep, #n, r.device.n); \
    sep = ",";
    UROCE_COUNTERS(UROCE_JSON)
#undef UROCE_JSON
    out += "},\"qps\":[";
    sep = "";
    for (const QpReport& q : r.qps) {
        fmt::format_to(it, "{}{{\"qpn\":{},\"qpn_hex\":\"{}\",\"counters\":{}}}", sep, q.qpn,
                       qpn_hex(q.qpn), qp_counters_json(q.values));
        sep = ",";
    }
    return out + "]}";
}

std::string qp_json(const std::string& device, const QpReport& q) {
    return fmt::format("{{\"device\":{},\"qpn\":{},\"qpn_hex\":\"{}\",\"counters\":{}}}",
                       json_string(device), q.qpn, qpn_hex(q.qpn), qp_counters_json(q.values));
}

}  // namespace uroce::tools
