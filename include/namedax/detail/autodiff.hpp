// SPDX-License-Identifier: MIT
// Reverse-mode differentiation behind namedax/autodiff.hpp: the recorded program (a graph of
// cells, one per operation on traced values, each holding its primal and a pullback), the
// sweep that runs the pullbacks newest first, the fit of a contribution to its operand's type,
// the helpers every rule is written with (record, elementwise, linear, reduce, add_at), the
// checks of vjp's cotangents and of nested derivatives (not supported yet), and
// the rules the other headers hand traced values to through detail/traced.hpp: the
// collectives (through the linear maps of namedax/transpose.hpp), pdot, xeinsum's product,
// the collective matmuls and the structural operations.
// IWYU pragma: private, include <namedax/autodiff.hpp>
#pragma once

#include <namedax/detail/compilation.hpp>
#include <namedax/detail/digamma.hpp>
#include <namedax/detail/traced.hpp>
#include <namedax/detail/unpack.hpp>
#include <namedax/elementwise.hpp>
#include <namedax/reductions.hpp>
#include <namedax/structure.hpp>
#include <namedax/transpose.hpp>
#include <namedax/xeinsum.hpp>

#include <xtensor/xbroadcast.hpp>
#include <xtensor/xreducer.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <numbers>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_set>
#include <variant>
#include <utility>
#include <vector>

namespace namedax {
template <std::size_t... I>
struct argnums_t;
struct has_aux_t;
}  // namespace namedax

namespace namedax::detail::ad {

/// The value a named expression evaluates to: named<shared_array<T>, Env, Varying>.
template <class X>
using owned_t = decltype(namedax::eval(std::declval<const X&>()));

/// Whether values of element type T are differentiated: floating point ones are; integers,
/// bools and indices are constants of the program.
template <class T>
inline constexpr bool differentiable_element = std::is_floating_point_v<T>;

/// One recorded operation. `order` grows with every node made, so a node's operands are older
/// than it: running the pullbacks in decreasing order completes each cotangent before it is
/// used. Every device runs the same program, so each runs its pullbacks, and the collectives
/// in them, in the same order.
struct node {
  explicit node(std::vector<std::shared_ptr<node>> operands) : parents(std::move(operands)), order(next_order()) {}
  node(const node&) = delete;
  node& operator=(const node&) = delete;
  virtual ~node() = default;
  /// Adds this node's cotangent, through its pullback, to its operands' cotangents.
  virtual void propagate() = 0;
  /// Drops the cotangent, so that a pullback may run again.
  virtual void forget() = 0;

  /// The order the next node made will have: a trace's nodes, made after it is read, have it
  /// or more, so an older node in its program is one of an enclosing trace.
  static std::uint64_t upcoming_order() { return counter().load(std::memory_order_relaxed); }

  std::vector<std::shared_ptr<node>> parents;
  std::uint64_t order;

 private:
  static std::atomic<std::uint64_t>& counter() {
    static std::atomic<std::uint64_t> count{0};
    return count;
  }
  static std::uint64_t next_order() { return counter().fetch_add(1, std::memory_order_relaxed); }
};

/// A contribution `a` to an operand of positional `shape` (and the same `vectorized` trailing
/// dims), summed over the positional dims it was broadcast along (NumPy's rules, from the
/// right) and broadcast where the operand was larger. One function per element type, compiled
/// once (see fit).
template <class T>
xt::xarray<T> fit_shape(xt::xarray<T> a, const std::vector<std::size_t>& shape, std::size_t vectorized) {
  const std::size_t target = shape.size();
  const std::size_t rank = a.dimension() - vectorized;
  std::vector<std::size_t> full(shape);
  full.insert(full.end(), a.shape().end() - static_cast<std::ptrdiff_t>(vectorized), a.shape().end());
  if (std::equal(a.shape().begin(), a.shape().end(), full.begin(), full.end())) return a;
  std::vector<std::size_t> summed;  // dims broadcast from the operand's 1 or absent
  for (std::size_t k = 0; k < rank; ++k)
    if (k + target < rank || (shape[k + target - rank] == 1 && a.shape()[k] != 1)) summed.push_back(k);
  if (!summed.empty()) {
    xt::xarray<T> s = xt::sum(a, summed, xt::keep_dims);  // lazy: the immediate strategy crashes on xtensor 0.24
    a = std::move(s);
  }
  std::vector<std::size_t> kept(a.shape().begin() + static_cast<std::ptrdiff_t>(rank > target ? rank - target : 0),
                                a.shape().end());
  if (rank < target) kept.insert(kept.begin(), target - rank, 1);
  a.reshape(kept);
  if (!std::equal(kept.begin(), kept.end(), full.begin(), full.end()))
    a = xt::broadcast(a, full);  // the contribution was a smaller value broadcast to the operand
  return a;
}

#ifdef NAMEDAX_SEPARATE_COMPILATION  // defined once, by <namedax/separate_compilation.hpp>
#define NAMEDAX_INSTANTIATE(T) \
  NAMEDAX_EXTERN template xt::xarray<T> fit_shape<T>(xt::xarray<T>, const std::vector<std::size_t>&, std::size_t);
NAMEDAX_FOR_EACH_ELEMENT_TYPE(NAMEDAX_INSTANTIATE)
#undef NAMEDAX_INSTANTIATE
#endif

template <class R, class N>
N fit(const R& r, const std::vector<std::size_t>& shape);

/// A recorded value of type N (named<shared_array<T>, Env, Varying>) and its cotangent, which
/// has N's type: contributions are summed where they vary and N does not, and over the
/// positional dims they were broadcast along (see fit). An input has no pullback; an
/// operation's result is a pulled_cell.
template <class N>
struct cell : node {
  cell(N value, std::vector<std::shared_ptr<node>> operands) : node(std::move(operands)), primal(std::move(value)) {}

  void propagate() override {
    if (cotangent) pull(*cotangent);
  }
  void forget() override { cotangent.reset(); }

  template <class R>
  void accumulate(const R& contribution) {
    N c = fit<R, N>(contribution, primal.shape());
    if (cotangent) cotangent.emplace(namedax::eval(*cotangent + c));
    else cotangent.emplace(std::move(c));
  }

  N primal;
  std::optional<N> cotangent;

 private:
  /// Adds the cotangent `ct`'s contributions to the operands' cotangents.
  virtual void pull(const N& /*ct*/) {}
};

/// A cell with its pullback, called through the cell's virtual function rather than a
/// std::function: each operation's pullback then costs one class, not std::function's
/// manager and invoker. The pullback is given the cotangent and the cells of the traced
/// operands (the node's parents, in the operands' order).
template <class N, class Pullback>
struct pulled_cell final : cell<N> {
  pulled_cell(N value, std::vector<std::shared_ptr<node>> operands, Pullback pb)
      : cell<N>(std::move(value), std::move(operands)), pullback(std::move(pb)) {}

 private:
  void pull(const N& ct) override { pullback(ct, this->parents); }
  Pullback pullback;
};

/// The cells of an operation's traced operands, in the operands' order, as the node holds them.
template <class... Xs>
std::vector<std::shared_ptr<node>> traced_cells(const Xs&... xs) {
  std::vector<std::shared_ptr<node>> cells;
  auto add = [&](const auto& x) {
    if constexpr (Traced<decltype(x)>) cells.push_back(x.cell());
  };
  (add(xs), ...);
  return cells;
}

/// The cell of operand K, a traced one of Xs, among the node's parents (see traced_cells).
template <std::size_t K, class... Xs>
auto& operand_cell(const std::vector<std::shared_ptr<node>>& parents) {
  using X = std::tuple_element_t<K, std::tuple<Xs...>>;
  std::size_t position = 0, k = 0;
  ((position += k++ < K && Traced<Xs>), ...);  // the traced operands before K
  return static_cast<cell<typename X::primal_type>&>(*parents[position]);
}

/// The cell of `value`, computed by an operation on the cells `operands`, with its pullback.
/// Owned as a cell<N>, deleted through node's virtual destructor: one control block type per
/// N, not one per pullback.
template <class N, class Pullback>
std::shared_ptr<cell<N>> make_cell(N value, std::vector<std::shared_ptr<node>> operands, Pullback pullback) {
  cell<N>* c = new pulled_cell<N, Pullback>(std::move(value), std::move(operands), std::move(pullback));
  return std::shared_ptr<cell<N>>(c);
}

}  // namespace namedax::detail::ad

namespace namedax {

/// A named value recorded for reverse-mode differentiation: what a function given to
/// namedax::grad or namedax::vjp receives for each differentiated argument, and what every
/// namedax operation on such a value returns. It reads like the named value it holds
/// (`primal()`); the program it was computed by is kept until its pullback has run.
template <class N>
class traced {
 public:
  using traced_tag = void;
  using primal_type = N;
  using value_type = typename N::value_type;
  using env_type = typename N::env_type;
  static constexpr axis_mask varying = N::varying;

  explicit traced(std::shared_ptr<detail::ad::cell<N>> c) : cell_(std::move(c)) {}

  /// The value itself, without its record: use it where a derivative must not flow (JAX's
  /// stop_gradient), or to print.
  [[nodiscard]] const N& primal() const noexcept { return cell_->primal; }
  [[nodiscard]] std::size_t dimension() const { return primal().dimension(); }
  [[nodiscard]] std::vector<std::size_t> shape() const { return primal().shape(); }
  /// The single value on this device, as named::value(): for SPMD control flow.
  [[nodiscard]] value_type value() const { return primal().value(); }
  explicit operator bool() const { return static_cast<bool>(value()); }

  [[nodiscard]] const std::shared_ptr<detail::ad::cell<N>>& cell() const noexcept { return cell_; }

 private:
  std::shared_ptr<detail::ad::cell<N>> cell_;
};

}  // namespace namedax

namespace namedax::detail::ad {

/// What an operation computes with: a traced operand's value, any other operand as it is.
template <class X>
decltype(auto) primal_of(const X& x) {
  if constexpr (Traced<X>) return (x.primal());
  else return (x);
}

/// A traced input: a cell with no operands and no pullback.
template <class N>
traced<owned_t<N>> input(const N& x) {
  using O = owned_t<N>;
  // Not make_shared: the control block is then the type make_cell's cells have.
  return traced<O>(std::shared_ptr<cell<O>>(new cell<O>(namedax::eval(x), std::vector<std::shared_ptr<node>>{})));
}

/// `r`, a contribution computed in an environment that extends `Env` (an operation mixed the
/// operand with values of inner maps), summed over the inner names and given `Env`.
template <class Env, class R>
auto in_env(const R& r) {
  using REnv = typename R::env_type;
  if constexpr (std::is_same_v<REnv, Env>) {
    return r;
  } else {
    static_assert(env_is_prefix<Env, REnv>(),
                  "namedax::grad: an operand and the value computed from it have environments that do not nest");
    constexpr axis_mask outer = (axis_mask{1} << Env::size) - 1;
    constexpr axis_mask inner = R::varying & ~outer;
    auto summed = [&] {
      if constexpr (inner == 0) return r;
      else return namedax::psum(r, axes_of_mask<REnv, inner>());
    }();
    using S = decltype(summed);
    xt::xarray<typename S::value_type> a = evaluate(summed.payload());
    std::vector<std::size_t> shape(a.shape().begin(), a.shape().end() - (REnv::vectorized_count - Env::vectorized_count));
    a.reshape(shape);
    return make_named<shared_array<typename S::value_type>, Env, S::varying & outer>(share_array(std::move(a)));
  }
}

/// A contribution with the primal's type N and positional `shape`: moved to N's environment,
/// summed where it varies and N does not (or marked varying where N varies), summed over the
/// positional dims it was broadcast along (NumPy's rules, from the right), converted to N's
/// element type.
template <class R, class N>
N fit(const R& r, const std::vector<std::size_t>& shape) {
  using T = typename N::value_type;
  using Env = typename N::env_type;
  auto matched = match_variance<N>(in_env<Env>(r));
  // Already an array of N's type and shape (a product's or a sum's cotangent, as most are):
  // taken as it is, since cotangents are never written after they are made.
  if constexpr (std::is_same_v<std::remove_cvref_t<decltype(matched)>, N>) {
    const auto& held = matched.payload().shape();
    if (matched.dimension() == shape.size() && std::equal(shape.begin(), shape.end(), held.begin())) return matched;
  }
  return N(share_array(fit_shape<T>(evaluate<T>(matched.payload()), shape, Env::vectorized_count)));
}

/// The traced result of an operation on `xs`: `y` (evaluated) recorded with a pullback;
/// `pullback(ct, k)` gives the contribution of y's cotangent to operand k, and is asked
/// only for the traced operands.
template <class Y, class Pullback, class... Xs>
auto record(const Y& y, Pullback pullback, const Xs&... xs) {
  using N = owned_t<Y>;
  auto propagate = [pullback = std::move(pullback)](const N& ct, const std::vector<std::shared_ptr<node>>& parents) {
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      (
          [&] {
            if constexpr (Traced<std::tuple_element_t<K, std::tuple<Xs...>>>)
              operand_cell<K, Xs...>(parents).accumulate(pullback(ct, std::integral_constant<std::size_t, K>{}));
          }(),
          ...);
    }(std::index_sequence_for<Xs...>{});
  };
  return traced<N>(make_cell(N(namedax::eval(y)), traced_cells(xs...), std::move(propagate)));
}

