// SPDX-License-Identifier: MIT
// The value type: an xtensor payload plus, in its type, the axis environment and the set of
// named axes the value varies along. Elementwise arithmetic broadcasts by name.
#pragma once

#include <namedax/detail/kernels.hpp>
#include <namedax/detail/runtime.hpp>
#include <namedax/error.hpp>
#include <namedax/named_shape.hpp>

#include <boost/hana/accessors.hpp>
#include <boost/hana/concept/struct.hpp>
#include <boost/hana/second.hpp>
#include <boost/hana/unpack.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xeval.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xoperation.hpp>
#include <xtensor/xstrided_view.hpp>

#include <array>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace namedax {

template <class E, class Env, axis_mask Varying>
class named;
template <class Fn, class... Names>
struct deferred;
struct axis_index_fn;

namespace detail {
template <class T>
inline constexpr bool is_named = false;
template <class E, class Env, axis_mask V>
inline constexpr bool is_named<named<E, Env, V>> = true;
template <class T>
inline constexpr bool is_deferred = false;
template <class Fn, class... Names>
inline constexpr bool is_deferred<deferred<Fn, Names...>> = true;

// Named so that a failing static_assert prints the environment and the mask.
template <class Env, axis_mask Varying>
inline constexpr bool is_one_value_per_device = (Varying & Env::vectorized_mask) == 0;
}  // namespace detail

/// A value with named axes in its type (what a mapped function receives and returns).
template <class T>
concept NamedValue = detail::is_named<std::remove_cvref_t<T>>;
/// A value waiting for an environment: `axis_index("i"_ax)` before it meets a mapped value.
template <class T>
concept DeferredValue = detail::is_deferred<std::remove_cvref_t<T>>;
/// A positional value: an arithmetic scalar or an xtensor expression; it varies along no name.
template <class T>
concept PlainValue = std::is_arithmetic_v<std::remove_cvref_t<T>> || xt::is_xexpression<std::remove_cvref_t<T>>::value;
/// Anything that mixes into named arithmetic.
template <class T>
concept Operand = NamedValue<T> || DeferredValue<T> || PlainValue<T>;

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

 private:
  E payload_;
};

namespace detail {
template <class E, class Env, axis_mask V>
auto make_named(E payload) {
  return named<E, Env, V>(std::move(payload));
}

/// An owned, shareable container: copies of a named value share it, so lazy expressions
/// built from it stay valid after the named value that made them is gone.
template <class T>
using shared_array = xt::xshared_expression<xt::xarray<T>>;

template <class T, class Expr>
shared_array<T> share_array(Expr&& e) {
  return xt::make_xshared(xt::xarray<T>(std::forward<Expr>(e)));
}

/// Evaluates any payload into a fresh row-major container; strided memory is copied by a
/// plain loop, since xtensor's stepper assignment from a dynamic-layout view is slow.
template <class T = void, class Expr>
auto evaluate(const Expr& e) {
  using value = std::conditional_t<std::is_void_v<T>, typename std::decay_t<Expr>::value_type, T>;
  if constexpr (StridedMemory<Expr>) {
    auto block = block_of(e);
    auto out = xt::xarray<value>::from_shape(block.shape);
    copy_strided(block, out.data());
    return out;
  } else {
    xt::xarray<value> out(e);
    return out;
  }
}

/// Where a payload's elements are: in place when it is strided memory, else in `storage`.
template <class T, class E>
strided_block<T> block_in_memory(const E& e, xt::xarray<T>& storage) {
  if constexpr (StridedMemory<E> && std::is_same_v<typename E::value_type, T>) {
    return block_of(e);
  } else {
    storage = evaluate<T>(e);
    return block_of(storage);
  }
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
      return xt::make_xshared(std::move(a));
    }
  } else {
    auto a = evaluate(x);
    auto s = a.shape();
    std::vector<std::size_t> shape(s.begin(), s.end());
    shape.resize(shape.size() + Env::vectorized_count, 1);
    a.reshape(shape);
    return xt::make_xshared(std::move(a));
  }
}

