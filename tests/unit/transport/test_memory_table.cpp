// MemoryTable: registration, and the key, protection-domain, bounds and access checks that
// guard every local and remote access.
#include <array>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "transport/memory_table.h"

using namespace uroce::transport;

namespace {

constexpr uint32_t kPd = 3;
constexpr uint32_t kOtherPd = 4;
constexpr uint32_t kAllAccess = kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic;
constexpr uint64_t kAddr = 0x10000;
constexpr uint64_t kLen = 4096;

}  // namespace

TEST_CASE("MemoryTable add and remove", "[memory]") {
    MemoryTable t;
    CHECK(t.size() == 0);
    const MemoryKeys a = t.add(kPd, kAddr, kLen, kAddr, kAllAccess);
    const MemoryKeys b = t.add(kPd, kAddr, kLen, kAddr, kAllAccess);
    CHECK(t.size() == 2);
    // Four distinct keys: lkey and rkey of one region differ, two regions share none.
    const std::set<uint32_t> keys{a.lkey, a.rkey, b.lkey, b.rkey};
    CHECK(keys.size() == 4);

    // An rkey is not an lkey: remove() takes lkeys only.
    CHECK_FALSE(t.remove(a.rkey));
    CHECK(t.size() == 2);
    CHECK(t.remove(a.lkey));
    CHECK(t.size() == 1);
    CHECK_FALSE(t.remove(a.lkey));
    CHECK_FALSE(t.remove(0));
    CHECK_FALSE(t.remove(0xdeadbeef));
    CHECK(t.size() == 1);

    // The survivor still works, the removed region no longer does.
    uint64_t local = 0;
    CHECK(t.check_local(b.lkey, kPd, kAddr, kLen, kLocalWrite) == KeyCheck::Ok);
    CHECK(t.check_remote(b.rkey, kPd, kAddr, kLen, kRemoteRead, local) == KeyCheck::Ok);
    CHECK(t.check_local(a.lkey, kPd, kAddr, kLen, 0) == KeyCheck::BadKey);
    CHECK(t.check_remote(a.rkey, kPd, kAddr, kLen, 0, local) == KeyCheck::BadKey);

    CHECK(t.remove(b.lkey));
    CHECK(t.size() == 0);
}

TEST_CASE("MemoryTable keys are not reused after removal", "[memory]") {
    MemoryTable t;
    std::set<uint32_t> seen;
    std::vector<MemoryKeys> removed;
    for (int i = 0; i < 1000; ++i) {
        const MemoryKeys k = t.add(kPd, kAddr, kLen, kAddr, kAllAccess);
        CHECK(seen.insert(k.lkey).second);
        CHECK(seen.insert(k.rkey).second);
        if (i % 2 == 0) {
            CHECK(t.remove(k.lkey));
            removed.push_back(k);
        }
    }
    CHECK(t.size() == 500);
    uint64_t local = 0;
    for (const MemoryKeys& k : removed) {
        CHECK(t.check_local(k.lkey, kPd, kAddr, 1, 0) == KeyCheck::BadKey);
        CHECK(t.check_remote(k.rkey, kPd, kAddr, 1, 0, local) == KeyCheck::BadKey);
    }
}

TEST_CASE("MemoryTable rejects unknown keys and keys of the wrong kind", "[memory]") {
    MemoryTable t;
    const MemoryKeys k = t.add(kPd, kAddr, kLen, kAddr, kAllAccess);
    uint64_t local = 0;

    SECTION("unknown") {
        for (uint32_t key : {0u, 1u, 0xffffffffu, k.lkey + 0x100, k.rkey + 0x100}) {
            CHECK(t.check_local(key, kPd, kAddr, 1, 0) == KeyCheck::BadKey);
            CHECK(t.check_remote(key, kPd, kAddr, 1, 0, local) == KeyCheck::BadKey);
        }
    }
    SECTION("lkey used as an rkey") {
        CHECK(t.check_remote(k.lkey, kPd, kAddr, 1, kRemoteRead, local) == KeyCheck::BadKey);
    }
    SECTION("rkey used as an lkey") {
        CHECK(t.check_local(k.rkey, kPd, kAddr, 1, kLocalWrite) == KeyCheck::BadKey);
    }
    SECTION("removed") {
        REQUIRE(t.remove(k.lkey));
        CHECK(t.check_local(k.lkey, kPd, kAddr, 1, 0) == KeyCheck::BadKey);
        CHECK(t.check_remote(k.rkey, kPd, kAddr, 1, 0, local) == KeyCheck::BadKey);
    }
}

