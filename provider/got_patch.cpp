// Import-slot lookup and patching for one loaded ELF object. See got_patch.h.
#include "provider/got_patch.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

namespace uroce::provider::got {
namespace {

using Addr = ElfW(Addr);
using Sxword = ElfW(Sxword);
using Sym = ElfW(Sym);
using Rela = ElfW(Rela);

#if defined(__x86_64__)
constexpr bool kSupported = true;
constexpr uint32_t kRelJumpSlot = R_X86_64_JUMP_SLOT;
constexpr uint32_t kRelGlobDat = R_X86_64_GLOB_DAT;
#elif defined(__aarch64__)
constexpr bool kSupported = true;
constexpr uint32_t kRelJumpSlot = R_AARCH64_JUMP_SLOT;
constexpr uint32_t kRelGlobDat = R_AARCH64_GLOB_DAT;
#else
constexpr bool kSupported = false;
constexpr uint32_t kRelJumpSlot = 0xffffffffu;
constexpr uint32_t kRelGlobDat = 0xffffffffu;
#endif

uintptr_t page_size() noexcept {
    const long size = sysconf(_SC_PAGESIZE);
    return size > 0 ? static_cast<uintptr_t>(size) : 4096u;
}

uintptr_t align_down(uintptr_t value, uintptr_t alignment) noexcept {
    return value & ~(alignment - 1);
}

bool inside(const LoadedObject& object, uintptr_t address) noexcept {
    return address >= object.lo && address < object.hi;
}

// Fills `out` from one dl_iterate_phdr entry. False if the entry has no PT_LOAD.
bool describe(const dl_phdr_info& info, LoadedObject* out) noexcept {
    LoadedObject object;
    object.base = info.dlpi_addr;
    object.phdr = info.dlpi_phdr;
    object.phnum = info.dlpi_phnum;
    object.lo = UINTPTR_MAX;
    const uintptr_t page = page_size();
    for (size_t i = 0; i < info.dlpi_phnum; ++i) {
        const Phdr& ph = info.dlpi_phdr[i];
        const uintptr_t start = info.dlpi_addr + ph.p_vaddr;
        if (ph.p_type == PT_LOAD) {
            if (start < object.lo) object.lo = start;
            if (start + ph.p_memsz > object.hi) object.hi = start + ph.p_memsz;
        } else if (ph.p_type == PT_DYNAMIC) {
            object.dynamic = reinterpret_cast<const Dyn*>(start);
        } else if (ph.p_type == PT_GNU_RELRO) {
            // The loader protects whole pages only: both ends rounded down.
            object.relro_lo = align_down(start, page);
            object.relro_hi = align_down(start + ph.p_memsz, page);
        }
    }
    if (object.hi == 0) return false;
    *out = object;
    return true;
}

// The dynamic-section values this file needs.
struct DynamicInfo {
    const char* strtab = nullptr;
    size_t strsz = 0;
    const uint8_t* symtab = nullptr;
    size_t syment = sizeof(Sym);
    const uint8_t* jmprel = nullptr;
    size_t pltrelsz = 0;
    Sxword pltrel = DT_RELA;
    const uint8_t* rela = nullptr;
    size_t relasz = 0;
    size_t relaent = sizeof(Rela);
    bool has_soname = false;
    size_t soname = 0;
    bool bind_now = false;
};

// glibc stores relocated addresses in the in-memory dynamic section; other loaders (and the
// vDSO) leave the link-time values. A link-time value of a shared object is a small offset
// outside the mapped range, so the two cannot be confused unless the bias is 0, where they
// coincide.
template <typename T>
const T* dyn_pointer(const LoadedObject& object, Addr value) noexcept {
    const uintptr_t address = inside(object, value) ? value : object.base + value;
    return reinterpret_cast<const T*>(address);
}

bool read_dynamic(const LoadedObject& object, DynamicInfo* out) noexcept {
    if (object.dynamic == nullptr) return false;
    DynamicInfo info;
    // A dynamic section is a few dozen entries; the bound only guards against garbage.
    constexpr size_t kMaxEntries = 4096;
    size_t i = 0;
    for (const Dyn* d = object.dynamic; d->d_tag != DT_NULL && i < kMaxEntries; ++d, ++i) {
        switch (d->d_tag) {
            case DT_STRTAB:
                info.strtab = dyn_pointer<char>(object, d->d_un.d_ptr);
                break;
            case DT_STRSZ:
                info.strsz = d->d_un.d_val;
                break;
            case DT_SYMTAB:
                info.symtab = dyn_pointer<uint8_t>(object, d->d_un.d_ptr);
                break;
            case DT_SYMENT:
                info.syment = d->d_un.d_val;
                break;
            case DT_JMPREL:
                info.jmprel = dyn_pointer<uint8_t>(object, d->d_un.d_ptr);
                break;
            case DT_PLTRELSZ:
                info.pltrelsz = d->d_un.d_val;
                break;
            case DT_PLTREL:
                info.pltrel = static_cast<Sxword>(d->d_un.d_val);
                break;
            case DT_RELA:
                info.rela = dyn_pointer<uint8_t>(object, d->d_un.d_ptr);
                break;
            case DT_RELASZ:
                info.relasz = d->d_un.d_val;
                break;
            case DT_RELAENT:
                info.relaent = d->d_un.d_val;
                break;
            case DT_SONAME:
                info.has_soname = true;
                info.soname = d->d_un.d_val;
                break;
            case DT_BIND_NOW:
                info.bind_now = true;
                break;
            case DT_FLAGS:
                if ((d->d_un.d_val & DF_BIND_NOW) != 0) info.bind_now = true;
                break;
            case DT_FLAGS_1:
                if ((d->d_un.d_val & DF_1_NOW) != 0) info.bind_now = true;
                break;
            default:
                break;
        }
    }
    if (info.strtab == nullptr) return false;
    *out = info;
    return true;
}

const char* dynamic_soname(const LoadedObject& object) noexcept {
    DynamicInfo info;
    if (!read_dynamic(object, &info) || !info.has_soname || info.soname >= info.strsz) {
        return nullptr;
    }
    return info.strtab + info.soname;
}

struct AnchorSearch {
    uintptr_t anchor;
    LoadedObject* out;
    bool found;
};

int anchor_callback(dl_phdr_info* info, size_t, void* data) noexcept {
    auto* search = static_cast<AnchorSearch*>(data);
    for (size_t i = 0; i < info->dlpi_phnum; ++i) {
        const Phdr& ph = info->dlpi_phdr[i];
        const uintptr_t start = info->dlpi_addr + ph.p_vaddr;
        if (ph.p_type == PT_LOAD && search->anchor >= start &&
            search->anchor < start + ph.p_memsz) {
            search->found = describe(*info, search->out);
            return 1;
        }
    }
    return 0;
}

struct SonameSearch {
    const char* prefix;
    LoadedObject* out;
    bool found;
};

int soname_callback(dl_phdr_info* info, size_t, void* data) noexcept {
    auto* search = static_cast<SonameSearch*>(data);
    LoadedObject object;
    if (!describe(*info, &object)) return 0;
    const char* name = dynamic_soname(object);
    if (name == nullptr || strncmp(name, search->prefix, strlen(search->prefix)) != 0) return 0;
    *search->out = object;
    search->found = true;
    return 1;
}

// Adds the slots of one relocation table that import `symbol`.
void scan_relocations(const LoadedObject& object, const DynamicInfo& info, const uint8_t* table,
                      size_t size, const char* symbol, ImportSlots* out) noexcept {
    if (table == nullptr || info.symtab == nullptr || info.relaent < sizeof(Rela) ||
        info.syment < sizeof(Sym)) {
        return;
    }
    for (size_t offset = 0; offset + sizeof(Rela) <= size; offset += info.relaent) {
        const auto* rel = reinterpret_cast<const Rela*>(table + offset);
        const uint32_t type = static_cast<uint32_t>(ELF64_R_TYPE(rel->r_info));
        const size_t sym_index = ELF64_R_SYM(rel->r_info);
        if ((type != kRelJumpSlot && type != kRelGlobDat) || sym_index == 0) continue;
        const auto* sym = reinterpret_cast<const Sym*>(info.symtab + sym_index * info.syment);
        if (sym->st_name >= info.strsz || strcmp(info.strtab + sym->st_name, symbol) != 0) {
            continue;
        }
        const uintptr_t address = object.base + rel->r_offset;
        if (!inside(object, address) || address % alignof(void*) != 0) continue;
        void** slot = reinterpret_cast<void**>(address);
        bool known = false;
        for (size_t i = 0; i < out->count; ++i) known = known || out->slot[i] == slot;
        if (known) continue;
        if (out->count == ImportSlots::kMax) {
            out->overflow = true;
            continue;
        }
        out->slot[out->count] = slot;
        out->bound[out->count] = info.bind_now || type == kRelGlobDat;
        ++out->count;
    }
}

// The protection the loader left on the page at `page`.
int loader_protection(const LoadedObject& object, uintptr_t page, uintptr_t address) noexcept {
    if (page >= object.relro_lo && page < object.relro_hi) return PROT_READ;
    for (size_t i = 0; i < object.phnum; ++i) {
        const Phdr& ph = object.phdr[i];
        const uintptr_t start = object.base + ph.p_vaddr;
        if (ph.p_type != PT_LOAD || address < start || address >= start + ph.p_memsz) continue;
        int prot = 0;
        if ((ph.p_flags & PF_R) != 0) prot |= PROT_READ;
        if ((ph.p_flags & PF_W) != 0) prot |= PROT_WRITE;
        if ((ph.p_flags & PF_X) != 0) prot |= PROT_EXEC;
        return prot;
    }
    return PROT_READ;
}

pthread_mutex_t g_store_mutex = PTHREAD_MUTEX_INITIALIZER;

}  // namespace

int find_object(const void* anchor, LoadedObject* out) noexcept {
    AnchorSearch search{reinterpret_cast<uintptr_t>(anchor), out, false};
    dl_iterate_phdr(anchor_callback, &search);
    return search.found ? 0 : ENOENT;
}

int find_object_by_soname(const char* soname_prefix, LoadedObject* out) noexcept {
    SonameSearch search{soname_prefix, out, false};
    dl_iterate_phdr(soname_callback, &search);
    return search.found ? 0 : ENOENT;
}

const char* soname(const LoadedObject& object) noexcept {
    return dynamic_soname(object);
}

int find_import_slots(const LoadedObject& object, const char* symbol, ImportSlots* out) noexcept {
    *out = ImportSlots{};
    if (!kSupported || sizeof(void*) != 8) return ENOTSUP;
    DynamicInfo info;
    if (!read_dynamic(object, &info)) return ENOEXEC;
    if (info.jmprel != nullptr && info.pltrel != DT_RELA) return ENOTSUP;
    scan_relocations(object, info, info.jmprel, info.pltrelsz, symbol, out);
    scan_relocations(object, info, info.rela, info.relasz, symbol, out);
    return out->overflow ? E2BIG : 0;
}

void* current_target(const LoadedObject& object, const ImportSlots& slots,
                     const char* symbol) noexcept {
    for (size_t i = 0; i < slots.count; ++i) {
        if (slots.bound[i]) return load_slot(slots.slot[i]);
    }
    for (size_t i = 0; i < slots.count; ++i) {
        void* value = load_slot(slots.slot[i]);
        if (value != nullptr && !inside(object, reinterpret_cast<uintptr_t>(value))) return value;
    }
    return dlsym(RTLD_DEFAULT, symbol);
}

int store_import_slots(const LoadedObject& object, const ImportSlots& slots, void* value) noexcept {
    const uintptr_t page_bytes = page_size();
    int error = 0;
    pthread_mutex_lock(&g_store_mutex);
    for (size_t i = 0; i < slots.count && error == 0; ++i) {
        const auto address = reinterpret_cast<uintptr_t>(slots.slot[i]);
        const uintptr_t page = align_down(address, page_bytes);
        const int original = loader_protection(object, page, address);
        const bool writable = (original & PROT_WRITE) != 0;
        void* page_pointer = reinterpret_cast<void*>(page);
        if (!writable && mprotect(page_pointer, page_bytes, original | PROT_WRITE) != 0) {
            error = errno;
            break;
        }
        __atomic_store_n(slots.slot[i], value, __ATOMIC_RELEASE);
        if (!writable && mprotect(page_pointer, page_bytes, original) != 0) error = errno;
    }
    pthread_mutex_unlock(&g_store_mutex);
    return error;
}

}  // namespace uroce::provider::got
