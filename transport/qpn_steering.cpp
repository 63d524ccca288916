// QPN steering: see qpn_steering.h.
#include "transport/qpn_steering.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <endian.h>

#include <cerrno>
#include <cstdarg>
#include <cstring>

#include "transport/qpn_steering_bpf.h"  // kQpnSteeringBpf, generated from qpn_steering.bpf.c

namespace uroce::transport {

namespace {

constexpr char kMapName[] = "uroce_slots";
constexpr uint32_t kMapEntries = DeviceSlots::kSlots;
constexpr char kServicesName[] = "uroce_cm_svc";
constexpr uint32_t kServicesEntries = 4096;
constexpr char kRoutesName[] = "uroce_routes";
// Where the slot table keeps the maps' ids (DeviceSlot::update_shared_value).
constexpr unsigned kSocketMapValue = 0;
constexpr unsigned kServicesMapValue = 1;
constexpr unsigned kRoutesMapValue = 2;

// libbpf reports to stderr by default; the provider runs inside other people's processes
// and says nothing unasked. Our errors come back as errno and a message of our own.
int quiet(enum libbpf_print_level, const char*, va_list) {
    return 0;
}

class QuietLibbpf {
  public:
    QuietLibbpf() : previous_(libbpf_set_print(quiet)) {}
    ~QuietLibbpf() { libbpf_set_print(previous_); }
    QuietLibbpf(const QuietLibbpf&) = delete;
    QuietLibbpf& operator=(const QuietLibbpf&) = delete;

  private:
    libbpf_print_fn_t previous_;
};

// An fd closed unless released.
class Fd {
  public:
    explicit Fd(int fd = -1) : fd_(fd) {}
    ~Fd() {
        if (fd_ >= 0) ::close(fd_);
    }
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    int get() const { return fd_; }
    int release() {
        const int fd = fd_;
        fd_ = -1;
        return fd;
    }
    void reset(int fd) {
        if (fd_ >= 0) ::close(fd_);
        fd_ = fd;
    }

