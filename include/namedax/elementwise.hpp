// SPDX-License-Identifier: MIT
// Elementwise operations on named values: operators, xtensor's math functions, where, cast.
// Each broadcasts by name: the result varies along every name its operands vary along.
#pragma once

#include <namedax/detail/elementwise.hpp>
#include <namedax/named_array.hpp>

namespace namedax {

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


}  // namespace namedax

#undef NAMEDAX_FWD
