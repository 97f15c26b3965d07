// SPDX-License-Identifier: MIT
// A two-layer MLP trained on a data x model mesh, shared by examples/mesh_mlp.cpp (device
// threads and vectorized meshes) and examples/mpi_mesh_mlp.cpp (MPI processes x threads):
// the parameters as a Hana struct, their partition specs, the sharded SGD with its
// hand-written backward pass, and an unsharded plain-loop reference.
#pragma once

#include <namedax/namedax.hpp>

#include <boost/hana/define_struct.hpp>
#include <xtensor/xadapt.hpp>
#include <xtensor/xrandom.hpp>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

namespace mesh_mlp {

using namespace namedax::literals;

constexpr std::size_t batch = 8, inputs = 6, hidden = 8, outputs = 3;
constexpr int steps = 5;
constexpr float learning_rate = 0.2f;

/// y = tanh(x w1 + b1) w2 + b2. One type parameter per member, so that shard_map can build
/// the same struct around blocks, named values and specs.
template <class W1, class B1, class W2, class B2>
struct mlp {
  BOOST_HANA_DEFINE_STRUCT(mlp, (W1, w1), (B1, b1), (W2, w2), (B2, b2));
};
using array = xt::xarray<float>;
using parameters = mlp<array, array, array, array>;

/// Where each parameter lives: W1's columns and b1 split over "model" (each index of "model"
/// computes its own hidden units), W2's rows over "model" (its share of the output), b2
/// whole everywhere. No parameter is split over "data": every batch block sees all of them.
/// (clang 14 deduces no aggregate's template arguments: the spec types are spelled.)
using columns = decltype(namedax::P(namedax::none, "model"_ax));
using rows = decltype(namedax::P("model"_ax));
using replicated = decltype(namedax::P());
inline const auto parameter_specs = mlp<columns, rows, rows, replicated>{};
/// The arguments (parameters, x, targets): the batch split over "data".
inline const auto in_specs = std::tuple{parameter_specs, namedax::P("data"_ax), namedax::P("data"_ax)};
/// The results (trained parameters, losses): the parameters come back where they came from;
/// the losses are the same on every block.
inline const auto out_specs = std::tuple{parameter_specs, namedax::P()};

/// SGD on loss = mean over the batch of |tanh(x w1 + b1) w2 + b2 - t|^2 / 2, written for one
/// block of the mesh: x and t are this index of "data"'s rows; w1, b1 and w2 are this index
/// of "model"'s hidden units. Returns the trained parameters and the loss before each step.
struct sgd {
  template <class Params, class X, class T>
  auto operator()(const Params& p, const X& x, const T& t) const {
    auto w1 = namedax::eval(p.w1);
    auto b1 = namedax::eval(p.b1);
    auto w2 = namedax::eval(p.w2);
    auto b2 = namedax::eval(p.b2);
    const float block_rows = static_cast<float>(x.shape()[0]);
    std::vector<float> losses;
    for (int step = 0; step < steps; ++step) {
      // Forward. a varies along "model" (its hidden units); the psum over "model" adds the
      // shares of the output, so out varies along "data" only.
      auto a = namedax::eval(namedax::tanh(namedax::xeinsum<"bi,ih->bh">(x, w1) + b1));
      auto out = namedax::psum(namedax::xeinsum<"bh,ho->bo">(a, w2), "model"_ax) + b2;
      auto r = namedax::eval(out - t);  // dloss/dout, times the batch size
      losses.push_back(namedax::pmean(namedax::sum(r * r, 1), namedax::axes(0, "data"_ax)).value() / 2);

      // Backward. Every gradient sums over the batch: over this block's rows, then a pmean
      // over "data" averages the blocks. r is the same along "model", so the gradient of
      // the psum needs no exchange; a is not, so w2's and w1's gradients stay per hidden unit.
      auto over_batch = [&](auto per_block) { return namedax::pmean(per_block, "data"_ax) / block_rows; };
      auto dw2 = over_batch(namedax::xeinsum<"bh,bo->ho">(a, r));
      auto db2 = over_batch(namedax::sum(r, 0));
      auto dh = namedax::eval(namedax::xeinsum<"bo,ho->bh">(r, w2) * (1.f - a * a));
      auto dw1 = over_batch(namedax::xeinsum<"bi,bh->ih">(x, dh));
      auto db1 = over_batch(namedax::sum(dh, 0));
      w1 -= learning_rate * dw1;
      b1 -= learning_rate * db1;
      w2 -= learning_rate * dw2;
      b2 -= learning_rate * db2;
    }
    // The struct spelled out: clang 14 deduces no aggregate's template arguments.
    return std::tuple{mlp<decltype(w1), decltype(b1), decltype(w2), decltype(b2)>{w1, b1, w2, b2},
                      array(xt::adapt(losses))};
  }
};

/// What the examples train: the initial parameters, the inputs and the targets.
struct problem {
  parameters initial;
  array x, t;
};
/// The same problem on every process (one seed).
inline problem make_problem() {
  xt::random::seed(18);
  parameters p{0.5f * xt::random::randn<float>({inputs, hidden}), 0.1f * xt::random::randn<float>({hidden}),
               0.5f * xt::random::randn<float>({hidden, outputs}), 0.1f * xt::random::randn<float>({outputs})};
  array x = xt::random::randn<float>({batch, inputs});
  array t = xt::random::randn<float>({batch, outputs});
  return {p, x, t};
}

/// Trains on mesh `m`: the results of shard_map, already whole (the parameters struct of
/// arrays, and the losses).
template <class Mesh>
std::tuple<parameters, array> train(const Mesh& m, const problem& data) {
  return namedax::shard_map(sgd{}, m, in_specs, out_specs)(data.initial, data.x, data.t);
}

/// The same SGD on the whole batch with plain loops, in double: the trained parameters and
/// the losses.
inline std::tuple<parameters, array> reference(const problem& data) {
  const auto& p0 = data.initial;
  const auto& x = data.x;
  const auto& t = data.t;
  xt::xarray<double> w1 = p0.w1, b1 = p0.b1, w2 = p0.w2, b2 = p0.b2;
  std::vector<float> losses;
  for (int step = 0; step < steps; ++step) {
    xt::xarray<double> dw1 = xt::zeros<double>(w1.shape()), db1 = xt::zeros<double>(b1.shape());
    xt::xarray<double> dw2 = xt::zeros<double>(w2.shape()), db2 = xt::zeros<double>(b2.shape());
    double loss = 0;
    for (std::size_t n = 0; n < batch; ++n) {
      std::vector<double> a(hidden), da(hidden, 0.0);
      for (std::size_t h = 0; h < hidden; ++h) {
        double s = b1(h);
        for (std::size_t i = 0; i < inputs; ++i) s += x(n, i) * w1(i, h);
        a[h] = std::tanh(s);
      }
      for (std::size_t o = 0; o < outputs; ++o) {
        double s = b2(o);
        for (std::size_t h = 0; h < hidden; ++h) s += a[h] * w2(h, o);
        const double r = s - t(n, o);
        loss += r * r / 2 / batch;
        db2(o) += r / batch;
        for (std::size_t h = 0; h < hidden; ++h) dw2(h, o) += a[h] * r / batch, da[h] += w2(h, o) * r / batch;
      }
      for (std::size_t h = 0; h < hidden; ++h) {
        const double dh = da[h] * (1 - a[h] * a[h]);
        db1(h) += dh;
        for (std::size_t i = 0; i < inputs; ++i) dw1(i, h) += x(n, i) * dh;
      }
    }
    losses.push_back(static_cast<float>(loss));
    w1 -= learning_rate * dw1, b1 -= learning_rate * db1, w2 -= learning_rate * dw2, b2 -= learning_rate * db2;
  }
  return {parameters{xt::cast<float>(w1), xt::cast<float>(b1), xt::cast<float>(w2), xt::cast<float>(b2)},
          array(xt::adapt(losses))};
}

/// The largest difference between `a` and `b`, relative to b's largest magnitude.
inline double relative_error(const array& a, const array& b) {
  if (a.shape() != b.shape()) return INFINITY;
  return static_cast<double>(xt::amax(xt::abs(a - b))()) / std::max(1e-30, static_cast<double>(xt::amax(xt::abs(b))()));
}
/// The largest relative_error over the parameters and the losses of two runs.
inline double relative_error(const std::tuple<parameters, array>& a, const std::tuple<parameters, array>& b) {
  const auto& [pa, la] = a;
  const auto& [pb, lb] = b;
  return std::max({relative_error(pa.w1, pb.w1), relative_error(pa.b1, pb.b1), relative_error(pa.w2, pb.w2),
                   relative_error(pa.b2, pb.b2), relative_error(la, lb)});
}
/// Whether two runs agree bit for bit.
inline bool same_bits(const std::tuple<parameters, array>& a, const std::tuple<parameters, array>& b) {
  const auto& [pa, la] = a;
  const auto& [pb, lb] = b;
  return pa.w1 == pb.w1 && pa.b1 == pb.b1 && pa.w2 == pb.w2 && pa.b2 == pb.b2 && la == lb;
}

}  // namespace mesh_mlp