  private:
    int fd_;
};

// What one of the device's maps is.
struct MapShape {
    bpf_map_type type;
    const char* name;
    uint32_t key_size;
    uint32_t value_size;
    uint32_t entries;
};
constexpr MapShape kSocketMap{BPF_MAP_TYPE_REUSEPORT_SOCKARRAY, kMapName, sizeof(uint32_t),
                              sizeof(uint64_t), kMapEntries};
constexpr MapShape kServicesMap{BPF_MAP_TYPE_HASH, kServicesName, sizeof(uint64_t),
                                sizeof(uint32_t), kServicesEntries};
constexpr MapShape kRoutesMap{BPF_MAP_TYPE_ARRAY, kRoutesName, sizeof(uint32_t), sizeof(uint32_t),
                              kMapEntries};

// The device's map, if `id` still names one of ours of that shape.
int open_shared_map(uint32_t id, const MapShape& shape) {
    if (id == 0) return -1;
    Fd fd(bpf_map_get_fd_by_id(id));
    if (fd.get() < 0) return -1;
    bpf_map_info info{};
    uint32_t len = sizeof info;
    if (bpf_obj_get_info_by_fd(fd.get(), &info, &len) != 0) return -1;
    if (info.type != static_cast<uint32_t>(shape.type) || info.max_entries != shape.entries ||
        info.key_size != shape.key_size || std::strcmp(info.name, shape.name) != 0)
        return -1;  // the id was reused by somebody else's map
    return fd.release();
}

uint32_t map_id(int fd) {
    bpf_map_info info{};
    uint32_t len = sizeof info;
    return bpf_obj_get_info_by_fd(fd, &info, &len) == 0 ? info.id : 0;
}

std::string describe(int err, const char* what) {
    std::string s = std::string(what) + ": " + std::strerror(err);
    if (err == EPERM || err == EACCES)
        s += " (several contexts on one device need CAP_BPF and CAP_SYS_ADMIN: run as root)";
    return s;
}

}  // namespace

std::unique_ptr<QpnSteering> QpnSteering::open(const DeviceSlot& slot, std::string& error,
                                               int& err) {
    QuietLibbpf quiet_libbpf;
    // The device's map of this shape, created on first use; its id is kept in the slot table.
    const auto shared_map = [&slot](unsigned value, const MapShape& shape, Fd& map) {
        int create_err = 0;
        const int rc = slot.update_shared_value(value, [&](uint32_t stored) {
            map.reset(open_shared_map(stored, shape));
            if (map.get() >= 0) return stored;
            map.reset(bpf_map_create(shape.type, shape.name, shape.key_size, shape.value_size,
                                     shape.entries, nullptr));
            if (map.get() < 0) {
                create_err = errno;
                return stored;
            }
            return map_id(map.get());
        });
        return rc != 0 ? rc : map.get() < 0 ? create_err : 0;
    };
    Fd map;
    Fd services;
    if ((err = shared_map(kSocketMapValue, kSocketMap, map)) != 0) {
        error = describe(err, "cannot set up the device's socket map");
        return nullptr;
    }
    if ((err = shared_map(kServicesMapValue, kServicesMap, services)) != 0) {
        error = describe(err, "cannot set up the device's CM service map");
        return nullptr;
    }
    Fd routes;
    if ((err = shared_map(kRoutesMapValue, kRoutesMap, routes)) != 0) {
        error = describe(err, "cannot set up the device's slot route map");
        return nullptr;
    }

    // (LIBBPF_OPTS is a C macro: a statement expression with a compound literal.)
    bpf_object_open_opts opts{};
    opts.sz = sizeof opts;
    opts.object_name = "uroce_qpn_steering";
    bpf_object* obj = bpf_object__open_mem(kQpnSteeringBpf.data(), kQpnSteeringBpf.size(), &opts);
    if (obj == nullptr) {
        err = errno;
        error = describe(err, "cannot open the QPN steering program");
        return nullptr;
    }
    Fd prog;
    {
        bpf_map* m = bpf_object__find_map_by_name(obj, kMapName);
        bpf_map* svc = bpf_object__find_map_by_name(obj, kServicesName);
        bpf_map* rt = bpf_object__find_map_by_name(obj, kRoutesName);
        bpf_program* p = bpf_object__find_program_by_name(obj, "uroce_steer_by_qpn");
        int e = (m == nullptr || svc == nullptr || rt == nullptr || p == nullptr) ? ENOENT : 0;
        if (e == 0 && bpf_map__reuse_fd(m, map.get()) != 0) e = errno;
        if (e == 0 && bpf_map__reuse_fd(svc, services.get()) != 0) e = errno;
        if (e == 0 && bpf_map__reuse_fd(rt, routes.get()) != 0) e = errno;
        if (e == 0 && bpf_object__load(obj) != 0) e = errno;
        if (e == 0) {
            prog.reset(::fcntl(bpf_program__fd(p), F_DUPFD_CLOEXEC, 0));
            if (prog.get() < 0) e = errno;
        }
        bpf_object__close(obj);
        if (e != 0) {
            err = e;
            error = describe(err, "cannot load the QPN steering program");
            return nullptr;
        }
    }
    return std::unique_ptr<QpnSteering>(new QpnSteering(map.release(), services.release(),
                                                        routes.release(), prog.release(),
                                                        slot.number(), ::getpid()));
}

int QpnSteering::add(int socket_fd, std::string& error) {
    // Attaching replaces the group's program with this identical one: harmless.
    if (::setsockopt(socket_fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_EBPF, &prog_fd_, sizeof prog_fd_) !=
        0) {
        const int err = errno;
        error = describe(err, "cannot attach the QPN steering program to the socket");
        return err;
    }
    const uint64_t value = static_cast<uint64_t>(socket_fd);
    // The slot may have been a further slot of a context gone by: its packets are ours now.
    const uint32_t own = 0;
    if (bpf_map_update_elem(routes_fd_, &slot_, &own, BPF_ANY) != 0 ||
        bpf_map_update_elem(map_fd_, &slot_, &value, BPF_ANY) != 0) {
        const int err = errno;
        error = describe(err, "cannot enter the socket in the device's socket map");
        return err;
    }
    return 0;
}

int QpnSteering::route(uint16_t further_slot) {
    const uint32_t key = further_slot;
    if (key == 0 || key >= kMapEntries || key == slot_) return EINVAL;
    if (bpf_map_update_elem(routes_fd_, &key, &slot_, BPF_ANY) != 0) return errno;
    routed_.push_back(further_slot);
    return 0;
}

int QpnSteering::claim_cm_service(uint64_t service_id) {
    const uint64_t key = htobe64(service_id);
    for (int attempt = 0; attempt < 4; ++attempt) {
        if (bpf_map_update_elem(services_fd_, &key, &slot_, BPF_NOEXIST) == 0) return 0;
        if (errno != EEXIST) return errno;
        uint32_t holder = 0;
        if (bpf_map_lookup_elem(services_fd_, &key, &holder) != 0) continue;  // just removed
        if (holder == slot_) return 0;
        // Taken by a context that still has its socket in the group: in use. A holder that
        // went away without saying so (killed) left its entry behind: take it over.
        uint64_t cookie = 0;
        if (holder < kMapEntries && bpf_map_lookup_elem(map_fd_, &holder, &cookie) == 0)
            return EADDRINUSE;
        if (bpf_map_update_elem(services_fd_, &key, &slot_, BPF_EXIST) == 0) return 0;
    }
    return EAGAIN;
}

bool QpnSteering::cm_service_held_elsewhere(uint64_t service_id) const {
    const uint64_t key = htobe64(service_id);
    uint32_t holder = 0;
    if (bpf_map_lookup_elem(services_fd_, &key, &holder) != 0 || holder == slot_) return false;
    // As in claim_cm_service(): a holder without its socket in the group is dead.
    uint64_t cookie = 0;
    return holder < kMapEntries && bpf_map_lookup_elem(map_fd_, &holder, &cookie) == 0;
}

void QpnSteering::release_cm_service(uint64_t service_id) {
    const uint64_t key = htobe64(service_id);
    uint32_t holder = 0;
    if (bpf_map_lookup_elem(services_fd_, &key, &holder) == 0 && holder == slot_)
        bpf_map_delete_elem(services_fd_, &key);
}

QpnSteering::~QpnSteering() {
    if (::getpid() == owner_pid_) {
        bpf_map_delete_elem(map_fd_, &slot_);
        // Still held here (qpn_space.h): nobody else can have routed them since.
        const uint32_t none = 0;
        for (const uint16_t s : routed_) {
            const uint32_t key = s;
            bpf_map_update_elem(routes_fd_, &key, &none, BPF_ANY);
        }
    }
    ::close(routes_fd_);
    ::close(prog_fd_);
    ::close(services_fd_);
    ::close(map_fd_);
}

}  // namespace uroce::transport
