// SPDX-License-Identifier: MIT
// Fault injection: the points of a collective where a test makes one device fail, on purpose
// rather than by luck (tests/test_faults.cpp), to prove that every device then gets an error
// and that nothing crashes or hangs.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <atomic>
#include <string_view>

namespace namedax::detail {

/// Where in a collective a fault can be injected.
enum class fault_point {
  arrival,     // before the device offers its payload
  exchanged,   // after the first barrier: the others may read its payload from now on
  reading,     // before it says it is done reading: the others may still read its payload
  allocation,  // an output array is about to be allocated (throw std::bad_alloc here)
};

/// A hook called at every fault point, with the operation ("psum"; empty for an allocation).
using fault_hook = void (*)(fault_point, std::string_view operation);

/// The hook in force; null, the default, costs one relaxed load per point.
inline std::atomic<fault_hook>& fault_injection() {
  static std::atomic<fault_hook> hook{nullptr};
  return hook;
}

inline void at_fault_point(fault_point point, std::string_view operation) {
  if (fault_hook hook = fault_injection().load(std::memory_order_relaxed)) hook(point, operation);
}

}  // namespace namedax::detail
