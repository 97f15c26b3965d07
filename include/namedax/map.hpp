// SPDX-License-Identifier: MIT
// vmap and pmap: bind a named axis, as a vectorized dimension or as simulated devices, run
// the function with named values, and stack its results along out_axes.
#pragma once

#include <namedax/detail/devices.hpp>
#include <namedax/detail/reduction.hpp>
#include <namedax/named_array.hpp>

#include <optional>
#include <tuple>

namespace namedax {

/// `in_axes` entry of an argument that is not mapped (JAX's None).
struct none_t {
  explicit constexpr none_t() = default;
};
inline constexpr none_t none{};

namespace detail {

template <class T>
inline constexpr bool is_tuple = false;
template <class... T>
inline constexpr bool is_tuple<std::tuple<T...>> = true;

/// The in_axes entry of argument K: one int or none for all, or a tuple with one per argument.
template <std::size_t K, class InAxes>
auto in_axis_of(const InAxes& in_axes) {
  if constexpr (is_tuple<InAxes>) return std::get<K>(in_axes);
  else return in_axes;
}

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

inline std::size_t canonical_axis(std::string_view verb, std::string_view name, std::string_view what, int axis,
                                  std::size_t count) {
  int d = axis < 0 ? axis + static_cast<int>(count) : axis;
  if (d < 0 || d >= static_cast<int>(count))
    fail("namedax::", verb, "<\"", name, "\">: ", what, " ", axis, " is out of range for ", count, " positions");
  return static_cast<std::size_t>(d);
}

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

/// Where a map's output goes: its shape (a slab's, with the mapped axis of `count` inserted
/// at out_axes), the strides of a slab's dims in it, and the step from one slab to the next.
struct stacked_layout {
  dims_t shape;
  strides_t slab_strides;
  std::ptrdiff_t slot_step;
};

/// `outer_vectorized`: the number of vectorized dims of the environment around the map, which
/// end each slab.
inline stacked_layout stack_layout(std::string_view verb, std::string_view name, std::span<const std::size_t> slab,
                                   std::size_t count, int out_axes, std::size_t outer_vectorized) {
  const std::size_t positional = slab.size() - outer_vectorized;
  const std::size_t o = canonical_axis(verb, name, "out_axes", out_axes, positional + 1);
  stacked_layout l{{}, {}, 0};
  for (std::size_t k = 0; k <= slab.size(); ++k) {
    if (k == o) l.shape.push_back(count);
    if (k < slab.size()) l.shape.push_back(slab[k]);
  }
  if (element_count_overflows(l.shape))
    fail("namedax::", verb, "<\"", name, "\">: stacking ", count, " results of shape ", slab,
         " gives more elements than std::size_t counts; slice or reduce the results first");
  l.slab_strides = row_major_strides(l.shape);
  l.slot_step = l.slab_strides[o];
  l.slab_strides.erase(l.slab_strides.begin() + static_cast<std::ptrdiff_t>(o));
  return l;
}

/// The stacked array as the map's result: the array itself, or in an enclosing map a value
/// of the outer environment that no longer varies along this map's axis.
template <class Outer, axis_mask Varying, class T>
auto stacked_result(xt::xarray<T> out) {
  if constexpr (Outer::size == 0) {
    return out;
  } else {
    constexpr axis_mask own_bit = axis_mask{1} << Outer::size;
    return make_named<shared_array<T>, Outer, Varying & ~own_bit>(share_array(std::move(out)));
  }
}

/// The map's output for one result leaf, from one slab per index of the mapped axis (each
/// with the positional dims, then the outer environment's vectorized dims): the new axis
/// goes to position out_axes, and the value keeps the outer environment.
template <class T>
xt::xarray<T> stack_slabs(std::string_view verb, std::string_view name, const std::vector<strided_block<T>>& slabs,
                          int out_axes, std::size_t outer_vectorized) {
  const stacked_layout l = stack_layout(verb, name, slabs.front().shape, slabs.size(), out_axes, outer_vectorized);
  auto out = uninitialized_array<T>(l.shape);
  for (std::size_t d = 0; d < slabs.size(); ++d)
    copy_strided(slabs[d], out.data() + static_cast<std::ptrdiff_t>(d) * l.slot_step, l.slab_strides);
  return out;
}
template <class Outer, axis_mask Varying, class T>
auto map_output(std::string_view verb, std::string_view name, const std::vector<strided_block<T>>& slabs,
                int out_axes) {
  // The stacking depends on the element type alone: one copy of it per type, not per leaf.
  return stacked_result<Outer, Varying>(stack_slabs<T>(verb, name, slabs, out_axes, Outer::vectorized_count));
}

/// Runs a map. `OnProcesses`: a process map (namedax::mpi::pmap), which splits the process
/// grid `processes` (null for vmap and pmap).
template <class Binding, bool OnProcesses = false, class F, class InAxes, class... Args>
auto call_map(std::string_view verb, const F& f, const InAxes& in_axes, int out_axes, std::size_t axis_size,
              process_grid* processes, const Args&... args) {
  using A = typename Binding::axis_type;
  constexpr placement P = Binding::place;
  using Outer = typename merged_env<env<>, Args...>::type;
  if constexpr (Outer::index_of(A::name) >= 0) (void)sizeof(axis_bound_twice<A>);
  // Over plain data the types cannot show an enclosing map of the same name; the thread's frames do.
  if (const frame* enclosing = find_frame(A::name))
    fail("namedax::", verb, "<\"", A::name, "\">: axis '", A::name, "' is already bound by an enclosing namedax::",
         map_verb(*enclosing), "<\"", A::name, "\">; give the inner map an axis name of its own");
  using Inner = typename env_push<Outer, Binding>::type;
  using arg_types = std::tuple<Args...>;
  constexpr std::size_t count = sizeof...(Args);
  if constexpr (is_tuple<InAxes>)
    static_assert(std::tuple_size_v<InAxes> == count,
                  "namedax::vmap/pmap: in_axes must have one entry per argument of the mapped function");

  auto holders = std::tuple{hold(args)...};
  std::array<std::optional<std::size_t>, count> dims{};
  std::optional<std::size_t> size;
  std::size_t size_from = 0;
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    (
        [&] {
          using X = std::tuple_element_t<K, arg_types>;
          using InAxis = decltype(in_axis_of<K>(in_axes));
          if constexpr (!std::is_same_v<InAxis, none_t> && !std::is_arithmetic_v<X>) {
            const auto& c = held(std::get<K>(holders));
            const std::size_t rank = c.dimension() - vectorized_dims_of<X>();
            const std::size_t d = canonical_axis(verb, A::name, message("in_axes of argument ", K), in_axis_of<K>(in_axes), rank);
            dims[K] = d;
            if (size && *size != c.shape()[d])
              fail("namedax::", verb, "<\"", A::name, "\">: mapped arguments differ in size along the axis: argument ",
                   size_from, " has ", *size, ", argument ", K, " has ", c.shape()[d], " (positional shape ",
                   std::vector<std::size_t>(c.shape().begin(), c.shape().begin() + static_cast<std::ptrdiff_t>(rank)),
                   ")");
            if (!size) size = c.shape()[d], size_from = K;
          }
        }(),
        ...);
  }(std::make_index_sequence<count>{});
  // A process map may also take each process's own slice (extent 1) and defaults to every process.
  bool own_slices = false;
  if (processes) {
    const std::size_t available = processes->block_size();
    const std::size_t given = axis_size ? axis_size : size && *size != 1 ? *size : available;
    own_slices = size && *size == 1 && given != 1;
    if (size && !own_slices && *size != given)
      fail("namedax::", verb, "<\"", A::name, "\">: the arguments give axis size ", *size, " but axis_size is ", given);
    if (given == 0 || available % given != 0)
      fail("namedax::", verb, "<\"", A::name, "\">: an axis of size ", given, " cannot be spread over ", available,
           " processes; the number of processes must be a multiple of the axis size");
    size = given;
  }
  if (size && axis_size && *size != axis_size)  // JAX raises too; ignoring either would map the wrong size
    fail("namedax::", verb, "<\"", A::name, "\">: the arguments give axis size ", *size, " but axis_size is ", axis_size);
  if (!size) {
    if (axis_size == 0)
      fail("namedax::", verb, "<\"", A::name, "\">: no argument is mapped, so the axis size is unknown; pass axis_size");
    size = axis_size;
  }
  const std::size_t n = *size;
  if (Binding::extent != dynamic_extent && n != Binding::extent)
    fail("namedax::", verb, "<\"", A::name, "\">: the axis has static size ", Binding::extent, " but the arguments give ", n);
  if (P == placement::devices && n == 0) fail("namedax::", verb, "<\"", A::name, "\">: cannot map over zero devices");

