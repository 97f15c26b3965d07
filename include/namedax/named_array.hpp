// SPDX-License-Identifier: MIT
// The value type: an xtensor payload plus, in its type, the axis environment and the set of
// named axes the value varies along. Elementwise arithmetic broadcasts by name.
#pragma once

#include <namedax/concepts.hpp>
#include <namedax/detail/deferred.hpp>
#include <namedax/detail/evaluate.hpp>
#include <namedax/detail/kernels.hpp>
#include <namedax/detail/pytree.hpp>
#include <namedax/detail/runtime.hpp>
#include <namedax/detail/unpack.hpp>
#include <namedax/error.hpp>
#include <namedax/named_shape.hpp>

#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xeval.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xoperation.hpp>
#include <xtensor/xstrided_view.hpp>

#include <array>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace namedax {

/// A value of a mapped function. `E` is an xtensor expression whose dimensions are the
/// positional ones the user sees, then one per vectorized axis of `Env` (size 1 where the
/// value does not vary along it): appending them keeps NumPy's right-aligned broadcasting
/// true for positional dimensions, and names line up without any reshape.
/// Device axes have no dimension: each device thread holds its own slice.
template <class E, class Env, axis_mask Varying>
class named {
 public:
  using payload_type = E;
  using env_type = Env;
  using value_type = typename std::decay_t<E>::value_type;
  static constexpr axis_mask varying = Varying;

  explicit named(E payload) : payload_(std::move(payload)) {}

  /// The xtensor expression behind the value (positional dimensions, then vectorized axes).
  [[nodiscard]] const E& payload() const& noexcept { return payload_; }
  [[nodiscard]] E payload() && { return std::move(payload_); }

  /// The positional rank and shape, as the mapped function sees them.
  [[nodiscard]] std::size_t dimension() const { return payload_.dimension() - Env::vectorized_count; }
  [[nodiscard]] std::vector<std::size_t> shape() const {
    auto s = payload_.shape();
    return {s.begin(), s.begin() + static_cast<std::ptrdiff_t>(dimension())};
  }

  /// The single value on this device, for SPMD control flow under pmap:
  /// `if (namedax::psum(x, "i"_ax).value() > 0)`. Does not compile for a value that varies
  /// along a vmap axis: under vmap it is many values; use namedax::where.
  [[nodiscard]] value_type value() const {
    static_assert(detail::is_one_value_per_device<Env, Varying>,
                  "namedax: this value varies along a vmap axis, so it is not one value; use namedax::where "
                  "instead of if, or map that axis with pmap");
    if (xt::compute_size(payload_.shape()) != 1)
      detail::fail("namedax: value() needs a single element; this value has positional shape ", shape());
    return *payload_.cbegin();
  }
  explicit operator bool() const { return static_cast<bool>(value()); }

  /// Rebinding, for loops that update a value (`acc = acc + y`, `acc = namedax::psum(acc, "i"_ax)`):
  /// a value that owns its data (what namedax::eval returns) takes any value of its element
  /// type (or a scalar) that varies along no name it does not; one that varies along fewer
  /// widens, as pvary does. The data is replaced, never written in place, since other values
  /// may share it. Other values' types record the expression that computes them, so they
  /// cannot be rebound: the first error line says to hold the variable with namedax::eval.
  template <Operand R>
    requires(!std::is_same_v<R, named>)
  named& operator=(const R& r) {
    rebind(r);
    return *this;
  }
  /// `acc += y` is `acc = acc + y`, and so on, on a value that owns its data.
  template <Operand R>
  named& operator+=(const R& r) {
    return *this = *this + r;
  }
  template <Operand R>
  named& operator-=(const R& r) {
    return *this = *this - r;
  }
  template <Operand R>
  named& operator*=(const R& r) {
    return *this = *this * r;
  }
  template <Operand R>
  named& operator/=(const R& r) {
    return *this = *this / r;
  }

 private:
  template <class R>
  void rebind(const R& r);  // defined below, where the helpers it uses are

  E payload_;
};

