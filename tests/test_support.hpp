// SPDX-License-Identifier: MIT
// Helpers shared by the runtime tests: bitwise comparison and random inputs.
#pragma once

#include <namedax/namedax.hpp>

#include <doctest/doctest.h>
#include <xtensor/xio.hpp>
#include <xtensor/xrandom.hpp>

#include <cstring>
#include <random>
#include <sstream>

namespace namedax_test {

/// Same shape and the same bits in every element (so NaN equals NaN, and 0.1 + 0.2 is exact).
template <class A, class B>
bool bitwise_equal(const A& a, const B& b) {
  xt::xarray<typename A::value_type> x = a;
  xt::xarray<typename B::value_type> y = b;
  static_assert(std::is_same_v<typename A::value_type, typename B::value_type>);
  if (x.shape() != y.shape()) return false;
  // An empty array's data() may be null, which memcmp must not be given.
  return x.size() == 0 || std::memcmp(x.data(), y.data(), x.size() * sizeof(typename A::value_type)) == 0;
}

/// bitwise_equal leaf by leaf, for tuples and pairs of arrays (nested too).
template <class A, class B>
bool tree_bitwise_equal(const A& a, const B& b) {
  if constexpr (requires { std::tuple_size<A>::value; }) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return (tree_bitwise_equal(std::get<I>(a), std::get<I>(b)) && ...);
    }(std::make_index_sequence<std::tuple_size_v<A>>{});
  } else {
    return bitwise_equal(a, b);
  }
}

template <class A>
std::string show(const A& a) {
  std::ostringstream out;
  out << a;
  return out.str();
}

/// Runs `f` mapped along "i" in both modes.
template <class F, class... Args>
auto both_modes(F f, const Args&... args) {
  return std::pair{namedax::vmap<"i">(f)(args...), namedax::pmap<"i">(f)(args...)};
}

/// The message of the namedax::error that `f` throws, or "no error".
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const namedax::error& e) {
    return e.what();
  }
  return "no error";
}

/// The outcome of comparing two arrays bitwise: true, or false with both arrays shown, which
/// doctest prints as the check's value when it fails.
struct bitwise_comparison {
  bool equal;
  std::string shown;  // "a vs b", only when not equal
  explicit operator bool() const { return equal; }
  friend std::ostream& operator<<(std::ostream& out, const bitwise_comparison& c) { return out << c.shown; }
};

template <class A, class B>
bitwise_comparison compare_bitwise(const A& a, const B& b) {
  if (bitwise_equal(a, b)) return {true, {}};
  return {false, show(a) + " vs " + show(b)};
}

// A plain CHECK, not CHECK_MESSAGE: doctest builds a message in a lambda, and clang before 16
// cannot capture structured bindings in one, so `auto [v, p] = ...; CHECK_BITWISE(v, p);` would
// not compile. Each argument is evaluated once.
#define CHECK_BITWISE(a, b) CHECK(::namedax_test::compare_bitwise(a, b))

/// A random array of `shape` with values that make floating-point sums order-sensitive.
template <class T>
xt::xarray<T> random_array(std::mt19937& rng, const std::vector<std::size_t>& shape) {
  xt::xarray<T> a = xt::xarray<T>::from_shape(shape);
  std::uniform_real_distribution<double> real(-1e3, 1e3);
  std::uniform_int_distribution<int> integer(-50, 50);
  for (auto& v : a) {
    if constexpr (std::is_same_v<T, bool>) v = integer(rng) > 0;
    else if constexpr (std::is_integral_v<T>) v = static_cast<T>(integer(rng));
    else v = static_cast<T>(real(rng) * std::pow(10.0, integer(rng) % 4));
  }
  return a;
}

/// The reference of an operation per index: `ref` applied to the slices of `args` at every
/// index of their `Leading` leading dims, the results stacked along those dims (what a map of
/// the operation must give).
template <std::size_t Leading, class Ref, class First, class... Args>
auto per_index(Ref ref, const First& first, const Args&... args) {
  static_assert(Leading == 1 || Leading == 2);
  auto at = [&](const auto&... index) {
    // The slices outlive the expression `ref` returns, which may refer to them; evaluated into
    // an xarray, since xt::eval picks a fixed rank from the shape type's capacity, wrongly.
    auto slices = std::tuple{xt::xarray<typename First::value_type>(xt::view(first, index...)),
                             xt::xarray<typename Args::value_type>(xt::view(args, index...))...};
    auto r = std::apply(ref, slices);
    return xt::xarray<typename decltype(r)::value_type>(r);
  };
  using R = decltype(at(std::size_t{0}, std::size_t{0}));
  std::vector<R> parts;
  const std::size_t outer = first.shape()[0], inner = Leading == 2 ? first.shape()[1] : 1;
  for (std::size_t a = 0; a < outer; ++a)
    for (std::size_t b = 0; b < inner; ++b) parts.push_back(Leading == 2 ? at(a, b) : at(a));
  std::vector<std::size_t> shape{outer};
  if (Leading == 2) shape.push_back(inner);
  const auto& part = parts.at(0);
  shape.insert(shape.end(), part.shape().begin(), part.shape().end());
  xt::xarray<typename R::value_type> out = xt::xarray<typename R::value_type>::from_shape(shape);
  for (std::size_t k = 0; k < parts.size(); ++k) {
    REQUIRE(parts[k].shape() == part.shape());
    std::copy(parts[k].begin(), parts[k].end(), out.begin() + static_cast<std::ptrdiff_t>(k * part.size()));
  }
  return out;
}

/// Checks that `f`, mapped over the leading dims of `args` in every placement, gives `ref`
/// applied per index, bit for bit: vmap and pmap over "i" (dim 0), and the 2-D meshes "i" x
/// "j" (dims 0 and 1) as vmap of vmap (two vectorized dims in one payload) and pmap of vmap
/// (devices, each with a vectorized dim). The other two meshes hold their payloads as one of
/// these does (pmap of pmap as pmap, vmap of pmap as pmap of vmap), and each map costs compile
/// time. `args` need two leading dims; each placement is named in the failure it reports.
template <class F, class Ref, class... Args>
void check_every_placement(F f, Ref ref, const Args&... args) {
  using namedax::pmap;
  using namedax::vmap;
  const auto one = per_index<1>(ref, args...);
  const auto two = per_index<2>(ref, args...);
  auto check = [](std::string placement, const auto& got, const auto& expected) {
    INFO("placement: ", placement);
    CHECK_BITWISE(got, expected);
  };
  check("vmap<i>", vmap<"i">(f)(args...), one);
  check("pmap<i>", pmap<"i">(f)(args...), one);
  check("vmap<i>(vmap<j>)", vmap<"i">(vmap<"j">(f))(args...), two);
  check("pmap<i>(vmap<j>)", pmap<"i">(vmap<"j">(f))(args...), two);
}

/// A random shape of `rank` dims, each of 1 to `largest` elements.
inline std::vector<std::size_t> random_shape(std::mt19937& rng, std::size_t rank, std::size_t largest = 5) {
  std::uniform_int_distribution<std::size_t> extent(1, largest);
  std::vector<std::size_t> shape(rank);
  for (auto& e : shape) e = extent(rng);
  return shape;
}

}  // namespace namedax_test
