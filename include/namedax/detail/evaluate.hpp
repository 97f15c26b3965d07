// SPDX-License-Identifier: MIT
// Evaluation of payloads into memory: strided memory by a copy, lazy elementwise expressions
// a tile at a time (far faster than xtensor's element-at-a-time assignment of broadcasting
// expressions), anything else through xtensor first.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <namedax/detail/kernels.hpp>
#include <namedax/detail/unpack.hpp>
#include <namedax/error.hpp>

#include <xtensor/xarray.hpp>
#include <xtensor/xfunction.hpp>
#include <xtensor/xscalar.hpp>

#include <array>
#include <span>
#include <type_traits>
#include <vector>

namespace namedax::detail {

template <class E>
inline constexpr bool is_xfunction = false;
template <class F, class... CT>
inline constexpr bool is_xfunction<xt::xfunction<F, CT...>> = true;
template <class E>
inline constexpr bool is_xscalar = false;
template <class CT>
inline constexpr bool is_xscalar<xt::xscalar<CT>> = true;

/// Strides of `e` (an operand with `strides` in memory) along the dims of `shape`, which it
/// broadcasts to as NumPy does: aligned on the right, 0 where it has size 1 or no dim.
template <class Shape, class Strides>
std::vector<std::ptrdiff_t> broadcast_strides(const Shape& from, const Strides& strides, std::span<const std::size_t> shape) {
  std::vector<std::ptrdiff_t> out(shape.size(), 0);
  const std::size_t lead = shape.size() - from.size();
  for (std::size_t k = 0; k < from.size(); ++k) out[lead + k] = from[k] == 1 ? 0 : strides[k];
  return out;
}

/// Strided memory seen with the dims of `shape`.
template <StridedMemory E>
auto broadcast_block(const E& e, std::span<const std::size_t> shape) {
  using V = std::remove_cvref_t<decltype(*e.data())>;
  return strided_block<V>{e.data() + e.data_offset(), {shape.begin(), shape.end()},
                          broadcast_strides(e.shape(), e.strides(), shape)};
}

/// A lazy elementwise expression is evaluated a tile at a time (up to `tile_size` elements,
/// a few lines of the output's innermost dimension): each operand read in place is gathered
/// into a buffer, each function applied over whole buffers in a loop that vectorizes, the
/// result stored in the output's layout. xtensor's own assignment walks broadcasting
/// expressions an element at a time through steppers, an order of magnitude slower.
inline constexpr std::size_t tile_size = 256;

/// An operand read in place: its strides along the output's dims, and where the current tile
/// starts in it, with its steps along the tile's rows and columns.
struct tile_operand {
  const void* data;
  std::vector<std::ptrdiff_t> strides;
  std::ptrdiff_t start = 0, row = 0, col = 0;
};
struct tile_extent {
  std::size_t rows, cols;
};
template <class T>
struct tile_buffer {
  // Left uninitialized, even in a std::tuple (which value-initializes, zeroing an aggregate):
  // every tile writes it first.
  tile_buffer() noexcept {}
  T values[tile_size];
};

/// Lists the operands of `e` (depth first, left to right, the order `tile_values` reads
/// them). A subexpression that is neither elementwise nor in memory, such as a reducer, is
/// evaluated once here and read as an operand.
template <class E>
void collect_operands(const E& e, std::span<const std::size_t> shape, std::vector<tile_operand>& operands,
                      std::vector<std::shared_ptr<const void>>& kept) {
  if constexpr (is_xfunction<E>) {
    unpack(e.arguments(), [&](const auto&... a) { (collect_operands(a, shape, operands, kept), ...); });
  } else if constexpr (is_xscalar<E>) {
    operands.push_back({&e(), std::vector<std::ptrdiff_t>(shape.size(), 0)});
  } else if constexpr (StridedMemory<E>) {
    operands.push_back({e.data() + e.data_offset(), broadcast_strides(e.shape(), e.strides(), shape)});
  } else {
    auto once = std::make_shared<const xt::xarray<typename E::value_type>>(e);
    kept.push_back(once);
    operands.push_back({once->data(), broadcast_strides(once->shape(), once->strides(), shape)});
  }
}

/// The values of `e` over the current tile, row-major: in `scratch`, or in place when an
/// operand is already laid out so.
template <class E, class V = typename E::value_type>
const V* tile_values(const E& e, const tile_operand*& operand, tile_extent t, V* scratch) {
  if constexpr (is_xfunction<E>) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      using arguments = std::remove_cvref_t<decltype(e.arguments())>;
      std::tuple<tile_buffer<typename std::decay_t<std::tuple_element_t<I, arguments>>::value_type>...> buffers;
      // Braces evaluate the arguments left to right, the order in which operands were listed.
      std::tuple values{tile_values(std::get<I>(e.arguments()), operand, t, std::get<I>(buffers).values)...};
      const std::size_t count = t.rows * t.cols;
      for (std::size_t k = 0; k < count; ++k) scratch[k] = static_cast<V>(e.functor()(std::get<I>(values)[k]...));
      return static_cast<const V*>(scratch);
    }(std::make_index_sequence<std::tuple_size_v<std::remove_cvref_t<decltype(e.arguments())>>>{});
  } else {
    const tile_operand& o = *operand++;
    const V* p = static_cast<const V*>(o.data) + o.start;
    if (o.col == 1 && (t.rows == 1 || o.row == static_cast<std::ptrdiff_t>(t.cols))) return p;
    for (std::size_t r = 0; r < t.rows; ++r) {
      const V* line = p + static_cast<std::ptrdiff_t>(r) * o.row;
      V* into = scratch + r * t.cols;
      if (o.col == 0) std::fill(into, into + t.cols, line[0]);
      else if (o.col == 1) std::copy(line, line + t.cols, into);
      else for (std::size_t c = 0; c < t.cols; ++c) into[c] = line[static_cast<std::ptrdiff_t>(c) * o.col];
    }
    return scratch;
  }
}

