// Address handles: the destination of UD SENDs. RoCE addresses by GID, so an AH needs a GRH
// whose destination GID is an address of the device's family (IPv4-mapped on an IPv4
// device): a unicast address, or a multicast group for QPs attached to it.
#include <cerrno>
#include <new>

#include "provider/device_limits.h"
#include "provider/objects.h"
#include "provider/qp_modify.h"

namespace uroce::provider {

ibv_ah* create_ah(ibv_pd* pd, ibv_ah_attr* attr) noexcept {
    if (inherited(pd->context)) {
        errno = EIO;
        return nullptr;
    }
    IpAddress ip;
    const int family = to_uctx(pd->context)->state->device->config.ip.family();
    if (!attr || !attr->is_global || attr->grh.sgid_index != 0 ||
        !gid_to_ip(attr->grh.dgid, family, ip) || attr->port_num > 1) {
        errno = EINVAL;
        return nullptr;
    }
    auto* ah = new (std::nothrow) UroceAh{};
    if (!ah) {
        errno = ENOMEM;
        return nullptr;
    }
    ContextState* st = to_uctx(pd->context)->state;
    if (!ah->slot.acquire(st->ahs, kMaxAh)) {
        delete ah;
        errno = ENOMEM;
        return nullptr;
    }
    if (!st->live_ahs.add(ah)) {
        delete ah;
        errno = ENOMEM;
        return nullptr;
    }
    ah->dst_ip = ip;
    ah->hop_limit = attr->grh.hop_limit;
    ah->ah.context = pd->context;
    ah->ah.pd = pd;
    ah->ah.handle = 0;
    to_upd(pd)->users.fetch_add(1);
    return &ah->ah;
}

int destroy_ah(ibv_ah* ibah) noexcept {
    if (inherited(ibah->context)) return 0;  // the parent's (fork_guard.h)
    auto* ah = to_uah(ibah);
    to_uctx(ibah->context)->state->live_ahs.remove(ah);
    to_upd(ibah->pd)->users.fetch_sub(1);
    delete ah;
    return 0;
}

void reclaim_ah(UroceAh* ah) noexcept {
    delete ah;
}

}  // namespace uroce::provider