TEST_CASE("MemoryTable rejects a key of another protection domain", "[memory]") {
    MemoryTable t;
    const MemoryKeys k = t.add(kPd, kAddr, kLen, kAddr, kAllAccess);
    const MemoryKeys other = t.add(kOtherPd, kAddr, kLen, kAddr, kAllAccess);
    uint64_t local = 0;
    CHECK(t.check_local(k.lkey, kOtherPd, kAddr, 1, 0) == KeyCheck::WrongPd);
    CHECK(t.check_remote(k.rkey, kOtherPd, kAddr, 1, 0, local) == KeyCheck::WrongPd);
    CHECK(t.check_local(other.lkey, kPd, kAddr, 1, 0) == KeyCheck::WrongPd);
    CHECK(t.check_remote(other.rkey, kPd, kAddr, 1, 0, local) == KeyCheck::WrongPd);
    CHECK(t.check_local(other.lkey, kOtherPd, kAddr, 1, 0) == KeyCheck::Ok);
    // The domain is checked before the range and the rights: a foreign key learns nothing
    // about the region behind it.
    CHECK(t.check_local(k.lkey, kOtherPd, kAddr - 1, kLen + 2, kAllAccess) == KeyCheck::WrongPd);
    CHECK(t.check_remote(k.rkey, kOtherPd, 0, UINT64_MAX, kAllAccess, local) == KeyCheck::WrongPd);
}

TEST_CASE("MemoryTable bounds checks", "[memory]") {
    MemoryTable t;
    // Remote addresses live in a different space than local ones.
    constexpr uint64_t kIova = 0x7f0000000000;
    const MemoryKeys k = t.add(kPd, kAddr, kLen, kIova, kAllAccess);

    struct Case {
        const char* what;
        uint64_t offset;  // from the start of the region; may "underflow" on purpose
        uint64_t length;
        KeyCheck expected;
    };
    const Case cases[] = {
        {"whole region", 0, kLen, KeyCheck::Ok},
        {"first byte", 0, 1, KeyCheck::Ok},
        {"last byte", kLen - 1, 1, KeyCheck::Ok},
        {"middle", 100, 200, KeyCheck::Ok},
        {"zero bytes at the start", 0, 0, KeyCheck::Ok},
        {"one byte before", UINT64_MAX, 1, KeyCheck::OutOfBounds},
        {"one byte before, running into the region", UINT64_MAX, 2, KeyCheck::OutOfBounds},
        {"one byte past the end", kLen, 1, KeyCheck::OutOfBounds},
        {"one byte too long", 0, kLen + 1, KeyCheck::OutOfBounds},
        {"last byte and one more", kLen - 1, 2, KeyCheck::OutOfBounds},
        {"far past the end", 1ull << 40, 1, KeyCheck::OutOfBounds},
        {"length UINT64_MAX", 0, UINT64_MAX, KeyCheck::OutOfBounds},
        {"length UINT64_MAX from the second byte", 1, UINT64_MAX, KeyCheck::OutOfBounds},
        // addr + length wraps around to inside the region.
        {"length wrapping to the start", 16, UINT64_MAX - 15, KeyCheck::OutOfBounds},
        {"length wrapping into the region", kLen - 1, UINT64_MAX - kLen + 10,
         KeyCheck::OutOfBounds},
    };
    for (const Case& c : cases) {
        INFO(c.what);
        CHECK(t.check_local(k.lkey, kPd, kAddr + c.offset, c.length, kLocalWrite) == c.expected);
        uint64_t local = 0;
        CHECK(t.check_remote(k.rkey, kPd, kIova + c.offset, c.length, kRemoteWrite, local) ==
              c.expected);
    }

    SECTION("local checks use the local address, remote checks the iova") {
        uint64_t local = 0;
        CHECK(t.check_local(k.lkey, kPd, kIova, 1, 0) == KeyCheck::OutOfBounds);
        CHECK(t.check_remote(k.rkey, kPd, kAddr, 1, 0, local) == KeyCheck::OutOfBounds);
    }
}

