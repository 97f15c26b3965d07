// SPDX-License-Identifier: MIT
// Local reductions and scans (namedax/reductions.hpp): each operation on random shapes and
// dtypes, in every placement, bit for bit against a plain loop over each index's slice that
// accumulates in index order; then keepdims, ties, NaN, wrapping, axis_index operands and
// errors. Table driven: one mapped function per (input type, result type) runs every operation
// of that result type, chosen at run time, so that the file compiles in reasonable time.
#include "test_support.hpp"

#include <namedax/reductions.hpp>

#include <algorithm>
#include <cmath>
#include <complex>
#include <limits>
#include <numeric>

using namespace namedax::literals;
using namedax_test::check_every_placement;
using namedax_test::error_of;

namespace {

enum class op {
  sum, prod, mean, max, min, any, all, argmax, argmin, logsumexp,  // reductions
  cumsum, cumprod, softmax, log_softmax, sort, argsort, top_k_values, top_k_indices  // along one dim
};

const char* name_of(op o) {
  static const char* names[] = {"sum",    "prod",    "mean",    "max",         "min",  "any",
                                "all",    "argmax",  "argmin",  "logsumexp",   "cumsum", "cumprod",
                                "softmax", "log_softmax", "sort", "argsort", "top_k values", "top_k indices"};
  return names[static_cast<int>(o)];
}

bool is_reduction(op o) { return o <= op::logsumexp; }

/// One call: the operation, its dims (or all of them), keepdims, and top_k's k.
struct spec {
  op o;
  std::vector<int> dims;
  bool all_dims = false;
  bool keepdims = false;
  int k = 0;
};

// The result types, written out as jax.numpy's rules say (not taken from the library).
template <class V>
using summed = std::conditional_t<std::is_same_v<V, bool> || (std::is_integral_v<V> && sizeof(V) < 4), std::int32_t, V>;
template <class V>
using inexact = std::conditional_t<std::is_floating_point_v<V>, V, float>;

template <class V>
struct result_types {
  static bool of(op o, auto tag) {
    using R = typename decltype(tag)::type;
    switch (o) {
      case op::sum: case op::prod: case op::cumsum: case op::cumprod: return std::is_same_v<R, summed<V>>;
      case op::mean: case op::logsumexp: case op::softmax: case op::log_softmax: return std::is_same_v<R, inexact<V>>;
      case op::max: case op::min: case op::sort: case op::top_k_values: return std::is_same_v<R, V>;
      case op::any: case op::all: return std::is_same_v<R, bool>;
      default: return std::is_same_v<R, std::int32_t>;
    }
  }
};

/// The mapped function: runs the operation `s` names among those whose result type is R
/// (each evaluated, so that every branch returns one type).
template <class V, class R>
struct call {
  spec s;
  template <class X>
  auto operator()(const X& x) const {
    namedax::reduction_options o{.keepdims = s.keepdims};
    auto reduce = [&](auto verb) {
      if (s.all_dims) return namedax::eval(verb(x, o));
      if (s.dims.size() == 1 && s.o != op::sum) return namedax::eval(verb(x, s.dims[0], o));
      return namedax::eval(verb(x, s.dims, o));
    };
    if constexpr (std::is_same_v<R, summed<V>>) {
      if (s.o == op::sum) return reduce([](const auto& y, auto... a) { return namedax::sum(y, a...); });
      if (s.o == op::prod) return reduce([](const auto& y, auto... a) { return namedax::prod(y, a...); });
      if (s.o == op::cumsum) return s.all_dims ? namedax::eval(namedax::cumsum(x)) : namedax::eval(namedax::cumsum(x, s.dims[0]));
      if (s.o == op::cumprod) return s.all_dims ? namedax::eval(namedax::cumprod(x)) : namedax::eval(namedax::cumprod(x, s.dims[0]));
    }
    if constexpr (std::is_same_v<R, inexact<V>>) {
      if (s.o == op::mean) return reduce([](const auto& y, auto... a) { return namedax::mean(y, a...); });
      if (s.o == op::logsumexp) return reduce([](const auto& y, auto... a) { return namedax::logsumexp(y, a...); });
      if (s.o == op::softmax) return namedax::eval(namedax::softmax(x, s.dims[0]));
      if (s.o == op::log_softmax) return namedax::eval(namedax::log_softmax(x, s.dims[0]));
    }
    if constexpr (std::is_same_v<R, V>) {
      if (s.o == op::max) return reduce([](const auto& y, auto... a) { return namedax::max(y, a...); });
      if (s.o == op::min) return reduce([](const auto& y, auto... a) { return namedax::min(y, a...); });
      if (s.o == op::sort) return namedax::eval(namedax::sort(x, s.dims[0]));
      if (s.o == op::top_k_values) return namedax::eval(namedax::top_k(x, s.k).first);
    }
    if constexpr (std::is_same_v<R, bool>) {
      if (s.o == op::any) return reduce([](const auto& y, auto... a) { return namedax::any(y, a...); });
      if (s.o == op::all) return reduce([](const auto& y, auto... a) { return namedax::all(y, a...); });
    }
    if constexpr (std::is_same_v<R, std::int32_t>) {
      if (s.o == op::argmax) return s.all_dims ? namedax::eval(namedax::argmax(x, o)) : namedax::eval(namedax::argmax(x, s.dims[0], o));
      if (s.o == op::argmin) return s.all_dims ? namedax::eval(namedax::argmin(x, o)) : namedax::eval(namedax::argmin(x, s.dims[0], o));
      if (s.o == op::argsort) return namedax::eval(namedax::argsort(x, s.dims[0]));
      if (s.o == op::top_k_indices) return namedax::eval(namedax::top_k(x, s.k).second);
    }
    throw std::logic_error(std::string("no branch for ") + name_of(s.o));
  }
};

// ---- the reference: plain loops over one index's slice ----

template <class T>
bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) return std::isnan(v);
  else return false;
}

