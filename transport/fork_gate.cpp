// See fork_gate.h.
#include "transport/fork_gate.h"

#include <pthread.h>

#include <algorithm>
#include <vector>

namespace uroce::transport {

struct ForkGateRegistry {
    std::mutex mutex;
    std::vector<ForkGate*> gates;

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
    }
    // In the parent and in the child alike: the forking thread took every lock, and in the
    // child it is that thread's copy that goes on.
    static void after() {
        ForkGateRegistry& r = get();
        for (ForkGate* g : r.gates) g->mutex_.unlock();
        r.mutex.unlock();
    }
};

ForkGate::ForkGate() {
    ForkGateRegistry& r = ForkGateRegistry::get();
    std::lock_guard lock(r.mutex);
    r.gates.push_back(this);
}

ForkGate::~ForkGate() {
    ForkGateRegistry& r = ForkGateRegistry::get();
    std::lock_guard lock(r.mutex);
    r.gates.erase(std::remove(r.gates.begin(), r.gates.end(), this), r.gates.end());
}

}  // namespace uroce::transport
