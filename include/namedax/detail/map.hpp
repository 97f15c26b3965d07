// SPDX-License-Identifier: MIT
// The body of a map: its arguments checked and viewed per index (map_call), then one runner
// per placement: vectorized (one call, the axis a trailing dim), devices (one thread per
// index) and processes (one MPI process per index). Results are stacked leaf by leaf.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <namedax/detail/compilation.hpp>
#include <namedax/detail/devices.hpp>
#include <namedax/detail/pytree.hpp>
#include <namedax/detail/reduction.hpp>
#include <namedax/detail/traced.hpp>
#include <namedax/detail/unpack.hpp>
#include <namedax/named_array.hpp>

#include <xtensor/xshape.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <tuple>

namespace namedax {

/// `in_axes` / `out_axes` entry of a leaf that is not mapped (JAX's None). As an out_axes
/// entry, the result must not vary along the axis (checked at compile time); the map returns
/// its one value instead of stacking copies.
struct none_t {
  explicit constexpr none_t() = default;
};
inline constexpr none_t none{};

/// Named by the first error line when a map's out_axes entry for a result is `none` but the
/// result varies along the map's axis: the type, left incomplete, carries the axis and the
/// index of the result's leaf.
template <Axis A, std::size_t ResultLeaf>
struct out_axes_none_but_result_varies_along_axis;

namespace detail {

/// Keeps an argument's data alive and addressable with strides for the whole call: the
/// caller's container itself, or a container evaluated from an expression or named payload.
template <class X>
auto hold(const X& x) {
  if constexpr (NamedValue<X>) return evaluate(x.payload());
  else if constexpr (std::is_arithmetic_v<X>) return x;
  else if constexpr (std::is_base_of_v<xt::xcontainer<X>, X>) return std::cref(x);  // views are copied: their offset
  else return evaluate(x);
}
template <class H>
const auto& held(const H& h) {
  if constexpr (requires { h.get(); }) return h.get();
  else return h;
}

template <class X>
constexpr std::size_t vectorized_dims_of() {
  if constexpr (NamedValue<X>) return X::env_type::vectorized_count;
  else return 0;
}

/// `axis` (negative: from the end) as one of `count` positions, or nothing when out of range.
constexpr std::optional<std::size_t> position_of(int axis, std::size_t count) {
  const auto n = static_cast<std::ptrdiff_t>(count);
  const std::ptrdiff_t d = axis < 0 ? axis + n : axis;
  if (d < 0 || d >= n) return std::nullopt;
  return static_cast<std::size_t>(d);
}
/// The error for an in_axes or out_axes entry (`what`) that position_of finds out of range.
[[noreturn]] NAMEDAX_DECL void fail_axis_range(std::string_view verb, std::string_view name, std::string_view what,
                                               int axis, std::size_t count);

/// The dims of a mapped view: a std::array when the payload's rank is known at compile time
/// (a fixed-rank argument such as xt::xtensor<float, 2>), so that its type says its rank.
template <std::size_t Rank, class T>
class view_dims {
 public:
  void push_back(T v) { dims_[size_++] = v; }
  auto take() && { return dims_; }

 private:
  std::array<T, Rank> dims_{};
  std::size_t size_ = 0;
};
template <class T>
class view_dims<dynamic_extent, T> {
 public:
  void push_back(T v) { dims_.push_back(v); }
  auto take() && { return std::move(dims_); }

