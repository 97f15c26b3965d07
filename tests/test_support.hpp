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

#define CHECK_BITWISE(a, b) CHECK_MESSAGE(::namedax_test::bitwise_equal(a, b), ::namedax_test::show(a), " vs ", ::namedax_test::show(b))

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
