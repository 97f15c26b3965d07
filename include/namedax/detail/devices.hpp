// SPDX-License-Identifier: MIT
// Runs one body per simulated device, all at once: oneTBB tasks, with a thread of its own for
// any device TBB has not started shortly, since blocking rendezvous need every device running.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <namedax/detail/thread_sanitizer.hpp>
#include <namedax/detail/compilation.hpp>
#include <namedax/detail/rendezvous.hpp>
#include <namedax/detail/runtime.hpp>

#if NAMEDAX_DEFINITIONS  // with separate compilation, only the unit that defines the launch parses oneTBB
#include <tbb/global_control.h>
#include <tbb/task_arena.h>
#endif

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <latch>
#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <typeinfo>


namespace namedax::detail {

/// Rethrows a device's exception. One of the standard exception types (exactly, not a class
/// derived from it) is rethrown as the same type with the device and the last collectives
/// each device entered appended to its message; any other type is rethrown unchanged.
[[noreturn]] NAMEDAX_DECL void rethrow_from_device(std::exception_ptr error, const std::string& note);
/// Whether an exception is an abort that another device's failure caused.
NAMEDAX_DECL bool is_abort(std::exception_ptr error);
/// What an exception says: its what(), or that it is not a std::exception.
NAMEDAX_DECL std::string description_of(std::exception_ptr error);

#if NAMEDAX_DEFINITIONS
[[noreturn]] NAMEDAX_DECL void rethrow_from_device(std::exception_ptr error, const std::string& note) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    auto same = [&]<class E>(std::type_identity<E>) {
      if (typeid(e) == typeid(E)) throw E(e.what() + note);
    };
    same(std::type_identity<std::runtime_error>{}), same(std::type_identity<std::logic_error>{});
    same(std::type_identity<std::invalid_argument>{}), same(std::type_identity<std::out_of_range>{});
    same(std::type_identity<std::domain_error>{}), same(std::type_identity<std::length_error>{});
    same(std::type_identity<std::range_error>{}), same(std::type_identity<std::overflow_error>{});
    same(std::type_identity<std::underflow_error>{});
    throw;
  }
}

NAMEDAX_DECL bool is_abort(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const collective_abort&) {
    return true;
  } catch (...) {
    return false;
  }
}

NAMEDAX_DECL std::string description_of(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}
#endif

/// Called, when set, before device `device` of a launch is started (`own_thread`: on a thread
/// of its own, else as a TBB task); what it throws stands for a start that failed (tests set it).
inline void (*before_device_start)(std::size_t device, bool own_thread) = nullptr;

/// Runs `body(d)` for d in [0, n) concurrently, each on a thread whose frame stack is the
/// caller's plus the device frame of `name`. Rethrows the first exception any device threw.
NAMEDAX_DECL void launch_devices(std::string_view name, std::size_t n, index_body body);

#if NAMEDAX_DEFINITIONS
/// Lets TBB run up to 256 tasks at once (it caps concurrency at the core count unless the
/// global limit allows more; even then it promises nothing, hence the fallback threads in
/// run_devices).
NAMEDAX_DECL void allow_many_devices() {
  static tbb::global_control limit(tbb::global_control::max_allowed_parallelism, 256);
}

