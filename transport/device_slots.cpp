// The device's slot table: see device_slots.h.
#include "transport/device_slots.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "transport/random_source.h"

namespace uroce::transport {

namespace {

constexpr char kMagic[8] = {'u', 'r', 'o', 'c', 'e', 's', 'l', '1'};
constexpr off_t kSharedValueAt = 8;
constexpr off_t kEntriesAt = 64;
static_assert(kSharedValueAt + DeviceSlot::kSharedValues * sizeof(uint32_t) <= kEntriesAt);
// Locks live past the end of the data: byte 0 guards the table, byte kSlotLocksAt + n
// belongs to the holder of slot n.
constexpr off_t kTableLock = 0;
constexpr off_t kSlotLocksAt = 1 << 20;

enum : uint32_t { kFree = 0, kHeld = 1 };

struct Entry {
    uint64_t released_ns;  // CLOCK_BOOTTIME when last released (0: never used)
    uint32_t state;
    uint32_t pid;  // of the holder, for people reading the file; liveness is the lock
};
static_assert(sizeof(Entry) == 16);

using Table = std::array<Entry, DeviceSlots::kSlots>;

uint64_t now_ns() {
    timespec ts{};
    ::clock_gettime(CLOCK_BOOTTIME, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

int ofd_lock(int fd, int cmd, short type, off_t at) {
    struct flock fl {};
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = at;
    fl.l_len = 1;
    int rc;
    do rc = ::fcntl(fd, cmd, &fl);
    while (rc != 0 && errno == EINTR);
    return rc == 0 ? 0 : errno;
}

// True if some other open file description holds slot n's lock (its holder is alive).
bool held_by_someone(int fd, unsigned n) {
    struct flock fl {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = kSlotLocksAt + static_cast<off_t>(n);
    fl.l_len = 1;
    if (::fcntl(fd, F_OFD_GETLK, &fl) != 0) return true;  // cannot tell: treat as held
    return fl.l_type != F_UNLCK;
}

// Holds the table lock for its lifetime.
class TableLock {
  public:
    explicit TableLock(int fd) : fd_(fd), err_(ofd_lock(fd, F_OFD_SETLKW, F_WRLCK, kTableLock)) {}
    ~TableLock() {
        if (err_ == 0) ofd_lock(fd_, F_OFD_SETLK, F_UNLCK, kTableLock);
    }
    TableLock(const TableLock&) = delete;
    TableLock& operator=(const TableLock&) = delete;
    int error() const { return err_; }

  private:
    int fd_;
    int err_;
};

bool read_table(int fd, Table& t) {
    t = {};
    char magic[sizeof kMagic] = {};
    const ssize_t m = ::pread(fd, magic, sizeof magic, 0);
    if (m == 0) return true;  // a new file: every slot free, never used
    if (m != static_cast<ssize_t>(sizeof magic) || std::memcmp(magic, kMagic, sizeof magic) != 0)
        return false;
    // Entries never written yet lie past the end of the file: they read as zeros (free).
    const ssize_t n = ::pread(fd, t.data(), sizeof t, kEntriesAt);
    return n >= 0 && n % static_cast<ssize_t>(sizeof(Entry)) == 0;
}

bool write_entry(int fd, unsigned n, const Entry& e) {
    if (::pwrite(fd, kMagic, sizeof kMagic, 0) != static_cast<ssize_t>(sizeof kMagic)) return false;
    const off_t at = kEntriesAt + static_cast<off_t>(n * sizeof(Entry));
    return ::pwrite(fd, &e, sizeof e, at) == static_cast<ssize_t>(sizeof e);
}

}  // namespace

std::unique_ptr<DeviceSlot> DeviceSlots::claim(const std::string& path, std::string& error,
                                               int& err, std::chrono::milliseconds quarantine) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        err = errno;
        error = "cannot open the device's slot table " + path + ": " + std::strerror(err);
        return nullptr;
    }
    ::fchmod(fd, 0666);  // whatever the umask: every user of the device needs it (best effort)
    auto fail = [&](int e, const std::string& what) -> std::unique_ptr<DeviceSlot> {
        err = e;
        error = what;
        ::close(fd);
        return nullptr;
    };
    int chosen = -1;
    {
        TableLock lock(fd);
        if (lock.error() != 0)
            return fail(lock.error(), "cannot lock " + path + ": " + std::strerror(lock.error()));
        Table t;
        if (!read_table(fd, t)) return fail(EINVAL, path + " is not a uroce slot table");
        const uint64_t now = now_ns();
        const auto wait_ns = static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(quarantine).count());
        // The free slot released longest ago, or -1. Among rested slots if `rested_only`.
        // Dead holders (their lock is gone) are looked for only when no rested slot is left,
        // so that a claim probes one lock per held slot only when the table is nearly full;
        // their slots rest from the moment they are found.
        // Scanning from a random place makes ties (above all the never-used slots of a fresh
        // table) go to a random slot: the slot is half of every QPN, which a blind attacker
        // should not be able to guess.
        const unsigned start = static_cast<unsigned>(random_u64() % (kSlots - 1));
        auto pick = [&](bool rested_only) -> int {
            int best = -1;
            for (unsigned k = 0; k < kSlots - 1; ++k) {
                const unsigned n = 1 + (start + k) % (kSlots - 1);
                Entry& e = t[n];
                if (!rested_only && e.state == kHeld && !held_by_someone(fd, n)) {
                    e = Entry{now, kFree, 0};
                    write_entry(fd, n, e);
                }
                if (e.state != kFree) continue;
                if (rested_only && e.released_ns != 0 && now - e.released_ns < wait_ns) continue;
                if (best < 0 || e.released_ns < t[static_cast<unsigned>(best)].released_ns)
                    best = static_cast<int>(n);
            }
            return best;
        };
        for (unsigned attempt = 0; attempt < kSlots && chosen < 0; ++attempt) {
            int n = pick(true);
            if (n < 0) n = pick(false);
            if (n < 0) return fail(EBUSY, "every context slot of the device is in use");
            const int e = ofd_lock(fd, F_OFD_SETLK, F_WRLCK, kSlotLocksAt + n);
            if (e == 0) {
                chosen = n;
                break;
            }
            if (e != EAGAIN && e != EACCES)
                return fail(e, "cannot lock slot " + std::to_string(n) + " of " + path);
            // The table says free, yet someone holds the slot's lock (a record written by
            // another process sharing the holder's lock, such as a child of fork()): the lock
            // is the truth.
            t[static_cast<unsigned>(n)].state = kHeld;
            write_entry(fd, static_cast<unsigned>(n), t[static_cast<unsigned>(n)]);
        }
        if (chosen < 0) return fail(EBUSY, "every context slot of the device is in use");
        const auto n = static_cast<unsigned>(chosen);
        if (!write_entry(fd, n, Entry{t[n].released_ns, kHeld, static_cast<uint32_t>(::getpid())}))
            return fail(errno, "cannot write " + path);
    }
    return std::unique_ptr<DeviceSlot>(
        new DeviceSlot(fd, static_cast<uint16_t>(chosen), static_cast<int>(::getpid())));
}

SharedValueReader::~SharedValueReader() {
    if (fd_ >= 0) ::close(fd_);
}

std::optional<uint32_t> SharedValueReader::read(unsigned index) {
    if (index >= DeviceSlot::kSharedValues) return std::nullopt;
    if (fd_ < 0) fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) return std::nullopt;
    // No table lock (it needs a writable file): an aligned four-byte value is read whole.
    uint32_t value = 0;
    const off_t at = kSharedValueAt + static_cast<off_t>(index * sizeof(uint32_t));
    const ssize_t n = ::pread(fd_, &value, sizeof value, at);
    if (n < 0) return std::nullopt;
    return n == static_cast<ssize_t>(sizeof value) ? value : 0;
}