template <class X>
struct env_of {
  using type = env<>;
};
template <NamedValue X>
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

/// Resolves a deferred operand in `Env`; other operands pass through.
template <class Env, class X>
decltype(auto) resolve_in(const X& x) {
  if constexpr (DeferredValue<X>) return x.template resolve<Env>();
  else return (x);
}

template <class... Lists>
struct type_list_cat;
template <class... Ns>
struct type_list_cat<type_list<Ns...>> {
  using type = type_list<Ns...>;
};
template <class... A, class... B, class... Rest>
struct type_list_cat<type_list<A...>, type_list<B...>, Rest...> : type_list_cat<type_list<A..., B...>, Rest...> {};

/// The axis names a deferred operand waits for; none for other operands.
template <class X>
struct names_awaited {
  using type = type_list<>;
};
template <class Fn, class... Names>
struct names_awaited<deferred<Fn, Names...>> {
  using type = type_list<Names...>;
};
template <class... Xs>
using names_awaited_t = typename type_list_cat<type_list<>, typename names_awaited<std::remove_cvref_t<Xs>>::type...>::type;

template <class Fn, class List>
struct deferred_from;
template <class Fn, class... Names>
struct deferred_from<Fn, type_list<Names...>> {
  using type = deferred<Fn, Names...>;
};

template <class T>
inline constexpr bool is_tuple_like = false;
template <class... T>
inline constexpr bool is_tuple_like<std::tuple<T...>> = true;
template <class T, std::size_t N>
inline constexpr bool is_tuple_like<std::array<T, N>> = true;
template <class A, class B>
inline constexpr bool is_tuple_like<std::pair<A, B>> = true;

template <class T>
inline constexpr bool is_std_array = false;
template <class T, std::size_t N>
inline constexpr bool is_std_array<std::array<T, N>> = true;
template <class T>
inline constexpr bool is_std_pair = false;
template <class A, class B>
inline constexpr bool is_std_pair<std::pair<A, B>> = true;

/// A Boost.Hana struct (BOOST_HANA_DEFINE_STRUCT) is a pytree node too.
template <class X>
concept HanaStruct = boost::hana::Struct<X>::value;

/// A pytree node: its children are leaves or nodes.
template <class X>
inline constexpr bool is_node = is_tuple_like<X> || HanaStruct<X>;

/// The children of a pytree node, as a std::tuple of references.
template <class X>
auto children(const X& x) {
  if constexpr (HanaStruct<X>)
    return boost::hana::unpack(boost::hana::accessors<X>(),
                               [&](auto... member) { return std::tie(boost::hana::second(member)(x)...); });
  else
    return std::apply([](const auto&... child) { return std::tie(child...); }, x);
}

template <class X, class U>
struct rebind_struct {
  static_assert(always_false<X>,
                "namedax: a Boost.Hana struct whose members change type must be a template of one type, such as "
                "template <class T> struct params { BOOST_HANA_DEFINE_STRUCT(params, (T, w), (T, b)); }");
};
template <template <class> class S, class T, class U>
struct rebind_struct<S<T>, U> {
  using type = S<U>;
};

/// A node shaped as `X` (std::array, std::pair, std::tuple or Hana struct) of `parts`.
template <class X, class... Parts>
auto make_like(Parts&&... parts) {
  if constexpr (is_std_array<X>) {
    return std::array{std::forward<Parts>(parts)...};
  } else if constexpr (is_std_pair<X>) {
    return std::pair{std::forward<Parts>(parts)...};
  } else if constexpr (HanaStruct<X>) {
    if constexpr (requires { X{std::forward<Parts>(parts)...}; }) return X{std::forward<Parts>(parts)...};
    else return typename rebind_struct<X, std::common_type_t<std::remove_cvref_t<Parts>...>>::type{std::forward<Parts>(parts)...};
  } else {
    return std::tuple{std::forward<Parts>(parts)...};
  }
}

