// SPDX-License-Identifier: MIT
// Asynchronous collectives: among device threads, a mailbox per communicator where a sender
// leaves its block for the receiver without waiting for it, and the receipt by which the
// receiver later takes it, with the same errors instead of hangs as the blocking exchanges;
// among MPI processes, nonblocking MPI calls waited for at wait().
#pragma once
// IWYU pragma: private, include <namedax/async.hpp>

#include <namedax/collectives.hpp>
#include <namedax/detail/compilation.hpp>
#include <namedax/detail/ppermute.hpp>
#include <namedax/detail/process_rules.hpp>
#include <namedax/detail/rendezvous.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <utility>

namespace namedax::detail {

/// Slots per receiving device: the exchange a device starts as its s-th asynchronous call over
/// some axes uses slot s % async_depth, so at most this many of its handles over the same axes
/// may be in flight (started and not yet waited) at once.
inline constexpr std::uint32_t async_depth = 8;

/// One leaf's array with its element type erased, held in place (every shared_array has the
/// size of a shared_ptr), so that leaving a block in a mailbox allocates nothing.
class erased_array {
 public:
  erased_array() = default;
  erased_array(const erased_array&) = delete;
  erased_array& operator=(const erased_array&) = delete;
  ~erased_array() { reset(); }
  template <class T>
  void hold(const shared_array<T>& a) {
    static_assert(sizeof(shared_array<T>) <= sizeof(bytes_) && alignof(shared_array<T>) <= alignof(std::max_align_t));
    reset();
    new (bytes_) shared_array<T>(a);
    destroy_ = [](void* p) { std::launder(static_cast<shared_array<T>*>(p))->~shared_array<T>(); };
  }
  /// The array held, which must be of element type T (the signature check says so).
  template <class T>
  shared_array<T> take() {
    shared_array<T> out = *std::launder(reinterpret_cast<shared_array<T>*>(bytes_));
    reset();
    return out;
  }
  void reset() noexcept {
    if (destroy_) std::exchange(destroy_, nullptr)(bytes_);
  }

 private:
  alignas(std::max_align_t) std::byte bytes_[sizeof(shared_array<double>)];
  void (*destroy_)(void*) = nullptr;
};

/// Where senders leave blocks for one receiver, one call at a time: slot k of a receiver
/// serves its calls k, k + async_depth, k + 2 * async_depth... in that order, so that a fast
/// sender of a later call never takes the place of a slow sender of an earlier one. `state`
/// packs the sequence number of the call the slot serves now (30 bits, wrapping) with a
/// phase: free (its block, if any, has not come), writing (its sender writes it: a few stores),
/// posted (the block waits for the receiver), abandoned (the receiver gave up before the block
/// came: its sender passes the slot on). The
/// receiver passes the slot on to call s + async_depth once it is done with call s, whether it
/// received a block or none. The sender writes the other fields before it posts, and the
/// receiver reads them after it sees the post.
struct alignas(64) async_slot {
  enum phase : std::uint32_t { free = 0, posted = 1, abandoned = 2, writing = 3 };
  static constexpr std::uint32_t sequence_mask = (1u << 30) - 1;
  static constexpr std::uint32_t pack(std::uint32_t sequence, phase p) { return ((sequence & sequence_mask) << 2) | p; }
  static constexpr std::uint32_t sequence_of(std::uint32_t state) { return state >> 2; }
  static constexpr phase phase_of(std::uint32_t state) { return static_cast<phase>(state & 3); }
  /// Whether the slot serves call `sequence` now.
  static constexpr bool serves(std::uint32_t state, std::uint32_t sequence) {
    return sequence_of(state) == (sequence & sequence_mask);
  }
  /// Whether the slot serves call `sequence` or has passed it (it serves a later one).
  static constexpr bool reached(std::uint32_t state, std::uint32_t sequence) {
    return serves(state, sequence) || passed(state, sequence);
  }
  /// Whether the slot has passed call `sequence` (it serves a later one).
  static constexpr bool passed(std::uint32_t state, std::uint32_t sequence) {
    const std::uint32_t ahead = (sequence_of(state) - sequence) & sequence_mask;
    return ahead != 0 && ahead < (1u << 29);
  }

  std::atomic<std::uint32_t> state{pack(0, free)};  // slot k starts at pack(k, free)
  std::atomic<int> sleepers{0};
  std::uint64_t fingerprint = 0;  // of the sender's call
  std::size_t source = 0;         // the sender's rank
  std::string signature;          // the sender's call, for a mismatch report (keeps its capacity)
  erased_array block;

  void wake() {
    if (sleepers.load(std::memory_order_seq_cst) > 0) wake_sleepers(state);
  }
  /// Done with call `sequence`: the slot serves call sequence + async_depth.
  void pass_on(std::uint32_t sequence);
};

/// The mailbox of one communicator: async_depth slots per receiver and lane, and per member
/// the count of asynchronous calls it started and how many handles it has in flight in each
/// of its slots (each member's own thread alone touches its part). ppermute's mailbox has one
/// lane (a receiver has at most one sender per call); the mailbox of the collectives in which
/// every member sends to every member has a lane per sender.
struct async_mailbox {
  struct alignas(64) member {
    std::uint32_t started = 0;
    std::array<std::uint32_t, async_depth> in_flight{};
    std::array<std::string, async_depth> calls;  // its own calls, for mismatch reports
  };
  std::size_t size, lanes;
  std::vector<std::string> paths;  // the members' device paths, by rank
  std::string axes;                // "('i',)"
  std::unique_ptr<async_slot[]> slots;
  std::unique_ptr<member[]> members;

  async_mailbox(const communicator& c, std::span<const named_axis> named, std::size_t lane_count);
  async_slot& slot(std::size_t receiver, std::uint32_t sequence, std::size_t lane = 0) {
    return slots[(receiver * async_depth + sequence % async_depth) * lanes + lane];
  }

  /// The shared_fold of leaf `leaf` of call `sequence`: made by the first member to ask,
  /// forgotten here once every member has taken it.
  std::shared_ptr<shared_fold> take_fold(std::uint32_t sequence, std::size_t leaf);