TEST_CASE("MemoryTable checks a region at the very top of the address space", "[memory]") {
    MemoryTable t;
    const uint64_t top = UINT64_MAX - kLen + 1;  // the region ends exactly at 2^64
    const MemoryKeys k = t.add(kPd, top, kLen, top, kAllAccess);
    uint64_t local = 0;
    CHECK(t.check_local(k.lkey, kPd, top, kLen, 0) == KeyCheck::Ok);
    CHECK(t.check_local(k.lkey, kPd, UINT64_MAX, 1, 0) == KeyCheck::Ok);
    CHECK(t.check_local(k.lkey, kPd, UINT64_MAX, 2, 0) == KeyCheck::OutOfBounds);
    CHECK(t.check_local(k.lkey, kPd, top - 1, 1, 0) == KeyCheck::OutOfBounds);
    CHECK(t.check_remote(k.rkey, kPd, UINT64_MAX, 1, 0, local) == KeyCheck::Ok);
    CHECK(local == UINT64_MAX);
    CHECK(t.check_remote(k.rkey, kPd, top + 1, UINT64_MAX, 0, local) == KeyCheck::OutOfBounds);
}

TEST_CASE("MemoryTable access rights, bit by bit", "[memory]") {
    MemoryTable t;
    const std::array<uint32_t, 4> bits{kLocalWrite, kRemoteWrite, kRemoteRead, kRemoteAtomic};
    for (uint32_t granted = 0; granted < 16; ++granted) {
        const MemoryKeys k = t.add(kPd, kAddr, kLen, kAddr, granted);
        for (uint32_t asked = 0; asked < 16; ++asked) {
            const KeyCheck expected = (asked & ~granted) == 0 ? KeyCheck::Ok : KeyCheck::NoAccess;
            INFO("granted " << granted << " asked " << asked);
            uint64_t local = 0;
            CHECK(t.check_local(k.lkey, kPd, kAddr, kLen, asked) == expected);
            CHECK(t.check_remote(k.rkey, kPd, kAddr, kLen, asked, local) == expected);
        }
        // Each missing bit on its own is refused.
        for (uint32_t bit : bits) {
            if (granted & bit) continue;
            uint64_t local = 0;
            CHECK(t.check_local(k.lkey, kPd, kAddr, 1, bit) == KeyCheck::NoAccess);
            CHECK(t.check_remote(k.rkey, kPd, kAddr, 1, bit, local) == KeyCheck::NoAccess);
        }
    }
    // The range is checked before the rights.
    const MemoryKeys none = t.add(kPd, kAddr, kLen, kAddr, 0);
    CHECK(t.check_local(none.lkey, kPd, kAddr, kLen + 1, kLocalWrite) == KeyCheck::OutOfBounds);
}

