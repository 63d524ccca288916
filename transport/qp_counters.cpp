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

// "uroecqp2": version 2 has 256-byte blocks with an owner word; a version 1 file (128-byte
// blocks, no owner) has another magic, so it is started afresh by a context and refused by a
// reader, never misread.
constexpr uint64_t kMagic = 0x32707163656f7275ull;
constexpr size_t kStride = QpCounterTable::kStride;
constexpr size_t kHeader = 4096;
constexpr size_t kFileBytes = kHeader + QpCounterTable::kQps * kStride;

#define UROCE_COUNT_ONE(name) +1
constexpr uint32_t kCounterCount = 0 UROCE_QP_COUNTERS(UROCE_COUNT_ONE);
#undef UROCE_COUNT_ONE
static_assert(sizeof(QpCounters) == (kCounterCount + 1) * sizeof(uint64_t));  // + owner
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
    uint64_t layout;  // layout_hash()
    uint64_t stride;  // kStride
};

bool header_ok(const Header* h) {
    return __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == kMagic && h->layout == layout_hash() &&
           h->stride == kStride;
}

// The mapped table file at `path`, checked, for a reader.
bool open_view(const std::string& path, CounterFileView& file, std::string& error) {
    if (!file.open(path, kFileBytes, "QP counters", error)) return false;
    if (!header_ok(reinterpret_cast<const Header*>(file.data()))) {
        error = path + " was written by a uroce with other QP counters";
        return false;
    }
    return true;
}

}  // namespace

#define UROCE_QP_RESET(name) name.store(0, std::memory_order_relaxed);

void QpCounters::claim(uint32_t qpn) {
    UROCE_QP_COUNTERS(UROCE_QP_RESET)
    // Release: a reader that sees the owner sees the zeroes.
    owner.store(kOwned | qpn, std::memory_order_release);
}

void QpCounters::clear() {
    owner.store(0, std::memory_order_relaxed);
    UROCE_QP_COUNTERS(UROCE_QP_RESET)
}

#undef UROCE_QP_RESET

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
        for (uint32_t i = 0; i < kQps; ++i) blocks[i].c.clear();
        h->layout = layout_hash();
        h->stride = kStride;
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

bool QpCounterTable::read(const std::string& path, uint32_t qpn, QpCounterValues& out, bool& owned,
                          std::string& error) {
    out = {};
    owned = false;
    CounterFileView file;
    if (!open_view(path, file, error)) return false;
    const QpCounters& c = reinterpret_cast<const Block*>(file.data() + kHeader)[qpn % kQps].c;
    owned = c.owner.load(std::memory_order_acquire) == (QpCounters::kOwned | qpn);
    if (owned) out = snapshot(c);
    return true;
}

bool QpCounterTable::read_all(const std::string& path, std::vector<Entry>& out,
                              std::string& error) {
    out.clear();
    CounterFileView file;
    if (!open_view(path, file, error)) return false;
    const auto* blocks = reinterpret_cast<const Block*>(file.data() + kHeader);
    for (uint32_t i = 0; i < kQps; ++i) {
        const uint64_t owner = blocks[i].c.owner.load(std::memory_order_acquire);
        if (!(owner & QpCounters::kOwned)) continue;  // never used (a sparse, zero block)
        out.push_back(Entry{static_cast<uint32_t>(owner & 0xffffff), snapshot(blocks[i].c)});
    }
    return true;
}

}  // namespace uroce::transport