 private:
  struct fold_entry {
    std::uint32_t sequence;
    std::size_t leaf, taken;
    std::shared_ptr<shared_fold> fold;
  };
  std::mutex folds_lock_;
  std::vector<fold_entry> folds_;
};

/// ppermute's mailbox of the communicator of `m`, made by the first member that needs it.
NAMEDAX_DECL async_mailbox& mailbox_of(const membership& m, std::span<const named_axis> axes);
/// The mailbox with a lane per sender, for the collectives in which every member sends.
NAMEDAX_DECL async_mailbox& all_lanes_mailbox_of(const membership& m, std::span<const named_axis> axes);

/// Waits until `done(state)` holds for `slot`'s state, for the move of device `peer` (the
/// sender whose block this device waits for, or the receiver that must first take an older
/// one). Spins briefly, then sleeps on the state word; once a millisecond, under the world's
/// lock, looks whether the peer returned, every running device waits (a deadlock), or the
/// timeout passed. On trouble, or when the world is poisoned, poisons it and throws a
/// collective_abort naming `what` and this device. Returns the state that satisfied `done`.
template <class Done>
std::uint32_t wait_for_peer(world& w, async_slot& slot, Done done, std::string_view what, const std::string& peer) {
  device_record& me = *current_device();
  std::uint32_t now = slot.state.load(std::memory_order_acquire);
  const bool crowded = w.running > static_cast<int>(hardware_threads());
  const auto start = std::chrono::steady_clock::now();
  for (int spin = 0; !done(now) && !w.poisoned.load() && spin < (crowded ? crowded_yields : 2048); ++spin) {
    if (crowded) std::this_thread::yield();
    else if (spin % 64 == 63 && std::chrono::steady_clock::now() > start + std::chrono::microseconds(50)) break;
    else cpu_relax();
    now = slot.state.load(std::memory_order_acquire);
  }
  const auto deadline = start + std::chrono::duration<double>(collective_timeout_seconds());
  auto next_check = start;
  std::optional<std::string> trouble;
  while (!done(now) && !trouble) {
    me.block(what, &slot.state, now);
    slot.sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (slot.state.load(std::memory_order_seq_cst) == now && !w.poisoned.load())
      sleep_while_equal(slot.state, now, std::chrono::milliseconds(1));
    slot.sleepers.fetch_sub(1, std::memory_order_relaxed);
    now = slot.state.load(std::memory_order_acquire);
    if (done(now)) break;
    const auto clock = std::chrono::steady_clock::now();
    if (!w.poisoned.load() && clock < next_check) continue;
    next_check = clock + std::chrono::milliseconds(1);
    std::lock_guard guard(w.lock);
    if (w.poisoned) {
      trouble = w.reason;
      break;
    }
    auto it = w.devices.find(peer);
    if (it != w.devices.end() && it->second->launches == me.launches && it->second->now == device_record::state::finished)
      trouble = message("device ", peer, " returned from the mapped function while device ", me.path, " waits for it in ",
                        what, "; every device must start the same asynchronous collectives");
    else if (w.deadlocked()) {
      std::string who;
      for (const auto& [path, record] : w.devices)
        if (auto in = record->stuck_in()) who += message("\n  device ", path, " waits in ", *in);
      trouble = message("every running device waits in a collective that cannot complete (devices called "
                        "different collectives):", who);
    } else if (clock > deadline) {
      trouble = message("timed out after ", collective_timeout_seconds(),
                        " s (NAMEDAX_COLLECTIVE_TIMEOUT) waiting for ", peer.empty() ? std::string("another device") :
                        message("device ", peer));
    }
    // The peer may have posted, and then returned or blocked elsewhere, after `now` was read:
    // what it did before the world's lock was taken is seen now.
    if (trouble && !w.poisoned && done(now = slot.state.load(std::memory_order_acquire))) trouble.reset();
    if (trouble) *trouble += w.recent_collectives(), w.poison(*trouble);
  }
  me.unblock();
  if (trouble) throw collective_abort(message(what, " on device ", me.path, " was aborted: ", *trouble));
  return now;
}

/// Poisons the world with `why` and makes it the error pmap reports, unless a device's own
/// error came first (call without the world's lock).
NAMEDAX_DECL void report_in_world(world& w, const std::string& path, const std::string& why);
/// Device `path` found that the devices started different asynchronous calls: `why` is final for
/// the map. The exchanges are point to point, so the devices outside the pair that met the
/// mismatch cannot learn of it, and the calls of the two may no longer pair up with the others'
/// (one of them started none, or took a slot of another call): the world is poisoned with `why`,
/// which pmap reports, and `why` is thrown.
[[noreturn]] NAMEDAX_DECL void fail_async_mismatch(world& w, const std::string& path, std::string why);
/// Throws the collective_abort of a start of `what` on device `path` when the world is poisoned:
/// a device failed, or devices started different asynchronous calls, earlier in the map.
NAMEDAX_DECL void start_unless_poisoned(world& w, std::string_view what, const std::string& path);

/// This device's side of one asynchronous exchange it started: where its incoming block
/// arrives (or that none does), until it takes the block or gives up on it. Move-only; a
/// receipt dropped before its block was taken cancels it.
class async_receipt {
 public:
  async_receipt() = default;
  async_receipt(std::shared_ptr<world> w, std::shared_ptr<async_mailbox> box, std::shared_ptr<device_record> device,
                std::size_t rank, std::uint32_t sequence, long source, std::uint64_t fingerprint, std::string_view verb,
                std::size_t lane = 0);
  async_receipt(async_receipt&& other) noexcept { *this = std::move(other); }
  async_receipt& operator=(async_receipt&& other) noexcept;
  ~async_receipt() { cancel(); }

  [[nodiscard]] bool active() const { return box_ != nullptr; }
  /// "namedax::async::ppermute over ('i',)".
  [[nodiscard]] std::string what() const;
  [[nodiscard]] const std::string& device_path() const { return device_->path; }
  [[nodiscard]] std::uint32_t sequence() const { return sequence_; }
  [[nodiscard]] const std::shared_ptr<async_mailbox>& mailbox() const { return box_; }

  /// Waits for this device's incoming block and takes it; a device that receives nothing gets
  /// zeros of `shape` (once the slot serves this call: at once, unless it still waits for an
  /// earlier block this device gave up on).
  template <class T>
  shared_array<T> take(std::span<const std::size_t> shape) {
    check_device();
    auto done = finish_on_exit();
    async_slot& slot = box_->slot(rank_, sequence_, lane_);
    if (source_ < 0) {
      wait_for_peer(*world_, slot, [&](std::uint32_t s) { return async_slot::reached(s, sequence_); }, what(), {});
      pass_over_nothing(slot);
      auto zeros = uninitialized_array<T>(shape);
      std::fill(zeros.data(), zeros.data() + zeros.size(), T{});
      return share_array<T>(std::move(zeros));
    }
    const std::uint32_t wanted = async_slot::pack(sequence_, async_slot::posted);
    const std::string& peer = box_->paths[static_cast<std::size_t>(source_)];
    wait_for_peer(*world_, slot, [&](std::uint32_t s) { return s == wanted; }, what(), peer);
    try {
      at_fault_point(fault_point::reading, verb_);
    } catch (...) {
      slot.pass_on(sequence_);
      throw;
    }
    if (slot.fingerprint != fingerprint_) {
      const std::string theirs = slot.signature;
      slot.pass_on(sequence_);
      fail_async_mismatch(*world_, device_->path,
                          message(what(), ": devices made different asynchronous calls at the same point: device ", peer,
                                  " sent a block from ", theirs, ", device ", device_->path, " called ", my_call(),
                                  "; every device must start the same asynchronous collectives in the same order"));
    }
    auto out = slot.block.take<T>();
    slot.pass_on(sequence_);
    return out;
  }

  /// Gives up on the incoming block: drops it if it came, else marks the slot so that its
  /// sender passes it on. When the slot still serves an earlier call this device gave up on,
  /// whose sender has not come, nothing can be marked: the world is then poisoned, since
  /// nobody could wait on that slot any more (this needs two exchanges given up on, which a
  /// device does only when it catches the exceptions that unwound past their handles).
  void cancel() noexcept;

 private:
  /// Clears this receipt, and its slot's in-flight mark, when the caller leaves.
  struct finish {
    async_receipt* r;
    ~finish() {
      --r->box_->members[r->rank_].in_flight[r->sequence_ % async_depth];
      r->box_.reset(), r->world_.reset(), r->device_.reset();
    }
  };
  finish finish_on_exit() { return finish{this}; }
  void check_device() const;
  [[nodiscard]] std::string my_call() const { return box_->members[rank_].calls[sequence_ % async_depth]; }
  /// Passes the slot on after a call in which this device receives nothing; a block that came
  /// for that call anyway is a mismatch of the devices' calls.
  void pass_over_nothing(async_slot& slot);

