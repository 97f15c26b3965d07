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

/// The ring that moves every index's block to the next index: (d, d + 1 mod n).
inline std::vector<std::pair<int, int>> ring_to_next(int n) {
  std::vector<std::pair<int, int>> pairs;
  for (int d = 0; d < n; ++d) pairs.emplace_back(d, (d + 1) % n);
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

/// At step s an index holds the block of index (me - s) mod n, whose product fills that
/// index's rows of the result; the block moves on while the product is computed.
template <class Verb, class X, class W, class A>
auto all_gather_matmul_ring(const X& x, const W& w, const A& axis) {
  require_matrix<Verb>(x);
  const int n = namedax::axis_size(axis);
  const auto me = namedax::axis_index(axis);
  const auto ring = ring_to_next(n);
  const int rows = static_cast<int>(x.shape()[0]);
  auto block = namedax::eval(namedax::pvary(x, axis));
  auto rows_from = [&](int step) { return std::tuple{((me + (n - step)) % n) * rows, 0}; };
  auto first = block_product(block, w);
  using T = typename decltype(first)::value_type;
  const std::size_t cols = first.shape()[1];
  const xt::xarray<T> empty = xt::zeros<T>({static_cast<std::size_t>(n * rows), cols});
  if (n == 1) return namedax::eval(namedax::dynamic_update_slice(empty, first, rows_from(0)));
  auto handle = namedax::async::ppermute(block, axis, ring);
  auto out = namedax::eval(namedax::dynamic_update_slice(empty, first, rows_from(0)));
  for (int step = 1; step < n; ++step) {
    block = handle.wait();
    if (step + 1 < n) handle = namedax::async::ppermute(block, axis, ring);
    out = update_slice_in_place(std::move(out), block_product(block, w), rows_from(step));  // out is the ring's alone
  }
  return out;
}

/// At step s an index adds its product for the rows of index (me - 1 - s) mod n to the
/// partial sum it received; after n - 1 moves the sum for its own rows is complete.
template <class Verb, class X, class W, class A>
auto matmul_reduce_scatter_ring(const X& x, const W& w, const A& axis) {
  require_matrix<Verb>(x);
  const int n = namedax::axis_size(axis);
  const std::size_t m = x.shape()[0], k = x.shape()[1];
  if (m % static_cast<std::size_t>(n) != 0)
    fail("namedax::", Verb::name, ": the ", m, " rows of the left operand do not split into ", n,
         " equal blocks along axis '", A::name, "' of size ", n);
  const int rows = static_cast<int>(m) / n;
  const auto me = namedax::axis_index(axis);
  const auto ring = ring_to_next(n);
  auto product_for = [&](int step) {
    auto owner = (me + (2 * n - 1 - step)) % n;
    auto part = namedax::dynamic_slice(x, std::tuple{owner * rows, 0},
                                       std::array<std::size_t, 2>{static_cast<std::size_t>(rows), k});
    return block_product(part, w);
  };
  auto partial = namedax::eval(namedax::pvary(product_for(0), axis));
  for (int step = 1; step < n; ++step) {
    auto handle = namedax::async::ppermute(partial, axis, ring);
    auto mine = product_for(step);
    partial = handle.wait() + mine;
  }
  return partial;
}

}  // namespace namedax::detail