  auto argument = [&]<std::size_t K>(std::size_t device) {
    using X = std::tuple_element_t<K, arg_types>;
    using InAxis = decltype(in_axis_of<K>(in_axes));
    if constexpr (std::is_arithmetic_v<X>) {
      static_assert(std::is_same_v<InAxis, none_t>,
                    "namedax::vmap/pmap: a scalar argument cannot be mapped; give it in_axes namedax::none");
      return std::get<K>(holders);
    } else {
      constexpr axis_mask own_bit = axis_mask{1} << (Inner::size - 1);
      constexpr axis_mask varying = mask_of<X>() | (std::is_same_v<InAxis, none_t> ? 0 : own_bit);
      constexpr std::size_t rank = mapped_payload_rank<X, !std::is_same_v<InAxis, none_t>, Inner>();
      auto view = mapped_view<Inner, P, vectorized_dims_of<X>(), rank>(held(std::get<K>(holders)), dims[K], device);
      return make_named<decltype(view), Inner, varying>(std::move(view));
    }
  };
  auto call = [&](std::size_t device) {
    return [&]<std::size_t... K>(std::index_sequence<K...>) {
      return f(argument.template operator()<K>(device)...);
    }(std::make_index_sequence<count>{});
  };
  using result_type = decltype(call(0));

