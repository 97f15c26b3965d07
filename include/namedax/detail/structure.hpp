// SPDX-License-Identifier: MIT
// The bodies of the structural operations over positional dims (views, dynamic slices,
// concatenation, the reshape family, take): each one's batching rule leaves the trailing
// vectorized dims of the payload in place, so it is batched over vmap axes as it stands.
// IWYU pragma: private
#pragma once

#include <namedax/detail/compilation.hpp>
#include <namedax/detail/pgather.hpp>
#include <namedax/detail/unpack.hpp>
#include <namedax/named_array.hpp>

#include <xtensor/xbroadcast.hpp>
#include <xtensor/xmanipulation.hpp>
#include <xtensor/xslice.hpp>
#include <xtensor/xstrided_view.hpp>
#include <xtensor/xview.hpp>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <initializer_list>
#include <numeric>
#include <optional>
#include <ranges>
#include <span>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace namedax {

/// A list of dims or extents: `{2, -1}`, or any range of integers (std::vector, std::array).
struct int_list {
  std::vector<std::ptrdiff_t> values;
  int_list(std::initializer_list<std::ptrdiff_t> v) : values(v) {}
  /// One value: `squeeze(x, 1)`, `reshape(x, -1)`.
  template <Dim D>
  int_list(D d) : values{static_cast<std::ptrdiff_t>(static_cast<int>(d))} {}
  template <std::ranges::input_range R>
    requires std::integral<std::ranges::range_value_t<R>>
  int_list(const R& r) : values(std::ranges::begin(r), std::ranges::end(r)) {}
};

/// Padding before and after each positional dim; a single pair pads every dim alike. Signed, so
/// that a negative width is reported rather than wrapped to a huge one.
using pad_widths = std::vector<std::pair<std::ptrdiff_t, std::ptrdiff_t>>;

namespace detail {

// ---------------------------------------------------------------- dims and shapes

/// `dim` (negative from the end) as an index into a positional rank `rank`.
NAMEDAX_DECL std::size_t positional_dim(std::string_view verb, std::ptrdiff_t dim, std::size_t rank);

/// Where a new dim goes among `rank` dims (stack, expand): 0..rank, negative from the end.
NAMEDAX_DECL std::size_t insertion_dim(std::string_view verb, std::ptrdiff_t dim, std::size_t rank);

/// The positional part of a payload's shape (the dims before its `vectorized` trailing ones).
template <class P>
std::vector<std::size_t> positional_shape(const P& p, std::size_t vectorized) {
  const auto& s = p.shape();
  return {s.begin(), s.end() - static_cast<std::ptrdiff_t>(vectorized)};
}
template <class P>
std::vector<std::size_t> trailing_shape(const P& p, std::size_t vectorized) {
  const auto& s = p.shape();
  return {s.end() - static_cast<std::ptrdiff_t>(vectorized), s.end()};
}

/// The payload in memory: itself when it is a container or a strided view of one (then views
/// of it are views of the value's memory), else evaluated once.
template <class P>
auto in_memory(P p) {
  if constexpr (StridedMemory<P>) return p;
  else return share_array(evaluate(p));
}

template <class P>
inline constexpr bool is_shared_array = false;
template <class T>
inline constexpr bool is_shared_array<shared_array<T>> = true;

/// Vectorized dims of several operands broadcast together: each is 1 or the axis's size.
NAMEDAX_DECL std::vector<std::size_t> broadcast_trailing(std::initializer_list<std::vector<std::size_t>> all);

/// Calls `f(index)` for every index of `shape` in row-major order (once for an empty shape).
template <class F>
void for_each_index(std::span<const std::size_t> shape, F&& f) {
  std::vector<std::size_t> index(shape.size(), 0);
  for (auto e : shape)
    if (e == 0) return;
  while (true) {
    f(std::span<const std::size_t>(index));
    std::size_t k = shape.size();
    while (k > 0) {
      --k;
      if (++index[k] < shape[k]) break;
      index[k] = 0;
      if (k == 0) return;
    }
    if (shape.empty()) return;
  }
}

/// The offset of `index` (one entry per trailing dim) in a block whose trailing dims start at
/// `first` and have `strides` (0 where the block has size 1: it broadcasts).
inline std::ptrdiff_t trailing_offset(std::span<const std::size_t> index, std::span<const std::ptrdiff_t> strides, std::size_t first) {
  std::ptrdiff_t o = 0;
  for (std::size_t k = 0; k < index.size(); ++k) o += static_cast<std::ptrdiff_t>(index[k]) * strides[first + k];
  return o;
}

// ---------------------------------------------------------------- view

template <class S>
inline constexpr bool is_newaxis_slice = std::is_same_v<std::remove_cvref_t<S>, xt::xnewaxis_tag>;
template <class S>
inline constexpr bool is_ellipsis_slice = std::is_same_v<std::remove_cvref_t<S>, xt::xellipsis_tag>;
template <class S>
inline constexpr bool is_keep_or_drop = xt::detail::is_xkeep_slice<std::remove_cvref_t<S>>::value ||
                                        xt::detail::is_xdrop_slice<std::remove_cvref_t<S>>::value;

/// Named so that a failing static_assert prints the slice types.
template <class... S>
inline constexpr bool slices_are_positional = (!Axis<S> && ...);
template <class... S>
inline constexpr bool at_most_one_ellipsis = ((is_ellipsis_slice<S> ? 1 : 0) + ... + 0) <= 1;
template <class... S>
inline constexpr bool ellipsis_without_keep_or_drop = !(is_ellipsis_slice<S> || ...) || !(is_keep_or_drop<S> || ...);

template <class S>
inline constexpr bool is_range_adaptor = false;
template <class A, class B, class C>
inline constexpr bool is_range_adaptor<xt::xrange_adaptor<A, B, C>> = true;

/// The errors of the slices that xtensor takes unchecked (see normalized_slice).
[[noreturn]] NAMEDAX_DECL void fail_zero_step(std::size_t dim);
NAMEDAX_DECL void check_kept_index(std::ptrdiff_t at, std::size_t extent, std::size_t dim);
[[noreturn]] NAMEDAX_DECL void fail_dropped(std::size_t extent, std::size_t dim);

/// A slice of dim `dim` of extent `extent`, checked where xtensor does not check it: an integer
/// (taken from the end when negative), a range's step (xtensor divides by it), the indices of
/// xt::keep (read as given, past the dim too) and of xt::drop (miscounted unless distinct, in
/// range and increasing).
template <class S>
auto normalized_slice(const S& s, std::size_t extent, std::size_t dim) {
  if constexpr (std::is_integral_v<S>) {
    const auto n = static_cast<std::ptrdiff_t>(extent);
    const auto i = static_cast<std::ptrdiff_t>(s);
    const std::ptrdiff_t at = i < 0 ? i + n : i;
    if (at < 0 || at >= n)
      fail("namedax::view: index ", i, " is out of range for dim ", dim, " of extent ", extent, "; pass an index in [", -n,
           ", ", n, ")");
    return static_cast<std::size_t>(at);
  } else {
    if constexpr (is_range_adaptor<S>) {
      if constexpr (std::is_integral_v<decltype(s.step())>)
        if (s.step() == 0) fail_zero_step(dim);
    } else if constexpr (xt::detail::is_xkeep_slice<S>::value) {
      auto kept = s;
      kept.normalize(extent);
      for (std::ptrdiff_t k = 0; k < static_cast<std::ptrdiff_t>(kept.size()); ++k)
        check_kept_index(static_cast<std::ptrdiff_t>(kept(k)), extent, dim);
    } else if constexpr (xt::detail::is_xdrop_slice<S>::value) {
      // The elements xtensor keeps must be the ones the indices do not name, in order.
      auto dropped = s;
      dropped.normalize(extent);
      const auto left = static_cast<std::ptrdiff_t>(dropped.size());
      std::ptrdiff_t kept = 0;
      bool right = left >= 0;
      for (std::size_t i = 0; right && i < extent; ++i)
        if (dropped.contains(static_cast<std::ptrdiff_t>(i)))
          right = kept < left && static_cast<std::size_t>(dropped(kept++)) == i;
      if (!right || kept != left) fail_dropped(extent, dim);
    }
    return s;
  }
}

template <class... S>
struct view_op {
  std::tuple<S...> slices;