 private:
  xt::dynamic_shape<T> dims_;
};

/// The rank of the payload a mapped argument of type X gets, when its type fixes it: its own
/// positional dims (less the mapped one), then the environment's vectorized dims.
template <class X, bool Mapped, class Inner>
constexpr std::size_t mapped_payload_rank() {
  if constexpr (PlainValue<X> && !std::is_arithmetic_v<X> && xt::get_rank<X>::value != SIZE_MAX)
    return xt::get_rank<X>::value - (Mapped ? 1 : 0) + Inner::vectorized_count;
  else
    return dynamic_extent;
}

/// The argument as the mapped function sees it: a strided view (no copy) whose positional
/// dims drop the mapped one, followed by the vectorized dims of the environment. Under vmap
/// the mapped dim becomes the last vectorized dim; under pmap device `device` takes its slice.
template <class Inner, placement P, std::size_t ArgVec, std::size_t Rank, class C>
auto mapped_view(const C& c, std::optional<std::size_t> dim, std::size_t device) {
  constexpr std::size_t outer_vec = Inner::vectorized_count - (P == placement::vectorized ? 1 : 0);
  const auto& s = c.shape();
  const auto& st = c.strides();
  view_dims<Rank, std::size_t> shape;
  view_dims<Rank, std::ptrdiff_t> strides;
  for (std::size_t k = 0; k < c.dimension(); ++k)
    if (k != dim) shape.push_back(s[k]), strides.push_back(s[k] == 1 ? 0 : st[k]);
  for (std::size_t k = ArgVec; k < outer_vec; ++k) shape.push_back(1), strides.push_back(0);
  std::size_t offset = 0;
  if constexpr (P == placement::vectorized) {
    shape.push_back(dim ? s[*dim] : 1);
    strides.push_back(dim && s[*dim] != 1 ? st[*dim] : 0);
  } else if (dim) {
    offset = device * static_cast<std::size_t>(st[*dim]);
  }
  return xt::strided_view(c, std::move(shape).take(), std::move(strides).take(), offset, xt::layout_type::dynamic);
}

/// A result leaf of the mapped function as a named value of the map's environment.
template <class Inner, class L>
auto to_inner(const L& leaf) {
  if constexpr (DeferredValue<L>) {
    return leaf.template resolve<Inner>();
  } else if constexpr (std::is_same_v<typename env_of<L>::type, Inner>) {
    return leaf;
  } else if constexpr (std::is_arithmetic_v<L>) {
    std::array<std::size_t, Inner::vectorized_count> ones;
    ones.fill(1);
    xt::xarray<L> a = xt::xarray<L>::from_shape(ones);
    a.fill(leaf);
    return make_named<shared_array<L>, Inner, 0>(share_array<L>(std::move(a)));
  } else {
    auto p = payload_in<Inner>(leaf);
    return make_named<decltype(p), Inner, mask_of<L>()>(std::move(p));
  }
}

template <class Inner, class L>
inline constexpr axis_mask result_mask = decltype(to_inner<Inner>(std::declval<const L&>()))::varying;

/// Where a map's output for one result leaf goes: its shape (a slab's, with the mapped axis
/// of `count` inserted at out_axes) and the position `slot` of that axis.
struct stacked_layout {
  dims_t shape;
  std::size_t slot;
};

/// `outer_vectorized`: the number of vectorized dims of the environment around the map, which
/// end each slab; `leaf`: which leaf of the result, for messages.
NAMEDAX_DECL stacked_layout stack_layout(std::string_view verb, std::string_view name,
                                         std::span<const std::size_t> slab, std::size_t count, int out_axes,
                                         std::size_t outer_vectorized, std::size_t leaf);

/// A map called as `.into(outputs)`: the caller's arrays, a pytree shaped as the result.
/// Without it (`no_destination`), each result leaf is a fresh array.
struct no_destination {};

/// The memory a result leaf is written to, with its strides: a fresh row-major array, or the
/// caller's array given to into(), resized only when its shape differs.
template <class T>
struct output_memory {
  xt::xarray<T> fresh;  // empty when the caller's array is written
  T* data = nullptr;
  strides_t strides;