/// A linear map applied to a traced value: its pullback is the map's transpose (namedax::vjp).
template <class Op, class X>
auto linear(const Op& op, const X& x) {
  auto applied = vjp_of(op, x.primal());  // not a structured binding: lambdas capture it (clang 14)
  return record(applied.first, [pullback = std::move(applied.second)](const auto& ct, auto) { return pullback(ct); }, x);
}

/// An operand as a pullback keeps it: a traced or named value shares its data; plain arrays
/// and scalars are copied, as lazy expressions would hold them.
template <class X>
auto owned_operand(const X& x) {
  if constexpr (Traced<X>) return x.primal();
  else if constexpr (NamedOperand<X>) return x;
  else if constexpr (std::is_arithmetic_v<X>) return x;
  else if constexpr (is_node<X>) return detail::tree_map(x, [](const auto& leaf) { return owned_operand(leaf); });
  else if constexpr (PlainValue<X>) return xt::xarray<typename X::value_type>(x);
  else return x;  // a constant of another kind (an options struct, a string): kept as it is
}

/// An elementwise operation `f` of the operands, whose pullback to operand k is
/// `derivative(ct, k, y, primals...)` (y the result).
template <class F, class D, class... Xs>
auto elementwise(F f, D derivative, const Xs&... xs) {
  auto y = namedax::eval(f(primal_of(xs)...));
  return record(
      y, [derivative, y, ... primals = owned_operand(xs)](const auto& ct, auto k) { return derivative(ct, k, y, primals...); },
      xs...);
}

/// `ct` with positional shape `shape` (the same elements; its vectorized dims kept).
template <class C>
C with_positional_shape(const C& ct, const std::vector<std::size_t>& shape) {
  using T = typename C::value_type;
  xt::xarray<T> a = evaluate(ct.payload());
  std::vector<std::size_t> full(shape);
  full.insert(full.end(), a.shape().end() - static_cast<std::ptrdiff_t>(C::env_type::vectorized_count), a.shape().end());
  a.reshape(full);
  return C(share_array(std::move(a)));
}

/// The local reductions that are differentiated.
enum class local_reduction { sum, mean, max, min, logsumexp, prod };

/// The lines of a row-major array along dim `d`: `f(first, count, stride)` for each, `first`
/// the offset of its first element. (kernels.hpp's for_each_line walks innermost lines and
/// drops dims of size 1, so it cannot give the lines along a given dim.)
template <class F>
void for_each_line_along(const std::vector<std::size_t>& shape, std::size_t d, F f) {
  const auto product = [&](std::size_t from, std::size_t to) {
    return std::accumulate(shape.begin() + static_cast<std::ptrdiff_t>(from), shape.begin() + static_cast<std::ptrdiff_t>(to),
                           std::size_t{1}, std::multiplies<>());
  };
  const std::size_t outer = product(0, d);
  const std::size_t count = shape[d];
  const std::size_t inner = product(d + 1, shape.size());
  for (std::size_t o = 0; o < outer; ++o)
    for (std::size_t i = 0; i < inner; ++i) f(o * count * inner + i, count, inner);
}

/// In place, along dim `d`: each element becomes the product of the other elements of its
/// line, as the exclusive prefix product times the exclusive suffix product. No division, so
/// a zero gives the right answer (the others' product where it is, zero elsewhere in its line).
template <class T>
void product_of_others(xt::xarray<T>& a, std::size_t d) {
  const std::vector<std::size_t> shape(a.shape().begin(), a.shape().end());
  T* data = a.data();
  for_each_line_along(shape, d, [data](std::size_t first, std::size_t count, std::size_t stride) {
    T suffix(1);  // the product of the elements after k, then the prefix is multiplied in
    std::vector<T> line(count);
    for (std::size_t k = count; k-- > 0;) {
      line[k] = suffix;
      suffix *= data[first + k * stride];
    }
    T prefix(1);
    for (std::size_t k = 0; k < count; ++k) {
      const T v = data[first + k * stride];
      data[first + k * stride] = prefix * line[k];
      prefix *= v;
    }
  });
}

/// At each element of x (a named value), the product of the other elements over the positional
/// `dims` (every positional dim when none): prod's derivative, zero-safe. Over several dims
/// d0 < d1 < ... it is the product, for each k, of the others along d_k of x's product over
/// the dims after d_k (kept as size 1 and broadcast back).
template <class N>
N product_of_others(const N& x, const std::optional<std::vector<int>>& dims) {
  using T = typename N::value_type;
  const int rank = static_cast<int>(x.dimension());
  std::vector<std::size_t> reduced;
  if (dims)
    for (int d : *dims) reduced.push_back(static_cast<std::size_t>(d < 0 ? d + rank : d));
  else
    for (int d = 0; d < rank; ++d) reduced.push_back(static_cast<std::size_t>(d));
  std::sort(reduced.begin(), reduced.end());
  xt::xarray<T> rest = evaluate(x.payload());
  xt::xarray<T> result = xt::ones<T>(rest.shape());
  for (std::size_t k = reduced.size(); k-- > 0;) {
    xt::xarray<T> others = rest;
    product_of_others(others, reduced[k]);
    xt::xarray<T> multiplied = result * others;  // others has size 1 along the dims after d_k
    result = std::move(multiplied);
    if (k > 0) {
      xt::xarray<T> p = xt::prod(rest, std::vector<std::size_t>{reduced[k]}, xt::keep_dims);
      rest = std::move(p);
    }
  }
  return N(share_array(std::move(result)));
}

/// cumprod's pullback along dim `d` of x (a named value), ct of x's shape. With E_i the
/// exclusive prefix product of a line and S_i = ct_i + x_{i+1} S_{i+1} (S_{n-1} = ct_{n-1}),
/// the contribution to x_i is E_i S_i: O(n) per line and no division, so zeros are exact.
template <class C, class N>
C cumprod_pullback(const C& ct, const N& x, int d) {
  using T = typename C::value_type;
  const int rank = static_cast<int>(x.dimension());
  const auto dim = static_cast<std::size_t>(d < 0 ? d + rank : d);
  xt::xarray<T> v = evaluate<T>(x.payload());
  xt::xarray<T> c = evaluate(ct.payload());
  if (!std::equal(v.shape().begin(), v.shape().end(), c.shape().begin(), c.shape().end())) {
    xt::xarray<T> b = xt::broadcast(v, c.shape());  // x replicated where the cotangent varies
    v = std::move(b);
  }
  const std::vector<std::size_t> shape(c.shape().begin(), c.shape().end());
  const T* xs = v.data();
  T* cs = c.data();
  for_each_line_along(shape, dim, [xs, cs](std::size_t first, std::size_t count, std::size_t stride) {
    if (count == 0) return;
    T s = cs[first + (count - 1) * stride];  // S_{k}, from the end
    std::vector<T> suffix(count);
    suffix[count - 1] = s;
    for (std::size_t k = count - 1; k-- > 0;) {
      s = cs[first + k * stride] + xs[first + (k + 1) * stride] * s;
      suffix[k] = s;
    }
    T prefix(1);
    for (std::size_t k = 0; k < count; ++k) {
      cs[first + k * stride] = prefix * suffix[k];
      prefix *= xs[first + k * stride];
    }
  });
  return C(share_array(std::move(c)));
}

/// A local reduction of a traced value over `dims` (every positional dim when none).
/// `keep(v, dims)` computes it on a named value with keepdims, so that its result broadcasts
/// against v; the pullback broadcasts the cotangent back the same way.
template <local_reduction Kind, class X, class Keep>
auto reduce(const X& x, std::optional<std::vector<int>> dims, bool keepdims, Keep keep) {
  const auto& a = x.primal();
  auto kept = namedax::eval(keep(a, dims));
  auto y = keepdims ? kept : [&] {
    std::vector<std::size_t> shape;
    std::vector<bool> reduced(a.dimension(), !dims);
    if (dims)
      for (int d : *dims) reduced[static_cast<std::size_t>(d < 0 ? d + static_cast<int>(a.dimension()) : d)] = true;
    for (std::size_t k = 0; k < a.dimension(); ++k)
      if (!reduced[k]) shape.push_back(kept.shape()[k]);
    return with_positional_shape(kept, shape);
  }();
  return record(
      y,
      [a, kept, dims](const auto& ct, auto) {
        using T = typename std::remove_cvref_t<decltype(ct)>::value_type;
        auto c = with_positional_shape(ct, kept.shape());
        auto count = [&](const auto& v) {
          return dims ? namedax::sum(v, *dims, {.keepdims = true}) : namedax::sum(v, {.keepdims = true});
        };
        if constexpr (Kind == local_reduction::sum) {
          return c;
        } else if constexpr (Kind == local_reduction::mean) {
          return namedax::eval(c * (static_cast<T>(kept.payload().size()) / static_cast<T>(a.payload().size())));
        } else if constexpr (Kind == local_reduction::logsumexp) {
          return namedax::eval(c * namedax::exp(a - kept));
        } else if constexpr (Kind == local_reduction::prod) {
          return namedax::eval(c * product_of_others(a, dims));
        } else {
          // The maximum (minimum) takes the cotangent, shared equally among ties, as JAX.
          auto chosen = namedax::eval(namedax::cast<T>(a == kept));
          return namedax::eval(c * chosen / count(chosen));
        }
      },
      x);
}

/// A value of positional shape `operand` (and ct's vectorized dims) holding, at each
/// position p, the sum of the elements of `ct` whose `source` is `offset + p` (a source
/// outside the operand, a pad's or another operand's, adds nothing): the transpose of a gather.
template <class C, class S>
C add_at(const C& ct, const S& source, std::int64_t offset, const std::vector<std::size_t>& operand) {
  using T = typename C::value_type;
  constexpr std::size_t vectorized = C::env_type::vectorized_count;
  xt::xarray<T> c = evaluate(ct.payload());
  xt::xarray<std::int64_t> s = evaluate(source.payload());
  // Both to their common shape: a source that differs along a vmap axis (a slice at starts
  // from axis_index) or a cotangent that does not.
  std::vector<std::size_t> common(c.shape().begin(), c.shape().end());
  for (std::size_t k = 0; k < common.size(); ++k) common[k] = std::max(common[k], s.shape()[k]);
  if (!std::equal(common.begin(), common.end(), c.shape().begin())) c = xt::broadcast(c, common);
  if (!std::equal(common.begin(), common.end(), s.shape().begin())) s = xt::broadcast(s, common);
  const std::size_t lanes = std::accumulate(common.end() - static_cast<std::ptrdiff_t>(vectorized), common.end(),
                                            std::size_t{1}, std::multiplies<>());
  std::vector<std::size_t> out_shape(operand);
  out_shape.insert(out_shape.end(), common.end() - static_cast<std::ptrdiff_t>(vectorized), common.end());
  xt::xarray<T> out = xt::zeros<T>(out_shape);
  const auto size = static_cast<std::int64_t>(out.size() / lanes);
  for (std::size_t f = 0; f < c.size(); ++f) {
    const std::int64_t p = s.data()[f] - offset;
    if (p >= 0 && p < size) out.data()[static_cast<std::size_t>(p) * lanes + f % lanes] += c.data()[f];
  }
  return C(share_array(std::move(out)));
}

/// Every node that the outputs depend on, newest first.
NAMEDAX_DECL std::vector<node*> reverse_program(const std::vector<std::shared_ptr<node>>& outputs);

// ---------------------------------------------------------------------------------------
// The program: tracing the arguments, running the pullbacks, reading the gradients.

/// A leaf of an argument as the differentiated function receives it: traced where it is
/// differentiated (a named value, array or scalar of floating type), as it is otherwise.
/// Arrays and scalars become values of no environment.
template <class L>
auto trace_leaf(const L& x) {
  if constexpr (NamedValue<L>) {
    if constexpr (differentiable_element<typename L::value_type>) return input(x);
    else return x;
  } else if constexpr (std::is_arithmetic_v<L>) {
    if constexpr (differentiable_element<L>) return input(make_named<shared_array<L>, env<>, 0>(share_array(xt::xarray<L>(x))));
    else return x;
  } else if constexpr (PlainValue<L>) {
    using T = typename L::value_type;
    if constexpr (differentiable_element<T>) return input(make_named<shared_array<T>, env<>, 0>(share_array(xt::xarray<T>(x))));
    else return x;
  } else {
    return x;
  }
}

