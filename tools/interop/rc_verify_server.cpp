// rc_verify's server: a passive region, its guards checked at the end (rc_verify.h).
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

int run_server(const Options& o) {
    g_role = "rc_verify server";
    Verbs v;
    open_verbs(o, v, 2);
    const size_t region = o.size * o.depth;
    std::vector<uint8_t> buf(region + 2 * o.guard);
    std::memset(buf.data(), kGuardByte, o.guard);
    fill_canary(buf.data() + o.guard, region);
    std::memset(buf.data() + o.guard + region, kGuardByte, o.guard);
    // The guards are inside the registered memory, outside the range handed out: a responder
    // that writes past the addressed range lands on them.
    ibv_mr* mr = reg(v, buf.data(), buf.size(),
                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);

    std::random_device rd;
    PeerInfo local;
    local.qpn = v.qp->qp_num;
    local.psn = o.psn >= 0 ? static_cast<uint32_t>(o.psn) : (rd() & 0xffffff);
    local.gid = v.gid;
    local.rkey = mr->rkey;
    local.addr = reinterpret_cast<uintptr_t>(buf.data() + o.guard);
    local.len = region;
    local.rd_atomic = std::min(kMaxRdAtomic, std::max(1, v.dev_attr.max_qp_rd_atom));

    LineChannel oob(tcp_listen_accept(o.tcp_port, o.oob_wait_s));
    std::string line;
    PeerInfo remote;
    if (!oob.recv_line_within(line, o.oob_wait_s) || !parse_peer(line, remote))
        die(kExitIncomplete, "no valid peer information from the client (got '%s')", line.c_str());
    if (!oob.send_line(format_peer(local))) die(kExitIncomplete, "TCP send failed");
    connect_qp(o, v, local, remote,
               std::max(1, std::min({kMaxRdAtomic, v.dev_attr.max_qp_init_rd_atom})),
               local.rd_atomic);
    if (!oob.recv_line_within(line, o.oob_wait_s) || line != "READY")
        die(kExitIncomplete, "client not ready (got '%s')", line.c_str());
    if (!oob.send_line("READY")) die(kExitIncomplete, "TCP send failed");
    logf("serving %zu bytes at 0x%" PRIx64 " rkey 0x%x", region, local.addr, local.rkey);

    // Passive: the responder needs nothing from us. Watch the client's heartbeats and our
    // async events until the client is done.
    auto last = Clock::now();
    unsigned async = 0;
    std::string done;
    bool finished = false;
    uint64_t client_pairs = 0;
    while (!finished) {
        int r = oob.recv_line(line, 500);
        async += report_async_events(v);
        if (r < 0) {
            logf("client went away");
            break;
        }
        if (r == 1) {
            last = Clock::now();
            if (line.rfind("P ", 0) == 0) {
                client_pairs = std::strtoull(line.c_str() + 2, nullptr, 10);
            } else if (line.rfind("DONE ", 0) == 0) {
                done = line.substr(5);
                finished = true;
            }
        } else if (seconds_since(last) > o.stall_s + 10) {
            logf("no word from the client for %.0f s (last count %" PRIu64 " pairs)",
                 o.stall_s + 10, client_pairs);
            break;
        }
    }
    bool guards_ok =
        guard_intact(buf.data(), o.guard) && guard_intact(buf.data() + o.guard + region, o.guard);
    std::string qp_state = qp_state_now(v);
    async += report_async_events(v);
    char summary[256];
    std::snprintf(summary, sizeof summary, "guard_bad=%d qp=%s async=%u", guards_ok ? 0 : 1,
                  qp_state.c_str(), async);
    if (finished) oob.send_line(std::string("SERVER ") + summary);
    logf("client: %s", finished ? done.c_str() : "(no DONE)");
    std::printf("RESULT role=server size=%zu depth=%u %s\n", o.size, o.depth, summary);
    std::fflush(stdout);
    close_verbs(v);
    if (!guards_ok) return kExitWrongData;
    return finished ? kExitOk : kExitIncomplete;
}

}  // namespace rc_verify
