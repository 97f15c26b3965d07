// SPDX-License-Identifier: MIT
// Reverse-mode derivatives of functions of named values: namedax::grad, value_and_grad (with
// the options argnums and has_aux), vjp, jvp, linearize, jacrev, jacfwd and checkpoint, as JAX's.
// See docs/adjoints.md.
//
//   auto loss = [](const auto& w, const auto& x, const auto& y) {
//     auto r = namedax::pdot(x, w, namedax::axes(), {{1}, {0}}) - y;
//     return namedax::pmean(namedax::mean(r * r), "batch"_ax);
//   };
//   auto dw = namedax::grad(loss)(w, x, y);  // inside vmap<"batch"> or pmap<"batch">
//
// The function is called once, with each differentiated argument (a named value, array or
// scalar of floating type, or a pytree of them) as a namedax::traced value; every namedax
// operation on a traced value computes its result as usual and records, with it, how to send
// a cotangent back (its pullback). The pullbacks then run newest first. A collective's
// pullback is its transpose (namedax::linear), so it communicates as the collective did: each
// device runs the same pullbacks in the same order. Memory: every intermediate result is kept
// until the gradient is read, as in JAX's reverse mode.
//
// Cotangents pair with values as docs/adjoints.md says: a result that varies along a name is
// differentiated as the sum of its values along it, so `grad` of a per-device loss is the
// gradient of the total loss, and the gradient of a parameter that does not vary along a name
// (replicated) is summed over it, by construction (JAX's check_vma rules).
#pragma once

#include <namedax/detail/autodiff.hpp>

