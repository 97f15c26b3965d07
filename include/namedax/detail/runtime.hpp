// SPDX-License-Identifier: MIT
// The runtime axis environment of a thread: one frame per enclosing map, with sizes, and for
// device axes the index of this device and the world its devices share.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <namedax/detail/compilation.hpp>
#include <namedax/error.hpp>
#include <namedax/named_shape.hpp>
#include <namedax/trace.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <span>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace namedax::detail {

struct communicator;

using groups_t = std::vector<std::vector<int>>;

/// How a process transport combines elements, and what it combines.
enum class fold_kind { sum, max, min };
enum class element_kind {
  boolean, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float32, float64, complex64, complex128
};

template <class T>
inline constexpr bool is_complex_v = false;
template <class T>
inline constexpr bool is_complex_v<std::complex<T>> = true;

/// The element type of a mean (pmean, namedax::mean, softmax, ...): integers and bool give
/// float32, floating and complex types keep theirs, as in JAX.
template <class T>
using inexact_t = std::conditional_t<std::is_floating_point_v<T> || is_complex_v<T>, T, float>;

template <class T>
constexpr element_kind element_kind_of() {
  constexpr std::size_t n = sizeof(T);
  if constexpr (std::is_same_v<T, bool>) return element_kind::boolean;
  else if constexpr (std::is_same_v<T, float>) return element_kind::float32;
  else if constexpr (std::is_same_v<T, double>) return element_kind::float64;
  else if constexpr (std::is_same_v<T, std::complex<float>>) return element_kind::complex64;
  else if constexpr (std::is_same_v<T, std::complex<double>>) return element_kind::complex128;
  else if constexpr (!std::is_integral_v<T> || n > 8)
    static_assert(always_false<T>, "namedax: elements are bool, integers, float, double or their std::complex");
  else if constexpr (std::is_signed_v<T>)
    return n == 1 ? element_kind::int8 : n == 2 ? element_kind::int16 : n == 4 ? element_kind::int32 : element_kind::int64;
  else
    return n == 1 ? element_kind::uint8 : n == 2 ? element_kind::uint16 : n == 4 ? element_kind::uint32 : element_kind::uint64;
}

/// The processes (MPI ranks) that differ along some process axes, reached by one
/// communicator: members of a collective that live in other processes. namedax/mpi.hpp
/// implements it; nothing else includes mpi.h.
struct process_channel {
  virtual ~process_channel() = default;
  [[nodiscard]] virtual std::size_t size() const = 0;
  [[nodiscard]] virtual std::size_t rank() const = 0;
  virtual void allgather(const void* mine, void* all, std::size_t bytes) = 0;
  virtual void allreduce(const void* in, void* out, std::size_t count, element_kind, fold_kind) = 0;
  virtual void reduce_scatter(const void* in, void* out, std::size_t count_each, element_kind, fold_kind) = 0;
  virtual void alltoall(const void* in, void* out, std::size_t bytes_each) = 0;
  /// Sends `send_bytes[k]` bytes at `in + send_at[k]` to rank k and receives `recv_bytes[k]`
  /// bytes from rank k at `out + recv_at[k]` (MPI_Alltoallv); `out` elsewhere is untouched.
  virtual void alltoallv(const void* in, std::span<const std::size_t> send_bytes, std::span<const std::size_t> send_at,
                         void* out, std::span<const std::size_t> recv_bytes, std::span<const std::size_t> recv_at) = 0;
  /// Copies `bytes` at `data` of rank `root` into `data` of every other rank.
  virtual void broadcast(void* data, std::size_t bytes, std::size_t root) = 0;
  /// Sends `bytes` to rank `to` and receives them from rank `from` (-1: none).
  virtual void sendrecv(const void* in, long to, void* out, long from, std::size_t bytes) = 0;
  /// A call started and not yet finished (MPI_Isend and MPI_Irecv, MPI_Iallreduce, ...):
  /// wait() finishes it. Destroyed before wait(), it lets go of its requests, and the arrays
  /// it reads and writes must then stay for the rest of the program, since the transport may
  /// still read and write them.
  struct pending_call {
    virtual ~pending_call() = default;
    virtual void wait() = 0;
  };
  /// Starts a sendrecv and returns without waiting for it; `in` and `out` must stay until it
  /// is finished. A transport without such calls finishes it here (and returns nothing).
  virtual std::unique_ptr<pending_call> start_sendrecv(const void* in, long to, void* out, long from, std::size_t bytes) {
    sendrecv(in, to, out, from, bytes);
    return nullptr;
  }
  /// allreduce, allgather, reduce_scatter and alltoall started, as start_sendrecv starts a
  /// sendrecv: the asynchronous collectives among processes.
  virtual std::unique_ptr<pending_call> start_allreduce(const void* in, void* out, std::size_t count, element_kind kind,
                                                        fold_kind fold) {
    allreduce(in, out, count, kind, fold);
    return nullptr;
  }
  virtual std::unique_ptr<pending_call> start_allgather(const void* mine, void* all, std::size_t bytes) {
    allgather(mine, all, bytes);
    return nullptr;
  }
  virtual std::unique_ptr<pending_call> start_reduce_scatter(const void* in, void* out, std::size_t count_each,
                                                             element_kind kind, fold_kind fold) {
    reduce_scatter(in, out, count_each, kind, fold);
    return nullptr;
  }
  virtual std::unique_ptr<pending_call> start_alltoall(const void* in, void* out, std::size_t bytes_each) {
    alltoall(in, out, bytes_each);
    return nullptr;
  }
};

