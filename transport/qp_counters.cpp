// See qp_counters.h.
#include "transport/qp_counters.h"

#include "transport/counter_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace uroce::transport {
namespace {

constexpr uint64_t kMagic = 0x31707163656f7275ull;  // "uroecqp1"
constexpr size_t kStride = QpCounterTable::kStride;
constexpr size_t kHeader = 4096;
constexpr size_t kFileBytes = kHeader + QpCounterTable::kQps * kStride;

#define UROCE_COUNT_ONE(name) +1
constexpr uint32_t kCounterCount = 0 UROCE_QP_COUNTERS(UROCE_COUNT_ONE);
#undef UROCE_COUNT_ONE
static_assert(sizeof(QpCounters) == kCounterCount * sizeof(uint64_t));
static_assert(sizeof(QpCounters) <= kStride);

// The blocks are laid out kStride apart: a QpCounters padded to the stride.
struct alignas(kStride) Block {
    QpCounters c;
};
static_assert(sizeof(Block) == kStride);

#define UROCE_NAME(name) #name,
constexpr uint64_t layout_hash() {
    return counter_layout_hash({UROCE_QP_COUNTERS(UROCE_NAME)});
}
#undef UROCE_NAME

struct Header {
    uint64_t magic;
    uint64_t layout;
};

bool header_ok(const Header* h) {
    return __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == kMagic && h->layout == layout_hash();
}

}  // namespace

void QpCounters::reset() {
#define UROCE_QP_RESET(name) name.store(0, std::memory_order_relaxed);
    UROCE_QP_COUNTERS(UROCE_QP_RESET)
#undef UROCE_QP_RESET
}

QpCounterValues snapshot(const QpCounters& c) {
    QpCounterValues v;
#define UROCE_QP_SNAPSHOT(name) v.name = c.name.load(std::memory_order_relaxed);
    UROCE_QP_COUNTERS(UROCE_QP_SNAPSHOT)
#undef UROCE_QP_SNAPSHOT
    return v;
}

std::string QpCounterTable::path_for_slot(const std::string& device_counters_file, uint32_t slot) {
    return device_counters_file + ".qp." + std::to_string(slot);
}

std::unique_ptr<QpCounterTable> QpCounterTable::open_shared(const std::string& path,
                                                            std::string& error) {
    // One context holds a slot at a time, so nobody else writes this file while we set it
    // up; a reader (uroce stats) checks the header before it trusts a block.
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        error = errno_text("cannot open " + path, errno);
        return nullptr;
    }
    ::fchmod(fd, 0666);  // whatever the umask (best effort), as for the slot table
    struct stat st {};
    const bool sized = ::fstat(fd, &st) == 0 && (static_cast<size_t>(st.st_size) == kFileBytes ||
                                                 ::ftruncate(fd, kFileBytes) == 0);
    void* map =
        sized ? ::mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    const int map_err = errno;
    ::close(fd);
    if (map == MAP_FAILED) {
        error = errno_text("cannot map " + path, map_err);
        return nullptr;
    }
    auto* h = static_cast<Header*>(map);
    if (!header_ok(h)) {
        // New, or written by a uroce with other QP counters: start afresh with this layout.
        __atomic_store_n(&h->magic, 0, __ATOMIC_RELEASE);
        auto* blocks = reinterpret_cast<Block*>(static_cast<char*>(map) + kHeader);
        for (uint32_t i = 0; i < kQps; ++i) blocks[i].c.reset();
        h->layout = layout_hash();
        __atomic_store_n(&h->magic, kMagic, __ATOMIC_RELEASE);
    }
    return std::unique_ptr<QpCounterTable>(
        new QpCounterTable(map, kFileBytes, static_cast<char*>(map) + kHeader));
}

std::unique_ptr<QpCounterTable> QpCounterTable::make_private() {
    auto* blocks = new Block[kQps];
    return std::unique_ptr<QpCounterTable>(
        new QpCounterTable(nullptr, 0, reinterpret_cast<char*>(blocks)));
}

QpCounterTable::~QpCounterTable() {
    if (map_)
        ::munmap(map_, length_);
    else
        delete[] reinterpret_cast<Block*>(blocks_);
}

bool QpCounterTable::read(const std::string& path, uint32_t qpn, QpCounterValues& out,
                          std::string& error) {
    out = {};
    CounterFileView file;
    if (!file.open(path, kFileBytes, "QP counters", error)) return false;
    if (!header_ok(reinterpret_cast<const Header*>(file.data()))) {
        error = path + " was written by a uroce with other QP counters";
        return false;
    }
    out = snapshot(reinterpret_cast<const Block*>(file.data() + kHeader)[qpn % kQps].c);
    return true;
}

}  // namespace uroce::transport