TEST_CASE("MemoryTable translates iova to the local address", "[memory]") {
    MemoryTable t;
    std::vector<uint8_t> buffer(kLen);
    const uint64_t addr = reinterpret_cast<uint64_t>(buffer.data());
    constexpr uint64_t kIova = 0x1000;  // below the buffer, so va - iova != va - addr
    const MemoryKeys k = t.add(kPd, addr, kLen, kIova, kRemoteRead | kRemoteWrite);

    uint64_t local = 0;
    REQUIRE(t.check_remote(k.rkey, kPd, kIova, kLen, kRemoteRead, local) == KeyCheck::Ok);
    CHECK(local == addr);
    REQUIRE(t.check_remote(k.rkey, kPd, kIova + 123, 10, kRemoteWrite, local) == KeyCheck::Ok);
    CHECK(local == addr + 123);
    REQUIRE(t.check_remote(k.rkey, kPd, kIova + kLen - 1, 1, kRemoteRead, local) == KeyCheck::Ok);
    CHECK(local == addr + kLen - 1);

    // A failed check leaves `local` alone.
    local = 42;
    CHECK(t.check_remote(k.rkey, kPd, kIova + kLen, 1, kRemoteRead, local) ==
          KeyCheck::OutOfBounds);
    CHECK(t.check_remote(k.rkey, kPd, kIova, 1, kRemoteAtomic, local) == KeyCheck::NoAccess);
    CHECK(t.check_remote(k.rkey, kOtherPd, kIova, 1, kRemoteRead, local) == KeyCheck::WrongPd);
    CHECK(local == 42);

    // Two regions over the same memory with different iovas translate independently.
    const MemoryKeys k2 = t.add(kPd, addr + 64, 64, 0xabc000, kRemoteRead);
    REQUIRE(t.check_remote(k2.rkey, kPd, 0xabc000 + 5, 1, kRemoteRead, local) == KeyCheck::Ok);
    CHECK(local == addr + 64 + 5);
}

TEST_CASE("MemoryTable zero-length region", "[memory]") {
    MemoryTable t;
    const MemoryKeys k = t.add(kPd, kAddr, 0, 0x5000, kAllAccess);
    CHECK(t.size() == 1);
    uint64_t local = 0;
    CHECK(t.check_local(k.lkey, kPd, kAddr, 0, kLocalWrite) == KeyCheck::Ok);
    CHECK(t.check_remote(k.rkey, kPd, 0x5000, 0, kRemoteWrite, local) == KeyCheck::Ok);
    CHECK(local == kAddr);
    CHECK(t.check_local(k.lkey, kPd, kAddr, 1, kLocalWrite) == KeyCheck::OutOfBounds);
    CHECK(t.check_local(k.lkey, kPd, kAddr + 1, 0, kLocalWrite) == KeyCheck::OutOfBounds);
    CHECK(t.check_local(k.lkey, kPd, kAddr - 1, 0, kLocalWrite) == KeyCheck::OutOfBounds);
    CHECK(t.check_remote(k.rkey, kPd, 0x5000, 1, kRemoteWrite, local) == KeyCheck::OutOfBounds);
    CHECK(t.check_remote(k.rkey, kPd, 0x5001, 0, kRemoteWrite, local) == KeyCheck::OutOfBounds);
    CHECK(t.remove(k.lkey));
    CHECK(t.check_local(k.lkey, kPd, kAddr, 0, 0) == KeyCheck::BadKey);
}

TEST_CASE("MemoryTable remove waits for accesses in progress", "[memory]") {
    MemoryTable t;
    const MemoryKeys k = t.add(kPd, kAddr, kLen, kAddr, kAllAccess);
    std::future<bool> removed;
    {
        auto guard = t.lock_shared();
        REQUIRE(t.check_local(k.lkey, kPd, kAddr, 1, 0) == KeyCheck::Ok);
        removed = std::async(std::launch::async, [&t, &k] { return t.remove(k.lkey); });
        // While the access is in progress the region stays.
        CHECK(removed.wait_for(std::chrono::milliseconds(100)) == std::future_status::timeout);
        CHECK(t.check_local(k.lkey, kPd, kAddr, 1, 0) == KeyCheck::Ok);
    }
    REQUIRE(removed.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
    CHECK(removed.get());
    CHECK(t.check_local(k.lkey, kPd, kAddr, 1, 0) == KeyCheck::BadKey);
}

TEST_CASE("MemoryTable checks and registrations from many threads", "[memory]") {
    MemoryTable t;
    const MemoryKeys stable = t.add(kPd, kAddr, kLen, kAddr, kAllAccess);
    std::atomic<bool> failed{false};
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
        threads.emplace_back([&t, &failed] {
            for (int n = 0; n < 2000; ++n) {
                const MemoryKeys k = t.add(kPd, kAddr, kLen, kAddr, kRemoteRead);
                if (!t.remove(k.lkey)) failed = true;
            }
        });
    }
    threads.emplace_back([&t, &failed, stable] {
        for (int n = 0; n < 4000; ++n) {
            auto guard = t.lock_shared();
            uint64_t local = 0;
            if (t.check_remote(stable.rkey, kPd, kAddr, kLen, kRemoteWrite, local) != KeyCheck::Ok)
                failed = true;
        }
    });
    for (auto& th : threads) th.join();
    CHECK_FALSE(failed);
    CHECK(t.size() == 1);
}

