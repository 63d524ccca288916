// rc_verify's client: WRITE, READ back, compare (rc_verify.h).
#include <infiniband/verbs.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "rc_verify.h"

namespace rc_verify {
namespace {

struct Problem {
    uint64_t iter;
    std::string what;
};

struct ClientStats {
    uint64_t pairs_posted = 0;
    uint64_t pairs_done = 0;  // both completions seen, whatever their status
    uint64_t pairs_ok = 0;    // both SUCCESS and the READ's data right
    std::map<std::string, uint64_t> write_status;
    std::map<std::string, uint64_t> read_status;
    uint64_t read_wrong = 0;            // SUCCESS with wrong data, any kind
    uint64_t read_wrong_untouched = 0;  // ... every byte still the canary
    uint64_t read_wrong_tail = 0;       // ... a correct head, then an untouched tail
    uint64_t read_wrong_other = 0;
    uint64_t guard_bad = 0;
    uint64_t out_of_order = 0;
    bool stalled = false;
    bool error_seen = false;
    std::vector<Problem> problems;
};

std::string status_summary(const std::map<std::string, uint64_t>& m) {
    if (m.empty()) return "none";
    std::string s;
    for (const auto& [k, n] : m) {
        if (!s.empty()) s += ",";
        std::string name = k;  // one word, so that RESULT lines split on spaces
        std::replace(name.begin(), name.end(), ' ', '_');
        s += name + "=" + std::to_string(n);
    }
    return s;
}

// Compares a successful READ's buffer with the data written; classifies what is wrong.
// Returns true when the data and both guards are right.
bool check_read(const Options& o, ClientStats& st, uint64_t iter, const uint8_t* want,
                const uint8_t* slot_buf) {
    const uint8_t* lo_guard = slot_buf;
    const uint8_t* got = slot_buf + o.guard;
    const uint8_t* hi_guard = got + o.size;
    bool ok = true;
    if (!guard_intact(lo_guard, o.guard) || !guard_intact(hi_guard, o.guard)) {
        ok = false;
        ++st.guard_bad;
        if (st.problems.size() < kMaxReportedProblems)
            st.problems.push_back({iter, "guard bytes around the READ buffer changed"});
    }
    if (std::memcmp(got, want, o.size) == 0) return ok;
    ++st.read_wrong;
    size_t first = o.size, last = 0, mismatches = 0, canaries = 0, all_canary = 1;
    for (size_t i = 0; i < o.size; ++i) {
        if (got[i] != canary(i)) all_canary = 0;
        if (got[i] != want[i]) {
            ++mismatches;
            if (got[i] == canary(i)) ++canaries;
            first = std::min(first, i);
            last = i;
        }
    }
    // A correct head followed by a tail that is still entirely canary.
    bool tail_untouched = !all_canary && first < o.size;
    for (size_t i = first; tail_untouched && i < o.size; ++i)
        if (got[i] != canary(i) && got[i] != want[i]) tail_untouched = false;
    const char* kind = "other";
    if (all_canary) {
        ++st.read_wrong_untouched;
        kind = "untouched (all canary)";
    } else if (tail_untouched && last == o.size - 1) {
        ++st.read_wrong_tail;
        kind = "correct head, untouched tail";
    } else {
        ++st.read_wrong_other;
    }
    char msg[256];
    std::snprintf(msg, sizeof msg,
                  "READ SUCCESS with wrong data: %s; %zu of %zu bytes wrong (%zu still canary), "
                  "first at %zu, last at %zu",
                  kind, mismatches, o.size, canaries, first, last);
    if (st.problems.size() < kMaxReportedProblems || o.verbose) st.problems.push_back({iter, msg});
    if (o.verbose) logf("pair %" PRIu64 ": %s", iter, msg);
    return false;
}

}  // namespace

int run_client(const Options& o) {
    g_role = "rc_verify client";
    Verbs v;
    const unsigned depth = o.depth;
    open_verbs(o, v, 2 * depth);

    const size_t slot_bytes = o.size + 2 * o.guard;
    std::vector<uint8_t> src(o.size * depth);
    std::vector<uint8_t> dst(slot_bytes * depth);
    ibv_mr* src_mr = reg(v, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
    ibv_mr* dst_mr = reg(v, dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);

    std::random_device rd;
    PeerInfo local;
    local.qpn = v.qp->qp_num;
    local.psn = o.psn >= 0 ? static_cast<uint32_t>(o.psn) : (rd() & 0xffffff);
    local.gid = v.gid;
    local.rd_atomic =
        std::min({static_cast<int>(depth), kMaxRdAtomic, v.dev_attr.max_qp_init_rd_atom});

    LineChannel oob(tcp_connect(o.server, o.tcp_port, o.oob_wait_s));
    if (!oob.send_line(format_peer(local))) die(kExitIncomplete, "TCP send failed");
    std::string line;
    PeerInfo remote;
    if (!oob.recv_line_within(line, o.oob_wait_s) || !parse_peer(line, remote))
        die(kExitIncomplete, "no valid peer information from the server (got '%s')", line.c_str());
    if (remote.len < o.size * depth)
        die(kExitUsage, "server region is %" PRIu64 " bytes, need %zu (same -s/-q on both sides?)",
            remote.len, o.size * depth);
    int max_rd_atomic = std::max(1, std::min(local.rd_atomic, remote.rd_atomic));
    connect_qp(o, v, local, remote, max_rd_atomic,
               std::min(kMaxRdAtomic, std::max(1, v.dev_attr.max_qp_rd_atom)));
    if (!oob.send_line("READY")) die(kExitIncomplete, "TCP send failed");
    if (!oob.recv_line_within(line, o.oob_wait_s) || line != "READY")
        die(kExitIncomplete, "server not ready (got '%s')", line.c_str());

    logf("%" PRIu64 " pairs of WRITE %zu B + READ %zu B, %u in flight, seed %" PRIu64
         ", stall limit %.0f s",
         o.iters, o.size, o.size, depth, o.seed, o.stall_s);

    ClientStats st;
    std::vector<uint64_t> slot_iter(depth, 0);
    std::vector<int> slot_pending(depth, 0);  // completions still expected per slot
    std::vector<bool> slot_ok(depth, false);  // no error status, no wrong byte so far
    uint64_t next_iter = 0;
    uint64_t expected_seq = 0;  // completions arrive in posting order: 2*iter, 2*iter+1
    uint64_t outstanding = 0;
    auto start = Clock::now();
    auto last_progress = start;
    auto last_beat = start;

    auto post_pair = [&](unsigned slot) -> bool {
        uint64_t iter = next_iter;
        uint8_t* s = src.data() + slot * o.size;
        uint8_t* d = dst.data() + slot * slot_bytes;
        fill_data(s, o.size, o.seed, iter);
        std::memset(d, kGuardByte, o.guard);
        fill_canary(d + o.guard, o.size);
        std::memset(d + o.guard + o.size, kGuardByte, o.guard);

        ibv_sge wsge{reinterpret_cast<uintptr_t>(s), static_cast<uint32_t>(o.size), src_mr->lkey};
        ibv_sge rsge{reinterpret_cast<uintptr_t>(d + o.guard), static_cast<uint32_t>(o.size),
                     dst_mr->lkey};
        ibv_send_wr rwr{};
        rwr.wr_id = 2 * iter + 1;
        rwr.sg_list = &rsge;
        rwr.num_sge = 1;
        rwr.opcode = IBV_WR_RDMA_READ;
        rwr.send_flags = IBV_SEND_SIGNALED;
        rwr.wr.rdma.remote_addr = remote.addr + slot * o.size;
        rwr.wr.rdma.rkey = remote.rkey;
        ibv_send_wr wwr{};
        wwr.wr_id = 2 * iter;
        wwr.sg_list = &wsge;
        wwr.num_sge = 1;
        wwr.opcode = IBV_WR_RDMA_WRITE;
        wwr.send_flags = IBV_SEND_SIGNALED;
        wwr.wr.rdma.remote_addr = remote.addr + slot * o.size;
        wwr.wr.rdma.rkey = remote.rkey;
        wwr.next = &rwr;
        ibv_send_wr* bad = nullptr;
        int rc = ibv_post_send(v.qp, &wwr, &bad);
        if (rc != 0) {
            logf("ibv_post_send failed at pair %" PRIu64 ": %s", iter, std::strerror(rc));
            // If only the READ failed to post, the WRITE is still outstanding.
            if (bad == &rwr) {
                ++outstanding;
                slot_iter[slot] = iter;
                slot_ok[slot] = false;
                slot_pending[slot] = 1;
                ++next_iter;
                ++st.pairs_posted;
            }
            return false;
        }
        slot_iter[slot] = iter;
        slot_ok[slot] = true;
        slot_pending[slot] = 2;
        outstanding += 2;
        ++next_iter;
        ++st.pairs_posted;
        return true;
    };

    bool posting = true;
    for (unsigned s = 0; s < depth && next_iter < o.iters; ++s) {
        if (!post_pair(s)) {
            posting = false;
            st.error_seen = true;
            break;
        }
    }

    ibv_wc wc[32];
    while (outstanding > 0) {
        int n = poll_some(v, o.busy_poll, wc, 32, 200);
        if (n < 0) {
            logf("ibv_poll_cq failed");
            st.error_seen = true;
            break;
        }
        auto now = Clock::now();
        if (n > 0) last_progress = now;
        for (int i = 0; i < n; ++i) {
            const ibv_wc& w = wc[i];
            uint64_t iter = w.wr_id / 2;
            bool is_read = (w.wr_id & 1) != 0;
            unsigned slot = static_cast<unsigned>(iter % depth);
            std::string status = ibv_wc_status_str(w.status);
            (is_read ? st.read_status : st.write_status)[status]++;
            --outstanding;
            if (w.wr_id != expected_seq) ++st.out_of_order;
            expected_seq = w.wr_id + 1;
            if (w.status != IBV_WC_SUCCESS) {
                slot_ok[slot] = false;
                if (!st.error_seen || o.verbose)
                    logf("pair %" PRIu64 " %s: %s (vendor_err 0x%x)", iter,
                         is_read ? "READ" : "WRITE", status.c_str(), w.vendor_err);
                if (!st.error_seen && st.problems.size() < kMaxReportedProblems)
                    st.problems.push_back(
                        {iter, std::string(is_read ? "READ " : "WRITE ") + status});
                st.error_seen = true;
                posting = false;
            } else if (is_read) {
                if (w.opcode != IBV_WC_RDMA_READ) ++st.out_of_order;
                if (slot_iter[slot] != iter) die(kExitUsage, "internal: slot bookkeeping");
                if (o.self_test != 0 && (iter + 1) % o.self_test == 0) {
                    uint8_t* got = dst.data() + slot * slot_bytes + o.guard;
                    size_t from = ((iter + 1) / o.self_test) % 2 == 1 ? o.size - o.size / 4 : 0;
                    for (size_t b = from; b < o.size; ++b) got[b] = canary(b);
                }
                if (!check_read(o, st, iter, src.data() + slot * o.size,
                                dst.data() + slot * slot_bytes))
                    slot_ok[slot] = false;
            } else if (w.opcode != IBV_WC_RDMA_WRITE) {
                ++st.out_of_order;
            }
            if (--slot_pending[slot] == 0) {
                ++st.pairs_done;
                if (slot_ok[slot]) ++st.pairs_ok;
                if (posting && next_iter < o.iters && !post_pair(slot)) {
                    posting = false;
                    st.error_seen = true;
                }
            }
        }
        if (seconds_since(last_beat) >= 1.0) {
            last_beat = now;
            oob.send_line("P " + std::to_string(st.pairs_done));
        }
        if (std::chrono::duration<double>(now - last_progress).count() > o.stall_s) {
            logf("no completion for %.0f s with %" PRIu64 " work requests outstanding: giving up",
                 o.stall_s, outstanding);
            st.stalled = true;
            break;
        }
    }
    double elapsed = seconds_since(start);
    unsigned async = report_async_events(v);
    std::string qp_state = qp_state_now(v);

    char summary[512];
    std::snprintf(summary, sizeof summary,
                  "pairs=%" PRIu64 " posted=%" PRIu64 " done=%" PRIu64 " ok=%" PRIu64
                  " read_success_wrong_data=%" PRIu64 " guard_bad=%" PRIu64 " stalled=%d",
                  o.iters, st.pairs_posted, st.pairs_done, st.pairs_ok, st.read_wrong, st.guard_bad,
                  st.stalled ? 1 : 0);
    oob.send_line(std::string("DONE ") + summary);
    std::string server_line = "(no answer)";
    if (oob.recv_line_within(line, 10) && line.rfind("SERVER ", 0) == 0)
        server_line = line.substr(7);
    // Only a server that answered can report its guards; silence is an incomplete run.
    bool server_answered = server_line != "(no answer)";
    bool server_guard_bad = server_answered && server_line.find("guard_bad=0") == std::string::npos;

    for (const auto& p : st.problems)
        logf("problem at pair %" PRIu64 ": %s", p.iter, p.what.c_str());
    logf("elapsed %.2f s (%.1f pairs/s)", elapsed,
         elapsed > 0 ? static_cast<double>(st.pairs_done) / elapsed : 0.0);
    logf("WRITE completions: %s", status_summary(st.write_status).c_str());
    logf("READ completions: %s", status_summary(st.read_status).c_str());
    logf("READ SUCCESS with wrong data: %" PRIu64 " (untouched %" PRIu64 ", untouched tail %" PRIu64
         ", other %" PRIu64 ")",
         st.read_wrong, st.read_wrong_untouched, st.read_wrong_tail, st.read_wrong_other);
    logf("guard violations (client READ buffers): %" PRIu64 "; completions out of order: %" PRIu64,
         st.guard_bad, st.out_of_order);
    logf("QP state at end: %s; async events: %u", qp_state.c_str(), async);
    logf("server: %s", server_line.c_str());
    std::printf(
        "RESULT role=client size=%zu depth=%u %s wc_write=%s wc_read=%s wrong_untouched=%" PRIu64
        " wrong_tail=%" PRIu64 " wrong_other=%" PRIu64 " out_of_order=%" PRIu64
        " qp=%s async=%u elapsed=%.2f"
        " server={%s}\n",
        o.size, depth, summary, status_summary(st.write_status).c_str(),
        status_summary(st.read_status).c_str(), st.read_wrong_untouched, st.read_wrong_tail,
        st.read_wrong_other, st.out_of_order, qp_state.c_str(), async, elapsed,
        server_line.c_str());
    std::fflush(stdout);
    close_verbs(v);

    if (st.read_wrong > 0 || st.guard_bad > 0 || server_guard_bad) return kExitWrongData;
    if (st.stalled || st.error_seen || st.pairs_ok != o.iters || st.out_of_order > 0 ||
        !server_answered)
        return kExitIncomplete;
    return kExitOk;
}

}  // namespace rc_verify
