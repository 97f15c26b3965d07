// SPDX-License-Identifier: MIT
// A mixture-of-experts layer with top-2 routing and ragged dispatch: no capacity, no dropped
// tokens. Each of 4 devices holds 12 tokens and 2 of the 8 experts (expert e lives on device
// e / 2); the router is the same everywhere.
//
// The layer, for one token x:  y = g0 * expert_e0(x) + g1 * expert_e1(x), where e0 and e1 are
// the two experts of highest router probability softmax(x W_router + b) and g0, g1 their
// probabilities renormalised to sum to 1. An expert is a small MLP, tanh(x W1) W2.
//
// The dispatch, on each device:
//   1. every (token, chosen expert) pair is a row to send; the rows are sorted by expert, so
//      the rows for one device are contiguous (input_offsets, send_sizes);
//   2. the size table is exchanged with all_to_all (recv_sizes), each receiver lays its chunks
//      out in sender order, and a second all_to_all tells each sender where its chunk lands
//      (output_offsets), as JAX's documentation of ragged_all_to_all describes;
//   3. ragged_all_to_all carries the rows (and which local expert each is for) to the experts;
//   4. each device runs its experts on what it received;
//   5. a second ragged_all_to_all, with the roles of the tables swapped, brings every row
//      back to the position it left from, and each token adds its two results, gate-weighted.
// Every exchange has a fixed-size buffer that is large enough for any routing, so no token is
// ever dropped. Three routings are run: the router as drawn, and with a bias that switches
// off expert 7, then experts 6 and 7 (device 3 then receives nothing from anyone), so that
// empty chunks between some pairs of devices are part of the test.
//
// Run under vmap and under pmap; both are checked against plain loops over the whole batch on
// one process, and against each other bit for bit.
#include <namedax/namedax.hpp>

#include <xtensor/xrandom.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <tuple>
#include <vector>

using namespace namedax::literals;

