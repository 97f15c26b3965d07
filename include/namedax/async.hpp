// SPDX-License-Identifier: MIT
// Asynchronous collectives: `namedax::async::ppermute` starts an exchange and returns a handle
// whose wait() gives what the blocking collective gives, so that a device computes while its
// block travels. The bodies are in detail/async.hpp.
#pragma once

#include <namedax/axis.hpp>
#include <namedax/collective_options.hpp>
#include <namedax/detail/async.hpp>
#include <namedax/detail/traced.hpp>

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
/// local variables, in structs or in std::array: in a container whose destructor may not
/// throw, a dropped pending handle ends the program, as a dropped joinable std::thread does.
template <class R>
class handle {
 public:
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
  detail::async_state<R> state_;
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
/// MPI_Isend and wait() waits for them. Under vmap, with a mix of placements, and for nested
/// pytrees, the exchange runs at start and wait() returns its result.
struct ppermute_fn {
  static constexpr std::string_view name = "async::ppermute";
  template <class X, AxisArgument A>
    requires(!Traced<X>)
  [[nodiscard]] auto operator()(const X& x, const A& axes, const std::vector<std::pair<int, int>>& perm) const {
    auto state = detail::start_ppermute<ppermute_fn>(x, axes, perm);
    return handle<typename decltype(state)::result_type>(std::move(state));
  }
  template <Traced X, AxisArgument A>
  X operator()(const X& x, const A&, const std::vector<std::pair<int, int>>&) const {
    static_assert(detail::always_false<X>,
                  "namedax::grad: async::ppermute has no derivative rule; in a differentiated function use "
                  "namedax::ppermute, whose rule is its transpose");
    return x;  // only the assertion above is reported
  }
  /// A permutation known at compile time (`namedax::static_perm<0, 1, 1, 0>`): checked at
  /// compile time as namedax::ppermute checks it.
  template <class X, AxisArgument A, int... P>
  [[nodiscard]] auto operator()(const X& x, const A& axes, static_permutation<P...> perm) const {
    using checked [[maybe_unused]] = decltype(namedax::ppermute(x, axes, perm));
    return (*this)(x, axes, static_permutation<P...>::pairs());
  }
};
inline constexpr ppermute_fn ppermute{};

}  // namespace namedax::async