/// a + b and a * b wrapping as two's complement integers do.
template <class T>
T add(T a, T b) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
    return static_cast<T>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
  else return a + b;
}
template <class T>
T multiply(T a, T b) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
    return static_cast<T>(static_cast<std::uint64_t>(a) * static_cast<std::uint64_t>(b));
  else if constexpr (std::is_same_v<T, bool>) return a && b;
  else return a * b;
}

/// max of `xs` in index order: a NaN anywhere gives NaN; equal values keep the first.
template <class T>
T max_of(const std::vector<T>& xs) {
  T m = xs[0];
  for (T v : xs) {
    if (is_nan(v)) return v;
    if (m < v) m = v;
  }
  return m;
}
template <class T>
T min_of(const std::vector<T>& xs) {
  T m = xs[0];
  for (T v : xs) {
    if (is_nan(v)) return v;
    if (v < m) m = v;
  }
  return m;
}

/// The elements of `a` grouped by their index over the dims not in `dims`, each group in
/// row-major order over `dims`: what one output element of a reduction combines.
template <class V>
std::vector<std::vector<V>> groups_of(const xt::xarray<V>& a, const std::vector<std::size_t>& dims,
                                      std::vector<std::size_t>& kept_shape) {
  const std::size_t rank = a.dimension();
  kept_shape.clear();
  for (std::size_t d = 0; d < rank; ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) kept_shape.push_back(a.shape()[d]);
  std::size_t kept_size = 1;
  for (auto e : kept_shape) kept_size *= e;
  std::vector<std::vector<V>> groups(kept_size);
  std::vector<std::size_t> index(rank, 0);
  for (std::size_t flat = 0; flat < a.size(); ++flat) {
    std::size_t rest = flat, out = 0;
    for (std::size_t d = rank; d-- > 0;) index[d] = rest % a.shape()[d], rest /= a.shape()[d];
    for (std::size_t d = 0; d < rank; ++d)
      if (std::find(dims.begin(), dims.end(), d) == dims.end()) out = out * a.shape()[d] + index[d];
    groups[out].push_back(a.data()[flat]);
  }
  return groups;
}

