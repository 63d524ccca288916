// What the process's RDMA CM (transport/cm/rdma_cm.h) gets from the provider: the uroce
// devices libibverbs listed, an engine per device for the CM's QP1, and the host's port
// tables (under the device registry's root).
#pragma once

#include <string>
#include <vector>

#include "provider/objects.h"
#include "transport/cm/rdma_cm.h"

namespace uroce::provider {

// Called for every uroce device libibverbs allocates: the RDMA CM can then resolve its
// address. Never fails (a device that cannot be noted is one the CM does not know).
void cm_host_note_device(const char* name, const char* ibdev_path,
                         const DeviceConfig& config) noexcept;

// Every uroce device libibverbs listed, as an engine's peers (EngineConfig::host_devices).
// Empty if that cannot be had.
std::vector<transport::EngineConfig::HostDevice> host_devices() noexcept;

// The process's CM host (never destroyed: engines it made run until the process exits).
transport::cm::CmHost& cm_host();

}  // namespace uroce::provider
