// QPN steering: see qpn_steering.h.
#include "transport/qpn_steering.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstring>

#include "transport/qpn_steering_bpf.h"  // kQpnSteeringBpf, generated from qpn_steering.bpf.c

namespace uroce::transport {

namespace {

constexpr char kMapName[] = "uroce_slots";
constexpr uint32_t kMapEntries = DeviceSlots::kSlots;

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

// The device's map, if `id` still names one of ours.
int open_shared_map(uint32_t id) {
    if (id == 0) return -1;
    Fd fd(bpf_map_get_fd_by_id(id));
    if (fd.get() < 0) return -1;
    bpf_map_info info{};
    uint32_t len = sizeof info;
    if (bpf_obj_get_info_by_fd(fd.get(), &info, &len) != 0) return -1;
    if (info.type != BPF_MAP_TYPE_REUSEPORT_SOCKARRAY || info.max_entries != kMapEntries ||
        info.key_size != sizeof(uint32_t) || std::strcmp(info.name, kMapName) != 0)
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
    Fd map;
    int create_err = 0;
    const int rc = slot.update_shared_value([&](uint32_t stored) {
        map.reset(open_shared_map(stored));
        if (map.get() >= 0) return stored;
        map.reset(bpf_map_create(BPF_MAP_TYPE_REUSEPORT_SOCKARRAY, kMapName, sizeof(uint32_t),
                                 sizeof(uint64_t), kMapEntries, nullptr));
        if (map.get() < 0) {
            create_err = errno;
            return stored;
        }
        return map_id(map.get());
    });
    if (rc != 0 || map.get() < 0) {
        err = rc != 0 ? rc : create_err;
        error = describe(err, "cannot set up the device's socket map");
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
        bpf_program* p = bpf_object__find_program_by_name(obj, "uroce_steer_by_qpn");
        int e = (m == nullptr || p == nullptr) ? ENOENT : 0;
        if (e == 0 && bpf_map__reuse_fd(m, map.get()) != 0) e = errno;
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
    return std::unique_ptr<QpnSteering>(
        new QpnSteering(map.release(), prog.release(), slot.number(), ::getpid()));
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
    if (bpf_map_update_elem(map_fd_, &slot_, &value, BPF_ANY) != 0) {
        const int err = errno;
        error = describe(err, "cannot enter the socket in the device's socket map");
        return err;
    }
    return 0;
}

QpnSteering::~QpnSteering() {
    if (::getpid() == owner_pid_) bpf_map_delete_elem(map_fd_, &slot_);
    ::close(prog_fd_);
    ::close(map_fd_);
}

}  // namespace uroce::transport