  std::shared_ptr<world> world_;
  std::shared_ptr<async_mailbox> box_;
  std::shared_ptr<device_record> device_;
  std::size_t rank_ = 0;
  std::uint32_t sequence_ = 0;
  long source_ = -1;
  std::uint64_t fingerprint_ = 0;
  std::string_view verb_;
  std::size_t lane_ = 0;  // the sender's, in a mailbox with a lane per sender
};

/// Leaves this device's block for its receiver (in the sender's `lane`): waits only until the
/// receiver's slot serves this call (the receiver is done with its call async_depth calls
/// earlier).
template <class T>
void post_block(world& w, async_mailbox& box, std::size_t receiver, std::uint32_t sequence, std::size_t rank,
                const collective_call& call, const shared_array<T>& block, std::size_t lane = 0) {
  async_slot& slot = box.slot(receiver, sequence, lane);
  std::uint32_t now = wait_for_peer(w, slot, [&](std::uint32_t s) { return async_slot::reached(s, sequence); }, call.what,
                                    box.paths[receiver]);
  for (;;) {
    if (async_slot::passed(now, sequence))
      fail_async_mismatch(w, box.paths[rank],
                          message(call.what, ": device ", box.paths[rank], " sends to device ", box.paths[receiver],
                                  ", which receives nothing in that call (", call.signature, "); every device must "
                                  "start the same asynchronous collectives with the same pairs"));
    if (async_slot::phase_of(now) == async_slot::abandoned) return slot.pass_on(sequence);  // nobody wants it
    if (async_slot::phase_of(now) != async_slot::free)  // posted, or being written, by another sender
      fail_async_mismatch(w, box.paths[rank],
                          message(call.what, ": device ", box.paths[rank], " and another device both send to device ",
                                  box.paths[receiver], " in the same asynchronous call; every device must start the "
                                  "same asynchronous collectives with the same pairs"));
    // The slot is this sender's once it marks it: the receiver then waits for the post
    // instead of giving up on the block or passing the slot on while the fields are written.
    if (!slot.state.compare_exchange_strong(now, async_slot::pack(sequence, async_slot::writing),
                                            std::memory_order_acq_rel, std::memory_order_acquire))
      continue;  // the receiver gave up, or passed the slot on, meanwhile: `now` says which
    slot.fingerprint = call.fingerprint, slot.source = rank;
    try {
      slot.signature.assign(call.signature);
    } catch (...) {  // out of memory: the block is posted all the same, with no text for a report
      slot.signature.clear();
    }
    slot.block.hold(block);
    slot.state.store(async_slot::pack(sequence, async_slot::posted), std::memory_order_seq_cst);
    slot.wake();
    return;
  }
}

/// One device's asynchronous call in a mailbox, from its start until its blocks are left: the
/// call's sequence number and the call as the receivers compare it. Made after the check that
/// the call's slot has no handle in flight, with the call recorded for reports and the arrival
/// fault point passed; finish() counts the call as started.
struct async_start {
  async_mailbox& box;
  std::size_t rank;
  std::uint32_t sequence;
  collective_call call;
  std::shared_ptr<device_record> me;
  std::shared_ptr<world> w;

  template <class T>
  async_start(async_mailbox& mailbox, const membership& m, std::string_view verb, std::span<const named_axis> axes,
              std::span<const std::string_view> names, std::string_view options,
              const std::optional<groups_t>& groups, const shared_array<T>& mine)
      : box(mailbox), rank(m.rank), sequence(mailbox.members[m.rank].started),
        call(call_of<T>(verb, axes, options, groups, dims_t(mine.shape().begin(), mine.shape().end()))),
        me(current_device()), w(find_frame(names.front())->shared) {
    start_unless_poisoned(*w, call.what, me->path);
    auto& self = box.members[rank];
    if (self.in_flight[sequence % async_depth])
      fail(call.what, ": device ", me->path, " starts an exchange while the one it started ", async_depth,
           " calls earlier over the same axes is still in flight; at most ", async_depth,
           " may be in flight at once: call wait() on the oldest handle first");
    me->enter(call.signature);
    self.calls[sequence % async_depth].assign(call.signature);
    at_fault_point(fault_point::arrival, verb);
  }
  void finish() { box.members[rank].started = (sequence + 1) & async_slot::sequence_mask; }
};

/// Starts ppermute among device threads: checks the pairs, leaves this device's array for
/// its destination, and returns the receipt of what this device receives. `names` are the
/// axes' names, all device-thread axes along which the value varies (thread_axes).
template <class T>
async_receipt start_permute(std::string_view verb, const shared_array<T>& mine, std::span<const named_axis> axes,
                            std::span<const std::string_view> names, const permutation_t& perm) {
  membership m = join(names);
  const long source = senders(verb, axes, perm, member_count(axes))[m.rank];
  async_start start(mailbox_of(m, axes), m, verb, axes, names, pairs_options(perm), std::nullopt, mine);
  long destination = -1;
  for (auto [s, d] : perm)
    if (static_cast<std::size_t>(s) == m.rank) destination = d;
  if (destination >= 0)
    post_block(*start.w, start.box, static_cast<std::size_t>(destination), start.sequence, m.rank, start.call, mine);
  start.finish();
  async_receipt receipt(start.w, m.comm->mailbox, start.me, m.rank, start.sequence, source, start.call.fingerprint, verb);
  at_fault_point(fault_point::exchanged, verb);
  return receipt;
}

/// Starts a collective in which every member sends to every member, among the device threads
/// spanned by `names` (the device axes of `axes` along which the operand varies): leaves this
/// device's block for every member, itself included, in its own lane, and appends the
/// receipts of what the members leave for it, in rank order. `options` and `groups` complete
/// the signature that the receivers compare, as the blocking collective's frame does.
template <class T>
void start_all_lanes(std::vector<async_receipt>& receipts, std::string_view verb, const shared_array<T>& mine,
                     std::span<const named_axis> axes, std::span<const std::string_view> names,
                     std::string_view options, const std::optional<groups_t>& groups) {
  membership m = join(names);
  async_start start(all_lanes_mailbox_of(m, axes), m, verb, axes, names, options, groups, mine);
  for (std::size_t r = 0; r < start.box.size; ++r)
    post_block(*start.w, start.box, r, start.sequence, m.rank, start.call, mine, m.rank);
  start.finish();
  for (std::size_t s = 0; s < start.box.size; ++s)
    receipts.emplace_back(start.w, m.comm->all_lanes_mailbox, start.me, m.rank, start.sequence, static_cast<long>(s),
                          start.call.fingerprint, verb, s);
  at_fault_point(fault_point::exchanged, verb);
}

/// This process's side of an asynchronous ppermute among MPI processes: the pending
/// MPI_Isend and MPI_Irecv, and the arrays they read and write, until wait() finishes them.
/// Dropped before, or failed in, the wait, it keeps those arrays for the rest of the program,
/// since MPI may still read and write them.
class process_receipt {
 public:
  process_receipt() = default;
  process_receipt(std::unique_ptr<process_channel::pending_call> pending, std::shared_ptr<void> sent,
                  std::shared_ptr<void> received)
      : pending_(std::move(pending)), sent_(std::move(sent)), received_(std::move(received)) {}
  process_receipt(process_receipt&& other) noexcept { *this = std::move(other); }
  process_receipt& operator=(process_receipt&& other) noexcept;
  ~process_receipt() { cancel(); }

  [[nodiscard]] bool active() const { return received_ != nullptr; }

  /// Waits for the MPI requests and returns the array they wrote into.
  std::shared_ptr<void> finish();

  /// Waits for the MPI requests and returns what arrived (zeros where nothing does).
  template <class T>
  shared_array<T> take() {
    return share_array<T>(std::move(*std::static_pointer_cast<xt::xarray<T>>(finish())));
  }

  void cancel() noexcept;

