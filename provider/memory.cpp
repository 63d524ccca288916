// Protection domains and memory regions.
//
// uroce never pins memory: every access to a region is a CPU access from this process, so
// pages fault in when they are touched, whatever the registration said. That is what
// on-demand paging asks for, and IBV_ACCESS_ON_DEMAND regions are ordinary regions here
// (implicit ODP, a region covering the whole address space, is not offered: an access to an
// unmapped address would fault in the engine thread instead of failing the request).
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <new>
#include <stdexcept>

#include "provider/device_limits.h"
#include "provider/objects.h"

namespace uroce::provider {

namespace {

// MW_BIND is the right to bind memory windows to the region (provider/mw.cpp). HUGETLB is
// the application's promise that an on-demand region lies in huge pages (ibv_reg_mr(3)): a
// hint for a NIC's page tables, which uroce has none of.
constexpr int kSupportedAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                 IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                                 IBV_ACCESS_RELAXED_ORDERING | IBV_ACCESS_MW_BIND |
                                 IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB;

uint32_t transport_access(int access) {
    uint32_t a = 0;
    if (access & IBV_ACCESS_LOCAL_WRITE) a |= transport::kLocalWrite;
    if (access & IBV_ACCESS_REMOTE_WRITE) a |= transport::kRemoteWrite;
    if (access & IBV_ACCESS_REMOTE_READ) a |= transport::kRemoteRead;
    if (access & IBV_ACCESS_REMOTE_ATOMIC) a |= transport::kRemoteAtomic;
    if (access & IBV_ACCESS_MW_BIND) a |= transport::kMwBind;
    return a;
}

}  // namespace

ibv_pd* alloc_pd(ibv_context* ibctx) noexcept {
    if (inherited(ibctx)) {
        errno = EIO;
        return nullptr;
    }
    auto* pd = new (std::nothrow) UrocePd{};
    if (!pd) {
        errno = ENOMEM;
        return nullptr;
    }
    if (!pd->slot.acquire(to_uctx(ibctx)->state->pds, kMaxPd)) {
        delete pd;
        errno = EINVAL;  // as rxe's object pools answer when full
        return nullptr;
    }
    if (!to_uctx(ibctx)->state->live_pds.add(pd)) {
        delete pd;
        errno = ENOMEM;
        return nullptr;
    }
    pd->id = to_uctx(ibctx)->state->next_pd.fetch_add(1);
    pd->pd.handle = pd->id;
    return &pd->pd;
}

ibv_pd* alloc_parent_domain(ibv_context* ibctx, ibv_parent_domain_init_attr* attr) noexcept {
    if (inherited(ibctx)) {
        errno = EIO;
        return nullptr;
    }
    // A parent domain of a parent domain, one of another context, or a thread domain (uroce
    // offers none) is refused.
    if (!attr || !attr->pd || attr->pd->context != ibctx || to_upd(attr->pd)->protection_domain ||
        attr->td) {
        errno = EINVAL;
        return nullptr;
    }
    auto* pd = new (std::nothrow) UrocePd{};
    if (!pd) {
        errno = ENOMEM;
        return nullptr;
    }
    ContextState& st = *to_uctx(ibctx)->state;
    if (!pd->slot.acquire(st.pds, kMaxPd)) {
        delete pd;
        errno = EINVAL;
        return nullptr;
    }
    if (!st.live_pds.add(pd)) {
        delete pd;
        errno = ENOMEM;
        return nullptr;
    }
    // Objects made in it belong to the protection domain it wraps. Its allocators would
    // provide the memory of provider-owned queues; uroce's queues live in the transport and
    // need none, so they are never called (IBV_ALLOCATOR_USE_DEFAULT in effect).
    UrocePd* inner = to_upd(attr->pd);
    pd->protection_domain = inner;
    pd->id = inner->id;
    inner->users.fetch_add(1);
    pd->pd.context = ibctx;
    pd->pd.handle = pd->id;
    return &pd->pd;
}

int dealloc_pd(ibv_pd* pd) noexcept {
    if (inherited(pd->context)) return 0;  // the parent's (fork_guard.h)
    UrocePd* upd = to_upd(pd);
    if (upd->users.load() > 0) return EBUSY;
    to_uctx(pd->context)->state->live_pds.remove(upd);
    if (upd->protection_domain) upd->protection_domain->users.fetch_sub(1);
    delete upd;
    return 0;
}

void reclaim_pd(UrocePd* pd) noexcept {
    delete pd;
}

ibv_mr* reg_mr(ibv_pd* ibpd, void* addr, size_t length, uint64_t hca_va, int access) noexcept {
    if (inherited(ibpd->context)) {
        errno = EIO;
        return nullptr;
    }
    // The IBA: remote write or atomic access requires local write access.
    // Optional flags are hints a provider may ignore (libibverbs passes them because we
    // said we handle them).
    access &= ~IBV_ACCESS_OPTIONAL_RANGE;
    if ((access & ~kSupportedAccess) ||
        ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
         !(access & IBV_ACCESS_LOCAL_WRITE)) ||
        (!addr && length) || length > kMaxMrSize) {
        errno = EINVAL;
        return nullptr;
    }
    auto* mr = new (std::nothrow) UroceMr{};
    if (!mr) {
        errno = ENOMEM;
        return nullptr;
    }
    if (!mr->slot.acquire(to_uctx(ibpd->context)->state->mrs, kMaxMr)) {
        delete mr;
        errno = EINVAL;
        return nullptr;
    }
    auto* pd = to_upd(ibpd);
    ContextState& st = *to_uctx(ibpd->context)->state;
    if (!st.live_mrs.add(mr)) {
        delete mr;
        errno = ENOMEM;
        return nullptr;
    }
    transport::MemoryKeys keys;
    try {
        keys = st.engine->memory().add(pd->id, reinterpret_cast<uint64_t>(addr), length, hca_va,
                                       transport_access(access));
    } catch (const std::invalid_argument&) {
        // A buffer or iova range that runs past 2^64 (the memory table refuses it).
        st.live_mrs.remove(mr);
        delete mr;
        errno = EINVAL;
        return nullptr;
    } catch (...) {
        st.live_mrs.remove(mr);
        delete mr;
        errno = ENOMEM;
        return nullptr;
    }
    mr->pd_id = pd->id;
    pd->users.fetch_add(1);
    mr->vmr.ibv_mr.lkey = keys.lkey;
    mr->vmr.ibv_mr.rkey = keys.rkey;
    mr->vmr.ibv_mr.handle = keys.lkey;
    mr->vmr.mr_type = UROCE_MR_TYPE_MR;
    mr->vmr.access = access;
    return &mr->vmr.ibv_mr;
}

