// SPDX-License-Identifier: MIT
// The body of shard_map: partition specs as compile-time layouts, the arguments' dims split
// into (mesh axes..., block) by strided views, one map per mesh axis nested in mesh order,
// and the results' stacked dims merged back by a reshape.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <namedax/detail/map.hpp>
#include <namedax/detail/unpack.hpp>

#include <xtensor/xadapt.hpp>

#include <array>
#include <string_view>

namespace namedax {

/// The mesh axes one dim of a partition spec is split over, major to minor (none: not split).
template <Axis... Names>
struct spec_dim {
  static constexpr std::size_t count = sizeof...(Names);
};

/// A partition spec (JAX's `PartitionSpec`): for each leading positional dim of a value, the
/// mesh axes it is split over; dims past the last entry are not split.
template <class... Dims>
struct partition_spec {
  static constexpr std::size_t rank = sizeof...(Dims);
};

/// Named by the first error line when a partition spec names an axis the mesh does not have.
template <Axis A>
struct partition_spec_names_axis_not_in_mesh;
/// Named by the first error line when a partition spec names a mesh axis twice.
template <Axis A>
struct partition_spec_names_mesh_axis_twice;
/// Named by the first error line when a spec has more entries than argument `Leaf` has dims.
template <std::size_t Leaf, std::size_t SpecEntries, std::size_t ArgumentRank>
struct partition_spec_has_more_entries_than_the_argument_has_dims;
/// Named by the first error line when result leaf `Leaf` varies along a mesh axis that its
/// out spec does not name: its blocks differ, and the spec keeps one.
template <Axis A, std::size_t Leaf>
struct out_spec_omits_axis_the_result_varies_along;

namespace detail {

template <class Entry>
struct spec_dim_of {
  static_assert(always_false<Entry>, "namedax::P: each entry is namedax::none, an axis (\"data\"_ax) or several "
                                     "axes (namedax::axes(\"data\"_ax, \"model\"_ax))");
};
template <>
struct spec_dim_of<none_t> {
  using type = spec_dim<>;
};
template <Axis A>
struct spec_dim_of<A> {
  using type = spec_dim<canonical_axis_t<A>>;
};
template <std::size_t Positional, class... Names>
struct spec_dim_of<axis_list<Positional, Names...>> {
  static_assert(Positional == 0, "namedax::P: a partition spec names mesh axes only, no positional ints");
  using type = spec_dim<canonical_axis_t<Names>...>;
};

template <class Spec>
inline constexpr bool is_partition_spec = false;
template <class... Dims>
inline constexpr bool is_partition_spec<partition_spec<Dims...>> = true;

template <class... Names>
constexpr void append_names(spec_dim<Names...>*, std::string_view* out, std::size_t& k) {
  ((out[k++] = Names::name), ...);
}

/// Where a spec puts its mesh axes in the layout that splits each spec'd dim into (its mesh
/// axes..., its block): their names in order, their positions, and the dim each splits.
template <class Spec>
struct spec_layout;
template <class... Dims>
struct spec_layout<partition_spec<Dims...>> {
  static constexpr std::size_t named = (Dims::count + ... + 0);
  static constexpr auto names = [] {
    std::array<std::string_view, named> all{};
    [[maybe_unused]] std::size_t k = 0;
    (append_names(static_cast<Dims*>(nullptr), all.data(), k), ...);
    return all;
  }();
  static constexpr std::array<std::size_t, sizeof...(Dims)> counts{Dims::count...};
  /// Position of each name in the split layout, and the positional dim it splits.
  static constexpr auto positions = [] {
    std::array<std::size_t, named> at{};
    std::size_t k = 0, position = 0;
    for (std::size_t count : counts) {
      for (std::size_t j = 0; j < count; ++j) at[k++] = position++;
      ++position;  // the block
    }
    return at;
  }();
  static constexpr auto dims = [] {
    std::array<std::size_t, named> of{};
    std::size_t k = 0;
    for (std::size_t d = 0; d < counts.size(); ++d)
      for (std::size_t j = 0; j < counts[d]; ++j) of[k++] = d;
    return of;
  }();

