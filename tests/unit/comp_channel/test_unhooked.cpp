// When the write hook cannot be installed, ibv_create_comp_channel fails with EPERM and one
// stderr line says why; nothing is left half patched. A process of its own: the hook is
// installed once per process, so this one must never have succeeded. libibverbs' GOT is
// made unwritable for real, by a seccomp filter that fails mprotect on the page of its
// write slot with EACCES (what a sealed GOT or a strict security policy does).
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <rdma/rdma_user_ioctl_cmds.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "provider/comp_channel.h"
#include "provider/got_patch.h"
#include "uroce/verbs_abi.h"

namespace got = uroce::provider::got;
using uroce::provider::comp_channel_attach;

namespace {

// Fails mprotect(page, ...) with EACCES for this thread and any it starts; everything else
// passes. false if the kernel refuses filters here.
bool forbid_mprotect_of(uintptr_t page) {
    const auto lo = static_cast<uint32_t>(page);
    const auto hi = static_cast<uint32_t>(page >> 32);
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mprotect, 0, 5),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[0])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, lo, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[0]) + 4),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, hi, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EACCES & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog program{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
           prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0;
}

// stderr goes to a file while this lives; text() is what was written.
class CapturedStderr {
  public:
    CapturedStderr() {
        fflush(stderr);
        saved_ = dup(2);
        char name[] = "/tmp/uroce-stderr-XXXXXX";
        file_ = mkstemp(name);
        REQUIRE(file_ >= 0);
        unlink(name);
        REQUIRE(dup2(file_, 2) == 2);
    }
    ~CapturedStderr() { restore(); }
    CapturedStderr(const CapturedStderr&) = delete;
    CapturedStderr& operator=(const CapturedStderr&) = delete;
    std::string text() {
        restore();
        std::string out;
        char buf[512];
        ssize_t got;
        lseek(file_, 0, SEEK_SET);
        while ((got = read(file_, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(got));
        return out;
    }

  private:
    void restore() {
        if (saved_ < 0) return;
        fflush(stderr);
        dup2(saved_, 2);
        close(saved_);
        saved_ = -1;
    }
    int saved_ = -1;
    int file_ = -1;
};

// A context as libibverbs builds it for a provider, on a /dev/null cmd_fd (see test_hook.cpp).
class FakeContext {
  public:
    FakeContext() {
        device_.ops = &device_ops_;
        device_.refcount = 1;
        cmd_fd_ = open("/dev/null", O_RDWR | O_CLOEXEC);
        REQUIRE(cmd_fd_ >= 0);
        context_ = static_cast<verbs_context*>(_verbs_init_and_alloc_context(
            &device_.device, cmd_fd_, sizeof(verbs_context), nullptr, UROCE_RDMA_DRIVER_UNKNOWN));
        REQUIRE(context_ != nullptr);
    }
    ~FakeContext() {
        verbs_uninit_context(context_);
        free(context_);
    }
    FakeContext(const FakeContext&) = delete;
    FakeContext& operator=(const FakeContext&) = delete;
    ibv_context* context() { return &context_->context; }
    int cmd_fd() const { return cmd_fd_; }

  private:
    verbs_device_ops device_ops_{};
    verbs_device device_{};
    int cmd_fd_ = -1;
    verbs_context* context_ = nullptr;
};

size_t count_lines(const std::string& text) {
    size_t lines = 0;
    for (char c : text) lines += c == '\n' ? 1 : 0;
    return lines;
}

}  // namespace

TEST_CASE("without the hook, channel creation fails with EPERM and says why once", "[unhooked]") {
    got::LoadedObject ibverbs;
    REQUIRE(got::find_object(reinterpret_cast<const void*>(&ibv_create_comp_channel), &ibverbs) ==
            0);
    got::ImportSlots slots;
    REQUIRE(got::find_import_slots(ibverbs, "write", &slots) == 0);
    REQUIRE(slots.count >= 1);
    void* const before = got::load_slot(slots.slot[0]);
    const auto page = reinterpret_cast<uintptr_t>(slots.slot[0]) &
                      ~static_cast<uintptr_t>(sysconf(_SC_PAGESIZE) - 1);
    if (!forbid_mprotect_of(page)) {
        printf("skip - comp_channel unhooked: seccomp filters refused here\n");
        exit(77);
    }

    FakeContext first;
    CapturedStderr captured;
    CHECK(comp_channel_attach(first.cmd_fd()) == EACCES);
    errno = 0;
    CHECK(ibv_create_comp_channel(first.context()) == nullptr);
    CHECK(errno == EPERM);
    // ioctl still says ENOTTY, so libibverbs keeps using its sysfs fallbacks.
    char header[64] = {};
    errno = 0;
    CHECK(ioctl(first.cmd_fd(), RDMA_VERBS_IOCTL, header) == -1);
    CHECK(errno == ENOTTY);

    // A second context: the same answer, no second line.
    FakeContext second;
    CHECK(comp_channel_attach(second.cmd_fd()) == EACCES);
    errno = 0;
    CHECK(ibv_create_comp_channel(second.context()) == nullptr);
    CHECK(errno == EPERM);

    const std::string text = captured.text();
    INFO(text);
    CHECK(count_lines(text) == 1);
    CHECK(text.rfind("uroce: completion channels unavailable", 0) == 0);
    CHECK(text.find("EACCES") != std::string::npos);
    CHECK(text.find("fails with EPERM") != std::string::npos);
    for (size_t i = 0; i < slots.count; ++i) CHECK(got::load_slot(slots.slot[i]) == before);
}