/// A value of x's type holding zeros: the gradient of an argument the result does not depend
/// on, and of one that is not differentiated (an integer or bool value, as JAX's float0).
template <class L>
auto zeros_like(const L& x) {
  if constexpr (NamedValue<L>) {
    using T = typename L::value_type;
    xt::xarray<T> a = xt::zeros<T>(x.payload().shape());
    return make_named<shared_array<T>, typename L::env_type, L::varying>(share_array(std::move(a)));
  } else if constexpr (std::is_arithmetic_v<L>) {
    return L{};
  } else if constexpr (PlainValue<L>) {
    return xt::xarray<typename L::value_type>(xt::zeros<typename L::value_type>(x.shape()));
  } else {
    return x;  // a value waiting for its environment (axis_index) is an index: no gradient
  }
}

/// The gradient of one argument leaf `x`, which the function received as `t`, given as x is.
template <class L, class T>
auto gradient_leaf(const L& x, const T& t) {
  if constexpr (!Traced<T>) {
    return ad::zeros_like(x);
  } else {
    const auto& ct = t.cell()->cotangent;
    if constexpr (NamedValue<L>) {
      return ct ? *ct : ad::zeros_like(x);
    } else if constexpr (std::is_arithmetic_v<L>) {
      return ct ? static_cast<L>(*ct->payload().cbegin()) : L{};
    } else {
      return ct ? xt::xarray<typename L::value_type>(ct->payload()) : ad::zeros_like(x);
    }
  }
}

/// The primal of every traced leaf of a result.
template <class Y>
auto primal_tree(const Y& y) {
  return detail::tree_map(y, [](const auto& leaf) {
    if constexpr (Traced<decltype(leaf)>) return leaf.primal();
    else return leaf;
  });
}

/// Throws, for `verb`, when the program of a trace whose nodes have order `first` or more
/// reaches an older node: the function closes over a traced value of an enclosing trace,
/// whose derivative in that value would need the nested one (not supported yet).
NAMEDAX_DECL void require_one_trace(std::string_view verb, const std::vector<node*>& nodes, std::uint64_t first);

/// Runs the pullbacks of a recorded program, traced from node order `first` on: `seed` has
/// given the outputs their cotangents; `read` then reads the inputs'. Cotangents are dropped
/// afterwards, also when a pullback throws, so that the pullback may run again.
template <class Read>
auto run_pullbacks(std::string_view verb, const std::vector<std::shared_ptr<node>>& outputs, std::uint64_t first,
                   Read read) {
  const auto nodes = reverse_program(outputs);
  struct forget_all {
    const std::vector<node*>& nodes;
    ~forget_all() {
      for (node* n : nodes) n->forget();
    }
  } guard{nodes};
  require_one_trace(verb, nodes, first);
  for (node* n : nodes) n->propagate();
  return read();
}

/// A cotangent given for a result of type N: a named value as it is; a plain array or a
/// scalar (outside any map, or a constant inside one) as a value of N's environment.
template <class N, class C>
auto as_cotangent(const C& ct) {
  if constexpr (NamedValue<C>) {
    return ct;
  } else if constexpr (std::is_arithmetic_v<C>) {
    return as_cotangent<N>(xt::xarray<typename N::value_type>(static_cast<typename N::value_type>(ct)));
  } else {
    using T = typename N::value_type;
    using Env = typename N::env_type;
    return make_named<shared_array<T>, Env, 0>(share_array(evaluate<T>(payload_in<Env>(ct))));
  }
}

/// The gradient tree of an argument tree `x`, received by the function as `t`.
template <class X, class T>
auto gradients_of(const X& x, const T& t) {
  auto x_leaves = tree_leaves(x);
  auto t_leaves = tree_leaves(t);
  auto grads = [&]<std::size_t... K>(std::index_sequence<K...>) {
    return std::make_tuple(gradient_leaf(std::get<K>(x_leaves), std::get<K>(t_leaves))...);
  }(std::make_index_sequence<leaf_count<X>()>{});
  return tree_unflatten<X>(grads);
}

/// The condition of the static_assert of a derivative of a derivative, given whether the
/// arguments are traced: it prints as `higher_order_is_supported<false>`, not as the
/// arguments' types.
template <bool Supported>
inline constexpr bool higher_order_is_supported = Supported;

/// The pullback of `out`, the result of a function that received the traced `inputs` for
/// the arguments `originals` (their leaves traced from node order `first` on).
template <class Inputs, class Out, class Originals>
auto pullback_of(std::string_view verb, std::uint64_t first, Inputs inputs, Out out, Originals originals) {
  return [verb, first, inputs = std::move(inputs), out = std::move(out), originals = std::move(originals)](const auto& ct) {
    using C = std::remove_cvref_t<decltype(ct)>;
    static_assert(leaf_count<C>() == leaf_count<Out>(),
                  "namedax::vjp: the cotangent must have the structure of the function's result");
    check_cotangent_shapes(primal_tree(out), ct);
    std::vector<std::shared_ptr<node>> outputs;
    const auto out_leaves = tree_leaves(out);
    const auto ct_leaves = tree_leaves(ct);
    auto seed = [&]<std::size_t... K>(std::index_sequence<K...>) {
      (
          [&] {
            const auto& o = std::get<K>(out_leaves);
            if constexpr (Traced<decltype(o)>) {
              o.cell()->accumulate(as_cotangent<typename std::remove_cvref_t<decltype(o)>::primal_type>(std::get<K>(ct_leaves)));
              outputs.push_back(o.cell());
            }
          }(),
          ...);
    };
    try {
      seed(std::make_index_sequence<leaf_count<Out>()>{});
    } catch (...) {
      for (const auto& o : outputs) o->forget();
      throw;
    }
    return run_pullbacks(verb, outputs, first, [&] {
      return [&]<std::size_t... I>(std::index_sequence<I...>) {
        return std::make_tuple(gradients_of(std::get<I>(originals), std::get<I>(inputs))...);
      }(std::make_index_sequence<std::tuple_size_v<Originals>>{});
    });
  };
}

/// A function's result split into what is differentiated and its auxiliary data (has_aux:
/// the function returns `(value, aux)`), the aux as plain values.
template <bool HasAux, class R>
auto split_aux(R&& r) {
  if constexpr (HasAux) {
    using Result = std::remove_cvref_t<R>;
    if constexpr (requires { std::tuple_size<Result>::value; }) {
      static_assert(std::tuple_size_v<Result> == 2, "namedax::grad with namedax::has_aux: the function must return a "
                                                    "pair (value, aux), as with jax.grad(has_aux=True)");
      return std::pair{std::get<0>(std::forward<R>(r)), primal_tree(std::get<1>(std::forward<R>(r)))};
    } else {
      static_assert(always_false<Result>, "namedax::grad with namedax::has_aux: the function must return a pair "
                                          "(value, aux), as with jax.grad(has_aux=True)");
      return std::pair{std::forward<R>(r), 0};
    }
  } else {
    return std::pair{std::forward<R>(r), std::monostate{}};
  }
}

/// Which leaves of a call's arguments `Xs...` were traced values, in tree_leaves' order: a
/// std::integer_sequence<bool, ...>. A derivative that runs the call again (checkpoint, a
/// map's rule) traces those alone, so that the function gets every other argument as the
/// call gave it.
template <class Leaves>
struct traced_flags;
template <class... L>
struct traced_flags<std::tuple<L...>> {
  using type = std::integer_sequence<bool, Traced<std::remove_cvref_t<L>>...>;
};
template <class... Xs>
using traced_leaves_of = typename traced_flags<decltype(tree_leaves(std::declval<const std::tuple<const Xs&...>&>()))>::type;

/// The positions of the set flags in `Flags` (traced_leaves_of's), and each position's index
/// among them: what a map's rule keeps of its per-leaf lists for the traced leaves alone.
template <class Flags>
struct set_flags;
template <bool... F>
struct set_flags<std::integer_sequence<bool, F...>> {
  static constexpr std::size_t count = (std::size_t{0} + ... + std::size_t{F});
  static constexpr std::array<bool, sizeof...(F)> set{F...};
  static constexpr auto positions = [] {
    std::array<std::size_t, count> p{};
    for (std::size_t i = 0, k = 0; i < sizeof...(F); ++i)
      if (set[i]) p[k++] = i;
    return p;
  }();
  static constexpr auto ranks = [] {
    std::array<std::size_t, sizeof...(F)> r{};
    for (std::size_t i = 0, k = 0; i < sizeof...(F); ++i) r[i] = set[i] ? k++ : 0;
    return r;
  }();
};
/// The elements of the tuple `t` at the set positions of Flags.
template <class Flags, class Tuple>
auto at_set_flags(const Tuple& t) {
  using S = set_flags<Flags>;
  return [&]<std::size_t... J>(std::index_sequence<J...>) {
    return std::make_tuple(std::get<S::positions[J]>(t)...);
  }(std::make_index_sequence<S::count>{});
}
/// Element `Rank` of `chosen` where the flag is set, a placeholder (0) where it is not.
template <bool Set, std::size_t Rank, class Tuple>
auto chosen_or_placeholder(const Tuple& chosen) {
  if constexpr (Set) return std::get<Rank>(chosen);
  else return 0;
}
/// The inverse of at_set_flags: one element per flag, `chosen`'s at the set positions.
template <class Flags, class Tuple>
auto from_set_flags(const Tuple& chosen) {
  using S = set_flags<Flags>;
  return [&]<std::size_t... K>(std::index_sequence<K...>) {
    return std::make_tuple(chosen_or_placeholder<S::set[K], S::ranks[K]>(chosen)...);
  }(std::make_index_sequence<S::set.size()>{});
}

/// A leaf traced (trace_leaf), or a copy of it as it is.
template <bool Trace, class L>
auto traced_if(const L& leaf) {
  if constexpr (Trace) return trace_leaf(leaf);
  else return L(leaf);
}

/// The arguments as the differentiated function receives them: every leaf traced where it can
/// be (`Selected` void: grad, vjp), or only the leaves whose flag in `Selected` is set (see
/// traced_leaves_of), the others as they are.
template <class Selected, class... Xs>
auto trace_arguments(const Xs&... xs) {
  if constexpr (std::is_void_v<Selected>) {
    // make_tuple, not std::tuple{...}: one argument that is itself a tuple must stay one argument.
    return std::make_tuple(detail::tree_map(xs, [](const auto& leaf) { return trace_leaf(leaf); })...);
  } else {
    const std::tuple<const Xs&...> given(xs...);
    const auto leaves = tree_leaves(given);
    return [&]<bool... Trace, std::size_t... K>(std::integer_sequence<bool, Trace...>, std::index_sequence<K...>) {
      auto chosen = std::make_tuple(traced_if<Trace>(std::get<K>(leaves))...);
      return tree_unflatten<std::tuple<Xs...>>(chosen);
    }(Selected{}, std::make_index_sequence<Selected::size()>{});
  }
}

/// vjp (and, through it, grad, value_and_grad and checkpoint, which name themselves as
/// `verb`): `{value, pullback, aux}`, the aux std::monostate unless HasAux. `Selected`: which
/// leaves are traced (see trace_arguments).
template <bool HasAux, class Selected = void, class F, class... Xs>
auto trace_function(std::string_view verb, const F& f, const Xs&... xs) {
  const std::uint64_t first = node::upcoming_order();
  auto inputs = trace_arguments<Selected>(xs...);
  auto [out, aux] = split_aux<HasAux>(unpack(inputs, f));
  auto value = primal_tree(out);
  return std::tuple{std::move(value), pullback_of(verb, first, std::move(inputs), std::move(out), std::make_tuple(xs...)),
                    std::move(aux)};
}

template <class F, class... Xs>
auto vjp_of_function(const F& f, const Xs&... xs) {
  constexpr bool nested = (false || ... || has_traced_leaves<Xs>());
  if constexpr (nested) {
    static_assert(higher_order_is_supported<!nested>,
                  "namedax::vjp: higher-order derivatives (vjp inside grad or vjp, of traced values) are not supported "
                  "yet; apply it to namedax::stop_gradient of the traced values to hold its result constant");
    // Only the assertion above is reported: a result of the types a nested vjp would give.
    return std::pair{f(xs...), [xs...](const auto&) { return std::make_tuple(xs...); }};
  } else {
    auto [value, pullback, aux] = trace_function<false>("vjp", f, xs...);
    return std::pair{std::move(value), std::move(pullback)};
  }
}