  /// The in_axes / out_axes position of mesh axis `level` (of the mesh env `MeshEnv`) for the
  /// map of that level, nested in mesh order: its position in the split layout, less the
  /// positions the maps of the outer mesh axes have taken before it; -1 if not named.
  template <class MeshEnv>
  static constexpr int level_position(std::size_t level) {
    for (std::size_t k = 0; k < named; ++k) {
      if (names[k] != MeshEnv::names[level]) continue;
      int taken = 0;
      for (std::size_t j = 0; j < named; ++j)
        if (static_cast<std::size_t>(MeshEnv::index_of(names[j])) < level && positions[j] < positions[k]) ++taken;
      return static_cast<int>(positions[k]) - taken;
    }
    return -1;
  }
  /// Whether the spec names the mesh axis at `level`.
  template <class MeshEnv>
  static constexpr bool names_level(std::size_t level) {
    return level_position<MeshEnv>(level) >= 0;
  }
};

/// The checks of one name of a spec against the mesh, each failing with a first error line
/// that names the axis: the name is in the mesh, and the spec names it once.
template <class MeshEnv, class Spec, class A>
constexpr void check_spec_name() {
  if constexpr (MeshEnv::index_of(A::name) < 0) {
    (void)sizeof(partition_spec_names_axis_not_in_mesh<A>);
    static_assert(always_false<A>, "namedax::shard_map: a partition spec names an axis the mesh does not have; name "
                                   "one of the mesh's axes, or add the axis to the mesh");
  }
  constexpr std::size_t times = [] {
    std::size_t n = 0;
    for (std::string_view other : spec_layout<Spec>::names) n += other == A::name;
    return n;
  }();
  if constexpr (times > 1) {
    (void)sizeof(partition_spec_names_mesh_axis_twice<A>);
    static_assert(always_false<A>, "namedax::shard_map: a partition spec names a mesh axis twice; a mesh axis splits "
                                   "at most one dim of a value, once");
  }
}
template <class MeshEnv, class Spec, class... Names>
constexpr void check_spec_dim(spec_dim<Names...>*) {
  (check_spec_name<MeshEnv, Spec, Names>(), ...);
}
template <class MeshEnv, class Spec, class... Dims>
constexpr void check_spec_dims(partition_spec<Dims...>*) {
  (check_spec_dim<MeshEnv, Spec>(static_cast<Dims*>(nullptr)), ...);
}
template <class MeshEnv, class Spec>
constexpr void check_spec() {
  static_assert(is_partition_spec<Spec>, "namedax::shard_map: in_specs and out_specs hold namedax::P(...) specs, "
                                         "one for all leaves or a pytree prefix of the arguments or results");
  if constexpr (is_partition_spec<Spec>) check_spec_dims<MeshEnv, Spec>(static_cast<Spec*>(nullptr));
}

/// The mesh axis sizes of the names a spec splits dim `d` over, and their product.
template <class Spec, class MeshEnv>
std::vector<std::size_t> split_sizes(std::span<const std::size_t> mesh_sizes, std::size_t d) {
  using layout = spec_layout<Spec>;
  std::vector<std::size_t> sizes;
  for (std::size_t k = 0; k < layout::named; ++k)
    if (layout::dims[k] == d) sizes.push_back(mesh_sizes[static_cast<std::size_t>(MeshEnv::index_of(layout::names[k]))]);
  return sizes;
}

template <class Spec>
std::string spec_names_of_dim(std::size_t d) {
  using layout = spec_layout<Spec>;
  std::string text;
  for (std::size_t k = 0; k < layout::named; ++k)
    if (layout::dims[k] == d) text += message(text.empty() ? "\"" : ", \"", layout::names[k], "\"");
  return text;
}

/// An argument split by its spec: each spec'd dim of size D over mesh axes of sizes s1..sk
/// becomes dims (s1, ..., sk, D / (s1 * ... * sk)), contiguous blocks in row-major order over
/// the axes, by new strides over the same memory (no copy).
template <class Spec, class MeshEnv, class C>
auto split_by_spec(const C& c, std::span<const std::size_t> mesh_sizes, std::string_view argument) {
  using layout = spec_layout<Spec>;
  const auto& shape = c.shape();
  const auto& strides = c.strides();
  if (c.dimension() < Spec::rank)
    fail("namedax::shard_map: ", argument, " has ", c.dimension(), " dims, but its partition spec has ", Spec::rank,
         " entries");
  dims_t split_shape;
  strides_t split_strides;
  for (std::size_t d = 0; d < c.dimension(); ++d) {
    const std::size_t extent = shape[d];
    const std::ptrdiff_t stride = extent == 1 ? 0 : strides[d];
    if (d >= Spec::rank || layout::counts[d] == 0) {
      split_shape.push_back(extent), split_strides.push_back(stride);
      continue;
    }
    const std::vector<std::size_t> sizes = split_sizes<Spec, MeshEnv>(mesh_sizes, d);
    std::size_t parts = 1;
    for (std::size_t s : sizes) parts *= s;
    if (parts == 0 || extent % parts != 0)
      fail("namedax::shard_map: ", argument, ", dim ", d, " of size ", extent, " does not split over mesh axes ",
           spec_names_of_dim<Spec>(d), " of sizes ", sizes, " (", parts, " blocks); its size must be a multiple of ",
           parts);
    const std::size_t block = extent / parts;
    std::vector<std::ptrdiff_t> axis_strides(sizes.size());
    std::ptrdiff_t step = stride * static_cast<std::ptrdiff_t>(block);
    for (std::size_t j = sizes.size(); j-- > 0;) axis_strides[j] = step, step *= static_cast<std::ptrdiff_t>(sizes[j]);
    for (std::size_t j = 0; j < sizes.size(); ++j) split_shape.push_back(sizes[j]), split_strides.push_back(axis_strides[j]);
    split_shape.push_back(block), split_strides.push_back(stride);
  }
  // An adaptor, not a view: a container to the maps, which then take it by reference.
  return xt::adapt(c.data(), c.size(), xt::no_ownership(), std::move(split_shape), std::move(split_strides));
}

/// A map's in_axes or out_axes entry for a value with spec `Spec` at mesh level `Level`.
template <class MeshEnv, std::size_t Level, class Spec>
auto level_entry() {
  constexpr int position = spec_layout<Spec>::template level_position<MeshEnv>(Level);
  if constexpr (position >= 0) return position;
  else return none;
}

/// A result leaf, stacked by the maps with the split layout of its spec, with each spec'd
/// dim merged back (a reshape of a fresh row-major array, no copy).
template <class Spec, class T>
void merge_by_spec(xt::xarray<T>& out) {
  using layout = spec_layout<Spec>;
  dims_t merged;
  std::size_t at = 0;
  for (std::size_t d = 0; at < out.dimension(); ++d) {
    const std::size_t parts = d < Spec::rank ? layout::counts[d] : 0;
    std::size_t extent = 1;
    for (std::size_t j = 0; j <= parts; ++j) extent *= out.shape()[at++];
    merged.push_back(extent);
  }
  out.reshape(merged);
}

/// Checks at compile time that a result leaf varies along no mesh axis its out spec leaves out.
template <class MeshEnv, std::size_t Leaf, class Spec, class L>
constexpr bool check_result_variance() {
  check_spec<MeshEnv, Spec>();
  constexpr axis_mask varying = result_mask<MeshEnv, L>;
  [&]<std::size_t... Level>(std::index_sequence<Level...>) {
    (
        [&] {
          if constexpr ((varying >> Level & 1) != 0 && !spec_layout<Spec>::template names_level<MeshEnv>(Level)) {
            using A = typename binding_at<MeshEnv, Level>::type::axis_type;
            (void)sizeof(out_spec_omits_axis_the_result_varies_along<A, Leaf>);
            static_assert(always_false<A>, "namedax::shard_map: a result varies along a mesh axis its out spec does "
                                           "not name; name the axis in the out spec to concatenate the blocks, or "
                                           "reduce the result over it (psum, pmax, ...)");
          }
        }(),
        ...);
  }(std::make_index_sequence<MeshEnv::size>{});
  return true;
}

/// Checks that a result leaf has at least as many dims as its out spec has entries.
template <class MeshEnv, std::size_t Leaf, class Spec, class L>
void check_result_rank(const L& leaf) {
  std::size_t rank = 0;  // a scalar's
  if constexpr (NamedValue<L>) rank = leaf.payload().dimension() - MeshEnv::vectorized_count;
  else if constexpr (DeferredValue<L>) rank = leaf.positional_rank();  // a value of axis_index alone
  else if constexpr (!std::is_arithmetic_v<L>) rank = leaf.dimension();
  if (rank < Spec::rank)
    fail("namedax::shard_map: result ", Leaf, " has ", rank, " dims, but its out spec has ", Spec::rank, " entries");
}

/// The maps of the mesh axes from `Level` in, nested in mesh order around `body`. `Specs`: the
/// spec type of each argument leaf, in order; `out_specs`: the out specs as given.
template <std::size_t Level, class Specs, class Mesh, class Body, class OutSpecs>
auto nest_maps(const Mesh& m, Body body, const OutSpecs& out_specs) {
  using MeshEnv = typename Mesh::env_type;
  if constexpr (Level == Mesh::rank) {
    return body;
  } else {
    const auto in_axes = [&]<std::size_t... K>(std::index_sequence<K...>) {
      return std::tuple{level_entry<MeshEnv, Level, std::tuple_element_t<K, Specs>>()...};
    }(std::make_index_sequence<std::tuple_size_v<Specs>>{});
    const auto out_axes = detail::tree_map(out_specs, [](const auto& spec) {
      return level_entry<MeshEnv, Level, std::remove_cvref_t<decltype(spec)>>();
    });
    return m.template axis_at<Level>().map(nest_maps<Level + 1, Specs>(m, std::move(body), out_specs), in_axes, out_axes);
  }
}

/// Whether X is a value of an enclosing map. A named value of no map (a primal, when grad
/// is taken outside shard_map) is plain data.
template <class X>
constexpr bool of_an_enclosing_map() {
  if constexpr (NamedValue<X>) return X::env_type::size != 0;
  else return DeferredValue<X>;
}

/// An argument leaf as the outermost map takes it: split by its spec, or a scalar as it is.
template <class Spec, class MeshEnv, std::size_t Leaf, class X, class Held>
auto split_leaf(const Held& held_leaf, std::span<const std::size_t> mesh_sizes, const std::string& argument) {
  check_spec<MeshEnv, Spec>();
  static_assert(!of_an_enclosing_map<X>(),
                "namedax::shard_map: runs at the top level, on plain arrays; inside a map, nest maps instead");
  if constexpr (std::is_arithmetic_v<X>) {
    static_assert(Spec::rank == 0, "namedax::shard_map: a scalar argument cannot be split; give it the spec P()");
    return held_leaf;
  } else {
    constexpr std::size_t rank = xt::get_rank<X>::value;
    if constexpr (rank != SIZE_MAX && rank < Spec::rank) {
      (void)sizeof(partition_spec_has_more_entries_than_the_argument_has_dims<Leaf, Spec::rank, rank>);
      static_assert(always_false<X>, "namedax::shard_map: a partition spec has more entries than its argument has "
                                     "dims; give one entry per leading dim");
    }
    return split_by_spec<Spec, MeshEnv>(held(held_leaf), mesh_sizes, argument);
  }
}

/// Runs shard_map once its in_specs fit the arguments: splits the argument leaves, runs the
/// nested maps, and merges the results.
template <class F, class Mesh, class InSpecs, class OutSpecs, class... Args>
auto run_shard_map(const F& f, const Mesh& m, const InSpecs& in_specs, const OutSpecs& out_specs, const Args&... args) {
  using MeshEnv = typename Mesh::env_type;
  const std::tuple<const Args&...> arguments(args...);
  using specs_type = decltype(spread_prefix<std::tuple<Args...>>(in_specs));
  const auto leaves = tree_leaves(arguments);
  constexpr std::size_t count = std::tuple_size_v<decltype(leaves)>;
  const auto holders = unpack(leaves, [](const auto&... leaf) { return std::tuple{hold(leaf)...}; });
  const auto mesh_sizes = m.sizes();
  const auto blocks = [&]<std::size_t... K>(std::index_sequence<K...>) {
    return std::tuple{split_leaf<std::tuple_element_t<K, specs_type>, MeshEnv, K,
                                 std::remove_cvref_t<std::tuple_element_t<K, decltype(leaves)>>>(
        std::get<K>(holders), mesh_sizes, argument_name(leaf_counts_of<Args...>, K))...};
  }(std::make_index_sequence<count>{});

  // The function as the innermost map calls it: the argument pytrees built again around the
  // blocks, and each result leaf checked against its out spec. The last block is the
  // environment's carrier, dropped here.
  auto body = [&f](const auto&... block) {
    auto flat = std::tuple{block...};
    auto result = unpack(tree_unflatten<std::tuple<Args...>>(flat), f);
    using out_specs_type = decltype(spread_prefix<decltype(result)>(std::declval<const OutSpecs&>()));
    const auto result_leaves = tree_leaves(result);
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      // In a static_assert, so that both compilers report it before the maps check out_axes.
      static_assert((check_result_variance<MeshEnv, K, std::tuple_element_t<K, out_specs_type>,
                                           std::remove_cvref_t<std::tuple_element_t<K, decltype(result_leaves)>>>() &&
                     ...));
      (check_result_rank<MeshEnv, K, std::tuple_element_t<K, out_specs_type>>(std::get<K>(result_leaves)), ...);
    }(std::make_index_sequence<std::tuple_size_v<out_specs_type>>{});
    return result;
  };
  // Each map learns the axes of the maps around it from its named arguments; a 0-d array,
  // mapped by none, carries them when no argument does (a function of axis_index alone).
  static const xt::xarray<char> carrier = xt::xarray<char>::from_shape({});
  using specs_carried = decltype(std::tuple_cat(std::declval<specs_type>(), std::tuple<partition_spec<>>{}));
  // Called directly, not through std::apply, whose noexcept check would add its own layers to
  // every diagnostic from inside the function.
  const auto maps = nest_maps<0, specs_carried>(m, body, out_specs);
  auto results = [&]<std::size_t... K>(std::index_sequence<K...>) {
    return maps(std::get<K>(blocks)..., carrier);
  }(std::make_index_sequence<count>{});
  using out_specs_type = decltype(spread_prefix<decltype(results)>(out_specs));
  auto result_leaves = tree_leaves(results);
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    (merge_by_spec<std::tuple_element_t<K, out_specs_type>>(std::get<K>(result_leaves)), ...);
  }(std::make_index_sequence<std::tuple_size_v<out_specs_type>>{});
  return results;
}

