// The process's ucma state: the open event channels, the identifier each channel holds (with
// the uid librdmacm gave it), the multicast joins, and the RDMA CM itself, created on the
// first command that needs it, whose events are routed here to their identifiers' channels.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "provider/ucma_channel.h"
#include "provider/ucma_layouts.h"
#include "transport/cm/rdma_cm.h"

namespace uroce::provider::ucma {

struct IdEntry {
    std::shared_ptr<Channel> channel;
    uint64_t uid = 0;  // librdmacm's; 0 for a connection request until rdma_accept names it
    IbService ib;      // the AF_IB address it was bound with, if any
};

// Which file an fd is: an fd number can be closed behind the hooks' back and reused.
struct FileId {
    dev_t dev = 0;
    ino_t ino = 0;
    bool operator==(const FileId&) const = default;
};
// fd's file; false (errno unchanged) if fstat fails.
bool file_id(int fd, FileId* out) noexcept;

struct ChannelEntry {
    std::shared_ptr<Channel> channel;
    FileId file;
};

class Ucma {
  public:
    std::mutex mutex;  // channels and ids; taken inside the RDMA CM's lock (its event sink)
    std::unordered_map<int, ChannelEntry> channels;
    std::atomic<size_t> channel_count{0};
    std::unordered_map<uint32_t, IdEntry> ids;
    // Multicast joins (rdma_join_multicast), by the handle LEAVE_MCAST names; their handles
    // have the top bit set, so that a channel counts their events apart from identifiers'.
    struct McEntry {
        uint32_t id = 0;
        std::shared_ptr<Channel> channel;
    };
    std::unordered_map<uint32_t, McEntry> mcs;
    uint32_t next_mc = 0;

    // Created on the first command that needs it, never destroyed (its engines run until
    // the process exits).
    transport::cm::RdmaCm* cm();

  private:
    // A process that exits with identifiers left: the kernel's RDMA CM would destroy them
    // when the file closes, so that peers hear DREQ/DREP/REJ at once instead of timing
    // out. Not in a child of fork(), whose copies are the parent's.
    static void at_exit();

    // An RDMA CM event, queued on its identifier's channel.
    void deliver(const transport::cm::CmIdEvent& ev);

    std::once_flag cm_once_;
    transport::cm::RdmaCm* cm_ = nullptr;
    pid_t owner_ = 0;
};

// The process's one instance (never destroyed); nullptr if it could not be allocated.
Ucma* ucma() noexcept;

}  // namespace uroce::provider::ucma
