// SPDX-License-Identifier: MIT
// Runs one body per simulated device, all at once: oneTBB tasks, with a thread of its own for
// any device TBB has not started shortly, since blocking rendezvous need every device running.
#pragma once

#include <namedax/detail/runtime.hpp>

#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <latch>
#include <thread>

namespace namedax::detail {

inline tbb::task_arena& device_arena() {
  // TBB caps concurrency at the core count unless both the arena and the global limit allow
  // more; even then it promises nothing, hence the fallback threads in run_devices.
  static tbb::global_control limit(tbb::global_control::max_allowed_parallelism, 256);
  static tbb::task_arena arena(256, 1);
  return arena;
}

/// Runs `body(d)` for d in [0, n) concurrently, each on a thread whose frame stack is the
/// caller's plus the device frame of `name`. Rethrows the first exception a device threw.
template <class Body>
void run_devices(std::string_view name, std::size_t n, Body&& body) {
  std::vector<frame> parent = frames();
  std::shared_ptr<device_record> parent_record = current_device();
  std::shared_ptr<world> shared;
  for (const frame& f : parent)
    if (f.shared) shared = f.shared;  // nested pmaps share the outermost one's world
  if (!shared) shared = std::make_shared<world>();
  const std::string parent_path = device_path(parent);

  struct launch {
    std::vector<std::shared_ptr<device_record>> records;
    std::unique_ptr<std::atomic<bool>[]> claimed;
    std::latch done;
    std::size_t remaining;
    std::exception_ptr first_error;
    std::mutex start_lock;
    std::condition_variable started_all;
    std::size_t started = 0;
    explicit launch(std::size_t n) : claimed(new std::atomic<bool>[n]), done(static_cast<std::ptrdiff_t>(n)), remaining(n) {
      for (std::size_t d = 0; d < n; ++d) claimed[d] = false;
    }
  };
  auto state = std::make_shared<launch>(n);
  {
    std::lock_guard guard(shared->lock);
    for (std::size_t d = 0; d < n; ++d) {
      auto record = std::make_shared<device_record>();
      record->path = parent_path;
      append_coordinate(record->path, name, d);
      shared->devices[record->path] = record;
      state->records.push_back(std::move(record));
    }
    shared->running += static_cast<int>(n);
    if (parent_record) parent_record->now = device_record::state::in_nested_map, --shared->running;
  }

  auto run = [&, state](std::size_t d) {
    if (state->claimed[d].exchange(true)) return;
    {
      std::lock_guard guard(state->start_lock);
      if (++state->started == n) state->started_all.notify_one();
    }
    auto record = state->records[d];
    {
      std::vector<frame> stack = parent;
      stack.push_back(frame{name, n, placement::devices, d, shared});
      frame_scope scope(std::move(stack), record);
      try {
        body(d);
      } catch (...) {
        std::string what = "an exception that is not a std::exception";
        try {
          throw;
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        std::lock_guard guard(shared->lock);
        if (!state->first_error) state->first_error = std::current_exception();
        record->now = device_record::state::failed;
        shared->poison(message("device ", record->path, " threw: ", what));
      }
    }
    {
      std::lock_guard guard(shared->lock);
      if (record->now != device_record::state::failed) record->now = device_record::state::finished;
      --shared->running;
      if (--state->remaining == 0 && parent_record)
        parent_record->now = device_record::state::running, ++shared->running;
      shared->wake.notify_all();
    }
    state->done.count_down();
  };

  auto& arena = device_arena();
  for (std::size_t d = 0; d < n; ++d) arena.enqueue([run, d] { run(d); });

  // Devices TBB has not started after a short grace period get a thread of their own.
  {
    std::unique_lock guard(state->start_lock);
    state->started_all.wait_for(guard, std::chrono::milliseconds(20), [&] { return state->started == n; });
  }
  std::vector<std::thread> fallback;
  for (std::size_t d = 0; d < n; ++d)
    if (!state->claimed[d].load()) fallback.emplace_back(run, d);
  state->done.wait();
  for (auto& t : fallback) t.join();
  if (state->first_error) std::rethrow_exception(state->first_error);
}

}  // namespace namedax::detail
