// SPDX-License-Identifier: MIT
// The rings of all_gather_matmul and matmul_reduce_scatter, written with the public verbs
// (async::ppermute, xeinsum, dynamic_slice, dynamic_update_slice), so that one body serves
// every placement.
#pragma once
// IWYU pragma: private, include <namedax/collective_matmul.hpp>

#include <namedax/async.hpp>
#include <namedax/collectives.hpp>
#include <namedax/structure.hpp>
#include <namedax/xeinsum.hpp>

#include <array>
#include <tuple>
#include <utility>
#include <vector>

namespace namedax::detail {

/// The ring that moves every index's block `step` indices on (1: to the next index, -1: to
/// the previous one): the pairs (d, d + step mod n).
inline std::vector<std::pair<int, int>> ring_shift(int n, int step) {
  std::vector<std::pair<int, int>> pairs;
  for (int d = 0; d < n; ++d) pairs.emplace_back(d, ((d + step) % n + n) % n);
  return pairs;
}

/// The product of x's positional dims (rows, k) and w's (k, c), held in memory.
template <class X, class W>
auto block_product(const X& x, const W& w) {
  return namedax::eval(namedax::xeinsum<"ij,jk->ik">(x, w));
}

template <class Verb, class X>
void require_matrix(const X& x) {
  if (x.dimension() != 2)
    fail("namedax::", Verb::name, ": the left operand is a matrix; it has positional shape ", x.shape());
}

/// The rows of x's blocks, one per index along an axis of size n (x has n blocks of rows).
template <class Verb, class A, class X>
int rows_per_index(const X& x, int n) {
  require_matrix<Verb>(x);
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

/// At step s an index holds the block of index (me - s) mod n, whose product fills that
/// index's rows of the result; the block moves on while the product is computed.
template <class Verb, class X, class W, class A>
auto all_gather_matmul_ring(const X& x, const W& w, const A& axis) {
  require_matrix<Verb>(x);
  const int n = namedax::axis_size(axis);
  const auto me = namedax::axis_index(axis);
  const auto ring = ring_shift(n, 1);
  const int rows = static_cast<int>(x.shape()[0]);
  auto block = namedax::eval(namedax::pvary(x, axis));
  if (n == 1) return gathered_rows(block_product(block, w), me, n);
  auto handle = namedax::async::ppermute(block, axis, ring);  // in flight while the own block is multiplied
  auto out = gathered_rows(block_product(block, w), me, n);
  for (int step = 1; step < n; ++step) {
    block = handle.wait();
    if (step + 1 < n) handle = namedax::async::ppermute(block, axis, ring);
    out = update_slice_in_place(std::move(out), block_product(block, w), std::tuple{((me + (n - step)) % n) * rows, 0});
  }
  return out;
}

/// Both directions at once: at step s an index holds the blocks of indices (me - s) and
/// (me + s) mod n, one from each neighbour, and multiplies both while the next two travel;
/// after n / 2 steps it has every block. Each block's product is the unidirectional ring's.
template <class Verb, class X, class W, class A>
auto all_gather_matmul_bidirectional(const X& x, const W& w, const A& axis) {
  require_matrix<Verb>(x);
  const int n = namedax::axis_size(axis);
  const auto me = namedax::axis_index(axis);
  const int rows = static_cast<int>(x.shape()[0]);
  // The steps of the blocks moving forward (from the indices behind) and back (from ahead).
  const int forward_steps = n / 2, backward_steps = (n - 1) / 2;
  const auto next = ring_shift(n, 1), previous = ring_shift(n, -1);
  auto from_behind = namedax::eval(namedax::pvary(x, axis));
  auto from_ahead = from_behind;
  if (n == 1) return gathered_rows(block_product(from_behind, w), me, n);
  auto to_next = namedax::async::ppermute(from_behind, axis, next);
  decltype(to_next) to_previous;
  if (backward_steps > 0) to_previous = namedax::async::ppermute(from_ahead, axis, previous);
  auto out = gathered_rows(block_product(from_behind, w), me, n);
  for (int step = 1; step <= forward_steps; ++step) {
    const bool both = step <= backward_steps;
    from_behind = to_next.wait();
    if (step < forward_steps) to_next = namedax::async::ppermute(from_behind, axis, next);
    if (both) {
      from_ahead = to_previous.wait();
      if (step < backward_steps) to_previous = namedax::async::ppermute(from_ahead, axis, previous);
    }
    out = update_slice_in_place(std::move(out), block_product(from_behind, w), std::tuple{((me + (n - step)) % n) * rows, 0});
    if (both) out = update_slice_in_place(std::move(out), block_product(from_ahead, w), std::tuple{((me + step) % n) * rows, 0});
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

/// At step s an index adds its product for the rows of index (me - 1 - s) mod n to the
/// partial sum it received; after n - 1 moves the sum for its own rows is complete.
template <class Verb, class X, class W, class A>
auto matmul_reduce_scatter_ring(const X& x, const W& w, const A& axis) {
  const int n = namedax::axis_size(axis);
  const int rows = rows_per_index<Verb, A>(x, n);
  const auto me = namedax::axis_index(axis);
  const auto ring = ring_shift(n, 1);
  auto partial = namedax::eval(namedax::pvary(product_for(x, w, (me + (n - 1)) % n, rows), axis));
  for (int step = 1; step < n; ++step) {
    auto handle = namedax::async::ppermute(partial, axis, ring);
    auto mine = product_for(x, w, (me + (2 * n - 1 - step)) % n, rows);
    partial = handle.wait() + mine;
  }
  return partial;
}

/// Two partial sums per index's rows, one travelling each way: the one for index t starts
/// n / 2 indices behind it and gathers the products of those indices and t's own; the other
/// starts (n - 1) / 2 indices ahead. They meet at t after n / 2 steps and are added there
/// (the first plus the second), so the sum's order differs from the unidirectional ring's.
template <class Verb, class X, class W, class A>
auto matmul_reduce_scatter_bidirectional(const X& x, const W& w, const A& axis) {
  const int n = namedax::axis_size(axis);
  const int rows = rows_per_index<Verb, A>(x, n);
  const auto me = namedax::axis_index(axis);
  const int forward_steps = n / 2, backward_steps = (n - 1) / 2;  // of the sums moving forward and back
  const auto next = ring_shift(n, 1), previous = ring_shift(n, -1);
  auto forward = namedax::eval(namedax::pvary(product_for(x, w, (me + forward_steps) % n, rows), axis));
  auto backward = forward;
  if (backward_steps > 0) backward = namedax::eval(namedax::pvary(product_for(x, w, (me + (n - backward_steps)) % n, rows), axis));
  for (int step = 1; step <= forward_steps; ++step) {
    auto to_next = namedax::async::ppermute(forward, axis, next);
    decltype(to_next) to_previous;
    if (step <= backward_steps) to_previous = namedax::async::ppermute(backward, axis, previous);
    auto mine = product_for(x, w, (me + (forward_steps - step)) % n, rows);  // at the last step, its own rows
    if (step < backward_steps) {
      auto mine_back = product_for(x, w, (me + (n - backward_steps + step)) % n, rows);
      forward = to_next.wait() + mine;
      backward = to_previous.wait() + mine_back;
    } else {
      forward = to_next.wait() + mine;
      if (step == backward_steps) backward = to_previous.wait();
    }
  }
  if (backward_steps > 0) forward = forward + backward;
  return forward;
}

}  // namespace namedax::detail
