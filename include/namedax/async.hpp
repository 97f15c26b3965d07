// SPDX-License-Identifier: MIT
// Asynchronous collectives: `namedax::async::ppermute` starts an exchange and returns a handle
// whose wait() gives what the blocking collective gives, so that a device computes while its
// block travels. The bodies are in detail/async.hpp.
#pragma once

#include <namedax/axis.hpp>
#include <namedax/collective_options.hpp>
#include <namedax/detail/async.hpp>
#include <namedax/detail/traced.hpp>

#include <cstddef>
#include <exception>
#include <string>
#include <utility>
#include <vector>

namespace namedax::async {

/// An exchange started by an asynchronous collective. It owns what it sent and what it will
/// receive; it is move-only, and wait() is called once:
///   auto h = namedax::async::ppermute(block, "i"_ax, ring);  // sent now
///   auto partial = namedax::xeinsum<"ij,jk->ik">(a, w);      // computed meanwhile
///   auto next = h.wait();                                    // == namedax::ppermute(block, "i"_ax, ring)
/// A handle that goes away without wait() throws a namedax::collective_error from its
/// destructor (unless an exception is already unwinding past it, which is then the error
/// reported); its exchange is cancelled first, so peers never wait on it. Keep handles as
/// local variables, in structs, in std::array, or many of them in namedax::async::handles:
/// in a container whose destructor may not throw (std::vector), a dropped pending handle ends
/// the program, as a dropped joinable std::thread does, after a line on stderr that starts
/// "namedax: terminating:" and names the handle.
/// (clang++ never destroys a value returned from the scope of a handle that throws so,
/// llvm-project#12658: close the handle's scope before the return.)
template <class R>
class handle {
 public:
  /// What wait() returns: the blocking collective's result type.
  using result_type = R;
  handle() = default;
  explicit handle(detail::async_state<R> state) : state_(std::move(state)) {}
  handle(handle&&) noexcept = default;
  /// Assigning over a pending handle drops it (see above).
  handle& operator=(handle&&) = default;
  handle(const handle&) = delete;
  handle& operator=(const handle&) = delete;
  ~handle() noexcept(false) { state_.drop(); }

  /// Blocks until this device's incoming block is there and returns it: exactly what the
  /// blocking collective returns (type, variance, bits). A second call is a namedax::error.
  [[nodiscard]] R wait() { return state_.wait(); }
  /// Whether the handle holds an exchange that wait() has not taken yet.
  [[nodiscard]] bool pending() const { return state_.pending(); }

 private:
  friend struct detail::handle_access;
  detail::async_state<R> state_;
};

/// Many handles of one result type, owned together: a std::vector of handles would end the
/// program when it drops a pending one (its destructor may not throw). Going away (or assigned
/// over) with handles pending, it cancels every one of them, so peers never wait on them, and
/// throws one namedax::collective_error that says how many were dropped and names the first
/// ("namedax::async::handles: 2 of 3 handles were dropped without wait(), the first
/// namedax::async::pmax over ('i',) on device i=2; ..."), unless an exception is already
/// unwinding past it, which is then the error reported. Each handle counts against the
/// exchanges a device may have in flight (detail::async_depth, 8, over the same axes).
///   namedax::async::handles<decltype(namedax::psum(x, "i"_ax))> hs;
///   for (int k = 0; k < 3; ++k) hs.push_back(namedax::async::psum(x * (k + 1.0f), "i"_ax));
///   auto sums = hs.wait_all();  // sums[k] == namedax::psum(x * (k + 1.0f), "i"_ax), bit for bit
template <class R>
class handles {
 public:
  handles() = default;
  handles(handles&& other) noexcept : items_(std::move(other.items_)) {}
  /// Assigning over pending handles drops them (see above).
  handles& operator=(handles&& other) {
    if (this != &other) detail::drop_handles(items_, exceptions_), items_ = std::move(other.items_);
    return *this;
  }
  handles(const handles&) = delete;
  handles& operator=(const handles&) = delete;
  ~handles() noexcept(false) { detail::drop_handles(items_, exceptions_); }