  /// The strides of a slab in it, and the step from one slab to the next, when the mapped
  /// axis is at `slot`.
  [[nodiscard]] std::pair<strides_t, std::ptrdiff_t> slots(std::size_t slot) const {
    strides_t slab = strides;
    const std::ptrdiff_t step = slab[slot];
    slab.erase(slab.begin() + static_cast<std::ptrdiff_t>(slot));
    return {std::move(slab), step};
  }
};

/// The errors of a caller's array given to into() that cannot take a result leaf's shape:
/// xtensor's resize checks neither a fixed rank nor a fixed shape.
NAMEDAX_DECL void check_into_rank(std::string_view verb, std::string_view name, std::size_t leaf,
                                  std::span<const std::size_t> shape, std::size_t rank);
NAMEDAX_DECL void check_into_shape(std::string_view verb, std::string_view name, std::size_t leaf,
                                   std::span<const std::size_t> shape, std::span<const std::size_t> fixed);

/// A fresh row-major array of `shape` for a result leaf: one function per element type.
template <class T>
output_memory<T> fresh_output(const dims_t& shape) {
  output_memory<T> out;
  out.fresh = uninitialized_array<T>(shape);
  out.data = out.fresh.data();
  out.strides = row_major_strides(shape);
  return out;
}

template <class T, std::size_t Leaf, class Dest>
output_memory<T> output_memory_for(std::string_view verb, std::string_view name, const dims_t& shape, Dest& dest) {
  if constexpr (std::is_same_v<Dest, no_destination>) {
    return fresh_output<T>(shape);
  } else {
    output_memory<T> out;
    auto& target = std::get<Leaf>(tree_leaves(dest));
    static_assert(std::is_same_v<typename std::remove_cvref_t<decltype(target)>::value_type, T>,
                  "namedax: into: an output array's element type differs from the result's");
    using Target = std::remove_cvref_t<decltype(target)>;
    if constexpr (xt::detail::is_fixed<typename Target::shape_type>::value) {
      const dims_t fixed(target.shape().begin(), target.shape().end());
      check_into_shape(verb, name, Leaf, shape, fixed);
    } else {
      if constexpr (xt::get_rank<Target>::value != SIZE_MAX) check_into_rank(verb, name, Leaf, shape, xt::get_rank<Target>::value);
      if (!std::equal(shape.begin(), shape.end(), target.shape().begin(), target.shape().end())) target.resize(shape);
    }
    out.data = target.data();
    out.strides.assign(target.strides().begin(), target.strides().end());
    return out;
  }
}

/// What a map returns for one result leaf: the fresh array itself, or in an enclosing map a
/// value of the outer environment that no longer varies along this map's axis; nothing for
/// a leaf written into the caller's array.
template <class Outer, axis_mask Varying, class Dest, class T>
auto map_result(output_memory<T>&& out) {
  if constexpr (!std::is_same_v<Dest, no_destination>) {
    return 0;
  } else if constexpr (Outer::size == 0) {
    return std::move(out.fresh);
  } else {
    constexpr axis_mask own_bit = axis_mask{1} << Outer::size;
    return make_named<shared_array<T>, Outer, Varying & ~own_bit>(share_array(std::move(out.fresh)));
  }
}

/// The map's output for one result leaf, from one slab per index of the mapped axis (each
/// with the positional dims, then the outer environment's vectorized dims), the new axis at
/// position `slot`.
template <class T>
void stack_slabs(const std::vector<strided_block<T>>& slabs, const output_memory<T>& out, std::size_t slot) {
  const auto [slab_strides, step] = out.slots(slot);
  for (std::size_t d = 0; d < slabs.size(); ++d)
    copy_strided(slabs[d], out.data + static_cast<std::ptrdiff_t>(d) * step, slab_strides);
}

/// Checks at compile time that a result leaf whose out_axes entry is `none` does not vary
/// along the map's axis, the last of `Inner`.
template <class Binding, class Inner, std::size_t Leaf, class Entry, class L>
constexpr void check_unstacked() {
  if constexpr (std::is_same_v<Entry, none_t>) {
    constexpr axis_mask own_bit = axis_mask{1} << (Inner::size - 1);
    if constexpr ((result_mask<Inner, L> & own_bit) != 0) {
      (void)sizeof(out_axes_none_but_result_varies_along_axis<typename Binding::axis_type, Leaf>);
      static_assert(always_false<typename Binding::axis_type>, "namedax: out_axes is namedax::none for a result that varies along the map's axis; "
                                     "reduce it (psum, pmax, ...) first, or give it an out_axes position to stack it");
    }
  }
}

/// The environment of a map's arguments, from their leaves.
template <class Leaves>
struct leaves_env;
template <class... L>
struct leaves_env<std::tuple<L...>> : merged_env<env<>, std::remove_cvref_t<L>...> {};

/// "argument 2", or "argument 1, leaf 3" for a leaf of a pytree argument, from the number of
/// leaves of each argument.
NAMEDAX_DECL std::string argument_name(std::span<const std::size_t> leaf_counts, std::size_t leaf);
template <class... Args>
inline constexpr std::array<std::size_t, sizeof...(Args)> leaf_counts_of{leaf_count<Args>()...};

/// A leaf of a map's arguments as the checks see it: its in_axes entry (none: not mapped) and
/// positional shape; `dim` is set to the positional dim the map takes.
struct map_leaf {
  std::optional<int> entry;
  dims_t shape;
  std::optional<std::size_t> dim;
};
/// The size of a map's axis, and whether each process of a process map was given its own
/// slice (extent 1) rather than the whole arguments.
struct map_extent {
  std::size_t size = 0;
  bool own_slices = false;
};

/// The checks of a map's arguments, compiled once: which dim of each mapped leaf the map takes
/// and the size they agree on, against axis_size, the axis's static extent, an enclosing map
/// of the same name, and (`processes`, nonzero for a process map) the number of processes.
/// `leaf_counts`: the leaves of each argument, for messages.
NAMEDAX_DECL map_extent check_map_arguments(std::string_view verb, std::string_view name, std::span<map_leaf> leaves,
                                            std::span<const std::size_t> leaf_counts, std::size_t axis_size,
                                            std::size_t static_extent, placement place, std::size_t processes);

/// One call of a map: the arguments' leaves held and checked (which dim of each is mapped,
/// the axis size), and the mapped function called on the arguments of one index.
template <class Binding, class F, class InEntries, class... Args>
class map_call {
  using A = typename Binding::axis_type;
  using leaf_refs = decltype(tree_leaves(std::declval<const std::tuple<const Args&...>&>()));
  static constexpr std::size_t count = std::tuple_size_v<leaf_refs>;
  template <std::size_t K>
  using leaf_type = std::remove_cvref_t<std::tuple_element_t<K, leaf_refs>>;
  template <std::size_t K>
  static constexpr bool mapped = !std::is_same_v<std::tuple_element_t<K, InEntries>, none_t>;

 public:
  using outer_env = typename leaves_env<leaf_refs>::type;
  using inner_env = typename env_push<outer_env, Binding>::type;

  map_call(std::string_view verb, const F& f, const InEntries& entries, std::size_t axis_size,
           process_grid* processes, const Args&... args)
      : verb_(verb), f_(f), holders_(hold_all(std::tuple<const Args&...>(args...))) {
    if constexpr (outer_env::index_of(A::name) >= 0) (void)sizeof(axis_bound_twice<A>);
    std::array<map_leaf, count> leaves;
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      (
          [&] {
            if constexpr (mapped<K>) {
              static_assert(!std::is_arithmetic_v<leaf_type<K>>,
                            "namedax::vmap/pmap: a scalar argument cannot be mapped; give it in_axes namedax::none");
              const auto& shape = held(std::get<K>(holders_)).shape();
              const auto positional = static_cast<std::ptrdiff_t>(shape.size() - vectorized_dims_of<leaf_type<K>>());
              leaves[K] = {std::get<K>(entries), dims_t(shape.begin(), shape.begin() + positional), {}};
            }
          }(),
          ...);
    }(std::make_index_sequence<count>{});
    const std::size_t process_count = processes ? processes->block_size() : 0;
    const map_extent extent = check_map_arguments(verb, A::name, leaves, leaf_counts_of<Args...>, axis_size,
                                                  Binding::extent, Binding::place, process_count);
    for (std::size_t k = 0; k < count; ++k) dims_[k] = leaves[k].dim;
    size_ = extent.size;
    own_slices_ = extent.own_slices;
  }

  [[nodiscard]] std::string_view verb() const { return verb_; }
  [[nodiscard]] std::size_t size() const { return size_; }
  /// A process map given each process's own slice (extent 1) rather than the whole arguments.
  [[nodiscard]] bool own_slices() const { return own_slices_; }

