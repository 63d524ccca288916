// RingQueue: a first-in first-out queue of work requests in one array.
//
// Why not std::deque: libstdc++ gives each deque block 512 bytes, or one element when the
// element is larger. A SendWqe is about 600 bytes and a RecvWqe about 270, so a queue of them
// allocated a block at every post and freed it at every completion: about 40 ns of malloc and
// free per work request, twice per round trip of a ping-pong (2026-12-02). This queue keeps
// its array: it grows by doubling when full and never shrinks (clear() keeps it too), so a QP
// holds room for the most requests it ever had queued at once, at most its max_send_wr or
// max_recv_wr rounded up to a power of two.
//
// Unlike std::deque, adding an element may move the others: no reference or pointer into
// the queue may be held across emplace_back() or push_back().
#pragma once

#include <algorithm>
#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace uroce::transport {

template <typename T>
class RingQueue {
    // A removed element is left where it was, to be overwritten: it must own nothing.
    static_assert(std::is_trivially_destructible_v<T>);

  public:
    size_t size() const { return count_; }
    bool empty() const { return count_ == 0; }
    // Room before the array must grow.
    size_t capacity() const { return slots_.size(); }

    // The i-th element from the front.
    T& operator[](size_t i) { return slots_[(head_ + i) & mask()]; }
    const T& operator[](size_t i) const { return slots_[(head_ + i) & mask()]; }
    T& front() { return (*this)[0]; }
    const T& front() const { return (*this)[0]; }
    T& back() { return (*this)[count_ - 1]; }

    // A new element at the back, built in place from `args` (T{args...}).
    template <typename... Args>
    T& emplace_back(Args&&... args) {
        if (count_ == slots_.size()) grow();
        // Built where it goes (T{...} assigned would be built, then copied): the slot's
        // object, trivially destructible, is simply replaced.
        T* slot = ::new (&slots_[(head_ + count_) & mask()]) T{std::forward<Args>(args)...};
        ++count_;
        return *slot;
    }
    void push_back(const T& value) { emplace_back(value); }

    void pop_front() {
        head_ = (head_ + 1) & mask();
        --count_;
    }
    // Keeps the first `n` elements (all of them if there are fewer), drops the rest.
    void truncate(size_t n) { count_ = std::min(count_, n); }
    // Empties the queue; the array stays.
    void clear() {
        head_ = 0;
        count_ = 0;
    }

  private:
    size_t mask() const { return slots_.size() - 1; }  // the size is a power of two

    void grow() {
        std::vector<T> bigger(std::max<size_t>(1, slots_.size() * 2));
        for (size_t i = 0; i < count_; ++i) bigger[i] = (*this)[i];
        slots_ = std::move(bigger);
        head_ = 0;
    }

    std::vector<T> slots_;
    size_t head_ = 0;
    size_t count_ = 0;
};

}  // namespace uroce::transport
