// SPDX-License-Identifier: MIT
// The logical members of a collective over named axes, the same in both modes: member r is
// the payload at r's coordinates (row-major over the axes as given), read in place along
// vectorized axes and from another device's buffer along device axes. Every rule computes
// its outputs from these members, so vmap and pmap agree bit for bit.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <namedax/detail/compilation.hpp>
#include <namedax/detail/kernels.hpp>
#include <namedax/detail/rendezvous.hpp>
#include <namedax/error.hpp>

#include <xtensor/xarray.hpp>

#include <algorithm>
#include <atomic>
#include <climits>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <vector>

namespace namedax::detail {

/// One named axis of a collective, as the rules need it.
struct named_axis {
  std::string_view name;
  placement place;
  std::size_t size;
  bool varies;        // does the operand vary along it (else every index holds the same value)
  std::size_t slot;   // its trailing payload dimension, after the positional ones (vectorized axes)
  std::size_t index;  // this device's index (device axes)
};

/// The element type in JAX's spelling, for signatures and messages: every type its own name
/// (int8 and int16 must not meet in one exchange as one "int").
template <class T>
constexpr std::string_view dtype_name() {
  constexpr std::size_t bits = sizeof(T) * CHAR_BIT;
  if constexpr (std::is_same_v<T, bool>) return "bool";
  else if constexpr (is_complex_v<T>) return bits == 64 ? "complex64" : bits == 128 ? "complex128" : "complex256";
  else if constexpr (std::is_floating_point_v<T>)
    return bits == 16 ? "float16" : bits == 32 ? "float32" : bits == 64 ? "float64" : "float128";
  else if constexpr (std::is_integral_v<T> && std::is_signed_v<T>)
    return bits == 8 ? "int8" : bits == 16 ? "int16" : bits == 32 ? "int32" : bits == 64 ? "int64" : "int128";
  else if constexpr (std::is_integral_v<T>)
    return bits == 8 ? "uint8" : bits == 16 ? "uint16" : bits == 32 ? "uint32" : bits == 64 ? "uint64" : "uint128";
  else static_assert(always_false<T>, "namedax: collectives take bool, integer, floating-point or complex elements");
}

/// Appends the axes as JAX prints a tuple of names: "('i',)", "('i', 'j')".
NAMEDAX_DECL void append_axes(std::string& out, std::span<const named_axis> axes);
/// The axes as JAX prints a tuple of names.
NAMEDAX_DECL std::string describe_axes(std::span<const named_axis> axes);

/// A collective's parameters in the user's words, as its signature shows them, written into
/// a buffer of this thread that keeps its capacity (valid until the thread's next call).
template <class... Parts>
std::string_view option_text(const Parts&... parts) {
  thread_local std::string text;
  text.clear();
  (write_part(text, parts), ...);
  return text;
}

/// The groups of a collective: each one's ranks in the order given (one group of every rank
/// without axis_index_groups), and each rank's group and position in it.
struct group_layout {
  std::vector<std::vector<std::size_t>> members;
  std::vector<std::size_t> group_of, position_of;
};

/// One group of every rank in order: made once per size and thread, and kept (a call
/// without groups allocates nothing for them).
NAMEDAX_DECL const group_layout& ungrouped(std::size_t total);

/// How to name an index of an axis of `total` indices, for messages about one out of range.
NAMEDAX_DECL std::string valid_indices(std::size_t total);
/// Checks that `groups` partition 0..total-1 (and have equal sizes where the collective needs it).
NAMEDAX_DECL group_layout make_groups(std::string_view verb, std::span<const named_axis> axes,
                                      const std::optional<groups_t>& groups, std::size_t total, bool equal_sizes);
NAMEDAX_DECL std::string join_names(std::span<const std::string_view> names);

/// The process grid of the innermost process map, which knows every process axis in scope.
NAMEDAX_DECL process_grid& innermost_process_grid();

/// The number of members of a collective over `axes`: the product of their sizes.
inline std::size_t member_count(std::span<const named_axis> axes) {
  std::size_t total = 1;
  for (const auto& ax : axes) total *= ax.size;
  return total;
}

/// Makes `in` row-major, copying it into `storage` when it is not: other devices and
/// processes read a payload with one set of strides.
template <class T>
void make_row_major(strided_block<T>& in, xt::xarray<T>& storage) {
  if (in.strides == row_major_strides(in.shape)) return;
  storage = xt::xarray<T>::from_shape(in.shape);
  copy_strided(in, storage.data());
  in.data = storage.data();
  in.strides = row_major_strides(in.shape);
}

/// Runs `call`, an MPI call that reads and writes `buffers`. If it throws (another process
/// failed and the call was left pending, or MPI failed), the buffers are kept for the rest of
/// the program: MPI may still write to them.
template <class Call, class... Buffers>
void call_keeping(Call&& call, Buffers&... buffers) {
  try {
    call();
  } catch (...) {
    static std::mutex lock;
    static std::vector<std::shared_ptr<void>> kept;
    std::lock_guard hold(lock);
    (kept.push_back(std::make_shared<Buffers>(std::move(buffers))), ...);
    throw;
  }
}

/// The texts behind this thread's current collective_call, and what they describe: a call
/// like the one before (a collective in a loop) reuses them as they are.
struct call_texts {
  std::string axes, parameters, shape, signature, what;
  std::uint64_t fingerprint = 0;
  bool reusable = false;  // no groups (so `parameters` are the options), and written in full
  std::string_view verb, dtype;
  xt::svector<std::string_view, 8> names;
  dims_t dims;