  template <class Y>
  auto operator()(const Y& y) const {
    using Env = typename Y::env_type;
    const auto shape = positional_shape(y.payload(), Env::vectorized_count);
    constexpr std::size_t taking = ((is_newaxis_slice<S> || is_ellipsis_slice<S> ? 0 : 1) + ... + 0);
    if (taking > shape.size())
      fail("namedax::view: ", taking, " slices select dims of a value of positional shape ", shape,
           "; give at most one slice per positional dim (the vmap axes are not sliced)");
    if constexpr ((is_ellipsis_slice<S> || ...)) {
      auto payload = in_memory(y.payload());
      return make_named<decltype(xt::strided_view(std::move(payload), xt::xstrided_slice_vector{})), Env, Y::varying>(
          xt::strided_view(std::move(payload), expanded(shape, taking)));
    } else {
      return unpack(slices, [&](const auto&... s) {
        auto v = select(y.payload(), shape, s...);
        return make_named<decltype(v), Env, Y::varying>(std::move(v));
      });
    }
  }

 private:
  // Without an ellipsis the slices select the leading dims and xt::view leaves the rest,
  // the vectorized ones included, whole; an integer slice is checked against its dim.
  template <class P, class... T>
  static auto select(P p, const std::vector<std::size_t>& shape, const T&... s) {
    return [&]<std::size_t... K>(std::index_sequence<K...>) {
      // The dim each slice selects: newaxis slices select none.
      constexpr std::array<bool, sizeof...(T)> takes{!is_newaxis_slice<T>...};
      constexpr auto dim = [&] {
        std::array<std::size_t, sizeof...(T)> d{};
        for (std::size_t k = 0, at = 0; k < d.size(); ++k) d[k] = at, at += takes[k] ? 1 : 0;
        return d;
      }();
      auto fix = [&](const auto& slice, std::size_t at) {
        if constexpr (is_newaxis_slice<decltype(slice)>) return slice;
        else return normalized_slice(slice, shape[at], at);
      };
      return xt::view(std::move(p), fix(s, dim[K])...);
    }(std::index_sequence_for<T...>{});
  }

