// SPDX-License-Identifier: MIT
// Recycled storage for the arrays collectives return. A fresh large array costs a page fault
// per 4 KiB when first written (10-14 us each on virtual machines: more than the collective
// itself), so when the last copy of a result goes away its array waits here, and the next
// output of the same element type and size takes it: a collective called in a loop writes
// into memory it already touched.
#pragma once

#include <xtensor/xarray.hpp>
#include <xtensor/xexpression.hpp>

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace namedax::detail {

/// Arrays smaller than this are left to malloc, which reuses small blocks by itself.
inline constexpr std::size_t recycled_bytes_min = std::size_t{64} << 10;
/// At most this many bytes wait in each element type's pool; the oldest go first.
inline constexpr std::size_t recycled_bytes_max = std::size_t{1} << 30;

template <class T>
class array_pool {
 public:
  static array_pool& instance() {
    static array_pool pool;
    return pool;
  }

  /// An array of `count` elements whose contents are left over, if one waits.
  bool take(std::size_t count, xt::xarray<T>& into) {
    if (count * sizeof(T) < recycled_bytes_min) return false;
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
    if (bytes < recycled_bytes_min || bytes > recycled_bytes_max) return;
    std::lock_guard guard(lock_);
    while (!spare_.empty() && bytes_ + bytes > recycled_bytes_max) {
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

/// Takes a recycled array of `shape` (its contents left over) into `into`, if one of that
/// size waits.
template <class T, class Shape>
bool reuse_array(const Shape& shape, xt::xarray<T>& into) {
  std::size_t count = 1;
  for (auto extent : shape) count *= static_cast<std::size_t>(extent);
  if (!array_pool<T>::instance().take(count, into)) return false;
  into.reshape(std::vector<std::size_t>(std::begin(shape), std::end(shape)));
  return true;
}

/// Returns an array to its pool when the last shared copy of it goes away.
template <class T>
struct recycle_on_release {
  void operator()(xt::xarray<T>* a) const {
    array_pool<T>::instance().give(std::move(*a));
    delete a;
  }
};

/// An owned, shareable container: copies of a named value share it, so lazy expressions
/// built from it stay valid after the named value that made them is gone.
template <class T>
using shared_array = xt::xshared_expression<xt::xarray<T>>;

/// Shares an array without copying it (xt::make_xshared copies its elements).
template <class T>
shared_array<T> share_array(xt::xarray<T>&& a) {
  // When the last copy goes, the array waits in its pool for the next output of its size.
  return shared_array<T>(std::shared_ptr<xt::xarray<T>>(new xt::xarray<T>(std::move(a)), recycle_on_release<T>{}));
}

}  // namespace namedax::detail
