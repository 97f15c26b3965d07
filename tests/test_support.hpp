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
  return std::memcmp(x.data(), y.data(), x.size() * sizeof(typename A::value_type)) == 0;
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

}  // namespace namedax_test
