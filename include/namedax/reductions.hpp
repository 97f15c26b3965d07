// SPDX-License-Identifier: MIT
// Local reductions and scans over positional dims, as jax.numpy's: sum, prod, mean, max, min,
// argmax, argmin, any, all, logsumexp, cumsum, cumprod, sort, argsort, top_k, softmax and
// log_softmax. Each works on the positional dims of one named value and is batched over the
// vmap axes by construction (their dims trail the payload and are never reduced): the result
// has the operand's environment and varies along the same names.
#pragma once

#include <namedax/detail/local_reductions.hpp>
#include <namedax/named_array.hpp>

#include <concepts>
#include <initializer_list>
#include <iterator>
#include <ranges>
#include <vector>

namespace namedax {

/// Options of the reductions (jax.numpy's keyword arguments).
struct reduction_options {
  /// Keep each reduced dim with size 1, so that the result broadcasts against the operand.
  bool keepdims = false;
};

/// A list of dims held in a range of ints: std::vector<int>, std::array<int, N>, std::span<const int>.
/// (A braced list `{0, 1}` takes the std::initializer_list overload: a deduced type never
/// competes with the options struct for a braced argument.)
template <class D>
concept DimList = std::ranges::input_range<D> && std::same_as<std::ranges::range_value_t<D>, int>;

// Each reduction takes the dims to reduce as one int (negative from the end), a list
// (`{0, 1}`, or a DimList such as std::vector<int>), or none for every positional dim; options come last.
// The value must be a named value or an axis_index value, so that plain calls of std::max,
// std::min or xt::sum on other types never see these.
#define NAMEDAX_LOCAL_REDUCTION(verb, kind)                                                        \
  template <NamedOperand X>                                                                        \
  auto verb(const X& x, reduction_options o = {}) {                                                \
    return detail::reduce<detail::local_kind::kind>(x, {{}, true}, o.keepdims);                    \
  }                                                                                                \
  template <NamedOperand X, Dim D>                                                                 \
  auto verb(const X& x, D dim, reduction_options o = {}) {                                         \
    detail::check_static_dim<X>(dim);                                                              \
    return detail::reduce<detail::local_kind::kind>(x, {{static_cast<int>(dim)}, false}, o.keepdims); \
  }                                                                                                \
  template <NamedOperand X>                                                                        \
  auto verb(const X& x, std::initializer_list<int> dims, reduction_options o = {}) {               \
    return detail::reduce<detail::local_kind::kind>(x, {std::vector<int>(dims), false}, o.keepdims); \
  }                                                                                                \
  template <NamedOperand X, DimList D>                                                             \
  auto verb(const X& x, const D& dims, reduction_options o = {}) {                                 \
    return detail::reduce<detail::local_kind::kind>(x, {{std::begin(dims), std::end(dims)}, false}, o.keepdims); \
  }

/// `sum(x, dims)`: jnp.sum. bool and integers narrower than 32 bits sum as int32 (uint32
/// when unsigned), wrapping on overflow; an empty sum is 0.
/// `sum(x, 0)` of rows {{1, 2}, {3, 4}} is {4, 6}; `sum(x, {.keepdims = true})` is {{10}}.
NAMEDAX_LOCAL_REDUCTION(sum, sum)
/// `prod(x, dims)`: jnp.prod, with sum's types; an empty product is 1.
/// `prod(x, 1)` of {{1, 2}, {3, 4}} is {2, 12}.
NAMEDAX_LOCAL_REDUCTION(prod, prod)
/// `mean(x, dims)`: jnp.mean; integers and bool give float32 (converted, then summed).
/// `mean(x, -1)` of {{1, 2}, {3, 4}} is {1.5, 3.5}.
NAMEDAX_LOCAL_REDUCTION(mean, mean)
/// `max(x, dims)`: jnp.max, keeping the type; NaN propagates; an empty dim is an error.
/// `max(x, 0)` of {{1, 5}, {3, 4}} is {3, 5}.
NAMEDAX_LOCAL_REDUCTION(max, max)
/// `min(x, dims)`: jnp.min, as max.
NAMEDAX_LOCAL_REDUCTION(min, min)
/// `any(x, dims)`: jnp.any; bool, true where some element is nonzero (NaN counts as nonzero).
NAMEDAX_LOCAL_REDUCTION(any, any)
/// `all(x, dims)`: jnp.all; bool, true where every element is nonzero (true when empty).
NAMEDAX_LOCAL_REDUCTION(all, all)
/// `logsumexp(x, dims)`: jax.nn.logsumexp, log(sum(exp(x))) computed as
/// log(sum(exp(x - m))) + m with m the (finite) max; integers give float32.
/// `logsumexp(x, -1)` of {{0, 0}} is {log 2}.
NAMEDAX_LOCAL_REDUCTION(logsumexp, logsumexp)
#undef NAMEDAX_LOCAL_REDUCTION

/// `argmax(x, dim)`: jnp.argmax, int32; ties go to the lowest index, a NaN wins (the first
/// one); without a dim, the index into the row-major flattened positional dims. An empty dim
/// is an error. `argmax(x, 1)` of {{1, 3, 3}} is {1}.
template <NamedOperand X, Dim D>
auto argmax(const X& x, D dim, reduction_options o = {}) {
  detail::check_static_dim<X>(dim);
  return detail::reduce<detail::local_kind::argmax>(x, {{static_cast<int>(dim)}, false}, o.keepdims);
}
template <NamedOperand X>
auto argmax(const X& x, reduction_options o = {}) {
  return detail::reduce<detail::local_kind::argmax>(x, {{}, true}, o.keepdims);
}
/// `argmin(x, dim)`: jnp.argmin, as argmax.
template <NamedOperand X, Dim D>
auto argmin(const X& x, D dim, reduction_options o = {}) {
  detail::check_static_dim<X>(dim);
  return detail::reduce<detail::local_kind::argmin>(x, {{static_cast<int>(dim)}, false}, o.keepdims);
}
template <NamedOperand X>
auto argmin(const X& x, reduction_options o = {}) {
  return detail::reduce<detail::local_kind::argmin>(x, {{}, true}, o.keepdims);
}

/// `cumsum(x, dim)`: jnp.cumsum, the inclusive running sum along `dim`, with sum's types;
/// without a dim, over the row-major flattened positional dims (a vector).
/// `cumsum(x, 0)` of {1, 2, 3} is {1, 3, 6}.
template <NamedOperand X, Dim D>
auto cumsum(const X& x, D dim) {
  detail::check_static_dim<X>(dim);
  return detail::when_resolved(detail::scan_fn<detail::scan_kind::cumsum>{static_cast<int>(dim), false}, x);
}
template <NamedOperand X>
auto cumsum(const X& x) {
  return detail::when_resolved(detail::scan_fn<detail::scan_kind::cumsum>{0, true}, x);
}
/// `cumprod(x, dim)`: jnp.cumprod, as cumsum. `cumprod(x, 0)` of {1, 2, 3} is {1, 2, 6}.
template <NamedOperand X, Dim D>
auto cumprod(const X& x, D dim) {
  detail::check_static_dim<X>(dim);
  return detail::when_resolved(detail::scan_fn<detail::scan_kind::cumprod>{static_cast<int>(dim), false}, x);
}
template <NamedOperand X>
auto cumprod(const X& x) {
  return detail::when_resolved(detail::scan_fn<detail::scan_kind::cumprod>{0, true}, x);
}

/// `softmax(x, dim = -1)`: jax.nn.softmax, exp(x - max) / sum(exp(x - max)) along `dim`;
/// integers give float32. `softmax(x)` of {0, log 3} is {0.25, 0.75}.
template <NamedOperand X, Dim D = int>
auto softmax(const X& x, D dim = -1) {
  detail::check_static_dim<X>(dim);
  return detail::when_resolved(detail::softmax_fn<false>{static_cast<int>(dim)}, x);
}
/// `log_softmax(x, dim = -1)`: jax.nn.log_softmax, (x - max) - log(sum(exp(x - max))).
template <NamedOperand X, Dim D = int>
auto log_softmax(const X& x, D dim = -1) {
  detail::check_static_dim<X>(dim);
  return detail::when_resolved(detail::softmax_fn<true>{static_cast<int>(dim)}, x);
}

/// `sort(x, dim = -1)`: jnp.sort, ascending and stable, NaN last, -0 equal to +0.
/// `sort(x)` of {3, NaN, 1} is {1, 3, NaN}.
template <NamedOperand X, Dim D = int>
auto sort(const X& x, D dim = -1) {
  detail::check_static_dim<X>(dim);
  return detail::when_resolved(detail::sort_fn<false>{static_cast<int>(dim)}, x);
}
/// `argsort(x, dim = -1)`: jnp.argsort, int32, stable (equal values keep their order).
/// `argsort(x)` of {3, 1, 3} is {1, 0, 2}.
template <NamedOperand X, Dim D = int>
auto argsort(const X& x, D dim = -1) {
  detail::check_static_dim<X>(dim);
  return detail::when_resolved(detail::sort_fn<true>{static_cast<int>(dim)}, x);
}

/// `top_k(x, k)`: lax.top_k along the last positional dim, a std::pair {values, indices}
/// (int32): the k largest in descending order, NaN largest, ties to the lower index.
/// `top_k(x, 2)` of {1, 4, 4, 2} is {{4, 4}, {1, 2}}.
template <NamedOperand X>
auto top_k(const X& x, long long k) {
  return detail::when_resolved(detail::top_k_fn{k}, x);
}

}  // namespace namedax