/// Canonical dims, sorted: negative ones count from the end.
std::vector<std::size_t> canonical(const spec& s, std::size_t rank) {
  std::vector<std::size_t> out;
  if (s.all_dims) {
    for (std::size_t d = 0; d < rank; ++d) out.push_back(d);
  } else {
    for (int d : s.dims) out.push_back(static_cast<std::size_t>(d < 0 ? d + static_cast<int>(rank) : d));
  }
  std::sort(out.begin(), out.end());
  return out;
}

template <class V, class R>
R reduce_group(op o, const std::vector<V>& xs) {
  using F = inexact<V>;
  const std::size_t n = xs.size();
  switch (o) {
    case op::sum: {
      R acc = n ? static_cast<R>(xs[0]) : R{0};
      for (std::size_t j = 1; j < n; ++j) acc = add(acc, static_cast<R>(xs[j]));
      return acc;
    }
    case op::prod: {
      R acc = n ? static_cast<R>(xs[0]) : R{1};
      for (std::size_t j = 1; j < n; ++j) acc = multiply(acc, static_cast<R>(xs[j]));
      return acc;
    }
    case op::mean: {
      F acc = n ? static_cast<F>(xs[0]) : F{0};
      for (std::size_t j = 1; j < n; ++j) acc = acc + static_cast<F>(xs[j]);
      return static_cast<R>(acc / static_cast<F>(n));
    }
    case op::max: return static_cast<R>(max_of(xs));
    case op::min: return static_cast<R>(min_of(xs));
    case op::any: return static_cast<R>(std::any_of(xs.begin(), xs.end(), [](V v) { return static_cast<bool>(v); }));
    case op::all: return static_cast<R>(std::all_of(xs.begin(), xs.end(), [](V v) { return static_cast<bool>(v); }));
    case op::argmax:
    case op::argmin: {
      for (std::size_t j = 0; j < n; ++j)
        if (is_nan(xs[j])) return static_cast<R>(j);
      std::size_t at = 0;
      for (std::size_t j = 1; j < n; ++j)
        if (o == op::argmax ? xs[at] < xs[j] : xs[j] < xs[at]) at = j;
      return static_cast<R>(at);
    }
    case op::logsumexp: {
      std::vector<F> f(xs.begin(), xs.end());
      F m = n ? max_of(f) : -std::numeric_limits<F>::infinity();
      if (!std::isfinite(m)) m = 0;
      F s = 0;
      for (F v : f) s += std::exp(v - m);
      return static_cast<R>(std::log(std::abs(s)) + m);
    }
    default: throw std::logic_error("not a reduction");
  }
}

