// SPDX-License-Identifier: MIT
// Shared-memory exchange among device threads: communicators found by the names they span,
// two-phase barriers that compare the callers' signatures, and errors instead of hangs.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <namedax/detail/compilation.hpp>
#include <namedax/detail/fault.hpp>
#include <namedax/detail/runtime.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <climits>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <span>

#if NAMEDAX_DEFINITIONS && defined(__linux__)  // the futex calls are in the bodies
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace namedax::detail {

/// Sleeps while `word` holds `expected`, for at most `timeout`; it may wake early.
NAMEDAX_DECL void sleep_while_equal(const std::atomic<std::uint32_t>& word, std::uint32_t expected,
                                    std::chrono::microseconds timeout);

/// Tells the core that this thread spins (cheaper for its sibling hyperthread and the bus).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// The number of hardware threads (at least 1).
NAMEDAX_DECL std::size_t hardware_threads();

/// Wakes every thread asleep in sleep_while_equal on `word`.
NAMEDAX_DECL void wake_sleepers(std::atomic<std::uint32_t>& word);

/// How the members of an exchange offer their data: what a slot of the exchange points to.
/// Every member of one call must offer the same form, so the form is chosen from what they
/// all agree on (the call's signature and the placement of its axes), never from how one
/// device holds its operand; it is part of the fingerprint they compare, so that a form chosen
/// differently would be reported instead of read wrongly.
enum class exchange_form : std::uint8_t {
  payload,         // the member's payload, row-major (or a copy of it in the communicator)
  offer,           // an output_exchange's inputs and output
  references,      // the arrays themselves, handed over (ppermute by reference)
  process_funnel,  // the payloads a process's first thread gathered from the other processes
};

NAMEDAX_DECL std::string_view form_name(exchange_form form);

struct async_mailbox;  // detail/async.hpp

/// The devices that differ only along some device axes, meeting again and again. A member
/// arrives with one atomic increment; the last one to arrive compares the signatures and
/// advances `generation`, which the others watch: spinning, then asleep on it (a futex), so
/// that a release wakes them without any lock to fight over.
struct communicator {
  std::size_t size = 0;
  std::vector<std::string> member_paths;  // by rank, for departure reports
  std::vector<const void*> slots;         // what each member offers in the current exchange
  // Small payloads are copied here instead of lent (see pointer_exchange): two buffers of
  // size * inline_payload_bytes, used by alternate barrier generations.
  std::vector<std::byte> inline_payloads[2];
  // What each member writes when it arrives, a cache line each: members that shared a line
  // would take it from one another's cores on every call.
  struct alignas(64) arrival {
    std::uint64_t fingerprint = 0;             // of the member's current call and form
    exchange_form form = exchange_form::payload;
    std::atomic<std::uint32_t> generation{0};  // generation + 1 once the member arrived in it
  };
  std::unique_ptr<arrival[]> arrivals;
  // The members arrived in the current generation, with the generation in the high half, so
  // that a member can take its arrival back only from the barrier it arrived at.
  alignas(64) std::atomic<std::uint64_t> arrived{0};
  alignas(64) std::atomic<std::uint32_t> generation{0};  // watched by every waiter
  std::atomic<int> sleepers{0};
  // The calls differed at the barrier that made generation g: failed_generation[g % 2] == g,
  // and failure[g % 2] says how; written before the release. Two, used by alternate
  // generations, since a slow member may still read the last one while the others meet again.
  std::uint32_t failed_generation[2] = {0, 0};
  std::string failure[2];
  // A member that left an exchange between its barriers (it threw while the others read):
  // the release barrier that made generation g fails for every member (an output they share
  // may lack its part), left_generation[g % 2] == g, and left_by[g % 2] names it. Written
  // under the world's lock, before the member arrives.
  std::uint32_t left_generation[2] = {0, 0};
  std::string left_by[2];
  // Where asynchronous collectives among these devices leave their blocks (detail/async.hpp),
  // made by the first member that starts one: ppermute's, and the one with a lane per sender.
  // Shared: a handle keeps its mailbox while it lives.
  std::once_flag mailbox_made, all_lanes_mailbox_made;
  std::shared_ptr<async_mailbox> mailbox, all_lanes_mailbox;
};

/// This device's communicator over the device axes `names` (given order) and its rank in it,
/// row-major over `names` as JAX orders a tuple of axis names.
struct membership {
  world* shared = nullptr;  // kept alive by the device threads' frames
  communicator* comm = nullptr;
  std::size_t rank = 0;
};

/// Payloads up to this size are copied into the communicator's buffer, so that an exchange
/// needs one barrier instead of two.
inline constexpr std::size_t inline_payload_bytes = 4096;

/// This device's membership in the communicator of the device axes `names` (in order): the
/// one its record met before, or the one the world keeps under a key of the names, the sizes
/// of every device axis, this device's coordinates along the others and the enclosing runs.
NAMEDAX_DECL membership join(std::span<const std::string_view> names);

/// Lets go of the communicators device `me` met, once it runs no more collectives (call with
/// the world's lock held): the last member of one to let go frees it. Every member meets a
/// communicator once (its record keeps it), so when all have let go none reads it any more.
NAMEDAX_DECL void leave_communicators(world& w, device_record& me);

/// A collective call as the devices compare it and the trace records it. Its texts live in
/// buffers of the calling thread that keep their capacity, so that describing a call
/// allocates nothing after the first; they hold until the thread describes its next call.
struct collective_call {
  std::string_view op, axes, parameters, shape, dtype;
  std::string_view signature;  // all of the above in one text
  std::string_view what;       // "namedax::psum over ('i',)", for messages
  std::uint64_t fingerprint;   // of the signature, which is what devices compare
};

/// A 64-bit FNV-1a hash of a text.
NAMEDAX_DECL std::uint64_t fingerprint_of(std::string_view text);

/// The call device `path` is in now: the last it entered (for a mismatch report).
NAMEDAX_DECL std::string current_call_of(world& w, const std::string& path);

/// Sleeps until the barrier of generation `gen` completes or the world is poisoned; once a
/// millisecond, looks under the world's lock whether a member left, every running device
/// sleeps (a deadlock), or the timeout passed, and then returns what is wrong.
NAMEDAX_DECL std::optional<std::string> sleep_until_released(const membership& m, std::uint32_t gen,
                                                             std::string_view what, bool leaves_on_poison);

/// Takes back member `rank`'s arrival at the barrier of generation `gen`, unless the barrier
/// is completing (every member counted: then it is released, and must not leave). Returns
/// whether it was taken back.
NAMEDAX_DECL bool take_back_arrival(communicator& c, std::size_t rank, std::uint32_t gen);

/// How often a waiter yields, where devices outnumber cores, before it sleeps.
inline constexpr int crowded_yields = 16;

/// The mismatch message for members 0 and r of `c` (call with the world's lock held).
NAMEDAX_DECL std::string mismatch_between(world& w, const communicator& c, std::size_t r);

/// Waits until every member arrived. With a call (the first barrier of an exchange), the
/// members' calls must agree: their fingerprints are compared, and on a mismatch their texts,
/// kept in their device records. Throws collective_error instead of waiting forever: when a
/// member returned or failed, when every running device waits (a deadlock: devices wait in
/// different collectives), or on timeout; a member that gives up takes its arrival back first,
/// so that the barrier cannot complete without it and nobody reads what it offered.
/// Without a call (the release barrier, after which a member may free what it offered), a
/// member stays even when the world is poisoned: every member that passed the first barrier
/// arrives here, and the others may still read its memory until they do.
NAMEDAX_DECL void arrive_and_wait(const membership& m, const collective_call* call, std::string_view what,
                                  exchange_form form = exchange_form::payload);

/// One exchange of pointers: every member offers its buffer, reads the others' after
/// `exchange`, and calls `release` once it no longer reads them. A payload of at most
/// inline_payload_bytes (`bytes`, contiguous at `mine`; 0: lend the pointer) is copied into
/// the communicator instead: then nobody reads the lender's memory, and release needs no
/// barrier. Two buffers alternate by barrier generation: a member writes the next one while
/// slower members still read this one, and cannot reach the one after before they arrive.
/// A member that fails between the two (it throws, or cannot allocate its output) still meets
/// the others at the release barrier as it unwinds, before what it lent is freed: the others
/// finish reading, and its error then reaches them as the world's poison.
class pointer_exchange {
 public:
  pointer_exchange(membership m, const void* mine, collective_call call, std::size_t bytes = 0,
                   exchange_form form = exchange_form::payload);
  pointer_exchange(const pointer_exchange&) = delete;  // the others hold pointers into it
  pointer_exchange& operator=(const pointer_exchange&) = delete;
  ~pointer_exchange() { meet_at_release(); }
  [[nodiscard]] const void* slot(std::size_t rank) const {
    return copied_ ? inline_base_ + rank * inline_payload_bytes : m_.comm->slots[rank];
  }
  [[nodiscard]] std::size_t rank() const { return m_.rank; }
  [[nodiscard]] std::size_t size() const { return m_.comm->size; }
  void release();

 private:
  /// The release barrier of a member that leaves early (it unwinds): what it lent stays
  /// until the others are done reading it.
  void meet_at_release() noexcept;

  membership m_;
  collective_call call_;
  bool copied_;
  bool lent_ = false;  // the others may read what this member lent, until the release barrier
  std::byte* inline_base_ = nullptr;
  double arrival_us_ = -1, wait_us_ = 0;  // arrival_us_ < 0: not traced
};

#if NAMEDAX_DEFINITIONS  // the bodies of the functions declared above (see detail/compilation.hpp)
NAMEDAX_DECL void sleep_while_equal(const std::atomic<std::uint32_t>& word, std::uint32_t expected,
                                    std::chrono::microseconds timeout) {
#if defined(__linux__)
  const timespec ts{static_cast<time_t>(timeout.count() / 1000000), static_cast<long>(timeout.count() % 1000000) * 1000};
  syscall(SYS_futex, reinterpret_cast<const std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, &ts, nullptr, 0);
#else
  if (word.load() == expected) std::this_thread::sleep_for(std::min(timeout, std::chrono::microseconds(50)));
#endif
}

NAMEDAX_DECL std::size_t hardware_threads() {
  static const std::size_t n = std::max(1u, std::thread::hardware_concurrency());
  return n;
}

NAMEDAX_DECL void wake_sleepers(std::atomic<std::uint32_t>& word) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
#else
  (void)word;
#endif
}