namespace {

int change_region(verbs_mr* vmr, int flags, ibv_pd* ibpd, void* addr, size_t length,
                  int access) noexcept {
    ibv_context* ctx = vmr->ibv_mr.context;
    if (inherited(ctx)) return EIO;
    auto* mr = reinterpret_cast<UroceMr*>(vmr);
    transport::MemoryTable::Change change;
    access &= ~IBV_ACCESS_OPTIONAL_RANGE;
    if (flags &
        ~(IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS))
        return EINVAL;
    if (flags & IBV_REREG_MR_CHANGE_ACCESS) {
        if ((access & ~kSupportedAccess) ||
            ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
             !(access & IBV_ACCESS_LOCAL_WRITE)))
            return EINVAL;
        change.access = transport_access(access);
    }
    if (flags & IBV_REREG_MR_CHANGE_PD) {
        if (!ibpd || ibpd->context != ctx) return EINVAL;
        change.pd = to_upd(ibpd)->id;
    }
    if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
        if (!addr || length == 0 || length > kMaxMrSize) return EINVAL;
        change.translation = true;
        change.addr = reinterpret_cast<uint64_t>(addr);
        change.length = length;
        change.iova = change.addr;  // as ibv_reg_mr addresses it
    }
    try {
        // A region memory windows are bound to stays as it is (EINVAL, as ibv_dereg_mr).
        if (to_uctx(ctx)->state->engine->memory().modify(vmr->ibv_mr.lkey, change) !=
            transport::MemoryTable::Modification::Modified)
            return EINVAL;
    } catch (...) {
        return EINVAL;  // a range that runs past 2^64
    }
    // libibverbs sets mr->pd, addr and length itself once this returns 0.
    if (flags & IBV_REREG_MR_CHANGE_PD) {
        to_upd(vmr->ibv_mr.pd)->users.fetch_sub(1);
        to_upd(ibpd)->users.fetch_add(1);
        mr->pd_id = to_upd(ibpd)->id;
    }
    if (flags & IBV_REREG_MR_CHANGE_ACCESS) vmr->access = access;
    return 0;
}

}  // namespace