/// One line along a dim, transformed.
template <class V, class R>
std::vector<R> transform_line(const spec& s, const std::vector<V>& xs) {
  using F = inexact<V>;
  const std::size_t n = xs.size();
  std::vector<R> out;
  if (n == 0) return out;
  auto nan_last = [&] {  // indices: numbers in stable ascending order, then NaNs in order
    std::vector<std::int32_t> numbers, nans;
    for (std::size_t j = 0; j < n; ++j) (is_nan(xs[j]) ? nans : numbers).push_back(static_cast<std::int32_t>(j));
    std::stable_sort(numbers.begin(), numbers.end(), [&](std::int32_t a, std::int32_t b) { return xs[a] < xs[b]; });
    numbers.insert(numbers.end(), nans.begin(), nans.end());
    return numbers;
  };
  switch (s.o) {
    case op::cumsum:
    case op::cumprod: {
      R acc{};
      for (std::size_t j = 0; j < n; ++j) {
        const R v = static_cast<R>(xs[j]);
        acc = j == 0 ? v : s.o == op::cumsum ? add(acc, v) : multiply(acc, v);
        out.push_back(acc);
      }
      return out;
    }
    case op::softmax:
    case op::log_softmax: {
      std::vector<F> f(xs.begin(), xs.end());
      const F m = max_of(f);
      F sum = 0;
      for (F v : f) sum += std::exp(v - m);
      for (F v : f) out.push_back(static_cast<R>(s.o == op::softmax ? std::exp(v - m) / sum : (v - m) - std::log(sum)));
      return out;
    }
    case op::sort:
      for (auto j : nan_last()) out.push_back(static_cast<R>(xs[j]));
      return out;
    case op::argsort:
      for (auto j : nan_last()) out.push_back(static_cast<R>(j));
      return out;
    case op::top_k_values:
    case op::top_k_indices: {
      // Descending: NaNs first (in index order), then numbers, equal ones in index order.
      std::vector<std::int32_t> order, numbers;
      for (std::size_t j = 0; j < n; ++j) (is_nan(xs[j]) ? order : numbers).push_back(static_cast<std::int32_t>(j));
      std::stable_sort(numbers.begin(), numbers.end(), [&](std::int32_t a, std::int32_t b) { return xs[b] < xs[a]; });
      order.insert(order.end(), numbers.begin(), numbers.end());
      for (int j = 0; j < s.k; ++j) out.push_back(s.o == op::top_k_values ? static_cast<R>(xs[order[j]]) : static_cast<R>(order[j]));
      return out;
    }
    default: throw std::logic_error("not along a dim");
  }
}

template <class V, class R>
struct reference {
  spec s;
  xt::xarray<R> operator()(const xt::xarray<V>& a) const {
    const std::size_t rank = a.dimension();
    std::vector<std::size_t> kept;
    if (is_reduction(s.o)) {
      const auto dims = canonical(s, rank);
      const auto groups = groups_of(a, dims, kept);
      std::vector<std::size_t> shape = kept;
      if (s.keepdims) {
        shape.assign(a.shape().begin(), a.shape().end());
        for (auto d : dims) shape[d] = 1;
      }
      xt::xarray<R> out = xt::xarray<R>::from_shape(shape);
      for (std::size_t k = 0; k < groups.size(); ++k) out.data()[k] = reduce_group<V, R>(s.o, groups[k]);
      return out;
    }
    // Along one dim: flattened first when no dim is given (cumsum's axis=None).
    xt::xarray<V> b = a;
    if (s.all_dims) b.reshape({a.size()});
    const std::size_t d = canonical(s, b.dimension()).at(0);
    const auto lines = groups_of(b, {d}, kept);
    std::vector<std::size_t> shape(b.shape().begin(), b.shape().end());
    if (s.o == op::top_k_values || s.o == op::top_k_indices) shape[d] = static_cast<std::size_t>(s.k);
    xt::xarray<R> out = xt::xarray<R>::from_shape(shape);
    std::vector<std::vector<R>> results;
    for (const auto& l : lines) results.push_back(transform_line<V, R>(s, l));
    std::vector<std::size_t> index(shape.size(), 0);
    for (std::size_t flat = 0; flat < out.size(); ++flat) {
      std::size_t rest = flat, line = 0;
      for (std::size_t e = shape.size(); e-- > 0;) index[e] = rest % shape[e], rest /= shape[e];
      for (std::size_t e = 0; e < shape.size(); ++e)
        if (e != d) line = line * shape[e] + index[e];
      out.data()[flat] = results[line][index[d]];  // element j = index[d] of its line
    }
    return out;
  }
};

// ---- random cases ----

enum class flavor { plain, ties, nan };

/// Random values: plain (order-sensitive floats), ties (a handful of values, zeros of both
/// signs among them), or with NaNs mixed in.
template <class V>
xt::xarray<V> sample(std::mt19937& rng, const std::vector<std::size_t>& shape, flavor f) {
  auto a = namedax_test::random_array<V>(rng, shape);
  std::uniform_int_distribution<int> pick(0, 9);
  for (auto& v : a) {
    if (f == flavor::ties) {
      const int p = pick(rng);
      if constexpr (std::is_floating_point_v<V>) v = p < 2 ? V(-0.0) : p < 4 ? V(0) : static_cast<V>(p % 3);
      else v = static_cast<V>(p % 3);
    } else if (f == flavor::nan) {
      if constexpr (std::is_floating_point_v<V>)
        if (pick(rng) < 2) v = std::numeric_limits<V>::quiet_NaN();
    }
  }
  return a;
}

