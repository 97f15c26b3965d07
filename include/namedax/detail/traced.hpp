// SPDX-License-Identifier: MIT
// What the collectives need to know of reverse-mode differentiation: the traced value's
// name and the hook through which each collective's pytree walk hands a traced leaf to its
// derivative rule (detail/autodiff.hpp, which defines the rules).
// IWYU pragma: private, include <namedax/autodiff.hpp>
#pragma once

#include <namedax/concepts.hpp>
#include <namedax/detail/pytree.hpp>

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

namespace namedax {

template <class N>
class traced;

/// A named value recorded for reverse-mode differentiation (namedax::grad, namedax::vjp).
template <class T>
concept Traced = requires { typename std::remove_cvref_t<T>::traced_tag; };

namespace detail {
/// Whether a pytree of type X has a traced leaf: an argument of a function that an enclosing
/// grad or vjp is differentiating.
template <class X>
constexpr bool has_traced_leaves() {
  using leaves = decltype(tree_leaves(std::declval<const X&>()));
  return []<std::size_t... K>(std::index_sequence<K...>) {
    return (false || ... || Traced<std::tuple_element_t<K, leaves>>);
  }(std::make_index_sequence<std::tuple_size_v<leaves>>{});
}

/// The condition of the static_assert of an operation with no derivative rule, given
/// `!Traced<X>`: clang++ prints it as `has_derivative_rule<false>`, where `always_false<X>`
/// would spell out the whole traced type on the first error line.
template <bool Has>
inline constexpr bool has_derivative_rule = Has;

/// The derivative of collective `Verb` on a traced leaf: specialized, per pytree walk, in
/// detail/autodiff.hpp. `Rule` names the walk (all_gather, all_to_all, ...); `Verb` keeps the
/// name errors are reported under and makes the lookup wait for the instantiation.
template <class Rule, class Verb>
struct derivative;

/// `V`, as a type that depends on `Dep`: a verb's own rule is then looked up when the verb is
/// instantiated, after detail/autodiff.hpp has defined it.
template <class Dep, class V>
struct dependent {
  using type = V;
};

/// A collective's pytree walk, leaf by leaf: a traced leaf goes to the derivative rule of
/// `Rule` with `rule_args`, every other leaf to `body`, the walk's own code. The arguments are
/// held by reference: use the result within the walk's call.
template <class Rule, class Verb, class Body, class... RuleArgs>
auto traced_to_rule(const Body& body, const RuleArgs&... rule_args) {
  return [&](const auto& leaf) {
    // The rule's type depends on the leaf's, so that it is needed only for a traced leaf: a
    // unit that never differentiates need not include detail/autodiff.hpp (clang++ looks up
    // names that do not depend on the lambda's parameter when the walk is instantiated).
    using rule_of_leaf = typename dependent<decltype(leaf), derivative<Rule, Verb>>::type;
    if constexpr (Traced<decltype(leaf)>) return rule_of_leaf::apply(leaf, rule_args...);
    else return body(leaf);
  };
}

namespace rule {
template <auto Kind, bool Grouped>
struct all_reduce;
template <bool Invariant>
struct all_gather;
struct psum_scatter;
struct all_to_all;
struct permute;
struct pvary;
struct pbroadcast;
struct pdot;
struct pgather;
struct ragged_all_to_all;
struct all_gather_v;
struct einsum;
struct collective_matmul;
struct structural;
struct map;
}  // namespace rule

namespace ad {
/// (f(xs...), its pullback), for any function of named values (namedax::vjp).
template <class F, class... Xs>
auto vjp_of_function(const F& f, const Xs&... xs);
}  // namespace ad
}  // namespace detail
}  // namespace namedax
