// Path MTUs: bytes and the verbs enum, for the provider and the project's own programs.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <optional>

namespace uroce {

// The verbs enum for an MTU of `bytes` (256, 512, 1024, 2048 or 4096); nullopt otherwise.
constexpr std::optional<ibv_mtu> mtu_enum(uint32_t bytes) {
    switch (bytes) {
        case 256:
            return IBV_MTU_256;
        case 512:
            return IBV_MTU_512;
        case 1024:
            return IBV_MTU_1024;
        case 2048:
            return IBV_MTU_2048;
        case 4096:
            return IBV_MTU_4096;
        default:
            return std::nullopt;
    }
}

}  // namespace uroce