std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string out = "(";
  for (auto e : shape) out += std::to_string(e) + ",";
  return out + ")";
}

/// Whether the operation has a value for an empty reduction (else JAX raises).
bool has_identity(op o) { return o != op::max && o != op::min && o != op::argmax && o != op::argmin; }

/// Random specs of operation `o` on a random shape: dims (one or several, sometimes
/// negative, sometimes all), keepdims, k; leading dims 1-3 x 1-3 for the placements.
template <class V, class R>
void check_random(op o, std::mt19937& rng, int trials) {
  std::uniform_int_distribution<int> coin(0, 1), percent(0, 99);
  for (int t = 0; t < trials; ++t) {
    spec s{o, {}};
    const bool along = !is_reduction(o);
    const bool top_k = o == op::top_k_values || o == op::top_k_indices;
    std::size_t rank = std::uniform_int_distribution<std::size_t>(along ? 1 : 0, 3)(rng);
    auto positional = namedax_test::random_shape(rng, rank, 5);
    if (has_identity(o) && !top_k && rank > 0 && percent(rng) < 10) positional[rng() % rank] = 0;
    const bool several = o != op::argmax && o != op::argmin && !along;
    if (rank == 0 || (percent(rng) < 20 && o != op::softmax && o != op::log_softmax && o != op::sort && o != op::argsort && !top_k)) {
      s.all_dims = true;
    } else if (top_k) {
      s.dims = {-1};
      s.k = std::uniform_int_distribution<int>(0, static_cast<int>(positional.back()))(rng);
    } else {
      std::vector<int> dims(rank);
      std::iota(dims.begin(), dims.end(), 0);
      std::shuffle(dims.begin(), dims.end(), rng);
      dims.resize(several ? std::uniform_int_distribution<std::size_t>(1, rank)(rng) : 1);
      // All negative or all not: a single map sees one more positional dim (the inner
      // mapped one), where a mix could name one dim twice.
      if (coin(rng))
        for (int& d : dims) d -= static_cast<int>(rank);
      s.dims = dims;
    }
    s.keepdims = !along && coin(rng);
    std::vector<std::size_t> shape{std::size_t(1 + rng() % 3), std::size_t(1 + rng() % 3)};
    shape.insert(shape.end(), positional.begin(), positional.end());
    const auto f = static_cast<flavor>(rng() % 3);
    const auto x = sample<V>(rng, shape, f);
    std::string dims;
    for (int d : s.dims) dims += std::to_string(d) + " ";
    INFO(std::string(name_of(o)), " on ", std::string(typeid(V).name()), " of shape ", shape_text(shape), ", dims ",
         s.all_dims ? std::string("all") : dims, s.keepdims ? "keepdims" : "", " k=", s.k, " flavor ",
         static_cast<int>(f));
    check_every_placement(call<V, R>{s}, reference<V, R>{s}, x);
  }
}

template <class V>
void check_all_ops(std::initializer_list<op> ops, int trials = 6) {
  std::mt19937 rng(1234 + sizeof(V));
  for (op o : ops) {
    if (result_types<V>::of(o, std::type_identity<summed<V>>{})) check_random<V, summed<V>>(o, rng, trials);
    else if (result_types<V>::of(o, std::type_identity<inexact<V>>{})) check_random<V, inexact<V>>(o, rng, trials);
    else if (result_types<V>::of(o, std::type_identity<V>{})) check_random<V, V>(o, rng, trials);
    else if (result_types<V>::of(o, std::type_identity<bool>{})) check_random<V, bool>(o, rng, trials);
    else check_random<V, std::int32_t>(o, rng, trials);
  }
}

