// fork() after opening devices (fork_guard.h): the parent's objects stay the parent's. A
// child that closes them does not hang and takes nothing from the parent; a child that uses
// them gets EIO and steals none of the parent's packets; a child opens devices of its own and
// runs verified traffic on them while the parent goes on with its own.
//
// Each scenario runs in a process of its own (scenario_passes, the "parent" below), which forks
// the child: if a parent is left broken (with the guard missing, a child's close can leave the
// parent's engine unable to stop), the test fails when the time limit kills it instead of
// hanging the test binary.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "tests/integration/scenario.h"
#include "tests/integration/verbs_fixture.h"
#include "transport/counters.h"

using namespace uroce::test;
using namespace std::chrono_literals;

namespace {

constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

// The counters that tell where the packets of a failed exchange went, on stderr: every
// counter of the context that is not zero.
void print_counters(const char* who, Endpoint& e) {
    std::fprintf(stderr, "  %s (pid %d):", who, static_cast<int>(::getpid()));
#define UROCE_NAME(n) #n,
    static const char* const kNames[] = {UROCE_COUNTERS(UROCE_NAME)};
#undef UROCE_NAME
    for (const char* name : kNames) {
        try {
            const auto v = counter(e.ctx, name);
            if (v == 0) continue;
            std::fprintf(stderr, " %s=%llu", name, static_cast<unsigned long long>(v));
        } catch (const std::exception&) {
            std::fprintf(stderr, " %s=?", name);
        }
    }
    std::fprintf(stderr, "\n");
}

// A WRITE of fresh bytes from `from` to `to`, then a READ of them back; true if both
// completed and every byte matches.
bool verified_write_read(Endpoint& from, Endpoint& to, uint64_t seed) {
    constexpr size_t kLen = 1 << 16;
    Buffer src(from.pd, kLen, kAll), back(from.pd, kLen, kAll), dst(to.pd, kLen, kAll);
    fill_pattern(src.bytes.data(), kLen, seed);
    if (post_rdma(from.qp, IBV_WR_RDMA_WRITE, src, 0, kLen, dst.addr(), dst.mr->rkey, 1) != 0)
        return false;
    if (post_rdma(from.qp, IBV_WR_RDMA_READ, back, 0, kLen, dst.addr(), dst.mr->rkey, 2) != 0)
        return false;
    const auto wcs = wait_completions(from.cq, 2);
    // What went wrong goes to stderr (the scenario runs in a child: no Catch2 messages).
    if (wcs.size() != 2) {
        std::fprintf(stderr, "verified_write_read: %zu of 2 completions\n", wcs.size());
        print_counters("from", from);
        print_counters("to", to);
        return false;
    }
    for (const ibv_wc& wc : wcs) {
        if (wc.status != IBV_WC_SUCCESS) {
            std::fprintf(stderr, "verified_write_read: wr_id %llu: %s (vendor_err %u)\n",
                         static_cast<unsigned long long>(wc.wr_id), ibv_wc_status_str(wc.status),
                         wc.vendor_err);
            print_counters("from", from);
            print_counters("to", to);
            return false;
        }
    }
    const bool written = dst.bytes == src.bytes, read = back.bytes == src.bytes;
    if (!written || !read)
        std::fprintf(stderr, "verified_write_read: data %s\n",
                     written ? "read back differs" : "written differs");
    return written && read;
}

}  // namespace

TEST_CASE("fork: a child closing its parent's objects neither hangs nor disturbs the parent",
          "[fork]") {
    const bool passed = scenario_passes([] {
        Endpoint a(devices().a), b(devices().b);
        connect(a, b);
        int failures = expect(verified_write_read(a, b, 1), "traffic before the fork");
        Buffer extra(b.pd, 4096, kAll);
        // What an atexit handler, a destructor or Python's multiprocessing does in the child.
        const pid_t child = spawn([&] {
            int wrong = 0;
            wrong += ibv_destroy_qp(b.qp) != 0;
            wrong += ibv_dereg_mr(extra.mr) != 0;
            wrong += ibv_destroy_cq(b.cq) != 0;
            wrong += ibv_dealloc_pd(b.pd) != 0;
            wrong += ibv_close_device(b.ctx) != 0;
            wrong += ibv_close_device(a.ctx) != 0;  // with its QP, CQ and PD still open
            return wrong;
        });
        failures += expect(wait_child(child) == 0, "the child's closes returned 0, in time");
        // The parent's objects and sockets are all still there: traffic both ways.
        failures += expect(verified_write_read(a, b, 2), "a -> b after the child closed");
        failures += expect(verified_write_read(b, a, 3), "b -> a after the child closed");
        return failures;  // the Endpoints are destroyed here: a hang is caught by the limit
    });
    CHECK(passed);
}

