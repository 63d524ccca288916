// The interception of libibverbs' write, exercised through libibverbs itself.
//
// There is no device here: the context comes from libibverbs' own
// _verbs_init_and_alloc_context on a /dev/null cmd_fd (its ioctl probe gets ENOTTY and picks
// the write path, as with uroce's device node), with a stand-in verbs_device around it.
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <rdma/ib_user_verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "provider/comp_channel.h"
#include "provider/got_patch.h"
#include "tests/unit/comp_channel/test_util.h"
#include "uroce/verbs_abi.h"

namespace got = uroce::provider::got;
using uroce::provider::cmd_fd_register;
using uroce::provider::cmd_fd_unregister;
using uroce::provider::comp_channel_hook_install;
using uroce::provider::comp_channel_lookup;
using uroce::test::wait_until;

namespace {

std::atomic<int> g_cq_events{0};
void count_cq_event(ibv_cq*) {
    g_cq_events.fetch_add(1);
}

got::LoadedObject libibverbs() {
    got::LoadedObject object;
    REQUIRE(got::find_object(reinterpret_cast<const void*>(&ibv_create_comp_channel), &object) ==
            0);
    return object;
}

// What libibverbs' PLT calls for `symbol` right now.
template <typename Fn>
Fn ibverbs_import(const char* symbol) {
    got::ImportSlots slots;
    REQUIRE(got::find_import_slots(libibverbs(), symbol, &slots) == 0);
    REQUIRE(slots.count >= 1);
    return reinterpret_cast<Fn>(got::load_slot(slots.slot[0]));
}

using WriteFn = ssize_t (*)(int, const void*, size_t);
using ReadFn = ssize_t (*)(int, void*, size_t);
using CloseFn = int (*)(int);

// Another interposer that patched libibverbs' write and read slots before uroce did (done
// before main, so before any test installs the hook). The hook must chain to these, not
// call libc (or ASan) directly.
std::atomic<int> g_earlier_writes{0};
std::atomic<int> g_earlier_reads{0};
WriteFn g_earlier_write_next = nullptr;
ReadFn g_earlier_read_next = nullptr;

ssize_t earlier_write(int fd, const void* buf, size_t len) {
    g_earlier_writes.fetch_add(1);
    return g_earlier_write_next(fd, buf, len);
}

ssize_t earlier_read(int fd, void* buf, size_t len) {
    g_earlier_reads.fetch_add(1);
    return g_earlier_read_next(fd, buf, len);
}

template <typename Fn>
bool patch_before_install(const char* symbol, Fn replacement, Fn* next) {
    got::LoadedObject object;
    got::ImportSlots slots;
    if (got::find_object(reinterpret_cast<const void*>(&ibv_create_comp_channel), &object) != 0 ||
        got::find_import_slots(object, symbol, &slots) != 0 || slots.count == 0) {
        return false;
    }
    *next = reinterpret_cast<Fn>(got::current_target(object, slots, symbol));
    return *next != nullptr &&
           got::store_import_slots(object, slots, reinterpret_cast<void*>(replacement)) == 0;
}

const bool g_earlier_patched =
    patch_before_install("write", earlier_write, &g_earlier_write_next) &&
    patch_before_install("read", earlier_read, &g_earlier_read_next);

// A context as a provider's alloc_context would build it, without a device.
class FakeContext {
  public:
    FakeContext() {
        REQUIRE(comp_channel_hook_install() == 0);
        device_.ops = &device_ops_;
        device_.refcount = 1;
        cmd_fd_ = open("/dev/null", O_RDWR | O_CLOEXEC);
        REQUIRE(cmd_fd_ >= 0);
        context_ = static_cast<verbs_context*>(_verbs_init_and_alloc_context(
            &device_.device, cmd_fd_, sizeof(verbs_context), nullptr, UROCE_RDMA_DRIVER_UNKNOWN));
        REQUIRE(context_ != nullptr);
        verbs_context_ops ops{};
        ops.cq_event = count_cq_event;
        verbs_set_ops(context_, &ops);
        REQUIRE(cmd_fd_register(cmd_fd_) == 0);
    }
    ~FakeContext() {
        if (context_ != nullptr) release();
    }
    FakeContext(const FakeContext&) = delete;
    FakeContext& operator=(const FakeContext&) = delete;

    ibv_context* context() { return &context_->context; }
    int cmd_fd() const { return cmd_fd_; }

    // What ibv_close_device does after the provider's free_context: libibverbs closes cmd_fd.
    void release() {
        verbs_uninit_context(context_);
        free(context_);
        context_ = nullptr;
    }