  // With an ellipsis, a runtime slice vector: the ellipsis becomes as many xt::all() as the
  // positional dims it covers, so that it never reaches the vectorized dims.
  xt::xstrided_slice_vector expanded(const std::vector<std::size_t>& shape, std::size_t taking) const {
    xt::xstrided_slice_vector out;
    std::size_t d = 0;
    unpack(slices, [&](const auto&... s) {
      auto add = [&](const auto& slice) {
        using T = std::remove_cvref_t<decltype(slice)>;
        if constexpr (is_ellipsis_slice<T>) {
          for (std::size_t k = 0; k < shape.size() - taking; ++k) out.push_back(xt::all());
          d += shape.size() - taking;
        } else if constexpr (is_newaxis_slice<T>) {
          out.push_back(xt::newaxis());
        } else if constexpr (std::is_integral_v<T>) {
          out.push_back(static_cast<std::ptrdiff_t>(normalized_slice(slice, shape[d], d))), ++d;
        } else {
          out.push_back(normalized_slice(slice, shape[d], d)), ++d;
        }
      };
      (add(s), ...);
    });
    return out;
  }
};

template <class X, class... S>
auto view(const X& x, const S&... slices) {
  return when_resolved(view_op<S...>{std::tuple{slices...}}, x);
}

// ---------------------------------------------------------------- dynamic slices

/// The payload of an index or update operand (a named value, an xtensor expression or a scalar).
template <class Env, class I>
auto index_payload(const I& idx) {
  if constexpr (std::is_arithmetic_v<I>) {
    xt::xarray<I> a = xt::xarray<I>::from_shape(std::vector<std::size_t>(Env::vectorized_count, 1));
    a.fill(idx);
    return share_array(std::move(a));
  } else {
    return payload_in<Env>(idx);
  }
}


/// The start indices of a dynamic slice as one int64 array per dim, each in the environment's
/// vectorized dims (size 1 where a start does not vary along an axis).
template <class Env, class... Starts>
std::vector<xt::xarray<std::int64_t>> start_arrays(std::string_view verb, const Starts&... starts) {
  std::vector<xt::xarray<std::int64_t>> out;
  auto add = [&](const auto& s) {
    using S = std::remove_cvref_t<decltype(s)>;
    static_assert(std::is_integral_v<value_type_of_t<S>> && !std::is_same_v<value_type_of_t<S>, bool>,
                  "namedax: start indices must be integers");
    if constexpr (std::is_arithmetic_v<S>) {
      xt::xarray<std::int64_t> a = xt::xarray<std::int64_t>::from_shape(std::vector<std::size_t>(Env::vectorized_count, 1));
      a.fill(static_cast<std::int64_t>(s));
      out.push_back(std::move(a));
    } else {
      auto p = payload_in<Env>(s);
      if (p.dimension() != Env::vectorized_count)
        fail("namedax::", verb, ": start index ", out.size(), " has positional shape ", positional_shape(p, Env::vectorized_count),
             "; each start is one integer (per index of the maps)");
      out.push_back(evaluate<std::int64_t>(p));
    }
  };
  (add(starts), ...);
  return out;
}

/// A start clamped as lax.dynamic_slice clamps it, so that `size` elements from it fit in `extent`.
inline std::size_t clamp_start(std::int64_t start, std::size_t extent, std::size_t size) {
  const auto high = static_cast<std::int64_t>(extent - size);
  return static_cast<std::size_t>(std::clamp<std::int64_t>(start, 0, high));
}

/// The starts at one index of the vectorized dims, clamped.
NAMEDAX_DECL std::vector<std::size_t> starts_at(const std::vector<xt::xarray<std::int64_t>>& starts,
                                                std::span<const std::size_t> index, std::span<const std::size_t> extents,
                                                std::span<const std::size_t> sizes);

NAMEDAX_DECL void check_slice_sizes(std::string_view verb, const std::vector<std::size_t>& shape, std::size_t starts,
                                    std::span<const std::size_t> sizes, std::string_view what);

template <std::size_t R>
struct dynamic_slice_op {
  std::array<std::size_t, R> sizes;

  template <class Y, class... Starts>
  auto operator()(const Y& y, const Starts&... starts) const {
    using Env = typename merged_env<env<>, Y, Starts...>::type;
    constexpr axis_mask varying = Y::varying | (mask_of<Starts>() | ... | 0);
    auto payload = payload_in<Env>(y);
    const auto shape = positional_shape(payload, Env::vectorized_count);
    check_slice_sizes("dynamic_slice", shape, sizeof...(Starts), sizes, "slice size");
    const auto all = start_arrays<Env>("dynamic_slice", starts...);
    if constexpr (((mask_of<Starts>() & Env::vectorized_mask) | ... | 0) == 0) {
      // One start per device: a view of this device's value.
      auto memory = in_memory(std::move(payload));
      xt::xstrided_slice_vector slices;
      for (std::size_t k = 0; k < R; ++k) {
        const auto at = static_cast<std::ptrdiff_t>(clamp_start(all[k].data()[0], shape[k], sizes[k]));
        slices.push_back(xt::range(at, at + static_cast<std::ptrdiff_t>(sizes[k])));
      }
      auto v = xt::strided_view(std::move(memory), slices);
      return make_named<decltype(v), Env, varying>(std::move(v));
    } else {
      // Starts that vary along a vmap axis: each index of it copies its own block (a gather).
      using T = typename Y::value_type;
      xt::xarray<T> storage;
      const auto src = block_in_memory<T>(payload, storage);
      std::vector<std::vector<std::size_t>> trailing{trailing_shape(payload, Env::vectorized_count)};
      for (const auto& s : all) trailing.emplace_back(s.shape().begin(), s.shape().end());
      std::vector<std::size_t> out_trailing(Env::vectorized_count, 1);
      for (const auto& t : trailing)
        for (std::size_t k = 0; k < out_trailing.size(); ++k) out_trailing[k] = broadcast_extent(out_trailing[k], t[k]);
      std::vector<std::size_t> out_shape(sizes.begin(), sizes.end());
      out_shape.insert(out_shape.end(), out_trailing.begin(), out_trailing.end());
      auto out = uninitialized_array<T>(out_shape);
      const auto out_strides = row_major_strides(out_shape);
      const std::span<const std::ptrdiff_t> block_strides(out_strides.data(), R);
      for_each_index(out_trailing, [&](std::span<const std::size_t> v) {
        const auto at = starts_at(all, v, shape, sizes);
        const T* from = src.data + trailing_offset(v, src.strides, R);
        for (std::size_t k = 0; k < R; ++k) from += static_cast<std::ptrdiff_t>(at[k]) * src.strides[k];
        strided_block<T> block{from, {sizes.begin(), sizes.end()}, {src.strides.begin(), src.strides.begin() + R}};
        copy_strided(block, out.data() + trailing_offset(v, out_strides, R), block_strides);
      });
      return make_named<shared_array<T>, Env, varying>(share_array(std::move(out)));
    }
  }
};

template <class X, class Starts, std::size_t R>
auto dynamic_slice(const X& x, const Starts& starts, const std::array<std::size_t, R>& sizes) {
  return unpack(starts, [&](const auto&... s) { return when_resolved(dynamic_slice_op<R>{sizes}, x, s...); });
}

/// Named so that a failing static_assert prints both element types.
template <class T, class U>
inline constexpr bool update_has_the_value_type = std::is_same_v<T, U>;

/// dynamic_update_slice on resolved operands. With a `target` (update_slice_in_place), y's
/// payload, which y's caller gave up and holds alone: the update is written into its array
/// where that already has the result's shape, and the result shares it.
template <class Target = void>
struct dynamic_update_slice_op {
  Target* target = nullptr;