/// The process axes of the enclosing maps and every channel among them. One per process and
/// process map; each process-axis frame holds the grid that includes its axis.
struct process_grid {
  virtual ~process_grid() = default;
  /// The channel among the processes that differ only along the process axes `names`,
  /// ranked row-major over them in the order given; with groups, this rank's group, ranked
  /// in the group's order. Created on first use (by every process at once) and kept.
  virtual process_channel& channel(std::span<const std::string_view> names, const groups_t* groups) = 0;
  /// Checks that every process makes the same call: `signature` must be equal everywhere,
  /// else every process throws a collective_error naming the processes and their calls.
  virtual void agree(std::string_view signature, std::string_view what) = 0;
  /// `agree`, and in the same exchange an all-reduce of `count` elements at `in` into `out`
  /// among the processes of channel(names, groups), where the transport can do both at once
  /// (MPI: a small payload among all processes, one MPI_Allreduce). Returns the number of
  /// processes reduced over then; 0 where it cannot, having done nothing: the caller agrees
  /// and reduces apart.
  virtual std::size_t agree_and_allreduce(std::string_view /*signature*/, std::string_view /*what*/,
                                          std::span<const std::string_view> /*names*/, const groups_t* /*groups*/,
                                          const void* /*in*/, void* /*out*/, std::size_t /*count*/, element_kind,
                                          fold_kind) {
    return 0;
  }
  /// `agree`, and in the same exchange an all-gather of `bytes` at `in` from every process of
  /// channel(names, groups) into `out`, in rank order, where the transport can do both at once
  /// (MPI: when every block fits the agreement). Returns the number of processes then, else 0.
  virtual std::size_t agree_and_allgather(std::string_view /*signature*/, std::string_view /*what*/,
                                          std::span<const std::string_view> /*names*/, const groups_t* /*groups*/,
                                          const void* /*in*/, void* /*out*/, std::size_t /*bytes*/) {
    return 0;
  }
  /// Processes per index of the innermost process axis (all processes before any): what a
  /// new process axis splits among its indices.
  [[nodiscard]] virtual std::size_t block_size() const = 0;
  /// The grid with process axis `name` of size n added, and this process's index along it.
  virtual std::pair<std::shared_ptr<process_grid>, std::size_t> push(std::string_view name, std::size_t n) = 0;
  /// Agrees on `signature` as `agree` does, always: where a process map starts (its size and
  /// kind of arguments) and returns (its results' shapes), so that a process that failed alone
  /// before (its `raise_everywhere`) is met there, and processes that differ throw.
  virtual void agree_always(std::string_view signature, std::string_view what) = 0;
  /// Rethrows `error`, which this process met alone, after telling the other processes through
  /// their next agreement (they throw a collective_error naming this process instead of
  /// waiting), unless every process knows of a failure already.
  [[noreturn]] virtual void raise_everywhere(std::exception_ptr error) = 0;
};

