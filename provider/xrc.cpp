// XRC domains and XRC SRQs: ibv_open_xrcd, ibv_close_xrcd, ibv_create_srq_ex, ibv_get_srq_num.
//
// A domain ties XRC SRQs to the XRC target QPs that may deliver into them (docs/xrc.md).
// Opening one on a file finds the domain already open on that file in this context, as the
// kernel finds it by the file's inode; fd -1 makes a new, private domain. Domains live in
// the context: SRQs and target QPs of one domain must be in the same context.
#include <sys/stat.h>

#include <fcntl.h>
#include <algorithm>
#include <cerrno>
#include <new>

#include "provider/device_limits.h"
#include "provider/objects.h"

namespace uroce::provider {

namespace {

// The domain open on the file (dev, ino) in this context, or nullptr. Caller holds
// xrc_domains_mutex; forgets domains nobody holds any more.
std::shared_ptr<XrcDomain> find_domain(ContextState& st, dev_t dev, ino_t ino) {
    auto& v = st.xrc_domains;
    v.erase(std::remove_if(v.begin(), v.end(), [](const auto& w) { return w.expired(); }), v.end());
    for (const auto& w : v) {
        if (auto d = w.lock(); d && d->on_file && d->dev == dev && d->ino == ino) return d;
    }
    return nullptr;
}

}  // namespace

ibv_xrcd* open_xrcd(ibv_context* ibctx, ibv_xrcd_init_attr* attr) noexcept {
    if (inherited(ibctx)) {
        errno = EIO;
        return nullptr;
    }
    constexpr uint32_t kKnown = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    if (!attr || (attr->comp_mask & ~kKnown) || !(attr->comp_mask & IBV_XRCD_INIT_ATTR_FD) ||
        !(attr->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS) || (attr->oflags & ~(O_CREAT | O_EXCL))) {
        errno = EINVAL;
        return nullptr;
    }
    ContextState& st = *to_uctx(ibctx)->state;
    auto* x = new (std::nothrow) UroceXrcd{};
    if (!x) {
        errno = ENOMEM;
        return nullptr;
    }
    if (!x->slot.acquire(st.xrcds, kMaxXrcd)) {
        delete x;
        errno = EINVAL;
        return nullptr;
    }
    try {
        std::lock_guard lock(st.xrc_domains_mutex);
        struct stat sb {};
        if (attr->fd != -1) {
            if (::fstat(attr->fd, &sb) != 0) {
                delete x;
                errno = EBADF;
                return nullptr;
            }
            x->domain = find_domain(st, sb.st_dev, sb.st_ino);
            // As the kernel answers: no domain on the file and no O_CREAT, or one already
            // there and O_EXCL.
            if ((!x->domain && !(attr->oflags & O_CREAT)) ||
                (x->domain && (attr->oflags & O_EXCL))) {
                delete x;
                errno = EINVAL;
                return nullptr;
            }
        }
        if (!x->domain) {
            x->domain = std::make_shared<XrcDomain>();
            x->domain->id = st.next_xrcd.fetch_add(1);
            if (attr->fd != -1) {
                x->domain->on_file = true;
                x->domain->dev = sb.st_dev;
                x->domain->ino = sb.st_ino;
                st.xrc_domains.push_back(x->domain);
            }
        }
        ++x->domain->handles;
    } catch (...) {
        delete x;
        errno = ENOMEM;
        return nullptr;
    }
    if (!st.live_xrcds.add(x)) {
        std::lock_guard lock(st.xrc_domains_mutex);
        --x->domain->handles;
        delete x;
        errno = ENOMEM;
        return nullptr;
    }
    x->vxrcd.xrcd.context = ibctx;
    x->vxrcd.comp_mask = 0;
    x->vxrcd.handle = x->domain->id;
    return &x->vxrcd.xrcd;
}

int close_xrcd(ibv_xrcd* ibxrcd) noexcept {
    if (inherited(ibxrcd->context)) return 0;  // the parent's (fork_guard.h)
    UroceXrcd* x = to_uxrcd(ibxrcd);
    ContextState& st = *to_uctx(ibxrcd->context)->state;
    {
        std::lock_guard lock(st.xrc_domains_mutex);
        // The last handle of a domain still holding SRQs or target QPs stays (the kernel
        // answers EBUSY the same way); other handles may go, the domain lives on.
        if (x->domain->handles == 1 && x->domain->users.load() > 0) return EBUSY;
        --x->domain->handles;
        x->domain.reset();
    }
    st.live_xrcds.remove(x);
    delete x;
    return 0;
}

void reclaim_xrcd(UroceXrcd* x) noexcept {
    delete x;
}

ibv_srq* create_srq_ex(ibv_context* ibctx, ibv_srq_init_attr_ex* attr) noexcept {
    if (!attr) {
        errno = EINVAL;
        return nullptr;
    }
    constexpr uint32_t kKnown = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD |
                                IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
    const ibv_srq_type type =
        (attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) ? attr->srq_type : IBV_SRQT_BASIC;
    if (attr->comp_mask & ~kKnown) {
        errno = EOPNOTSUPP;  // tag matching
        return nullptr;
    }
    if (type != IBV_SRQT_BASIC && type != IBV_SRQT_XRC) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd || attr->pd->context != ibctx) {
        errno = EINVAL;
        return nullptr;
    }
    // ibv_srq_init_attr_ex starts with the fields of ibv_srq_init_attr.
    auto* init = reinterpret_cast<ibv_srq_init_attr*>(attr);
    if (type == IBV_SRQT_BASIC) return new_srq(attr->pd, init, nullptr, nullptr);
    // An XRC SRQ needs its domain and its own CQ, both of this context.
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) || !(attr->comp_mask & IBV_SRQ_INIT_ATTR_CQ) ||
        !attr->xrcd || !attr->cq || attr->xrcd->context != ibctx || attr->cq->context != ibctx) {
        errno = EINVAL;
        return nullptr;
    }
    return new_srq(attr->pd, init, to_uxrcd(attr->xrcd), to_ucq(attr->cq));
}

int get_srq_num(ibv_srq* ibsrq, uint32_t* srq_num) noexcept {
    if (!srq_num) return EINVAL;
    const UroceSrq* srq = to_usrq(ibsrq);
    if (!srq->xrcd) return EINVAL;  // only XRC SRQs have a number requests can name
    *srq_num = srq->queue->xrc().srqn;
    return 0;
}

}  // namespace uroce::provider