namespace namedax {

/// Operands of an operation on traced values: each a traced value or an operand of named
/// arithmetic, and one at least traced.
template <class... Xs>
concept TracedOperands = ((Traced<Xs> || Operand<Xs>) && ...) && (Traced<Xs> || ...);

/// `namedax::argnums<I...>`, an option of grad and value_and_grad (jax.grad's argnums): the
/// positions of the arguments to differentiate, the others held constant. One position gives
/// that argument's gradient; two or more give a std::tuple of gradients in their order.
template <std::size_t... I>
struct argnums_t {
  static_assert(sizeof...(I) > 0, "namedax::argnums: name at least one argument position");
};
template <std::size_t... I>
inline constexpr argnums_t<I...> argnums{};

/// `namedax::has_aux`, an option of grad and value_and_grad (jax.grad's has_aux=True): the
/// function returns a pair `(value, aux)`; only the value is differentiated, and aux (its
/// traced leaves as plain values) is returned beside the gradient.
struct has_aux_t {
  explicit constexpr has_aux_t() = default;
};
inline constexpr has_aux_t has_aux{};

/// An option of grad and value_and_grad.
template <class O>
concept GradOption = std::same_as<O, has_aux_t> || detail::ad::is_argnums<O>;

/// `grad(f)(x, rest...)`: the gradient of the scalar `f(x, rest...)` in x (a pytree: the
/// result has x's structure and types), the other arguments held constant (jax.grad with
/// argnums=0). f's result must have positional shape []; where it varies along names, the
/// gradient is that of its sum over them. Integer and bool leaves get zeros. First order only:
/// `grad(grad(f))` (any traced argument) stops at a static_assert that says so, and a function
/// that captures a traced value of an enclosing grad throws namedax::error.
///
/// Options, after f in any order, as jax.grad's keywords:
///   grad(f, namedax::argnums<0, 2>)(a, b, c)   // std::tuple{d/da, d/dc}
///   grad(f, namedax::has_aux)(x)                // f returns (loss, aux): std::pair{d/dx, aux}
template <class F, GradOption... Options>
auto grad(F f, Options...) {
  return typename detail::ad::gradient_with<F, false, false, argnums_t<0>, Options...>::type{std::move(f)};
}

/// `value_and_grad(f)(x, rest...)`: `std::pair{f(x, rest...), grad(f)(x, rest...)}`,
/// computing f once. With namedax::has_aux, `std::pair{std::pair{value, aux}, gradient}`
/// (jax.value_and_grad's `((value, aux), grads)`); namedax::argnums as for grad.
template <class F, GradOption... Options>
auto value_and_grad(F f, Options...) {
  return typename detail::ad::gradient_with<F, true, false, argnums_t<0>, Options...>::type{std::move(f)};
}

/// `checkpoint(f)` (jax.checkpoint, also known as remat): computes what f computes, but
/// under grad or vjp keeps only f's arguments and result, not the values in between: the
/// backward pass runs f's forward again to get them. Trades compute for memory in a deep
/// program (a transformer's blocks). The differentiated arguments are traced values
/// themselves (not pytrees holding some), f returns one named value or a pytree of named
/// values of one type (element type and names), and f must not capture a traced value (pass
/// it as an argument). Each recomputation runs f's collectives again, on every device in the
/// same order.
template <class F>
auto checkpoint(F f) {
  return detail::ad::checkpointed<F>{{std::move(f)}};
}

/// `custom_vjp(f, fwd, bwd)` (jax.custom_vjp, then defvjp(fwd, bwd)): computes what f
/// computes, with a pullback of the user's under grad, value_and_grad and vjp, in any map.
/// `fwd(xs...)` returns `std::pair{f(xs...), residuals}` (residuals: anything bwd needs);
/// `bwd(residuals, ct)` returns one cotangent per argument, a std::tuple (for one argument,
/// the cotangent alone will do), each a named value, an array or a scalar of the argument's
/// positional shape (another is a namedax::error). Constants' cotangents are ignored. Outside
/// any derivative f alone runs. Arguments and result as for checkpoint.
///   auto clipped = namedax::custom_vjp(
///       [](auto x) { return x; },
///       [](auto x) { return std::pair{x, 0}; },
///       [](int, auto ct) { return namedax::clip(ct, -1., 1.); });  // clips the gradient
template <class F, class Fwd, class Bwd>
auto custom_vjp(F f, Fwd fwd, Bwd bwd) {
  return detail::ad::custom_vjp_function<F, Fwd, Bwd>{{std::move(f)}, std::move(fwd), std::move(bwd)};
}

/// `custom_jvp(f, jvp)` (jax.custom_jvp, then defjvp(jvp)): computes what f computes, with a
/// derivative of the user's: `jvp(std::tuple{primals...}, std::tuple{tangents...})` returns
/// `std::pair{f(primals...), tangent}`, the tangent linear in the tangents. Under grad,
/// value_and_grad and vjp the pullback is the transpose of that linear map, found by reverse
/// mode through the namedax operations it is written in (jax transposes it likewise), so it
/// must be written in differentiable operations of the tangents. The pullback calls jvp
/// again at the primals. Arguments and result as for checkpoint.
///   auto softplus = namedax::custom_jvp(
///       [](auto x) { return namedax::log1p(namedax::exp(x)); },
///       [](auto p, auto t) {
///         auto [x] = p;
///         return std::pair{namedax::log1p(namedax::exp(x)), namedax::sigmoid(x) * std::get<0>(t)};
///       });
template <class F, class Jvp>
auto custom_jvp(F f, Jvp jvp) {
  return detail::ad::custom_jvp_function<F, Jvp>{{std::move(f)}, std::move(jvp)};
}

/// `jvp(f, std::tuple{primals...}, std::tuple{tangents...})`: `std::pair{f(primals...), J t}`,
/// the derivative of f at the primals in the direction of the tangents (jax.jvp), each tangent
/// of its primal's structure and shape, f returning one value (named, array or scalar).
/// Computed by reverse mode: one pullback per element of f's result (inside a map, per element
/// and per index of the axes the result varies along, a tangent reaching the other indices
/// through f's collectives), so its cost grows with the result's size; a forward mode with
/// rules of its own is to come.
template <class F, class... Ps, class... Ts>
auto jvp(F f, const std::tuple<Ps...>& primals, const std::tuple<Ts...>& tangents) {
  static_assert(sizeof...(Ps) == sizeof...(Ts), "namedax::jvp: give one tangent per primal");
  return detail::ad::jvp_by_pullbacks(f, primals, tangents);
}

/// `linearize(f, primals...)`: `std::pair{f(primals...), f_jvp}` where `f_jvp(tangents...)`
/// is J t at the primals, as jvp's second result (jax.linearize): f runs once, and f_jvp may
/// be called for any number of tangents, inside maps too; computed as jvp is.
template <class F, class... Ps>
auto linearize(F f, const Ps&... primals) {
  return detail::ad::linearize_by_pullbacks(f, primals...);
}

/// `jacrev(f)(x, rest...)`: the Jacobian of f in x (jax.jacrev with argnums=0), an array of
/// f's result dims followed by x's dims: `jacrev(f)(x)(i, j)` is d f(x)_i / d x_j. x one
/// value, f returning one value; one pullback per element of f's result. Inside a map, each
/// index's Jacobian as a named value of x's environment, the rows seeded on every index at
/// once (jax.vmap(jax.jacrev(f)): per-example Jacobians under vmap).
///   jacrev([](auto x) { return namedax::square(x); })(xt::xarray<double>{1., 2.})  // {{2., 0.}, {0., 4.}}
template <class F>
auto jacrev(F f) {
  return detail::ad::jacobian<F, true>{std::move(f)};
}

/// `jacfwd(f)(x, rest...)`: the Jacobian as jax.jacfwd gives it, computed by reverse mode
/// (jvp's pullbacks) until namedax has a forward mode with rules of its own: outside maps,
/// jacrev's array; inside a map, columns of jvps with the unit tangents on every index at once
/// (jax.vmap(jax.jacfwd(f))), which differ from jacrev's rows where collectives couple the
/// indices.
template <class F>
auto jacfwd(F f) {
  return detail::ad::jacobian<F, false>{std::move(f)};
}

/// The value without its record: no derivative flows through it (jax.lax.stop_gradient).
template <class X>
decltype(auto) stop_gradient(const X& x) {
  return detail::ad::primal_of(x);
}

/// A traced value is already evaluated.
template <Traced X>
const X& eval(const X& x) {
  return x;
}

}  // namespace namedax