int DeviceSlot::update_shared_value(unsigned index,
                                    const std::function<uint32_t(uint32_t)>& update) const {
    if (index >= kSharedValues) return EINVAL;
    const off_t at = kSharedValueAt + static_cast<off_t>(index * sizeof(uint32_t));
    TableLock lock(fd_);
    if (lock.error() != 0) return lock.error();
    uint32_t value = 0;
    const ssize_t n = ::pread(fd_, &value, sizeof value, at);
    if (n < 0) return errno;
    if (n != static_cast<ssize_t>(sizeof value)) value = 0;
    const uint32_t next = update(value);
    if (next != value && ::pwrite(fd_, &next, sizeof next, at) != static_cast<ssize_t>(sizeof next))
        return errno;
    return 0;
}

bool DeviceSlot::alone() const {
    // One query over every slot's byte: our own lock is on this open file description, so
    // it conflicts with nothing; any other holder's does.
    struct flock fl {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = kSlotLocksAt;
    fl.l_len = DeviceSlots::kSlots;
    if (::fcntl(fd_, F_OFD_GETLK, &fl) != 0) return false;  // cannot tell: not alone
    return fl.l_type == F_UNLCK;
}

DeviceSlot::~DeviceSlot() {
    if (::getpid() == owner_pid_) {
        TableLock lock(fd_);
        if (lock.error() == 0) write_entry(fd_, number_, Entry{now_ns(), kFree, 0});
    }
    ::close(fd_);  // drops the slot's lock
}

}  // namespace uroce::transport