int rereg_mr(verbs_mr* vmr, int flags, ibv_pd* ibpd, void* addr, size_t length,
             int access) noexcept {
    // libibverbs turns any failure into IBV_REREG_MR_ERR_CMD and leaves errno alone: the
    // reason must be in errno, as a kernel provider's failed command leaves it there.
    const int err = change_region(vmr, flags, ibpd, addr, length, access);
    if (err) errno = err;
    return err;
}

int dereg_mr(verbs_mr* vmr) noexcept {
    if (inherited(vmr->ibv_mr.context)) return 0;  // the parent's (fork_guard.h)
    auto* mr = reinterpret_cast<UroceMr*>(vmr);
    ContextState& st = *to_uctx(vmr->ibv_mr.context)->state;
    // Takes effect at once: waits for accesses that passed their check to finish. A region
    // windows are bound to stays, as rxe keeps it (IBA 10.6.7.2.6).
    if (st.engine->memory().deregister(vmr->ibv_mr.lkey) ==
        transport::MemoryTable::Removal::WindowsBound)
        return EINVAL;
    st.live_mrs.remove(mr);
    to_upd(vmr->ibv_mr.pd)->users.fetch_sub(1);
    delete mr;
    return 0;
}

int advise_mr(ibv_pd* ibpd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg_list,
              uint32_t num_sge) noexcept {
    if (inherited(ibpd->context)) return EIO;
    if (advice != IBV_ADVISE_MR_ADVICE_PREFETCH && advice != IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE &&
        advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
        return EOPNOTSUPP;
    if ((flags & ~IBV_ADVISE_MR_FLAG_FLUSH) || num_sge == 0 || !sg_list) return EINVAL;
    const transport::MemoryTable& mem = to_uctx(ibpd->context)->state->engine->memory();
    const uint32_t pd = to_upd(ibpd)->id;
    const uint32_t need =
        advice == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE ? uint32_t{transport::kLocalWrite} : 0u;
    // Every range first: a bad one fails the call with nothing done.
    {
        auto guard = mem.lock_shared();
        for (uint32_t i = 0; i < num_sge; ++i) {
            const ibv_sge& s = sg_list[i];
            if (mem.check_local(s.lkey, pd, s.addr, s.length, need) != transport::KeyCheck::Ok)
                return EINVAL;
        }
    }
    // Prefetching is faulting the pages in now (NO_FAULT asks only for pages already
    // present, which every access finds anyway). It is advice: a kernel without
    // MADV_POPULATE_* leaves the faults to the first access.
    if (advice == IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT) return 0;
#if defined(MADV_POPULATE_READ) && defined(MADV_POPULATE_WRITE)
    const int how = advice == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE ? int{MADV_POPULATE_WRITE}
                                                                  : int{MADV_POPULATE_READ};
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    for (uint32_t i = 0; i < num_sge; ++i) {
        const uint64_t start = sg_list[i].addr & ~(page - 1);
        const uint64_t end = sg_list[i].addr + sg_list[i].length;
        if (end > start) ::madvise(reinterpret_cast<void*>(start), end - start, how);
    }
#endif
    return 0;
}

void reclaim_mr(ContextState& st, UroceMr* mr) noexcept {
    st.engine->memory().remove(mr->vmr.ibv_mr.lkey);
    delete mr;
}

}  // namespace uroce::provider