namespace detail {
template <class E, class Env, axis_mask V>
auto make_named(E payload) {
  return named<E, Env, V>(std::move(payload));
}

/// The payload of an operand, expressed in the longer environment `Env`.
template <class Env, class X>
auto payload_in(const X& x) {
  if constexpr (std::is_arithmetic_v<X>) {
    return x;
  } else if constexpr (is_named<X>) {
    using from = typename X::env_type;
    if constexpr (std::is_same_v<from, Env>) {
      return x.payload();  // a copy: expressions hold it by value, never by reference
    } else {
      // A value captured from an outer map: append size-1 dims for the inner vectorized axes.
      auto a = evaluate(x.payload());
      auto s = a.shape();
      std::vector<std::size_t> shape(s.begin(), s.end());
      shape.resize(shape.size() + Env::vectorized_count - from::vectorized_count, 1);
      a.reshape(shape);
      return share_array(std::move(a));
    }
  } else {
    auto a = evaluate(x);
    auto s = a.shape();
    std::vector<std::size_t> shape(s.begin(), s.end());
    shape.resize(shape.size() + Env::vectorized_count, 1);
    a.reshape(shape);
    return share_array(std::move(a));
  }
}

template <class X>
struct env_of {
  using type = env<>;
};
template <class X>
  requires requires { typename std::remove_cvref_t<X>::env_type; }  // a named value, or one traced (namedax::grad)
struct env_of<X> {
  using type = typename std::remove_cvref_t<X>::env_type;
};

/// The element type of a named value, an xtensor expression or a scalar.
template <class X>
struct value_type_of {
  using type = X;
};
template <class X>
  requires requires { typename X::value_type; }
struct value_type_of<X> {
  using type = typename X::value_type;
};
template <class X>
using value_type_of_t = typename value_type_of<std::remove_cvref_t<X>>::type;

template <class X>
constexpr axis_mask mask_of() {
  if constexpr (NamedValue<X>) return std::remove_cvref_t<X>::varying;
  else return 0;
}

template <class Acc, class... Xs>
struct merged_env {
  using type = Acc;
};
template <class Acc, class X, class... Xs>
struct merged_env<Acc, X, Xs...> : merged_env<env_merge_t<Acc, typename env_of<X>::type>, Xs...> {};

template <class S>
inline constexpr bool is_fixed_shape = false;
template <std::size_t N>
inline constexpr bool is_fixed_shape<std::array<std::size_t, N>> = true;

/// The positional rank an operand has in its type: 0 for a scalar, N for a fixed-rank
/// `xt::xtensor<T, N>`, and for a named value whose payload's shape is a std::array (a mapped
/// fixed-rank argument, and lazy expressions of such); dynamic_extent when only its value knows.
template <class X>
constexpr std::size_t static_positional_rank() {
  if constexpr (std::is_arithmetic_v<X>) {
    return 0;
  } else if constexpr (PlainValue<X>) {
    return xt::get_rank<X>::value != SIZE_MAX ? xt::get_rank<X>::value : dynamic_extent;
  } else if constexpr (NamedValue<X>) {
    using shape = std::remove_cvref_t<decltype(std::declval<const typename X::payload_type&>().shape())>;
    if constexpr (is_fixed_shape<shape>) return std::tuple_size_v<shape> - X::env_type::vectorized_count;
    else return dynamic_extent;
  } else {
    return dynamic_extent;
  }
}

// Named so that a failing static_assert prints the dim and the rank.
template <int Dim, std::size_t Rank>
inline constexpr bool positional_dim_in_range =
    Rank == dynamic_extent || (Dim >= -static_cast<int>(Rank) && Dim < static_cast<int>(Rank));

/// A dim given as `dim<K>` checked against the rank in X's type (plus `Extra` for operations
/// that insert a dim); an int dim is checked at run time by the operation.
template <class X, std::size_t Extra = 0, class D>
constexpr void check_static_dim(D) {
  if constexpr (is_dim_constant<D>) {
    constexpr std::size_t rank = static_positional_rank<std::remove_cvref_t<X>>();
    constexpr std::size_t positions = rank == dynamic_extent ? rank : rank + Extra;
    static_assert(positional_dim_in_range<D::value, positions>,
                  "namedax: a positional dim is out of range for the rank the value's type gives it; dims count from 0, "
                  "negative dims from the end");
  }
}

/// A collective over `names` on a deferred operand x: `then(x)`, computed now on x's table.
template <class X, class Names, class Then>
auto defer_with(const X& x, Names names, Then then) {
  return compute_deferred(names, then, x);
}

/// An operand's shape, for the message of a failed broadcast; a scalar has none.
template <class X>
void add_operand_shape(std::vector<std::vector<std::size_t>>& shapes, const X& x) {
  if constexpr (!is_xscalar<X>) shapes.emplace_back(x.shape().begin(), x.shape().end());
}

/// Checks that a new elementwise node's operands broadcast, to a shape whose elements can be
/// counted; the message is built by the compiled fail_broadcast, and only on failure.
template <class E>
void check_broadcast_count(const E& e, std::size_t vectorized) {
  std::optional<bool> overflows;  // empty: the operands do not broadcast
  try {
    overflows = element_count_overflows(e.shape());  // computes the broadcast
  } catch (const xt::broadcast_error&) {
  }
  if (overflows == false) return;
  std::vector<std::vector<std::size_t>> operands;
  unpack(e.arguments(), [&](const auto&... operand) { (add_operand_shape(operands, operand), ...); });
  if (!overflows) fail_broadcast(operands, {}, vectorized);
  fail_broadcast(operands, std::vector<std::size_t>(e.shape().begin(), e.shape().end()), vectorized);
}

/// Calls `op` with the operands once each is a named value or a plain one. An operand that
/// waits for its environment (`axis_index`) is resolved in the environment of the named
/// operands; when none is named, the result waits too, for every name the operands await.
/// Every operation on named values resolves such operands here, so each accepts `axis_index` values.
template <class Op, class... Xs>
auto when_resolved(Op op, const Xs&... xs) {
  if constexpr ((DeferredValue<Xs> || ...)) {
    if constexpr ((NamedValue<Xs> || ...)) {
      using Env = typename merged_env<env<>, Xs...>::type;
      return op(resolve_in<Env>(xs)...);
    } else {
      return compute_deferred(type_list<>{}, op, xs...);
    }
  } else {
    return op(xs...);
  }
}

/// Applies an xtensor elementwise function to operands, broadcasting by name: `fn` on the
/// operands' payloads expressed in their merged environment (positional dims, then its
/// vectorized dims, size 1 where an operand does not vary). The result varies along every
/// operand's names. Operands that wait for their environment (`axis_index`) are resolved first.
template <class Fn, class... Xs>
auto elementwise(Fn fn, const Xs&... xs) {
  if constexpr ((DeferredValue<Xs> || ...)) {
    return when_resolved([fn](const auto&... ys) { return elementwise(fn, ys...); }, xs...);
  } else {
    using Env = typename merged_env<env<>, Xs...>::type;
    auto e = fn(payload_in<Env>(xs)...);
    if constexpr (is_xfunction<decltype(e)>) check_broadcast_count(e, Env::vectorized_count);
    return named<decltype(e), Env, (mask_of<Xs>() | ...)>(std::move(e));
  }
}
}  // namespace detail

