// One of a bounded number of objects of a kind (QPs, CQs, PDs, MRs) in a context: taking
// the slot fails past the limit, and deleting the object that holds it gives it back, so
// no destroy path has to remember to.
#pragma once

#include <atomic>

namespace uroce::provider {

class LimitedSlot {
  public:
    LimitedSlot() = default;
    ~LimitedSlot() {
        if (count_) count_->fetch_sub(1, std::memory_order_relaxed);
    }
    LimitedSlot(const LimitedSlot&) = delete;
    LimitedSlot& operator=(const LimitedSlot&) = delete;

    // False (and nothing taken) if `count` already reached `limit`.
    bool acquire(std::atomic<int>& count, int limit) {
        if (count.fetch_add(1, std::memory_order_relaxed) >= limit) {
            count.fetch_sub(1, std::memory_order_relaxed);
            return false;
        }
        count_ = &count;
        return true;
    }

  private:
    std::atomic<int>* count_ = nullptr;
};

}  // namespace uroce::provider
