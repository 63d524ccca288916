// See device_counters.h.
#include "transport/device_counters.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <system_error>

#include "transport/counter_file.h"
#include "transport/device_slots.h"

namespace uroce::transport {
namespace {

// Header, then DeviceSlots::kSlots blocks of kStride bytes. The file is sparse: blocks of
// slots never used take no space.
constexpr uint64_t kMagic = 0x31746e63656f7275ull;  // "uroecnt1"
constexpr size_t kStride = 1024;                    // room for 128 counters per block
constexpr size_t kHeader = kStride;

#define UROCE_COUNT_ONE(name) +1
constexpr uint32_t kCounterCount = 0 UROCE_COUNTERS(UROCE_COUNT_ONE);
#undef UROCE_COUNT_ONE
static_assert(sizeof(EngineCounters) <= kStride);
static_assert(sizeof(EngineCounters) == kCounterCount * sizeof(uint64_t));
static_assert(std::atomic<uint64_t>::is_always_lock_free, "counters shared across processes");

constexpr size_t kFileBytes = kHeader + DeviceSlots::kSlots * kStride;

#define UROCE_NAME(name) #name,
constexpr uint64_t layout_hash() {
    return counter_layout_hash({UROCE_COUNTERS(UROCE_NAME)});
}
#undef UROCE_NAME

struct Header {
    uint64_t magic;
    uint64_t layout;  // layout_hash()
    uint32_t count;   // kCounterCount
    uint32_t stride;  // kStride
};

bool header_matches(const Header* h) {
    return __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == kMagic && h->layout == layout_hash() &&
           h->count == kCounterCount && h->stride == kStride;
}

// Checks the header, or writes it into a new (all-zero) file. The caller holds an exclusive
// lock on the file.
bool header_ok_or_written(Header* h) {
    if (h->magic == 0) {
        h->layout = layout_hash();
        h->count = kCounterCount;
        h->stride = kStride;
        __atomic_store_n(&h->magic, kMagic, __ATOMIC_RELEASE);
        return true;
    }
    return header_matches(h);
}

// A file of another layout that no other context uses starts afresh: every block zero
// (holes punched back, so that the file stays sparse; written over if the file system
// cannot), then this layout's header. The caller holds an exclusive lock on the file.
void restart(int fd, void* map) {
    auto* h = static_cast<Header*>(map);
    __atomic_store_n(&h->magic, 0, __ATOMIC_RELEASE);
    if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, kHeader,
                    kFileBytes - kHeader) != 0)
        std::memset(static_cast<char*>(map) + kHeader, 0, kFileBytes - kHeader);
    header_ok_or_written(h);
}

}  // namespace

CounterValues snapshot(const EngineCounters& c) {
    CounterValues v;
#define UROCE_SNAPSHOT(name) v.name = c.name.load(std::memory_order_relaxed);
    UROCE_COUNTERS(UROCE_SNAPSHOT)
#undef UROCE_SNAPSHOT
    return v;
}

std::unique_ptr<DeviceCounters> DeviceCounters::open(const std::string& path, uint16_t slot,
                                                     bool alone, std::string& error) {
    if (slot >= DeviceSlots::kSlots) {
        error = "counters: slot out of range";
        return nullptr;
    }
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        error = errno_text("cannot open " + path, errno);
        return nullptr;
    }
    ::fchmod(fd, 0666);  // whatever the umask (best effort), as for the slot table
    // The first context sizes the file and writes the header, under an OFD lock so that two
    // first contexts do not race.
    flock lk{};
    lk.l_type = F_WRLCK;
    lk.l_whence = SEEK_SET;
    if (::fcntl(fd, F_OFD_SETLKW, &lk) != 0) {
        error = errno_text("cannot lock the counters file", errno);
        ::close(fd);
        return nullptr;
    }
    struct stat st {};
    bool ok = ::fstat(fd, &st) == 0 &&
              (static_cast<size_t>(st.st_size) >= kFileBytes || ::ftruncate(fd, kFileBytes) == 0);
    void* map =
        ok ? ::mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    const int map_err = errno;
    if (map != MAP_FAILED && !header_ok_or_written(static_cast<Header*>(map)) && alone)
        restart(fd, map);
    if (map != MAP_FAILED && !header_matches(static_cast<Header*>(map))) {
        error = path + " was written by a uroce with other counters";
        ::munmap(map, kFileBytes);
        map = MAP_FAILED;
    } else if (map == MAP_FAILED) {
        error = errno_text("cannot map " + path, map_err);
    }
    lk.l_type = F_UNLCK;
    ::fcntl(fd, F_OFD_SETLK, &lk);
    ::close(fd);  // the mapping stays
    if (map == MAP_FAILED) return nullptr;
    // The block is zero (new file) or holds the counts of the slot's earlier holders: both
    // are valid states of atomics of this layout, so it is used in place.
    auto* block = reinterpret_cast<EngineCounters*>(static_cast<char*>(map) + kHeader +
                                                    size_t{slot} * kStride);
    return std::unique_ptr<DeviceCounters>(new DeviceCounters(map, kFileBytes, block));
}

DeviceCounters::~DeviceCounters() {
    ::munmap(map_, length_);
}

bool DeviceCounters::read_totals(const std::string& path, CounterValues& out, std::string& error) {
    out = {};
    CounterFileView file;
    if (!file.open(path, kFileBytes, "counters", error)) return false;
    if (!header_matches(reinterpret_cast<const Header*>(file.data()))) {
        error = path +
                " was written by a uroce with other counters (the next context to open the "
                "device while no other uses it starts it afresh)";
        return false;
    }
    for (size_t s = 0; s < DeviceSlots::kSlots; ++s) {
        const auto* b =
            reinterpret_cast<const EngineCounters*>(file.data() + kHeader + s * kStride);
#define UROCE_SUM(name) out.name += b->name.load(std::memory_order_relaxed);
        UROCE_COUNTERS(UROCE_SUM)
#undef UROCE_SUM
    }
    return true;
}

}  // namespace uroce::transport