constexpr std::initializer_list<op> every_op = {
    op::sum,    op::prod,    op::mean,    op::max,         op::min,  op::any,     op::all,
    op::argmax, op::argmin,  op::logsumexp, op::cumsum,    op::cumprod, op::softmax, op::log_softmax,
    op::sort,   op::argsort, op::top_k_values, op::top_k_indices};

}  // namespace

TEST_CASE("reductions and scans agree with a plain loop in every placement: float32") { check_all_ops<float>(every_op); }
TEST_CASE("reductions and scans agree with a plain loop in every placement: float64") { check_all_ops<double>(every_op); }
TEST_CASE("reductions and scans agree with a plain loop in every placement: int32") {
  check_all_ops<std::int32_t>({op::sum, op::prod, op::mean, op::max, op::min, op::any, op::all, op::argmax, op::argmin,
                               op::logsumexp, op::cumsum, op::cumprod, op::sort, op::argsort, op::top_k_values,
                               op::top_k_indices});
}
TEST_CASE("reductions and scans agree with a plain loop in every placement: int8") {
  check_all_ops<std::int8_t>({op::sum, op::prod, op::mean, op::max, op::min, op::argmax, op::argmin, op::cumsum,
                              op::cumprod, op::sort, op::argsort});
}
TEST_CASE("reductions and scans agree with a plain loop in every placement: bool") {
  check_all_ops<bool>({op::sum, op::prod, op::mean, op::max, op::min, op::any, op::all, op::argmax, op::argmin,
                       op::cumsum});
}

TEST_CASE("documented values: keepdims, dims given several ways, the jnp dtypes") {
  // jnp.sum(x, axis=0) of [[1, 2], [3, 4]] is [4, 6]; with keepdims=True, [[4, 6]].
  xt::xarray<float> x = {{{1, 2}, {3, 4}}, {{5, 6}, {7, 8}}};  // two mapped slices
  auto kept = [](auto v) { return namedax::sum(v, 0, {.keepdims = true}); };
  auto [a, b] = namedax_test::both_modes(kept, x);
  xt::xarray<float> sums = {{{4, 6}}, {{12, 14}}};
  CHECK_BITWISE(a, sums);
  CHECK_BITWISE(b, sums);
  // Every positional dim: none given, a braced list in any order, a vector, negative dims.
  auto forms = [](auto v) {
    auto all = namedax::sum(v);
    auto listed = namedax::sum(v, {1, 0});
    auto vector = namedax::sum(v, std::vector<int>{-1, -2});
    auto kept_all = namedax::mean(v, {.keepdims = true});
    return std::tuple{all, listed, vector, kept_all};
  };
  auto [all, listed, vector, kept_all] = namedax::vmap<"i">(forms)(x);
  xt::xarray<float> totals = {10, 26};
  CHECK_BITWISE(all, totals);
  CHECK_BITWISE(listed, totals);
  CHECK_BITWISE(vector, totals);
  xt::xarray<float> means = xt::xarray<float>::from_shape({2, 1, 1});
  means(0, 0, 0) = 2.5f, means(1, 0, 0) = 6.5f;
  CHECK_BITWISE(kept_all, means);
  // jnp.mean of ints is float32; jnp.argmax gives int32; jnp.any gives bool.
  xt::xarray<std::int32_t> ints = {{1, 2}, {3, 4}};
  auto types = [](auto v) { return std::tuple{namedax::mean(v, 0), namedax::argmax(v, 0), namedax::any(v, 0)}; };
  auto [mean, arg, any] = namedax::pmap<"i">(types)(ints);
  CHECK_BITWISE(mean, (xt::xarray<float>{1.5f, 3.5f}));
  CHECK_BITWISE(arg, (xt::xarray<std::int32_t>{1, 1}));
  CHECK_BITWISE(any, (xt::xarray<bool>{true, true}));
  // jnp.mean of complex64 is complex64.
  using C = std::complex<float>;
  const xt::xarray<C> complexes = {{C(1, 2), C(3, 0)}, {C(0, -4), C(2, 2)}};
  auto [cv, cp] = namedax_test::both_modes([](auto v) { return namedax::mean(v, 0); }, complexes);
  static_assert(std::is_same_v<decltype(cv)::value_type, C>);
  CHECK_BITWISE(cv, (xt::xarray<C>{C(2, 1), C(1, -1)}));
  CHECK_BITWISE(cp, cv);
}

