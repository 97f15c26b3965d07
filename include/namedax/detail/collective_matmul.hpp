// SPDX-License-Identifier: MIT
// The rings of all_gather_matmul and matmul_reduce_scatter, written with the public verbs
// (async::ppermute, xeinsum, dynamic_slice, dynamic_update_slice), so that one body serves
// every placement; beside it, all_gather_matmul among the device threads of one process, where
// blocks need not travel: one all_gather, and each block's gemm writing into its rows.
#pragma once
// IWYU pragma: private, include <namedax/collective_matmul.hpp>

#include <namedax/async.hpp>
#include <namedax/collectives.hpp>
#include <namedax/detail/compilation.hpp>
#include <namedax/structure.hpp>
#include <namedax/xeinsum.hpp>

#include <array>
#include <optional>
#include <span>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace namedax::detail {

/// The ring that moves every index's block `step` indices on (1: to the next index, -1: to
/// the previous one): the pairs (d, d + step mod n).
NAMEDAX_DECL std::vector<std::pair<int, int>> ring_shift(int n, int step);

/// The product of x's positional dims (rows, k) and w's (k, c), held in memory.
template <class X, class W>
auto block_product(const X& x, const W& w) {
  return namedax::eval(namedax::xeinsum<"ij,jk->ik">(x, w));
}

/// The error of a right operand that is not a matrix with as many rows as x has columns,
/// named by the verb before the product inside it meets the shapes.
NAMEDAX_DECL void check_right_operand(std::string_view verb, std::span<const std::size_t> x_shape,
                                      std::span<const std::size_t> w_shape);

template <class Verb, class X, class W>
void require_matrices(const X& x, const W& w) {
  if (x.dimension() != 2)
    fail("namedax::", Verb::name, ": the left operand is a matrix; it has positional shape ", x.shape());
  const auto& x_shape = x.shape();
  const auto& w_shape = w.shape();
  check_right_operand(Verb::name, std::vector<std::size_t>(x_shape.begin(), x_shape.end()),
                      std::vector<std::size_t>(w_shape.begin(), w_shape.end()));
}

/// The rows of x's blocks, one per index along an axis of size n (x has n blocks of rows).
template <class Verb, class A, class X>
int rows_per_index(const X& x, int n) {
  const std::size_t m = x.shape()[0];
  if (m % static_cast<std::size_t>(n) != 0)
    fail("namedax::", Verb::name, ": the ", m, " rows of the left operand do not split into ", n,
         " equal blocks along axis '", A::name, "' of size ", n);
  return static_cast<int>(m) / n;
}

/// The (n rows) x c result of a gathering ring, zero, with the product of this index's own
/// block in its rows; the rows of the others' blocks are filled as they arrive.
template <class P, class Me>
auto gathered_rows(const P& own, const Me& me, int n) {
  using T = typename P::value_type;
  const auto rows = static_cast<int>(own.shape()[0]);
  const xt::xarray<T> empty = xt::zeros<T>({static_cast<std::size_t>(n * rows), own.shape()[1]});
  return namedax::eval(namedax::dynamic_update_slice(empty, own, std::tuple{me * rows, 0}));
}

/// How many steps a ring's blocks (or partial sums) take forward, to the next index, and back,
/// to the previous one: n - 1 and 0 one way; n / 2 and (n - 1) / 2 both ways.
struct ring_step_counts {
  int forward, backward;
  ring_step_counts(int n, bool both_ways) : forward(both_ways ? n / 2 : n - 1), backward(both_ways ? (n - 1) / 2 : 0) {}
};

/// all_gather_matmul among the device threads of one process, where a block need not travel
/// to be read: the devices meet once, in all_gather (tiled, one shared array), and each
/// block's product is written into its rows of the result by the gemm the ring runs for that
/// block (the same problem: the same bits). R is the ring's result type. Nothing where this
/// does not apply (vmap, processes, vectorized dims in the payload, a product gemm does not
/// take): the ring runs then.
template <class R, class X, class W, class A>
std::optional<R> all_gather_matmul_on_threads(const X& own, const W& w, const A& axis, std::size_t n) {
  using Env = typename R::env_type;
  using T = typename R::value_type;
  if constexpr (Env::vectorized_count != 0 || !GemmScalar<T>) {
    return std::nullopt;
  } else {
    const frame* f = find_frame(A::name);
    if (!current_device() || !f || !f->on_threads()) return std::nullopt;
    xt::xarray<T> x_storage, w_storage;
    const strided_block<T> block = block_in_memory<T>(own.payload(), x_storage);
    const auto w_payload = payload_in<Env>(w);
    const strided_block<T> right = block_in_memory<T>(w_payload, w_storage);
    const std::size_t rows = block.shape[0], columns = right.shape[1];
    const dims_t shape{rows, columns};
    const auto strides = row_major_strides(shape);
    const std::array<std::string_view, 2> subscripts{"ij", "jk"};
    // The problem of every block (each has this index's shape and strides in the gathered rows).
    const auto problem = einsum_as_gemm<T>(std::array{block, right}, subscripts, "ik", "j", 0, shape, strides);
    if (!problem) return std::nullopt;
    const auto gathered = namedax::all_gather(own, axis, {.tiled = true});
    xt::xarray<T> gathered_storage;
    const strided_block<T> all = block_in_memory<T>(gathered.payload(), gathered_storage);
    auto out = uninitialized_array<T>(dims_t{n * rows, columns});
    for (std::size_t j = 0; j < n; ++j)
      gemm_contract<T>(*problem, chunk_of(all, 0, j, rows).data, right.data, out.data() + j * rows * columns,
                       rows * columns, true);
    return make_named<shared_array<T>, Env, R::varying>(share_array(std::move(out)));
  }
}