  /// The mapped function on the arguments of index `index`, pytrees built again around views.
  auto operator()(std::size_t index) const {
    if constexpr (flat_node<std::tuple<Args...>>) {  // no pytree to build: one leaf per argument
      return [&]<std::size_t... K>(std::index_sequence<K...>) { return f_(argument<K>(index)...); }(
          std::make_index_sequence<count>{});
    } else {
      auto leaves = [&]<std::size_t... K>(std::index_sequence<K...>) {
        return std::tuple{argument<K>(index)...};
      }(std::make_index_sequence<count>{});
      return unpack(tree_unflatten<std::tuple<Args...>>(leaves), f_);
    }
  }

 private:
  static auto hold_all(const std::tuple<const Args&...>& args) {
    return unpack(tree_leaves(args), [](const auto&... leaf) { return std::tuple{hold(leaf)...}; });
  }

  template <std::size_t K>
  auto argument(std::size_t index) const {
    using X = leaf_type<K>;
    if constexpr (std::is_arithmetic_v<X>) {
      return std::get<K>(holders_);
    } else {
      constexpr axis_mask own_bit = axis_mask{1} << (inner_env::size - 1);
      constexpr axis_mask varying = mask_of<X>() | (mapped<K> ? own_bit : 0);
      constexpr std::size_t rank = mapped_payload_rank<X, mapped<K>, inner_env>();
      auto view = mapped_view<inner_env, Binding::place, vectorized_dims_of<X>(), rank>(
          held(std::get<K>(holders_)), dims_[K], own_slices_ ? 0 : index);
      return make_named<decltype(view), inner_env, varying>(std::move(view));
    }
  }

