// The process's ucma state (ucma_registry.h).
#include "provider/ucma_registry.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <new>

#include "provider/cm_host.h"

namespace uroce::provider::ucma {

namespace tcm = transport::cm;

tcm::RdmaCm* Ucma::cm() {
    std::call_once(cm_once_, [this] {
        cm_ = new tcm::RdmaCm(cm_host(), [this](const tcm::CmIdEvent& ev) { deliver(ev); });
        owner_ = ::getpid();
        std::atexit(&Ucma::at_exit);
    });
    return cm_;
}

Ucma* ucma() noexcept {
    static Ucma* const instance = new (std::nothrow) Ucma();
    return instance;
}

void Ucma::at_exit() {
    Ucma* u = ucma();
    if (u && u->cm_ && u->owner_ == ::getpid()) {
        try {
            u->cm_->destroy_all();
        } catch (...) {
        }
    }
}

bool file_id(int fd, FileId* out) noexcept {
    const int saved = errno;
    struct stat st {};
    const bool ok = ::fstat(fd, &st) == 0;
    errno = saved;
    if (ok) *out = FileId{st.st_dev, st.st_ino};
    return ok;
}

void Ucma::deliver(const tcm::CmIdEvent& ev) {
    std::lock_guard lock(mutex);
    uint32_t counted_for = ev.id;
    auto it = ids.find(ev.id);
    uint64_t uid = 0;
    if (ev.type == tcm::CmIdEventType::ConnectRequest) {
        // The new identifier lives on its listener's channel, without a uid until rdma_accept
        // names one; the event carries the listener's uid and counts as the listener's.
        const auto listener = ids.find(ev.listen_id);
        if (listener == ids.end()) return;
        try {
            it = ids.insert_or_assign(ev.id, IdEntry{listener->second.channel, 0, IbService{}})
                     .first;
        } catch (...) {
            return;
        }
        uid = listener->second.uid;
        counted_for = ev.listen_id;
    } else {
        if (it == ids.end()) return;
        // A new connection's events before rdma_accept named it (a REJ from a requester that
        // gave up) are dropped, as the kernel's ucma drops them: librdmacm, which finds an
        // event's identifier by its uid, would take it for the listener's, and the new
        // identifier's rdma_destroy_id would wait for ever for its acknowledgement.
        uid = it->second.uid;
        if (uid == 0) return;
    }
    rdma_ucm_event_resp resp{};
    resp.uid = uid;
    resp.id = ev.id;
    resp.event = static_cast<uint32_t>(ev.type);
    resp.status = static_cast<uint32_t>(ev.status);
    if (ev.ud)
        fill_ud(resp.param.ud, ev);
    else
        fill_conn(resp.param.conn, ev.param);
    it->second.channel->push(resp, counted_for);
}

}  // namespace uroce::provider::ucma