/// A cotangent of ones for a scalar result: the seed of grad.
template <class Y>
auto ones_for(std::string_view verb, const Y& y) {
  if constexpr (NamedValue<Y>) {
    using T = typename Y::value_type;
    if (y.dimension() != 0)
      fail("namedax::", verb, ": the function must return a scalar (positional shape []), as jax.grad; it returned "
           "positional shape ", y.shape(), "; reduce it with namedax::sum or namedax::mean");
    xt::xarray<T> a = xt::ones<T>(y.payload().shape());
    return make_named<shared_array<T>, typename Y::env_type, Y::varying>(share_array(std::move(a)));
  } else {
    static_assert(std::is_arithmetic_v<Y>, "namedax::grad: the function must return one named value or scalar");
    return Y{1};
  }
}

template <class O>
inline constexpr bool is_argnums = false;
template <std::size_t... I>
inline constexpr bool is_argnums<argnums_t<I...>> = true;

/// Whether the positions I... are all different.
template <std::size_t... I>
constexpr bool distinct_positions() {
  const std::size_t p[] = {I...};
  for (std::size_t a = 0; a < sizeof...(I); ++a)
    for (std::size_t b = a + 1; b < sizeof...(I); ++b)
      if (p[a] == p[b]) return false;
  return true;
}

/// Where argument P goes among the differentiated ones `I...`, or -1 where it is held constant.
template <std::size_t P, std::size_t... I>
constexpr int differentiated_position() {
  int k = 0, found = -1;
  ((found = (found < 0 && I == P) ? k : found, ++k), ...);
  return found;
}

/// The arguments `all` with those at the positions `I...` replaced by `traced` (in order).
template <std::size_t... I, class F, class All, class Traced>
decltype(auto) call_substituted(const F& f, const All& all, const Traced& traced) {
  return [&]<std::size_t... P>(std::index_sequence<P...>) -> decltype(auto) {
    return f([&]() -> decltype(auto) {
      constexpr int k = differentiated_position<P, I...>();
      if constexpr (k >= 0) return std::get<k>(traced);
      else return std::get<P>(all);
    }()...);
  }(std::make_index_sequence<std::tuple_size_v<All>>{});
}

/// grad and value_and_grad: differentiates `f` in the arguments at positions `I...`
/// (argnums; the first alone by default), the others constant; with HasAux, f returns
/// `(value, aux)` and aux is returned beside the gradient.
template <class F, bool WithValue, bool HasAux, std::size_t... I>
struct gradient {
  F f;

  template <class... Xs>
  auto operator()(const Xs&... xs) const {
    constexpr std::string_view verb = WithValue ? "value_and_grad" : "grad";
    constexpr bool in_range = ((I < sizeof...(Xs)) && ...);
    constexpr bool nested = (false || ... || has_traced_leaves<Xs>());
    const auto all = std::forward_as_tuple(xs...);
    if constexpr (!in_range) {
      static_assert(in_range, "namedax::grad: argnums names an argument position past the arguments given");
      return 0;  // only the assertion is reported
    } else if constexpr (nested) {
      // Only the assertion is reported: a result of the types a nested derivative would give.
      if constexpr (WithValue) {
        static_assert(higher_order_is_supported<!nested>,
                      "namedax::value_and_grad: higher-order derivatives (value_and_grad inside grad) are not "
                      "supported yet; apply the inner one to namedax::stop_gradient of its traced arguments to hold "
                      "its result constant");
      } else {
        static_assert(higher_order_is_supported<!nested>,
                      "namedax::grad: higher-order derivatives (grad of grad) are not supported yet; apply the inner "
                      "grad to namedax::stop_gradient of its traced arguments to hold its result constant");
      }
      return std::get<0>(all);
    } else {
      static_assert(distinct_positions<I...>(), "namedax::grad: argnums names an argument position twice");
      auto [y, pullback, aux] = trace_function<HasAux>(
          verb, [&](const auto&... t) { return call_substituted<I...>(f, all, std::forward_as_tuple(t...)); },
          std::get<I>(all)...);
      auto grads = pullback(ones_for(verb, y));
      auto g = [&] {
        if constexpr (sizeof...(I) == 1) return std::get<0>(std::move(grads));
        else return std::move(grads);
      }();
      if constexpr (WithValue && HasAux) return std::pair{std::pair{std::move(y), std::move(aux)}, std::move(g)};
      else if constexpr (WithValue) return std::pair{std::move(y), std::move(g)};
      else if constexpr (HasAux) return std::pair{std::move(g), std::move(aux)};
      else return g;
    }
  }
};

/// The options given to grad or value_and_grad, read into a gradient type.
template <class F, bool WithValue, bool HasAux, class Argnums, class... Options>
struct gradient_with;
template <class F, bool WithValue, bool HasAux, std::size_t... I>
struct gradient_with<F, WithValue, HasAux, argnums_t<I...>> {
  using type = gradient<F, WithValue, HasAux, I...>;
};
template <class F, bool WithValue, bool HasAux, class Argnums, std::size_t... I, class... Options>
struct gradient_with<F, WithValue, HasAux, Argnums, argnums_t<I...>, Options...>
    : gradient_with<F, WithValue, HasAux, argnums_t<I...>, Options...> {};
template <class F, bool WithValue, bool HasAux, class Argnums, class... Options>
struct gradient_with<F, WithValue, HasAux, Argnums, has_aux_t, Options...>
    : gradient_with<F, WithValue, true, Argnums, Options...> {};

/// A leaf of a gradient or tangent as a flat array of its positional elements (outside any map).
template <class L>
auto flat_elements(const L& leaf) {
  if constexpr (std::is_arithmetic_v<L>) return xt::xarray<double>(static_cast<double>(leaf));
  else if constexpr (NamedValue<L>) return xt::xarray<double>(leaf.payload());
  else return xt::xarray<double>(leaf);
}

/// A leaf's shape (outside any map): a scalar's is ().
template <class L>
std::vector<std::size_t> leaf_shape(const L& leaf) {
  if constexpr (std::is_arithmetic_v<L>) return {};
  else if constexpr (NamedValue<L>) return {leaf.payload().shape().begin(), leaf.payload().shape().end()};
  else return {leaf.shape().begin(), leaf.shape().end()};
}

/// The shapes of a pytree's leaves, in order.
template <class P>
auto leaf_shapes(const P& tree) {
  return unpack(tree_leaves(tree), [](const auto&... leaf) {
    return std::array<std::vector<std::size_t>, sizeof...(leaf)>{leaf_shape(leaf)...};
  });
}

/// The leaves of argument `argument`'s tangent as flat arrays, each checked against its
/// primal leaf's shape (`shapes`, the primal's leaf_shapes): made once for all the elements
/// of J t.
template <std::size_t N, class T>
auto flat_tangent(const std::array<std::vector<std::size_t>, N>& shapes, const T& tangent, std::size_t argument) {
  const auto t_leaves = tree_leaves(tangent);
  static_assert(N == std::tuple_size_v<decltype(t_leaves)>,
                "namedax::jvp: each tangent must have the structure of its primal");
  return [&]<std::size_t... K>(std::index_sequence<K...>) {
    return std::tuple{[&] {
      auto ts = flat_elements(std::get<K>(t_leaves));
      if (!std::equal(shapes[K].begin(), shapes[K].end(), ts.shape().begin(), ts.shape().end()))
        fail("namedax::jvp: the tangent of argument ", argument, " has shape ", ts.shape(), " but its primal has shape ",
             shapes[K]);
      return ts;
    }()...};
  }(std::make_index_sequence<N>{});
}

/// sum over the leaves of <gradient leaf, tangent leaf>: one element of J t.
template <class G, class Flats>
double pair_leaves(const G& gradient, const Flats& tangent) {
  double total = 0;
  unpack(tree_leaves(gradient), [&](const auto&... g) {
    unpack(tangent, [&](const auto&... ts) {
      (
          [&] {
            const auto gs = flat_elements(g);
            for (std::size_t k = 0; k < gs.size(); ++k) total += gs.flat(k) * ts.flat(k);
          }(),
          ...);
    });
  });
  return total;
}

/// `each(e, pullback(unit cotangent e))` for each positional element e of `value` (a named
/// value): the rows of the Jacobian. Inside a map the unit is seeded on every index at once
/// (every lane of the payload), as jax.vmap(jax.jacrev(f)) seeds each example's.
template <class Y, class Pullback, class Each>
void for_each_unit_cotangent(const Y& value, const Pullback& pullback, Each&& each) {
  using T = typename Y::value_type;
  const auto& shape = value.payload().shape();
  const std::size_t positional = shape.size() - Y::env_type::vectorized_count;
  const std::size_t elements = element_count(std::span(shape.data(), positional));
  const std::size_t lanes = element_count(std::span(shape.data() + positional, shape.size() - positional));
  for (std::size_t e = 0; e < elements; ++e) {
    xt::xarray<T> unit = xt::zeros<T>(shape);  // a new array each time: a cotangent is never written once made
    for (std::size_t lane = 0; lane < lanes; ++lane) unit.flat(e * lanes + lane) = T{1};
    each(e, pullback(Y(share_array(std::move(unit)))));
  }
}

/// A leaf of a gradient or tangent as a named value of doubles: a plain array or number as a
/// value of no map.
template <class L>
auto as_named_double(const L& leaf) {
  if constexpr (NamedValue<L>) return namedax::cast<double>(leaf);
  else return make_named<shared_array<double>, env<>, 0>(share_array(xt::xarray<double>(leaf)));
}

/// <gradient, tangent> of one argument inside a map, on each index: the sum over its leaves
/// and their positional elements of g t, a named scalar. Each tangent leaf must have its
/// gradient's (its primal's) positional shape.
template <class G, class T>
auto paired_in_map(const G& gradient, const T& tangent, std::size_t argument) {
  const auto gs = tree_leaves(gradient);
  const auto ts = tree_leaves(tangent);
  static_assert(std::tuple_size_v<decltype(gs)> == std::tuple_size_v<decltype(ts)>,
                "namedax::jvp: each tangent must have the structure of its primal");
  return [&]<std::size_t... K>(std::index_sequence<K...>) {
    auto term = [&](const auto& g, const auto& t) {
      const auto gn = as_named_double(g);
      const auto tn = as_named_double(t);
      const auto gp = positional_shape(gn), tp = positional_shape(tn);
      if (gp != tp)
        fail("namedax::jvp: the tangent of argument ", argument, " has positional shape ", tp,
             " but its primal has positional shape ", gp);
      return namedax::sum(gn * tn);
    };
    return (term(std::get<K>(gs), std::get<K>(ts)) + ...);
  }(std::make_index_sequence<std::tuple_size_v<decltype(gs)>>{});
}

/// A named scalar summed over every axis it varies along (psum), then read: the same number on
/// every index.
template <class S>
double summed_everywhere(const S& s) {
  if constexpr (S::varying != 0) {
    const auto total = namedax::psum(s, axes_of_mask<typename S::env_type, S::varying>());
    return evaluate<double>(total.payload()).flat(0);
  } else {
    return evaluate<double>(s.payload()).flat(0);
  }
}

/// J t inside a map, from f's value and pullback and `paired(grads)`, the pairing of a
/// pullback's gradients with the tangents summed over every index: element e of the result on
/// index d is the sum over every index d' and element j of dy_{d,e}/dx_{d',j} t_{d',j}, as
/// jax.jvp inside a map gives it. One pullback per element of the result and index of the axes
/// it varies along, seeded on that index alone; every index runs them all, in the same order.
template <class Y, class Pullback, class Paired>
Y jvp_in_map(const Y& value, const Pullback& pullback, const Paired& paired) {
  using T = typename Y::value_type;
  using Env = typename Y::env_type;
  constexpr auto varying = set_bits_v<Y::varying>;  // the bindings the result varies along
  const auto& held = value.payload().shape();
  dims_t shape(held.begin(), held.end());
  const std::size_t positional = shape.size() - Env::vectorized_count;
  std::array<std::size_t, varying.size()> sizes{}, own{};  // own: this device's index along a device axis
  std::size_t seeds = 1;
  for (std::size_t v = 0; v < varying.size(); ++v) {
    const std::size_t k = varying[v];
    const frame& bound = *find_frame(Env::names[k]);
    sizes[v] = bound.size, own[v] = bound.index;
    seeds *= sizes[v];
    if (Env::places[k] == placement::vectorized) shape[positional + Env::vectorized_slot(k)] = sizes[v];
  }
  const std::size_t elements = element_count(std::span(shape.data(), positional));
  const std::size_t lanes = element_count(std::span(shape.data() + positional, Env::vectorized_count));
  xt::xarray<T> out = xt::zeros<T>(shape);
  std::vector<std::size_t> seeded;  // the lanes of this index where the seed is
  for (std::size_t seed = 0; seed < seeds; ++seed) {
    std::array<std::size_t, varying.size()> at{};  // the seed's index along each varying binding
    bool here = true;
    for (std::size_t v = varying.size(), rest = seed; v-- > 0; rest /= sizes[v]) {
      at[v] = rest % sizes[v];
      const std::size_t k = varying[v];
      if (Env::places[k] != placement::vectorized) here = here && own[v] == at[v];
    }
    seeded.clear();
    for (std::size_t lane = 0; here && lane < lanes; ++lane) {
      bool match = true;
      for (std::size_t d = Env::vectorized_count, rest = lane; d-- > 0; rest /= shape[positional + d]) {
        const std::size_t coordinate = rest % shape[positional + d];
        for (std::size_t v = 0; v < varying.size(); ++v)
          if (Env::places[varying[v]] == placement::vectorized && Env::vectorized_slot(varying[v]) == d)
            match = match && coordinate == at[v];
      }
      if (match) seeded.push_back(lane);
    }
    for (std::size_t e = 0; e < elements; ++e) {
      xt::xarray<T> unit = xt::zeros<T>(shape);
      for (std::size_t lane : seeded) unit.flat(e * lanes + lane) = T{1};
      const T total = static_cast<T>(paired(pullback(Y(share_array(std::move(unit))))));
      for (std::size_t lane : seeded) out.flat(e * lanes + lane) = total;
    }
  }
  return Y(share_array(std::move(out)));
}

