// SPDX-License-Identifier: MIT
// A mixture-of-experts layer with top-2 routing and ragged dispatch, shared by
// examples/moe_ragged.cpp (vmap and device threads) and examples/mpi_moe_ragged.cpp (MPI
// processes): no capacity, no dropped tokens. Each of 4 indices holds 12 tokens and 2 of the
// 8 experts (expert e lives on index e / 2); the router is the same everywhere.
//
// The layer, for one token x:  y = g0 * expert_e0(x) + g1 * expert_e1(x), where e0 and e1 are
// the two experts of highest router probability softmax(x W_router + b) and g0, g1 their
// probabilities renormalised to sum to 1. An expert is a small MLP, tanh(x W1) W2.
//
// The dispatch, on each index:
//   1. every (token, chosen expert) pair is a row to send; the rows are sorted by expert, so
//      the rows for one index are contiguous (input_offsets, send_sizes);
//   2. the size table is exchanged with all_to_all (recv_sizes), each receiver lays its chunks
//      out in sender order, and a second all_to_all tells each sender where its chunk lands
//      (output_offsets), as JAX's documentation of ragged_all_to_all describes;
//   3. two asynchronous ragged_all_to_alls carry the rows and the local expert each is for,
//      both in flight while the offsets for the way back are exchanged;
//   4. each index runs its experts on what it received;
//   5. a third ragged_all_to_all, with the roles of the tables swapped, brings every row
//      back to the position it left from, and each token adds its two results, gate-weighted.
// Every exchange has a fixed-size buffer that is large enough for any routing, so no token is
// ever dropped. Three routings: the router as drawn, and with a bias that switches off expert
// 7, then experts 6 and 7 (index 3 then receives nothing from anyone), so that empty chunks
// between some pairs of indices are part of the test.
#pragma once

#include <namedax/namedax.hpp>

#include <xtensor/xrandom.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <tuple>
#include <utility>
#include <vector>

