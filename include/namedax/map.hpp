// SPDX-License-Identifier: MIT
// vmap and pmap: bind a named axis, as a vectorized dimension or as simulated devices, run
// the function with named values, and stack its results along out_axes. Arguments and
// results are pytrees; in_axes and out_axes are prefixes of them.
#pragma once

#include <namedax/detail/map.hpp>

namespace namedax {

/// Maps `f` over axis `Name` as a vectorized dimension (JAX's `vmap(f, in_axes, out_axes,
/// axis_name=Name, axis_size)`). Arguments and results are pytrees (std::tuple, std::pair,
/// std::array, Boost.Hana structs, nested). `in_axes`: an int or `none` for every leaf, or a
/// std::tuple with one entry per argument, each an int, `none` or a node of entries for the
/// argument's children (a pytree prefix, as in JAX). `out_axes`: the same for the result;
/// `none` for a result that does not vary along the axis (checked at compile time), which is
/// returned once instead of stacked. `Extent` fixes the axis size in the type.
/// `vmap<"i">(f).into(out)(x)` writes the results into the caller's arrays instead (`out`: one
/// array, or a pytree of references shaped as the result, such as std::tie(a, b); resized only
/// when its shape differs), so that a map called in a loop does not allocate its results.
///   auto f = namedax::vmap<"i">([](auto x) { return x / namedax::psum(x, "i"_ax); });
///   f(xt::xarray<float>{0, 1, 2, 3})  // {0, 1/6, 2/6, 3/6}
template <fixed_string Name, std::size_t Extent = dynamic_extent, class F, class InAxes = int, class OutAxes = int>
auto vmap(F f, InAxes in_axes = 0, OutAxes out_axes = 0, std::size_t axis_size = 0) {
  return detail::mapped_function<binding<axis<Name>, placement::vectorized, Extent>, F, InAxes, OutAxes>(
      "vmap", std::move(f), std::move(in_axes), std::move(out_axes), axis_size);
}

/// Maps `f` over axis `Name` with one simulated device (a host thread) per index; the
/// collectives inside really exchange data among the devices (JAX's `pmap`).
///   namedax::pmap<"i">([](auto x) { return namedax::psum(x, "i"_ax); })(xt::arange<int>(4))  // {6, 6, 6, 6}
template <fixed_string Name, std::size_t Extent = dynamic_extent, class F, class InAxes = int, class OutAxes = int>
auto pmap(F f, InAxes in_axes = 0, OutAxes out_axes = 0, std::size_t axis_size = 0) {
  return detail::mapped_function<binding<axis<Name>, placement::devices, Extent>, F, InAxes, OutAxes>(
      "pmap", std::move(f), std::move(in_axes), std::move(out_axes), axis_size);
}

}  // namespace namedax