  /// Whether they describe the call of verb `v` over `axes` with `options`, payload shape `s`
  /// and dtype `d` as they are.
  [[nodiscard]] bool describe(std::string_view v, std::span<const named_axis> axes, std::string_view options,
                              std::span<const std::size_t> s, std::string_view d) const;
};

/// A collective call as devices and processes compare it: `options` in the user's words.
/// Written into texts of this thread whose capacity stays: no allocation after the first.
template <class T>
collective_call call_of(std::string_view verb, std::span<const named_axis> axes, std::string_view options,
                        const std::optional<groups_t>& groups, std::span<const std::size_t> shape) {
  thread_local call_texts t;
  if (!groups && t.describe(verb, axes, options, shape, dtype_name<T>()))
    return {verb, t.axes, t.parameters, t.shape, dtype_name<T>(), t.signature, t.what, t.fingerprint};
  t.reusable = false;
  t.verb = verb, t.dtype = dtype_name<T>(), t.dims.assign(shape.begin(), shape.end());
  t.names.clear();
  for (const auto& a : axes) t.names.push_back(a.name);
  t.axes.clear(), append_axes(t.axes, axes);
  t.parameters.assign(options);
  if (groups) write_part(t.parameters, " with groups "), write_part(t.parameters, *groups);
  t.shape.clear(), write_part(t.shape, shape);
  t.signature.clear();
  for (std::string_view part : {verb, std::string_view(" over "), std::string_view(t.axes), std::string_view(t.parameters),
                                std::string_view(" of payload shape "), std::string_view(t.shape),
                                std::string_view(" and type "), dtype_name<T>()})
    t.signature += part;
  t.what.assign("namedax::"), t.what += verb, t.what += " over ", t.what += t.axes;
  t.fingerprint = fingerprint_of(t.signature);
  t.reusable = !groups;
  return {verb, t.axes, t.parameters, t.shape, dtype_name<T>(), t.signature, t.what, t.fingerprint};
}

/// Payload shape with the dims of the vectorized `axes` set to `size_of(axis)`.
template <class Size>
dims_t with_axis_dims(dims_t shape, std::size_t positional_rank, std::span<const named_axis> axes, Size size_of) {
  for (const auto& ax : axes)
    if (ax.place == placement::vectorized) shape[positional_rank + ax.slot] = size_of(ax);
  return shape;
}

/// A reduction's output that the members of one asynchronous call fold together in their
/// waits (reduce_in_wait): each claims pieces until none is left, so that the result is
/// computed once, not once per device, and every device shares it.
struct shared_fold {
  std::mutex making;          // the first member to come makes `out`
  std::shared_ptr<void> out;  // an xt::xarray of the result's element type
  std::atomic<std::size_t> claimed{0}, folded{0};  // pieces
};

/// What an asynchronous collective's start left for this device (detail/async.hpp): per leaf
/// that meets other devices, every member's block (row-major, indexed as the rendezvous
/// indexes them), this device's own among them, and the shape they share. While a wait() runs
/// the blocking collective on what was started, each collective_frame that would meet the
/// other devices takes the entry of its operand (its own block: the order in which a pytree's
/// leaves are computed is the compiler's), and the paths that would meet them otherwise stand
/// aside (thread_axes gives nothing): the wait computes what the blocking call computes, from
/// the same members, with the same rule.
struct received_members {
  struct entry {
    std::vector<const void*> members;  // empty once a frame took them
    const void* mine;
    dims_t shape;
    std::function<std::shared_ptr<shared_fold>()> shared;  // the call's shared_fold for this leaf
  };
  std::vector<entry> entries;