  template <class Y, class U, class... Starts>
  auto operator()(const Y& y, const U& update, const Starts&... starts) const {
    using Env = typename merged_env<env<>, Y, U, Starts...>::type;
    using T = value_type_of_t<Y>;  // y may be a plain array, the update a named value
    constexpr axis_mask varying = mask_of<Y>() | mask_of<U>() | (mask_of<Starts>() | ... | 0);
    static_assert(update_has_the_value_type<T, value_type_of_t<U>> || std::is_arithmetic_v<U>,
                  "namedax::dynamic_update_slice: the update has another element type than the value; convert it "
                  "with namedax::cast");
    auto payload = payload_in<Env>(y);
    auto up = [&] {
      if constexpr (std::is_arithmetic_v<U>) return index_payload<Env>(static_cast<T>(update));
      else return payload_in<Env>(update);
    }();
    const auto shape = positional_shape(payload, Env::vectorized_count);
    const auto up_shape = positional_shape(up, Env::vectorized_count);
    if (up_shape.size() != shape.size())
      fail("namedax::dynamic_update_slice: the update has positional shape ", up_shape, " and the value ", shape,
           "; give an update of the value's positional rank");
    check_slice_sizes("dynamic_update_slice", shape, sizeof...(Starts), up_shape, "update extent");
    const auto all = start_arrays<Env>("dynamic_update_slice", starts...);
    std::vector<std::size_t> out_trailing(Env::vectorized_count, 1);
    auto widen = [&](const auto& t) {
      for (std::size_t k = 0; k < out_trailing.size(); ++k) out_trailing[k] = broadcast_extent(out_trailing[k], t[k]);
    };
    widen(trailing_shape(payload, Env::vectorized_count));
    widen(trailing_shape(up, Env::vectorized_count));
    for (const auto& s : all) widen(s.shape());
    std::vector<std::size_t> out_shape = shape;
    out_shape.insert(out_shape.end(), out_trailing.begin(), out_trailing.end());
    const auto out_strides = row_major_strides(out_shape);
    const bool in_place = [&] {
      if constexpr (std::is_void_v<Target>) return false;
      else return std::equal(target->shape().begin(), target->shape().end(), out_shape.begin(), out_shape.end());
    }();
    xt::xarray<T> fresh;
    if (!in_place) {
      fresh = uninitialized_array<T>(out_shape);
      evaluate_into<T>(payload, out_shape, fresh.data(), out_strides);
    }
    T* const out = [&] {
      if constexpr (std::is_void_v<Target>) return fresh.data();
      else return in_place ? target->data() : fresh.data();
    }();
    xt::xarray<typename decltype(up)::value_type> storage;
    const auto src = block_in_memory<typename decltype(up)::value_type>(up, storage);
    const std::size_t rank = shape.size();
    const std::span<const std::ptrdiff_t> block_strides(out_strides.data(), rank);
    for_each_index(out_trailing, [&](std::span<const std::size_t> v) {
      const auto at = starts_at(all, v, shape, up_shape);
      T* into = out + trailing_offset(v, out_strides, rank);
      for (std::size_t k = 0; k < rank; ++k) into += static_cast<std::ptrdiff_t>(at[k]) * out_strides[k];
      strided_block<typename decltype(up)::value_type> block{src.data + trailing_offset(v, src.strides, rank),
                                                             {up_shape.begin(), up_shape.end()},
                                                             {src.strides.begin(), src.strides.begin() + static_cast<std::ptrdiff_t>(rank)}};
      copy_strided(block, into, block_strides);
    });
    if constexpr (!std::is_void_v<Target>)
      if (in_place) return make_named<shared_array<T>, Env, varying>(y.payload());
    return make_named<shared_array<T>, Env, varying>(share_array(std::move(fresh)));
  }
};

template <class X, class U, class Starts>
auto dynamic_update_slice(const X& x, const U& update, const Starts& starts) {
  return unpack(starts, [&](const auto&... s) { return when_resolved(dynamic_update_slice_op<>{}, x, update, s...); });
}

/// dynamic_update_slice of a value its caller gives up: where nothing else holds its array and
/// the result has its shape (the update and starts vary along no other name), the update is
/// written into that array, as XLA does with a donated buffer; otherwise a copy is updated.
/// For loops that fill a result block by block (the collective matmul rings).
template <class T, class Env, axis_mask Varying, class U, class Starts>
auto update_slice_in_place(named<shared_array<T>, Env, Varying>&& x, const U& update, const Starts& starts) {
  shared_array<T> payload = std::move(x).payload();
  if (payload.use_count() != 1)
    return dynamic_update_slice(make_named<shared_array<T>, Env, Varying>(std::move(payload)), update, starts);
  const auto held = make_named<shared_array<T>, Env, Varying>(payload);  // shares the array
  const dynamic_update_slice_op<shared_array<T>> into{&payload};
  return unpack(starts, [&](const auto&... s) { return when_resolved(into, held, update, s...); });
}

// ---------------------------------------------------------------- concat and stack

/// Named so that a failing static_assert prints the environments of the values.
template <class E, class... Es>
inline constexpr bool nested_with_each = (environments_are_nested<E, Es> && ...);
template <class... Es>
inline constexpr bool values_share_one_map = (nested_with_each<Es, Es...> && ...);

template <class Tuple>
struct tuple_envs_share_one_map;
template <template <class...> class Tuple, class... Xs>
struct tuple_envs_share_one_map<Tuple<Xs...>> {
  static constexpr bool value = values_share_one_map<typename env_of<Xs>::type...>;
};
template <class X, std::size_t N>
struct tuple_envs_share_one_map<std::array<X, N>> {
  static constexpr bool value = true;
};

template <class T>
inline constexpr bool holds_named_value = false;
template <class... Xs>
inline constexpr bool holds_named_value<std::tuple<Xs...>> = (NamedOperand<Xs> || ...);
template <class X, std::size_t N>
inline constexpr bool holds_named_value<std::array<X, N>> = N > 0 && NamedOperand<X>;

/// Joins operands along a positional dim: `stack` inserts a new one, `concat` extends one.
template <bool Stack>
struct join_op {
  std::ptrdiff_t dim;