/// linearize_by_pullbacks outside any map, from f's vjp at the primals.
template <class Vjp, class... Ps>
auto linearize_outside_maps(Vjp value_and_pullback, const Ps&... primals) {
  using Y = typename Vjp::first_type;
  auto f_jvp = [value = value_and_pullback.first, pullback = std::move(value_and_pullback.second),
                shapes = std::tuple{leaf_shapes(primals)...}](
                   const auto&... tangents) {
    static_assert(sizeof...(tangents) == sizeof...(Ps), "namedax::linearize: give one tangent per primal");
    const auto flats = [&]<std::size_t... K>(std::index_sequence<K...>) {
      return std::make_tuple(flat_tangent(std::get<K>(shapes), tangents, K)...);  // braces would copy a lone tuple
    }(std::index_sequence_for<Ps...>{});
    auto paired = [&](const auto& grads) {
      double total = 0;
      [&]<std::size_t... K>(std::index_sequence<K...>) {
        ((total += pair_leaves(std::get<K>(grads), std::get<K>(flats))), ...);
      }(std::index_sequence_for<Ps...>{});
      return total;
    };
    if constexpr (std::is_arithmetic_v<Y>) {
      return static_cast<Y>(paired(pullback(Y{1})));
    } else {
      using T = typename Y::value_type;
      xt::xarray<T> tangent = xt::zeros<T>(leaf_shape(value));
      for_each_unit_cotangent(value, pullback,
                              [&](std::size_t k, const auto& grads) { tangent.flat(k) = static_cast<T>(paired(grads)); });
      return Y(share_array(std::move(tangent)));
    }
  };
  return std::pair{std::move(value_and_pullback.first), std::move(f_jvp)};
}

/// f's value at the primals and its linear map `t... -> J t` (jax.linearize): outside any
/// map, J t by one pullback per element of the result, each seeded with that element's unit
/// cotangent; inside a map, jvp_in_map's. The pullback is kept and called again for every
/// tangent.
template <class F, class... Ps>
auto linearize_by_pullbacks(const F& f, const Ps&... primals) {
  auto vjp = vjp_of_function(f, primals...);  // not a structured binding: clang++ 14 cannot capture one
  using Y = decltype(vjp.first);
  static_assert(std::is_arithmetic_v<Y> || NamedValue<Y>,
                "namedax::jvp and linearize: the function must return one named value, array or scalar");
  if constexpr (NamedValue<Y> && Y::env_type::size > 0) {
    auto f_jvp = [value = vjp.first, pullback = std::move(vjp.second)](const auto&... tangents) {
      static_assert(sizeof...(tangents) == sizeof...(Ps), "namedax::linearize: give one tangent per primal");
      return jvp_in_map(value, pullback, [&](const auto& grads) {
        return [&]<std::size_t... K>(std::index_sequence<K...>) {
          const auto ts = std::forward_as_tuple(tangents...);
          return (0.0 + ... + summed_everywhere(paired_in_map(std::get<K>(grads), std::get<K>(ts), K)));
        }(std::index_sequence_for<Ps...>{});
      });
    };
    return std::pair{std::move(vjp.first), std::move(f_jvp)};
  } else {
    return linearize_outside_maps(std::move(vjp), primals...);
  }
}

/// jvp: linearize, then its linear map at the tangents.
template <class F, class... Ps, class... Ts>
auto jvp_by_pullbacks(const F& f, const std::tuple<Ps...>& primals, const std::tuple<Ts...>& tangents) {
  auto [value, f_jvp] = unpack(primals, [&](const auto&... p) { return linearize_by_pullbacks(f, p...); });
  auto tangent = unpack(tangents, f_jvp);
  return std::pair{std::move(value), std::move(tangent)};
}

/// The Jacobian inside a map, from f's value and pullback at x: one pullback per positional
/// element e of the value, seeded with e's unit cotangent on every index of the map at once
/// (as jax.vmap(jax.jacrev(f)) seeds each example's), the gradients in x stacked as rows
/// before x's positional dims. A value of x's environment (T, f's element type).
template <class Y, class Pullback, class X>
auto jacobian_in_map(const Y& value, const Pullback& pullback, const X& x) {
  using T = typename Y::value_type;
  using G = std::remove_cvref_t<std::tuple_element_t<0, decltype(pullback(value))>>;
  std::vector<xt::xarray<T>> rows;
  // The rows' common shape (a dim of 1 in one row broadcasts to another's); x's, for a result
  // of no element.
  dims_t row_shape;
  if constexpr (NamedValue<X>) row_shape.assign(x.payload().shape().begin(), x.payload().shape().end());
  else for (std::size_t extent : leaf_shape(x)) row_shape.push_back(extent);
  for_each_unit_cotangent(value, pullback, [&](std::size_t e, const auto& grads) {
    if constexpr (NamedValue<G>) rows.push_back(evaluate<T>(std::get<0>(grads).payload()));
    else rows.push_back(xt::xarray<T>(std::get<0>(grads)));
    const auto& s = rows.back().shape();
    if (e == 0) row_shape.assign(s.begin(), s.end());
    for (std::size_t k = 0; k < row_shape.size(); ++k) row_shape[k] = std::max(row_shape[k], s[k]);
  });
  const auto output = positional_shape(value);
  dims_t stacked(row_shape);
  stacked.insert(stacked.begin(), output.begin(), output.end());
  xt::xarray<T> jacobian = xt::xarray<T>::from_shape(stacked);
  const std::size_t row_size = element_count(row_shape);
  for (std::size_t e = 0; e < rows.size(); ++e) {
    const xt::xarray<T> row = xt::broadcast(rows[e], row_shape);
    std::copy(row.begin(), row.end(), jacobian.data() + e * row_size);
  }
  if constexpr (NamedValue<G>) return named_like<G>(std::move(jacobian));
  else return jacobian;
}

/// jacfwd's Jacobian inside a map, from f's value and pullback at x: column j is the jvp
/// (jvp_in_map) with the unit tangent of x's positional element j on every index at once (as
/// jax.vmap(jax.jacfwd(f)) gives each example its basis), placed after the result's
/// positional dims; a named value of the result's environment.
template <class Y, class Pullback, class X>
auto forward_jacobian_in_map(const Y& value, const Pullback& pullback, const X& x) {
  using T = typename Y::value_type;
  const auto unit_tangents = [&] {  // x's shape, and a maker of the unit tangent of element j
    if constexpr (NamedValue<X>) {
      using O = owned_t<X>;
      const auto& held = x.payload().shape();
      return std::pair{positional_shape(x), [shape = dims_t(held.begin(), held.end()),
                                             vec = X::env_type::vectorized_count](std::size_t j) {
                         xt::xarray<typename O::value_type> unit = xt::zeros<typename O::value_type>(shape);
                         const std::size_t lanes = element_count(std::span(shape.data() + shape.size() - vec, vec));
                         for (std::size_t lane = 0; lane < lanes; ++lane) unit.flat(j * lanes + lane) = 1;
                         return O(share_array(std::move(unit)));
                       }};
    } else {
      const std::vector<std::size_t> shape = leaf_shape(x);
      return std::pair{shape, [shape](std::size_t j) {
                         xt::xarray<typename X::value_type> unit = xt::zeros<typename X::value_type>(shape);
                         unit.flat(j) = 1;
                         return unit;
                       }};
    }
  }();
  const std::vector<std::size_t>& input = unit_tangents.first;
  const std::size_t inputs = element_count(input);
  std::vector<xt::xarray<T>> columns;
  for (std::size_t j = 0; j < inputs; ++j) {
    const auto tangent = unit_tangents.second(j);
    const Y column = jvp_in_map(value, pullback, [&](const auto& grads) {
      return summed_everywhere(paired_in_map(std::get<0>(grads), tangent, 0));
    });
    columns.push_back(evaluate<T>(column.payload()));
  }
  const std::vector<std::size_t> output = positional_shape(value);
  const std::size_t outputs = element_count(output);
  dims_t shape(output.begin(), output.end());
  shape.insert(shape.end(), input.begin(), input.end());
  const auto& column_shape = inputs ? columns.front().shape() : value.payload().shape();
  shape.insert(shape.end(), column_shape.end() - static_cast<std::ptrdiff_t>(Y::env_type::vectorized_count), column_shape.end());
  const std::size_t lanes = element_count(std::span(shape.data() + output.size() + input.size(), Y::env_type::vectorized_count));
  xt::xarray<T> jacobian = xt::xarray<T>::from_shape(shape);
  for (std::size_t e = 0; e < outputs; ++e)
    for (std::size_t j = 0; j < inputs; ++j)
      for (std::size_t lane = 0; lane < lanes; ++lane)
        jacobian.flat((e * inputs + j) * lanes + lane) = columns[j].flat(e * lanes + lane);
  return named_like<Y>(std::move(jacobian));
}

/// The Jacobian of f in its first argument (jax.jacrev; jax.jacfwd, `Reverse` false): the
/// result's dims, then the argument's; row e is the gradient of result element e, by one
/// pullback of one vjp per element. Inside a map, jacrev's rows are jacobian_in_map's and
/// jacfwd's columns forward_jacobian_in_map's.
template <class F, bool Reverse = true>
struct jacobian {
  F f;

  template <class X, class... Rest>
  auto operator()(const X& x, const Rest&... rest) const {
    static_assert(!is_node<X>, "namedax::jacrev/jacfwd: the differentiated argument is one value (not a pytree) "
                               "for now; pass the leaves as arguments of their own");
    auto [value, pullback] = vjp_of_function([&](const auto& a) { return f(a, rest...); }, x);
    using Y = decltype(value);
    static_assert(std::is_arithmetic_v<Y> || NamedValue<Y>,
                  "namedax::jacrev/jacfwd: the function must return one named value, array or scalar");
    if constexpr (std::is_arithmetic_v<Y>) {
      return xt::xarray<Y>(flat_elements(std::get<0>(pullback(Y{1}))));
    } else if constexpr (Y::env_type::size > 0) {
      if constexpr (Reverse) return jacobian_in_map(value, pullback, x);
      else return forward_jacobian_in_map(value, pullback, x);
    } else {
      using T = typename Y::value_type;
      const std::vector<std::size_t> input = leaf_shape(x);
      const std::size_t inputs = element_count(input);
      std::vector<std::size_t> shape = leaf_shape(value);
      shape.insert(shape.end(), input.begin(), input.end());
      auto out = xt::xarray<T>::from_shape(shape);
      for_each_unit_cotangent(value, pullback, [&](std::size_t e, const auto& grads) {
        const xt::xarray<double> row = flat_elements(std::get<0>(grads));
        for (std::size_t k = 0; k < inputs; ++k) out.flat(e * inputs + k) = static_cast<T>(row.flat(k));
      });
      return out;
    }
  }
};

