// SPDX-License-Identifier: MIT
// The options of the collectives (JAX's keyword arguments, as designated-initializer
// structs), compile-time permutations for ppermute, and pcast's targets.
#pragma once

#include <algorithm>
#include <array>
#include <string_view>
#include <utility>
#include <vector>

namespace namedax {

/// Options of psum, pmean, pmax and pmin (JAX's keyword arguments).
struct reduce_options {
  /// Reduce within each group of axis indices; the groups must partition 0..N-1.
  std::vector<std::vector<int>> axis_index_groups{};
};

/// Options of all_gather (JAX's keyword arguments).
struct all_gather_options {
  std::vector<std::vector<int>> axis_index_groups{};  ///< gather within each group; equal sizes
  int axis = 0;                                     ///< where the gathered axis goes (tiled: which axis grows)
  bool tiled = false;                               ///< concatenate along `axis` instead of stacking
};

namespace without_groups {
/// What all_gather's options bind to when written without groups (`{.axis = 1, .tiled = true}`,
/// `{}`): the result is then known at compile time to be the same along the gathered axes.
/// Written as braces, never by name; compilers name it where the braces are wrong (fields
/// out of their declared order: `.axis`, then `.tiled`).
struct all_gather_options {
  int axis = 0;        ///< where the gathered axis goes (tiled: which axis grows)
  bool tiled = false;  ///< concatenate along `axis` instead of stacking
};
}  // namespace without_groups

/// Options of all_gather_invariant: all_gather's without groups, as JAX's all_gather_invariant
/// takes none (each group would gather its own value, which is not the same on every index).
struct all_gather_invariant_options {
  int axis = 0;        ///< where the gathered axis goes (tiled: which axis grows)
  bool tiled = false;  ///< concatenate along `axis` instead of stacking
};

/// Options of psum_scatter (JAX's keyword arguments).
struct psum_scatter_options {
  int scatter_dimension = 0;                        ///< the positional axis split among the indices
  std::vector<std::vector<int>> axis_index_groups{};  ///< reduce-scatter within each group; equal sizes
  bool tiled = false;                               ///< keep scatter_dimension, divided, instead of removing it
};

/// Options of all_to_all (JAX's keyword arguments).
struct all_to_all_options {
  std::vector<std::vector<int>> axis_index_groups{};  ///< exchange within each group; equal sizes
  bool tiled = false;  ///< split split_axis into chunks and concatenate them along concat_axis
};

/// Options of pswapaxes.
struct pswapaxes_options {
  std::vector<std::vector<int>> axis_index_groups{};  ///< swap within each group; equal sizes
};

/// Options of all_gather_matmul and matmul_reduce_scatter.
struct collective_matmul_options {
  /// Use both directions of the ring: blocks (or partial sums) travel to the next and to the
  /// previous index at once, so the ring takes n / 2 steps instead of n - 1, each moving two
  /// blocks, one over each link direction.
  bool bidirectional = false;
};

/// A permutation known at compile time, as flat (source, destination) pairs:
/// `ppermute(x, "i"_ax, namedax::static_perm<0, 1, 1, 2, 2, 0>)`. Repeated or negative
/// indices do not compile, nor indices past a static axis size (`vmap<"i", 3>`).
template <int... SourceDestination>
struct static_permutation {
  static constexpr std::array<int, sizeof...(SourceDestination)> flat{SourceDestination...};
  static constexpr bool pairs_complete = sizeof...(SourceDestination) % 2 == 0;
  static constexpr bool nonnegative = ((SourceDestination >= 0) && ...);
  static constexpr bool unique_at(std::size_t offset) {
    for (std::size_t a = offset; a < flat.size(); a += 2)
      for (std::size_t b = a + 2; b < flat.size(); b += 2)
        if (flat[a] == flat[b]) return false;
    return true;
  }
  static constexpr bool sources_unique = unique_at(0);
  static constexpr bool destinations_unique = unique_at(1);
  static constexpr int largest = std::max({0, SourceDestination...});
  static std::vector<std::pair<int, int>> pairs() {
    std::vector<std::pair<int, int>> out;
    for (std::size_t k = 0; k + 1 < flat.size(); k += 2) out.emplace_back(flat[k], flat[k + 1]);
    return out;
  }
};
template <int... SourceDestination>
inline constexpr static_permutation<SourceDestination...> static_perm{};
namespace detail {
template <class T>
inline constexpr bool is_static_permutation = false;
template <int... P>
inline constexpr bool is_static_permutation<static_permutation<P...>> = true;
}  // namespace detail
/// A static_perm<...>. Taken as a deduced type, so that braces (`ppermute(x, "i"_ax, {})`, an
/// empty permutation) pick the runtime pairs rather than an empty static one.
template <class T>
concept StaticPermutation = detail::is_static_permutation<T>;
/// The targets of pcast, as JAX's `to` strings: `pcast(x, "i"_ax, pcast_to::varying)`.
/// namedax types a value as varying or invariant along each name; JAX's `reduced` and
/// `unreduced` have no type here, so a cast to them does not compile (see pcast).
namespace pcast_to {
struct varying_t {
  static constexpr std::string_view name = "varying";
};
struct reduced_t {
  static constexpr std::string_view name = "reduced";
};
struct unreduced_t {
  static constexpr std::string_view name = "unreduced";
};
inline constexpr varying_t varying{};
inline constexpr reduced_t reduced{};
inline constexpr unreduced_t unreduced{};
}  // namespace pcast_to

}  // namespace namedax