/// Evaluates the elementwise expression `e`, broadcast to `shape`, into `out` laid out with
/// `out_strides`, converting to `T`.
template <class T, class E>
void evaluate_tiles(const E& e, std::span<const std::size_t> shape, T* out, std::span<const std::ptrdiff_t> out_strides) {
  std::vector<tile_operand> operands;
  std::vector<std::shared_ptr<const void>> kept;
  collect_operands(e, shape, operands, kept);
  std::vector<std::span<const std::ptrdiff_t>> layouts{out_strides};
  for (const auto& o : operands) layouts.emplace_back(o.strides);
  const auto nest = output_order(shape, layouts);
  if (nest.empty) return;
  const auto& sizes = nest.shape;
  const std::size_t width = operands.size() + 1;  // the output's strides, then each operand's
  // A tile: `rows` lines along the second innermost dim, of `cols` elements along the innermost.
  const std::size_t rank = sizes.size();
  const std::size_t line = rank > 0 ? sizes[rank - 1] : 1, lines = rank > 1 ? sizes[rank - 2] : 1;
  auto step = [&](std::size_t dim, std::size_t j) { return dim < rank ? nest.strides[j][dim] : std::ptrdiff_t{0}; };
  const std::size_t cols = std::min(line, tile_size);
  const std::size_t rows = line >= tile_size ? 1 : std::min(lines, tile_size / line);
  const std::size_t inner = rank - 1, second = rank - 2;  // out of range (no step) when rank is smaller
  for (std::size_t j = 1; j < width; ++j) operands[j - 1].row = step(second, j), operands[j - 1].col = step(inner, j);
  const std::size_t outer_rank = rank > 2 ? rank - 2 : 0;
  std::vector<std::size_t> index(outer_rank, 0);
  std::vector<std::ptrdiff_t> base(width, 0);
  tile_buffer<typename E::value_type> result;
  while (true) {
    for (std::size_t r0 = 0; r0 < lines; r0 += rows)
      for (std::size_t c0 = 0; c0 < line; c0 += cols) {
        const tile_extent t{std::min(rows, lines - r0), std::min(cols, line - c0)};
        auto at = [&](std::size_t j) {
          return base[j] + static_cast<std::ptrdiff_t>(r0) * step(second, j) + static_cast<std::ptrdiff_t>(c0) * step(inner, j);
        };
        for (std::size_t j = 1; j < width; ++j) operands[j - 1].start = at(j);
        const tile_operand* next = operands.data();
        T* target = out + at(0);
        const std::ptrdiff_t row_out = step(second, 0), col_out = step(inner, 0);
        if constexpr (std::is_same_v<T, typename E::value_type>) {
          if (col_out == 1 && (t.rows == 1 || row_out == static_cast<std::ptrdiff_t>(t.cols))) {
            (void)tile_values(e, next, t, target);  // the tile is contiguous in the output: computed in place
            continue;
          }
        }
        const auto* values = tile_values(e, next, t, result.values);
        for (std::size_t r = 0; r < t.rows; ++r) {
          T* into = target + static_cast<std::ptrdiff_t>(r) * row_out;
          const auto* from = values + r * t.cols;
          if (col_out == 1) for (std::size_t c = 0; c < t.cols; ++c) into[c] = static_cast<T>(from[c]);
          else for (std::size_t c = 0; c < t.cols; ++c) into[static_cast<std::ptrdiff_t>(c) * col_out] = static_cast<T>(from[c]);
        }
      }
    std::size_t k = outer_rank;
    while (k > 0) {
      --k;
      for (std::size_t j = 0; j < width; ++j) base[j] += nest.strides[j][k];
      if (++index[k] < sizes[k]) break;
      for (std::size_t j = 0; j < width; ++j) base[j] -= nest.strides[j][k] * static_cast<std::ptrdiff_t>(sizes[k]);
      index[k] = 0;
      if (k == 0) return;
    }
    if (outer_rank == 0) return;
  }
}

