// SPDX-License-Identifier: MIT
// Meshes and shard_map: JAX's `Mesh`, `PartitionSpec` and `shard_map`, built on the maps.
// A mesh is an ordered set of named axes, each with a size and a placement (device threads,
// a vectorized dim, or MPI processes with <namedax/mpi.hpp>). shard_map splits each argument
// into contiguous blocks by its partition spec, runs the function once per mesh position
// with each block as a named value, and assembles the results by their out specs.
#pragma once

#include <namedax/detail/shard_map.hpp>
#include <namedax/detail/unpack.hpp>
#include <namedax/map.hpp>

namespace namedax {

/// One axis of a mesh: its name, its size, and where its indices run.
template <fixed_string Name, placement P>
struct mesh_axis {
  using axis_type = axis<Name>;
  static constexpr placement place = P;
  std::size_t size;

  /// The map that binds this axis around `f` (vmap or pmap), as shard_map nests them. Its
  /// binding records the mesh, so that a name missing inside `f` is reported as missing from
  /// the mesh.
  template <class F, class InAxes, class OutAxes>
  auto map(F f, const InAxes& in_axes, const OutAxes& out_axes) const {
    return detail::mapped_function<mesh_binding<axis<Name>, P>, F, InAxes, OutAxes>(
        P == placement::vectorized ? "vmap" : "pmap", std::move(f), in_axes, out_axes, size);
  }
};

/// A mesh axis of `size` simulated devices, one host thread each (pmap's placement).
template <fixed_string Name>
constexpr mesh_axis<Name, placement::devices> devices(std::size_t size) {
  return {size};
}
/// A mesh axis of `size` indices computed as one vectorized dim (vmap's placement).
template <fixed_string Name>
constexpr mesh_axis<Name, placement::vectorized> vectorized(std::size_t size) {
  return {size};
}

namespace detail {
template <class A>
constexpr bool on_processes() {
  if constexpr (requires { A::on_processes; }) return A::on_processes;
  else return false;
}
template <class... Axes>
constexpr bool processes_come_first() {
  const bool processes[] = {on_processes<Axes>()..., false};
  for (std::size_t k = 1; k < sizeof...(Axes); ++k)
    if (processes[k] && !processes[k - 1]) return false;
  return true;
}
}  // namespace detail

/// A mesh axis: a name, a size, a placement, and the map that binds it.
template <class A>
concept MeshAxis = Axis<typename A::axis_type> && requires(const A& a) {
  { a.size } -> std::convertible_to<std::size_t>;
  { A::place } -> std::convertible_to<placement>;
};

/// An ordered set of named axes, major to minor (JAX's `Mesh`); each axis's placement is in
/// its type, so a mesh of threads and one of MPI processes run the same program:
///   namedax::mesh m{namedax::devices<"data">(2), namedax::vectorized<"model">(4)};
template <MeshAxis... Axes>
class mesh {
  static_assert(detail::axes_are_distinct<typename Axes::axis_type...>, "namedax::mesh: an axis name is given twice");
  static_assert(detail::processes_come_first<Axes...>(),
                "namedax::mesh: MPI process axes (namedax::mpi::processes) come before the other axes of a mesh");

 public:
  /// The axes as the maps bind them, outermost first.
  using env_type = env<mesh_binding<typename Axes::axis_type, Axes::place>...>;
  static constexpr std::size_t rank = sizeof...(Axes);

  constexpr explicit mesh(Axes... axes) : axes_(axes...) {
    // A size of 0 would reach the maps as "no axis_size given".
    (..., [&] {
      if (axes.size == 0)
        detail::fail("namedax::mesh: axis \"", Axes::axis_type::name, "\" has size 0; every mesh axis needs at least one index");
    }());
  }

  /// The sizes of the axes, in order.
  [[nodiscard]] constexpr std::array<std::size_t, rank> sizes() const {
    return detail::unpack(axes_, [](const auto&... a) { return std::array<std::size_t, rank>{a.size...}; });
  }
  /// The size of the axis named `A`: `m.size("data"_ax)`.
  template <Axis A>
  [[nodiscard]] constexpr std::size_t size(A) const {
    static_assert(env_type::index_of(A::name) >= 0, "namedax::mesh::size: the mesh has no axis of this name");
    return sizes()[static_cast<std::size_t>(env_type::index_of(A::name))];
  }
  /// The number of mesh positions (the product of the sizes).
  [[nodiscard]] constexpr std::size_t position_count() const {
    std::size_t n = 1;
    for (std::size_t s : sizes()) n *= s;
    return n;
  }
  /// Axis `L`, in order.
  template <std::size_t L>
  [[nodiscard]] constexpr const auto& axis_at() const {
    return std::get<L>(axes_);
  }

 private:
  std::tuple<Axes...> axes_;
};

/// A partition spec (JAX's `P`): one entry per leading positional dim of a value, each
/// `namedax::none` (not split), a mesh axis (`"data"_ax`), or several
/// (`namedax::axes("data"_ax, "model"_ax)`, major to minor). A dim named by mesh axes is
/// split into contiguous blocks, one per position along them; dims past the entries, and
/// mesh axes the spec does not name, are not split (the value is replicated along them).
///   namedax::P("data"_ax, namedax::none)   // rows split over "data", columns whole
template <class... Entries>
constexpr auto P(Entries...) {
  return partition_spec<typename detail::spec_dim_of<std::remove_cvref_t<Entries>>::type...>{};
}

/// Maps `f` over the mesh, JAX's `shard_map(f, mesh=m, in_specs, out_specs)`. Each argument
/// leaf is split into blocks by its spec (`in_specs`: one spec for every leaf, or a pytree
/// prefix of the argument list, as `in_axes`); `f` runs once per mesh position with each block
/// as a named value that varies along the mesh axes its spec names. Each result leaf is
/// assembled by its out spec (`out_specs`: one spec or a prefix of the result): the blocks
/// are concatenated along the dims whose entries name mesh axes. A result must not vary
/// along a mesh axis its out spec does not name: checked at compile time from its type (JAX
/// checks at trace time). Sizes that do not split evenly are a namedax::error.
///   namedax::mesh m{namedax::devices<"i">(4)};
///   auto f = namedax::shard_map([](auto x) { return x / namedax::psum(x, "i"_ax); }, m,
///                               namedax::P("i"_ax), namedax::P("i"_ax));
///   f(xt::xarray<float>{0, 1, 2, 3})  // {0, 1/6, 2/6, 3/6}
/// A function that calls shard_map can be differentiated (grad outside shard_map): the
/// pullback is the same mesh's shard_map of the function's pullback.
template <class F, class Mesh, class InSpecs, class OutSpecs>
auto shard_map(F f, const Mesh& m, InSpecs in_specs, OutSpecs out_specs) {
  return detail::sharded_function<F, Mesh, InSpecs, OutSpecs>(std::move(f), m, std::move(in_specs), std::move(out_specs));
}

}  // namespace namedax
