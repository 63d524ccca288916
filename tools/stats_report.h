// What `uroce stats` shows of a device: its counters (the sum of every context's block, in
// every process) and the counters of every QP ever created on it (each slot's QP table),
// read from the shared counter files, and that report rendered as text or JSON.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "transport/device_counters.h"
#include "transport/qp_counters.h"

namespace uroce::tools {

struct QpReport {
    uint32_t qpn = 0;
    transport::QpCounterValues values;
};

struct DeviceReport {
    std::string name;
    transport::CounterValues device;
    std::vector<QpReport> qps;          // by QPN
    std::vector<std::string> warnings;  // QP tables that could not be read (skipped)
};

// The device `name` whose counters file is `counters_file` (.../NAME/uroce/counters), with
// every QP of its slots' tables (`with_qps`). A device no context has opened yet has no file:
// all zero, no QP. False with `error` set if the device's counters file cannot be read.
bool read_device_report(const std::string& name, const std::filesystem::path& counters_file,
                        bool with_qps, DeviceReport& out, std::string& error);

// One QP's counters: false with `error` set if no QP `qpn` was ever created on the device
// (or its table cannot be read).
bool read_qp_report(const std::string& name, const std::filesystem::path& counters_file,
                    uint32_t qpn, QpReport& out, std::string& error);

// "0x%06x", as ibv_rc_pingpong prints a QPN.
std::string qpn_hex(uint32_t qpn);

// Text: the device's counters as "NAME VALUE" lines, then one line per QP,
// "qp 0xQPN NAME=VALUE ...". With `previous` (the same device one report earlier) each value is
// followed by what it grew since: "NAME VALUE +DELTA", "NAME=VALUE(+DELTA)".
std::string device_text(const DeviceReport& r, const DeviceReport* previous);
// "NAME VALUE" lines of one QP (`uroce stats NAME --qp QPN`), deltas as above.
std::string qp_text(const QpReport& q, const QpReport* previous);

// JSON objects (one line, no trailing newline):
//   {"device":NAME,"counters":{...},"qps":[{"qpn":N,"qpn_hex":"0x..","counters":{...}},...]}
//   {"device":NAME,"qpn":N,"qpn_hex":"0x..","counters":{...}}
std::string device_json(const DeviceReport& r);
std::string qp_json(const std::string& device, const QpReport& q);

// A JSON string literal for `s` (quotes, backslashes and control characters escaped).
std::string json_string(const std::string& s);

}  // namespace uroce::tools