  /// Takes `h` in, after the others; returns it as held here.
  handle<R>& push_back(handle<R> h) { return items_.emplace_back(std::move(h)); }
  [[nodiscard]] std::size_t size() const { return items_.size(); }
  [[nodiscard]] bool empty() const { return items_.empty(); }
  /// The k-th handle taken in, to wait on it alone.
  [[nodiscard]] handle<R>& operator[](std::size_t k) { return items_[k]; }
  [[nodiscard]] const handle<R>& operator[](std::size_t k) const { return items_[k]; }

  /// Waits on every handle in the order they were taken in and returns their results in that
  /// order; this then holds no handle. When a wait throws (a handle waited already, a failed
  /// device), the handles not yet waited are cancelled without a report of their own, and that
  /// error is the one that leaves.
  [[nodiscard]] std::vector<R> wait_all() { return detail::wait_all_handles(items_); }

 private:
  std::vector<handle<R>> items_;
  int exceptions_ = std::uncaught_exceptions();  // more than these unwinding: dropping is silent
};

/// ppermute, started now and waited later: sends the value of index `source` to index
/// `destination` for each pair; indices that receive nothing get zeros at wait().
///   auto h = namedax::async::ppermute(x, "i"_ax, {{0, 1}, {1, 2}, {2, 3}, {3, 0}});
///   ...
///   auto shifted = h.wait();  // the same as namedax::ppermute(x, "i"_ax, pairs)
/// Among device threads (pmap) the start leaves this device's block for its destination and
/// returns without waiting for any device; wait() blocks until the block for this device is
/// there, with the same timeouts and failure reports as a blocking collective; each leaf of a
/// pytree is an exchange of its own, and at most detail::async_depth (8) exchanges of a device
/// over the same axes may be in flight. Among MPI processes the start posts MPI_Irecv and
/// MPI_Isend and wait() waits for them. Under vmap, with a mix of placements, for nested
/// pytrees and under grad, the exchange runs at start and wait() returns its result.
struct ppermute_fn {
  static constexpr std::string_view name = "async::ppermute";
  template <class X, AxisArgument A>
  [[nodiscard]] auto operator()(const X& x, const A& axes, const std::vector<std::pair<int, int>>& perm) const {
    auto state = detail::start_ppermute<ppermute_fn>(x, axes, perm);
    return handle<typename decltype(state)::result_type>(std::move(state));
  }
  /// A permutation known at compile time (`namedax::static_perm<0, 1, 1, 0>`): checked at
  /// compile time as namedax::ppermute checks it.
  template <class X, AxisArgument A, StaticPermutation P>
  [[nodiscard]] auto operator()(const X& x, const A& axes, P perm) const {
    using checked [[maybe_unused]] = decltype(namedax::ppermute(x, axes, perm));
    return (*this)(x, axes, P::pairs());
  }
};
inline constexpr ppermute_fn ppermute{};

namespace detail {
template <class R>
handle<R> handle_of(namedax::detail::async_state<R> state) {
  return handle<R>(std::move(state));
}

/// The asynchronous form of the blocking collective `Blocking`, called as `Blocking{}(value,
/// axes, args...)` with the arguments given at start. `Sums`: the blocking one reads bools as
/// int32. Among device threads, the start leaves each leaf's evaluated payload for every device
/// along the axes and returns; wait() takes what the others left and computes this device's
/// result from it with the blocking collective's own rule (namedax::detail::start_collective),
/// so it is the blocking result bit for bit. Among MPI processes, a value whose process path
/// is one MPI call (psum, pmean, pmax, pmin: MPI_Iallreduce; all_gather: MPI_Iallgather;
/// psum_scatter: MPI_Ireduce_scatter_block; all_to_all and pswapaxes: MPI_Ialltoall) starts
/// that call and returns; wait() finishes it and completes the result with the blocking
/// collective's own code. Under vmap, with positional axes, for deferred values, for pytrees
/// and for the other cases among processes, the blocking collective runs at start; and under
/// grad (traced values), where its rule records the derivative: the pullback runs the
/// blocking transpose, and the forward does not overlap.
template <class Verb, class Blocking, bool Sums>
struct started {
  template <class X, class A, class... Args>
  static auto start(const X& x, const A& axes, std::string_view options, const std::optional<namedax::detail::groups_t>& groups,
                    const Args&... args) {
    return handle_of(namedax::detail::start_collective<Verb, Sums>(
        x, axes, options, groups, [axes, args...](const auto& value) { return Blocking{}(value, axes, args...); }));
  }
};

/// psum, pmean, pmax and pmin, with the blocking forms' overloads: `{}` or no options give a
/// result the same along the axes, reduce_options with groups one that varies.
template <class Verb, class Blocking, bool Sums>
struct all_reduce_fn : started<Verb, Blocking, Sums> {
  template <class X, AxisArgument A>
  [[nodiscard]] auto operator()(const X& x, const A& axes) const {
    return this->start(x, axes, "", std::nullopt);
  }
  template <class X, AxisArgument A>
  [[nodiscard]] auto operator()(const X& x, const A& axes, const namedax::detail::reduce_options_without_groups&) const {
    return (*this)(x, axes);
  }
  template <class X, AxisArgument A, class Options = reduce_options>
    requires std::same_as<Options, reduce_options>
  [[nodiscard]] auto operator()(const X& x, const A& axes, const Options& options) const {
    return this->start(x, axes, "", namedax::detail::groups_of(options.axis_index_groups), options);
  }
};
}  // namespace detail

/// psum started now and waited later: `auto h = namedax::async::psum(grads, "data"_ax);` ...
/// `auto total = h.wait();` gives namedax::psum(grads, "data"_ax), bit for bit. Each device
/// adds up every member's block at wait(), where the blocking psum of a large array shares
/// that work among the devices: overlap pays when there is work to hide the wait behind.
struct psum_fn : detail::all_reduce_fn<psum_fn, namedax::psum_fn, true> {
  static constexpr std::string_view name = "async::psum";
};
/// pmean started now and waited later.
struct pmean_fn : detail::all_reduce_fn<pmean_fn, namedax::pmean_fn, true> {
  static constexpr std::string_view name = "async::pmean";
};
/// pmax started now and waited later.
struct pmax_fn : detail::all_reduce_fn<pmax_fn, namedax::pmax_fn, false> {
  static constexpr std::string_view name = "async::pmax";
};
/// pmin started now and waited later.
struct pmin_fn : detail::all_reduce_fn<pmin_fn, namedax::pmin_fn, false> {
  static constexpr std::string_view name = "async::pmin";
};
inline constexpr psum_fn psum{};
inline constexpr pmean_fn pmean{};
inline constexpr pmax_fn pmax{};
inline constexpr pmin_fn pmin{};

/// all_gather started now and waited later, with the blocking form's overloads (no options
/// or options without groups: a result the same along the axes).
///   auto h = namedax::async::all_gather(shard, "model"_ax, {.tiled = true});  // FSDP: next layer's weights
struct all_gather_fn : detail::started<all_gather_fn, namedax::all_gather_fn, false> {
  static constexpr std::string_view name = "async::all_gather";
  template <class X, AxisArgument A>
  [[nodiscard]] auto operator()(const X& x, const A& axes) const {
    return start(x, axes, namedax::detail::gather_options(0, false), std::nullopt);
  }
  template <class X, AxisArgument A>
  [[nodiscard]] auto operator()(const X& x, const A& axes,
                                const namedax::without_groups::all_gather_options& options) const {
    return start(x, axes, namedax::detail::gather_options(options.axis, options.tiled), std::nullopt, options);
  }
  template <class X, AxisArgument A, class Options = all_gather_options>
    requires std::same_as<Options, all_gather_options>
  [[nodiscard]] auto operator()(const X& x, const A& axes, const Options& options) const {
    return start(x, axes, namedax::detail::gather_options(options.axis, options.tiled),
                 namedax::detail::groups_of(options.axis_index_groups), options);
  }
};
inline constexpr all_gather_fn all_gather{};

/// psum_scatter started now and waited later; each device adds up only its own chunk.
struct psum_scatter_fn : detail::started<psum_scatter_fn, namedax::psum_scatter_fn, true> {
  static constexpr std::string_view name = "async::psum_scatter";
  template <class X, AxisArgument A>
  [[nodiscard]] auto operator()(const X& x, const A& axes, const psum_scatter_options& options = {}) const {
    return start(x, axes, namedax::detail::scatter_options(options.scatter_dimension, options.tiled),
                 namedax::detail::groups_of(options.axis_index_groups), options);
  }
};
inline constexpr psum_scatter_fn psum_scatter{};

/// all_to_all started now and waited later; each device copies only its own chunks.
struct all_to_all_fn : detail::started<all_to_all_fn, namedax::all_to_all_fn, false> {
  static constexpr std::string_view name = "async::all_to_all";
  template <class X, AxisArgument A>
  [[nodiscard]] auto operator()(const X& x, const A& axes, int split_axis, int concat_axis,
                                const all_to_all_options& options = {}) const {
    return start(x, axes, namedax::detail::split_options(split_axis, concat_axis, options.tiled),
                 namedax::detail::groups_of(options.axis_index_groups), split_axis, concat_axis, options);
  }
};
inline constexpr all_to_all_fn all_to_all{};

/// pswapaxes started now and waited later.
struct pswapaxes_fn : detail::started<pswapaxes_fn, namedax::pswapaxes_fn, false> {
  static constexpr std::string_view name = "async::pswapaxes";
  template <class X, AxisArgument A>
  [[nodiscard]] auto operator()(const X& x, const A& axes, int axis, const pswapaxes_options& options = {}) const {
    return start(x, axes, namedax::detail::split_options(axis, axis, false),
                 namedax::detail::groups_of(options.axis_index_groups), axis, options);
  }
};
inline constexpr pswapaxes_fn pswapaxes{};

/// pbroadcast from index `source`, started now and waited later.
struct pbroadcast_fn : detail::started<pbroadcast_fn, namedax::pbroadcast_fn, false> {
  static constexpr std::string_view name = "async::pbroadcast";
  template <class X, AxisArgument A>
  [[nodiscard]] auto operator()(const X& x, const A& axes, int source) const {
    return start(x, axes, namedax::detail::source_options(source), std::nullopt, source);
  }
};
inline constexpr pbroadcast_fn pbroadcast{};

/// pshuffle started now and waited later: the output at index i comes from index perm[i]. A
/// bad perm is reported by wait() (the blocking pshuffle's check), by every device.
struct pshuffle_fn : detail::started<pshuffle_fn, namedax::pshuffle_fn, false> {
  static constexpr std::string_view name = "async::pshuffle";
  template <class X, AxisArgument A>
  [[nodiscard]] auto operator()(const X& x, const A& axes, const std::vector<int>& perm) const {
    return start(x, axes, namedax::detail::option_text(" with shuffle ", perm), std::nullopt, perm);
  }
};
inline constexpr pshuffle_fn pshuffle{};

namespace detail {
/// pargmax and pargmin, with the blocking forms' overloads.
template <class Verb, class Blocking, namedax::detail::reduction Extreme>
struct arg_extreme_fn {
  template <class X, AxisArgument A>
  [[nodiscard]] auto operator()(const X& x, const A& axes) const {
    return handle_of(namedax::detail::start_arg_extreme<Verb, Extreme>(
        x, axes, [axes](const auto& value) { return Blocking{}(value, axes); }));
  }
  /// With groups, the result is computed at start.
  template <class X, AxisArgument A>
  [[nodiscard]] auto operator()(const X& x, const A& axes, const reduce_options& options) const {
    return handle_of(namedax::detail::computed_at_start<Verb>(x, axes, [&] { return Blocking{}(x, axes, options); }));
  }
};
}  // namespace detail

/// pargmax started now and waited later: `wait()` gives namedax::pargmax(x, axes) bit for bit
/// (the lowest linear index along the axes holding the maximum; the largest int32 where an
/// index holds a NaN). Among device threads and without groups the start leaves the operand
/// for the other devices, as async::all_gather does, and the wait finds the index from the
/// members' blocks: the devices meet once, where the blocking form meets them twice (a pmax,
/// then a pmin of the candidates). With groups, under vmap and among processes it runs at start.
///   auto h = namedax::async::pargmax(scores, "expert"_ax);
///   auto logits = namedax::eval(x * w);  // computed meanwhile
///   auto best = h.wait();                // the expert with the highest score, per token
struct pargmax_fn : detail::arg_extreme_fn<pargmax_fn, namedax::pargmax_fn, namedax::detail::reduction::max> {
  static constexpr std::string_view name = "async::pargmax";
};
/// pargmin started now and waited later, as async::pargmax (the lowest index of the minimum).
struct pargmin_fn : detail::arg_extreme_fn<pargmin_fn, namedax::pargmin_fn, namedax::detail::reduction::min> {
  static constexpr std::string_view name = "async::pargmin";
};
inline constexpr pargmax_fn pargmax{};
inline constexpr pargmin_fn pargmin{};

/// pgather started now and waited later: `wait()` gives namedax::pgather(src, idx, axes) bit
/// for bit. Among device threads the start leaves src for the other devices, as
/// async::all_gather does, and the wait reads the elements idx names from their blocks: an
/// embedding lookup from a sharded table can hide behind other work. idx is taken at the
/// start. Under vmap, over MPI and where idx varies along names src does not, it runs at start.
///   auto h = namedax::async::pgather(table_shard, token_ids, namedax::axes("shard"_ax, 0));
///   auto positions = namedax::eval(pos_table * scale);  // computed meanwhile
///   auto embedded = h.wait();
struct pgather_fn {
  static constexpr std::string_view name = "async::pgather";
  template <class S, class I, AxisArgument A>
    requires(NamedOperand<S> && Operand<I>)
  [[nodiscard]] auto operator()(const S& src, const I& idx, const A& axes) const {
    return detail::handle_of(namedax::detail::start_pgather<pgather_fn>(src, idx, axes));
  }
  /// Under grad (src traced): namedax::pgather at start, whose rule records the derivative.
  template <class S, class I, AxisArgument A>
    requires(Traced<S> && Operand<I>)
  [[nodiscard]] auto operator()(const S& src, const I& idx, const A& axes) const {
    return detail::handle_of(
        namedax::detail::computed_at_start<pgather_fn>(src, axes, [&] { return namedax::pgather(src, idx, axes); }));
  }
};
inline constexpr pgather_fn pgather{};

/// pdot started now and waited later: the local contraction runs at start (its errors are
/// reported there, in pdot's words), and its sum over the axes is started as async::psum
/// starts one, so wait() gives namedax::pdot(x, y, axes, ...) bit for bit. The tensor-parallel
/// row-parallel linear layer, whose all-reduce hides behind the next computation:
///   auto h = namedax::async::pdot(h1, w2_rows, "model"_ax, {{1}, {0}});
///   auto skip = namedax::eval(x * gate);  // computed meanwhile
///   auto y = h.wait() + skip;
struct pdot_fn : detail::started<pdot_fn, namedax::psum_fn, true> {
  static constexpr std::string_view name = "async::pdot";
  template <class X, class Y, AxisArgument A>
    requires((NamedOperand<X> || NamedOperand<Y>) && !std::is_arithmetic_v<X> && !std::is_arithmetic_v<Y> &&
             !Traced<X> && !Traced<Y>)
  [[nodiscard]] auto operator()(const X& x, const Y& y, const A& axes,
                                const namedax::detail::dimension_pairs& pos_contract = {},
                                const namedax::detail::dimension_pairs& pos_batch = {}) const {
    auto local = namedax::detail::when_resolved(
        [&](const auto& a, const auto& b) {
          return namedax::detail::local_pdot<namedax::pdot_fn>(a, b, axes, pos_contract, pos_batch);
        },
        x, y);
    return start(local, axes, "", std::nullopt);
  }
  /// Under grad (x or y traced): namedax::pdot at start, whose rule records the derivative.
  template <class X, class Y, AxisArgument A>
    requires(Traced<X> || Traced<Y>)
  [[nodiscard]] auto operator()(const X& x, const Y& y, const A& axes,
                                const namedax::detail::dimension_pairs& pos_contract = {},
                                const namedax::detail::dimension_pairs& pos_batch = {}) const {
    return detail::handle_of(namedax::detail::computed_at_start<pdot_fn>(
        x, axes, [&] { return namedax::pdot(x, y, axes, pos_contract, pos_batch); }));
  }
};
inline constexpr pdot_fn pdot{};

}  // namespace namedax::async