// `derivative` is written in terms of the cotangent `ct`, the result `y` and the operand
// primals `a` (and `b`); `T` is the cotangent's element type.
#define NAMEDAX_TRACED_UNARY(name, derivative)                                                              \
  template <Traced X>                                                                                       \
  auto name(const X& x) {                                                                                   \
    return ::namedax::detail::ad::elementwise(                                                              \
        [](const auto& a) { return ::namedax::name(a); },                                                   \
        []<class C>(const C& ct, auto, [[maybe_unused]] const auto& y, [[maybe_unused]] const auto& a) {    \
          using T [[maybe_unused]] = typename C::value_type;                                                \
          return derivative;                                                                                \
        },                                                                                                  \
        x);                                                                                                 \
  }
#define NAMEDAX_TRACED_BINARY(name, derivative_a, derivative_b)                                             \
  template <class L, class R>                                                                               \
    requires TracedOperands<L, R>                                                                           \
  auto name(L&& l, R&& r) { /* forwarding, as xtensor's operators: see detail/elementwise.hpp */         \
    return ::namedax::detail::ad::elementwise(                                                              \
        [](const auto& a, const auto& b) { return ::namedax::name(a, b); },                                 \
        []<class C>(const C& ct, auto k, [[maybe_unused]] const auto& y, [[maybe_unused]] const auto& a,     \
                    [[maybe_unused]] const auto& b) {                                                       \
          using T [[maybe_unused]] = typename C::value_type;                                                \
          if constexpr (decltype(k)::value == 0) return derivative_a;                                       \
          else return derivative_b;                                                                         \
        },                                                                                                  \
        l, r);                                                                                              \
  }
// A comparison is not differentiated: it compares the primals.
#define NAMEDAX_TRACED_COMPARISON(name)                                                                     \
  template <class L, class R>                                                                               \
    requires TracedOperands<L, R>                                                                           \
  auto name(L&& l, R&& r) {                                                                                 \
    return ::namedax::name(::namedax::detail::ad::primal_of(l), ::namedax::detail::ad::primal_of(r));       \
  }

