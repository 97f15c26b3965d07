// SPDX-License-Identifier: MIT
// Recycled storage for the arrays collectives return. A fresh large array costs a page fault
// per 4 KiB when first written (10-14 us each on virtual machines: more than the collective
// itself), so when the last copy of a result goes away its array waits here, and the next
// output of the same element type and size takes it: a collective called in a loop writes
// into memory it already touched. The array objects and the shared_ptr control blocks of
// results are recycled too, so that a collective called again allocates nothing.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <namedax/detail/compilation.hpp>

#include <xtensor/xarray.hpp>
#include <xtensor/xexpression.hpp>

#include <array>
#include <cstddef>
#include <memory>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace namedax::detail {

/// At most this many bytes, and this many arrays, wait in each element type's shared pool;
/// the oldest go first.
inline constexpr std::size_t recycled_bytes_max = std::size_t{1} << 30;
inline constexpr std::size_t recycled_arrays_max = 64;

/// An empty array: a default-constructed xt::xarray allocates room for one element.
template <class T>
xt::xarray<T> empty_array() {
  return xt::xarray<T>::from_shape(std::array<std::size_t, 1>{0});
}

/// K empty arrays, without an element allocated (for storage that a call may or may not use).
template <class T, std::size_t K>
std::array<xt::xarray<T>, K> empty_arrays() {
  return []<std::size_t... I>(std::index_sequence<I...>) {
    return std::array<xt::xarray<T>, K>{(void(I), empty_array<T>())...};
  }(std::make_index_sequence<K>{});
}

/// Blocks of `Size` bytes recycled through free lists of bounded length: one per thread
/// (no lock: device threads make results at the same moment), then one shared by all.
template <std::size_t Size>
class block_recycler {
 public:
  static void* take() {
    if (local_blocks& mine = local(); mine.count > 0) return mine.free[--mine.count];
    shared_blocks& all = shared();
    {
      std::lock_guard guard(all.lock);
      if (all.count > 0) return all.free[--all.count];
    }
    return ::operator new(Size);
  }
  static void give(void* block) noexcept {
    if (local_blocks& mine = local(); mine.count < mine.free.size()) {
      mine.free[mine.count++] = block;
      return;
    }
    give_shared(block);
  }

 private:
  static void give_shared(void* block) noexcept {
    shared_blocks& all = shared();
    {
      std::lock_guard guard(all.lock);
      if (all.count < all.free.size()) {
        all.free[all.count++] = block;
        return;
      }
    }
    ::operator delete(block);
  }
  struct local_blocks {
    // Short, so that blocks freed by the threads that drop results reach, through the
    // shared list, the thread that makes them.
    std::array<void*, 8> free{};
    std::size_t count = 0;
    ~local_blocks() {
      while (count > 0) give_shared(free[--count]);
    }
  };
  struct shared_blocks {
    std::mutex lock;
    std::array<void*, 256> free{};
    std::size_t count = 0;
  };
  static local_blocks& local() {
    thread_local local_blocks blocks;
    return blocks;
  }
  static shared_blocks& shared() {
    static shared_blocks blocks;
    return blocks;
  }
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

/// Arrays waiting for reuse, the oldest first, at most `max_bytes` and `max_arrays` of them.
template <class T>
struct spare_arrays {
  std::vector<xt::xarray<T>> arrays;
  std::size_t bytes = 0;

  bool take(std::size_t count, xt::xarray<T>& into) {
    for (std::size_t k = arrays.size(); k-- > 0;)
      if (arrays[k].size() == count) {
        into = std::move(arrays[k]);
        bytes -= count * sizeof(T);
        arrays.erase(arrays.begin() + static_cast<std::ptrdiff_t>(k));
        return true;
      }
    return false;
  }
  void give(xt::xarray<T>&& a, std::size_t max_bytes, std::size_t max_arrays) {
    const std::size_t size = a.size() * sizeof(T);
    if (arrays.capacity() == 0) arrays.reserve(max_arrays + 1);
    while (!arrays.empty() && (bytes + size > max_bytes || arrays.size() >= max_arrays)) {
      bytes -= arrays.front().size() * sizeof(T);
      arrays.erase(arrays.begin());
    }
    bytes += size;
    arrays.push_back(std::move(a));
  }
};

/// Below this size an array waits in its thread's own pool (no lock), else in the one all
/// threads share (a large array is worth finding from any thread).
inline constexpr std::size_t shared_pool_bytes_min = std::size_t{64} << 10;

template <class T>
class array_pool {
 public:
  static array_pool& instance() {
    static array_pool pool;
    return pool;
  }

  /// An array of `count` elements whose contents are left over, if one waits.
  bool take(std::size_t count, xt::xarray<T>& into) {
    if (count * sizeof(T) < shared_pool_bytes_min) return local().take(count, into);
    std::lock_guard guard(lock_);
    return shared_.take(count, into);
  }

  void give(xt::xarray<T>&& a) {
    const std::size_t bytes = a.size() * sizeof(T);
    if (bytes == 0 || bytes > recycled_bytes_max) return;
    if (bytes < shared_pool_bytes_min) return local().give(std::move(a), shared_pool_bytes_min * 4, 16);
    std::lock_guard guard(lock_);
    shared_.give(std::move(a), recycled_bytes_max, recycled_arrays_max);
  }

 private:
  static spare_arrays<T>& local() {
    thread_local spare_arrays<T> spares;
    return spares;
  }
  std::mutex lock_;
  spare_arrays<T> shared_;
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

#ifdef NAMEDAX_SEPARATE_COMPILATION  // defined once, by <namedax/separate_compilation.hpp>
#define NAMEDAX_INSTANTIATE(T)                  \
  NAMEDAX_EXTERN template struct spare_arrays<T>; \
  NAMEDAX_EXTERN template class array_pool<T>;    \
  NAMEDAX_EXTERN template std::shared_ptr<xt::xarray<T>> shared_storage<T>(xt::xarray<T>&&);
NAMEDAX_FOR_EACH_ELEMENT_TYPE(NAMEDAX_INSTANTIATE)
NAMEDAX_INSTANTIATE(bool)
#undef NAMEDAX_INSTANTIATE
#endif

}  // namespace namedax::detail