NAMEDAX_DECL std::string_view form_name(exchange_form form) {
  constexpr std::string_view names[] = {"payload", "offer", "references", "process funnel"};
  return names[static_cast<std::size_t>(form)];
}

NAMEDAX_DECL std::uint64_t fingerprint_of(std::string_view text) {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ull;
  return h;
}

NAMEDAX_DECL membership join(std::span<const std::string_view> names) {
  const auto& stack = frames();
  const frame* first = find_frame(names.front());
  membership m{first->shared.get()};
  device_record* me = current_device().get();
  if (me)
    for (const auto& met : me->met)
      if (std::equal(met.names.begin(), met.names.end(), names.begin(), names.end())) {
        m.comm = met.comm, m.rank = met.rank;
        return m;
      }
  // The key: everything that tells communicators apart. The names spanned, in order; every
  // device axis with its size (maps of other sizes never meet), and this device's coordinate
  // along those not spanned; which run of each enclosing pmap this is.
  std::string key;
  for (auto n : names) key += n, key += ',';
  key += '|';
  std::vector<std::size_t> sizes;
  for (auto n : names) {
    const frame* f = find_frame(n);
    sizes.push_back(f->size);
    m.rank = m.rank * f->size + f->index;
  }
  for (const frame& f : stack) {
    if (f.place != placement::devices) continue;
    key += f.name, key += '/', key += std::to_string(f.size);
    if (std::find(names.begin(), names.end(), f.name) == names.end()) key += '=', key += std::to_string(f.index);
    key += ',';
  }
  if (me) key += '|', key += me->launches;

  std::lock_guard guard(m.shared->lock);
  auto entry = m.shared->communicators.try_emplace(std::move(key)).first;
  auto& slot = entry->second.comm;
  if (!slot) {
    auto c = std::make_unique<communicator>();
    std::size_t total = 1;
    for (auto s : sizes) total *= s;
    c->size = total;
    c->slots.assign(total, nullptr);
    c->arrivals.reset(new communicator::arrival[total]);
    for (auto& buffer : c->inline_payloads) buffer.resize(total * inline_payload_bytes);
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
  if (me) me->met.push_back({{names.begin(), names.end()}, m.comm, m.rank, &entry->first});
  return m;
}

NAMEDAX_DECL void leave_communicators(world& w, device_record& me) {
  for (const auto& met : me.met) {
    auto entry = w.communicators.find(*met.key);
    if (++entry->second.members_done == met.comm->size) w.communicators.erase(entry);
  }
  me.met.clear();
}

NAMEDAX_DECL std::string current_call_of(world& w, const std::string& path) {
  auto it = w.devices.find(path);
  if (it == w.devices.end()) return "an unknown collective";
  device_record& d = *it->second;
  std::lock_guard guard(d.lock);
  return d.entered == 0 ? std::string("no collective") : d.recent[(d.entered - 1) % d.recent.size()];
}

NAMEDAX_DECL std::optional<std::string> sleep_until_released(const membership& m, std::uint32_t gen,
                                                             std::string_view what, bool leaves_on_poison) {
  world& w = *m.shared;
  communicator& c = *m.comm;
  device_record& me = *current_device();
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(collective_timeout_seconds());
  auto next_check = start + std::chrono::milliseconds(1);
  std::optional<std::string> trouble;
  me.block(what, &c.generation, gen);
  while (c.generation.load(std::memory_order_acquire) == gen && !(leaves_on_poison && w.poisoned) && !trouble) {
    c.sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (c.generation.load(std::memory_order_seq_cst) == gen) sleep_while_equal(c.generation, gen, std::chrono::milliseconds(1));
    c.sleepers.fetch_sub(1, std::memory_order_relaxed);
    const auto now = std::chrono::steady_clock::now();
    if (now < next_check || c.generation.load(std::memory_order_acquire) != gen) continue;
    next_check = now + std::chrono::milliseconds(1);
    std::lock_guard guard(w.lock);
    for (std::size_t r = 0; r < c.size && !trouble; ++r) {
      if (c.arrivals[r].generation.load(std::memory_order_relaxed) == gen + 1) continue;
      // Records are found by path, which an inner pmap's runs share: a finished record of an
      // earlier run means that this run's member has not started yet, not that it left.
      auto it = w.devices.find(c.member_paths[r]);
      if (it != w.devices.end() && it->second->launches == me.launches && it->second->now == device_record::state::finished)
        trouble = message("device ", c.member_paths[r], " returned from the mapped function while device ", me.path,
                          " waits in ", what, "; every device must make the same collective calls");
    }
    if (!trouble && w.deadlocked()) {
      std::string who;
      for (const auto& [path, record] : w.devices)
        if (auto in = record->stuck_in()) who += message("\n  device ", path, " waits in ", *in);
      trouble = message("every running device waits in a collective that cannot complete (devices called "
                        "different collectives):", who);
    }
    if (!trouble && now > deadline)
      trouble = message("timed out after ", collective_timeout_seconds(),
                        " s (NAMEDAX_COLLECTIVE_TIMEOUT) waiting for the other devices");
  }
  me.unblock();
  if (c.generation.load(std::memory_order_acquire) != gen) return std::nullopt;  // released after all
  return trouble;
}

NAMEDAX_DECL bool take_back_arrival(communicator& c, std::size_t rank, std::uint32_t gen) {
  std::uint64_t now = c.arrived.load(std::memory_order_acquire);
  while (now >> 32 == gen && (now & 0xffffffffu) < c.size)
    if (c.arrived.compare_exchange_weak(now, now - 1, std::memory_order_acq_rel)) {
      c.arrivals[rank].generation.store(gen, std::memory_order_relaxed);
      return true;
    }
  return false;
}

NAMEDAX_DECL std::string mismatch_between(world& w, const communicator& c, std::size_t r) {
  std::string first = current_call_of(w, c.member_paths[0]), other = current_call_of(w, c.member_paths[r]);
  std::string text = message("devices made different collective calls at the same point: device ", c.member_paths[0],
                             " called ", first, ", device ", c.member_paths[r], " called ", other);
  if (first == other)  // the same call offered in different forms: a defect of namedax, not of the program
    text += message(" (the same call, offered as ", form_name(c.arrivals[0].form), " and as ",
                    form_name(c.arrivals[r].form), ": a namedax defect, please report it)");
  return text + "; every device must make the same collective calls in the same order" + w.recent_collectives();
}

NAMEDAX_DECL void arrive_and_wait(const membership& m, const collective_call* call, std::string_view what,
                                  exchange_form form) {
  world& w = *m.shared;
  communicator& c = *m.comm;
  const auto& me = current_device();
  const bool leaves_on_poison = call != nullptr;
  auto abort = [&](const std::string& why) -> void {
    throw collective_abort(message(what, " on device ", me->path, " was aborted: ", why));
  };
  if (leaves_on_poison && w.poisoned) {
    std::lock_guard guard(w.lock);
    abort(w.reason);
  }
  auto poisoned = [&] { return leaves_on_poison && w.poisoned.load(); };
  const std::uint32_t gen = c.generation.load(std::memory_order_acquire);
  if (call) {
    // The form goes into the fingerprint: members that offer different forms must not meet.
    c.arrivals[m.rank].fingerprint = call->fingerprint ^ (static_cast<std::uint64_t>(form) * 0x9e3779b97f4a7c15ull);
    c.arrivals[m.rank].form = form;
    me->enter(call->signature);
  }
  c.arrivals[m.rank].generation.store(gen + 1, std::memory_order_relaxed);
  if ((c.arrived.fetch_add(1, std::memory_order_acq_rel) & 0xffffffffu) + 1 == c.size) {
    if (call)
      for (std::size_t r = 0; r < c.size; ++r)
        if (c.arrivals[r].fingerprint != c.arrivals[0].fingerprint) {
          std::lock_guard guard(w.lock);
          c.failure[(gen + 1) % 2] = mismatch_between(w, c, r);
          c.failed_generation[(gen + 1) % 2] = gen + 1;
          break;
        }
    c.arrived.store(std::uint64_t{gen + 1} << 32, std::memory_order_relaxed);
    c.generation.store(gen + 1, std::memory_order_seq_cst);
    if (c.sleepers.load(std::memory_order_seq_cst) > 0) wake_sleepers(c.generation);
  } else {
    // Spin briefly, then sleep: a barrier among running threads costs well under a
    // microsecond, while sleeping costs a context switch. Where devices outnumber cores, a
    // waiter yields a few times and then sleeps, so that the devices that have not arrived
    // get the cores (a waiter that keeps yielding is scheduled again and again).
    const bool crowded = w.running > static_cast<int>(hardware_threads());
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
    for (int spin = 0; c.generation.load(std::memory_order_acquire) == gen && !poisoned(); ++spin) {
      if (crowded) {
        if (spin == crowded_yields) break;
        std::this_thread::yield();
      } else {
        if (spin % 64 == 63 && std::chrono::steady_clock::now() > spin_until) break;
        cpu_relax();
      }
    }
    while (c.generation.load(std::memory_order_acquire) == gen) {
      auto trouble = sleep_until_released(m, gen, what, leaves_on_poison);
      if (!trouble && c.generation.load(std::memory_order_acquire) == gen) {  // poisoned by another device
        std::lock_guard guard(w.lock);
        trouble = w.reason;
      }
      if (!trouble || !take_back_arrival(c, m.rank, gen)) continue;  // released meanwhile: go on
      std::lock_guard guard(w.lock);
      if (!w.poisoned) *trouble += w.recent_collectives();
      w.poison(*trouble);
      abort(*trouble);
    }
  }
  if (call && c.failed_generation[(gen + 1) % 2] == gen + 1)
    throw collective_error(message(what, ": ", c.failure[(gen + 1) % 2]));
  if (!call && c.left_generation[(gen + 1) % 2] == gen + 1)
    abort(message("device ", c.left_by[(gen + 1) % 2], " failed in it after the exchange began"));
}

NAMEDAX_DECL pointer_exchange::pointer_exchange(membership m, const void* mine, collective_call call, std::size_t bytes,
                                                exchange_form form)
    : m_(std::move(m)), call_(call), copied_(bytes > 0 && bytes <= inline_payload_bytes) {
  if (tracing()) arrival_us_ = trace_clock_us();
  at_fault_point(fault_point::arrival, call_.op);
  communicator& c = *m_.comm;
  if (copied_) {  // the slots vector is not used: a faster member may already fill it for the next call
    inline_base_ = c.inline_payloads[c.generation.load(std::memory_order_acquire) % 2].data();
    std::memcpy(inline_base_ + m_.rank * inline_payload_bytes, mine, bytes);
  } else {
    c.slots[m_.rank] = mine;
  }
  arrive_and_wait(m_, &call_, call_.what, form);
  lent_ = !copied_;
  if (arrival_us_ >= 0) wait_us_ = trace_clock_us() - arrival_us_;
  try {
    at_fault_point(fault_point::exchanged, call_.op);
  } catch (...) {  // no destructor runs for an object whose constructor throws
    meet_at_release();
    throw;
  }
}

NAMEDAX_DECL void pointer_exchange::release() {
  at_fault_point(fault_point::reading, call_.op);
  if (lent_) lent_ = false, arrive_and_wait(m_, nullptr, call_.what);
  if (arrival_us_ >= 0) {
    const auto& me = *current_device();
    record(trace_event{me.path, std::string(call_.op), std::string(call_.axes), std::string(call_.parameters),
                       std::string(call_.shape), std::string(call_.dtype), me.entered - 1, arrival_us_, wait_us_,
                       trace_clock_us() - arrival_us_});
  }
}

NAMEDAX_DECL void pointer_exchange::meet_at_release() noexcept {
  if (!lent_) return;
  lent_ = false;
  try {
    communicator& c = *m_.comm;
    const std::uint32_t gen = c.generation.load(std::memory_order_acquire);
    {
      std::lock_guard guard(m_.shared->lock);
      c.left_by[(gen + 1) % 2] = current_device()->path;
      c.left_generation[(gen + 1) % 2] = gen + 1;
    }
    arrive_and_wait(m_, nullptr, call_.what);
  } catch (...) {  // timed out: the world is poisoned, and the others are gone too
  }
}
#endif  // NAMEDAX_DEFINITIONS

}  // namespace namedax::detail
