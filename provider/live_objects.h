// The objects of one kind a context has handed out and not taken back. A kernel provider
// frees whatever an application left behind when its context closes (the uverbs file is
// released); uroce is that kernel, so free_context reclaims what is still listed here.
#pragma once

#include <mutex>
#include <unordered_set>

namespace uroce::provider {

template <class T>
class LiveObjects {
  public:
    // False (nothing listed) only if memory ran out; the caller then fails the create.
    bool add(T* object) noexcept {
        std::lock_guard lock(mutex_);
        try {
            objects_.insert(object);
            return true;
        } catch (...) {
            return false;
        }
    }

    void remove(T* object) noexcept {
        std::lock_guard lock(mutex_);
        objects_.erase(object);
    }

    // Everything still listed, and the list emptied (no allocation: the set is swapped out).
    std::unordered_set<T*> take_all() noexcept {
        std::unordered_set<T*> out;
        std::lock_guard lock(mutex_);
        out.swap(objects_);
        return out;
    }

  private:
    std::mutex mutex_;
    std::unordered_set<T*> objects_;
};

}  // namespace uroce::provider
