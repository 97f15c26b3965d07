// SPDX-License-Identifier: MIT
// Shared-memory exchange among device threads: communicators found by the names they span,
// two-phase barriers that compare the callers' signatures, and errors instead of hangs.
#pragma once

#include <namedax/detail/runtime.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <thread>
#include <span>

namespace namedax::detail {

/// The devices that differ only along some device axes, meeting again and again.
struct communicator {
  std::size_t size = 0;
  std::vector<std::string> member_paths;  // by rank, for departure reports
  std::vector<const void*> slots;         // what each member offers in the current exchange
  // Small payloads are copied here instead of lent (see pointer_exchange): two buffers of
  // size * inline_payload_bytes, used by alternate barrier generations.
  std::vector<std::byte> inline_payloads[2];
  std::vector<std::string> signatures;
  std::vector<std::uint64_t> arrived_in;  // generation + 1 once a member arrived in it
  std::size_t arrived = 0;
  std::atomic<std::uint64_t> generation{0};  // written under the world's lock, read by spinners
  std::uint64_t failed_generation = ~std::uint64_t{0};
  std::string failure;
};

/// This device's communicator over the device axes `names` (given order) and its rank in it,
/// row-major over `names` as JAX orders a tuple of axis names.
struct membership {
  std::shared_ptr<world> shared;
  communicator* comm = nullptr;
  std::size_t rank = 0;
};

inline membership join(std::span<const std::string_view> names) {
  const auto& stack = frames();
  const frame* first = find_frame(names.front());
  membership m{first->shared};
  // The key: the names spanned, then this device's coordinates along every other device axis.
  std::string key;
  for (auto n : names) append_coordinate(key, n, 0);
  key += '|';
  std::vector<std::size_t> sizes, own;
  for (auto n : names) {
    const frame* f = find_frame(n);
    sizes.push_back(f->size), own.push_back(f->index);
    m.rank = m.rank * f->size + f->index;
  }
  for (const frame& f : stack)
    if (f.place == placement::devices && std::find(names.begin(), names.end(), f.name) == names.end())
      append_coordinate(key, f.name, f.index);

  std::lock_guard guard(m.shared->lock);
  auto& slot = m.shared->communicators[key];
  if (!slot) {
    auto c = std::make_unique<communicator>();
    std::size_t total = 1;
    for (auto s : sizes) total *= s;
    c->size = total;
    c->slots.assign(total, nullptr);
    c->signatures.assign(total, {});
    c->arrived_in.assign(total, 0);
    for (std::size_t r = 0; r < total; ++r) {
      // The path of member r: this device's path with the coordinates along `names` replaced.
      std::vector<std::size_t> coord(names.size());
      for (std::size_t k = names.size(), rest = r; k-- > 0;) coord[k] = rest % sizes[k], rest /= sizes[k];
      std::string path;
      for (const frame& f : stack) {
        if (f.place != placement::devices) continue;
        auto it = std::find(names.begin(), names.end(), f.name);
        std::size_t index = it == names.end() ? f.index : coord[static_cast<std::size_t>(it - names.begin())];
        append_coordinate(path, f.name, index);
      }
      c->member_paths.push_back(std::move(path));
    }
    slot = std::move(c);
  }
  m.comm = slot.get();
  return m;
}

/// Waits until every member arrived. With a signature, the members' signatures must agree.
/// Throws collective_error instead of waiting forever: when a member returned or failed, when
/// every running device waits (a deadlock: devices wait in different collectives), or on timeout.
inline void arrive_and_wait(const membership& m, const std::string* signature, std::string_view what) {
  world& w = *m.shared;
  communicator& c = *m.comm;
  std::unique_lock guard(w.lock);
  const auto& me = current_device();
  auto abort = [&](const std::string& why) -> void {
    throw collective_error(message(what, " on device ", me->path, " was aborted: ", why));
  };
  if (w.poisoned) abort(w.reason);
  const std::uint64_t gen = c.generation;
  if (signature) c.signatures[m.rank] = *signature, me->enter(*signature);
  c.arrived_in[m.rank] = gen + 1;
  if (++c.arrived == c.size) {
    if (signature)
      for (std::size_t r = 0; r < c.size; ++r)
        if (c.signatures[r] != c.signatures[0]) {
          c.failure = message("devices made different collective calls at the same point: device ", c.member_paths[0],
                              " called ", c.signatures[0], ", device ", c.member_paths[r], " called ",
                              c.signatures[r], "; every device must make the same collective calls in the same order",
                              w.recent_collectives());
          c.failed_generation = gen;
          break;
        }
    c.arrived = 0;
    ++c.generation;
    w.waiting -= static_cast<int>(c.size - 1);  // the others are released, whenever they wake
    w.wake.notify_all();
  } else {
    me->waiting_in = std::string(what);
    ++w.waiting;
    // Spin briefly, then block: a barrier among running threads costs well under a
    // microsecond, while blocking costs a context switch. Yielding keeps the spin cheap
    // when devices outnumber cores.
    guard.unlock();
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
    for (int spin = 0; c.generation.load(std::memory_order_acquire) == gen && !w.poisoned.load(); ++spin) {
      if (spin % 64 == 63 && std::chrono::steady_clock::now() > spin_until) break;
      if (spin >= 16) std::this_thread::yield();
    }
    guard.lock();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(collective_timeout_seconds());
    std::optional<std::string> trouble;
    while (c.generation == gen && !w.poisoned && !trouble) {
      for (std::size_t r = 0; r < c.size && !trouble; ++r) {
        if (c.arrived_in[r] == gen + 1) continue;
        auto it = w.devices.find(c.member_paths[r]);
        if (it != w.devices.end() && it->second->now == device_record::state::finished)
          trouble = message("device ", c.member_paths[r], " returned from the mapped function while device ", me->path,
                            " waits in ", what, "; every device must make the same collective calls");
      }
      if (!trouble && w.waiting == w.running) {
        std::string who;
        for (const auto& [path, record] : w.devices)
          if (!record->waiting_in.empty()) who += message("\n  device ", path, " waits in ", record->waiting_in);
        trouble = message("every running device waits in a collective that cannot complete (devices called "
                          "different collectives):", who);
      }
      if (!trouble && w.wake.wait_until(guard, deadline) == std::cv_status::timeout && c.generation == gen)
        trouble = message("timed out after ", collective_timeout_seconds(),
                          " s (NAMEDAX_COLLECTIVE_TIMEOUT) waiting for the other devices");
    }
    me->waiting_in.clear();
    if (c.generation == gen) --w.waiting;  // leaving without completing: not released by another
    if (trouble) {
      *trouble += w.recent_collectives();
      w.poison(*trouble);
      abort(*trouble);
    }
    if (c.generation == gen) abort(w.reason);
  }
  if (c.failed_generation == gen) throw collective_error(message(what, ": ", c.failure));
}

/// A collective call as the devices compare it and the trace records it.
struct collective_call {
  std::string_view op;
  std::string axes, parameters, shape;
  std::string_view dtype;

