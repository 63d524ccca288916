// Counters of each QP, readable from any process while the QP lives and after it is gone.
//
// A context's QPs count into its slot's QP counters file (one per slot, beside the device's
// counters file, device_counters.h): a header, then one block per QP index (the low 12 bits
// of the QPN), mapped shared. A QP zeroes its block when it is created and counts into it
// directly (relaxed atomics, no lock, nothing on the data path beyond the increments); the
// block keeps its figures after the QP is destroyed, until a QP of the same number takes it,
// so `uroce stats NAME --qp QPN` can read a QP of a process that has exited. Engines without
// a slot table (unit tests) count into private memory.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace uroce::transport {

#define UROCE_QP_COUNTERS(X)                                                      \
    X(tx_packets)            /* packets of this QP handed to the socket */        \
    X(tx_payload_bytes)      /* their payload bytes (no headers, pad or ICRC) */  \
    X(rx_packets)            /* packets delivered to this QP */                   \
    X(rx_payload_bytes)      /* their payload bytes */                            \
    X(retransmit_timeouts)   /* retransmission timer expiries */                  \
    X(retransmitted_packets) /* request packets sent again */                     \
    X(rx_naks)               /* NAKs and RNR NAKs received */                     \
    X(tx_naks)               /* NAKs of every kind sent */                        \
    X(early_retransmits)     /* adaptive timeouts before the local ACK timeout */ \
    X(tail_probes)           /* last packets resent alone (tail-loss probes) */

struct QpCounters {
#define UROCE_QP_COUNTER_FIELD(name) std::atomic<uint64_t> name{0};
    UROCE_QP_COUNTERS(UROCE_QP_COUNTER_FIELD)
#undef UROCE_QP_COUNTER_FIELD
    void reset();
};

struct QpCounterValues {
#define UROCE_QP_COUNTER_VALUE(name) uint64_t name = 0;
    UROCE_QP_COUNTERS(UROCE_QP_COUNTER_VALUE)
#undef UROCE_QP_COUNTER_VALUE
};

QpCounterValues snapshot(const QpCounters& c);

class QpCounterTable {
  public:
    static constexpr uint32_t kQps = 4096;  // QP indexes of one context (QPN & 0xfff)
    static constexpr size_t kStride = 128;  // bytes per QP block: room for 16 counters

    // The shared table of one slot at `path` (created if absent, mode 0666); nullptr with
    // `error` set if the file cannot be used (the caller then counts privately).
    static std::unique_ptr<QpCounterTable> open_shared(const std::string& path, std::string& error);
    // A table in this process's memory only.
    static std::unique_ptr<QpCounterTable> make_private();
    ~QpCounterTable();
    QpCounterTable(const QpCounterTable&) = delete;
    QpCounterTable& operator=(const QpCounterTable&) = delete;

    QpCounters& for_qpn(uint32_t qpn) {
        return *reinterpret_cast<QpCounters*>(blocks_ + (qpn % kQps) * kStride);
    }

    // The counters of QP `qpn` in the table file at `path`. False with `error` set if the
    // file cannot be read.
    static bool read(const std::string& path, uint32_t qpn, QpCounterValues& out,
                     std::string& error);

    // The table file of `slot` for a device whose counters file is `device_counters_file`.
    static std::string path_for_slot(const std::string& device_counters_file, uint32_t slot);

  private:
    QpCounterTable(void* map, size_t length, char* blocks)
        : map_(map), length_(length), blocks_(blocks) {}
    void* map_;      // the shared mapping, or nullptr for a private table
    size_t length_;  // of the mapping
    char* blocks_;   // kQps blocks of kStride bytes, each starting with a QpCounters
};

}  // namespace uroce::transport