TEST_CASE("KeyCheck names", "[memory]") {
    for (KeyCheck c : {KeyCheck::Ok, KeyCheck::BadKey, KeyCheck::WrongPd, KeyCheck::OutOfBounds,
                       KeyCheck::NoAccess}) {
        CHECK(to_string(c) != std::string("?"));
    }
}

// A key holds a 24-bit registration index, which wraps after 2^24 registrations: the
// wrapped index must skip the keys of regions still registered (here the first one),
// rather than hand them out again for another region.
TEST_CASE("MemoryTable keys stay unique past 2^24 registrations", "[memory]") {
    MemoryTable t;
    const MemoryKeys first = t.add(kPd, kAddr, kLen, kAddr, kRemoteRead);
    size_t remove_failures = 0;
    for (uint32_t i = 0; i < (1u << 24) - 1; ++i) {
        const MemoryKeys k = t.add(kPd, 0x9000, 16, 0x9000, 0);
        remove_failures += !t.remove(k.lkey);
    }
    CHECK(remove_failures == 0);
    const MemoryKeys next = t.add(kOtherPd, 0x50000, 64, 0x50000, kRemoteWrite);
    CHECK(t.size() == 2);
    CHECK(next.lkey != first.lkey);
    CHECK(next.rkey != first.rkey);
    uint64_t local = 0;
    CHECK(t.check_remote(next.rkey, kOtherPd, 0x50000, 64, kRemoteWrite, local) == KeyCheck::Ok);
    CHECK(local == 0x50000);
    // The first region is what it was.
    CHECK(t.check_remote(first.rkey, kPd, kAddr, kLen, kRemoteRead, local) == KeyCheck::Ok);
}

TEST_CASE("MemoryTable type 2 windows: bound from free only, freed with their QP", "[memory]") {
    MemoryTable t;
    const MemoryKeys mr = t.add(kPd, kAddr, kLen, kAddr, kAllAccess | kMwBind);
    auto bind = [&](uint32_t rkey, uint32_t qpn, uint64_t length = 64) {
        MemoryTable::WindowBind b;
        b.mr_lkey = mr.lkey;
        b.addr = kAddr;
        b.length = length;
        b.access = kRemoteWrite;
        b.qpn = qpn;
        const uint32_t next = (rkey & 0xffffff00u) | ((rkey + 1) & 0xffu);
        return std::pair{t.bind_window(rkey, next, kPd, b), next};
    };
    auto reaches = [&](uint32_t rkey, uint32_t qpn) {
        uint64_t local = 0;
        return t.check_remote(rkey, kPd, kAddr, 8, kRemoteWrite, local, qpn) == KeyCheck::Ok;
    };
    const uint32_t w1 = t.add_window(kPd, true), w2 = t.add_window(kPd, true);
    const uint32_t w3 = t.add_window(kPd, true);
    CHECK(bind(w1, 7, 0).first != KeyCheck::Ok);  // length 0: no bind, no invalidation
    auto [r1c, r1] = bind(w1, 7);
    auto [r2c, r2] = bind(w2, 7);
    auto [r3c, r3] = bind(w3, 8);
    REQUIRE((r1c == KeyCheck::Ok && r2c == KeyCheck::Ok && r3c == KeyCheck::Ok));
    CHECK(bind(r1, 7).first != KeyCheck::Ok);  // bound: not again before invalidation
    CHECK(reaches(r1, 7));
    CHECK_FALSE(reaches(r1, 8));
    t.invalidate_windows_of(7);
    CHECK_FALSE(reaches(r1, 7));
    CHECK_FALSE(reaches(r2, 7));
    CHECK(reaches(r3, 8));  // another QP's window stays
    // Free again: they may be bound anew.
    auto [again, r1b] = bind(r1, 9);
    CHECK(again == KeyCheck::Ok);
    CHECK(reaches(r1b, 9));
    REQUIRE(t.invalidate_window(r1b, kPd, 0) == KeyCheck::Ok);
    CHECK_FALSE(reaches(r1b, 9));
    CHECK(bind(r1b, 9).first == KeyCheck::Ok);
    CHECK(t.remove_window(r3));
    t.invalidate_windows_of(8);  // nothing of 8's is left
}