  template <class... Ys>
  auto operator()(const Ys&... ys) const {
    using Env = typename merged_env<env<>, Ys...>::type;
    using T = std::common_type_t<value_type_of_t<Ys>...>;
    constexpr axis_mask varying = (mask_of<Ys>() | ...);
    constexpr std::string_view verb = Stack ? "stack" : "concat";
    auto payloads = std::tuple{payload_in<Env>(ys)...};
    const std::vector<std::vector<std::size_t>> shapes = unpack(payloads,
        [](const auto&... p) { return std::vector<std::vector<std::size_t>>{positional_shape(p, Env::vectorized_count)...}; });
    const std::vector<std::size_t> out_trailing = unpack(payloads,
        [](const auto&... p) { return broadcast_trailing({trailing_shape(p, Env::vectorized_count)...}); });
    const auto& first = shapes[0];
    if (!Stack && first.empty())
      fail("namedax::concat: the values have positional rank 0; concatenate values of rank 1 or more, or stack scalars");
    const std::size_t d = Stack ? insertion_dim(verb, dim, first.size()) : positional_dim(verb, dim, first.size());
    std::size_t joined = 0;
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      const auto& s = shapes[k];
      bool match = s.size() == first.size();
      for (std::size_t j = 0; match && j < s.size(); ++j) match = s[j] == first[j] || (!Stack && j == d);
      if (!match)
        fail("namedax::", verb, ": value ", k, " has positional shape ", s, " and value 0 has ", first,
             Stack ? "; stack values of one shape" : "; the shapes must match except along the dim joined, ", Stack ? "" : message("dim ", d));
      joined += Stack ? 1 : s[d];
    }
    std::vector<std::size_t> out_shape = first;
    if (Stack) out_shape.insert(out_shape.begin() + static_cast<std::ptrdiff_t>(d), joined);
    else out_shape[d] = joined;
    out_shape.insert(out_shape.end(), out_trailing.begin(), out_trailing.end());
    auto out = uninitialized_array<T>(out_shape);
    const auto out_strides = row_major_strides(out_shape);
    // Strides of one operand's part: the output's, without the stacked dim.
    std::vector<std::ptrdiff_t> part_strides(out_strides.begin(), out_strides.end());
    if (Stack) part_strides.erase(part_strides.begin() + static_cast<std::ptrdiff_t>(d));
    const std::ptrdiff_t step = out_strides[d];
    std::size_t at = 0, k = 0;
    unpack(payloads, [&](const auto&... p) {
      auto put = [&](const auto& payload) {
        std::vector<std::size_t> part = shapes[k++];
        part.insert(part.end(), out_trailing.begin(), out_trailing.end());
        evaluate_into<T>(payload, part, out.data() + static_cast<std::ptrdiff_t>(at) * step, part_strides);
        at += Stack ? 1 : part[d];
      };
      (put(p), ...);
    });
    return make_named<shared_array<T>, Env, varying>(share_array(std::move(out)));
  }
};

template <bool Stack, class Values>
auto join(const Values& values, std::ptrdiff_t dim) {
  return unpack(values, [&](const auto&... xs) { return when_resolved(join_op<Stack>{dim}, xs...); });
}

// ---------------------------------------------------------------- the reshape family

/// A view of the payload with the positional shape `shape` and the same trailing dims: the
/// container's memory when the payload is one, else one evaluated copy.
template <class P>
auto reshaped(P p, std::vector<std::size_t> shape, std::size_t vectorized) {
  const auto trailing = trailing_shape(p, vectorized);
  shape.insert(shape.end(), trailing.begin(), trailing.end());
  // Strides over the container's own memory (xt::reshape_view reads through an adaptor that
  // points into the view object, which a copied payload would leave behind).
  auto strides = row_major_strides(shape);
  std::vector<std::ptrdiff_t> steps(strides.begin(), strides.end());
  if constexpr (is_shared_array<P>)
    return xt::strided_view(std::move(p), std::move(shape), std::move(steps), 0, xt::layout_type::dynamic);
  else
    return xt::strided_view(share_array(evaluate(p)), std::move(shape), std::move(steps), 0, xt::layout_type::dynamic);
}

/// The positional shape a reshape gives, with its -1 worked out.
NAMEDAX_DECL std::vector<std::size_t> reshape_target(const std::vector<std::size_t>& from,
                                                     const std::vector<std::ptrdiff_t>& to);

struct reshape_op {
  std::vector<std::ptrdiff_t> shape;
  template <class Y>
  auto operator()(const Y& y) const {
    using Env = typename Y::env_type;
    auto target = reshape_target(y.shape(), shape);
    auto v = reshaped(y.payload(), std::move(target), Env::vectorized_count);
    return make_named<decltype(v), Env, Y::varying>(std::move(v));
  }
};

/// A permutation of the positional dims (negative from the end), checked.
NAMEDAX_DECL std::vector<std::size_t> positional_permutation(std::string_view verb, const std::vector<std::ptrdiff_t>& axes,
                                                             std::size_t rank);

/// permute_dims's body: `order` is a permutation of the positional dims; the vectorized ones stay last.
template <class Y>
auto permuted(const Y& y, std::vector<std::size_t> order) {
  using Env = typename Y::env_type;
  for (std::size_t k = 0; k < Env::vectorized_count; ++k) order.push_back(y.dimension() + k);
  auto v = xt::transpose(in_memory(y.payload()), std::move(order));
  return make_named<decltype(v), Env, Y::varying>(std::move(v));
}

struct permute_dims_op {
  std::vector<std::ptrdiff_t> axes;
  template <class Y>
  auto operator()(const Y& y) const {
    return permuted(y, positional_permutation("permute_dims", axes, y.dimension()));
  }
};

struct moveaxis_op {
  std::ptrdiff_t source, destination;
  template <class Y>
  auto operator()(const Y& y) const {
    const std::size_t rank = y.dimension();
    const auto from = positional_dim("moveaxis", source, rank), to = positional_dim("moveaxis", destination, rank);
    std::vector<std::size_t> order;
    for (std::size_t k = 0; k < rank; ++k)
      if (k != from) order.push_back(k);
    order.insert(order.begin() + static_cast<std::ptrdiff_t>(to), from);
    return permuted(y, std::move(order));
  }
};

struct swapaxes_op {
  std::ptrdiff_t a, b;
  template <class Y>
  auto operator()(const Y& y) const {
    const std::size_t rank = y.dimension();
    std::vector<std::size_t> order(rank);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::swap(order[positional_dim("swapaxes", a, rank)], order[positional_dim("swapaxes", b, rank)]);
    return permuted(y, std::move(order));
  }
};