namespace namedax {

// Arithmetic.
NAMEDAX_TRACED_BINARY(operator+, ct, ct)
NAMEDAX_TRACED_BINARY(operator-, ct, -ct)
NAMEDAX_TRACED_BINARY(operator*, ct * b, ct * a)
NAMEDAX_TRACED_BINARY(operator/, ct / b, -(ct * y) / b)
NAMEDAX_TRACED_UNARY(operator-, -ct)
NAMEDAX_TRACED_UNARY(operator+, ct)

// Comparisons, on the primals.
NAMEDAX_TRACED_COMPARISON(operator<)
NAMEDAX_TRACED_COMPARISON(operator<=)
NAMEDAX_TRACED_COMPARISON(operator>)
NAMEDAX_TRACED_COMPARISON(operator>=)
NAMEDAX_TRACED_COMPARISON(operator==)
NAMEDAX_TRACED_COMPARISON(operator!=)
NAMEDAX_TRACED_COMPARISON(equal)
NAMEDAX_TRACED_COMPARISON(not_equal)
NAMEDAX_TRACED_COMPARISON(less)
NAMEDAX_TRACED_COMPARISON(less_equal)
NAMEDAX_TRACED_COMPARISON(greater)
NAMEDAX_TRACED_COMPARISON(greater_equal)
// Logical operators and isclose, bool results: on the primals too.
NAMEDAX_TRACED_COMPARISON(operator&&)
NAMEDAX_TRACED_COMPARISON(operator||)
template <Traced X>
auto operator!(const X& x) {
  return !x.primal();
}
template <class L, class R>
  requires TracedOperands<L, R>
auto isclose(const L& l, const R& r, double rtol = 1e-05, double atol = 1e-08, bool equal_nan = false) {
  return namedax::isclose(detail::ad::primal_of(l), detail::ad::primal_of(r), rtol, atol, equal_nan);
}

/// `apply(f, xs...)` has no derivative: f is any scalar callable. Give it one with custom_vjp
/// or custom_jvp, or apply f to stop_gradient(x) where a constant is meant.
template <class F, class... Xs>
  requires(sizeof...(Xs) > 0 && (Traced<Xs> || ...))
auto apply(F, const Xs&... xs) {
  constexpr bool traced = (Traced<Xs> || ...);  // clang++ would print the fold unfolded in the flag
  static_assert(detail::has_derivative_rule<!traced>,
                "namedax::grad: apply has no derivative rule (f is any scalar function); give f a derivative with "
                "namedax::custom_vjp or namedax::custom_jvp, or apply it to namedax::stop_gradient(x)");
  return (xs, ...);  // only the assertion above is reported
}

// Elementwise functions. abs has derivative sign(x) (0 at 0), as JAX.
NAMEDAX_TRACED_UNARY(abs, ct * namedax::sign(a))
NAMEDAX_TRACED_UNARY(fabs, ct * namedax::sign(a))
NAMEDAX_TRACED_UNARY(sign, ct * T(0))
NAMEDAX_TRACED_UNARY(exp, ct * y)
NAMEDAX_TRACED_UNARY(exp2, ct * y * T(std::numbers::ln2))
NAMEDAX_TRACED_UNARY(expm1, ct * (y + T(1)))
NAMEDAX_TRACED_UNARY(log, ct / a)
NAMEDAX_TRACED_UNARY(log2, ct / (a * T(std::numbers::ln2)))
NAMEDAX_TRACED_UNARY(log10, ct / (a * T(std::numbers::ln10)))
NAMEDAX_TRACED_UNARY(log1p, ct / (a + T(1)))
NAMEDAX_TRACED_UNARY(sigmoid, ct * y * (T(1) - y))
NAMEDAX_TRACED_UNARY(sqrt, ct * T(0.5) / y)
NAMEDAX_TRACED_UNARY(cbrt, ct / (T(3) * y * y))
NAMEDAX_TRACED_UNARY(square, ct * T(2) * a)
NAMEDAX_TRACED_UNARY(cube, ct * T(3) * a * a)
NAMEDAX_TRACED_UNARY(sin, ct * namedax::cos(a))
NAMEDAX_TRACED_UNARY(cos, -ct * namedax::sin(a))
NAMEDAX_TRACED_UNARY(tan, ct * (T(1) + y * y))
NAMEDAX_TRACED_UNARY(asin, ct / namedax::sqrt(T(1) - a * a))
NAMEDAX_TRACED_UNARY(acos, -ct / namedax::sqrt(T(1) - a * a))
NAMEDAX_TRACED_UNARY(atan, ct / (T(1) + a * a))
NAMEDAX_TRACED_UNARY(sinh, ct * namedax::cosh(a))
NAMEDAX_TRACED_UNARY(cosh, ct * namedax::sinh(a))
NAMEDAX_TRACED_UNARY(tanh, ct * (T(1) - y * y))
NAMEDAX_TRACED_UNARY(asinh, ct / namedax::sqrt(a * a + T(1)))
NAMEDAX_TRACED_UNARY(acosh, ct / namedax::sqrt(a * a - T(1)))
NAMEDAX_TRACED_UNARY(atanh, ct / (T(1) - a * a))
NAMEDAX_TRACED_UNARY(erf, ct * T(std::numbers::inv_sqrtpi * 2) * namedax::exp(-a * a))
NAMEDAX_TRACED_UNARY(erfc, -ct * T(std::numbers::inv_sqrtpi * 2) * namedax::exp(-a * a))
NAMEDAX_TRACED_UNARY(deg2rad, ct * T(std::numbers::pi / 180))
NAMEDAX_TRACED_UNARY(radians, ct * T(std::numbers::pi / 180))
NAMEDAX_TRACED_UNARY(rad2deg, ct * T(180 / std::numbers::pi))
NAMEDAX_TRACED_UNARY(degrees, ct * T(180 / std::numbers::pi))
/// pow(a, b): b a^(b-1) in a; y log(a) in b, 0 where a is 0 (as JAX).
NAMEDAX_TRACED_BINARY(pow, ct * b * namedax::pow(a, b - T(1)),
                      namedax::where(a == T(0), T(0) * ct, ct * y * namedax::log(namedax::where(a == T(0), T(1), a))))
/// maximum and minimum send the cotangent to the operand chosen, half to each on a tie (as JAX).
NAMEDAX_TRACED_BINARY(maximum, ct * (namedax::cast<T>(a > b) + T(0.5) * namedax::cast<T>(a == b)),
                      ct * (namedax::cast<T>(b > a) + T(0.5) * namedax::cast<T>(a == b)))
NAMEDAX_TRACED_BINARY(minimum, ct * (namedax::cast<T>(a < b) + T(0.5) * namedax::cast<T>(a == b)),
                      ct * (namedax::cast<T>(b < a) + T(0.5) * namedax::cast<T>(a == b)))
NAMEDAX_TRACED_BINARY(fmax, ct * (namedax::cast<T>(a > b) + T(0.5) * namedax::cast<T>(a == b)),
                      ct * (namedax::cast<T>(b > a) + T(0.5) * namedax::cast<T>(a == b)))
NAMEDAX_TRACED_BINARY(fmin, ct * (namedax::cast<T>(a < b) + T(0.5) * namedax::cast<T>(a == b)),
                      ct * (namedax::cast<T>(b < a) + T(0.5) * namedax::cast<T>(a == b)))
NAMEDAX_TRACED_BINARY(atan2, ct * b / (a * a + b * b), -ct * a / (a * a + b * b))
/// fmod(a, b) = a - trunc(a / b) b, remainder(a, b) = a - rint(a / b) b (std::remainder: the
/// nearest quotient, ties to even), the quotient's derivative zero; fdim(a, b) = max(a - b, 0).
NAMEDAX_TRACED_BINARY(fmod, ct * T(1), -ct * namedax::trunc(a / b))
NAMEDAX_TRACED_BINARY(remainder, ct * T(1), -ct * namedax::rint(a / b))
/// mod(a, b) = a - floor_divide(a, b) b, the quotient's derivative zero (as JAX); floor_divide
/// is piecewise constant, its derivative zero in both operands.
NAMEDAX_TRACED_BINARY(mod, ct * T(1), -ct * namedax::floor_divide(a, b))
NAMEDAX_TRACED_BINARY(floor_divide, ct * T(0), ct * T(0))
NAMEDAX_TRACED_BINARY(fdim, ct * namedax::cast<T>(a > b), -ct * namedax::cast<T>(a > b))
NAMEDAX_TRACED_BINARY(hypot, ct * a / y, ct * b / y)
/// lgamma: digamma(a); tgamma: y digamma(a) (digamma from detail/digamma.hpp).
NAMEDAX_TRACED_UNARY(lgamma, ct * namedax::apply(::namedax::detail::digamma_fun{}, a))
NAMEDAX_TRACED_UNARY(tgamma, ct * y * namedax::apply(::namedax::detail::digamma_fun{}, a))
/// nan_to_num: ct where a is finite, 0 where it was NaN or infinite (as JAX).
NAMEDAX_TRACED_UNARY(nan_to_num, namedax::where(namedax::isfinite(a), ct, T(0)))

// Local reductions: `sum(x, dims, {.keepdims})` and the others take their dims as the
// reductions of named values do (none, one, a braced list, a DimList).
#define NAMEDAX_TRACED_REDUCTION(verb)                                                                   \
  template <Traced X>                                                                                   \
  auto verb(const X& x, reduction_options o = {}) {                                                     \
    return traced_reduction_##verb(x, std::nullopt, o.keepdims);                                        \
  }                                                                                                     \
  template <Traced X, Dim D>                                                                            \
  auto verb(const X& x, D dim, reduction_options o = {}) {                                              \
    return traced_reduction_##verb(x, std::vector<int>{static_cast<int>(dim)}, o.keepdims);             \
  }                                                                                                     \
  template <Traced X>                                                                                   \
  auto verb(const X& x, std::initializer_list<int> dims, reduction_options o = {}) {                    \
    return traced_reduction_##verb(x, std::vector<int>(dims), o.keepdims);                              \
  }                                                                                                     \
  template <Traced X, DimList D>                                                                        \
  auto verb(const X& x, const D& dims, reduction_options o = {}) {                                      \
    return traced_reduction_##verb(x, std::vector<int>(std::begin(dims), std::end(dims)), o.keepdims);  \
  }
#define NAMEDAX_TRACED_REDUCTION_BODY(verb)                                                              \
  namespace detail::ad {                                                                                \
  template <class X>                                                                                    \
  auto traced_reduction_##verb(const X& x, std::optional<std::vector<int>> dims, bool keepdims) {       \
    return reduce<local_reduction::verb>(x, std::move(dims), keepdims, [](const auto& v, const auto& d) { \
      return d ? namedax::verb(v, *d, {.keepdims = true}) : namedax::verb(v, {.keepdims = true});       \
    });                                                                                                 \
  }                                                                                                     \
  }                                                                                                     \
  using detail::ad::traced_reduction_##verb;                                                            \
  NAMEDAX_TRACED_REDUCTION(verb)