TEST_CASE("fork: verbs on inherited objects fail with EIO and take none of the parent's packets",
          "[fork]") {
    const bool passed = scenario_passes([] {
        constexpr int kMessages = 64;
        constexpr size_t kLen = 4096;
        Endpoint a(devices().a), b(devices().b);
        connect(a, b);
        Buffer src(a.pd, kLen * kMessages, kAll), dst(b.pd, kLen * kMessages, kAll);
        fill_pattern(src.bytes.data(), src.bytes.size(), 44);
        int failures = 0;
        for (int i = 0; i < kMessages; ++i)
            failures += expect(post_recv_buf(b.qp, dst, i * kLen, kLen, i) == 0, "post_recv");
        const pid_t child = spawn([&] {
            int wrong = 0;
            // Polls b's CQ while the parent's messages arrive at b: each poll must fail, and
            // none may receive a packet from the socket the child shares with its parent.
            const auto end = std::chrono::steady_clock::now() + 300ms;
            while (std::chrono::steady_clock::now() < end) {
                ibv_wc wc[4];
                if (ibv_poll_cq(b.cq, 4, wc) != -EIO) ++wrong;
            }
            ibv_send_wr swr{};
            ibv_send_wr* bad_s = nullptr;
            wrong += ibv_post_send(b.qp, &swr, &bad_s) != EIO || bad_s != &swr;
            ibv_recv_wr rwr{};
            ibv_recv_wr* bad_r = nullptr;
            wrong += ibv_post_recv(b.qp, &rwr, &bad_r) != EIO || bad_r != &rwr;
            wrong += ibv_req_notify_cq(b.cq, 0) != EIO;
            ibv_qp_attr attr{};
            attr.qp_state = IBV_QPS_ERR;
            wrong += ibv_modify_qp(b.qp, &attr, IBV_QP_STATE) != EIO;
            errno = 0;
            wrong += ibv_alloc_pd(b.ctx) != nullptr || errno != EIO;
            errno = 0;
            wrong += ibv_create_cq(b.ctx, 16, nullptr, nullptr, 0) != nullptr || errno != EIO;
            std::vector<uint8_t> mem(4096);
            errno = 0;
            wrong += ibv_reg_mr(b.pd, mem.data(), mem.size(), kAll) != nullptr || errno != EIO;
            return wrong;
        });
        for (int i = 0; i < kMessages; ++i) {
            failures += expect(post_send_msg(a.qp, src, i * kLen, kLen, i) == 0, "post_send");
            std::this_thread::sleep_for(5ms);  // spread over the child's polling
        }
        failures += expect(wait_child(child) == 0, "every verb failed with EIO in the child");
        // Every message reached the parent's b, in order and byte-exact.
        const auto sent = wait_completions(a.cq, kMessages);
        const auto got = wait_completions(b.cq, kMessages);
        failures += expect(sent.size() == kMessages, "every SEND completed");
        failures += expect(got.size() == kMessages, "every message arrived at the parent's b");
        for (size_t i = 0; i < got.size(); ++i)
            failures += expect(got[i].status == IBV_WC_SUCCESS && got[i].wr_id == i,
                               "messages in order, successful");
        failures += expect(dst.bytes == src.bytes, "the messages' bytes");
        return failures;
    });
    CHECK(passed);
}

TEST_CASE("fork: a child opens devices of its own and runs verified traffic", "[fork]") {
    const bool passed = scenario_passes([] {
        Endpoint a(devices().a), b(devices().b);
        connect(a, b);
        const pid_t child = spawn([] {
            Endpoint c(devices().a), d(devices().b);
            if (!c.qp || !d.qp) return 2;
            connect(c, d);
            int wrong = 0;
            for (uint64_t round = 0; round < 4; ++round) {
                wrong += !verified_write_read(c, d, 100 + round);
                wrong += !verified_write_read(d, c, 200 + round);
            }
            return wrong;
        });
        // The parent's pair works at the same time.
        int failures = 0;
        for (uint64_t round = 0; round < 4; ++round)
            failures += expect(verified_write_read(a, b, 300 + round), "the parent's traffic");
        failures += expect(wait_child(child, 60s) == 0, "the child's own traffic");
        failures += expect(verified_write_read(b, a, 400), "the parent's traffic after");
        return failures;
    });
    CHECK(passed);
}