TEST_CASE("integer sums: int8 widens to int32 as in jnp, int32 wraps") {
  xt::xarray<std::int8_t> small = {{100, 100, 100}};
  auto widen = [](auto v) { return std::tuple{namedax::sum(v, 0), namedax::cumsum(v, 0)}; };
  auto [sum, running] = namedax::vmap<"i">(widen)(small);
  CHECK_BITWISE(sum, (xt::xarray<std::int32_t>{300}));
  CHECK_BITWISE(running, (xt::xarray<std::int32_t>{{100, 200, 300}}));
  constexpr std::int32_t big = std::numeric_limits<std::int32_t>::max();
  xt::xarray<std::int32_t> large = {{big, 1}, {big, big}};
  auto wrap = [](auto v) { return namedax::sum(v, 0); };
  auto [a, b] = namedax_test::both_modes(wrap, large);
  xt::xarray<std::int32_t> wrapped = {std::numeric_limits<std::int32_t>::min(), -2};
  CHECK_BITWISE(a, wrapped);
  CHECK_BITWISE(b, wrapped);
}

TEST_CASE("argmax, argmin, sort and top_k: ties to the lower index, NaN as JAX") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  xt::xarray<float> x = {{3, 1, 3, 1}, {2, nan, 5, nan}};
  auto picks = [](auto v) {
    auto [values, indices] = namedax::top_k(v, 3);
    return std::tuple{namedax::argmax(v, 0), namedax::argmin(v, 0), namedax::sort(v), namedax::argsort(v), values, indices};
  };
  for (int mode = 0; mode < 2; ++mode) {
    auto r = mode == 0 ? namedax::vmap<"i">(picks)(x) : namedax::pmap<"i">(picks)(x);
    CHECK_BITWISE(std::get<0>(r), (xt::xarray<std::int32_t>{0, 1}));  // first of the ties; the first NaN
    CHECK_BITWISE(std::get<1>(r), (xt::xarray<std::int32_t>{1, 1}));
    CHECK_BITWISE(std::get<2>(r), (xt::xarray<float>{{1, 1, 3, 3}, {2, 5, nan, nan}}));
    CHECK_BITWISE(std::get<3>(r), (xt::xarray<std::int32_t>{{1, 3, 0, 2}, {0, 2, 1, 3}}));
    CHECK_BITWISE(std::get<4>(r), (xt::xarray<float>{{3, 3, 1}, {nan, nan, 5}}));
    CHECK_BITWISE(std::get<5>(r), (xt::xarray<std::int32_t>{{0, 2, 1}, {1, 3, 2}}));
  }
}

TEST_CASE("softmax, log_softmax and logsumexp: stable for large and infinite inputs") {
  const float inf = std::numeric_limits<float>::infinity();
  xt::xarray<float> x = {{1000, 1000}, {-inf, -inf}};
  auto f = [](auto v) { return std::tuple{namedax::softmax(v), namedax::log_softmax(v), namedax::logsumexp(v, -1)}; };
  auto [soft, log_soft, lse] = namedax::vmap<"i">(f)(x);
  CHECK(soft(0, 0) == 0.5f);
  CHECK(log_soft(0, 1) == -std::log(2.f));
  CHECK(lse(0) == 1000 + std::log(2.f));
  CHECK(lse(1) == -inf);  // the max is not finite: replaced by 0, and log(0)
  CHECK(std::isnan(soft(1, 0)));  // as jax.nn.softmax: -inf - -inf
}