/// `any`, `all`: bool results, constants of the program computed on the primal.
#define NAMEDAX_TRACED_CONSTANT_REDUCTION(verb)                                                          \
  namespace detail::ad {                                                                                \
  template <class X>                                                                                    \
  auto traced_reduction_##verb(const X& x, std::optional<std::vector<int>> dims, bool keepdims) {       \
    return dims ? namedax::verb(x.primal(), *dims, {.keepdims = keepdims})                              \
                : namedax::verb(x.primal(), {.keepdims = keepdims});                                    \
  }                                                                                                     \
  }                                                                                                     \
  using detail::ad::traced_reduction_##verb;                                                            \
  NAMEDAX_TRACED_REDUCTION(verb)
NAMEDAX_TRACED_CONSTANT_REDUCTION(any)
NAMEDAX_TRACED_CONSTANT_REDUCTION(all)
#undef NAMEDAX_TRACED_CONSTANT_REDUCTION

/// `sum`, `mean`: the cotangent spread over the reduced dims (divided by their count for mean).
NAMEDAX_TRACED_REDUCTION_BODY(sum)
NAMEDAX_TRACED_REDUCTION_BODY(mean)
/// `max`, `min`: the cotangent to the elements holding the extreme, shared equally among ties.
NAMEDAX_TRACED_REDUCTION_BODY(max)
NAMEDAX_TRACED_REDUCTION_BODY(min)
/// `logsumexp`: the cotangent times softmax.
NAMEDAX_TRACED_REDUCTION_BODY(logsumexp)
/// `prod`: the cotangent times the product of the other elements over the reduced dims, by
/// exclusive prefix and suffix products (no division: a zero gives the right answer, as JAX).
NAMEDAX_TRACED_REDUCTION_BODY(prod)