/// What one simulated device is doing, for error reports and departure checks.
struct device_record {
  enum class state { running, in_nested_map, finished, failed };
  std::string path;  // "i=0,j=2": the device coordinates along every device axis
  state now = state::running;
  // Its own lock, so that entering and waiting in a collective do not take the world's:
  // it guards what follows (read by error reports and deadlock checks, world's lock first).
  std::mutex lock;
  // While it sleeps in a rendezvous: what it waits in, and the barrier generation word and
  // value it waits to see change.
  std::string waiting_in;
  const std::atomic<std::uint32_t>* blocked_on = nullptr;
  std::uint32_t blocked_generation = 0;
  // The last collectives it entered, for error reports: entered % recent.size() is the next slot.
  std::uint64_t entered = 0;
  std::array<std::string, 3> recent;
  // The communicators this device met, by the names they span (its own thread only; axis
  // names are static text), its rank in each, and each one's key in the world.
  struct met_communicator {
    std::vector<std::string_view> names;
    communicator* comm;
    std::size_t rank;
    const std::string* key;
  };
  std::vector<met_communicator> met;
  // Which run of each enclosing pmap this device belongs to: "" on the outermost pmap's devices,
  // then "/k" for the k-th pmap each enclosing device launched, so that the devices of an inner
  // pmap run again (on every outer device alike) never meet those of an earlier run.
  std::string launches;
  std::size_t maps_launched = 0;  // the pmaps this device launched (its own thread only)

  static constexpr std::size_t text_capacity = 256;

  /// Records that it entered the collective of `signature`.
  void enter(std::string_view signature);
  /// Records that it sleeps in `what` until `generation` no longer holds `value`.
  void block(std::string_view what, const std::atomic<std::uint32_t>* generation, std::uint32_t value);
  void unblock() {
    std::lock_guard guard(lock);
    waiting_in.clear(), blocked_on = nullptr;
  }
  /// Whether it sleeps in a rendezvous that nobody has completed yet.
  [[nodiscard]] bool stuck() {
    std::lock_guard guard(lock);
    return blocked();
  }
  /// What it sleeps in, if it is stuck.
  [[nodiscard]] std::optional<std::string> stuck_in();

 private:
  [[nodiscard]] bool blocked() const { return blocked_on && blocked_on->load() == blocked_generation; }
};

/// Everything the devices of one outermost pmap share: one lock for their bookkeeping, the
/// devices by path (for departure and deadlock checks) and the communicators by key.
struct world {
  std::mutex lock;
  std::atomic<bool> poisoned{false};  // read without the lock by waiting devices
  std::string reason;
  std::exception_ptr first_error;  // the first exception any device threw, and where
  bool first_error_is_abort = false;  // it is a collective_abort: a device's own error replaces it
  std::string error_note;
  std::atomic<int> running{0};  // devices running user code (not joined on a nested pmap)
  std::unordered_map<std::string, std::shared_ptr<device_record>> devices;
  // Each communicator with the number of its members that met it and are done: the last one
  // frees it (an inner pmap that runs again and again gets new ones).
  struct shared_communicator {
    std::unique_ptr<communicator> comm;
    std::size_t members_done = 0;
  };
  std::unordered_map<std::string, shared_communicator> communicators;

  /// Makes every waiting device give up (they look at least once a millisecond).
  void poison(std::string why) {
    if (!poisoned) reason = std::move(why), poisoned = true;
  }