 private:
  std::unique_ptr<process_channel::pending_call> pending_;
  std::shared_ptr<void> sent_, received_;
};

/// Starts ppermute among MPI processes, where every axis is a process axis along which the
/// value varies (as the blocking one's MPI_Sendrecv path): the processes agree on the call
/// (as every collective over processes does), then MPI_Irecv and MPI_Isend start.
template <class T>
process_receipt start_permute_across_processes(std::string_view verb, const shared_array<T>& mine,
                                               std::span<const named_axis> axes, const permutation_t& perm) {
  auto call = whole_payloads<T>(verb, block_of(mine), axes, std::nullopt, false, pairs_options(perm));
  const auto from = senders(verb, axes, perm, member_count(axes));
  const auto me = static_cast<long>(call->channel->rank());
  long to = -1;
  for (auto [source, destination] : perm)
    if (source == me) to = destination;
  auto received = std::make_shared<xt::xarray<T>>(uninitialized_array<T>(call->in.shape));
  const long source = from[static_cast<std::size_t>(me)];
  if (source < 0) std::fill(received->begin(), received->end(), T{});
  const void* in = call->in.data;  // in `mine`, or in `contiguous`, whose buffer a move keeps
  auto sent = std::make_shared<std::pair<shared_array<T>, xt::xarray<T>>>(mine, std::move(call->contiguous));
  auto pending = call->channel->start_sendrecv(in, to, received->data(), source, received->size() * sizeof(T));
  return process_receipt(std::move(pending), std::move(sent), std::move(received));
}

/// The collective_error thrown for dropped handles. It carries the line that the terminate
/// handler installed by throw_dropped prints when the error ends the program.
class handle_dropped_error : public collective_error {
 public:
  handle_dropped_error(const std::string& what, std::shared_ptr<const std::string> report)
      : collective_error(what), report_(std::move(report)) {}
  [[nodiscard]] const std::shared_ptr<const std::string>& report() const noexcept { return report_; }

 private:
  std::shared_ptr<const std::string> report_;
};

/// Throws a handle_dropped_error saying `what`. A handle's destructor throws it, so that a
/// handle kept where no exception may leave (a std::vector, whose destructor is noexcept)
/// ends the program; g++ then calls std::terminate with no active exception, and nothing
/// would say why. So the first call installs a terminate handler (chaining the previous one)
/// that prints "namedax: terminating: <what> ..." when this error ends the program.
[[noreturn]] NAMEDAX_DECL void throw_dropped(const std::string& what);

/// Whether some receipt of `receipts` is still active.
inline bool any_active(std::span<const async_receipt> receipts) {
  for (const async_receipt& r : receipts)
    if (r.active()) return true;
  return false;
}

/// What a handle holds: the result itself when it was computed at start (vmap, and every case
/// that is not an exchange among device threads), or the receipt of the block to come and how
/// to type it as the blocking collective types its result.
template <class R>
class async_state {
 public:
  using result_type = R;
  async_state() = default;
  async_state(std::string (*what)(), R value) : what_(what), value_(std::move(value)) { note_caller(); }
  /// One receipt per leaf (among device threads), each leaf's shape, and how to make the result.
  using receipts = std::array<async_receipt, async_depth>;
  using shapes = std::array<dims_t, async_depth>;
  using receive_fn = R (*)(receipts&, process_receipt&, const shapes&);
  async_state(std::string (*what)(), receipts leaves, shapes shape, receive_fn receive)
      : what_(what), receipts_(std::move(leaves)), shapes_(std::move(shape)), receive_(receive) {
    note_caller();
  }
  async_state(std::string (*what)(), process_receipt receipt, receive_fn receive)
      : what_(what), process_(std::move(receipt)), receive_(receive) {
    note_caller();
  }
  /// The receipts of a collective in which every member sends (start_all_lanes), or of one
  /// started among processes, and how to make the result from them: `finish(lanes, process)`.
  template <std::invocable<std::vector<async_receipt>&, process_receipt&> Finish>
  async_state(std::string (*what)(), std::vector<async_receipt> lanes, Finish finish)
      : what_(what), lanes_(std::move(lanes)), finish_(new finisher_of<Finish>(std::move(finish))) {
    note_caller();
  }
  template <std::invocable<std::vector<async_receipt>&, process_receipt&> Finish>
  async_state(std::string (*what)(), process_receipt receipt, Finish finish)
      : what_(what), process_(std::move(receipt)), finish_(new finisher_of<Finish>(std::move(finish))) {
    note_caller();
  }
  async_state(async_state&& other) noexcept { *this = std::move(other); }
  async_state& operator=(async_state&& other) {
    if (this != &other) {
      drop();
      what_ = other.what_, value_ = std::move(other.value_), receipts_ = std::move(other.receipts_);
      process_ = std::move(other.process_), lanes_ = std::move(other.lanes_), finish_ = std::move(other.finish_);
      shapes_ = std::move(other.shapes_), receive_ = other.receive_, device_ = std::move(other.device_);
      exceptions_ = other.exceptions_;
      other.value_.reset(), other.receive_ = nullptr;
    }
    return *this;
  }
  ~async_state() = default;

  [[nodiscard]] bool pending() const {
    return value_.has_value() || process_.active() || any_active(receipts_) || any_active(lanes_);
  }

  R wait() {
    if (!pending())
      fail(what_ ? what_() : std::string("namedax::async"), ": wait() was called on a handle that holds no exchange",
           where(), " (it was waited already, or moved from); call wait() once on each started handle");
    if (value_) return std::exchange(value_, std::nullopt).value();
    if (finish_) return finish_->finish(lanes_, process_);
    return receive_(receipts_, process_, shapes_);
  }

  /// A handle that goes away pending: its exchange is cancelled, and unless an exception is
  /// unwinding the stack (which then reports the failure), a collective_error says so.
  void drop() {
    if (!pending()) return;
    cancel();
    if (std::uncaught_exceptions() > exceptions_) return;
    throw_dropped(message(what_(), ": a handle was dropped without wait()", where(),
                          "; call wait() on every handle an asynchronous collective returns"));
  }

  /// Cancels the exchange, if one is pending, without a report: peers never wait on it.
  void cancel() noexcept {
    for (auto& r : receipts_) r.cancel();
    for (auto& r : lanes_) r.cancel();
    process_.cancel();
    value_.reset();
  }

  /// "namedax::async::psum over ('i',) on device i=2", for reports.
  [[nodiscard]] std::string description() const {
    return message(what_ ? what_() : std::string("namedax::async"), where());
  }

 private:
  void note_caller() {
    device_ = current_device();
    exceptions_ = std::uncaught_exceptions();
  }
  [[nodiscard]] std::string where() const { return device_ ? message(" on device ", device_->path) : std::string(); }

  std::string (*what_)() = nullptr;  // "namedax::async::ppermute over ('i',)", made for messages only
  std::optional<R> value_;
  receipts receipts_;
  shapes shapes_;
  process_receipt process_;
  receive_fn receive_ = nullptr;
  /// A start's finishing lambda, held as one small class per lambda: std::function would also
  /// instantiate copying it, its manager and its checks, for every collective a program starts.
  struct finisher {
    virtual ~finisher() = default;
    virtual R finish(std::vector<async_receipt>& lanes, process_receipt& process) = 0;
  };
  template <class F>
  struct finisher_of final : finisher {
    explicit finisher_of(F f) : f_(std::move(f)) {}
    R finish(std::vector<async_receipt>& lanes, process_receipt& process) override { return f_(lanes, process); }
    F f_;
  };