  private:
    verbs_device_ops device_ops_{};
    verbs_device device_{};
    int cmd_fd_ = -1;
    verbs_context* context_ = nullptr;
};

// A CQ as far as ibv_get_cq_event and ibv_ack_cq_events look at it.
struct FakeCq {
    explicit FakeCq(ibv_context* context, ibv_comp_channel* channel) {
        cq.context = context;
        cq.channel = channel;
        cq.cq_context = this;
        pthread_mutex_init(&cq.mutex, nullptr);
        pthread_cond_init(&cq.cond, nullptr);
    }
    ~FakeCq() {
        pthread_cond_destroy(&cq.cond);
        pthread_mutex_destroy(&cq.mutex);
    }
    FakeCq(const FakeCq&) = delete;
    FakeCq& operator=(const FakeCq&) = delete;
    uint64_t handle() { return reinterpret_cast<uintptr_t>(&cq); }
    ibv_cq cq{};
};

bool fd_is_open(int fd) {
    return fcntl(fd, F_GETFD) != -1;
}

int count_open_fds() {
    DIR* dir = opendir("/proc/self/fd");
    if (dir == nullptr) return -1;
    int count = 0;
    while (readdir(dir) != nullptr) ++count;
    closedir(dir);
    return count;
}

// The permissions /proc/self/maps shows for the page holding `address` ("r--p", ...).
std::string page_permissions(const void* address) {
    FILE* maps = fopen("/proc/self/maps", "re");
    if (maps == nullptr) return "";
    const auto target = reinterpret_cast<uintptr_t>(address);
    char line[512];
    std::string found;
    while (found.empty() && fgets(line, sizeof line, maps) != nullptr) {
        unsigned long lo = 0;
        unsigned long hi = 0;
        char perms[8] = {};
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && target >= lo && target < hi) {
            found = perms;
        }
    }
    fclose(maps);
    return found;
}

struct CreateChannelCommand {
    ib_uverbs_cmd_hdr hdr;
    ib_uverbs_create_comp_channel body;
};

CreateChannelCommand create_channel_command(ib_uverbs_create_comp_channel_resp* response) {
    CreateChannelCommand command{};
    command.hdr.command = IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL;
    command.hdr.in_words = sizeof command / 4;
    command.hdr.out_words = sizeof *response / 4;
    command.body.response = reinterpret_cast<uintptr_t>(response);
    return command;
}

}  // namespace

TEST_CASE("the hook patches libibverbs' write slots only and keeps them read-only", "[hook]") {
    REQUIRE(g_earlier_patched);
    REQUIRE(comp_channel_hook_install() == 0);
    REQUIRE(comp_channel_hook_install() == 0);  // once per process
    const got::LoadedObject object = libibverbs();
    REQUIRE(got::soname(object) != nullptr);
    CHECK(std::string(got::soname(object)).rfind("libibverbs.so.", 0) == 0);
    got::ImportSlots slots;
    REQUIRE(got::find_import_slots(object, "write", &slots) == 0);
    REQUIRE(slots.count >= 1);
    for (size_t i = 0; i < slots.count; ++i) {
        void* now = got::load_slot(slots.slot[i]);
        CHECK(now != reinterpret_cast<void*>(&earlier_write));  // redirected to uroce's
        CHECK(now != dlsym(RTLD_DEFAULT, "write"));
        CHECK(page_permissions(slots.slot[i]).rfind("r--", 0) == 0);  // RELRO restored
    }
    // read and close stay as they were: the channel fd needs no help.
    CHECK(ibverbs_import<ReadFn>("read") == &earlier_read);
    CHECK(reinterpret_cast<void*>(ibverbs_import<CloseFn>("close")) ==
          dlsym(RTLD_DEFAULT, "close"));
    got::ImportSlots none;
    CHECK(got::find_import_slots(object, "no_such_import", &none) == 0);
    CHECK(none.count == 0);
}