/// `softmax(x, dim)`: y (ct - sum(ct y)) along dim.
template <Traced X, Dim D = int>
auto softmax(const X& x, D dim = -1) {
  return detail::ad::elementwise(
      [dim](const auto& a) { return namedax::softmax(a, dim); },
      [dim](const auto& ct, auto, const auto& y, const auto&) {
        return namedax::eval(y * (ct - namedax::sum(ct * y, static_cast<int>(dim), {.keepdims = true})));
      },
      x);
}
/// `log_softmax(x, dim)`: ct - exp(y) sum(ct) along dim.
template <Traced X, Dim D = int>
auto log_softmax(const X& x, D dim = -1) {
  return detail::ad::elementwise(
      [dim](const auto& a) { return namedax::log_softmax(a, dim); },
      [dim](const auto& ct, auto, const auto& y, const auto&) {
        return namedax::eval(ct - namedax::exp(y) * namedax::sum(ct, static_cast<int>(dim), {.keepdims = true}));
      },
      x);
}

/// `expand_dims(x, axis)`: its pullback drops the dim again (structural ops, namedax/structure.hpp,
/// add the cotangent back where each element came from).
template <Traced X, Dim D>
auto expand_dims(const X& x, D axis) {
  return detail::derivative<detail::rule::structural, void>::apply([axis](const auto& v) { return namedax::expand_dims(v, axis); }, x);
}