/// The pullback of a call recorded with its operands `xs` kept (record_call, joint_node): given
/// the result's cotangent, `backward(ct, operands...)` gives one cotangent per operand, each
/// added to its traced operand's cell among the node's parents.
template <class... Xs, class Backward>
auto call_pullback(Backward backward, const Xs&... xs) {
  return [backward = std::move(backward), ... kept = owned_operand(xs)](
             const auto& ct, const std::vector<std::shared_ptr<node>>& parents) {
    auto cotangents = backward(ct, kept...);
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      (
          [&] {
            using X = std::tuple_element_t<K, std::tuple<Xs...>>;
            if constexpr (Traced<X>)
              operand_cell<K, Xs...>(parents).accumulate(as_cotangent<typename X::primal_type>(std::get<K>(cotangents)));
          }(),
          ...);
    }(std::index_sequence_for<Xs...>{});
  };
}

/// The traced result `value` of a call on the operands `xs` whose pullback computes the call
/// again: `backward(ct, operands...)`, given the result's cotangent and the operands as the
/// call was given them (traced ones as their primals), returns one cotangent per operand. The
/// node keeps the operands, not what the call computed in between (checkpoint, a map's rule).
template <class N, class Backward, class... Xs>
traced<N> record_call(N value, Backward backward, const Xs&... xs) {
  return traced<N>(make_cell(std::move(value), traced_cells(xs...), call_pullback<Xs...>(std::move(backward), xs...)));
}

/// The node of a call's pytree result, whose leaves may differ in element type, names and
/// variance: each leaf is a cell of its own, whose pullback hands its cotangent to this node's
/// slot for it; this node, made before the leaves and so run after them, calls the call's
/// pullback once with every slot, zeros for a leaf that no cotangent reached.
template <class Pullback, class... N>
struct joint_node final : node {
  joint_node(std::tuple<N...> leaves, std::vector<std::shared_ptr<node>> operands, Pullback pb)
      : node(std::move(operands)), primals(std::move(leaves)), pullback(std::move(pb)) {}

  void propagate() override {
    const bool reached = std::apply([](const auto&... slot) { return (false || ... || slot.has_value()); }, slots);
    if (!reached) return;
    auto cotangents = [&]<std::size_t... K>(std::index_sequence<K...>) {
      return std::make_tuple((std::get<K>(slots) ? *std::get<K>(slots) : ad::zeros_like(std::get<K>(primals)))...);
    }(std::index_sequence_for<N...>{});
    pullback(cotangents, parents);
  }
  void forget() override { slots = {}; }

  std::tuple<N...> primals;
  std::tuple<std::optional<N>...> slots;
  Pullback pullback;
};

/// Whether a call's result leaf of type L is recorded, a cell of its own: a named value of
/// floating type. A leaf of integers or bools is a constant of the program, returned as it is
/// (`constant_leaf`), as trace_leaf leaves such an argument.
template <class L>
constexpr bool recorded_leaf() {
  if constexpr (NamedValue<L>) return differentiable_element<typename L::value_type>;
  else return false;
}
template <class L>
constexpr bool constant_leaf() {
  if constexpr (std::is_arithmetic_v<L>) return !differentiable_element<L>;
  else if constexpr (NamedValue<L> || PlainValue<L>) return !differentiable_element<typename L::value_type>;
  else return false;
}

/// The pullback of a joint node's leaf I: its cotangent goes to the node's slot for it.
template <std::size_t I, class Joint>
struct joint_slot {
  template <class C>
  void operator()(const C& ct, const std::vector<std::shared_ptr<node>>& parents) const {
    std::get<I>(static_cast<Joint&>(*parents[0]).slots).emplace(ct);
  }
};

/// Leaf I of a joint node's result: a cell whose parent is the node, or the leaf as it is
/// where it is a constant.
template <std::size_t I, class Values, class Joint>
auto joint_leaf(const Values& values, const std::shared_ptr<Joint>& parent) {
  using L = std::tuple_element_t<I, Values>;
  if constexpr (!recorded_leaf<L>())
    return std::get<I>(values);
  else
    return traced<L>(make_cell(std::get<I>(values), std::vector<std::shared_ptr<node>>{parent}, joint_slot<I, Joint>{}));
}

/// A result leaf as the joint node keeps it: evaluated where it is recorded, as it is otherwise.
template <class L>
auto result_value(const L& leaf) {
  if constexpr (recorded_leaf<L>()) return namedax::eval(leaf);
  else return L(leaf);
}

/// The traced result in Y's structure, of the leaves of a call's result (see joint_node): each
/// recorded leaf a cell whose parent is the joint node, each constant one as it is.
template <class Y, class Leaves, class Backward, class... Xs>
auto record_joint(const Leaves& leaves, Backward backward, const Xs&... xs) {
  return [&]<std::size_t... K>(std::index_sequence<K...>) {
    auto values = std::make_tuple(result_value(std::get<K>(leaves))...);
    auto pullback = call_pullback<Xs...>(
        [backward = std::move(backward)](auto cts, const auto&... operands) {
          return backward(tree_unflatten<Y>(cts), operands...);
        },
        xs...);
    using joint = joint_node<decltype(pullback), std::tuple_element_t<K, decltype(values)>...>;
    const auto parent = std::make_shared<joint>(values, traced_cells(xs...), std::move(pullback));
    auto traced_leaves = std::make_tuple(joint_leaf<K>(values, parent)...);
    return tree_unflatten<Y>(traced_leaves);
  }(std::make_index_sequence<leaf_count<Y>()>{});
}

/// The condition of record_result's static_assert: it prints as `leaves_are_named_values<false>`,
/// not as the leaves' types.
template <bool Named>
inline constexpr bool leaves_are_named_values = Named;

/// record_call for a result `y` that may be a pytree: one value is recorded as it is; a
/// pytree's leaves each as a cell of its own, under one joint_node that runs the pullback once.
/// `backward(ct, operands...)` gets the cotangent in y's structure.
template <class Y, class Backward, class... Xs>
auto record_result(Y y, Backward backward, const Xs&... xs) {
  using Leaves = decltype(tree_leaves(std::declval<const Y&>()));
  constexpr auto kinds = []<std::size_t... K>(std::index_sequence<K...>) {
    using namespace std;  // tuple_element_t, remove_cvref_t
    return pair{((recorded_leaf<remove_cvref_t<tuple_element_t<K, Leaves>>>() ||
                  constant_leaf<remove_cvref_t<tuple_element_t<K, Leaves>>>()) && ...),
                (false || ... || recorded_leaf<remove_cvref_t<tuple_element_t<K, Leaves>>>())};
  }(std::make_index_sequence<std::tuple_size_v<Leaves>>{});
  static_assert(leaves_are_named_values<kinds.first>, "namedax::checkpoint, custom_vjp and custom_jvp: the function must "
                                                      "return named values (one, or a pytree of them)");
  // Nothing to record where the assertion failed (it is then the one error), or where every
  // leaf is a constant.
  if constexpr (!kinds.first || !kinds.second) return y;
  else if constexpr (!is_node<Y>) return record_call(namedax::eval(std::move(y)), std::move(backward), xs...);
  else return record_joint<Y>(tree_leaves(y), std::move(backward), xs...);
}

/// A function with a derivative of its own (checkpoint, custom_vjp, custom_jvp): `f` itself
/// outside any derivative; under one, `Derived::record(xs...)`, the call recorded as one node.
/// The differentiated arguments are traced values themselves or constants, not pytrees
/// holding traced values (each becomes one operand of the node).
template <class Derived, class F>
struct own_derivative {
  F f;

  template <class... Xs>
  auto operator()(const Xs&... xs) const {
    if constexpr (!(false || ... || has_traced_leaves<Xs>())) {
      return f(xs...);
    } else {
      static_assert(((Traced<Xs> || !has_traced_leaves<Xs>()) && ...),
                    "namedax::checkpoint, custom_vjp or custom_jvp: each differentiated argument must be a traced "
                    "value itself, not a pytree holding some; pass the leaves as arguments of their own");
      return static_cast<const Derived&>(*this).record(xs...);
    }
  }
};

/// A function whose forward pass is computed again in the backward pass instead of being
/// recorded (namedax::checkpoint).
template <class F>
struct checkpointed : own_derivative<checkpointed<F>, F> {
  template <class... Xs>
  auto record(const Xs&... xs) const {
    auto y = this->f(primal_of(xs)...);  // nothing is recorded: the operands are plain values
    // The backward pass: the forward again, recorded this time, and its pullback at once.
    return record_result(
        std::move(y),
        [f = this->f](const auto& ct, const auto&... operands) {
          return std::get<1>(trace_function<false, traced_leaves_of<Xs...>>("checkpoint", f, operands...))(ct);
        },
        xs...);
  }
};

/// What a user's bwd returned, as one cotangent per argument: a tuple of as many, or, for a
/// function of one argument, the cotangent alone.
template <std::size_t Arguments, class C>
auto cotangent_tuple(C&& c) {
  using R = std::remove_cvref_t<C>;
  if constexpr (is_tuple_like<R>) {
    static_assert(std::tuple_size_v<R> == Arguments,
                  "namedax::custom_vjp: bwd must return one cotangent per argument of the function (a std::tuple, as "
                  "jax's bwd returns a tuple)");
    return std::forward<C>(c);
  } else {
    static_assert(Arguments == 1, "namedax::custom_vjp: bwd must return one cotangent per argument of the function "
                                  "(a std::tuple, as jax's bwd returns a tuple)");
    return std::make_tuple(std::forward<C>(c));
  }
}

/// A function whose pullback is its user's (namedax::custom_vjp): under a derivative, `fwd`
/// gives the result and the residuals, and the pullback is `bwd(residuals, ct)`.
template <class F, class Fwd, class Bwd>
struct custom_vjp_function : own_derivative<custom_vjp_function<F, Fwd, Bwd>, F> {
  Fwd fwd;
  Bwd bwd;

  template <class... Xs>
  auto record(const Xs&... xs) const {
    auto out = fwd(primal_of(xs)...);  // nothing is recorded: the operands are plain values
    if constexpr (!is_tuple_like<std::remove_cvref_t<decltype(out)>>) {
      static_assert(is_tuple_like<std::remove_cvref_t<decltype(out)>>,
                    "namedax::custom_vjp: fwd must return std::pair{result, residuals}, as jax's fwd returns (result, "
                    "residuals)");
      return 0;  // only the assertion is reported
    } else {
      return record_result(
          std::get<0>(std::move(out)),
          [bwd = bwd, residuals = std::get<1>(std::move(out))](const auto& ct, const auto&... operands) {
            auto cotangents = cotangent_tuple<sizeof...(Xs)>(bwd(residuals, ct));
            [&]<std::size_t... K>(std::index_sequence<K...>) {  // each differentiated argument's, before any use
              (
                  [&] {
                    if constexpr (Traced<std::tuple_element_t<K, std::tuple<Xs...>>>) {
                      auto what = [](const std::string&) {
                        return message("namedax::custom_vjp: bwd's cotangent for argument ", K);
                      };
                      check_derivative_shapes(std::get<K>(std::forward_as_tuple(operands...)), std::get<K>(cotangents),
                                              what, "the argument", "return a cotangent of each argument's shape");
                    }
                  }(),
                  ...);
            }(std::index_sequence_for<Xs...>{});
            return cotangents;
          },
          xs...);
    }
  }
};

/// A function whose derivative is its user's (namedax::custom_jvp): `jvp(primals, tangents)`
/// returns `{result, tangent}`, linear in the tangents. The pullback is that linear map's
/// transpose, taken by reverse mode: the vjp of `t -> jvp(primals, t).second` at t = 0.
template <class F, class Jvp>
struct custom_jvp_function : own_derivative<custom_jvp_function<F, Jvp>, F> {
  Jvp jvp;

  template <class... Xs>
  auto record(const Xs&... xs) const {
    return record_result(
        this->f(primal_of(xs)...),
        [jvp = jvp](const auto& ct, const auto&... primals) {
          auto tangent = [&](const auto&... t) {
            auto out = jvp(std::make_tuple(primals...), std::make_tuple(t...));
            static_assert(is_tuple_like<std::remove_cvref_t<decltype(out)>>,
                          "namedax::custom_jvp: jvp must return std::pair{result, tangent}, as jax's returns "
                          "(primal_out, tangent_out)");
            check_derivative_shapes(
                std::get<0>(out), std::get<1>(out),
                [](const std::string& result) { return message("namedax::custom_jvp: jvp's tangent", result); },
                "the result it stands for", "return a tangent of the result's shape");
            return std::get<1>(std::move(out));
          };
          auto zero = [](const auto& p) {  // the tangent at which the linear map is differentiated
            if constexpr (Operand<decltype(p)>) return namedax::zeros_like(p);
            else return p;  // a constant of another kind, not differentiated
          };
          return std::get<1>(trace_function<false, traced_leaves_of<Xs...>>("custom_jvp", tangent, zero(primals)...))(ct);
        },
        xs...);
  }
};