TEST_CASE("the command handler checks the layout as the kernel does", "[hook]") {
    using uroce::provider::detail::handle_cmd_write;
    ib_uverbs_create_comp_channel_resp response{0xffffffffu};
    CreateChannelCommand command = create_channel_command(&response);

    errno = 0;
    CHECK(handle_cmd_write(&command, 8) == -1);  // shorter than in_words says
    CHECK(errno == EINVAL);
    command.hdr.out_words = 0;
    errno = 0;
    CHECK(handle_cmd_write(&command, sizeof command) == -1);
    CHECK(errno == ENOSPC);
    command = create_channel_command(&response);
    command.body.response = 0;
    errno = 0;
    CHECK(handle_cmd_write(&command, sizeof command) == -1);
    CHECK(errno == EFAULT);
    command = create_channel_command(&response);
    command.hdr.command = 0;  // GET_CONTEXT, a kernel provider's business
    errno = 0;
    CHECK(handle_cmd_write(&command, sizeof command) == -1);
    CHECK(errno == EOPNOTSUPP);
    command.hdr.command = IB_USER_VERBS_CMD_FLAG_EXTENDED | IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL;
    errno = 0;
    CHECK(handle_cmd_write(&command, sizeof command) == -1);
    CHECK(errno == EOPNOTSUPP);
    CHECK(response.fd == 0xffffffffu);

    command = create_channel_command(&response);
    REQUIRE(handle_cmd_write(&command, sizeof command) == static_cast<ssize_t>(sizeof command));
    const int fd = static_cast<int>(response.fd);
    auto channel = comp_channel_lookup(fd);
    REQUIRE(channel);
    CHECK(channel->fd() == fd);
    CHECK(ibverbs_import<CloseFn>("close")(fd) == 0);  // what ibv_destroy_comp_channel does
    CHECK_FALSE(comp_channel_lookup(fd));
}