namespace moe_layer {

using namespace namedax::literals;

constexpr int devices = 4, experts_per_device = 2, experts = devices * experts_per_device;
constexpr int tokens = 12, features = 4, hidden = 6, k = 2;  // tokens per index
constexpr int pairs = tokens * k;                             // rows each index sends
constexpr int buffer = devices * pairs;  // rows an index may receive: every pair of every index
constexpr std::size_t D = devices, E = experts, T = tokens, F = features, H = hidden, P = pairs;

/// The tokens and weights, by index along the first dim, and the router, the same everywhere.
struct problem {
  xt::xarray<float> x;       // (D, tokens, features)
  xt::xarray<float> router;  // (features, experts)
  xt::xarray<float> bias;    // (experts): set by each routing
  xt::xarray<float> w1, w2;  // w1[d][j]: the first matrix of expert d * 2 + j
};

inline problem make_problem() {
  xt::random::seed(5);
  problem p;
  p.x = xt::random::randn<float>({D, T, F});
  p.router = xt::random::randn<float>({F, E});
  p.bias = xt::zeros<float>({E});
  p.w1 = xt::random::randn<float>({D, std::size_t{experts_per_device}, F, H});
  p.w2 = xt::random::randn<float>({D, std::size_t{experts_per_device}, H, F});
  return p;
}

/// The layer on one index, mapped along "i": x (tokens, features) and this index's experts'
/// weights in; y (tokens, features) and the rows sent to each index out.
inline auto layer(const problem& p) {
  return [&p](auto x, auto w1, auto w2) {
    const xt::xarray<std::int32_t> indices = xt::arange<std::int32_t>(devices);
    const xt::xarray<float> inbox_init = xt::zeros<float>({std::size_t{buffer}, F});
    const xt::xarray<std::int32_t> inbox_experts_init = xt::zeros<std::int32_t>({std::size_t{buffer}});
    const xt::xarray<float> outbox_init = xt::zeros<float>({P, F});

    // Route: each token's two best experts and their renormalised gates.
    auto probabilities = namedax::softmax(namedax::xeinsum<"tf,fe->te">(x, p.router) + p.bias, 1);
    auto [top, chosen] = namedax::top_k(probabilities, k);  // (tokens, k) each, best first
    auto gates = namedax::eval(top / namedax::sum(top, 1, {.keepdims = true}));

    // Pair q = t * k + j is token t's j-th choice. A stable sort by expert puts the rows for
    // each index together (experts d * 2 and d * 2 + 1 are adjacent), in token order.
    auto expert_of_pair = namedax::reshape(namedax::eval(chosen), {pairs});
    auto order = namedax::eval(namedax::argsort(expert_of_pair));  // sorted row r is pair order[r]
    auto outbox = namedax::eval(namedax::take(x, order / k, 0));  // (pairs, features)
    auto outbox_experts = namedax::eval(namedax::take(expert_of_pair, order, 0) % experts_per_device);

    // How many rows go to each index, and where each chunk starts in the outbox.
    auto destination = expert_of_pair / experts_per_device;
    auto send_sizes = namedax::eval(
        namedax::sum(namedax::cast<std::int32_t>(namedax::expand_dims(destination, 1) == indices), 0));
    auto input_offsets = namedax::eval(namedax::cumsum(send_sizes, 0) - send_sizes);
    // Entry s of recv_sizes: what index s sends here. The receiver lays the chunks out in
    // sender order; the senders learn where theirs start by the transposed exchange.
    auto recv_sizes = namedax::eval(namedax::all_to_all(send_sizes, "i"_ax, 0, 0));
    auto recv_offsets = namedax::eval(namedax::cumsum(recv_sizes, 0) - recv_sizes);
    auto output_offsets = namedax::eval(namedax::all_to_all(recv_offsets, "i"_ax, 0, 0));

    // Dispatch, started: the rows, and which of the receiver's experts each row is for. The
    // way back needs the senders' input_offsets at the receivers: exchanged meanwhile.
    auto rows_sent = namedax::async::ragged_all_to_all(outbox, inbox_init, input_offsets, send_sizes,
                                                       output_offsets, recv_sizes, "i"_ax);
    auto experts_sent = namedax::async::ragged_all_to_all(outbox_experts, inbox_experts_init, input_offsets,
                                                          send_sizes, output_offsets, recv_sizes, "i"_ax);
    auto home_offsets = namedax::eval(namedax::all_to_all(input_offsets, "i"_ax, 0, 0));
    auto inbox = rows_sent.wait();
    auto inbox_experts = experts_sent.wait();

    // The experts: every received row through both local experts (a few extra flops keep the
    // code free of per-expert slicing), then each row keeps its own expert's result. The
    // buffer's unused rows are zeros and are never sent back.
    auto h = namedax::eval(namedax::tanh(namedax::xeinsum<"bf,jfh->bjh">(inbox, w1)));
    auto both = namedax::xeinsum<"bjh,jhf->bjf">(h, w2);  // (buffer, experts_per_device, features)
    auto pick = namedax::expand_dims(namedax::expand_dims(inbox_experts, 1), 2);
    auto processed = namedax::squeeze(namedax::take_along_axis(both, pick, 1), {1});  // (buffer, features)

    // Return: each index sends back what it received, from where it put it, to where the row
    // came from; so the tables swap roles.
    auto returned = namedax::ragged_all_to_all(processed, outbox_init, recv_offsets, recv_sizes, home_offsets,
                                               send_sizes, "i"_ax);

    // Combine: undo the sort (argsort of a permutation is its inverse), then each token adds
    // its two results, weighted by its gates.
    auto by_pair = namedax::take(returned, namedax::argsort(order), 0);  // (pairs, features)
    auto per_choice = namedax::reshape(namedax::eval(by_pair), {tokens, k, features});
    auto y = namedax::sum(namedax::expand_dims(gates, 2) * per_choice, 1);  // (tokens, features)
    return std::tuple{namedax::eval(y), send_sizes};
  };
}

/// The same layer by plain loops, in double, token by token over the whole batch; also the
/// rows each index sends each index (sender x receiver).
inline std::pair<xt::xarray<double>, xt::xarray<std::int32_t>> reference(const problem& p) {
  xt::xarray<double> y = xt::zeros<double>({D, T, F});
  xt::xarray<std::int32_t> chunk_sizes = xt::zeros<std::int32_t>({D, D});
  for (std::size_t d = 0; d < D; ++d)
    for (std::size_t t = 0; t < T; ++t) {
      std::vector<double> q(E);
      for (std::size_t e = 0; e < E; ++e) {
        q[e] = p.bias(e);
        for (std::size_t f = 0; f < F; ++f) q[e] += double(p.x(d, t, f)) * p.router(f, e);
      }
      const double most = *std::max_element(q.begin(), q.end());
      for (double& v : q) v = std::exp(v - most);  // the softmax's denominator cancels in the gates
      std::vector<std::size_t> best(E);
      std::iota(best.begin(), best.end(), 0);
      std::stable_sort(best.begin(), best.end(), [&](std::size_t a, std::size_t b) { return q[a] > q[b]; });
      for (std::size_t j = 0; j < std::size_t{k}; ++j) {
        const std::size_t e = best[j], home = e / experts_per_device, local = e % experts_per_device;
        const double gate = q[e] / (q[best[0]] + q[best[1]]);
        ++chunk_sizes(d, home);
        std::vector<double> a(H);
        for (std::size_t u = 0; u < H; ++u) {
          for (std::size_t f = 0; f < F; ++f) a[u] += double(p.x(d, t, f)) * p.w1(home, local, f, u);
          a[u] = std::tanh(a[u]);
        }
        for (std::size_t f = 0; f < F; ++f) {
          double out = 0.0;
          for (std::size_t u = 0; u < H; ++u) out += a[u] * p.w2(home, local, u, f);
          y(d, t, f) += gate * out;
        }
      }
    }
  return {y, chunk_sizes};
}

/// A routing: the experts a bias of -30 switches off (a probability below 1e-12: never among
/// the top 2).
struct routing {
  const char* name;
  std::vector<std::size_t> off;
};
inline const routing routings[] = {{"as drawn", {}}, {"expert 7 off", {7}}, {"experts 6 and 7 off", {6, 7}}};

inline void route(problem& p, const routing& r) {
  p.bias.fill(0.f);
  for (std::size_t e : r.off) p.bias(e) = -30.f;
}

/// max |y - expected| / max |expected|.
template <class Y>
double relative_error(const Y& y, const xt::xarray<double>& expected) {
  const double scale = xt::amax(xt::abs(expected))();
  double error = 0.0;
  for (std::size_t n = 0; n < expected.size(); ++n) error = std::max(error, std::abs(double(y.flat(n)) - expected.flat(n)) / scale);
  return error;
}

}  // namespace moe_layer
