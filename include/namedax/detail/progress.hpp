// SPDX-License-Identifier: MIT
// Progress of the transport's nonblocking calls. MPI moves a nonblocking collective on only
// inside MPI calls; while an asynchronous collective among processes is in flight, namedax's
// array operations (each evaluation, each contraction) give MPI a turn, so that the exchange
// goes on while the program computes, without the program polling.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <atomic>

namespace namedax::detail {

/// Set by the MPI backend while one of its nonblocking calls is in flight, else null.
inline std::atomic<void (*)()>& progress_hook() {
  static std::atomic<void (*)()> hook{nullptr};
  return hook;
}

/// Gives the transport a turn when a call is in flight: one relaxed load otherwise. The hook
/// itself checks that it runs on the thread that calls MPI.
inline void drive_progress() {
  if (auto hook = progress_hook().load(std::memory_order_relaxed)) hook();
}

}  // namespace namedax::detail
