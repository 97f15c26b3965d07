// SPDX-License-Identifier: MIT
// Recycled storage for the arrays collectives return. A fresh large array costs a page fault
// per 4 KiB when first written (10-14 us each on virtual machines: more than the collective
// itself), so when the last copy of a result goes away its array waits here, and the next
// output of the same element type and size takes it: a collective called in a loop writes
// into memory it already touched. The array objects and the shared_ptr control blocks of
// results are recycled too, so that a collective called again allocates nothing.
#pragma once

#include <xtensor/xarray.hpp>
#include <xtensor/xexpression.hpp>

#include <array>
#include <cstddef>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

namespace namedax::detail {

/// At most this many bytes, and this many arrays, wait in each element type's pool; the
/// oldest go first.
inline constexpr std::size_t recycled_bytes_max = std::size_t{1} << 30;
inline constexpr std::size_t recycled_arrays_max = 64;

/// An empty array: a default-constructed xt::xarray allocates room for one element.
template <class T>
xt::xarray<T> empty_array() {
  return xt::xarray<T>::from_shape(std::array<std::size_t, 1>{0});
}

/// Blocks of `Size` bytes recycled through a free list of bounded length.
template <std::size_t Size>
class block_recycler {
 public:
  static void* take() {
    block_recycler& r = instance();
    {
      std::lock_guard guard(r.lock_);
      if (r.count_ > 0) return r.free_[--r.count_];
    }
    return ::operator new(Size);
  }
  static void give(void* block) noexcept {
    block_recycler& r = instance();
    {
      std::lock_guard guard(r.lock_);
      if (r.count_ < r.free_.size()) {
        r.free_[r.count_++] = block;
        return;
      }
    }
    ::operator delete(block);
  }

 private:
  static block_recycler& instance() {
    static block_recycler recycler;
    return recycler;
  }
  std::mutex lock_;
  std::array<void*, 256> free_{};
  std::size_t count_ = 0;
};

/// An allocator of single objects from a block_recycler (the control blocks of shared results).
template <class U>
struct recycling_allocator {
  using value_type = U;
  static_assert(alignof(U) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__);
  recycling_allocator() = default;
  template <class V>
  recycling_allocator(const recycling_allocator<V>&) noexcept {}
  U* allocate(std::size_t n) {
    return static_cast<U*>(n == 1 ? block_recycler<sizeof(U)>::take() : ::operator new(n * sizeof(U)));
  }
  void deallocate(U* p, std::size_t n) noexcept {
    if (n == 1) block_recycler<sizeof(U)>::give(p);
    else ::operator delete(p);
  }
  template <class V>
  bool operator==(const recycling_allocator<V>&) const noexcept {
    return true;
  }
};

template <class T>
class array_pool {
 public:
  static array_pool& instance() {
    static array_pool pool;
    return pool;
  }

  /// An array of `count` elements whose contents are left over, if one waits.
  bool take(std::size_t count, xt::xarray<T>& into) {
    std::lock_guard guard(lock_);
    for (std::size_t k = spare_.size(); k-- > 0;)
      if (spare_[k].size() == count) {
        into = std::move(spare_[k]);
        bytes_ -= count * sizeof(T);
        spare_.erase(spare_.begin() + static_cast<std::ptrdiff_t>(k));
        return true;
      }
    return false;
  }

  void give(xt::xarray<T>&& a) {
    const std::size_t bytes = a.size() * sizeof(T);
    if (bytes == 0 || bytes > recycled_bytes_max) return;
    std::lock_guard guard(lock_);
    if (spare_.capacity() == 0) spare_.reserve(recycled_arrays_max + 1);
    while (!spare_.empty() && (bytes_ + bytes > recycled_bytes_max || spare_.size() >= recycled_arrays_max)) {
      bytes_ -= spare_.front().size() * sizeof(T);
      spare_.erase(spare_.begin());
    }
    bytes_ += bytes;
    spare_.push_back(std::move(a));
  }

  void clear() {
    std::lock_guard guard(lock_);
    spare_.clear();
    bytes_ = 0;
  }

 private:
  std::mutex lock_;
  std::vector<xt::xarray<T>> spare_;
  std::size_t bytes_ = 0;
};

/// Gives an array that is no longer needed to its pool, for the next output of its size.
template <class T>
void recycle(xt::xarray<T>&& a) {
  array_pool<T>::instance().give(std::move(a));
}

/// Takes a recycled array of `shape` (its contents left over) into `into`, if one of that
/// size waits.
template <class T, class Shape>
bool reuse_array(const Shape& shape, xt::xarray<T>& into) {
  std::size_t count = 1;
  for (auto extent : shape) count *= static_cast<std::size_t>(extent);
  if (!array_pool<T>::instance().take(count, into)) return false;
  into.reshape(xt::svector<std::size_t, 8>(std::begin(shape), std::end(shape)));
  return true;
}

/// Returns an array to its pool, and its object to its recycler, when the last shared copy of
/// it goes away.
template <class T>
struct recycle_on_release {
  void operator()(xt::xarray<T>* a) const {
    array_pool<T>::instance().give(std::move(*a));
    using array = xt::xarray<T>;
    a->~array();
    block_recycler<sizeof(xt::xarray<T>)>::give(a);
  }
};

/// A shared owner of `a` whose array goes back to the pool when the last owner goes; its
/// object and control block are recycled blocks.
template <class T>
std::shared_ptr<xt::xarray<T>> shared_storage(xt::xarray<T>&& a) {
  auto* held = new (block_recycler<sizeof(xt::xarray<T>)>::take()) xt::xarray<T>(std::move(a));
  return std::shared_ptr<xt::xarray<T>>(held, recycle_on_release<T>{}, recycling_allocator<xt::xarray<T>>{});
}

/// An owned, shareable container: copies of a named value share it, so lazy expressions
/// built from it stay valid after the named value that made them is gone.
template <class T>
using shared_array = xt::xshared_expression<xt::xarray<T>>;

/// Shares an array without copying it (xt::make_xshared copies its elements).
template <class T>
shared_array<T> share_array(xt::xarray<T>&& a) {
  // When the last copy goes, the array waits in its pool for the next output of its size.
  return shared_array<T>(shared_storage(std::move(a)));
}

}  // namespace namedax::detail