/// A value that becomes a named value once the axis environment is known: it meets a mapped
/// value, or it is returned from a map. `axis_index` makes one. It holds a table of its
/// elements for every index of the names it awaits (see detail/deferred.hpp), so its type is
/// its element type `T`, the names, and which of them it varies along (bit k: the k-th name).
template <class T, axis_mask Varying, class... Names>
class deferred {
 public:
  explicit deferred(detail::shared_array<T> table) : table_(std::move(table)) {}

  /// This value as a named value of `Env`, which must bind every name it awaits.
  template <class Env>
  auto resolve() const {
    detail::require_bound<axis_index_fn, Env, Names...>();
    return detail::resolve_table<Env, Varying, Names...>(table_);
  }

  /// The positional rank of the value on each index (0 for axis_index itself).
  [[nodiscard]] std::size_t positional_rank() const { return table_.dimension() - sizeof...(Names); }

  /// SPMD control flow on device axes: `if (namedax::axis_index("i"_ax) == 0)` under pmap.
  /// The environment is not in this value's type, so vmap axes are reported at run time.
  explicit operator bool() const {
    (
        [] {
          const auto& f = detail::bound_frame("axis_index", Names::name);
          if (f.place != placement::devices)
            detail::fail("namedax: a condition on axis_index(\"", Names::name,
                         "\") is many values under vmap; use namedax::where, or map the axis with pmap");
        }(),
        ...);
    return static_cast<bool>(resolve<env<binding<Names, placement::devices>...>>().value());
  }

 private:
  detail::shared_array<T> table_;  // positional dims, then one per name (size 1 where it does not vary)
};