TEST_CASE("ibv_create_comp_channel, ibv_get_cq_event and ibv_destroy_comp_channel work", "[hook]") {
    FakeContext ctx;
    ibv_comp_channel* channel = ibv_create_comp_channel(ctx.context());
    REQUIRE(channel != nullptr);
    const int fd = channel->fd;
    auto cc = comp_channel_lookup(fd);
    REQUIRE(cc);
    CHECK(cc->fd() == fd);
    CHECK(fd_is_open(fd));
    CHECK((fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);

    FakeCq cq_a(ctx.context(), channel);
    FakeCq cq_b(ctx.context(), channel);
    const int events_before = g_cq_events.load();
    cc->notify(cq_b.handle());
    cc->notify(cq_a.handle());
    cc->notify(cq_b.handle());
    CHECK(cc->purge(cq_b.handle()) == 2);  // cq_b destroyed: its events never surface

    pollfd p{fd, POLLIN, 0};
    CHECK(poll(&p, 1, 0) == 1);
    ibv_cq* cq = nullptr;
    void* cq_context = nullptr;
    REQUIRE(ibv_get_cq_event(channel, &cq, &cq_context) == 0);
    CHECK(cq == &cq_a.cq);
    CHECK(cq_context == &cq_a);
    CHECK(g_cq_events.load() == events_before + 1);  // the provider's cq_event op ran
    ibv_ack_cq_events(cq, 1);
    CHECK(cq_a.cq.comp_events_completed == 1);
    CHECK(poll(&p, 1, 0) == 0);
    // The fd carries the kernel's record itself: {u64 cq_handle}.
    cc->notify(cq_b.handle());
    uint64_t record = 0;
    REQUIRE(read(fd, &record, sizeof record) == static_cast<ssize_t>(sizeof record));
    CHECK(record == cq_b.handle());
    CHECK(poll(&p, 1, 0) == 0);

    // UCX's way: non-blocking fd, drain until EAGAIN.
    REQUIRE(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) == 0);
    errno = 0;
    CHECK(ibv_get_cq_event(channel, &cq, &cq_context) == -1);
    CHECK(errno == EAGAIN);

    // A blocking reader in ibv_get_cq_event wakes on notify.
    REQUIRE(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) == 0);
    std::atomic<bool> done{false};
    ibv_cq* woken = nullptr;
    std::thread reader([&] {
        void* unused = nullptr;
        if (ibv_get_cq_event(channel, &woken, &unused) == 0) ibv_ack_cq_events(woken, 1);
        done = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    cc->notify(cq_a.handle());
    const bool woke = wait_until([&] { return done.load(); });
    if (!woke) cc->notify(cq_a.handle());
    reader.join();
    CHECK(woke);
    CHECK(woken == &cq_a.cq);

    channel->refcnt = 1;  // a CQ still attached
    CHECK(ibv_destroy_comp_channel(channel) == EBUSY);
    CHECK(comp_channel_lookup(fd));
    channel->refcnt = 0;
    cc->notify(cq_a.handle());  // a late event from a progress thread
    cc.reset();
    REQUIRE(ibv_destroy_comp_channel(channel) == 0);
    CHECK_FALSE(comp_channel_lookup(fd));
    CHECK_FALSE(fd_is_open(fd));
    uroce::provider::detail::sweep_channels();
}

TEST_CASE("commands other than channel creation fail with EOPNOTSUPP", "[hook]") {
    FakeContext ctx;
    auto ibv_write = ibverbs_import<WriteFn>("write");
    ib_uverbs_create_comp_channel_resp response{};
    CreateChannelCommand command = create_channel_command(&response);
    command.hdr.command = 3;  // ALLOC_PD
    errno = 0;
    CHECK(ibv_write(ctx.cmd_fd(), &command, sizeof command) == -1);
    CHECK(errno == EOPNOTSUPP);
}

TEST_CASE("a cmd_fd number closed and reused, or unregistered, is passed through", "[hook]") {
    auto ibv_write = ibverbs_import<WriteFn>("write");
    ib_uverbs_create_comp_channel_resp response{0x5a5a5a5au};
    CreateChannelCommand command = create_channel_command(&response);
    int pipe_fds[2];
    REQUIRE(pipe2(pipe_fds, O_CLOEXEC) == 0);

    SECTION("closed by verbs_uninit_context") {
        FakeContext ctx;
        const int number = ctx.cmd_fd();
        ctx.release();  // libibverbs closes cmd_fd; the provider is not told
        CHECK_FALSE(fd_is_open(number));
        REQUIRE(dup3(pipe_fds[1], number, O_CLOEXEC) == number);  // the number comes back
        CHECK(ibv_write(number, &command, sizeof command) == static_cast<ssize_t>(sizeof command));
        close(number);
    }
    SECTION("unregistered by the provider") {
        FakeContext ctx;
        cmd_fd_unregister(ctx.cmd_fd());
        // A write to /dev/null "succeeds" untouched: this is what an unhooked write does.
        CHECK(ibv_write(ctx.cmd_fd(), &command, sizeof command) ==
              static_cast<ssize_t>(sizeof command));
        REQUIRE(cmd_fd_register(ctx.cmd_fd()) == 0);
    }
    CHECK(response.fd == 0x5a5a5a5au);  // passed through: no channel was made
    close(pipe_fds[0]);
    close(pipe_fds[1]);
}

TEST_CASE("a channel number the app closed itself and reused is not taken for the channel",
          "[hook]") {
    FakeContext ctx;
    ibv_comp_channel* channel = ibv_create_comp_channel(ctx.context());
    REQUIRE(channel != nullptr);
    const int number = channel->fd;
    auto cc = comp_channel_lookup(number);
    REQUIRE(cc);
    int pipe_fds[2];
    REQUIRE(pipe2(pipe_fds, O_CLOEXEC) == 0);
    // The app closes the channel's fd itself (not through libibverbs) and the number is
    // reused at once: dup3 does both.
    REQUIRE(dup3(pipe_fds[0], number, O_CLOEXEC) == number);
    CHECK_FALSE(comp_channel_lookup(number));  // ibv_create_cq on it would fail
    cc->notify(1);                             // nothing is written into the other pipe
    pollfd p{number, POLLIN, 0};
    CHECK(poll(&p, 1, 0) == 0);
    cc.reset();
    CHECK(uroce::provider::detail::sweep_channels() == 0);  // the channel is gone
    CHECK(fd_is_open(number));                              // but not the app's new file
    CHECK(ibv_destroy_comp_channel(channel) == 0);          // closes the pipe end under that number
    CHECK_FALSE(fd_is_open(number));
    close(pipe_fds[0]);
    close(pipe_fds[1]);
}

TEST_CASE("channels created and destroyed from several threads leak nothing", "[hook]") {
    FakeContext ctx;
    uroce::provider::detail::sweep_channels();  // what earlier cases left
    const int fds_before = count_open_fds();
    constexpr int kThreads = 4;
    constexpr int kRounds = 200;
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&] {
            for (int i = 0; i < kRounds; ++i) {
                ibv_comp_channel* channel = ibv_create_comp_channel(ctx.context());
                if (channel == nullptr) {
                    failures.fetch_add(1);
                    continue;
                }
                auto cc = comp_channel_lookup(channel->fd);
                if (!cc) {
                    failures.fetch_add(1);
                } else {
                    cc->notify(static_cast<uint64_t>(i));
                    uint64_t handle = 0;
                    if (read(channel->fd, &handle, sizeof handle) != 8 ||
                        handle != static_cast<uint64_t>(i)) {
                        failures.fetch_add(1);
                    }
                }
                cc.reset();
                if (ibv_destroy_comp_channel(channel) != 0) failures.fetch_add(1);
            }
        });
    }
    for (auto& thread : threads) thread.join();
    CHECK(failures.load() == 0);
    // Each creation drops the channels closed before it; the last ones go at the next
    // creation or when a context unregisters its cmd_fd.
    CHECK(uroce::provider::detail::sweep_channels() == 0);
    CHECK(count_open_fds() == fds_before);
}