int main() {
  constexpr int devices = 4, experts_per_device = 2, experts = devices * experts_per_device;
  constexpr int tokens = 12, features = 4, hidden = 6, k = 2;  // tokens per device
  constexpr int pairs = tokens * k;                             // rows each device sends
  constexpr int buffer = devices * pairs;  // rows a device may receive: every pair of every device
  constexpr std::size_t D = devices, E = experts, T = tokens, F = features, H = hidden, P = pairs;

  xt::random::seed(5);
  xt::xarray<float> x = xt::random::randn<float>({D, T, F});  // tokens, by device
  xt::xarray<float> router = xt::random::randn<float>({F, E});
  xt::xarray<float> bias = xt::zeros<float>({E});  // set for each routing below
  // Expert weights, by device: w1[d][j] is the first matrix of expert d * 2 + j.
  xt::xarray<float> w1 = xt::random::randn<float>({D, std::size_t{experts_per_device}, F, H});
  xt::xarray<float> w2 = xt::random::randn<float>({D, std::size_t{experts_per_device}, H, F});
  const xt::xarray<std::int32_t> device_ids = xt::arange<std::int32_t>(devices);
  const xt::xarray<float> inbox_init = xt::zeros<float>({std::size_t{buffer}, F});
  const xt::xarray<std::int32_t> inbox_experts_init = xt::zeros<std::int32_t>({std::size_t{buffer}});
  const xt::xarray<float> outbox_init = xt::zeros<float>({P, F});

  // x: (tokens, features) of this device; w1, w2: its experts' weights.
  auto moe = [&](auto x, auto w1, auto w2) {
    // Route: each token's two best experts and their renormalised gates.
    auto probabilities = namedax::softmax(namedax::xeinsum<"tf,fe->te">(x, router) + bias, 1);
    auto [top, chosen] = namedax::top_k(probabilities, k);  // (tokens, k) each, best first
    auto gates = namedax::eval(top / namedax::sum(top, 1, {.keepdims = true}));

    // Pair p = t * k + j is token t's j-th choice. A stable sort by expert puts the rows for
    // each device together (experts d * 2 and d * 2 + 1 are adjacent), in token order.
    auto expert_of_pair = namedax::reshape(namedax::eval(chosen), {pairs});
    auto order = namedax::eval(namedax::argsort(expert_of_pair));  // sorted row r is pair order[r]
    auto outbox = namedax::take(x, order / k, 0);                  // (pairs, features)
    auto outbox_experts = namedax::eval(namedax::take(expert_of_pair, order, 0) % experts_per_device);

    // How many rows go to each device, and where each chunk starts in the outbox.
    auto destination = expert_of_pair / experts_per_device;
    auto send_sizes = namedax::eval(
        namedax::sum(namedax::cast<std::int32_t>(namedax::expand_dims(destination, 1) == device_ids), 0));
    auto input_offsets = namedax::eval(namedax::cumsum(send_sizes, 0) - send_sizes);
    // Entry s of recv_sizes: what device s sends here. The receiver lays the chunks out in
    // sender order; the senders learn where theirs start by the transposed exchange.
    auto recv_sizes = namedax::eval(namedax::all_to_all(send_sizes, "i"_ax, 0, 0));
    auto recv_offsets = namedax::eval(namedax::cumsum(recv_sizes, 0) - recv_sizes);
    auto output_offsets = namedax::eval(namedax::all_to_all(recv_offsets, "i"_ax, 0, 0));

    // Dispatch: the rows, and which of the receiver's experts each row is for.
    auto inbox = namedax::ragged_all_to_all(outbox, inbox_init, input_offsets, send_sizes, output_offsets,
                                            recv_sizes, "i"_ax);
    auto inbox_experts = namedax::ragged_all_to_all(outbox_experts, inbox_experts_init, input_offsets, send_sizes,
                                                    output_offsets, recv_sizes, "i"_ax);

    // The experts: every received row through both local experts (a few extra flops keep the
    // code free of per-expert slicing), then each row keeps its own expert's result. The
    // buffer's unused rows are zeros and are never sent back.
    auto h = namedax::eval(namedax::tanh(namedax::xeinsum<"bf,jfh->bjh">(inbox, w1)));
    auto both = namedax::xeinsum<"bjh,jhf->bjf">(h, w2);  // (buffer, experts_per_device, features)
    auto pick = namedax::expand_dims(namedax::expand_dims(inbox_experts, 1), 2);
    auto processed = namedax::squeeze(namedax::take_along_axis(both, pick, 1), {1});  // (buffer, features)

    // Return: each device sends back what it received, from where it put it, to where the row
    // came from; so the tables swap roles, and the senders' input_offsets travel once more.
    auto home_offsets = namedax::all_to_all(input_offsets, "i"_ax, 0, 0);
    auto returned = namedax::ragged_all_to_all(processed, outbox_init, recv_offsets, recv_sizes, home_offsets,
                                               send_sizes, "i"_ax);

    // Combine: undo the sort (argsort of a permutation is its inverse), then each token adds
    // its two results, weighted by its gates.
    auto by_pair = namedax::take(returned, namedax::argsort(order), 0);  // (pairs, features)
    auto per_choice = namedax::reshape(namedax::eval(by_pair), {tokens, k, features});
    auto y = namedax::sum(namedax::expand_dims(gates, 2) * per_choice, 1);  // (tokens, features)
    return std::tuple{namedax::eval(y), send_sizes};
  };

  // The same layer by plain loops, in double, token by token over the whole batch; also the
  // rows each device sends each device (sender x receiver).
  auto reference = [&] {
    xt::xarray<double> y = xt::zeros<double>({D, T, F});
    xt::xarray<std::int32_t> chunk_sizes = xt::zeros<std::int32_t>({D, D});
    for (std::size_t d = 0; d < D; ++d)
      for (std::size_t t = 0; t < T; ++t) {
        std::vector<double> p(E);
        for (std::size_t e = 0; e < E; ++e) {
          p[e] = bias(e);
          for (std::size_t f = 0; f < F; ++f) p[e] += double(x(d, t, f)) * router(f, e);
        }
        const double most = *std::max_element(p.begin(), p.end());
        for (double& v : p) v = std::exp(v - most);  // the softmax's denominator cancels in the gates
        std::vector<std::size_t> best(E);
        std::iota(best.begin(), best.end(), 0);
        std::stable_sort(best.begin(), best.end(), [&](std::size_t a, std::size_t b) { return p[a] > p[b]; });
        for (std::size_t j = 0; j < std::size_t{k}; ++j) {
          const std::size_t e = best[j], home = e / experts_per_device, local = e % experts_per_device;
          const double gate = p[e] / (p[best[0]] + p[best[1]]);
          ++chunk_sizes(d, home);
          std::vector<double> a(H);
          for (std::size_t u = 0; u < H; ++u) {
            for (std::size_t f = 0; f < F; ++f) a[u] += double(x(d, t, f)) * w1(home, local, f, u);
            a[u] = std::tanh(a[u]);
          }
          for (std::size_t f = 0; f < F; ++f) {
            double out = 0.0;
            for (std::size_t u = 0; u < H; ++u) out += a[u] * w2(home, local, u, f);
            y(d, t, f) += gate * out;
          }
        }
      }
    return std::pair{y, chunk_sizes};
  };

  // Three routings: the router as drawn; expert 7 switched off (some chunks empty); experts 6
  // and 7 switched off, so device 3 receives nothing from anyone, itself included. A bias of
  // -30 puts an expert's probability below 1e-12: it is never among the top 2.
  struct routing {
    const char* name;
    std::vector<std::size_t> off;
  };
  const routing routings[] = {{"as drawn", {}}, {"expert 7 off", {7}}, {"experts 6 and 7 off", {6, 7}}};
  bool ok = true;
  double max_error = 0.0;
  std::ptrdiff_t empty_chunks = 0;
  for (const auto& r : routings) {
    bias.fill(0.f);
    for (std::size_t e : r.off) bias(e) = -30.f;
    const auto ref = reference();  // named members, not bindings: lambdas below capture them
    const auto& expected = ref.first;
    const auto& chunk_sizes = ref.second;
    const double scale = xt::amax(xt::abs(expected))();
    const auto empty = std::count(chunk_sizes.begin(), chunk_sizes.end(), 0);
    empty_chunks += empty;
    std::printf("routing %s: rows sent (sender x receiver), %td of %zu chunks empty\n", r.name, empty, D * D);
    for (std::size_t s = 0; s < D; ++s) {
      for (std::size_t t = 0; t < D; ++t) std::printf(" %3d", chunk_sizes(s, t));
      std::printf("\n");
    }
    auto check = [&](const char* mode, const auto& result) {
      const auto& [y, sizes] = result;
      double error = 0.0;
      for (std::size_t n = 0; n < expected.size(); ++n)
        error = std::max(error, std::abs(double(y.flat(n)) - expected.flat(n)) / scale);
      const bool sizes_match = sizes == chunk_sizes;
      std::printf("  %s: max |difference| / max |y| = %.3g, send sizes %s\n", mode, error,
                  sizes_match ? "match" : "DIFFER");
      ok = ok && y.shape() == expected.shape() && error < 1e-5 && sizes_match;
      max_error = std::max(max_error, error);
    };
    const auto vectorized = namedax::vmap<"i">(moe)(x, w1, w2);
    const auto on_threads = namedax::pmap<"i">(moe)(x, w1, w2);
    check("vmap", vectorized);
    check("pmap", on_threads);
    if (std::get<0>(vectorized) != std::get<0>(on_threads)) {
      std::printf("  vmap and pmap results DIFFER\n");
      ok = false;
    }
  }
  if (!ok || empty_chunks == 0) return 1;
  std::printf("moe_ragged: vmap and pmap agree bit for bit; max error vs reference %.2g\n", max_error);
  return 0;
}