/// Maps a leaf function over a pytree: a single value, or a std::tuple, std::pair,
/// std::array or Boost.Hana struct of pytrees; the result has the same structure.
template <class X, class Leaf>
auto tree_map(const X& x, Leaf&& leaf) {
  if constexpr (is_node<X>) {
    return std::apply([&](const auto&... xs) { return make_like<X>(tree_map(xs, leaf)...); }, children(x));
  } else {
    return leaf(x);
  }
}

/// Applies an xtensor elementwise function to operands, broadcasting by name.
template <class Fn, class... Xs>
auto elementwise(Fn fn, const Xs&... xs) {
  if constexpr ((DeferredValue<Xs> || ...)) {
    if constexpr ((NamedValue<Xs> || ...)) {
      using Env = typename merged_env<env<>, Xs...>::type;
      return elementwise(fn, resolve_in<Env>(xs)...);
    } else {
      auto later = [fn, xs...]<class Env>(Env) { return elementwise(fn, resolve_in<Env>(xs)...); };
      using names = names_awaited_t<Xs...>;
      return typename deferred_from<decltype(later), names>::type{later};
    }
  } else {
    using Env = typename merged_env<env<>, Xs...>::type;
    constexpr axis_mask varying = (mask_of<Xs>() | ...);
    auto e = fn(payload_in<Env>(xs)...);
    return make_named<decltype(e), Env, varying>(std::move(e));
  }
}
}  // namespace detail

/// A value that becomes a named value once the axis environment is known: it meets a mapped
/// value, or it is returned from a map. `axis_index` makes one.
template <class Fn, class... Names>
struct deferred {
  Fn fn;

  template <class Env>
  auto resolve() const {
    detail::require_bound<axis_index_fn, Env, Names...>();
    return fn(Env{});
  }

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
    return static_cast<bool>(fn(env<binding<Names, placement::devices>...>{}).value());
  }
};

/// A named value or one waiting for its environment: what makes an expression namedax's.
template <class T>
concept NamedOperand = NamedValue<T> || DeferredValue<T>;

// Elementwise operators. Forwarding parameters, like xtensor's own operators, so that for
// (xtensor array, named value) both are equally good matches and these, being constrained,
// are chosen.
#define NAMEDAX_BINARY_OPERATOR(op, xfn)                                                            \
  template <class L, class R>                                                                      \
    requires(Operand<L> && Operand<R> && (NamedOperand<L> || NamedOperand<R>))                     \
  auto op(L&& l, R&& r) {                                                                          \
    return detail::elementwise([](auto&& a, auto&& b) { return xfn; }, l, r);                      \
  }

#define NAMEDAX_FWD(x) std::forward<decltype(x)>(x)
NAMEDAX_BINARY_OPERATOR(operator+, NAMEDAX_FWD(a) + NAMEDAX_FWD(b))
NAMEDAX_BINARY_OPERATOR(operator-, NAMEDAX_FWD(a) - NAMEDAX_FWD(b))
NAMEDAX_BINARY_OPERATOR(operator*, NAMEDAX_FWD(a) * NAMEDAX_FWD(b))
NAMEDAX_BINARY_OPERATOR(operator/, NAMEDAX_FWD(a) / NAMEDAX_FWD(b))
NAMEDAX_BINARY_OPERATOR(operator%, NAMEDAX_FWD(a) % NAMEDAX_FWD(b))
NAMEDAX_BINARY_OPERATOR(operator<, NAMEDAX_FWD(a) < NAMEDAX_FWD(b))
NAMEDAX_BINARY_OPERATOR(operator<=, NAMEDAX_FWD(a) <= NAMEDAX_FWD(b))
NAMEDAX_BINARY_OPERATOR(operator>, NAMEDAX_FWD(a) > NAMEDAX_FWD(b))
NAMEDAX_BINARY_OPERATOR(operator>=, NAMEDAX_FWD(a) >= NAMEDAX_FWD(b))
NAMEDAX_BINARY_OPERATOR(operator==, xt::equal(NAMEDAX_FWD(a), NAMEDAX_FWD(b)))
NAMEDAX_BINARY_OPERATOR(operator!=, xt::not_equal(NAMEDAX_FWD(a), NAMEDAX_FWD(b)))
NAMEDAX_BINARY_OPERATOR(operator&&, NAMEDAX_FWD(a) && NAMEDAX_FWD(b))
NAMEDAX_BINARY_OPERATOR(operator||, NAMEDAX_FWD(a) || NAMEDAX_FWD(b))
NAMEDAX_BINARY_OPERATOR(maximum, xt::maximum(NAMEDAX_FWD(a), NAMEDAX_FWD(b)))
NAMEDAX_BINARY_OPERATOR(minimum, xt::minimum(NAMEDAX_FWD(a), NAMEDAX_FWD(b)))
NAMEDAX_BINARY_OPERATOR(pow, xt::pow(NAMEDAX_FWD(a), NAMEDAX_FWD(b)))
#undef NAMEDAX_BINARY_OPERATOR

