// SPDX-License-Identifier: MIT
// The digamma function psi(x) = d/dx log Gamma(x), which neither the standard library nor
// xtensor offers: the derivative of lgamma (and, times Gamma, of tgamma).
// IWYU pragma: private, include <namedax/autodiff.hpp>
#pragma once

#include <cmath>
#include <limits>
#include <numbers>

namespace namedax::detail {

/// psi(x) in double, within about 1e-15 relative away from its zeros: the recurrence
/// psi(x) = psi(x + 1) - 1/x lifts x to 10 or more, where the asymptotic series
/// ln x - 1/(2x) - sum B_2n / (2n x^2n), to the x^-12 term, is exact to double precision; a
/// negative x uses the reflection psi(x) = psi(1 - x) - pi cot(pi x). NaN at the poles
/// (0 and the negative integers) and for NaN; +inf at +inf.
inline double digamma(double x) {
  if (std::isnan(x) || (x <= 0 && x == std::floor(x))) return std::numeric_limits<double>::quiet_NaN();
  double result = 0;
  if (x < 0) {
    // cot has period 1: reduce first, so that pi x stays small and exact enough.
    const double r = x - std::floor(x);
    result = -std::numbers::pi / std::tan(std::numbers::pi * r);
    x = 1 - x;
  }
  for (; x < 10; x += 1) result -= 1 / x;
  const double inv = 1 / x;
  const double inv2 = inv * inv;
  // Bernoulli numbers over 2n: 1/12, -1/120, 1/252, -1/240, 1/132, -691/32760.
  const double series =
      inv2 * (1.0 / 12 - inv2 * (1.0 / 120 - inv2 * (1.0 / 252 - inv2 * (1.0 / 240 - inv2 * (1.0 / 132 - inv2 * (691.0 / 32760))))));
  return result + std::log(x) - 0.5 * inv - series;
}

/// digamma as a function object on one element of any floating type (computed in double).
struct digamma_fun {
  template <class T>
  T operator()(T x) const {
    return static_cast<T>(digamma(static_cast<double>(x)));
  }
};

}  // namespace namedax::detail
