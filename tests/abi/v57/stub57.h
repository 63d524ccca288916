// What tests/abi/v57's stub libibverbs records (stub57.cpp), read by abi57_check.
#pragma once

#include <cstddef>
#include <cstdint>

struct Stub57State {
    const void* device_ops = nullptr;  // verbs_register_driver_57's argument
    int registrations = 0;
    size_t alloc_size = 0;  // _verbs_init_and_alloc_context's
    uint32_t driver_id = 0;
    const void* context_ops = nullptr;  // verbs_set_ops'
    int set_ops_calls = 0;
    int uninit_calls = 0;
};

extern "C" Stub57State* uroce_stub57_state();