  /// The entry of the operand at `mine` of `shape` whose members no frame has taken yet; null
  /// when there is none.
  entry* unread(const void* mine, const dims_t& shape);
};
/// The received members this thread's collective frames read, when a wait() runs; else null.
inline received_members*& members_received() {
  thread_local received_members* installed = nullptr;
  return installed;
}

/// The members of one collective call on this caller (a device thread or the vmap caller).
template <class T>
class collective_frame {
 public:
  /// `in`: the payload, `positional_rank` of its dims are positional. `options` completes the
  /// signature that devices compare (the operation's parameters, in the user's words).
  collective_frame(std::string_view verb, strided_block<T> in, std::size_t positional_rank,
                   std::span<const named_axis> axes, const std::optional<groups_t>& groups, bool equal_groups,
                   std::string_view options)
      : axes_(axes), in_(std::move(in)), positional_rank_(positional_rank) {
    total_ = member_count(axes_);
    if (groups) own_groups_ = make_groups(verb, axes_, groups, total_, equal_groups);
    groups_ = groups ? &*own_groups_ : &ungrouped(total_);
    member_shape_ = with_axis_dims(in_.shape, positional_rank_, axes_, [](const named_axis&) { return std::size_t{1}; });

    // Device axes along which the operand varies need the other devices' buffers: device
    // threads lend theirs, processes send copies.
    xt::svector<std::string_view, 8> exchanged, across_processes;
    for (const auto& ax : axes_)
      if (ax.place == placement::devices && ax.varies)
        (find_frame(ax.name)->processes ? across_processes : exchanged).push_back(ax.name);
    if (exchanged.empty() && across_processes.empty()) return;
    const void* operand = in_.data;
    make_row_major(in_, contiguous_);
    if (received_members* received = members_received(); received && across_processes.empty()) {
      received_members::entry* mine = received->unread(operand, in_.shape);
      if (!mine)
        fail("namedax::", verb, ": internal error: the blocks an asynchronous collective started do not match its wait");
      lent_ = std::exchange(mine->members, {});
      return;
    }
    collective_call call = call_of<T>(verb, axes_, options, groups, in_.shape);
    if (across_processes.empty())
      exchange_.emplace(join(exchanged), in_.data, std::move(call), element_count(in_.shape) * sizeof(T));
    else gather_from_processes(across_processes, std::move(call));
  }

  [[nodiscard]] std::size_t total() const { return total_; }
  [[nodiscard]] const group_layout& groups() const { return *groups_; }
  [[nodiscard]] std::size_t positional_rank() const { return positional_rank_; }
  [[nodiscard]] const dims_t& in_shape() const { return in_.shape; }
  [[nodiscard]] bool any_varies() const {
    return std::any_of(axes_.begin(), axes_.end(), [](const named_axis& a) { return a.varies; });
  }