namespace detail {
template <class E>
inline constexpr bool owns_its_data = false;
template <class T>
inline constexpr bool owns_its_data<shared_array<T>> = true;
template <class T>
inline constexpr bool owns_its_data<shared_window<T>> = true;

/// An array as the payload type E of a value that owns its data.
template <class E, class T>
E owned_payload(xt::xarray<T>&& a) {
  if constexpr (std::is_same_v<E, shared_window<T>>) return share_window(std::move(a));
  else return share_array(std::move(a));
}

// Named so that a failing static_assert's first line stays short: clang++ prints the condition
// with its arguments, which would otherwise spell out the whole expression type.
template <bool OwnsItsData>
inline constexpr bool variable_owns_its_data = OwnsItsData;
// Named so that a failing static_assert prints both masks (bit k: axis k of the environment).
template <axis_mask Variable, axis_mask Assigned>
inline constexpr bool variable_covers_names = (Assigned & ~Variable) == 0;
template <class Variable, class Assigned>
inline constexpr bool same_element_type = std::is_same_v<Variable, Assigned>;
}  // namespace detail

template <class E, class Env, axis_mask Varying>
template <class R>
void named<E, Env, Varying>::rebind(const R& r) {
  static_assert(detail::variable_owns_its_data<detail::owns_its_data<E>>,
                "namedax: this value's type records the expression that computes it, so it cannot be rebound; hold a "
                "variable that changes in a value that owns its data: `auto acc = namedax::eval(x);`, then `acc = ...` "
                "or `acc += ...`");
  if constexpr (detail::owns_its_data<E>) {
    const auto& y = detail::resolve_in<Env>(r);
    using Y = std::remove_cvref_t<decltype(y)>;
    static_assert(detail::variable_covers_names<Varying, detail::mask_of<Y>()>,
                  "namedax: the value assigned varies along a name the variable does not vary along; make the variable "
                  "vary along it: `auto acc = namedax::eval(namedax::pvary(x, \"i\"_ax));`");
    if constexpr (std::is_arithmetic_v<Y>) {
      auto a = detail::uninitialized_array<value_type>(std::vector<std::size_t>(Env::vectorized_count, 1));
      a.fill(static_cast<value_type>(y));
      payload_ = detail::owned_payload<E>(std::move(a));
    } else {
      static_assert(detail::same_element_type<value_type, detail::value_type_of_t<Y>>,
                    "namedax: the value assigned has another element type than the variable; convert it with "
                    "namedax::cast<T>(...)");
      payload_ = detail::owned_payload<E>(detail::evaluate<value_type>(detail::payload_in<Env>(y)));
    }
  }
}

/// Inserts a positional dimension of size 1 at `axis` (NumPy's expand_dims), so that a
/// vector broadcasts against a matrix along its rows: `expand_dims(r, 1) * X`.
template <NamedOperand X, Dim D>
auto expand_dims(const X& x, D axis) {
  detail::check_static_dim<X, 1>(axis);
  return detail::when_resolved(
      [axis = static_cast<int>(axis)]<class Y>(const Y& y) {
        using value = typename Y::value_type;
        xt::xarray<value> a = detail::evaluate(y.payload());
        const int rank = static_cast<int>(y.dimension());
        const int at = axis < 0 ? axis + rank + 1 : axis;
        if (at < 0 || at > rank)
          detail::fail("namedax::expand_dims: axis ", axis, " is out of range for a value of positional rank ", rank);
        std::vector<std::size_t> shape(a.shape().begin(), a.shape().end());
        shape.insert(shape.begin() + at, 1);
        a.reshape(shape);
        return detail::make_named<detail::shared_array<value>, typename Y::env_type, Y::varying>(
            detail::share_array(std::move(a)));
      },
      x);
}

/// Evaluates a lazy named expression into a named value that owns its data, like `xt::eval`.
/// A value waiting for its environment (`eval(axis_index("i"_ax) * 2)`) is evaluated where it
/// meets one: in the environment of the map that uses or returns it.
template <NamedOperand X>
auto eval(const X& x) {
  return detail::when_resolved(
      []<class Y>(const Y& y) {
        using value = typename Y::value_type;
        using result = named<detail::shared_array<value>, typename Y::env_type, Y::varying>;
        if constexpr (std::is_same_v<Y, result>) {
          return y;  // already owns its data, which no one changes: share it
        } else {
          if constexpr (std::is_same_v<typename Y::payload_type, detail::shared_window<value>>)
            if (const auto& whole = y.payload().storage().whole()) return result(detail::shared_array<value>(whole));
          return result(detail::share_array(detail::evaluate(y.payload())));
        }
      },
      x);
}

}  // namespace namedax