// Named so that a failing static_assert prints the counts: in_specs' entries, then the
// arguments.
template <std::size_t Entries, std::size_t Arguments>
inline constexpr bool in_specs_count_matches = Entries == Arguments;
// Named so that a failing static_assert prints the argument whose entry does not fit it.
template <std::size_t Argument, bool Fits>
inline constexpr bool in_spec_fits_argument = Fits;

/// The first argument whose in_specs entry is a node that does not fit the argument's
/// structure, or the number of arguments if none.
template <class InSpecs, class... Args>
constexpr std::size_t first_misfit_argument() {
  if constexpr (prefix_entries<InSpecs, sizeof...(Args)>() != sizeof...(Args) || !is_node<InSpecs>) {
    return sizeof...(Args);
  } else {
    return []<std::size_t... K>(std::index_sequence<K...>) {
      const bool fits[] = {prefix_fits<Args, child_t<InSpecs, K>>()..., false};
      std::size_t k = 0;
      while (fits[k]) ++k;
      return k;
    }(std::index_sequence_for<Args...>{});
  }
}

/// What a shard_map call returns when its specs fail a check: it converts to anything, so that
/// the caller's use of the result reports nothing more than that check.
struct unchecked_result {
  template <class T>
  operator T() const;  // never defined: the program does not compile
};