TEST_CASE("MemoryTable deregister keeps a region windows are bound to", "[memory]") {
    MemoryTable t;
    const MemoryKeys mr = t.add(kPd, kAddr, kLen, kAddr, kAllAccess | kMwBind);
    auto bind = [&](uint32_t rkey, uint32_t qpn, uint64_t length) {
        MemoryTable::WindowBind b{mr.lkey, kAddr, length, kRemoteWrite, qpn};
        const uint32_t next = (rkey & 0xffffff00u) | ((rkey + 1) & 0xffu);
        REQUIRE(t.bind_window(rkey, next, kPd, b) == KeyCheck::Ok);
        return next;
    };
    using R = MemoryTable::Removal;
    const uint32_t w2 = bind(t.add_window(kPd, true), 7, 64);    // type 2, on QP 7
    const uint32_t w1a = bind(t.add_window(kPd, false), 0, 64);  // type 1, bound twice
    const uint32_t w1b = bind(w1a, 0, 32);
    CHECK(t.deregister(mr.lkey) == R::WindowsBound);
    // ibv_rereg_mr is refused alike, and changes nothing.
    using M = MemoryTable::Modification;
    MemoryTable::Change to_other_pd;
    to_other_pd.pd = kOtherPd;
    CHECK(t.modify(mr.lkey, to_other_pd) == M::WindowsBound);
    uint64_t local = 0;
    CHECK(t.check_remote(w1b, kPd, kAddr, 32, kRemoteWrite, local) == KeyCheck::Ok);
    t.invalidate_windows_of(7);  // QP 7 is gone: its window lets go
    CHECK(t.deregister(mr.lkey) == R::WindowsBound);
    const uint32_t w1c = bind(w1b, 0, 0);  // a zero-length bind unbinds a type 1 window
    CHECK(t.modify(mr.lkey, MemoryTable::Change{}) == M::Modified);
    CHECK(t.deregister(mr.lkey) == R::Removed);
    CHECK(t.deregister(mr.lkey) == R::NoRegion);
    CHECK(t.remove_window(w2));
    CHECK(t.remove_window(w1c));
    // A freed window lets go too.
    const MemoryKeys mr2 = t.add(kPd, kAddr, kLen, kAddr, kAllAccess | kMwBind);
    MemoryTable::WindowBind b{mr2.lkey, kAddr, 64, kRemoteWrite, 0};
    const uint32_t w = t.add_window(kPd, false);
    const uint32_t wb = (w & 0xffffff00u) | ((w + 1) & 0xffu);
    REQUIRE(t.bind_window(w, wb, kPd, b) == KeyCheck::Ok);
    CHECK(t.deregister(mr2.lkey) == R::WindowsBound);
    CHECK(t.remove_window(wb));
    CHECK(t.deregister(mr2.lkey) == R::Removed);
}