struct squeeze_op {
  std::optional<std::vector<std::ptrdiff_t>> dims;  // none: every dim of size 1
  template <class Y>
  auto operator()(const Y& y) const {
    using Env = typename Y::env_type;
    const auto shape = y.shape();
    std::vector<bool> drop(shape.size(), false);
    if (dims) {
      for (auto d : *dims) {
        const auto at = positional_dim("squeeze", d, shape.size());
        if (shape[at] != 1)
          fail("namedax::squeeze: dim ", d, " has extent ", shape[at], " in positional shape ", shape,
               "; squeeze only dims of extent 1");
        drop[at] = true;
      }
    } else {
      for (std::size_t k = 0; k < shape.size(); ++k) drop[k] = shape[k] == 1;
    }
    xt::xstrided_slice_vector slices;
    for (std::size_t k = 0; k < shape.size(); ++k) slices.push_back(drop[k] ? xt::xstrided_slice<std::ptrdiff_t>(0) : xt::all());
    auto v = xt::strided_view(in_memory(y.payload()), slices);
    return make_named<decltype(v), Env, Y::varying>(std::move(v));
  }
};

struct broadcast_to_op {
  std::vector<std::ptrdiff_t> shape;
  template <class Y>
  auto operator()(const Y& y) const {
    using Env = typename Y::env_type;
    const auto from = y.shape();
    bool fits = from.size() <= shape.size();
    for (std::size_t k = 0; fits && k < from.size(); ++k) {
      const auto target = shape[shape.size() - from.size() + k];
      fits = from[k] == 1 || static_cast<std::ptrdiff_t>(from[k]) == target;
    }
    for (auto e : shape) fits = fits && e >= 0;
    if (!fits)
      fail("namedax::broadcast_to: positional shape ", from, " does not broadcast to ", shape,
           "; aligned on the right, each dim must have extent 1 or the target's");
    std::vector<std::size_t> full(shape.begin(), shape.end());
    const auto trailing = trailing_shape(y.payload(), Env::vectorized_count);
    full.insert(full.end(), trailing.begin(), trailing.end());
    (void)checked_element_count("broadcast_to", full, sizeof(typename Y::value_type));  // lazy, but never evaluable
    auto payload = y.payload();  // held by value: the view must not refer to y, a local of the caller
    auto v = xt::broadcast(std::move(payload), std::move(full));
    return make_named<decltype(v), Env, Y::varying>(std::move(v));
  }
};

struct flip_op {
  std::optional<std::ptrdiff_t> dim;  // none: every positional dim
  template <class Y>
  auto operator()(const Y& y) const {
    using Env = typename Y::env_type;
    const std::size_t rank = y.dimension();
    xt::xstrided_slice_vector slices;
    const std::size_t only = dim ? positional_dim("flip", *dim, rank) : rank;
    for (std::size_t k = 0; k < rank; ++k)
      slices.push_back(!dim || k == only ? xt::xstrided_slice<std::ptrdiff_t>(xt::range(xt::placeholders::_, xt::placeholders::_, -1))
                                         : xt::xstrided_slice<std::ptrdiff_t>(xt::all()));
    auto v = xt::strided_view(in_memory(y.payload()), slices);
    return make_named<decltype(v), Env, Y::varying>(std::move(v));
  }
};

struct roll_op {
  std::ptrdiff_t shift, dim;
  template <class Y>
  auto operator()(const Y& y) const {
    using Env = typename Y::env_type;
    using T = typename Y::value_type;
    const auto payload = y.payload();
    const std::size_t d = positional_dim("roll", dim, y.dimension());
    xt::xarray<T> storage;
    const auto src = block_in_memory<T>(payload, storage);
    const std::vector<std::size_t> shape(src.shape.begin(), src.shape.end());
    auto out = uninitialized_array<T>(shape);
    const auto out_strides = row_major_strides(shape);
    const auto n = static_cast<std::ptrdiff_t>(shape[d]);
    if (n == 0 || out.size() == 0) return make_named<shared_array<T>, Env, Y::varying>(share_array(std::move(out)));
    const std::ptrdiff_t s = ((shift % n) + n) % n;
    // out[s:] = x[:n - s] and out[:s] = x[n - s:], along dim d.
    auto copy_part = [&](std::ptrdiff_t from, std::ptrdiff_t to, std::ptrdiff_t length) {
      if (length == 0) return;
      strided_block<T> part = src;
      part.data += from * src.strides[d];
      part.shape[d] = static_cast<std::size_t>(length);
      copy_strided(part, out.data() + to * out_strides[d], out_strides);
    };
    copy_part(0, s, n - s);
    copy_part(n - s, 0, s);
    return make_named<shared_array<T>, Env, Y::varying>(share_array(std::move(out)));
  }
};

/// The shape of a payload of `payload_shape` (positional dims `positional` first) padded by
/// `widths`, checked: one pair per positional dim or one for all, no negative width, and a
/// size that fits in memory's address space.
NAMEDAX_DECL std::vector<std::size_t> padded_shape(const std::vector<std::size_t>& positional,
                                                   std::span<const std::size_t> payload_shape, const pad_widths& widths,
                                                   std::size_t element_size);

template <class V>
struct pad_op {
  pad_widths widths;
  V value;
  template <class Y>
  auto operator()(const Y& y) const {
    using Env = typename Y::env_type;
    using T = typename Y::value_type;
    auto payload = y.payload();
    xt::xarray<T> storage;
    const auto src = block_in_memory<T>(payload, storage);
    const auto out_shape = padded_shape(y.shape(), src.shape, widths, sizeof(T));
    std::ptrdiff_t offset = 0;
    const auto width = [&](std::size_t k) { return widths.size() == 1 ? widths[0] : widths[k]; };
    auto out = uninitialized_array<T>(out_shape);
    std::fill(out.begin(), out.end(), static_cast<T>(value));
    const auto out_strides = row_major_strides(out_shape);
    for (std::size_t k = 0; k < y.shape().size(); ++k) offset += width(k).first * out_strides[k];
    copy_strided(src, out.data() + offset, out_strides);
    return make_named<shared_array<T>, Env, Y::varying>(share_array(std::move(out)));
  }
};

// ---------------------------------------------------------------- take