#if NAMEDAX_DEFINITIONS  // the bodies of the functions declared above (see detail/compilation.hpp)
NAMEDAX_DECL std::vector<node*> reverse_program(const std::vector<std::shared_ptr<node>>& outputs) {
  std::vector<node*> nodes;
  std::unordered_set<node*> seen;
  std::vector<node*> pending;
  for (const auto& o : outputs)
    if (o && seen.insert(o.get()).second) pending.push_back(o.get());
  while (!pending.empty()) {
    node* n = pending.back();
    pending.pop_back();
    nodes.push_back(n);
    for (const auto& p : n->parents)
      if (seen.insert(p.get()).second) pending.push_back(p.get());
  }
  std::sort(nodes.begin(), nodes.end(), [](const node* a, const node* b) { return a->order > b->order; });
  return nodes;
}

NAMEDAX_DECL void require_one_trace(std::string_view verb, const std::vector<node*>& nodes, std::uint64_t first) {
  // Newest first: the oldest node is the last.
  if (!nodes.empty() && nodes.back()->order < first)
    fail("namedax::", verb, ": higher-order derivatives are not supported yet: the function given to ", verb,
         " uses a traced value of an enclosing grad or vjp (captured, not passed as an argument); hold it constant "
         "with namedax::stop_gradient");
}
#endif  // NAMEDAX_DEFINITIONS

}  // namespace namedax::detail::ad

namespace namedax::detail {

// ---------------------------------------------------------------------------------------
// The collectives: the linear ones through their maps (namedax::linear), pmax and pmin to
// the indices that hold the extreme, shared equally among ties (as JAX's max reductions).

template <reduction K, bool Grouped, class Verb>
struct derivative<rule::all_reduce<K, Grouped>, Verb> {
  template <class X, std::size_t P, class... Names>
  static auto apply(const X& x, const axis_list<P, Names...>& list, const std::optional<groups_t>& groups) {
    reduce_options options{.axis_index_groups = groups ? *groups : groups_t{}};
    if constexpr (P > 0) {
      // Over positional dims first (locally), then over the names.
      constexpr auto kind = K == reduction::sum    ? ad::local_reduction::sum
                            : K == reduction::mean ? ad::local_reduction::mean
                            : K == reduction::max  ? ad::local_reduction::max
                                                   : ad::local_reduction::min;
      std::vector<int> dims(list.positional.begin(), list.positional.end());
      auto local = ad::reduce<kind>(x, dims, false, [](const auto& v, const auto& d) {
        if constexpr (kind == ad::local_reduction::sum) return namedax::sum(v, *d, {.keepdims = true});
        else if constexpr (kind == ad::local_reduction::mean) return namedax::mean(v, *d, {.keepdims = true});
        else if constexpr (kind == ad::local_reduction::max) return namedax::max(v, *d, {.keepdims = true});
        else return namedax::min(v, *d, {.keepdims = true});
      });
      if constexpr (sizeof...(Names) == 0) return local;
      else if constexpr (Grouped) return Verb{}(local, axis_list<0, Names...>{}, options);
      else return Verb{}(local, axis_list<0, Names...>{});
    } else if constexpr (K == reduction::sum) {
      return ad::linear(linear::psum_map<axis_list<P, Names...>, Grouped>{{}, list, options}, x);
    } else if constexpr (K == reduction::mean) {
      return ad::linear(linear::pmean_map<axis_list<P, Names...>, Grouped>{{}, list, options}, x);
    } else {
      // The extreme of the primal, as this all-reduce computes it (Verb may be pargmax, which
      // reduces its operand by the maximum first), and the count of ties by the same groups.
      auto reduce = [list, options]<class R, class V>(R verb, const V& v) {
        if constexpr (Grouped) return verb(v, list, options);
        else return verb(v, list);
      };
      auto y = namedax::eval(reduce(all_reduce_verb<Verb, K>{}, x.primal()));
      return ad::record(
          y,
          [reduce, y, a = x.primal()](const auto& ct, auto) {
            using T = typename std::remove_cvref_t<decltype(ct)>::value_type;
            using Env = typename X::env_type;
            auto chosen = namedax::eval(namedax::cast<T>(a == y));
            // Ties are counted along the names the operand varies along: along the others it
            // is one value, which the extreme is (pmax of a replicated value is the value).
            constexpr axis_mask varies = Env::template mask_of<Names...>() & X::varying;
            if constexpr (varies == 0) return namedax::eval(ct * chosen);
            else if constexpr (Grouped) {
              // Each group's extreme is held by every member, each with its own cotangent.
              const all_reduce_verb<Verb, reduction::sum> group_sum;
              return namedax::eval(reduce(group_sum, ct) * chosen / reduce(group_sum, chosen));
            }
            else return namedax::eval(ct * chosen / namedax::psum(chosen, axes_of_mask<Env, varies>()));
          },
          x);
    }
  }
};

template <bool Invariant, class Verb>
struct derivative<rule::all_gather<Invariant>, Verb> {
  template <class X, class A>
  static auto apply(const X& x, const A& axes, const all_gather_options& options) {
    return ad::linear(linear::all_gather_map<A, !Invariant>{{}, axes, options}, x);
  }
};

template <class Verb>
struct derivative<rule::psum_scatter, Verb> {
  template <class X, class A>
  static auto apply(const X& x, const A& axes, const psum_scatter_options& options) {
    return ad::linear(linear::psum_scatter(axes, options), x);
  }
};

template <class Verb>
struct derivative<rule::all_to_all, Verb> {
  template <class X, class A>
  static auto apply(const X& x, const A& axes, int split_axis, int concat_axis, const std::vector<std::vector<int>>& groups, bool tiled) {
    return ad::linear(linear::all_to_all(axes, split_axis, concat_axis, {.axis_index_groups = groups, .tiled = tiled}), x);
  }
};

template <class Verb>
struct derivative<rule::permute, Verb> {
  template <class X, class... Names, class PairsOf>
  static auto apply(const X& x, type_list<Names...>, const PairsOf& pairs_of) {
    using N = typename X::primal_type;
    const auto axes = describe_named_axes<N, Names...>(Verb::name);
    permutation_t pairs = pairs_of(std::span<const named_axis>(axes));
    return ad::linear(linear::ppermute(axis_list<0, Names...>{}, std::move(pairs)), x);
  }
};

template <class Verb>
struct derivative<rule::pvary, Verb> {
  template <class X, class A>
  static auto apply(const X& x, const A& axes) {
    return ad::linear(linear::pvary(axes), x);
  }
};

template <class Verb>
struct derivative<rule::pbroadcast, Verb> {
  template <class X, class A>
  static auto apply(const X& x, const A& axes, int source) {
    return ad::linear(linear::pbroadcast(axes, source), x);
  }
};

template <class Verb>
struct derivative<rule::pdot, Verb> {
  template <class X, class Y, class A>
  static auto apply(const X& x, const Y& y, const A& axes, const dimension_pairs& contract, const dimension_pairs& batch) {
    auto a = ad::owned_operand(x);
    auto b = ad::owned_operand(y);
    return ad::record(
        Verb{}(a, b, axes, contract, batch),
        [a, b, axes, contract, batch](const auto& ct, auto k) {
          if constexpr (decltype(k)::value == 0) return linear::pdot_lhs(b, axes, contract, batch).transpose_of(ct);
          else return linear::pdot_rhs(a, axes, contract, batch).transpose_of(ct);
        },
        x, y);
  }
};

/// x gathered whole along the axes of `list`, flattened as pgather numbers them (the gathered
/// positional dims first, each name's all_gather at its place among them as written), then
/// read at `idx` by take: pgather's lookup, in operations that have derivative rules. An
/// index out of range, negative ones included, reads nothing.
template <std::size_t J = 0, class X, class I, std::size_t P, class... Names>
auto gather_by_take(const X& x, const I& idx, const axis_list<P, Names...>& list) {
  if constexpr (J == 0) {  // the gathered positional dims to the front, in the order written
    const auto dims = canonical_positional("pgather", list.positional, x.dimension());
    std::vector<std::ptrdiff_t> order(dims.begin(), dims.end());
    for (std::size_t d = 0; d < x.dimension(); ++d)
      if (std::find(dims.begin(), dims.end(), d) == dims.end()) order.push_back(static_cast<std::ptrdiff_t>(d));
    return gather_by_take<1>(namedax::permute_dims(x, order), idx, list);
  } else if constexpr (J <= sizeof...(Names)) {  // name J - 1 after the positional dims written before it
    std::size_t place = J - 1;
    for (const std::size_t before : list.names_before) place += before <= J - 1 ? 1 : 0;
    using Name = std::tuple_element_t<J - 1, std::tuple<Names...>>;
    return gather_by_take<J + 1>(namedax::all_gather(x, Name{}, {.axis = static_cast<int>(place)}), idx, list);
  } else {  // the gathered dims as one, read at idx
    const std::size_t gathered = P + sizeof...(Names);
    const auto& shape = x.primal().shape();
    std::ptrdiff_t total = 1;
    std::vector<std::ptrdiff_t> flat{0};
    for (std::size_t d = 0; d < x.dimension(); ++d)
      if (d < gathered) total *= static_cast<std::ptrdiff_t>(shape[d]);
      else flat.push_back(static_cast<std::ptrdiff_t>(shape[d]));
    flat[0] = total;
    auto in_range = [&] {  // negative indices past the end, where take reads nothing too
      if constexpr (std::is_arithmetic_v<I>) return idx < 0 ? total : static_cast<std::ptrdiff_t>(idx);
      else if constexpr (NamedOperand<I>) return namedax::where(idx < 0, total, idx);
      else return xt::xarray<std::ptrdiff_t>(xt::where(idx < 0, total, idx));
    };
    return namedax::take(namedax::reshape(x, flat), in_range(), 0);
  }
}

/// pgather in src: gathered as pgather gathers; the pullback is the transpose of the same
/// lookup written as gather_by_take, found by reverse mode: each cotangent element is added
/// to the element it was read from, on the index that holds it (take's pullback, then
/// all_gather's transpose, a psum_scatter). Indices are not differentiated.
template <class Verb>
struct derivative<rule::pgather, Verb> {
  template <class S, class I, std::size_t P, class... Names>
  static auto apply(const S& src, const I& idx, const axis_list<P, Names...>& list) {
    return ad::record_call(
        namedax::eval(Verb{}(src.primal(), idx, list)),
        [idx = ad::owned_operand(idx), list](const auto& ct, const auto& s) {
          auto lookup = [&](const auto& t) { return gather_by_take(t, idx, list); };
          return std::get<1>(ad::trace_function<false>("pgather", lookup, s))(ct);
        },
        src);
  }
};

/// ragged_all_to_all, linear in the operand and the output together: in the operand, the
/// transpose of linear::ragged_all_to_all (the cotangent's rows sent back where they came
/// from); in the output, the cotangent where no sender wrote, zero where one did (the rows a
/// ragged_all_to_all of ones writes). Offsets and sizes are not differentiated.
template <class Verb>
struct derivative<rule::ragged_all_to_all, Verb> {
  template <class X, class O, class IO, class SS, class OO, class RS, class A>
  static auto apply(const X& operand, const O& output, const IO& input_offsets, const SS& send_sizes,
                    const OO& output_offsets, const RS& recv_sizes, const A& axes,
                    const ragged_all_to_all_options& options) {
    static_assert(NamedValue<IO> && NamedValue<SS> && NamedValue<OO> && NamedValue<RS>,
                  "namedax::grad: ragged_all_to_all's offsets and sizes must be named values under grad");
    auto a = ad::owned_operand(operand);
    auto b = ad::owned_operand(output);
    return ad::record(
        Verb{}(a, b, input_offsets, send_sizes, output_offsets, recv_sizes, axes, options),
        [=](const auto& ct, auto k) {
          if constexpr (decltype(k)::value == 0) {
            return linear::ragged_all_to_all(axes, input_offsets, send_sizes, output_offsets, recv_sizes,
                                             a.shape()[0], b.shape()[0], options)
                .transpose_of(ct);
          } else {
            const auto written = Verb{}(namedax::full_like(a, 1), namedax::zeros_like(b), input_offsets, send_sizes,
                                        output_offsets, recv_sizes, axes, options);
            return namedax::eval(namedax::where(written != 0, 0, ct));
          }
        },
        operand, output);
  }
};

/// For each of the `total` rows of all_gather_v(x, count, axes), where x has `block` rows: the
/// row of all_gather(x, axes, {.tiled = true}) it holds, or n * block (out of range, nothing)
/// for a row of padding. Index r's rows start after the counts of the indices before it.
template <class C, class S, class A>
auto gathered_v_rows(const C& count, const S& x, const A& axes, std::size_t total) {
  using index = std::int64_t;
  const auto per_index = [&] {  // this index's count as a named value
    if constexpr (NamedValue<C>) {
      return namedax::cast<index>(count);
    } else {
      const auto zero = namedax::cast<index>(namedax::sum(x));  // a scalar with x's names
      if constexpr (DeferredValue<C>) return namedax::eval(namedax::zeros_like(zero) + count);  // axis_index's, resolved
      else return namedax::full_like(zero, count);
    }
  }();
  const auto counts = namedax::eval(namedax::all_gather(per_index, axes));  // [n], in index order
  const auto ends = namedax::eval(namedax::cumsum(counts, 0));
  const auto n = static_cast<index>(counts.shape()[0]), rows = static_cast<index>(x.shape()[0]);
  const xt::xarray<index> row = xt::arange<index>(static_cast<index>(total)).reshape({total, std::size_t{1}});
  const xt::xarray<index> at = xt::arange<index>(n) * rows;  // where index r's block starts in the gather
  const auto starts = namedax::eval(ends - counts);
  const auto holds = namedax::eval(starts <= row && row < ends);  // [total, n]: output row j comes from index r
  const auto from = namedax::sum(namedax::where(holds, at + (row - starts), index{0}), 1);
  return namedax::eval(namedax::where(namedax::any(holds, 1), from, n * rows));
}

/// all_gather_v in x: the pullback is the transpose of the same gather written as take over x
/// gathered whole (all_gather, tiled), reading the rows the counts name (gathered_v_rows),
/// found by reverse mode: each row's cotangent goes back to the row it came from, on the index
/// that holds it (take's pullback, then all_gather's transpose), and x's rows past its count
/// get zero. The counts are not differentiated.
template <class Verb>
struct derivative<rule::all_gather_v, Verb> {
  template <class X, class C, class A>
  static auto apply(const X& x, const C& count, const A& axes) {
    auto y = namedax::eval(Verb{}(x.primal(), count, axes));
    const std::size_t total = y.shape()[0];
    return ad::record_call(
        std::move(y),
        [count = ad::owned_operand(count), axes, total](const auto& ct, const auto& s) {
          const auto rows = gathered_v_rows(count, s, axes, total);
          auto gather = [&](const auto& t) { return namedax::take(namedax::all_gather(t, axes, {.tiled = true}), rows, 0); };
          return std::get<1>(ad::trace_function<false>("all_gather_v", gather, s))(ct);
        },
        x);
  }
};

/// vmap, pmap and shard_map differentiated through (grad outside the map, JAX's training
/// step): the forward map runs on the primals; its pullback is the map of the function's
/// pullback, over the primals again and the result's cotangent (in_axes and out_axes, or
/// in_specs and out_specs, swapped for the cotangents, as JAX's shard_map transpose does),
/// each index running the function's forward again under vjp, as checkpoint does. The
/// gradient of an unmapped (replicated) argument comes back summed over the axes, by the
/// pairing (a replicated value's cotangent is the sum of its uses). A pytree result's leaves
/// share one joint node, so the backward map runs once (record_result). Inside another map
/// (grad inside the outer one) the result is named in the outer map's environment, and the
/// backward map runs on each of its indices.
template <class Verb>
struct derivative<rule::map, Verb> {
  template <class Map, class... Xs>
  static auto apply(const Map& map, const Xs&... xs) {
    using arguments = std::tuple<Xs...>;
    const std::tuple<const Xs&...> given(xs...);
    const auto leaves = tree_leaves(given);  // the node's operands: every leaf, traced or not
    const auto entries = spread_prefix<arguments>(map.in_axes());  // one entry per leaf
    const auto& f = map.function();
    auto y = map(primals(xs)...);  // the forward, on the primals
    // Outside every map the result's leaves are plain arrays: recorded as named values of no map.
    constexpr bool plain = PlainValue<std::tuple_element_t<0, decltype(tree_leaves(y))>>;
    auto as_named = [](auto leaf) {
      using T = typename decltype(leaf)::value_type;
      if constexpr (plain && ad::differentiable_element<T>)
        return named<shared_array<T>, env<>, 0>(share_array(xt::xarray<T>(std::move(leaf))));
      else
        return leaf;  // a constant leaf (integers, bools) is returned as the map returns it
    };
    // The map of the pullback, on the leaves of the arguments (their primals) and the result's
    // cotangent, mapped as the forward's leaves and result were; it returns the cotangent of
    // each traced leaf, stacked as the leaf was. Only the leaves the forward was given traced
    // are traced again: f gets every other argument as the forward gave it.
    using traced_leaves = ad::traced_leaves_of<Xs...>;
    auto backward = map.remapped(
        [f](const auto&... leaves_and_ct) {
          auto all = std::forward_as_tuple(leaves_and_ct...);
          auto args = tree_unflatten<arguments>(all);
          auto call = unpack(args, [&](const auto&... a) { return ad::trace_function<false, traced_leaves>("vjp", f, a...); });
          const auto cotangents = std::get<1>(call)(std::get<sizeof...(leaves_and_ct) - 1>(all));
          return ad::at_set_flags<traced_leaves>(tree_leaves(cotangents));
        },
        std::tuple_cat(entries, std::make_tuple(map.out_axes())),  // make_tuple: a pair of specs stays one
        ad::at_set_flags<traced_leaves>(entries));
    auto result = [&] {
      if constexpr (is_node<decltype(y)>) return detail::tree_map(y, as_named);
      else return as_named(std::move(y));  // one array: moved, not copied
    }();
    return unpack(leaves, [&](const auto&... leaf) {
      return ad::record_result(
          std::move(result),
          [backward](const auto& ct, const auto&... operands) {
            auto payloads = [](const auto& c) {
              if constexpr (NamedValue<std::remove_cvref_t<decltype(c)>>) return c.payload();
              else return c;  // a constant leaf's zeros, a plain array already
            };
            // One cotangent per operand, a placeholder for each that is not traced (not read).
            if constexpr (plain) return ad::from_set_flags<traced_leaves>(backward(operands..., detail::tree_map(ct, payloads)));
            else return ad::from_set_flags<traced_leaves>(backward(operands..., ct));
          },
          leaf...);
    });
  }