  std::vector<async_receipt> lanes_;
  std::unique_ptr<finisher> finish_;
  std::shared_ptr<device_record> device_;
  int exceptions_ = 0;
};

/// Reaches the state of a namedax::async::handle, whose friend it is, for the bodies of
/// namedax::async::handles below.
struct handle_access {
  template <class H>
  static auto& state(H& h) {
    return h.state_;
  }
};

/// namedax::async::handles::wait_all: waits on each handle in order and returns the results
/// in that order, leaving `items` empty; when a wait throws, the handles not yet waited are
/// cancelled without a report of their own, and that error leaves.
template <class H>
std::vector<typename H::result_type> wait_all_handles(std::vector<H>& items) {
  std::vector<typename H::result_type> out;
  out.reserve(items.size());
  try {
    for (auto& h : items) out.push_back(h.wait());
  } catch (...) {
    for (auto& h : items) handle_access::state(h).cancel();
    items.clear();
    throw;
  }
  items.clear();
  return out;
}

/// namedax::async::handles going away (or assigned over): cancels every handle of `items` and,
/// when some were pending and no more exceptions than `exceptions` (those at its construction)
/// are unwinding, throws one handle_dropped_error with their count and the first one's
/// description.
template <class H>
void drop_handles(std::vector<H>& items, int exceptions) {
  std::size_t dropped = 0, first = 0;
  for (std::size_t k = items.size(); k-- > 0;)
    if (items[k].pending()) ++dropped, first = k;
  if (dropped == 0) return items.clear();
  const bool unwinding = std::uncaught_exceptions() > exceptions;
  std::string what;
  if (!unwinding)
    what = message("namedax::async::handles: ", dropped, " of ", items.size(), " handles were dropped without wait(), the first ",
                   handle_access::state(items[first]).description(),
                   "; call wait_all() (or wait() on each handle) before they go away");
  for (auto& h : items) handle_access::state(h).cancel();
  items.clear();
  if (!unwinding) throw_dropped(what);
}

/// "namedax::<verb> over ('i', 'j')" for the names of a call, made when a message needs it.
template <class Verb, class... Names>
std::string async_what() {
  std::string axes = "(";
  ((axes += axes.size() > 1 ? ", '" : "'", axes += Names::name, axes += '\''), ...);
  axes += sizeof...(Names) == 1 ? ",)" : ")";
  return message("namedax::", Verb::name, " over ", axes);
}

/// Whether leaf type L is a named value that varies along every one of `Names`.
template <class L, class... Names>
constexpr bool async_leaf_varies() {
  if constexpr (NamedValue<L>) {
    constexpr axis_mask names = L::env_type::template mask_of<Names...>();
    return (L::varying & names) == names;
  } else {
    return false;
  }
}

/// The leaves of X (itself, or the children of a node of at most async_depth named values),
/// when each varies along every one of `Names`: then they go among device threads one
/// exchange each. An empty tuple otherwise.
template <class X, class... Names>
auto async_leaves_of(const X& x, type_list<Names...>) {
  if constexpr (async_leaf_varies<X, Names...>()) {
    return std::tuple<const X&>{x};
  } else if constexpr (is_node<X>) {
    constexpr bool all = []<std::size_t... I>(std::index_sequence<I...>) {
      return ((async_leaf_varies<child_t<X, I>, Names...>() && ...));
    }(std::make_index_sequence<child_count<X>>{});
    if constexpr (all && child_count<X> > 0 && child_count<X> <= async_depth) return children(x);
    else return std::tuple<>{};
  } else {
    return std::tuple<>{};
  }
}

/// A received leaf typed as the blocking ppermute types it.
template <class L, class... Names>
using async_typed_t = named<shared_array<typename L::value_type>, typename L::env_type,
                            L::varying | L::env_type::template mask_of<Names...>()>;

/// The type of X made of the received leaves, as a std::type_identity (for decltype only).
template <class X, class Leaves, class... Names, std::size_t... I>
auto async_made_of(type_list<Names...>, std::index_sequence<I...>) {
  if constexpr (NamedValue<X>)
    return std::type_identity<async_typed_t<X, Names...>>{};
  else
    return std::type_identity<decltype(make_like<X>(
        std::declval<async_typed_t<std::remove_cvref_t<std::tuple_element_t<I, Leaves>>, Names...>>()...))>{};
}

/// Starts ppermute: among device threads, a leaf (or each leaf of a node) that varies along
/// every name leaves its array for its destination at once (start_permute); among MPI
/// processes, a leaf starts MPI_Isend and MPI_Irecv (start_permute_across_processes); every
/// other case (vmap, a mix of placements, nested pytrees, deferred values) runs the blocking
/// ppermute now and keeps its result; so does a traced x (under grad), whose blocking
/// ppermute records the derivative.
template <class Verb, class X, class A>
auto start_ppermute(const X& x, const A& axes, const permutation_t& perm) {
  using R = decltype(namedax::ppermute(x, axes, perm));
  return [&]<class... Names>(type_list<Names...> names) {
    std::string (*what)() = &async_what<Verb, Names...>;
    using leaves = decltype(async_leaves_of(x, names));
    constexpr std::size_t count = std::tuple_size_v<leaves>;
    if constexpr (count > 0) {
      using first = std::remove_cvref_t<std::tuple_element_t<0, leaves>>;
      // The result as the blocking ppermute makes it from the received arrays.
      using made = typename decltype(async_made_of<X, leaves>(names, std::make_index_sequence<count>{}))::type;
      if constexpr (std::is_same_v<made, R>) {
        require_bound<Verb, typename first::env_type, Names...>();
        const auto named_axes = describe_named_axes<first, Names...>(Verb::name);
        if (const auto threads = thread_axes(named_axes)) {
          typename async_state<R>::receipts receipts;
          typename async_state<R>::shapes shapes;
          const auto in = async_leaves_of(x, names);
          [&]<std::size_t... I>(std::index_sequence<I...>) {
            auto start = [&]<std::size_t K>(std::integral_constant<std::size_t, K>) {
              const auto owned = namedax::eval(std::get<K>(in));  // what is sent: the caller may rebind x meanwhile
              using T = typename std::remove_cvref_t<decltype(owned)>::value_type;
              receipts[K] = start_permute<T>(Verb::name, owned.payload(), named_axes, *threads, perm);
              shapes[K].assign(owned.payload().shape().begin(), owned.payload().shape().end());
            };
            (start(std::integral_constant<std::size_t, I>{}), ...);
          }(std::make_index_sequence<count>{});
          auto receive = [](typename async_state<R>::receipts& r, process_receipt&,
                            const typename async_state<R>::shapes& s) -> R {
            return [&]<std::size_t... I>(std::index_sequence<I...>) -> R {
              // Braced: the leaves are taken in order, as they were started.
              std::tuple<async_typed_t<std::remove_cvref_t<std::tuple_element_t<I, leaves>>, Names...>...> got{
                  r[I].template take<typename std::remove_cvref_t<std::tuple_element_t<I, leaves>>::value_type>(s[I])...};
              if constexpr (NamedValue<X>) return R(std::move(std::get<0>(got)));
              else return make_like<X>(std::move(std::get<I>(got))...);
            }(std::make_index_sequence<count>{});
          };
          return async_state<R>(what, std::move(receipts), std::move(shapes), +receive);
        }
        if constexpr (NamedValue<X>) {
          if (placed_on_processes(named_axes)) {
            using T = typename X::value_type;
            const auto owned = namedax::eval(x);
            auto receipt = start_permute_across_processes<T>(Verb::name, owned.payload(), named_axes, perm);
            auto receive = [](typename async_state<R>::receipts&, process_receipt& p,
                              const typename async_state<R>::shapes&) -> R { return R(p.take<T>()); };
            return async_state<R>(what, std::move(receipt), +receive);
          }
        }
      }
    }
    return async_state<R>(what, namedax::ppermute(x, axes, perm));
  }(names_only(to_axis_list(axes)));
}

/// Whether the blocking collective's frames read every leaf of X as its evaluated payload, so
/// that what a start leaves is what they would exchange: named values, none deferred, and no
/// bool that a sum (`Sums`) reads as int32.
template <class X, bool Sums>
constexpr bool leaves_sent_as_they_are() {
  using leaves = decltype(tree_leaves(std::declval<const X&>()));
  return []<std::size_t... I>(std::index_sequence<I...>) {
    return ([]<class L>(std::type_identity<L>) {
      if constexpr (NamedValue<L>) return !(Sums && std::is_same_v<typename L::value_type, bool>);
      else return false;
    }(std::type_identity<std::remove_cvref_t<std::tuple_element_t<I, leaves>>>{}) && ...);
  }(std::make_index_sequence<std::tuple_size_v<leaves>>{});
}

/// The device axes among `Names` along which leaf L varies, which its frame meets (none: it
/// meets no device), when all are axes of device threads; nothing when one is of processes.
template <class Verb, class L, class... Names>
std::optional<xt::svector<std::string_view, 8>> met_among_threads() {
  xt::svector<std::string_view, 8> names;
  for (const auto& ax : describe_named_axes<L, Names...>(Verb::name)) {
    if (ax.place != placement::devices || !ax.varies) continue;
    const frame* f = find_frame(ax.name);
    if (!f->on_threads()) return std::nullopt;
    names.push_back(ax.name);
  }
  return names;
}

/// Points `slot` at `now` for a scope: what a wait installs for the collective it runs.
template <class T>
class scoped_install {
 public:
  scoped_install(T*& slot, T* now) : slot_(slot), previous_(std::exchange(slot, now)) {}
  scoped_install(const scoped_install&) = delete;
  scoped_install& operator=(const scoped_install&) = delete;
  ~scoped_install() { slot_ = previous_; }