/// At step s an index holds the block of index (me - s) mod n, moving forward, and both ways
/// also the block of (me + s) mod n, moving back; each block's product fills its index's rows
/// of the result while the next blocks travel. Every block's product is the same matmul either
/// way, so both give the same bits.
template <class Verb, class X, class W, class A>
auto all_gather_matmul_ring(const X& x, const W& w, const A& axis, bool both_ways) {
  require_matrices<Verb>(x, w);
  const enclosing_function_scope within(Verb::name);
  const int n = namedax::axis_size(axis);
  const auto me = namedax::axis_index(axis);
  const int rows = static_cast<int>(x.shape()[0]);
  const ring_step_counts steps(n, both_ways);
  const auto next = ring_shift(n, 1), previous = ring_shift(n, -1);
  auto from_behind = namedax::eval(namedax::pvary(x, axis));
  using R = decltype(gathered_rows(block_product(from_behind, w), me, n));
  if (auto on_threads = all_gather_matmul_on_threads<R>(from_behind, w, axis, static_cast<std::size_t>(n)))
    return std::move(*on_threads);
  auto from_ahead = from_behind;
  if (n == 1) return gathered_rows(block_product(from_behind, w), me, n);
  auto to_next = namedax::async::ppermute(from_behind, axis, next);  // in flight while the own block is multiplied
  decltype(to_next) to_previous;
  if (steps.backward > 0) to_previous = namedax::async::ppermute(from_ahead, axis, previous);
  auto out = gathered_rows(block_product(from_behind, w), me, n);
  for (int step = 1; step <= steps.forward; ++step) {
    const bool back = step <= steps.backward;
    from_behind = to_next.wait();
    if (step < steps.forward) to_next = namedax::async::ppermute(from_behind, axis, next);
    if (back) {
      from_ahead = to_previous.wait();
      if (step < steps.backward) to_previous = namedax::async::ppermute(from_ahead, axis, previous);
    }
    out = update_slice_in_place(std::move(out), block_product(from_behind, w), std::tuple{((me + (n - step)) % n) * rows, 0});
    if (back) out = update_slice_in_place(std::move(out), block_product(from_ahead, w), std::tuple{((me + step) % n) * rows, 0});
  }
  return out;
}

/// x's product with w for the rows of index `owner`'s block.
template <class X, class W, class Owner>
auto product_for(const X& x, const W& w, const Owner& owner, int rows) {
  auto part = namedax::dynamic_slice(x, std::tuple{owner * rows, 0},
                                     std::array<std::size_t, 2>{static_cast<std::size_t>(rows), x.shape()[1]});
  return block_product(part, w);
}

/// The partial sum for index t's rows starts steps.forward indices behind t and moves forward,
/// each index adding its product for those rows, t's own last; both ways a second one starts
/// steps.backward indices ahead of t and moves back, and t adds it to the first. One way the
/// sum runs in ring order; both ways in another order, so the two may differ in rounding.
template <class Verb, class X, class W, class A>
auto matmul_reduce_scatter_ring(const X& x, const W& w, const A& axis, bool both_ways) {
  require_matrices<Verb>(x, w);
  const enclosing_function_scope within(Verb::name);
  const int n = namedax::axis_size(axis);
  const int rows = rows_per_index<Verb, A>(x, n);
  const auto me = namedax::axis_index(axis);
  const ring_step_counts steps(n, both_ways);
  const auto next = ring_shift(n, 1), previous = ring_shift(n, -1);
  auto forward = namedax::eval(namedax::pvary(product_for(x, w, (me + steps.forward) % n, rows), axis));
  auto backward = forward;
  if (steps.backward > 0)
    backward = namedax::eval(namedax::pvary(product_for(x, w, (me + (n - steps.backward)) % n, rows), axis));
  for (int step = 1; step <= steps.forward; ++step) {
    auto to_next = namedax::async::ppermute(forward, axis, next);
    decltype(to_next) to_previous;
    if (step <= steps.backward) to_previous = namedax::async::ppermute(backward, axis, previous);
    auto mine = product_for(x, w, (me + (steps.forward - step)) % n, rows);  // at the last step, its own rows
    if (step < steps.backward) {
      auto mine_back = product_for(x, w, (me + (n - steps.backward + step)) % n, rows);
      forward = to_next.wait() + mine;
      backward = to_previous.wait() + mine_back;
    } else {
      forward = to_next.wait() + mine;
      if (step == steps.backward) backward = to_previous.wait();
    }
  }
  if (steps.backward > 0) forward = forward + backward;
  return forward;
}

#if NAMEDAX_DEFINITIONS  // the bodies of the functions declared above (see detail/compilation.hpp)
NAMEDAX_DECL void check_right_operand(std::string_view verb, std::span<const std::size_t> x_shape,
                                      std::span<const std::size_t> w_shape) {
  if (w_shape.size() != 2 || w_shape[0] != x_shape[1])
    fail("namedax::", verb, ": the left operand has positional shape ", x_shape, " and the right operand ", w_shape,
         "; give a right operand of ", x_shape[1], " rows, a matrix");
}

NAMEDAX_DECL std::vector<std::pair<int, int>> ring_shift(int n, int step) {
  std::vector<std::pair<int, int>> pairs;
  for (int d = 0; d < n; ++d) pairs.emplace_back(d, ((d + step) % n + n) % n);
  return pairs;
}
#endif  // NAMEDAX_DEFINITIONS

}  // namespace namedax::detail