  /// Member r: the payload at r's coordinates, its dims along the vectorized axes of size 1.
  [[nodiscard]] strided_block<T> member(std::size_t rank) const {
    auto c = coordinates(rank);
    std::size_t device = 0;  // over the device axes (with a funnel: the process axes)
    std::ptrdiff_t offset = 0;
    dims_t thread(thread_index_.begin(), thread_index_.end());
    for (std::size_t k = 0; k < axes_.size(); ++k) {
      if (!axes_[k].varies) continue;
      if (axes_[k].place == placement::vectorized)
        offset += static_cast<std::ptrdiff_t>(c[k]) * in_.strides[positional_rank_ + axes_[k].slot];
      else if (funnel_ && thread_slot_[k] >= 0) thread[static_cast<std::size_t>(thread_slot_[k])] = c[k];
      else device = device * axes_[k].size + c[k];
    }
    const T* base = in_.data;
    if (funnel_) {
      std::size_t t = 0;
      for (std::size_t k = 0; k < thread.size(); ++k) t = t * thread_size_[k] + thread[k];
      base = static_cast<const T*>(exchange_->slot(0)) + (device * thread_size_total_ + t) * member_stride_;
    } else if (!lent_.empty()) {
      base = static_cast<const T*>(lent_[device]);
    } else if (exchange_) {
      base = static_cast<const T*>(exchange_->slot(device));
    } else if (member_stride_ > 0) {
      base = gathered_.data() + device * member_stride_;
    }
    // An empty payload may have no memory at all: its members are never read, and no offset
    // may be added to a null pointer.
    return {base ? base + offset : base, member_shape_, in_.strides};
  }

  /// Calls f(rank) for each rank whose output this caller computes: its own device
  /// coordinates with every coordinate along the vectorized axes, or, for an output that is
  /// the same for every rank (`all == false`), just the first.
  template <class F>
  void for_each_owned(bool all, F&& f) const {
    if (total_ == 0) return;  // an axis of size 0 has no member, so no rank owns an output
    dims_t c(axes_.size()), sizes(axes_.size(), 1);
    for (std::size_t k = 0; k < axes_.size(); ++k) {
      c[k] = axes_[k].place == placement::devices ? axes_[k].index : 0;
      if (all && axes_[k].place == placement::vectorized) sizes[k] = axes_[k].size;
    }
    const std::size_t count = std::accumulate(sizes.begin(), sizes.end(), std::size_t{1}, std::multiplies<>{});
    for (std::size_t s = 0; s < count; ++s) {
      for (std::size_t k = axes_.size(), rest = s; k-- > 0;)
        if (sizes[k] > 1) c[k] = rest % sizes[k], rest /= sizes[k];
      f(rank_of(c));
    }
  }

  /// `data` moved to rank r's place in a block with `strides` (vectorized_offset); null stays
  /// null (an empty block may have no memory, and no offset may be added to a null pointer).
  template <class U>
  [[nodiscard]] U* at_rank(U* data, std::size_t rank, std::span<const std::ptrdiff_t> strides,
                           std::size_t positional_rank) const {
    return data ? data + vectorized_offset(rank, strides, positional_rank) : data;
  }

  /// Where rank r's coordinates along the vectorized axes sit in a block with `strides`
  /// whose vectorized dims start after `positional_rank` dims.
  [[nodiscard]] std::ptrdiff_t vectorized_offset(std::size_t rank, std::span<const std::ptrdiff_t> strides,
                                                 std::size_t positional_rank) const {
    auto c = coordinates(rank);
    std::ptrdiff_t offset = 0;
    for (std::size_t k = 0; k < axes_.size(); ++k)
      if (axes_[k].place == placement::vectorized)
        offset += static_cast<std::ptrdiff_t>(c[k]) * strides[positional_rank + axes_[k].slot];
    return offset;
  }

  /// The output shape: the payload's, with `positional` dims in front, and the vectorized
  /// axes' dims whole when the output differs per rank (`varies`), else 1.
  [[nodiscard]] dims_t output_shape(dims_t positional, bool varies) const {
    positional.insert(positional.end(), in_.shape.begin() + static_cast<std::ptrdiff_t>(positional_rank_), in_.shape.end());
    const std::size_t rank = positional.size() - (in_.shape.size() - positional_rank_);
    return with_axis_dims(std::move(positional), rank, axes_,
                          [varies](const named_axis& a) { return varies ? a.size : std::size_t{1}; });
  }

  /// The devices are done reading each other's buffers.
  void release() {
    if (exchange_) exchange_->release();
  }