/// The checks of in_specs against the arguments, each a template of the counts or the
/// argument, so that both compilers print them in the diagnostic.
template <std::size_t Entries, std::size_t Arguments>
auto check_in_specs_count() {
  static_assert(in_specs_count_matches<Entries, Arguments>,
                "namedax::shard_map: in_specs has a different number of entries than the function takes arguments "
                "(the counts: in_specs_count_matches<entries, arguments>); give one spec per argument, or one spec "
                "for all of them");
  return unchecked_result{};
}
template <std::size_t Argument>
auto check_in_spec_fits_argument() {
  static_assert(in_spec_fits_argument<Argument, false>,
                "namedax::shard_map: the in_specs entry of an argument (in_spec_fits_argument<argument, ...>) is a "
                "node that does not match the argument's structure; give the argument one spec, or a node with one "
                "entry per child of the argument");
  return unchecked_result{};
}

/// Runs shard_map once in_specs fit the arguments; a mistake in them is the only error
/// reported.
template <class F, class Mesh, class InSpecs, class OutSpecs, class... Args>
auto call_shard_map(const F& f, const Mesh& m, const InSpecs& in_specs, const OutSpecs& out_specs, const Args&... args) {
  constexpr std::size_t entries = prefix_entries<InSpecs, sizeof...(Args)>();
  constexpr std::size_t misfit = first_misfit_argument<InSpecs, Args...>();
  if constexpr (entries != sizeof...(Args)) return check_in_specs_count<entries, sizeof...(Args)>();
  else if constexpr (misfit < sizeof...(Args)) return check_in_spec_fits_argument<misfit>();
  else return run_shard_map(f, m, in_specs, out_specs, args...);
}