  [[nodiscard]] std::string signature() const {
    return message(op, " over ", axes, parameters, " of payload shape ", shape, " and type ", dtype);
  }
};

/// Payloads up to this size are copied into the communicator's buffer, so that an exchange
/// needs one barrier instead of two.
inline constexpr std::size_t inline_payload_bytes = 4096;

/// One exchange of pointers: every member offers its buffer, reads the others' after
/// `exchange`, and calls `release` once it no longer reads them. A payload of at most
/// inline_payload_bytes (`bytes`, contiguous at `mine`; 0: lend the pointer) is copied into
/// the communicator instead: then nobody reads the lender's memory, and release needs no
/// barrier. Two buffers alternate by barrier generation: a member writes the next one while
/// slower members still read this one, and cannot reach the one after before they arrive.
class pointer_exchange {
 public:
  pointer_exchange(membership m, const void* mine, collective_call call, std::size_t bytes = 0)
      : m_(std::move(m)), call_(std::move(call)), what_(message("namedax::", call_.op, " over ", call_.axes)),
        copied_(bytes > 0 && bytes <= inline_payload_bytes) {
    if (tracing()) arrival_us_ = trace_clock_us();
    {
      std::lock_guard guard(m_.shared->lock);
      communicator& c = *m_.comm;
      if (copied_) {  // the slots vector is not used: a faster member may already fill it for the next call
        auto& buffer = c.inline_payloads[c.generation.load() % 2];
        if (buffer.empty()) buffer.resize(c.size * inline_payload_bytes);
        inline_base_ = buffer.data();
        std::memcpy(inline_base_ + m_.rank * inline_payload_bytes, mine, bytes);
      } else {
        c.slots[m_.rank] = mine;
      }
    }
    const std::string signature = call_.signature();
    arrive_and_wait(m_, &signature, what_);
    if (arrival_us_ >= 0) wait_us_ = trace_clock_us() - arrival_us_;
  }
  [[nodiscard]] const void* slot(std::size_t rank) const {
    return copied_ ? inline_base_ + rank * inline_payload_bytes : m_.comm->slots[rank];
  }
  [[nodiscard]] std::size_t rank() const { return m_.rank; }
  [[nodiscard]] std::size_t size() const { return m_.comm->size; }
  void release() {
    if (!copied_) arrive_and_wait(m_, nullptr, what_);
    if (arrival_us_ >= 0) {
      const auto& me = *current_device();
      record(trace_event{me.path, std::string(call_.op), std::move(call_.axes), std::move(call_.parameters),
                         std::move(call_.shape), std::string(call_.dtype), me.entered - 1, arrival_us_, wait_us_,
                         trace_clock_us() - arrival_us_});
    }
  }

 private:
  membership m_;
  collective_call call_;
  std::string what_;
  bool copied_;
  std::byte* inline_base_ = nullptr;
  double arrival_us_ = -1, wait_us_ = 0;  // arrival_us_ < 0: not traced
};

}  // namespace namedax::detail