 private:
  /// Members in other processes: every member's payload, gathered once by one MPI_Allgather.
  /// On the device threads of a process, every thread of it meets the others first and the
  /// first one sends all their payloads in one call (only one thread of a process calls MPI):
  /// a funnel, and member (process p, thread t) is at p * threads + t of what it received.
  void gather_from_processes(std::span<const std::string_view> across_processes,
                             collective_call call) {
    const std::size_t count = element_count(in_.shape);
    process_grid& grid = innermost_process_grid();
    const std::string signature(call.signature);
    const std::string_view what = call.what;
    if (!current_device()) {
      at_fault_point(fault_point::arrival, call.op);
      grid.agree(signature, what);
      process_channel& channel = grid.channel(across_processes, nullptr);
      at_fault_point(fault_point::exchanged, call.op);
      gathered_ = uninitialized_array<T>(std::array{channel.size() * count});
      call_keeping([&] { channel.allgather(in_.data, gathered_.data(), count * sizeof(T)); }, gathered_, contiguous_);
      member_stride_ = count;
      return;
    }
    std::vector<std::string_view> threads;
    for (const frame& f : frames())
      if (f.shared) threads.push_back(f.name), thread_size_.push_back(f.size), thread_index_.push_back(f.index);
    for (const auto& ax : axes_) {
      auto it = std::find(threads.begin(), threads.end(), ax.name);
      thread_slot_.push_back(it == threads.end() ? -1 : static_cast<int>(it - threads.begin()));
    }
    funnel_ = true;
    member_stride_ = count;
    pointer_exchange payloads(join(threads), in_.data, call);
    thread_size_total_ = payloads.size();
    if (payloads.rank() == 0) {
      grid.agree(signature, what);
      process_channel& channel = grid.channel(across_processes, nullptr);
      at_fault_point(fault_point::exchanged, call.op);
      auto mine = uninitialized_array<T>(std::array{thread_size_total_ * count});
      for (std::size_t t = 0; t < thread_size_total_; ++t)
        std::copy_n(static_cast<const T*>(payloads.slot(t)), count, mine.data() + t * count);
      gathered_ = uninitialized_array<T>(std::array{channel.size() * mine.size()});
      call_keeping([&] { channel.allgather(mine.data(), gathered_.data(), mine.size() * sizeof(T)); }, gathered_, mine);
    }
    payloads.release();
    exchange_.emplace(join(threads), payloads.rank() == 0 ? gathered_.data() : nullptr, std::move(call), 0,
                      exchange_form::process_funnel);
  }

  [[nodiscard]] dims_t coordinates(std::size_t rank) const {
    dims_t c(axes_.size());
    for (std::size_t k = axes_.size(); k-- > 0;) c[k] = rank % axes_[k].size, rank /= axes_[k].size;
    return c;
  }
  [[nodiscard]] std::size_t rank_of(std::span<const std::size_t> c) const {
    std::size_t r = 0;
    for (std::size_t k = 0; k < axes_.size(); ++k) r = r * axes_[k].size + c[k];
    return r;
  }

