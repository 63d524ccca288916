// Counters of each QP, readable from any process while the QP lives and after it is gone.
//
// A context's QPs count into its slot's QP counters file (one per slot, beside the device's
// counters file, device_counters.h): a header, then one block per QP index (the low 12 bits
// of the QPN), mapped shared. A QP zeroes its block when it is created, marks it with its
// QPN (so `uroce stats NAME` lists the QPs that ever existed) and counts into it
// directly (relaxed atomics, no lock, nothing on the data path beyond the increments); the
// block keeps its figures after the QP is destroyed, until a QP of the same number takes it,
// so `uroce stats NAME --qp QPN` can read a QP of a process that has exited. Engines without
// a slot table (unit tests) count into private memory.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace uroce::transport {

// The counters of one QP. The first ten are the original list (uroce_read_qp_counter names);
// the rest were added with `uroce stats`' per-QP listing. rx_packets counts every packet
// delivered to the QP, also those it then refuses (rx_wrong_peer, duplicates).
#define UROCE_QP_COUNTERS(X)                                                                  \
    X(tx_packets)            /* packets of this QP handed to the socket */                    \
    X(tx_payload_bytes)      /* their payload bytes (no headers, pad or ICRC) */              \
    X(rx_packets)            /* packets delivered to this QP */                               \
    X(rx_payload_bytes)      /* their payload bytes */                                        \
    X(retransmit_timeouts)   /* retransmission timer expiries */                              \
    X(retransmitted_packets) /* request packets sent again */                                 \
    X(rx_naks)               /* NAKs and RNR NAKs received */                                 \
    X(tx_naks)               /* NAKs of every kind sent */                                    \
    X(early_retransmits)     /* adaptive timeouts before the local ACK timeout */             \
    X(tail_probes)           /* tail-loss probes, and the second probe's go-back-N */         \
    X(tx_seq_naks)           /* PSN sequence error NAKs sent */                               \
    X(tx_rnr_naks)           /* RNR NAKs sent */                                              \
    X(tx_other_naks)         /* access, invalid request and remote operational NAKs sent */   \
    X(rx_seq_naks)           /* PSN sequence error NAKs received */                           \
    X(rx_rnr_naks)           /* RNR NAKs received */                                          \
    X(rx_other_naks)         /* other NAKs received */                                        \
    X(rx_duplicate)          /* duplicate requests (older PSN) received */                    \
    X(rx_wrong_peer)         /* packets naming this QP from a source not its peer: dropped */ \
    X(tx_faults)             /* UROCE_FAULTS' drops, corruptions, duplicates, delays */       \
    X(send_window_cuts)      /* send window halved by a loss (send_window.h) */               \
    X(spurious_retransmits)  /* timer resends a duplicate's ACK proved needless (undone) */   \
    X(selective_resends)     /* sequence NAKs answered with the lost packet alone, no go-back-N */

struct QpCounters {
#define UROCE_QP_COUNTER_FIELD(name) std::atomic<uint64_t> name{0};
    UROCE_QP_COUNTERS(UROCE_QP_COUNTER_FIELD)
#undef UROCE_QP_COUNTER_FIELD
    // Not a counter: kOwned | QPN of the QP that last took the block, 0 if none ever did, so
    // that a reader lists only blocks of QPs that existed.
    std::atomic<uint64_t> owner{0};
    static constexpr uint64_t kOwned = uint64_t{1} << 32;

    // Zeroes every counter, then marks the block as QP `qpn`'s.
    void claim(uint32_t qpn);
    // Zeroes everything: no QP ever took the block.
    void clear();
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
    static constexpr size_t kStride = 256;  // bytes per QP block: room for 31 counters + owner

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

    // The counters of QP `qpn` in the table file at `path`; `owned` says whether QP `qpn`
    // ever took its block (else `out` is all zero). False with `error` set if the file
    // cannot be read.
    static bool read(const std::string& path, uint32_t qpn, QpCounterValues& out, bool& owned,
                     std::string& error);

    struct Entry {
        uint32_t qpn;
        QpCounterValues values;
    };
    // Every block of the table file at `path` that a QP took, by index (= QPN order within
    // a slot). False with `error` set if the file cannot be read.
    static bool read_all(const std::string& path, std::vector<Entry>& out, std::string& error);

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