  std::string_view verb_;
  const F& f_;
  decltype(hold_all(std::declval<const std::tuple<const Args&...>&>())) holders_;
  std::array<std::optional<std::size_t>, count> dims_{};
  std::size_t size_ = 0;
  bool own_slices_ = false;
};

/// The results of a map over `call`, leaf by leaf: `output(leaf, entry)` for each leaf of the
/// mapped function's result with its out_axes entry, built again into the result's structure.
template <class Result, class OutAxes, class Output>
auto each_output(const OutAxes& out_axes, Output&& output) {
  const auto entries = spread_prefix<Result>(out_axes);
  auto outputs = [&]<std::size_t... K>(std::index_sequence<K...>) {
    return std::tuple{output.template operator()<K>(std::get<K>(entries))...};
  }(std::make_index_sequence<leaf_count<Result>()>{});
  return tree_unflatten<Result>(outputs);
}

/// vmap: one call, the axis a trailing vectorized dim of every value.
template <class Binding, class Call, class OutAxes, class Dest>
auto run_vectorized(const Call& call, const OutAxes& out_axes, Dest& dest) {
  using Outer = typename Call::outer_env;
  using Inner = typename Call::inner_env;
  constexpr std::string_view name = Binding::axis_type::name;
  const std::size_t n = call.size();
  frame_scope scope(frame{name, n, placement::vectorized, 0, nullptr, nullptr});
  auto result = call(0);
  const auto leaves = tree_leaves(result);
  return each_output<decltype(result)>(out_axes, [&]<std::size_t K>(auto entry) {
    using L = std::remove_cvref_t<std::tuple_element_t<K, decltype(leaves)>>;
    check_unstacked<Binding, Inner, K, decltype(entry), L>();
    auto named_leaf = to_inner<Inner>(std::get<K>(leaves));
    using T = typename decltype(named_leaf)::value_type;
    // The payload's last dim is the mapped axis (size 1 where the value does not vary, and
    // then broadcast): evaluated once, straight into the output's layout.
    const auto& payload = named_leaf.payload();
    dims_t shape(payload.shape().begin(), payload.shape().end());
    shape.pop_back();
    output_memory<T> out;
    strides_t strides;
    if constexpr (std::is_same_v<decltype(entry), none_t>) {
      out = output_memory_for<T, K>(call.verb(), name, shape, dest);
      strides = out.strides;
      strides.push_back(0);
    } else {
      const stacked_layout l = stack_layout(call.verb(), name, shape, n, entry, Outer::vectorized_count, K);
      out = output_memory_for<T, K>(call.verb(), name, l.shape, dest);
      auto [slab_strides, step] = out.slots(l.slot);
      strides = std::move(slab_strides);
      strides.push_back(step);
    }
    shape.push_back(std::is_same_v<decltype(entry), none_t> ? 1 : n);
    evaluate_into<T>(payload, shape, out.data, strides);
    return map_result<Outer, decltype(named_leaf)::varying, Dest>(std::move(out));
  });
}

/// One index's result leaves, in memory: what a collective returned is kept as it is (shared,
/// not copied), anything else is evaluated.
template <class Inner, class Result>
auto evaluate_leaves(const Result& r) {
  return unpack(tree_leaves(r), [](const auto&... leaf) {
    return std::tuple{[&] {
      const auto& payload = to_inner<Inner>(leaf).payload();
      using P = std::remove_cvref_t<decltype(payload)>;
      if constexpr (owns_its_data<P>) return payload;
      else return evaluate(payload);
    }()...};
  });
}

/// A result leaf's output from its slabs (one per index; one alone for out_axes none), each
/// ending with the `outer_vectorized` dims of the environment around the map.
template <class T, std::size_t K, class Entry, class Dest>
output_memory<T> write_output(std::string_view verb, std::string_view name, const std::vector<strided_block<T>>& slabs,
                              Entry entry, std::size_t outer_vectorized, Dest& dest) {
  if constexpr (std::is_same_v<Entry, none_t>) {
    output_memory<T> out = output_memory_for<T, K>(verb, name, slabs.front().shape, dest);
    copy_strided(slabs.front(), out.data, out.strides);
    return out;
  } else {
    const stacked_layout l = stack_layout(verb, name, slabs.front().shape, slabs.size(), entry, outer_vectorized, K);
    output_memory<T> out = output_memory_for<T, K>(verb, name, l.shape, dest);
    stack_slabs(slabs, out, l.slot);
    return out;
  }
}

/// pmap: one device thread per index, each with its own call; the results stacked from every
/// device's (or, for out_axes none, device 0's) memory.
template <class Binding, class Call, class OutAxes, class Dest>
auto run_on_devices(const Call& call, const OutAxes& out_axes, Dest& dest) {
  using Outer = typename Call::outer_env;
  using Inner = typename Call::inner_env;
  using result_type = decltype(call(0));
  constexpr std::string_view name = Binding::axis_type::name;
  const std::size_t n = call.size();
  // One slot per device, filled by its thread: an array, cheaper to compile than a std::vector of them.
  using leaves_type = decltype(evaluate_leaves<Inner>(std::declval<const result_type&>()));
  const auto results = std::make_unique<std::optional<leaves_type>[]>(n);
  run_devices(name, n, [&](std::size_t d) { results[d].emplace(evaluate_leaves<Inner>(call(d))); });
  return each_output<result_type>(out_axes, [&]<std::size_t K>(auto entry) {
    using L = std::remove_cvref_t<std::tuple_element_t<K, decltype(tree_leaves(std::declval<const result_type&>()))>>;
    check_unstacked<Binding, Inner, K, decltype(entry), L>();
    constexpr axis_mask varying = result_mask<Inner, L>;
    using T = typename std::remove_cvref_t<decltype(std::get<K>(*results[0]))>::value_type;
    std::vector<strided_block<T>> slabs;
    for (std::size_t d = 0; d < (std::is_same_v<decltype(entry), none_t> ? 1 : n); ++d) {
      slabs.push_back(block_of(std::get<K>(*results[d])));
      if (slabs.back().shape != slabs.front().shape)
        fail("namedax::", call.verb(), "<\"", name, "\">: devices returned values of different shapes for result ", K,
             ": device 0 returned ", slabs.front().shape, ", device ", d, " returned ", slabs.back().shape);
    }
    return map_result<Outer, varying, Dest>(
        write_output<T, K>(call.verb(), name, slabs, entry, Outer::vectorized_count, dest));
  });
}

/// The out_axes entries as text, for the processes to agree on.
template <class Result, class OutAxes>
std::string describe_out_axes(const OutAxes& out_axes) {
  std::string text;
  unpack(spread_prefix<Result>(out_axes), [&](const auto&... entry) {
    ((text += [&] {
       if constexpr (std::is_same_v<std::remove_cvref_t<decltype(entry)>, none_t>) return std::string(" none");
       else return message(" ", entry);
     }()),
     ...);
  });
  return text;
}

/// mpi::pmap: this process is one index of the axis (of the process grid `grid`); the results
/// of the others arrive by allgather.
template <class Binding, class Call, class OutAxes, class Dest>
auto run_on_processes(const Call& call, const OutAxes& out_axes, process_grid& processes, Dest& dest) {
  using Outer = typename Call::outer_env;
  using Inner = typename Call::inner_env;
  using result_type = decltype(call(0));
  constexpr std::string_view name = Binding::axis_type::name;
  const std::size_t n = call.size();
  auto [grid, index] = processes.push(name, n);
  const std::string what = message("namedax::", call.verb(), "<\"", name, "\">");
  // Before any collective, the processes meet: one whose own arguments failed a check has
  // thrown (mpi::pmap tells the others here), and a different size, kind of arguments or
  // out_axes fails on every process instead of in the exchange of the results.
  grid->agree_always(message(what, " of axis size ", n, call.own_slices() ? " on its own slices" : " on the whole arguments",
                             " with out_axes", describe_out_axes<result_type>(out_axes)),
                     what);
  std::optional<decltype(evaluate_leaves<Inner>(std::declval<const result_type&>()))> mine;
  try {
    frame_scope scope(frame{name, n, placement::devices, index, nullptr, grid});
    mine = evaluate_leaves<Inner>(call(index));
  } catch (...) {
    grid->raise_everywhere(std::current_exception());
  }
  std::string shapes;
  unpack(*mine, [&](const auto&... leaf) {
    ((shapes += message(" ", std::vector<std::size_t>(leaf.shape().begin(), leaf.shape().end()), " ",
                        dtype_name<typename std::remove_cvref_t<decltype(leaf)>::value_type>())),
     ...);
  });
  grid->agree_always(message("return from ", what, " with results", shapes), what);
  const std::string_view names[] = {name};
  process_channel& channel = grid->channel(names, nullptr);
  return each_output<result_type>(out_axes, [&]<std::size_t K>(auto entry) {
    using L = std::remove_cvref_t<std::tuple_element_t<K, decltype(tree_leaves(std::declval<const result_type&>()))>>;
    check_unstacked<Binding, Inner, K, decltype(entry), L>();
    constexpr axis_mask varying = result_mask<Inner, L>;
    auto mine_block = block_of(std::get<K>(*mine));
    using T = std::remove_cvref_t<decltype(*mine_block.data)>;
    xt::xarray<T> laid_out;  // a leaf that views memory in another order, as the exchange sends it
    make_row_major(mine_block, laid_out);
    std::vector<strided_block<T>> slabs{mine_block};
    xt::xarray<T> all;  // every process's leaf, gathered
    if (!std::is_same_v<decltype(entry), none_t> && !call.own_slices()) {
      const std::size_t elements = element_count(mine_block.shape);
      all = uninitialized_array<T>(std::array{n * elements});
      channel.allgather(mine_block.data, all.data(), elements * sizeof(T));
      slabs.assign(n, {all.data(), mine_block.shape, row_major_strides(mine_block.shape)});
      for (std::size_t d = 0; d < n; ++d) slabs[d].data += d * elements;
    }
    return map_result<Outer, varying, Dest>(
        write_output<T, K>(call.verb(), name, slabs, entry, Outer::vectorized_count, dest));
  });
}

/// The condition of run_map's static_assert: it prints as itself, not as the result's type.
template <bool NotCaptured>
inline constexpr bool map_result_is_not_captured_traced = NotCaptured;

/// Runs a map. `OnProcesses`: a process map (namedax::mpi::pmap), which splits the process
/// grid `processes` (null for vmap and pmap). `dest`: the caller's arrays for the results, or
/// no_destination.
template <class Binding, bool OnProcesses = false, class F, class InAxes, class OutAxes, class Dest, class... Args>
auto run_map(std::string_view verb, const F& f, const InAxes& in_axes, const OutAxes& out_axes, std::size_t axis_size,
             process_grid* processes, Dest& dest, const Args&... args) {
  // in_axes is a prefix of the argument list: one entry for all, or one per argument.
  auto entries = spread_prefix<std::tuple<Args...>>(in_axes);
  map_call<Binding, F, decltype(entries), Args...> call(verb, f, entries, axis_size, processes, args...);
  // A traced result from arguments that are not: the function captured a value grad traces,
  // which the map cannot see (C++ has no closure conversion); it must come as an argument.
  constexpr bool captures_traced = has_traced_leaves<decltype(call(0))>();
  static_assert(map_result_is_not_captured_traced<!captures_traced>,
                "namedax::vmap, pmap and shard_map: the mapped function returned a value computed from a value that "
                "grad traces and the function captured; pass that value to the map as an argument (in_axes "
                "namedax::none, or a replicated spec, where it is not mapped), and grad differentiates through the map");
  if constexpr (captures_traced) {
    return call(0);  // a value of the type the caller expects: the assertion above stays the only error
  } else {
    if constexpr (!std::is_same_v<Dest, no_destination>) {
      static_assert(map_call<Binding, F, decltype(entries), Args...>::outer_env::size == 0,
                    "namedax: into writes a map's results into arrays at the top level, outside every map");
      static_assert(leaf_count<Dest>() == leaf_count<decltype(call(0))>(),
                    "namedax: into takes one output array per result leaf, in a pytree shaped as the result (std::tie "
                    "of arrays for a tuple of results)");
    }
    if constexpr (Binding::place == placement::vectorized) return run_vectorized<Binding>(call, out_axes, dest);
    else if constexpr (OnProcesses) return run_on_processes<Binding>(call, out_axes, *processes, dest);
    else return run_on_devices<Binding>(call, out_axes, dest);
  }
}

template <class Binding, bool OnProcesses = false, class F, class InAxes, class OutAxes, class... Args>
auto call_map(std::string_view verb, const F& f, const InAxes& in_axes, const OutAxes& out_axes, std::size_t axis_size,
              process_grid* processes, const Args&... args) {
  no_destination fresh;
  return run_map<Binding, OnProcesses>(verb, f, in_axes, out_axes, axis_size, processes, fresh, args...);
}

/// A map object (vmap's, pmap's or shard_map's) called on `args`: `run(args...)`, or, with
/// traced leaves among them (grad outside the map), the maps' derivative rule in
/// detail/autodiff.hpp, which records the call. `run` is generic, so that it is instantiated
/// only for the arguments it runs on.
template <class Map, class Run, class... Args>
auto run_or_record(const Map& map, const Run& run, const Args&... args) {
  if constexpr ((false || ... || has_traced_leaves<Args>())) {
    using map_rule = typename dependent<std::tuple<Args...>, derivative<rule::map, void>>::type;
    return map_rule::apply(map, args...);
  } else {
    return run(args...);
  }
}

/// The memory of a leaf held by reference (hold: a container), as bytes; empty for any other.
template <class L>
std::span<const std::byte> memory_of(const L& leaf) {
  if constexpr (!std::is_arithmetic_v<L> && std::is_base_of_v<xt::xcontainer<L>, L>)
    return std::as_bytes(std::span(leaf.data(), leaf.size()));
  else return {};
}
NAMEDAX_DECL bool memory_overlaps(std::span<const std::byte> a, std::span<const std::byte> b);

/// Whether an array of `outputs` shares memory with a container among the arguments' leaves.
template <class Outputs, class... Args>
bool outputs_overlap_arguments(const Outputs& outputs, const Args&... args) {
  bool overlap = false;
  tree_for_each(outputs, [&](const auto& out) {
    const auto written = memory_of(out);
    (tree_for_each(args, [&](const auto& arg) { overlap = overlap || memory_overlaps(written, memory_of(arg)); }), ...);
  });
  return overlap;
}
/// The type of a copy of leaf type L that owns its elements: L itself, but for an adaptor of
/// the caller's memory (xt::adapt), whose copy would still read that memory: the container of
/// the same rank or fixed shape.
template <class L>
struct owning_copy {
  using type = L;
};
template <class EC, xt::layout_type L, class SC, class Tag>
struct owning_copy<xt::xarray_adaptor<EC, L, SC, Tag>> {
  using type = xt::xarray<typename xt::xarray_adaptor<EC, L, SC, Tag>::value_type>;
};
template <class EC, std::size_t N, xt::layout_type L, class Tag>
struct owning_copy<xt::xtensor_adaptor<EC, N, L, Tag>> {
  using type = xt::xtensor<typename xt::xtensor_adaptor<EC, N, L, Tag>::value_type, N>;
};
template <class EC, class S, xt::layout_type L, bool Sharable, class Tag>
struct owning_copy<xt::xfixed_adaptor<EC, S, L, Sharable, Tag>> {
  using type = xt::xtensor_fixed<typename xt::xfixed_adaptor<EC, S, L, Sharable, Tag>::value_type, S>;
};

/// A copy of an argument whose containers own their elements (owning_copy), and whose nodes
/// hold values where the argument's hold references (std::tie).
template <class X>
auto copy_tree(const X& x) {
  return detail::tree_map(x, []<class L>(const L& leaf) { return typename owning_copy<L>::type(leaf); });
}

/// A map (vmap or pmap) as an object: called, it returns its results in fresh arrays;
/// `into(outputs)` gives the same map writing them into the caller's arrays.
template <class Binding, class F, class InAxes, class OutAxes>
class mapped_function {
 public:
  mapped_function(std::string_view verb, F f, InAxes in_axes, OutAxes out_axes, std::size_t axis_size)
      : verb_(verb), f_(std::move(f)), in_axes_(std::move(in_axes)), out_axes_(std::move(out_axes)), axis_size_(axis_size) {}