  std::span<const named_axis> axes_;  // the caller's, which outlive the frame
  strided_block<T> in_;
  std::size_t positional_rank_;
  std::size_t total_ = 1;
  std::optional<group_layout> own_groups_;  // with axis_index_groups
  const group_layout* groups_;
  dims_t member_shape_;
  xt::xarray<T> contiguous_ = empty_array<T>();
  std::optional<pointer_exchange> exchange_;
  std::vector<const void*> lent_;  // the members an asynchronous start left (received_members)
  xt::xarray<T> gathered_ = empty_array<T>();  // members from other processes, member_stride_ elements each
  std::size_t member_stride_ = 0;  // 0: nothing gathered
  // The funnel of device threads inside a process: the thread axes in scope, this thread's
  // index along each, and each collective axis's place among them (-1: not a thread axis).
  bool funnel_ = false;
  std::vector<std::size_t> thread_size_, thread_index_;
  std::vector<int> thread_slot_;
  std::size_t thread_size_total_ = 1;
};

#if NAMEDAX_DEFINITIONS  // the bodies of the functions declared above (see detail/compilation.hpp)
NAMEDAX_DECL void append_axes(std::string& out, std::span<const named_axis> axes) {
  out += '(';
  for (std::size_t k = 0; k < axes.size(); ++k) out += k ? ", '" : "'", out += axes[k].name, out += '\'';
  out += axes.size() == 1 ? ",)" : ")";
}

NAMEDAX_DECL std::string describe_axes(std::span<const named_axis> axes) {
  std::string text;
  append_axes(text, axes);
  return text;
}

NAMEDAX_DECL const group_layout& ungrouped(std::size_t total) {
  thread_local std::vector<std::unique_ptr<group_layout>> made;
  for (const auto& g : made)
    if (g->group_of.size() == total) return *g;
  auto g = std::make_unique<group_layout>();
  g->members.emplace_back(total);
  std::iota(g->members[0].begin(), g->members[0].end(), std::size_t{0});
  g->position_of = g->members[0];
  g->group_of.assign(total, 0);
  made.push_back(std::move(g));
  return *made.back();
}

NAMEDAX_DECL std::string valid_indices(std::size_t total) {
  return total == 0 ? std::string("the axis has no index") : message("use indices 0..", total - 1);
}

NAMEDAX_DECL group_layout make_groups(std::string_view verb, std::span<const named_axis> axes,
                                      const std::optional<groups_t>& groups, std::size_t total, bool equal_sizes) {
  if (!groups) return ungrouped(total);
  group_layout g;
  g.group_of.assign(total, total), g.position_of.assign(total, 0);
  const auto where = message("namedax::", verb, ": axis_index_groups over axis ", describe_axes(axes), " of size ", total);
  for (const auto& group : *groups) {
    if (group.empty()) fail(where, " has an empty group");
    if (equal_sizes && group.size() != groups->front().size())
      fail(where, " have unequal sizes ", groups->front().size(), " and ", group.size(), "; ", verb,
           " needs groups of one size");
    std::vector<std::size_t> ranks;
    for (int i : group) {
      if (i < 0 || static_cast<std::size_t>(i) >= total)
        fail(where, " contain index ", i, ", which is out of range; ", valid_indices(total));
      const auto r = static_cast<std::size_t>(i);
      if (g.group_of[r] != total) fail(where, " contain index ", i, " twice; every index must be in exactly one group");
      g.group_of[r] = g.members.size(), g.position_of[r] = ranks.size();
      ranks.push_back(r);
    }
    g.members.push_back(std::move(ranks));
  }
  for (std::size_t r = 0; r < total; ++r)
    if (g.group_of[r] == total) fail(where, " do not contain index ", r, "; every index must be in exactly one group");
  return g;
}

NAMEDAX_DECL std::string join_names(std::span<const std::string_view> names) {
  std::vector<std::string> quoted;
  for (auto n : names) quoted.push_back(message('\'', n, '\''));
  return message(quoted);
}

NAMEDAX_DECL process_grid& innermost_process_grid() {
  const auto& stack = frames();
  auto it = std::find_if(stack.rbegin(), stack.rend(), [](const frame& f) { return f.processes != nullptr; });
  return *it->processes;
}

NAMEDAX_DECL bool call_texts::describe(std::string_view v, std::span<const named_axis> axes, std::string_view options,
                                      std::span<const std::size_t> s, std::string_view d) const {
  return reusable && v == verb && d == dtype && options == parameters &&
         std::equal(s.begin(), s.end(), dims.begin(), dims.end()) &&
         std::equal(axes.begin(), axes.end(), names.begin(), names.end(),
                    [](const named_axis& a, std::string_view n) { return a.name == n; });
}

NAMEDAX_DECL received_members::entry* received_members::unread(const void* mine, const dims_t& shape) {
  auto it = std::find_if(entries.begin(), entries.end(),
                         [&](const entry& e) { return !e.members.empty() && e.mine == mine && e.shape == shape; });
  return it == entries.end() ? nullptr : &*it;
}
#endif  // NAMEDAX_DEFINITIONS

#ifdef NAMEDAX_SEPARATE_COMPILATION  // defined once, by <namedax/separate_compilation.hpp>
#define NAMEDAX_INSTANTIATE(T)                                                                              \
  NAMEDAX_EXTERN template class collective_frame<T>;                                                       \
  NAMEDAX_EXTERN template collective_call call_of<T>(std::string_view, std::span<const named_axis>, std::string_view, \
                                                     const std::optional<groups_t>&, std::span<const std::size_t>);
NAMEDAX_FOR_EACH_ELEMENT_TYPE(NAMEDAX_INSTANTIATE)
NAMEDAX_INSTANTIATE(bool)
#undef NAMEDAX_INSTANTIATE
#endif

}  // namespace namedax::detail