  /// Every running device sleeps in a rendezvous nobody can complete (call with the lock held).
  [[nodiscard]] bool deadlocked();

  /// "last collectives entered" per device, for error messages (call with the lock held).
  [[nodiscard]] std::string recent_collectives() const;
};

/// One enclosing map, as the thread sees it at run time.
struct frame {
  std::string_view name;
  std::size_t size = 0;
  placement place = placement::vectorized;
  std::size_t index = 0;  // this device's index (device axes only)
  std::shared_ptr<world> shared;  // device axes on threads only
  std::shared_ptr<process_grid> processes;  // device axes on processes only

  /// Whether its devices are threads of this process, which can read each other's memory.
  [[nodiscard]] bool on_threads() const { return shared && !processes; }
};

inline std::vector<frame>& frames() {
  thread_local std::vector<frame> stack;
  return stack;
}

inline std::shared_ptr<device_record>& current_device() {
  thread_local std::shared_ptr<device_record> record;
  return record;
}

/// The public function whose steps this thread runs now ("all_gather_matmul"; empty outside
/// one), for error reports: a collective matmul is made of public collectives, and a call that
/// differs among the devices is reported with the function the program called.
inline std::string_view& enclosing_function() {
  thread_local std::string_view name;
  return name;
}

/// " (in namedax::all_gather_matmul)" inside a function that enclosing_function names, else "".
NAMEDAX_DECL std::string enclosing_function_note();

/// Names `name` the enclosing function for the lifetime of the scope.
class enclosing_function_scope {
 public:
  explicit enclosing_function_scope(std::string_view name) : saved_(std::exchange(enclosing_function(), name)) {}
  enclosing_function_scope(const enclosing_function_scope&) = delete;
  enclosing_function_scope& operator=(const enclosing_function_scope&) = delete;
  ~enclosing_function_scope() { enclosing_function() = saved_; }

 private:
  std::string_view saved_;
};

inline const frame* find_frame(std::string_view name) {
  auto& stack = frames();
  for (auto it = stack.rbegin(); it != stack.rend(); ++it)
    if (it->name == name) return &*it;
  return nullptr;
}

/// The map that pushed a frame, as users spell it: "vmap", "pmap" or "mpi::pmap".
inline std::string_view map_verb(const frame& f) {
  if (f.place == placement::vectorized) return "vmap";
  return f.processes ? "mpi::pmap" : "pmap";
}

/// The frame of `name`; a runtime error for values that carry no axis environment in their type.
NAMEDAX_DECL const frame& bound_frame(std::string_view verb, std::string_view name);

/// Appends "name=index" to a device path such as "i=0,j=2".
NAMEDAX_DECL void append_coordinate(std::string& path, std::string_view name, std::size_t index);

/// The device coordinates of this thread along every device axis, outermost first.
NAMEDAX_DECL std::string device_path(const std::vector<frame>& stack);

/// Pushes a frame for the duration of a scope (vmap) or replaces the whole stack (device threads).
class frame_scope {
 public:
  explicit frame_scope(frame f);
  frame_scope(std::vector<frame> stack, std::shared_ptr<device_record> record);
  frame_scope(const frame_scope&) = delete;
  frame_scope& operator=(const frame_scope&) = delete;
  ~frame_scope();

 private:
  std::vector<frame> saved_;
  std::shared_ptr<device_record> saved_record_;
};

/// Seconds a device may wait in one collective before it reports instead of hanging
/// (NAMEDAX_COLLECTIVE_TIMEOUT, default 600). Deadlocks and departures are found at once;
/// this only bounds a device that computes, or sleeps, for a very long time.
NAMEDAX_DECL double collective_timeout_seconds();

#if NAMEDAX_DEFINITIONS  // the bodies of the functions declared above (see detail/compilation.hpp)
NAMEDAX_DECL std::string enclosing_function_note() {
  return enclosing_function().empty() ? std::string() : message(" (in namedax::", enclosing_function(), ")");
}