  if constexpr (P == placement::vectorized) {
    frame_scope scope(frame{A::name, n, placement::vectorized, 0, nullptr, nullptr});
    auto result = call(0);
    return tree_map(result, [&](const auto& leaf) {
      auto named_leaf = to_inner<Inner>(leaf);
      using T = typename decltype(named_leaf)::value_type;
      // The payload's last dim is the mapped axis (size 1 where the value does not vary, and
      // then broadcast): evaluated once, straight into the stacked layout.
      const auto& payload = named_leaf.payload();
      std::vector<std::size_t> shape(payload.shape().begin(), payload.shape().end());
      shape.pop_back();
      stacked_layout l = stack_layout(verb, A::name, shape, n, out_axes, Outer::vectorized_count);
      shape.push_back(n);
      l.slab_strides.push_back(l.slot_step);
      auto out = uninitialized_array<T>(l.shape);
      evaluate_into<T>(payload, shape, out.data(), l.slab_strides);
      return stacked_result<Outer, decltype(named_leaf)::varying>(std::move(out));
    });
  } else {
    // Each device's result leaves, in memory: an array a collective returned is kept as it
    // is (shared, not copied), anything else is evaluated.
    auto evaluate_leaves = [](const result_type& r) {
      return tree_map(r, [](const auto& leaf) {
        const auto& payload = to_inner<Inner>(leaf).payload();
        using P = std::remove_cvref_t<decltype(payload)>;
        if constexpr (std::is_same_v<P, shared_array<typename P::value_type>>) return payload;
        else return evaluate(payload);
      });
    };
    using leaves_type = decltype(evaluate_leaves(std::declval<const result_type&>()));
    // Stacks every result leaf along the new axis from its slabs, one per index, and rebuilds
    // the result's structure around them, nodes within nodes. `get` picks, from one index's
    // evaluated leaves, the part that `Part` (a leaf or node of the result type) describes.
    auto stack_leaves = [&](auto slabs_of) {
      auto stack = [&]<class Part>(const auto& self, auto get) {
        if constexpr (is_node<Part>) {
          using parts = decltype(children(std::declval<const Part&>()));
          return [&]<std::size_t... I>(std::index_sequence<I...>) {
            return make_like<Part>(self.template operator()<std::remove_cvref_t<std::tuple_element_t<I, parts>>>(
                self, [get](const auto& leaves) -> const auto& { return std::get<I>(children(get(leaves))); })...);
          }(std::make_index_sequence<std::tuple_size_v<parts>>{});
        } else {
          return map_output<Outer, result_mask<Inner, Part>>(verb, A::name, slabs_of(get), out_axes);
        }
      };
      return stack.template operator()<result_type>(stack, [](const auto& leaves) -> const auto& { return leaves; });
    };

    if constexpr (OnProcesses) {
      // This process is one index of the axis; the results of the others arrive by allgather.
      auto [grid, index] = processes->push(A::name, n);
      const std::string what = message("namedax::", verb, "<\"", A::name, "\">");
      // Before any collective, the processes meet: one whose own arguments failed a check has
      // thrown (mpi::pmap tells the others here), and a different size, kind of arguments or
      // out_axes fails on every process instead of in the exchange of the results.
      grid->agree_always(message(what, " of axis size ", n, own_slices ? " on its own slices" : " on the whole arguments",
                                 " with out_axes ", out_axes),
                         what);
      std::optional<leaves_type> mine;
      try {
        frame_scope scope(frame{A::name, n, placement::devices, index, nullptr, grid});
        mine = evaluate_leaves(call(own_slices ? 0 : index));
      } catch (...) {
        grid->raise_everywhere(std::current_exception());
      }
      std::string shapes;
      tree_for_each(*mine, [&](const auto& leaf) {
        shapes += message(" ", std::vector<std::size_t>(leaf.shape().begin(), leaf.shape().end()), " ",
                          dtype_name<typename std::remove_cvref_t<decltype(leaf)>::value_type>());
      });
      grid->agree_always(message("return from ", what, " with results", shapes), what);
      const std::string_view names[] = {A::name};
      process_channel& channel = grid->channel(names, nullptr);
      std::vector<std::shared_ptr<void>> gathered;  // the other processes' results, kept while stacking
      return stack_leaves([&](auto get) {
        const auto mine_block = block_of(get(*mine));
        using T = std::remove_cvref_t<decltype(*mine_block.data)>;
        if (own_slices) return std::vector<strided_block<T>>{mine_block};
        const std::size_t count = element_count(mine_block.shape);
        std::shared_ptr<xt::xarray<T>> all = shared_storage(uninitialized_array<T>(std::array{n * count}));
        channel.allgather(mine_block.data, all->data(), count * sizeof(T));
        gathered.push_back(all);
        std::vector<strided_block<T>> slabs(n, {all->data(), mine_block.shape, row_major_strides(mine_block.shape)});
        for (std::size_t d = 0; d < n; ++d) slabs[d].data += d * count;
        return slabs;
      });
    }

    std::vector<std::optional<leaves_type>> results(n);
    run_devices(A::name, n, [&](std::size_t d) { results[d] = evaluate_leaves(call(d)); });
    return stack_leaves([&](auto get) {
      using T = typename std::remove_cvref_t<decltype(get(*results[0]))>::value_type;
      std::vector<strided_block<T>> slabs;
      for (std::size_t d = 0; d < n; ++d) {
        slabs.push_back(block_of(get(*results[d])));
        if (slabs.back().shape != slabs.front().shape)
          fail("namedax::", verb, "<\"", A::name, "\">: devices returned values of different shapes: device 0 returned ",
               slabs.front().shape, ", device ", d, " returned ", slabs.back().shape);
      }
      return slabs;
    });
  }
}

}  // namespace detail