/// `cumsum(x, dim)`: linear; its pullback is the running sum from the other end.
template <Traced X, Dim D>
auto cumsum(const X& x, D dim) {
  const int d = static_cast<int>(dim);
  return detail::ad::elementwise([d](const auto& a) { return namedax::cumsum(a, d); },
                                 [d](const auto& ct, auto, const auto&, const auto&) {
                                   return namedax::flip(namedax::cumsum(namedax::flip(ct, d), d), d);
                                 },
                                 x);
}
/// `cumsum(x)`: over the flattened positional dims.
template <Traced X>
auto cumsum(const X& x) {
  const auto shape = x.shape();
  const int size = static_cast<int>(std::accumulate(shape.begin(), shape.end(), std::size_t{1}, std::multiplies<>()));
  return namedax::cumsum(namedax::reshape(x, {size}), 0);
}

/// `cumprod(x, dim)`: with E_i the exclusive running product of x along dim and
/// S_i = ct_i + x_{i+1} S_{i+1} from the other end, the cotangent to x_i is E_i S_i (no
/// division: zeros give the right answer).
template <Traced X, Dim D>
auto cumprod(const X& x, D dim) {
  const int d = static_cast<int>(dim);
  return detail::ad::elementwise([d](const auto& a) { return namedax::cumprod(a, d); },
                                 [d](const auto& ct, auto, const auto&, const auto& a) {
                                   return detail::ad::cumprod_pullback(ct, a, d);
                                 },
                                 x);
}
/// `cumprod(x)`: over the flattened positional dims.
template <Traced X>
auto cumprod(const X& x) {
  const auto shape = x.shape();
  const int size = static_cast<int>(std::accumulate(shape.begin(), shape.end(), std::size_t{1}, std::multiplies<>()));
  return namedax::cumprod(namedax::reshape(x, {size}), 0);
}

/// `sort(x, dim)`: the elements in their sorted places, a gather by argsort; ties keep their
/// order (stable), so each cotangent goes to the element placed there.
template <Traced X, Dim D = int>
auto sort(const X& x, D dim = -1) {
  return namedax::take_along_axis(x, namedax::argsort(x.primal(), static_cast<int>(dim)), static_cast<int>(dim));
}
/// `top_k(x, k)`: {values, indices}; the values are a gather by the indices, which are constants.
template <Traced X>
auto top_k(const X& x, long long k) {
  auto indices = namedax::top_k(x.primal(), k).second;
  return std::pair{namedax::take_along_axis(x, indices, -1), indices};
}

// Indices, predicates and rounding of traced values are constants of the program (JAX gives
// rounding a zero derivative); they are computed on the primal.
#define NAMEDAX_TRACED_CONSTANT(verb)                                                                      \
  template <Traced X, class... Args>                                                                        \
  auto verb(const X& x, const Args&... args) {                                                              \
    return namedax::verb(x.primal(), args...);                                                              \
  }