NAMEDAX_DECL void device_record::enter(std::string_view signature) {
  std::lock_guard guard(lock);
  std::string& slot = recent[entered % recent.size()];
  if (slot.capacity() < text_capacity) slot.reserve(text_capacity);  // once: later calls reuse it
  slot = signature;
  if (!enclosing_function().empty()) slot.append(" in namedax::").append(enclosing_function());
  ++entered;
}

NAMEDAX_DECL void device_record::block(std::string_view what, const std::atomic<std::uint32_t>* generation,
                                       std::uint32_t value) {
  std::lock_guard guard(lock);
  if (waiting_in.capacity() < text_capacity) waiting_in.reserve(text_capacity);
  waiting_in = what, blocked_on = generation, blocked_generation = value;
}

NAMEDAX_DECL std::optional<std::string> device_record::stuck_in() {
  std::lock_guard guard(lock);
  if (blocked()) return waiting_in;
  return std::nullopt;
}

NAMEDAX_DECL bool world::deadlocked() {
  int stuck = 0;
  for (const auto& entry : devices) stuck += entry.second->now == device_record::state::running && entry.second->stuck();
  return stuck == running;
}

NAMEDAX_DECL std::string world::recent_collectives() const {
  std::vector<device_record*> order;
  for (const auto& entry : devices) order.push_back(entry.second.get());
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return natural_less(a->path, b->path); });
  constexpr std::size_t shown = 16;
  std::string text = "\nlast collectives each device entered:";
  for (std::size_t k = 0; k < order.size() && k < shown; ++k) {
    device_record& d = *order[k];
    std::lock_guard guard(d.lock);
    text += message("\n  device ", d.path, ":");
    if (d.entered == 0) text += " none";
    const std::uint64_t first = d.entered > d.recent.size() ? d.entered - d.recent.size() : 0;
    for (std::uint64_t n = first; n < d.entered; ++n)
      text += message(n == first ? " #" : "; #", n, ' ', d.recent[n % d.recent.size()]);
  }
  if (order.size() > shown) text += message("\n  (", order.size() - shown, " more devices)");
  return text;
}

NAMEDAX_DECL const frame& bound_frame(std::string_view verb, std::string_view name) {
  if (const frame* f = find_frame(name)) return *f;
  fail("namedax::", verb, ": axis '", name, "' is not bound by an enclosing vmap or pmap; wrap the function in "
       "namedax::vmap<\"", name, "\"> or namedax::pmap<\"", name, "\">");
}

NAMEDAX_DECL void append_coordinate(std::string& path, std::string_view name, std::size_t index) {
  if (!path.empty()) path += ',';
  path += name;
  path += '=';
  path += std::to_string(index);
}

NAMEDAX_DECL std::string device_path(const std::vector<frame>& stack) {
  std::string path;
  for (const frame& f : stack)
    if (f.place == placement::devices) append_coordinate(path, f.name, f.index);
  return path;
}

// The device stays the thread's own for the scope, and is its own again after it: a device
// that ran an inner map to its end meets the other devices as itself.
NAMEDAX_DECL frame_scope::frame_scope(frame f) : saved_(frames()), saved_record_(current_device()) {
  frames().push_back(std::move(f));
}

NAMEDAX_DECL frame_scope::frame_scope(std::vector<frame> stack, std::shared_ptr<device_record> record)
    : saved_(std::move(frames())), saved_record_(std::move(current_device())) {
  frames() = std::move(stack);
  current_device() = std::move(record);
}

NAMEDAX_DECL frame_scope::~frame_scope() {
  frames() = std::move(saved_);
  current_device() = std::move(saved_record_);
}

NAMEDAX_DECL double collective_timeout_seconds() {
  static const double seconds = [] {
    const char* text = std::getenv("NAMEDAX_COLLECTIVE_TIMEOUT");
    double v = text ? std::atof(text) : 0.0;
    return v > 0 ? v : 600.0;
  }();
  return seconds;
}
#endif  // NAMEDAX_DEFINITIONS

}  // namespace namedax::detail