NAMEDAX_DECL void launch_devices(std::string_view name, std::size_t n, index_body body) {
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
    bool failed = false;
    std::mutex start_lock;
    std::condition_variable started_all;
    std::size_t started = 0;
    explicit launch(std::size_t n) : claimed(new std::atomic<bool>[n]), done(static_cast<std::ptrdiff_t>(n)), remaining(n) {
      for (std::size_t d = 0; d < n; ++d) claimed[d] = false;
    }
  };
  auto state = std::make_shared<launch>(n);
  const std::string launches = parent_record ? message(parent_record->launches, '/', parent_record->maps_launched++) : "";
  {
    std::lock_guard guard(shared->lock);
    for (std::size_t d = 0; d < n; ++d) {
      auto record = std::make_shared<device_record>();
      record->path = parent_path;
      record->launches = launches;
      append_coordinate(record->path, name, d);
      shared->devices[record->path] = record;
      state->records.push_back(std::move(record));
    }
    shared->running += static_cast<int>(n);
    if (parent_record) parent_record->now = device_record::state::in_nested_map, --shared->running;
  }

  // A device that ran, or will never run (`started` false): its record says so, it lets go of
  // its communicators, and the last one gives the enclosing device back to its own map.
  auto leave = [&, state](device_record& record, bool started) {
    {
      std::lock_guard guard(shared->lock);
      if (!started) record.now = device_record::state::failed;
      if (record.now != device_record::state::failed) record.now = device_record::state::finished;
      leave_communicators(*shared, record);
      --shared->running;
      if (--state->remaining == 0 && parent_record)
        parent_record->now = device_record::state::running, ++shared->running;
    }
    state->done.count_down();
  };

  auto run = [&, state](std::size_t d) {
    if (state->claimed[d].exchange(true)) return;
    {
      std::lock_guard guard(state->start_lock);
      if (++state->started == n) state->started_all.notify_one();
    }
    auto record = state->records[d];
    {
      std::vector<frame> stack = parent;
      stack.push_back(frame{name, n, placement::devices, d, shared, nullptr});
      frame_scope scope(std::move(stack), record);
      try {
        body(d);
      } catch (...) {
        const std::string what = description_of(std::current_exception());
        const bool aborted = is_abort(std::current_exception());
        std::lock_guard guard(shared->lock);
        state->failed = true;
        // A device's own error wins over the aborts it caused, which may escape first (the
        // others leave an exchange as soon as it has unwound through it).
        const bool root = !shared->first_error || (shared->first_error_is_abort && !aborted);
        if (root)
          shared->first_error = std::current_exception(), shared->first_error_is_abort = aborted,
          shared->error_note = message(" (thrown on device ", record->path, ")", shared->recent_collectives());
        record->now = device_record::state::failed;
        const std::string why = message("device ", record->path, " threw: ", what);
        shared->poison(why);
        if (root && !aborted) shared->reason = why;  // the devices still waiting are told the cause
      }
    }
    leave(*record, true);
  };

  std::size_t starting = 0;  // the device being started, for a report
  std::vector<std::thread> fallback;
#ifndef NAMEDAX_THREAD_SANITIZER  // under TSan every device gets a std::thread of its own
  std::optional<tbb::task_arena> arena;
#endif
  try {
#ifndef NAMEDAX_THREAD_SANITIZER
    // An arena of this map's own, as wide as it has devices: TBB wakes that many workers for
    // it, not a worker for every slot of a wide shared arena (idle workers spin).
    allow_many_devices();
    // At most 255 slots: the global limit of 256 counts this thread, and TBB warns beyond it.
    arena.emplace(static_cast<int>(std::min<std::size_t>(n, 255)), 0);
    for (starting = 0; starting < n; ++starting) {
      if (before_device_start) before_device_start(starting, false);
      arena->enqueue([run, d = starting] { run(d); });
    }

    // Devices TBB has not started after a short grace period get a thread of their own.
    {
      std::unique_lock guard(state->start_lock);
      state->started_all.wait_for(guard, std::chrono::milliseconds(20), [&] { return state->started == n; });
    }
#endif
    fallback.reserve(n);
    for (starting = 0; starting < n; ++starting)
      if (!state->claimed[starting].load()) {
        if (before_device_start) before_device_start(starting, true);
        fallback.emplace_back(run, starting);
      }
  } catch (...) {
    // Out of threads or memory. The devices that started wait in collectives for those that
    // never will: the poisoned world sends them away, and the launch stands in for each device
    // nobody started, so that every thread that did start is joined before the error leaves.
    const std::string why = message("namedax::pmap<\"", name, "\">: could not start device thread ", starting, " of ", n,
                                    ": ", description_of(std::current_exception()),
                                    "; use fewer devices, or allow the process more threads or memory");
    {
      std::lock_guard guard(shared->lock);
      state->failed = true;
      if (!shared->first_error) shared->first_error = std::make_exception_ptr(error(why));
      shared->poison(why);
    }
    for (std::size_t d = 0; d < n; ++d)
      if (!state->claimed[d].exchange(true)) leave(*state->records[d], false);
  }
  state->done.wait();
  for (auto& t : fallback) t.join();
  if (!parent_record && tracing()) flush_trace_file();
  // A failure that poisoned the world is final even when every device caught what it threw (an
  // asynchronous mismatch, a device that returned while another waited for it): the outermost
  // pmap reports it.
  if (!state->failed && (parent_record || !shared->poisoned)) return;
  if (!shared->first_error) shared->first_error = std::make_exception_ptr(collective_error(shared->reason));
  // The first exception of any device, however deeply nested; the outermost pmap says where.
  if (parent_record) std::rethrow_exception(shared->first_error);
  rethrow_from_device(shared->first_error, shared->error_note);
}
#endif

/// Runs `body(d)` for d in [0, n) concurrently: launch_devices on a reference to `body`.
template <class Body>
void run_devices(std::string_view name, std::size_t n, Body&& body) {
  launch_devices(name, n, index_body(body));
}

}  // namespace namedax::detail
