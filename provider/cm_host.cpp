#include "provider/cm_host.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include "transport/engine.h"

namespace uroce::provider {
namespace {

struct NotedDevice {
    std::string ibdev_path;
    DeviceConfig config;
};

class ProviderCmHost final : public transport::cm::CmHost {
  public:
    void note(const std::string& name, const std::string& path, const DeviceConfig& cfg) {
        std::lock_guard lock(mutex_);
        devices_[name] = NotedDevice{path, cfg};
    }

    std::vector<transport::EngineConfig::HostDevice> engine_peers() const {
        std::lock_guard lock(mutex_);
        std::vector<transport::EngineConfig::HostDevice> out;
        for (const auto& [name, d] : devices_)
            out.push_back({d.config.ip, d.config.udp_port, d.ibdev_path + "/uroce/slots"});
        return out;
    }

    std::vector<transport::cm::CmDeviceInfo> devices() const override {
        std::lock_guard lock(mutex_);
        std::vector<transport::cm::CmDeviceInfo> out;
        // The CM speaks IPv4 only so far (docs/rdma-cm.md): IPv6 devices have no CM.
        for (const auto& [name, d] : devices_)
            if (d.config.ip.is_v4())
                out.push_back({name, d.config.ip.v4(), d.config.node_guid, d.config.mtu});
        return out;
    }

    transport::Engine* cm_engine(const std::string& name, int& err) override {
        std::lock_guard lock(mutex_);
        if (auto it = engines_.find(name); it != engines_.end()) return it->second.get();
        const auto dev = devices_.find(name);
        if (dev == devices_.end()) {
            err = ENODEV;
            return nullptr;
        }
        // The CM's own context of the device: QP1 lives there, steered to it among the
        // device's contexts (qpn_steering.bpf.c). Faults apply as to any context.
        transport::EngineConfig ec;
        ec.ip = dev->second.config.ip;
        ec.port = dev->second.config.udp_port;
        ec.mtu = dev->second.config.mtu;
        ec.slot_table = dev->second.ibdev_path + "/uroce/slots";
        ec.counters_file = dev->second.ibdev_path + "/uroce/counters";
        if (const char* spec = std::getenv("UROCE_FAULTS"); spec && *spec) {
            std::string why;
            if (auto f = transport::parse_fault_plan(spec, why)) ec.faults = *f;
        }
        std::string why;
        auto engine = transport::Engine::create(ec, why, err);
        if (!engine) {
            if (err == 0) err = ENOMEM;
            return nullptr;
        }
        transport::Engine* raw = engine.get();
        engines_.emplace(name, std::move(engine));
        return raw;
    }

    std::string port_table_path(transport::cm::PortSpace ps) const override {
        std::string root;
        {
            std::lock_guard lock(mutex_);
            // ROOT/sys/class/infiniband/NAME -> ROOT: the registry every process shares.
            if (!devices_.empty()) {
                std::filesystem::path p(devices_.begin()->second.ibdev_path);
                root = p.parent_path().parent_path().parent_path().parent_path().string();
            }
        }
        const char* name = "tcp";
        switch (ps) {
            case transport::cm::PortSpace::Tcp:
                name = "tcp";
                break;
            case transport::cm::PortSpace::Udp:
                name = "udp";
                break;
            case transport::cm::PortSpace::Ib:
                name = "ib";
                break;
            case transport::cm::PortSpace::Ipoib:
                name = "ipoib";
                break;
        }
        // `uroce add` makes the directory (sticky, world-writable, as /tmp); made here too for
        // a registry older than the RDMA CM. The files are made by whoever claims first.
        const std::string dir = root + "/rdma_cm";
        ::mkdir(dir.c_str(), 01777);
        return dir + "/ports-" + name;
    }

  private:
    mutable std::mutex mutex_;
    std::map<std::string, NotedDevice> devices_;
    std::map<std::string, std::unique_ptr<transport::Engine>> engines_;
};

ProviderCmHost* host() noexcept {
    static ProviderCmHost* const instance = new (std::nothrow) ProviderCmHost();
    return instance;
}

}  // namespace

void cm_host_note_device(const char* name, const char* ibdev_path,
                         const DeviceConfig& config) noexcept {
    try {
        if (host()) host()->note(name, ibdev_path, config);
    } catch (...) {
    }
}

std::vector<transport::EngineConfig::HostDevice> host_devices() noexcept {
    try {
        if (host()) return host()->engine_peers();
    } catch (...) {
    }
    return {};
}

transport::cm::CmHost& cm_host() {
    if (!host()) throw std::bad_alloc();
    return *host();
}

}  // namespace uroce::provider