/// out[e] = src[src_offset(e) + i * step] with i = idx[idx_offset(e)], negative i counted from
/// the end of the `extent` of the dim taken along; an index out of [-extent, extent) reads the
/// fill value (jnp.take's mode "fill").
template <class T, class I>
xt::xarray<T> take_kernel(const T* src, std::span<const std::ptrdiff_t> src_strides, std::ptrdiff_t step, std::size_t extent,
                          const I* idx, std::span<const std::ptrdiff_t> idx_strides, std::span<const std::size_t> out_shape) {
  auto out = uninitialized_array<T>(out_shape);
  const auto out_strides = row_major_strides(out_shape);
  std::vector<std::ptrdiff_t> src_offset(out.size()), idx_offset(out.size());
  element_offsets(out_shape, src_strides, out_strides, src_offset);
  element_offsets(out_shape, idx_strides, out_strides, idx_offset);
  const auto n = static_cast<long long>(extent);
  for (std::size_t e = 0; e < out.size(); ++e) {
    auto i = static_cast<long long>(idx[idx_offset[e]]);
    if (i < 0) i += n;
    out.data()[e] = i >= 0 && i < n ? src[src_offset[e] + static_cast<std::ptrdiff_t>(i) * step] : gather_fill<T>();
  }
  return out;
}

/// Named so that a failing static_assert prints the index type.
template <class I>
inline constexpr bool is_integer_index = std::is_integral_v<I> && !std::is_same_v<I, bool>;

/// take (`along` false: the indices' dims replace the dim) and take_along_axis (`along` true:
/// the indices have the value's rank and pick along the dim, the other dims broadcast).
template <bool Along>
struct take_op {
  std::ptrdiff_t dim;

  template <class Y, class I>
  auto operator()(const Y& y, const I& indices) const {
    using Env = typename merged_env<env<>, Y, I>::type;
    using T = typename Y::value_type;
    using Index = value_type_of_t<I>;
    static_assert(is_integer_index<Index>, "namedax::take: indices must be integers");
    constexpr std::string_view verb = Along ? "take_along_axis" : "take";
    constexpr std::size_t vec = Env::vectorized_count;
    const auto payload = payload_in<Env>(y);
    const auto idx_payload = index_payload<Env>(indices);
    xt::xarray<T> src_storage;
    xt::xarray<Index> idx_storage;
    const auto src = block_in_memory<T>(payload, src_storage);
    const auto idx = block_in_memory<Index>(idx_payload, idx_storage);
    const std::size_t rank = src.shape.size() - vec, idx_rank = idx.shape.size() - vec;
    const std::size_t d = positional_dim(verb, dim, rank);
    std::vector<std::size_t> out_shape;
    std::vector<std::ptrdiff_t> src_strides, idx_strides;
    auto dim_of = [&](std::size_t extent, std::ptrdiff_t s, std::ptrdiff_t i) {
      out_shape.push_back(extent), src_strides.push_back(s), idx_strides.push_back(i);
    };
    if constexpr (Along) {
      if (idx_rank != rank)
        fail("namedax::take_along_axis: indices of positional shape ", positional(idx.shape, idx_rank),
             " for a value of positional shape ", positional(src.shape, rank), "; give indices of the value's rank");
      for (std::size_t k = 0; k < rank; ++k) {
        if (k == d) {
          dim_of(idx.shape[k], 0, idx.strides[k]);
          continue;
        }
        if (src.shape[k] != idx.shape[k] && src.shape[k] != 1 && idx.shape[k] != 1)
          fail("namedax::take_along_axis: indices of positional shape ", positional(idx.shape, idx_rank),
               " do not broadcast with the value's ", positional(src.shape, rank), " along dim ", k,
               "; the dims other than the one taken along must match or be 1");
        dim_of(broadcast_extent(src.shape[k], idx.shape[k]), src.strides[k], idx.strides[k]);
      }
    } else {
      for (std::size_t k = 0; k < d; ++k) dim_of(src.shape[k], src.strides[k], 0);
      for (std::size_t k = 0; k < idx_rank; ++k) dim_of(idx.shape[k], 0, idx.strides[k]);
      for (std::size_t k = d + 1; k < rank; ++k) dim_of(src.shape[k], src.strides[k], 0);
    }
    for (std::size_t v = 0; v < vec; ++v)
      dim_of(broadcast_extent(src.shape[rank + v], idx.shape[idx_rank + v]), src.strides[rank + v], idx.strides[idx_rank + v]);
    auto out = take_kernel<T, Index>(src.data, src_strides, src.strides[d], src.shape[d], idx.data, idx_strides, out_shape);
    return make_named<shared_array<T>, Env, mask_of<Y>() | mask_of<I>()>(share_array(std::move(out)));
  }

 private:
  static std::vector<std::size_t> positional(const dims_t& shape, std::size_t rank) { return {shape.begin(), shape.begin() + static_cast<std::ptrdiff_t>(rank)}; }
};

#if NAMEDAX_DEFINITIONS  // the bodies of the functions declared above (see detail/compilation.hpp)
[[noreturn]] NAMEDAX_DECL void fail_zero_step(std::size_t dim) {
  fail("namedax::view: xt::range with step 0 for dim ", dim, "; give a nonzero step");
}

NAMEDAX_DECL void check_kept_index(std::ptrdiff_t at, std::size_t extent, std::size_t dim) {
  const auto n = static_cast<std::ptrdiff_t>(extent);
  if (at < 0 || at >= n)
    fail("namedax::view: xt::keep index ", at < 0 ? at - n : at, " is out of range for dim ", dim, " of extent ", extent,
         "; pass indices in [", -n, ", ", n, ")");
}

[[noreturn]] NAMEDAX_DECL void fail_dropped(std::size_t extent, std::size_t dim) {
  const auto n = static_cast<std::ptrdiff_t>(extent);
  fail("namedax::view: xt::drop indices for dim ", dim, " of extent ", extent,
       " are out of range, repeated or out of order; give distinct indices in [", -n, ", ", n, "), in increasing order");
}

NAMEDAX_DECL std::size_t positional_dim(std::string_view verb, std::ptrdiff_t dim, std::size_t rank) {
  const auto r = static_cast<std::ptrdiff_t>(rank);
  const std::ptrdiff_t d = dim < 0 ? dim + r : dim;
  if (d < 0 || d >= r)
    fail("namedax::", verb, ": dim ", dim, " is out of range for a value of positional rank ", rank, "; pass a dim in [",
         -r, ", ", r, ")");
  return static_cast<std::size_t>(d);
}

