// See fork_gate.h.
#include "transport/fork_gate.h"

#include <pthread.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace uroce::transport {

struct ForkGateRegistry {
    std::mutex mutex;
    std::vector<ForkGate*> gates;
    std::vector<std::pair<void (*)(), void (*)()>> hooks;  // ForkGate::add_hooks

    // Never destroyed: a gate may outlive static destruction (an engine an application
    // never closed), and fork() may come at any time.
    static ForkGateRegistry& get() {
        static ForkGateRegistry* r = [] {
            auto* reg = new ForkGateRegistry;
            // Fails only without memory: forks then go unguarded, as before gates existed.
            (void)pthread_atfork(&prepare, &after, &after);
            return reg;
        }();
        return *r;
    }

    // Gates taken in registration order; engine threads hold only their own, so no cycle.
    static void prepare() {
        ForkGateRegistry& r = get();
        r.mutex.lock();
        for (ForkGate* g : r.gates) g->mutex_.lock();
        for (const auto& hook : r.hooks) hook.first();
    }
    // In the parent and in the child alike: the forking thread took every lock, and in the
    // child it is that thread's copy that goes on.
    static void after() {
        ForkGateRegistry& r = get();
        for (auto it = r.hooks.rbegin(); it != r.hooks.rend(); ++it) it->second();
        for (ForkGate* g : r.gates) g->mutex_.unlock();
        r.mutex.unlock();
    }
};

ForkGate::ForkGate() {
    ForkGateRegistry& r = ForkGateRegistry::get();
    std::lock_guard lock(r.mutex);
    r.gates.push_back(this);
}

void ForkGate::add_hooks(void (*prepare)(), void (*after)()) {
    ForkGateRegistry& r = ForkGateRegistry::get();
    std::lock_guard lock(r.mutex);
    r.hooks.emplace_back(prepare, after);
}

ForkGate::~ForkGate() {
    ForkGateRegistry& r = ForkGateRegistry::get();
    std::lock_guard lock(r.mutex);
    r.gates.erase(std::remove(r.gates.begin(), r.gates.end(), this), r.gates.end());
}

}  // namespace uroce::transport