TEST_CASE("an axis_index operand") {
  std::mt19937 rng(7);
  xt::xarray<float> x = namedax_test::random_array<float>(rng, {3, 4, 2});
  auto f = [](auto v) { return namedax::sum(namedax::axis_index("i"_ax) * v, 0); };
  auto [a, b] = namedax_test::both_modes(f, x);
  xt::xarray<float> expected = xt::xarray<float>::from_shape({3, 2});
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t c = 0; c < 2; ++c) {
      float acc = static_cast<float>(i) * x(i, 0, c);
      for (std::size_t r = 1; r < 4; ++r) acc += static_cast<float>(i) * x(i, r, c);
      expected(i, c) = acc;
    }
  CHECK_BITWISE(a, expected);
  CHECK_BITWISE(b, expected);
  // Alone, axis_index waits for its environment: so does its reduction, until it meets one.
  auto alone = [](auto v) { return namedax::sum(namedax::axis_index("i"_ax)) + 0.f * namedax::sum(v); };
  auto [c, d] = namedax_test::both_modes(alone, x);
  CHECK_BITWISE(c, (xt::xarray<float>{0, 1, 2}));
  CHECK_BITWISE(d, (xt::xarray<float>{0, 1, 2}));
}

TEST_CASE("errors name the operation, the dims and the sizes") {
  xt::xarray<float> x = xt::zeros<float>({2, 3, 4});
  CHECK(error_of([&] { namedax::vmap<"i">([](auto v) { return namedax::sum(v, 2); })(x); }) ==
        "namedax::sum: dim 2 is out of range for a value of positional shape (3, 4); use a dim in [-2, 2)");
  CHECK(error_of([&] { namedax::pmap<"i">([](auto v) { return namedax::sum(v, {0, -2}); })(x); }) ==
        "namedax::sum: dim -2 is given twice; list each dim once");
  CHECK(error_of([&] { namedax::vmap<"i">([](auto v) { return namedax::top_k(v, 5).first; })(x); }) ==
        "namedax::top_k: k = 5 is out of range for a last dim of size 4 (positional shape (3, 4)); use 0 <= k <= 4");
  CHECK(error_of([&] { namedax::pmap<"i">([](auto v) { return namedax::softmax(v, -3); })(x); }) ==
        "namedax::softmax: dim -3 is out of range for a value of positional shape (3, 4); use a dim in [-2, 2)");
  xt::xarray<float> empty = xt::zeros<float>({2, 0, 4});
  CHECK(error_of([&] { namedax::vmap<"i">([](auto v) { return namedax::max(v, 0); })(empty); }) ==
        "namedax::max: dim 0 of positional shape (0, 4) is empty and max has no identity; reduce a non-empty dim, "
        "or mask the value first");
  CHECK(error_of([&] { namedax::pmap<"i">([](auto v) { return namedax::argmax(v); })(empty); }) ==
        "namedax::argmax: dim 0 of positional shape (0, 4) is empty and argmax has no identity; reduce a non-empty "
        "dim, or mask the value first");
  // Reductions with an identity accept empty dims: sum 0, prod 1.
  auto identities = [](auto v) { return std::tuple{namedax::sum(v, 0), namedax::prod(v, 0)}; };
  auto [zero, one] = namedax::vmap<"i">(identities)(empty);
  CHECK_BITWISE(zero, (xt::xarray<float>(xt::zeros<float>({2, 4}))));
  CHECK_BITWISE(one, (xt::xarray<float>(xt::ones<float>({2, 4}))));
}

// The verbs take named values only: plain calls keep their meaning.
template <class A>
concept summable = requires(A a) { namedax::sum(a, 0); };
template <class A>
concept has_max = requires(A a) { namedax::max(a); };
static_assert(!summable<xt::xarray<float>> && !has_max<float>);
TEST_CASE("plain calls of max, min and sum are not ambiguous") {
  using namespace namedax;
  using std::max;
  CHECK(max(1, 2) == 2);
  CHECK(std::min(1.f, 2.f) == 1.f);
}
