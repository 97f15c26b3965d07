// SPDX-License-Identifier: MIT
// Pytrees for users: std::tuple, std::pair, std::array and Boost.Hana structs of values,
// nested, as maps, collectives and grad take them.
#pragma once

#include <namedax/detail/pytree.hpp>
#include <namedax/detail/unpack.hpp>

#include <cstddef>
#include <tuple>
#include <utility>

namespace namedax {

/// `tree_map(f, tree, rest...)`: a pytree shaped as `tree` whose leaves are `f(leaf, leaves
/// of rest...)`, the trees of `rest` having `tree`'s structure, as jax.tree.map. An SGD step
/// over a pytree of parameters and its gradient:
///   params = namedax::tree_map([&](const auto& p, const auto& g) { return namedax::eval(p - rate * g); }, params, grads);
template <class F, class Tree, class... Rest>
auto tree_map(F&& f, const Tree& tree, const Rest&... rest) {
  static_assert(((detail::leaf_count<Tree>() == detail::leaf_count<Rest>()) && ...),
                "namedax::tree_map: the trees must have the same structure (as many leaves)");
  const auto leaves = detail::tree_leaves(tree);
  const auto others = std::make_tuple(detail::tree_leaves(rest)...);  // not std::tuple{}: one tree stays one
  auto mapped = [&]<std::size_t... K>(std::index_sequence<K...>) {
    auto leaf = [&]<std::size_t I>(std::integral_constant<std::size_t, I>) {
      return detail::unpack(others, [&](const auto&... o) { return f(std::get<I>(leaves), std::get<I>(o)...); });
    };
    return std::make_tuple(leaf(std::integral_constant<std::size_t, K>{})...);
  }(std::make_index_sequence<detail::leaf_count<Tree>()>{});
  return detail::tree_unflatten<Tree>(mapped);
}

}  // namespace namedax