  template <class... Args>
  auto operator()(const Args&... args) const {
    auto run = [&](const auto&... a) { return call_map<Binding>(verb_, f_, in_axes_, out_axes_, axis_size_, nullptr, a...); };
    return run_or_record(*this, run, args...);
  }

  /// The same map (axis, placement, axis_size) of another function, with other in_axes and
  /// out_axes: the map of a pullback.
  template <class G, class In, class Out>
  auto remapped(G g, In in_axes, Out out_axes) const {
    return mapped_function<Binding, G, In, Out>(verb_, std::move(g), std::move(in_axes), std::move(out_axes), axis_size_);
  }
  [[nodiscard]] const F& function() const { return f_; }
  [[nodiscard]] const InAxes& in_axes() const { return in_axes_; }
  [[nodiscard]] const OutAxes& out_axes() const { return out_axes_; }

  /// The map writing each result leaf into the matching array of `outputs` (one array, or a
  /// pytree of references such as std::tie(a, b)), resized only when its shape differs, so
  /// that a map called in a loop reuses its output memory. Returns `outputs`.
  template <class Outputs>
  auto into(Outputs&& outputs) const {
    return [this, &outputs](const auto&... args) -> Outputs& {
      // An output that is also an argument (an in-place step x = f(x)) would be written while
      // the results are still read from it: the arguments are copied first.
      if (outputs_overlap_arguments(outputs, args...))
        (void)run_map<Binding>(verb_, f_, in_axes_, out_axes_, axis_size_, nullptr, outputs, copy_tree(args)...);
      else
        (void)run_map<Binding>(verb_, f_, in_axes_, out_axes_, axis_size_, nullptr, outputs, args...);
      return outputs;
    };
  }