 private:
  T*& slot_;
  T* previous_;
};

/// The members' blocks a wait takes from its receipts (in the order the start left them), as
/// the collective frames that the wait's rule opens read them (received_members).
class members_taken {
 public:
  explicit members_taken(std::vector<async_receipt>& receipts) : receipts_(receipts) {}

  /// The next `n` receipts: the members of the frame that opens on `mine`.
  template <class P>
  void next(const P& mine, std::size_t n) {
    using T = typename P::value_type;
    auto& entry = received_.entries.emplace_back();
    entry.shape.assign(mine.shape().begin(), mine.shape().end());
    entry.mine = mine.data();
    entry.shared = [box = receipts_[lane_].mailbox(), sequence = receipts_[lane_].sequence(),
                    leaf = received_.entries.size() - 1] { return box->take_fold(sequence, leaf); };
    for (std::size_t k = 0; k < n; ++k) {
      auto block = receipts_[lane_++].template take<T>(entry.shape);
      entry.members.push_back(block.data());
      kept_.push_back(std::make_shared<const decltype(block)>(std::move(block)));
    }
  }

  /// `rule()`, its frames reading the blocks taken; each block must have been read.
  template <class Verb, class... Names, class Rule>
  auto run(Rule rule) {
    scoped_install scope(members_received(), &received_);
    auto out = rule();
    if (!all_read())
      fail(async_what<Verb, Names...>(), ": internal error: the wait read fewer blocks than the start left");
    return out;
  }

 private:
  [[nodiscard]] bool all_read() const {
    for (const received_members::entry& e : received_.entries)
      if (!e.members.empty()) return false;
    return true;
  }

