// Redirecting one loaded ELF object's imports of a function (its GOT/PLT "import slots").
//
// A dynamically linked object calls an imported function through a pointer-sized slot that
// the dynamic loader fills in: an R_*_JUMP_SLOT entry (a PLT call) or an R_*_GLOB_DAT entry
// (code built with -fno-plt, or an address taken). Storing another address in those slots
// changes what that one object calls, and nothing else in the process. Objects linked with
// full RELRO and BIND_NOW (Debian's libibverbs) have their slots in a page the loader made
// read-only after relocation; store_import_slots() makes the page writable for the store and
// puts the loader's protection back.
//
// Supported: x86-64 and AArch64 (64-bit ELF, RELA relocations). Elsewhere the lookups fail
// with ENOTSUP.
#pragma once

#include <link.h>

#include <cstddef>
#include <cstdint>

#pragma GCC visibility push(hidden)

namespace uroce::provider::got {

using Phdr = ElfW(Phdr);
using Dyn = ElfW(Dyn);

// A loaded object, found through an address inside one of its segments.
struct LoadedObject {
    uintptr_t base = 0;      // load bias (dlpi_addr)
    uintptr_t lo = 0;        // lowest address of its PT_LOAD segments
    uintptr_t hi = 0;        // one past the highest
    uintptr_t relro_lo = 0;  // PT_GNU_RELRO, page-aligned as the loader protects it
    uintptr_t relro_hi = 0;  // (empty when the object has no RELRO)
    const Phdr* phdr = nullptr;
    size_t phnum = 0;
    const Dyn* dynamic = nullptr;
};

// Finds the loaded object whose PT_LOAD segments contain `anchor`. 0, or ENOENT.
int find_object(const void* anchor, LoadedObject* out) noexcept;

// Finds a loaded object by the prefix of its DT_SONAME (e.g. "libibverbs.so."). 0, or ENOENT.
int find_object_by_soname(const char* soname_prefix, LoadedObject* out) noexcept;

// The object's DT_SONAME, or nullptr.
const char* soname(const LoadedObject& object) noexcept;

// Where one object imports one symbol. Several slots are possible (a PLT slot plus a GOT
// entry when the object also takes the function's address).
struct ImportSlots {
    static constexpr size_t kMax = 4;
    void** slot[kMax] = {};
    // The loader has certainly stored the function's address there: a GLOB_DAT entry, or
    // any slot of an object bound at load time (BIND_NOW). A lazily bound JUMP_SLOT may still
    // hold the address of its PLT stub.
    bool bound[kMax] = {};
    size_t count = 0;
    bool overflow = false;  // the object had more than kMax slots for the symbol
};

// Collects the JUMP_SLOT and GLOB_DAT slots through which `object` imports `symbol` (matched
// by name, any version). 0 (count may be 0 when the object does not import it), or ENOEXEC
// when the dynamic section is unusable, ENOTSUP on an unsupported architecture or format,
// E2BIG when there are more than kMax slots (redirecting only some would miss calls).
int find_import_slots(const LoadedObject& object, const char* symbol, ImportSlots* out) noexcept;

// What a call through these slots reaches today. A slot still pointing into the object
// itself is an unresolved lazy-binding stub, not a function: then the symbol is looked up
// in the global scope (dlsym(RTLD_DEFAULT)), which is what the loader would bind it to.
// nullptr when there is no slot and the lookup fails.
void* current_target(const LoadedObject& object, const ImportSlots& slots,
                     const char* symbol) noexcept;

// Stores `value` in every slot: each slot's page is made writable, the pointer is stored
// atomically (release), and the page gets back the protection the loader gave it (read-only
// inside PT_GNU_RELRO, the segment's own flags elsewhere). Stores are serialised process-wide.
// 0 or errno (from mprotect).
int store_import_slots(const LoadedObject& object, const ImportSlots& slots, void* value) noexcept;

// The value a slot holds now (acquire load).
inline void* load_slot(void** slot) noexcept {
    return __atomic_load_n(slot, __ATOMIC_ACQUIRE);
}

}  // namespace uroce::provider::got

#pragma GCC visibility pop