 private:
  std::string_view verb_;
  F f_;
  InAxes in_axes_;
  OutAxes out_axes_;
  std::size_t axis_size_;
};

#if NAMEDAX_DEFINITIONS  // the bodies of the functions declared above (see detail/compilation.hpp)

NAMEDAX_DECL bool memory_overlaps(std::span<const std::byte> a, std::span<const std::byte> b) {
  if (a.empty() || b.empty()) return false;
  const auto begin = [](std::span<const std::byte> s) { return reinterpret_cast<std::uintptr_t>(s.data()); };
  return begin(a) < begin(b) + b.size() && begin(b) < begin(a) + a.size();
}

NAMEDAX_DECL std::string argument_name(std::span<const std::size_t> leaf_counts, std::size_t leaf) {
  for (std::size_t k = 0; k < leaf_counts.size(); leaf -= leaf_counts[k], ++k)
    if (leaf < leaf_counts[k])
      return leaf_counts[k] == 1 ? message("argument ", k) : message("argument ", k, ", leaf ", leaf);
  return message("leaf ", leaf);
}

NAMEDAX_DECL map_extent check_map_arguments(std::string_view verb, std::string_view name, std::span<map_leaf> leaves,
                                            std::span<const std::size_t> leaf_counts, std::size_t axis_size,
                                            std::size_t static_extent, placement place, std::size_t processes) {
  // Over plain data the types cannot show an enclosing map of the same name; the thread's frames do.
  if (const frame* enclosing = find_frame(name))
    fail("namedax::", verb, "<\"", name, "\">: axis '", name, "' is already bound by an enclosing namedax::",
         map_verb(*enclosing), "<\"", name, "\">; give the inner map an axis name of its own");
  std::optional<std::size_t> size;
  std::size_t size_from = 0;
  for (std::size_t k = 0; k < leaves.size(); ++k) {
    map_leaf& leaf = leaves[k];
    if (!leaf.entry) continue;
    const auto position = position_of(*leaf.entry, leaf.shape.size());
    if (!position)  // the message only on failure: a map call builds no strings
      fail_axis_range(verb, name, message("in_axes of ", argument_name(leaf_counts, k)), *leaf.entry, leaf.shape.size());
    const std::size_t d = *position;
    leaf.dim = d;
    if (size && *size != leaf.shape[d])
      fail("namedax::", verb, "<\"", name, "\">: mapped arguments differ in size along the axis: ",
           argument_name(leaf_counts, size_from), " has ", *size, ", ", argument_name(leaf_counts, k), " has ",
           leaf.shape[d], " (positional shape ", leaf.shape, ")");
    if (!size) size = leaf.shape[d], size_from = k;
  }
  map_extent extent;
  if (processes) {  // a process map may also take each process's own slice (extent 1), and defaults to every process
    const std::size_t given = axis_size ? axis_size : size && *size != 1 ? *size : processes;
    extent.own_slices = size && *size == 1 && given != 1;
    if (size && !extent.own_slices && *size != given)
      fail("namedax::", verb, "<\"", name, "\">: the arguments give axis size ", *size, " but axis_size is ", given);
    if (given == 0 || processes % given != 0)
      fail("namedax::", verb, "<\"", name, "\">: an axis of size ", given, " cannot be spread over ", processes,
           " processes; the number of processes must be a multiple of the axis size");
    size = given;
  }
  if (size && axis_size && *size != axis_size)  // JAX raises too; ignoring either would map the wrong size
    fail("namedax::", verb, "<\"", name, "\">: the arguments give axis size ", *size, " but axis_size is ", axis_size);
  if (!size) {
    if (axis_size == 0)
      fail("namedax::", verb, "<\"", name, "\">: no argument is mapped, so the axis size is unknown; pass axis_size");
    size = axis_size;
  }
  extent.size = *size;
  if (static_extent != dynamic_extent && extent.size != static_extent)
    fail("namedax::", verb, "<\"", name, "\">: the axis has static size ", static_extent, " but the arguments give ",
         extent.size);
  if (place == placement::devices && extent.size == 0)
    fail("namedax::", verb, "<\"", name, "\">: cannot map over zero devices");
  return extent;
}
[[noreturn]] NAMEDAX_DECL void fail_axis_range(std::string_view verb, std::string_view name, std::string_view what,
                                               int axis, std::size_t count) {
  const int n = static_cast<int>(count);
  // Only an in_axes entry can meet no positions: an out_axes entry has the rank + 1.
  if (n == 0) fail("namedax::", verb, "<\"", name, "\">: ", what, " is ", axis,
                   ", but the value has no positional dim; give it in_axes namedax::none");
  fail("namedax::", verb, "<\"", name, "\">: ", what, " is ", axis, ", out of range for ", n,
       n == 1 ? " position (valid: " : " positions (valid: ", -n, " to ", n - 1, ")");
}

NAMEDAX_DECL void check_into_rank(std::string_view verb, std::string_view name, std::size_t leaf,
                                  std::span<const std::size_t> shape, std::size_t rank) {
  if (shape.size() != rank)
    fail("namedax::", verb, "<\"", name, "\">: into: output ", leaf, " is an array of rank ", rank,
         " and cannot hold result ", leaf, " of shape ", shape, "; give an array of rank ", shape.size(), ", or an xt::xarray");
}

NAMEDAX_DECL void check_into_shape(std::string_view verb, std::string_view name, std::size_t leaf,
                                   std::span<const std::size_t> shape, std::span<const std::size_t> fixed) {
  if (!std::equal(shape.begin(), shape.end(), fixed.begin(), fixed.end()))
    fail("namedax::", verb, "<\"", name, "\">: into: output ", leaf, " has the fixed shape ", fixed,
         " and cannot hold result ", leaf, " of shape ", shape, "; give an array of that shape, or an xt::xarray");
}

NAMEDAX_DECL stacked_layout stack_layout(std::string_view verb, std::string_view name,
                                         std::span<const std::size_t> slab, std::size_t count, int out_axes,
                                         std::size_t outer_vectorized, std::size_t leaf) {
  const std::size_t positional = slab.size() - outer_vectorized;
  const auto position = position_of(out_axes, positional + 1);
  if (!position) fail_axis_range(verb, name, message("out_axes of result ", leaf), out_axes, positional + 1);
  const std::size_t o = *position;
  stacked_layout l{{}, o};
  for (std::size_t k = 0; k <= slab.size(); ++k) {
    if (k == o) l.shape.push_back(count);
    if (k < slab.size()) l.shape.push_back(slab[k]);
  }
  if (element_count_overflows(l.shape))
    fail("namedax::", verb, "<\"", name, "\">: stacking ", count, " results of shape ", slab,
         " gives more elements than std::size_t counts; slice or reduce the results first");
  return l;
}
#endif  // NAMEDAX_DEFINITIONS

}  // namespace detail
}  // namespace namedax