/// Maps `f` over axis `Name` as a vectorized dimension (JAX's `vmap(f, in_axes, out_axes,
/// axis_name=Name, axis_size)`). `in_axes`: an int or `none` for every argument, or a
/// std::tuple with one per argument. `Extent` fixes the axis size in the type.
///   auto f = namedax::vmap<"i">([](auto x) { return x / namedax::psum(x, "i"_ax); });
///   f(xt::xarray<float>{0, 1, 2, 3})  // {0, 1/6, 2/6, 3/6}
template <fixed_string Name, std::size_t Extent = dynamic_extent, class F, class InAxes = int>
auto vmap(F f, InAxes in_axes = 0, int out_axes = 0, std::size_t axis_size = 0) {
  return [f = std::move(f), in_axes, out_axes, axis_size](const auto&... args) {
    return detail::call_map<binding<axis<Name>, placement::vectorized, Extent>>("vmap", f, in_axes, out_axes,
                                                                                axis_size, nullptr, args...);
  };
}

/// Maps `f` over axis `Name` with one simulated device (a host thread) per index; the
/// collectives inside really exchange data among the devices (JAX's `pmap`).
///   namedax::pmap<"i">([](auto x) { return namedax::psum(x, "i"_ax); })(xt::arange<int>(4))  // {6, 6, 6, 6}
template <fixed_string Name, std::size_t Extent = dynamic_extent, class F, class InAxes = int>
auto pmap(F f, InAxes in_axes = 0, int out_axes = 0, std::size_t axis_size = 0) {
  return [f = std::move(f), in_axes, out_axes, axis_size](const auto&... args) {
    return detail::call_map<binding<axis<Name>, placement::devices, Extent>>("pmap", f, in_axes, out_axes, axis_size,
                                                                             nullptr, args...);
  };
}

}  // namespace namedax