 private:
  /// An argument with its traced leaves replaced by their primals: a leaf as it is (not copied).
  template <class X>
  static decltype(auto) primals(const X& x) {
    if constexpr (is_node<X>) return detail::tree_map(x, [](const auto& leaf) { return ad::owned_operand(leaf); });
    else return ad::primal_of(x);
  }
};

template <class Verb>
struct derivative<rule::structural, Verb> {
  /// y = op(xs...) picks, for each of its elements, one element of one operand (or none: a
  /// pad). The same op on the operands' positions says which: operand k's are numbered from
  /// the sum of the sizes before it (-1 for an operand not differentiated). The pullback adds
  /// each element of the cotangent at the position it came from. An op that must tell
  /// positions from values (pad's fill) sees them as int64 values.
  template <class Op, class... Xs>
  static auto apply(const Op& op, const Xs&... xs) {
    std::array<std::int64_t, sizeof...(Xs)> offsets{};
    std::array<std::vector<std::size_t>, sizeof...(Xs)> shapes;
    std::int64_t next = 0;
    std::size_t k = 0;
    auto numbered = [&](const auto& x) {
      const auto& a = ad::primal_of(x);
      using A = std::remove_cvref_t<decltype(a)>;
      using Env = typename env_of<A>::type;
      if constexpr (NamedValue<A>) shapes[k] = a.shape();
      else shapes[k].assign(a.shape().begin(), a.shape().end());
      const auto count = static_cast<std::int64_t>(
          std::accumulate(shapes[k].begin(), shapes[k].end(), std::size_t{1}, std::multiplies<>()));
      std::vector<std::size_t> shape = shapes[k];
      shape.resize(shape.size() + Env::vectorized_count, 1);
      xt::xarray<std::int64_t> positions = xt::arange<std::int64_t>(next, next + count);
      if constexpr (!Traced<decltype(x)>) positions.fill(-1);
      positions.reshape(shape);
      offsets[k++] = next;
      next += count;
      return make_named<shared_array<std::int64_t>, Env, 0>(share_array(std::move(positions)));
    };
    // Braced: the operands are numbered in order.
    auto positions = std::tuple{numbered(xs)...};
    auto source = namedax::eval(unpack(positions, op));
    return ad::record(op(ad::primal_of(xs)...), [source, offsets, shapes](const auto& ct, auto k) {
      constexpr std::size_t K = decltype(k)::value;
      return ad::add_at(ct, source, offsets[K], shapes[K]);
    }, xs...);
  }
};

template <class Verb>
struct derivative<rule::einsum, Verb> {
  /// The local product of xeinsum (positional subscripts only; the names are psums around it).
  /// It is linear in each operand: operand k's pullback is the product of the cotangent and
  /// the other operands, out to k's subscripts; a subscript of k that no other operand and
  /// not the output has was summed in k alone, so the cotangent is broadcast along it (a ones
  /// operand of that extent).
  template <std::size_t N, class... Xs>
  static auto apply(const std::array<std::string_view, N>& subscripts, std::string_view output, const Xs&... xs) {
    auto operands = std::make_tuple(ad::owned_operand(xs)...);
    std::array<std::string, N> subs;
    for (std::size_t k = 0; k < N; ++k) {
      subs[k] = subscripts[k];
      for (std::size_t d = 0; d < subs[k].size(); ++d)
        if (subs[k].find(subs[k][d], d + 1) != std::string::npos)
          fail("namedax::grad: xeinsum with a subscript repeated in one operand ('", subs[k],
               "') has no derivative rule; take the diagonal first");
    }
    auto y = unpack(operands,
        [&](const auto&... a) { return local_einsum(Verb::name, std::span<const std::string_view>(subscripts), output, a...); });
    return ad::record(
        y,
        [operands, subs, out = std::string(output)](const auto& ct, auto k) {
          constexpr std::size_t K = decltype(k)::value;
          using T = typename std::remove_cvref_t<decltype(ct)>::value_type;
          const auto& operand = std::get<K>(operands);
          std::vector<std::size_t> shape = [&] {
            if constexpr (NamedValue<std::remove_cvref_t<decltype(operand)>>) return operand.shape();
            else return std::vector<std::size_t>(operand.shape().begin(), operand.shape().end());
          }();
          std::string others = out;
          for (std::size_t j = 0; j < N; ++j)
            if (j != K) others += subs[j];
          std::string alone;
          std::vector<std::size_t> alone_shape;
          for (std::size_t d = 0; d < subs[K].size(); ++d)
            if (others.find(subs[K][d]) == std::string::npos) alone += subs[K][d], alone_shape.push_back(shape[d]);
          xt::xarray<T> ones = xt::ones<T>(alone_shape);
          std::vector<std::string_view> specs{out};
          for (std::size_t j = 0; j < N; ++j)
            if (j != K) specs.emplace_back(subs[j]);
          specs.emplace_back(alone);
          return [&]<std::size_t... J>(std::index_sequence<J...>) {
            return local_einsum("transpose of xeinsum", specs, subs[K], ct, std::get<J < K ? J : J + 1>(operands)..., ones);
          }(std::make_index_sequence<N - 1>{});
        },
        xs...);
  }
};

template <class Verb>
struct derivative<rule::collective_matmul, Verb> {
  /// all_gather_matmul (G x) w and matmul_reduce_scatter S(x w), G an all_gather and S a
  /// psum_scatter along the axis, tiled over rows. In x: the linear map's transpose (the other
  /// collective matmul, by w transposed). In w: (G x)^T ct, and x^T (S^T ct).
  template <class X, class W, class A>
  static auto apply(const X& x, const W& w, const A& axis, const collective_matmul_options& options) {
    auto a = ad::owned_operand(x);
    auto b = ad::owned_operand(w);
    constexpr bool gathers = std::is_same_v<Verb, all_gather_matmul_fn>;
    return ad::record(
        Verb{}(a, b, axis, options),
        [a, b, axis, options](const auto& ct, auto k) {
          if constexpr (decltype(k)::value == 0) {
            if constexpr (gathers) return linear::all_gather_matmul(b, axis, options).transpose_of(ct);
            else return linear::matmul_reduce_scatter(b, axis, options).transpose_of(ct);
          } else if constexpr (gathers) {
            auto rows = namedax::all_gather(a, axis, {.axis = 0, .tiled = true});
            return namedax::pdot(rows, ct, namedax::axes(), {{0}, {0}});
          } else {
            auto [y, pullback] = vjp_of(linear::psum_scatter(axis, {.scatter_dimension = 0, .tiled = true}),
                                        namedax::pdot(a, b, namedax::axes(), {{1}, {0}}));
            return namedax::pdot(a, pullback(ct), namedax::axes(), {{0}, {0}});
          }
        },
        x, w);
  }
};

}  // namespace namedax::detail