/// Evaluates a payload, broadcast to `shape`, into `out` laid out with `out_strides`: strided
/// memory by a copy, elementwise expressions by tiles, anything else through xtensor first.
template <class T, class E>
void evaluate_into(const E& e, std::span<const std::size_t> shape, T* out, std::span<const std::ptrdiff_t> out_strides) {
  drive_progress();
  if constexpr (StridedMemory<E>) {
    copy_strided(broadcast_block(e, shape), out, out_strides);
  } else if constexpr (is_xfunction<E>) {
    evaluate_tiles<T>(e, shape, out, out_strides);
  } else {
    const xt::xarray<typename E::value_type> once(e);
    copy_strided(broadcast_block(once, shape), out, out_strides);
  }
}

/// Evaluates any payload into a fresh row-major container, converting to `T` when given.
template <class T = void, class Expr>
auto evaluate(const Expr& e) {
  using value = std::conditional_t<std::is_void_v<T>, typename std::decay_t<Expr>::value_type, T>;
  const std::vector<std::size_t> shape(e.shape().begin(), e.shape().end());
  if (element_count_overflows(shape))
    fail("namedax: a value of shape ", shape, " has more elements than std::size_t counts; slice or reduce its operands first");
  auto out = uninitialized_array<value>(shape);
  evaluate_into<value>(e, shape, out.data(), row_major_strides(shape));
  return out;
}

/// Where a payload's elements are: in place when it is strided memory, else in `storage`.
template <class T, class E>
strided_block<T> block_in_memory(const E& e, xt::xarray<T>& storage) {
  if constexpr (StridedMemory<E> && std::is_same_v<typename E::value_type, T>) {
    return block_of(e);
  } else {
    storage = evaluate<T>(e);
    return block_of(storage);
  }
}


}  // namespace namedax::detail