/// shard_map as an object, as mapped_function is vmap's and pmap's: called, it maps the
/// function over the mesh; called with traced arguments (grad outside shard_map), the maps'
/// derivative rule records it, and its pullback is the same mesh's shard_map of the
/// function's pullback (remapped, with the specs swapped for the cotangents).
template <class F, class Mesh, class InSpecs, class OutSpecs>
class sharded_function {
 public:
  sharded_function(F f, Mesh m, InSpecs in_specs, OutSpecs out_specs)
      : f_(std::move(f)), mesh_(std::move(m)), in_specs_(std::move(in_specs)), out_specs_(std::move(out_specs)) {}

  template <class... Args>
  auto operator()(const Args&... args) const {
    auto run = [&](const auto&... a) { return call_shard_map(f_, mesh_, in_specs_, out_specs_, a...); };
    return run_or_record(*this, run, args...);
  }

  /// The same mesh's shard_map of another function, with other specs.
  template <class G, class In, class Out>
  auto remapped(G g, In in_specs, Out out_specs) const {
    return sharded_function<G, Mesh, In, Out>(std::move(g), mesh_, std::move(in_specs), std::move(out_specs));
  }
  [[nodiscard]] const F& function() const { return f_; }
  [[nodiscard]] const InSpecs& in_axes() const { return in_specs_; }
  [[nodiscard]] const OutSpecs& out_axes() const { return out_specs_; }

 private:
  F f_;
  Mesh mesh_;
  InSpecs in_specs_;
  OutSpecs out_specs_;
};

}  // namespace detail
}  // namespace namedax