#define NAMEDAX_UNARY_FUNCTION(name, xfn)                                                    \
  template <NamedOperand X>                                                                  \
  auto name(X&& x) {                                                                         \
    return detail::elementwise([](auto&& a) { return xfn; }, x);                             \
  }

NAMEDAX_UNARY_FUNCTION(operator-, -NAMEDAX_FWD(a))
NAMEDAX_UNARY_FUNCTION(operator!, !NAMEDAX_FWD(a))
NAMEDAX_UNARY_FUNCTION(exp, xt::exp(NAMEDAX_FWD(a)))
NAMEDAX_UNARY_FUNCTION(log, xt::log(NAMEDAX_FWD(a)))
NAMEDAX_UNARY_FUNCTION(sqrt, xt::sqrt(NAMEDAX_FWD(a)))
NAMEDAX_UNARY_FUNCTION(abs, xt::abs(NAMEDAX_FWD(a)))
NAMEDAX_UNARY_FUNCTION(tanh, xt::tanh(NAMEDAX_FWD(a)))
NAMEDAX_UNARY_FUNCTION(square, xt::square(NAMEDAX_FWD(a)))
#undef NAMEDAX_UNARY_FUNCTION

/// `where(condition, a, b)`: elementwise choice, broadcasting by name.
template <Operand C, Operand A, Operand B>
  requires(NamedOperand<C> || NamedOperand<A> || NamedOperand<B>)
auto where(const C& c, const A& a, const B& b) {
  return detail::elementwise([](auto&& p, auto&& q, auto&& r) { return xt::where(NAMEDAX_FWD(p), NAMEDAX_FWD(q), NAMEDAX_FWD(r)); },
                             c, a, b);
}

/// `cast<float>(x)`: converts the element type.
template <class T, NamedOperand X>
auto cast(const X& x) {
  return detail::elementwise([](auto&& a) { return xt::cast<T>(NAMEDAX_FWD(a)); }, x);
}
#undef NAMEDAX_FWD

/// Inserts a positional dimension of size 1 at `axis` (NumPy's expand_dims), so that a
/// vector broadcasts against a matrix along its rows: `expand_dims(r, 1) * X`.
template <NamedValue X>
auto expand_dims(const X& x, int axis) {
  using value = typename X::value_type;
  xt::xarray<value> a = detail::evaluate(x.payload());
  const int rank = static_cast<int>(x.dimension());
  const int at = axis < 0 ? axis + rank + 1 : axis;
  if (at < 0 || at > rank)
    detail::fail("namedax::expand_dims: axis ", axis, " is out of range for a value of positional rank ", rank);
  std::vector<std::size_t> shape(a.shape().begin(), a.shape().end());
  shape.insert(shape.begin() + at, 1);
  a.reshape(shape);
  return detail::make_named<detail::shared_array<value>, typename X::env_type, X::varying>(xt::make_xshared(std::move(a)));
}

/// Evaluates a lazy named expression into a named value that owns its data, like `xt::eval`.
template <NamedValue X>
auto eval(const X& x) {
  using value = typename X::value_type;
  return detail::make_named<detail::shared_array<value>, typename X::env_type, X::varying>(
      detail::share_array<value>(x.payload()));
}

}  // namespace namedax
