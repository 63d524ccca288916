// uroce's own C interface, beside the verbs API: counters for tests and tools.
//
// The provider is loaded by libibverbs with dlopen(RTLD_LOCAL), so these symbols are found
// with dlopen(path, RTLD_NOLOAD) + dlsym on the provider's path. Setting UROCE_STATS=1 in
// the environment also prints every counter to stderr when a context closes.
#pragma once

#include <infiniband/verbs.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Reads the counter `name` (see transport/counters.h for the list) of a uroce context.
// Returns 0, EINVAL if ctx is not a uroce context, or ENOENT for an unknown name.
int uroce_read_counter(struct ibv_context* ctx, const char* name, uint64_t* value);

typedef int (*uroce_read_counter_fn)(struct ibv_context*, const char*, uint64_t*);

// Reads the counter `name` of the whole device `ctx` belongs to: every context that has used
// it, in any process, since the device was added (what `uroce stats DEVICE` prints). Returns
// 0, EINVAL if ctx is not a uroce context, ENOENT for an unknown name, or EIO if the device's
// counters file cannot be read.
int uroce_read_device_counter(struct ibv_context* ctx, const char* name, uint64_t* value);

typedef int (*uroce_read_device_counter_fn)(struct ibv_context*, const char*, uint64_t*);

// Reads the counter `name` of one QP (see transport/qp_counters.h for the list: packets and
// payload bytes each way, retransmissions, NAKs by kind, duplicates, packets from a wrong
// peer, injected faults). Returns 0, EINVAL if qp is not a uroce QP,
// or ENOENT for an unknown name.
int uroce_read_qp_counter(struct ibv_qp* qp, const char* name, uint64_t* value);

typedef int (*uroce_read_qp_counter_fn)(struct ibv_qp*, const char*, uint64_t*);

#ifdef __cplusplus
}
#endif