  std::vector<async_receipt>& receipts_;
  std::size_t lane_ = 0;
  received_members received_;
  std::vector<std::shared_ptr<const void>> kept_;  // the members' blocks, while the rule reads them
};

/// Starts `run(held)` among MPI processes: the blocking collective runs up to its MPI call,
/// which a process path starts (MPI_Iallreduce, MPI_Iallgather, MPI_Ireduce_scatter_block,
/// MPI_Ialltoall) and leaves in flight; wait() finishes it and runs the collective again on
/// what arrived, without a second agreement or MPI call (process_start). A run that reaches no
/// such call (not a process axis, or a case without a process path) finished at the start,
/// and its result is kept.
template <class R, class Held, class Run>
async_state<R> start_among_processes(std::string (*what)(), Held held, const Run& run) {
  auto start = std::make_shared<process_start>();
  start->operand = std::make_shared<Held>(held);  // shares the payload's array
  const auto* data = held.payload().data();
  start->operand_begin = data, start->operand_end = data + held.payload().size();
  {
    scoped_install scope(process_start_in_progress(), start.get());
    try {
      R value = run(held);
      if (!start->called) return async_state<R>(what, std::move(value));
    } catch (const started_among_processes&) {
    } catch (...) {
      // Failed after its MPI call started: MPI may still read and write the arrays, which the
      // cancelled receipt keeps for the rest of the program.
      if (start->pending) process_receipt(std::move(start->pending), std::move(start->sent), start->received).cancel();
      throw;
    }
  }
  process_receipt receipt(std::move(start->pending), std::move(start->sent), start->received);
  auto finish = [held = std::move(held), run, start](std::vector<async_receipt>&, process_receipt& p) -> R {
    start->received = p.finish();
    start->now = process_start::phase::replaying;
    scoped_install scope(process_start_in_progress(), start.get());
    return run(held);
  };
  return async_state<R>(what, std::move(receipt), std::move(finish));
}

/// Of one leaf of a start among device threads: the device axes its frame meets, and how many
/// members they span (0: none). Not a type of start_collective's own, which each start's
/// instantiation would have again, with its vector.
struct leaf_meeting {
  xt::svector<std::string_view, 8> names;
  std::size_t members = 0;
};
inline bool any_meets(const std::vector<leaf_meeting>& met) {
  for (const leaf_meeting& m : met)
    if (m.members > 0) return true;
  return false;
}

/// Starts the collective that `run(x)` computes (a blocking collective with its axes and
/// options bound; `options` and `groups` as its frames write them into their signature).
/// Among device threads, when every leaf is sent as it is (leaves_sent_as_they_are) and
/// meets devices on threads only, each leaf that meets any leaves its evaluated payload for
/// every member at once (start_all_lanes); wait() takes the members' blocks and runs `run` on
/// the evaluated leaves with those blocks as their members (received_members), so that it
/// gives the blocking collective's result bit for bit without meeting the devices again.
/// Every other case (vmap, processes, positional axes, deferred values) runs `run(x)` now;
/// so does a traced x (under grad), whose blocking collective records the derivative.
template <class Verb, bool Sums, class X, class A, class Run>
auto start_collective(const X& x, const A& axes, std::string_view options, const std::optional<groups_t>& groups,
                      Run run) {
  using R = decltype(run(x));
  return [&]<std::size_t P, class... Names>(const axis_list<P, Names...>&) {
    std::string (*what)() = &async_what<Verb, Names...>;
    if constexpr (P == 0 && leaves_sent_as_they_are<X, Sums>()) {
      using held_type = decltype(detail::tree_map(x, [](const auto& leaf) { return namedax::eval(leaf); }));
      if constexpr (std::is_same_v<decltype(run(std::declval<const held_type&>())), R>) {
        std::vector<leaf_meeting> met;
        bool on_threads = current_device() != nullptr && !members_received();
        tree_for_each(x, [&]<class L>(const L&) {
          const auto names = met_among_threads<Verb, L, Names...>();
          on_threads = on_threads && names;
          leaf_meeting& m = met.emplace_back();
          if (!names || names->empty()) return;
          m.names = *names, m.members = 1;
          for (std::string_view name : m.names) m.members *= find_frame(name)->size;
        });
        if (on_threads && any_meets(met)) {
          const std::string text(options);  // option_text's buffer is reused by the calls below
          held_type held = detail::tree_map(x, [](const auto& leaf) { return namedax::eval(leaf); });
          std::vector<async_receipt> lanes;
          std::size_t leaf = 0;
          tree_for_each(held, [&]<class L>(const L& v) {
            const leaf_meeting& m = met[leaf++];
            if (m.members == 0) return;
            start_all_lanes<typename L::value_type>(lanes, Verb::name, v.payload(),
                                                    describe_named_axes<L, Names...>(Verb::name), m.names, text, groups);
          });
          auto finish = [held = std::move(held), run, met](std::vector<async_receipt>& receipts, process_receipt&) -> R {
            members_taken taken(receipts);
            std::size_t leaf = 0;
            tree_for_each(held, [&]<class L>(const L& v) {
              if (const std::size_t n = met[leaf++].members) taken.next(v.payload(), n);
            });
            return taken.run<Verb, Names...>([&] { return run(held); });
          };
          return async_state<R>(what, std::move(lanes), std::move(finish));
        }
      }
    }
    // NamedValue<X> first: it does not depend on this lambda's parameters, so clang++ drops
    // the branch for a pytree (a condition that depends on P would keep eval(x) in it).
    if constexpr (NamedValue<X>) {
      using held_type = decltype(namedax::eval(x));
      if constexpr (P == 0 && std::is_same_v<decltype(run(std::declval<const held_type&>())), R>) {
        auto on_processes = [](std::string_view name) {
          const frame* f = find_frame(name);
          return f && f->processes;
        };
        if (!current_device() && (on_processes(Names::name) || ...))
          return start_among_processes<R>(what, namedax::eval(x), run);
      }
    }
    return async_state<R>(what, run(x));
  }(to_axis_list(axes));
}

/// Starts, among the device threads spanned by `names`, a collective whose rule opens one
/// frame on each of `arrays` (in any order): leaves each array for every member
/// (start_all_lanes), and the wait runs `rule(arrays...)` with the members' blocks as what
/// those frames read, so that it gives the blocking rule's result without meeting again.
template <class R, class Verb, class... Names, class Rule, class... T>
async_state<R> start_arrays(type_list<Names...>, std::span<const named_axis> axes, std::span<const std::string_view> names,
                            const std::optional<groups_t>& groups, Rule rule, shared_array<T>... arrays) {
  std::vector<async_receipt> lanes;
  (start_all_lanes<T>(lanes, Verb::name, arrays, axes, names, "", groups), ...);
  const std::size_t members = lanes.size() / sizeof...(T);
  auto finish = [rule = std::move(rule), members, arrays...](std::vector<async_receipt>& receipts,
                                                              process_receipt&) mutable -> R {
    members_taken taken(receipts);
    (taken.next(arrays, members), ...);
    return taken.run<Verb, Names...>([&] { return rule(arrays...); });
  };
  return async_state<R>(&async_what<Verb, Names...>, std::move(lanes), std::move(finish));
}

/// A collective of x that runs whole at start (`run()`), its result held for wait().
template <class Verb, class X, class A, class Run>
auto computed_at_start(const X&, const A& axes, Run run) {
  return [&]<std::size_t P, class... Names>(const axis_list<P, Names...>&) {
    return async_state<decltype(run())>(&async_what<Verb, Names...>, run());
  }(to_axis_list(axes));
}

/// pargmax's index (Extreme max) or pargmin's (min) from `gathered`, the operand gathered
/// along the axes without groups, member k's block at index k of dim 0, k its linear index
/// along the axes: the lowest k holding the extreme, or the largest int32 where a member holds
/// a NaN, which is what the blocking form's pmax, where and pmin give.
template <reduction Extreme, class G>
auto arg_extreme_of_gathered(const G& gathered) {
  using T = typename G::value_type;
  xt::xarray<T> storage;
  strided_block<T> all = block_in_memory<T>(gathered.payload(), storage);
  make_row_major(all, storage);
  const dims_t shape(all.shape.begin() + 1, all.shape.end());
  auto out = uninitialized_array<std::int32_t>(shape);
  const std::size_t members = all.shape.front(), count = out.size();
  for (std::size_t e = 0; e < count; ++e) {
    T best = all.data[e];
    bool has_nan = best != best;
    std::int32_t at = 0;
    for (std::size_t k = 1; k < members; ++k) {
      const T v = all.data[k * count + e];
      has_nan = has_nan || v != v;
      if (Extreme == reduction::max ? best < v : v < best) best = v, at = static_cast<std::int32_t>(k);
    }
    out.data()[e] = has_nan ? std::numeric_limits<std::int32_t>::max() : at;
  }
  return make_named<shared_array<std::int32_t>, typename G::env_type, G::varying>(share_array(std::move(out)));
}

/// Starts pargmax (Extreme max) or pargmin (min) without groups, whose blocking form
/// `blocking(x)` meets the devices twice (its second reduction reads the first one's result):
/// the start leaves the operand as async::all_gather's does, and the wait gathers the members'
/// blocks and finds the extreme's index itself, so the devices meet once. Every case that runs
/// at start runs the blocking form.
template <class Verb, reduction Extreme, class X, class A, class Blocking>
auto start_arg_extreme(const X& x, const A& axes, Blocking blocking) {
  return start_collective<Verb, false>(x, axes, "", std::nullopt, [axes, blocking](const auto& value) {
    if constexpr (leaves_sent_as_they_are<std::remove_cvref_t<decltype(value)>, false>()) {
      if (members_received())  // in a wait: the members' blocks are there, the devices are not
        return detail::tree_map(value, [&](const auto& leaf) {
          return arg_extreme_of_gathered<Extreme>(namedax::all_gather(leaf, axes));
        });
    }
    return blocking(value);
  });
}

/// Starts pgather: among device threads the start leaves src as async::all_gather does, and
/// the wait gathers from the members' blocks with pgather's own rule. `idx` is held as it is
/// at the start (evaluated, when it is a named value). When idx brings names src lacks (src
/// would be widened into their environment, a copy), pgather runs at start.
template <class Verb, class S, class I, class A>
auto start_pgather(const S& src, const I& idx, const A& axes) {
  auto index = [&] {
    if constexpr (NamedValue<I>) return namedax::eval(idx);
    else return idx;
  }();
  auto run = [index, axes](const auto& s) { return namedax::pgather(s, index, axes); };
  // Positional axes in `axes` only index src's block, which goes as it is: start along the
  // names, with the dims in the call's signature, as the blocking frame writes them.
  auto names = []<std::size_t P, class... Names>(const axis_list<P, Names...>&) { return axis_list<0, Names...>{}; };
  if constexpr (std::is_same_v<typename merged_env<env<>, S, I>::type, typename env_of<S>::type> && NamedValue<S>) {
    const auto list = to_axis_list(axes);
    const std::string dims = message(" along dims ", canonical_positional(Verb::name, list.positional, src.dimension()));
    return start_collective<Verb, false>(src, names(list), dims, std::nullopt, run);
  } else
    return computed_at_start<Verb>(src, axes, [&] { return run(src); });
}

#if NAMEDAX_DEFINITIONS  // the bodies of the functions declared above (see detail/compilation.hpp)
NAMEDAX_DECL async_mailbox& mailbox_of(const membership& m, std::span<const named_axis> axes) {
  communicator& c = *m.comm;
  std::call_once(c.mailbox_made, [&] { c.mailbox = std::make_shared<async_mailbox>(c, axes, 1); });
  return *c.mailbox;
}

NAMEDAX_DECL async_mailbox& all_lanes_mailbox_of(const membership& m, std::span<const named_axis> axes) {
  communicator& c = *m.comm;
  std::call_once(c.all_lanes_mailbox_made, [&] { c.all_lanes_mailbox = std::make_shared<async_mailbox>(c, axes, c.size); });
  return *c.all_lanes_mailbox;
}

NAMEDAX_DECL void report_in_world(world& w, const std::string& path, const std::string& why) {
  std::lock_guard guard(w.lock);
  if (!w.first_error || w.first_error_is_abort)
    w.first_error = std::make_exception_ptr(collective_error(why)), w.first_error_is_abort = false,
    w.error_note = message(" (on device ", path, ")");
  w.poison(why);
}

NAMEDAX_DECL void fail_async_mismatch(world& w, const std::string& path, std::string why) {
  why += enclosing_function_note();
  report_in_world(w, path, why);
  throw collective_error(why);
}

NAMEDAX_DECL void start_unless_poisoned(world& w, std::string_view what, const std::string& path) {
  if (!w.poisoned.load()) return;
  std::lock_guard guard(w.lock);
  throw collective_abort(message(what, " on device ", path, " was aborted: ", w.reason));
}

NAMEDAX_DECL void async_slot::pass_on(std::uint32_t sequence) {
  block.reset();
  state.store(pack(sequence + async_depth, free), std::memory_order_seq_cst);
  wake();
}

NAMEDAX_DECL async_mailbox::async_mailbox(const communicator& c, std::span<const named_axis> named,
                                          std::size_t lane_count)
    : size(c.size), lanes(lane_count), paths(c.member_paths), axes(describe_axes(named)),
      slots(new async_slot[c.size * async_depth * lane_count]), members(new member[c.size]) {
  for (std::size_t k = 0; k < c.size * async_depth * lanes; ++k)
    slots[k].state.store(async_slot::pack(static_cast<std::uint32_t>(k / lanes % async_depth), async_slot::free));
}

NAMEDAX_DECL std::shared_ptr<shared_fold> async_mailbox::take_fold(std::uint32_t sequence, std::size_t leaf) {
  std::lock_guard lock(folds_lock_);
  auto it = std::find_if(folds_.begin(), folds_.end(),
                         [&](const fold_entry& e) { return e.sequence == sequence && e.leaf == leaf; });
  if (it == folds_.end()) it = folds_.insert(folds_.end(), {sequence, leaf, 0, std::make_shared<shared_fold>()});
  std::shared_ptr<shared_fold> fold = it->fold;
  if (++it->taken == size) folds_.erase(it);
  return fold;
}

NAMEDAX_DECL async_receipt::async_receipt(std::shared_ptr<world> w, std::shared_ptr<async_mailbox> box,
                                          std::shared_ptr<device_record> device, std::size_t rank,
                                          std::uint32_t sequence, long source, std::uint64_t fingerprint,
                                          std::string_view verb, std::size_t lane)
    : world_(std::move(w)), box_(std::move(box)), device_(std::move(device)), rank_(rank), sequence_(sequence),
      source_(source), fingerprint_(fingerprint), verb_(verb), lane_(lane) {
  ++box_->members[rank_].in_flight[sequence_ % async_depth];
}

NAMEDAX_DECL async_receipt& async_receipt::operator=(async_receipt&& other) noexcept {
  if (this != &other) {
    cancel();
    world_ = std::move(other.world_), box_ = std::move(other.box_), device_ = std::move(other.device_);
    rank_ = other.rank_, sequence_ = other.sequence_, source_ = other.source_, fingerprint_ = other.fingerprint_;
    verb_ = other.verb_, lane_ = other.lane_;
  }
  return *this;
}

NAMEDAX_DECL std::string async_receipt::what() const { return message("namedax::", verb_, " over ", box_->axes); }

NAMEDAX_DECL void async_receipt::cancel() noexcept {
  if (!box_) return;
  auto done = finish_on_exit();
  async_slot& slot = box_->slot(rank_, sequence_, lane_);
  std::uint32_t now = slot.state.load(std::memory_order_acquire);
  while (async_slot::serves(now, sequence_)) {
    if (async_slot::phase_of(now) == async_slot::posted) return slot.pass_on(sequence_);
    if (async_slot::phase_of(now) == async_slot::writing) {  // posted in a moment
      std::this_thread::yield();
      now = slot.state.load(std::memory_order_acquire);
      continue;
    }
    const std::uint32_t next = source_ < 0 ? async_slot::pack(sequence_ + async_depth, async_slot::free)
                                           : async_slot::pack(sequence_, async_slot::abandoned);
    if (slot.state.compare_exchange_weak(now, next, std::memory_order_acq_rel, std::memory_order_acquire)) {
      slot.wake();
      return;
    }
  }
  try {
    report_in_world(*world_, device_->path,
                    message(what(), ": device ", device_->path, " gave up on an exchange while an earlier one it "
                            "gave up on had not arrived either; call wait() on every handle"));
  } catch (...) {  // out of memory for the message: the world stays as it is
  }
}

NAMEDAX_DECL void async_receipt::check_device() const {
  if (current_device() != device_)
    fail(what(), ": wait() was called on device ", current_device() ? current_device()->path : std::string("(none)"),
         " for a handle that device ", device_->path, " started; each device waits on its own handles");
}

NAMEDAX_DECL void async_receipt::pass_over_nothing(async_slot& slot) {
  std::uint32_t now = slot.state.load(std::memory_order_acquire);
  while (async_slot::phase_of(now) != async_slot::posted) {
    if (async_slot::phase_of(now) == async_slot::writing) {  // a block comes after all: posted in a moment
      std::this_thread::yield();
      now = slot.state.load(std::memory_order_acquire);
    } else if (slot.state.compare_exchange_weak(now, async_slot::pack(sequence_ + async_depth, async_slot::free),
                                                std::memory_order_acq_rel, std::memory_order_acquire)) {
      slot.wake();
      return;
    }
  }
  const std::string theirs = slot.signature, from = box_->paths[slot.source];
  slot.pass_on(sequence_);
  fail_async_mismatch(*world_, device_->path,
                      message(what(), ": device ", from, " sent device ", device_->path, " a block from ", theirs,
                              " in a call in which device ", device_->path, " receives nothing (", my_call(),
                              "); every device must start the same asynchronous collectives with the same pairs"));
}

// Which dropped-handle error this thread threw last: a weak reference to the report line the
// error object owns. It is never stale: it expires with the error's last copy (wherever that is
// destroyed, on any thread), so no start, wait or catch needs to clear it, and the handler
// cannot print a report for an error that was caught and is gone.
NAMEDAX_DECL std::weak_ptr<const std::string>& last_dropped_report() {
  thread_local std::weak_ptr<const std::string> report;
  return report;
}

NAMEDAX_DECL void print_dropped_report_and_terminate() noexcept;

// The handler that was installed before namedax's, called after namedax's line is printed.
NAMEDAX_DECL std::terminate_handler previous_terminate_handler() {
  static const std::terminate_handler previous = std::set_terminate(&print_dropped_report_and_terminate);
  return previous;
}

// When terminate is called for an active handle_dropped_error (clang++, or an error leaving a
// thread's function), the report is the error's. Otherwise, with an exception in flight (g++
// calls terminate straight from a noexcept function that an exception reaches, without making
// it active; the active one, if any, is one a catch block handles), the only trace is this
// thread's last dropped-handle error, if it still exists. No exception in flight means that
// terminate was called for another reason, and nothing is printed.
NAMEDAX_DECL void print_dropped_report_and_terminate() noexcept {
  std::shared_ptr<const std::string> report;
  if (std::exception_ptr active = std::current_exception()) {
    try {
      std::rethrow_exception(active);
    } catch (const handle_dropped_error& e) {
      report = e.report();
    } catch (...) {
    }
  }
  if (!report && std::uncaught_exceptions() > 0) report = last_dropped_report().lock();
  if (report) std::fputs(report->c_str(), stderr);
  if (std::terminate_handler previous = previous_terminate_handler()) previous();
  std::abort();
}

NAMEDAX_DECL void throw_dropped(const std::string& what) {
  auto report = std::make_shared<const std::string>(
      message("namedax: terminating: ", what, " (thrown by a destructor where no exception may leave, such as a "
              "std::vector's: keep many handles in a namedax::async::handles)\n"));
  (void)previous_terminate_handler();  // installs the handler, once
  last_dropped_report() = report;
  throw handle_dropped_error(what, std::move(report));
}

NAMEDAX_DECL process_receipt& process_receipt::operator=(process_receipt&& other) noexcept {
  if (this != &other) {
    cancel();
    pending_ = std::move(other.pending_), sent_ = std::move(other.sent_), received_ = std::move(other.received_);
  }
  return *this;
}

NAMEDAX_DECL std::shared_ptr<void> process_receipt::finish() {
  if (pending_) {
    try {
      pending_->wait();
    } catch (...) {
      cancel();
      throw;
    }
  }
  pending_.reset(), sent_.reset();
  return std::exchange(received_, nullptr);
}

NAMEDAX_DECL void process_receipt::cancel() noexcept {
  if (!active()) return;
  pending_.reset();  // lets go of the requests, which MPI completes on its own
  // Never destroyed: the arrays would go back to pools that are gone at exit.
  static std::mutex lock;
  static auto* kept = new std::vector<std::shared_ptr<void>>;
  try {
    std::lock_guard guard(lock);
    kept->push_back(std::move(sent_)), kept->push_back(std::move(received_));
  } catch (...) {  // out of memory: the arrays are leaked instead
    new std::shared_ptr<void>(std::move(sent_)), new std::shared_ptr<void>(std::move(received_));
  }
  sent_.reset(), received_.reset();
}
#endif  // NAMEDAX_DEFINITIONS

}  // namespace namedax::detail