NAMEDAX_DECL std::size_t insertion_dim(std::string_view verb, std::ptrdiff_t dim, std::size_t rank) {
  const auto r = static_cast<std::ptrdiff_t>(rank);
  const std::ptrdiff_t d = dim < 0 ? dim + r + 1 : dim;
  if (d < 0 || d > r)
    fail("namedax::", verb, ": dim ", dim, " is out of range for a new dim among ", rank, " positional dims; pass a dim in [",
         -r - 1, ", ", r, "]");
  return static_cast<std::size_t>(d);
}

NAMEDAX_DECL std::vector<std::size_t> broadcast_trailing(std::initializer_list<std::vector<std::size_t>> all) {
  std::vector<std::size_t> out(std::data(all)[0].size(), 1);
  for (const auto& t : all)
    for (std::size_t k = 0; k < out.size(); ++k) out[k] = broadcast_extent(out[k], t[k]);
  return out;
}

NAMEDAX_DECL std::vector<std::size_t> starts_at(const std::vector<xt::xarray<std::int64_t>>& starts,
                                                std::span<const std::size_t> index, std::span<const std::size_t> extents,
                                                std::span<const std::size_t> sizes) {
  std::vector<std::size_t> out(starts.size());
  for (std::size_t k = 0; k < starts.size(); ++k) {
    const auto strides = row_major_strides(std::span<const std::size_t>(starts[k].shape().data(), starts[k].dimension()));
    out[k] = clamp_start(starts[k].data()[trailing_offset(index, strides, 0)], extents[k], sizes[k]);
  }
  return out;
}

NAMEDAX_DECL void check_slice_sizes(std::string_view verb, const std::vector<std::size_t>& shape, std::size_t starts,
                                    std::span<const std::size_t> sizes, std::string_view what) {
  if (starts != shape.size() || sizes.size() != shape.size())
    fail("namedax::", verb, ": ", starts, " start indices and ", sizes.size(), " ", what, " for a value of positional shape ",
         shape, "; give one start and one size per positional dim");
  for (std::size_t k = 0; k < shape.size(); ++k)
    if (sizes[k] > shape[k])
      fail("namedax::", verb, ": ", what, " ", sizes[k], " along dim ", k, " exceeds the extent ", shape[k], " (positional shape ",
           shape, "); a slice must fit in the value");
}

NAMEDAX_DECL std::vector<std::size_t> reshape_target(const std::vector<std::size_t>& from,
                                                     const std::vector<std::ptrdiff_t>& to) {
  const std::size_t count = std::accumulate(from.begin(), from.end(), std::size_t{1}, std::multiplies<>());
  std::size_t known = 1;
  std::ptrdiff_t free = -1;
  for (std::size_t k = 0; k < to.size(); ++k) {
    if (to[k] == -1 && free < 0) free = static_cast<std::ptrdiff_t>(k);
    else if (to[k] < 0)
      fail("namedax::reshape: cannot reshape positional shape ", from, " to ", to, "; give extents of 0 or more and at most one -1");
    else if (__builtin_mul_overflow(known, static_cast<std::size_t>(to[k]), &known))
      fail("namedax::reshape: cannot reshape positional shape ", from, " (", count, " elements) to ", to,
           "; its extents multiply past what std::size_t holds");
  }
  std::vector<std::size_t> out(to.begin(), to.end());
  if (free >= 0) {
    if (known == 0 || count % known != 0)
      fail("namedax::reshape: cannot reshape positional shape ", from, " (", count, " elements) to ", to,
           "; the -1 must stand for a whole extent");
    out[static_cast<std::size_t>(free)] = count / known;
  } else if (known != count) {
    fail("namedax::reshape: cannot reshape positional shape ", from, " (", count, " elements) to ", to, " (", known,
         " elements); the new shape must have as many elements");
  }
  return out;
}

NAMEDAX_DECL std::vector<std::size_t> padded_shape(const std::vector<std::size_t>& positional,
                                                   std::span<const std::size_t> payload_shape, const pad_widths& widths,
                                                   std::size_t element_size) {
  if (widths.size() != positional.size() && widths.size() != 1)
    fail("namedax::pad: ", widths.size(), " (before, after) pairs for a value of positional shape ", positional,
         "; give one pair per positional dim, or one pair for all");
  std::vector<std::size_t> out(payload_shape.begin(), payload_shape.end());
  for (std::size_t k = 0; k < positional.size(); ++k) {
    const auto [before, after] = widths.size() == 1 ? widths[0] : widths[k];
    if (before < 0 || after < 0)
      fail("namedax::pad: widths (", before, ", ", after, ") for dim ", k, " of positional shape ", positional,
           "; widths must be >= 0 (to crop, take a view or a dynamic_slice)");
    if (__builtin_add_overflow(out[k], static_cast<std::size_t>(before), &out[k]) ||
        __builtin_add_overflow(out[k], static_cast<std::size_t>(after), &out[k]))
      fail("namedax::pad: widths (", before, ", ", after, ") for dim ", k, " of positional shape ", positional,
           " give an extent past what std::size_t holds");
  }
  (void)checked_element_count("pad", out, element_size);
  return out;
}

NAMEDAX_DECL std::vector<std::size_t> positional_permutation(std::string_view verb, const std::vector<std::ptrdiff_t>& axes,
                                                             std::size_t rank) {
  if (axes.size() != rank)
    fail("namedax::", verb, ": ", axes.size(), " axes ", axes, " for a value of positional rank ", rank,
         "; give a permutation of all its positional dims");
  std::vector<std::size_t> out;
  for (auto a : axes) {
    const auto d = positional_dim(verb, a, rank);
    if (std::find(out.begin(), out.end(), d) != out.end())
      fail("namedax::", verb, ": axes ", axes, " name dim ", d, " twice; give a permutation of the positional dims");
    out.push_back(d);
  }
  return out;
}
#endif  // NAMEDAX_DEFINITIONS

}  // namespace detail
}  // namespace namedax