NAMEDAX_TRACED_CONSTANT(argsort)
NAMEDAX_TRACED_CONSTANT(argmax)
NAMEDAX_TRACED_CONSTANT(argmin)
NAMEDAX_TRACED_CONSTANT(isnan)
NAMEDAX_TRACED_CONSTANT(isinf)
NAMEDAX_TRACED_CONSTANT(isfinite)
NAMEDAX_TRACED_CONSTANT(signbit)
#undef NAMEDAX_TRACED_CONSTANT
NAMEDAX_TRACED_UNARY(ceil, ct * T(0))
NAMEDAX_TRACED_UNARY(floor, ct * T(0))
NAMEDAX_TRACED_UNARY(trunc, ct * T(0))
NAMEDAX_TRACED_UNARY(round, ct * T(0))
NAMEDAX_TRACED_UNARY(nearbyint, ct * T(0))
NAMEDAX_TRACED_UNARY(rint, ct * T(0))

/// `clip(x, lo, hi)`: the cotangent to x strictly inside the bounds, else to the bound that
/// clipped it (as JAX's clamp); to hi wherever lo > hi, where the value is hi.
template <class X, class L, class H>
  requires TracedOperands<X, L, H>
auto clip(X&& x, L&& lo, H&& hi) {
  return detail::ad::elementwise(
      [](const auto& a, const auto& l, const auto& h) { return namedax::clip(a, l, h); },
      []<class C>(const C& ct, auto k, const auto&, const auto& a, const auto& l, const auto& h) {
        using T = typename C::value_type;
        if constexpr (decltype(k)::value == 0) return ct * namedax::cast<T>((a > l) && (a < h));
        else if constexpr (decltype(k)::value == 1) return ct * namedax::cast<T>((a <= l) && (l <= h));
        else return ct * namedax::cast<T>(((a >= h) && (a > l)) || ((a <= l) && (l > h)));
      },
      x, lo, hi);
}
/// `fma(a, b, c)`: a b + c.
template <class A, class B, class C>
  requires TracedOperands<A, B, C>
auto fma(A&& a, B&& b, C&& c) {
  return detail::ad::elementwise(
      [](const auto& u, const auto& v, const auto& w) { return namedax::fma(u, v, w); },
      [](const auto& ct, auto k, const auto&, const auto& u, const auto& v, const auto&) {
        if constexpr (decltype(k)::value == 0) return namedax::eval(ct * v);
        else if constexpr (decltype(k)::value == 1) return namedax::eval(ct * u);
        else return namedax::eval(ct);
      },
      a, b, c);
}

/// `pow<N>(x)`: N x^(N-1).
template <std::size_t N, Traced X>
auto pow(const X& x) {
  return detail::ad::elementwise([](const auto& a) { return namedax::pow<N>(a); },
                                 []<class C>(const C& ct, auto, const auto&, const auto& a) {
                                   using T = typename C::value_type;
                                   if constexpr (N == 1) return namedax::eval(ct * T(1));
                                   else return namedax::eval(ct * T(N) * namedax::pow<(N > 1 ? N - 1 : 1)>(a));
                                 },
                                 x);
}

/// `where(condition, a, b)`: the cotangent goes to the operand chosen; the condition is not
/// differentiated.
template <class Cnd, class A, class B>
  requires(Operand<Cnd> && TracedOperands<A, B>)
auto where(Cnd&& condition, A&& a, B&& b) {
  return detail::ad::elementwise(
      [condition](const auto& u, const auto& v) { return namedax::where(condition, u, v); },
      [condition]<class C>(const C& ct, auto k, const auto&, const auto&, const auto&) {
        using T = typename C::value_type;
        if constexpr (decltype(k)::value == 0) return namedax::where(condition, ct, T(0));
        else return namedax::where(condition, T(0), ct);
      },
      a, b);
}

/// `cast<T>(x)`: to a floating type the cotangent is cast back; to an integer or bool type the
/// result is a constant of the program.
template <class T, Traced X>
auto cast(const X& x) {
  if constexpr (detail::ad::differentiable_element<T>)
    return detail::ad::elementwise([](const auto& a) { return namedax::cast<T>(a); },
                                   [](const auto& ct, auto, const auto&, const auto&) { return ct; }, x);
  else
    return namedax::eval(namedax::cast<T>(x.primal()));
}

}  // namespace namedax

#undef NAMEDAX_TRACED_UNARY
#undef NAMEDAX_TRACED_BINARY
#undef NAMEDAX_TRACED_COMPARISON
#undef NAMEDAX_TRACED_REDUCTION
#undef NAMEDAX_TRACED_REDUCTION_BODY
