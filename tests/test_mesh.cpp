// SPDX-License-Identifier: MIT
// Meshes and shard_map: JAX's documented examples, a differential test against a plain-loop
// reference on random sizes for several specs and every placement mix, pytrees in and out,
// and the errors.
#include "test_support.hpp"

#include <boost/hana/define_struct.hpp>
#include <xtensor/xadapt.hpp>

#include <atomic>
#include <new>
#include <stdexcept>
#include <string>

using namespace namedax::literals;

namespace {

template <class W, class B>
struct dense {
  BOOST_HANA_DEFINE_STRUCT(dense, (W, w), (B, b));
};

/// The mesh axes a spec splits each dim over, as indices into the mesh ("a" = 0, ...): the
/// reference's own description of the spec, written beside it.
using spec_description = std::vector<std::vector<std::size_t>>;

/// What shard_map(x * 3 + psum(x, "c")) gives, by loops over the global array: each element's
/// block coordinates from the spec, and the sum over the coordinate of "c" (mesh axis 2) by
/// visiting the elements of the other blocks along "c" (or `size_c` times the element, when
/// the spec does not split along "c").
xt::xarray<std::int64_t> reference(const xt::xarray<std::int64_t>& x, const spec_description& spec,
                                   const std::array<std::size_t, 3>& mesh) {
  const std::size_t rank = x.dimension();
  std::vector<std::size_t> block(rank);
  for (std::size_t d = 0; d < rank; ++d) {
    std::size_t parts = 1;
    if (d < spec.size())
      for (std::size_t a : spec[d]) parts *= mesh[a];
    block[d] = x.shape()[d] / parts;
  }
  xt::xarray<std::int64_t> out = xt::zeros<std::int64_t>(x.shape());
  std::vector<std::size_t> index(rank, 0);
  for (std::size_t flat = 0; flat < x.size(); ++flat) {
    std::size_t rest = flat;
    for (std::size_t d = rank; d-- > 0;) index[d] = rest % x.shape()[d], rest /= x.shape()[d];
    // Where "c" splits a dim: that dim, and the stride of the c coordinate in its block number.
    std::optional<std::size_t> c_dim;
    std::size_t c_step = 1;
    for (std::size_t d = 0; d < spec.size(); ++d) {
      std::size_t step = 1;
      for (std::size_t j = spec[d].size(); j-- > 0;) {
        if (spec[d][j] == 2) c_dim = d, c_step = step;
        step *= mesh[spec[d][j]];
      }
    }
    std::int64_t sum = 0;
    if (!c_dim) {
      sum = static_cast<std::int64_t>(mesh[2]) * x.element(index.begin(), index.end());
    } else {
      const std::size_t d = *c_dim;
      const std::size_t number = index[d] / block[d], local = index[d] % block[d];
      const std::size_t c = number / c_step % mesh[2];
      for (std::size_t other = 0; other < mesh[2]; ++other) {
        std::vector<std::size_t> at = index;
        at[d] = ((number - c * c_step) + other * c_step) * block[d] + local;
        sum += x.element(at.begin(), at.end());
      }
    }
    out.element(index.begin(), index.end()) = 3 * x.element(index.begin(), index.end()) + sum;
  }
  return out;
}

/// shard_map of x * 3 + psum(x, "c") over a mesh of axes "a", "b", "c" with placements
/// `Pa`, `Pb`, `Pc`, the out spec the same as the in spec.
template <class Spec, namedax::placement Pa, namedax::placement Pb, namedax::placement Pc>
xt::xarray<std::int64_t> sharded(const xt::xarray<std::int64_t>& x, const std::array<std::size_t, 3>& sizes) {
  namedax::mesh m{namedax::mesh_axis<"a", Pa>{sizes[0]}, namedax::mesh_axis<"b", Pb>{sizes[1]},
                  namedax::mesh_axis<"c", Pc>{sizes[2]}};
  auto f = [](auto block) { return block * std::int64_t{3} + namedax::psum(block, "c"_ax); };
  return namedax::shard_map(f, m, Spec{}, Spec{})(x);
}

constexpr auto devices = namedax::placement::devices;
constexpr auto vectorized = namedax::placement::vectorized;

/// Every placement mix checked here gives the reference's bits: four mixes, or all eight.
template <class Spec, bool EveryMix = false>
void check_spec(const spec_description& description, std::size_t rank, std::mt19937& rng) {
  std::uniform_int_distribution<std::size_t> size(1, 3), block(1, 2);
  for (int trial = 0; trial < 3; ++trial) {
    const std::array<std::size_t, 3> mesh{size(rng), size(rng), size(rng)};
    std::vector<std::size_t> shape(rank);
    for (std::size_t d = 0; d < rank; ++d) {
      std::size_t parts = 1;
      if (d < description.size())
        for (std::size_t a : description[d]) parts *= mesh[a];
      shape[d] = parts * block(rng);
    }
    xt::xarray<std::int64_t> x = xt::random::randint<std::int64_t>(shape, -50, 50, rng);
    const auto expected = reference(x, description, mesh);
    INFO("mesh ", mesh[0], " x ", mesh[1], " x ", mesh[2], ", shape ", namedax_test::show(xt::adapt(shape)));
    CHECK_BITWISE((sharded<Spec, devices, devices, devices>(x, mesh)), expected);
    CHECK_BITWISE((sharded<Spec, vectorized, vectorized, vectorized>(x, mesh)), expected);
    CHECK_BITWISE((sharded<Spec, devices, vectorized, devices>(x, mesh)), expected);
    CHECK_BITWISE((sharded<Spec, vectorized, devices, vectorized>(x, mesh)), expected);
    if constexpr (EveryMix) {
      CHECK_BITWISE((sharded<Spec, devices, devices, vectorized>(x, mesh)), expected);
      CHECK_BITWISE((sharded<Spec, devices, vectorized, vectorized>(x, mesh)), expected);
      CHECK_BITWISE((sharded<Spec, vectorized, devices, devices>(x, mesh)), expected);
      CHECK_BITWISE((sharded<Spec, vectorized, vectorized, devices>(x, mesh)), expected);
    }
  }
}

/// One device of a shard_map throws at one fault point of a collective, once.
bool fault_active = false;
namedax::detail::fault_point fault_at = namedax::detail::fault_point::arrival;
std::atomic<int> faults_fired{0};
thread_local bool fault_armed = false;
void inject(namedax::detail::fault_point point, std::string_view) {
  if (!fault_armed || point != fault_at) return;
  fault_armed = false;
  ++faults_fired;
  if (point == namedax::detail::fault_point::allocation) throw std::bad_alloc();
  throw std::runtime_error("injected fault");
}

}  // namespace

TEST_SUITE("shard_map") {
  TEST_CASE("a device that fails at any point of a collective inside shard_map fails the call cleanly, no hang") {
    namedax::detail::fault_injection() = &inject;
    namedax::mesh m{namedax::devices<"data">(2), namedax::devices<"model">(2)};
    const xt::xarray<double> x = xt::arange<double>(64.).reshape({4, 16});
    auto body = [](auto b) {
      if (fault_active && namedax::axis_index("model"_ax) == 1 && namedax::axis_index("data"_ax) == 0) fault_armed = true;
      auto summed = namedax::psum(b, "model"_ax);
      auto gathered = namedax::all_gather(summed, "data"_ax, {.tiled = true});
      fault_armed = false;
      return namedax::eval(gathered * 1.0);
    };
    auto f = namedax::shard_map(body, m, namedax::P("data"_ax, "model"_ax), namedax::P(namedax::none, "model"_ax));
    const xt::xarray<double> expected = f(x);
    CHECK(faults_fired == 0);
    fault_active = true;
    for (auto point : {namedax::detail::fault_point::arrival, namedax::detail::fault_point::exchanged,
                       namedax::detail::fault_point::reading, namedax::detail::fault_point::allocation}) {
      INFO("fault point ", static_cast<int>(point));
      fault_at = point, faults_fired = 0;
      std::string caught = "no error";
      try {
        const xt::xarray<double> out = f(x);
        CHECK_BITWISE(out, expected);  // a point this call does not pass never fires
      } catch (const std::bad_alloc&) {
        caught = "bad_alloc";
      } catch (const std::exception& e) {
        caught = e.what();
      }
      if (point != namedax::detail::fault_point::allocation) CHECK(faults_fired == 1);
      if (faults_fired == 1)
        CHECK(caught.find(point == namedax::detail::fault_point::allocation ? "bad_alloc" : "injected fault") !=
              std::string::npos);
    }
    fault_active = false;
    namedax::detail::fault_injection() = nullptr;
  }

  TEST_CASE("JAX's examples: axis_index over a (4, 2) mesh, all_gather tiled, psum to P()") {
    // jax.lax.axis_index's documented example: out_specs P('i', 'j') of axis_index(('i', 'j'))[None, None].
    namedax::mesh m{namedax::devices<"i">(4), namedax::vectorized<"j">(2)};
    auto positions = namedax::shard_map(
        [] { return namedax::expand_dims(namedax::expand_dims(namedax::axis_index(namedax::axes("i"_ax, "j"_ax)), 0), 0); },
        m, std::tuple{}, namedax::P("i"_ax, "j"_ax));
    CHECK_BITWISE(positions(), (xt::xarray<std::int32_t>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));

    // The shard_map tutorial's all_gather: each block gathers all, concatenated by out_specs P('i').
    namedax::mesh line{namedax::devices<"i">(4)};
    auto gather = namedax::shard_map([](auto b) { return namedax::all_gather(b, "i"_ax, {.tiled = true}); }, line,
                                     namedax::P("i"_ax), namedax::P("i"_ax));
    CHECK_BITWISE(gather(xt::xarray<int>{3, 9, 5, 2}), (xt::xarray<int>{3, 9, 5, 2, 3, 9, 5, 2, 3, 9, 5, 2, 3, 9, 5, 2}));

    // A sum over the blocks is the same everywhere, so P() returns it once.
    auto total = namedax::shard_map([](auto b) { return namedax::psum(b, "i"_ax); }, line, namedax::P("i"_ax),
                                    namedax::P());
    CHECK_BITWISE(total(xt::xarray<int>{1, 2, 3, 4, 5, 6, 7, 8}), (xt::xarray<int>{1 + 3 + 5 + 7, 2 + 4 + 6 + 8}));
  }

  TEST_CASE("blocks are contiguous, in row-major order over the axes of a dim") {
    namedax::mesh m{namedax::devices<"data">(2), namedax::vectorized<"model">(3)};
    xt::xarray<int> x = xt::arange<int>(24).reshape({4, 6});
    // Each block learns its position; the out spec puts the blocks back where they came from.
    auto tag = namedax::shard_map([](auto b) { return b * 10 + namedax::axis_index("model"_ax); }, m,
                                  namedax::P("data"_ax, "model"_ax), namedax::P("data"_ax, "model"_ax));
    xt::xarray<int> columns{0, 0, 1, 1, 2, 2};
    CHECK_BITWISE(tag(x), xt::xarray<int>(x * 10 + columns));
    // Columns split over ("data", "model"): six blocks of one column, block number data * 3 + model.
    auto sums = namedax::shard_map([](auto b) { return namedax::psum(b, "model"_ax); }, m,
                                   namedax::P(namedax::none, namedax::axes("data"_ax, "model"_ax)),
                                   namedax::P(namedax::none, "data"_ax));
    xt::xarray<int> expected = xt::stack(xt::xtuple(xt::sum(xt::view(x, xt::all(), xt::range(0, 3)), {1}),
                                                    xt::sum(xt::view(x, xt::all(), xt::range(3, 6)), {1})),
                                         1);
    CHECK_BITWISE(sums(x), expected);
    // The same, with the mesh axes listed minor to major: block number model * 2 + data.
    auto swapped = namedax::shard_map([](auto b) { return b + namedax::axis_index("data"_ax) * 100; }, m,
                                      namedax::P(namedax::none, namedax::axes("model"_ax, "data"_ax)),
                                      namedax::P(namedax::none, namedax::axes("model"_ax, "data"_ax)));
    CHECK_BITWISE(swapped(x), xt::xarray<int>(x + xt::xarray<int>{0, 100, 0, 100, 0, 100}));
  }

  TEST_CASE("differential: specs of none, one and two axes per dim, random sizes, every placement mix") {
    std::mt19937 rng(18);
    using A = namedax::axis<"a">;
    using B = namedax::axis<"b">;
    using C = namedax::axis<"c">;
    check_spec<decltype(namedax::P(A{}, namedax::none))>({{0}, {}}, 2, rng);
    check_spec<decltype(namedax::P(namedax::none, namedax::axes(B{}, C{})))>({{}, {1, 2}}, 2, rng);
    check_spec<decltype(namedax::P(namedax::axes(C{}, A{}), B{})), true>({{2, 0}, {1}}, 3, rng);
    check_spec<decltype(namedax::P())>({}, 2, rng);
  }

  TEST_CASE("the same as nested maps over manual reshapes") {
    // P("i", none) over a mesh of 2 devices x 3 vectorized: rows in 2 blocks, replicated along "j".
    xt::xarray<double> x = xt::arange<double>(24).reshape({4, 6}) * 0.25;
    namedax::mesh m{namedax::devices<"i">(2), namedax::vectorized<"j">(3)};
    auto f = [](auto b) { return namedax::psum(b * b, "i"_ax) + b; };
    auto sharded = namedax::shard_map(f, m, namedax::P("i"_ax), namedax::P("i"_ax));
    xt::xarray<double> blocks = x;
    blocks.reshape({2, 2, 6});
    auto by_hand = namedax::pmap<"i">(namedax::vmap<"j">(f, namedax::none, namedax::none, 3));
    xt::xarray<double> expected = by_hand(blocks);
    expected.reshape({4, 6});
    CHECK_BITWISE(sharded(x), expected);
  }

  TEST_CASE("pytrees: a Hana struct of parameters with a spec per member, a tuple of results") {
    namedax::mesh m{namedax::devices<"data">(2), namedax::devices<"model">(2)};
    xt::xarray<double> w = xt::arange<double>(12).reshape({3, 4}) / 8.;  // columns split over "model"
    xt::xarray<double> b = xt::arange<double>(4);                        // split over "model"
    xt::xarray<double> x = xt::arange<double>(6).reshape({2, 3}) - 2.;   // rows split over "data"
    const dense<xt::xarray<double>, xt::xarray<double>> params{w, b};
    auto layer = [](const auto& p, const auto& batch) {
      auto y = namedax::xeinsum<"nk,km->nm">(batch, p.w) + p.b;
      return std::tuple{namedax::eval(y), namedax::psum(namedax::sum(y * y, 1), "model"_ax)};
    };
    // (clang 14 deduces no aggregate's template arguments: the spec types are spelled.)
    using columns = decltype(namedax::P(namedax::none, "model"_ax));
    using entries = decltype(namedax::P("model"_ax));
    const auto in_specs = std::tuple{dense<columns, entries>{}, namedax::P("data"_ax)};
    const auto out_specs = std::tuple{namedax::P("data"_ax, "model"_ax), namedax::P("data"_ax)};
    const auto [y, squares] = namedax::shard_map(layer, m, in_specs, out_specs)(params, x);
    // Every value is a multiple of 1/8 within range: the sums are exact in any order.
    xt::xarray<double> expected_y = xt::zeros<double>({2, 4});
    xt::xarray<double> expected_squares = xt::zeros<double>({2});
    for (std::size_t n = 0; n < 2; ++n)
      for (std::size_t j = 0; j < 4; ++j) {
        for (std::size_t k = 0; k < 3; ++k) expected_y(n, j) += x(n, k) * w(k, j);
        expected_y(n, j) += b(j);
        expected_squares(n) += expected_y(n, j) * expected_y(n, j);
      }
    CHECK_BITWISE(y, expected_y);
    CHECK_BITWISE(squares, expected_squares);
  }

  TEST_CASE("sizes that do not split, and specs longer than the argument, are errors naming them") {
    namedax::mesh m{namedax::devices<"data">(2), namedax::vectorized<"model">(3)};
    auto f = namedax::shard_map([](auto b) { return b; }, m, namedax::P(namedax::axes("data"_ax, "model"_ax)),
                                namedax::P(namedax::axes("data"_ax, "model"_ax)));
    CHECK(namedax_test::error_of([&] { f(xt::xarray<float>(xt::zeros<float>({4}))); }) ==
          "namedax::shard_map: argument 0, dim 0 of size 4 does not split over mesh axes \"data\", \"model\" of sizes "
          "(2, 3) (6 blocks); its size must be a multiple of 6");
    auto g = namedax::shard_map([](auto b) { return b; }, m, namedax::P(namedax::none, "data"_ax),
                                namedax::P(namedax::none, "data"_ax));
    CHECK(namedax_test::error_of([&] { g(xt::xarray<float>(xt::zeros<float>({4}))); }) ==
          "namedax::shard_map: argument 0 has 1 dims, but its partition spec has 2 entries");
  }

  TEST_CASE("a plain result shorter than its out spec, and a mesh axis of size 0, are errors naming them") {
    namedax::mesh m{namedax::devices<"data">(2)};
    const xt::xarray<double> x = xt::arange<double>(4);
    auto scalar = namedax::shard_map([](auto) { return 1.5; }, m, namedax::P("data"_ax), namedax::P("data"_ax));
    CHECK(namedax_test::error_of([&] { scalar(x); }) ==
          "namedax::shard_map: result 0 has 0 dims, but its out spec has 1 entries");
    // A result of axis_index alone is resolved by the maps; its rank is checked all the same, in
    // every placement of the mesh axis.
    auto index = [](auto) { return namedax::axis_index("data"_ax); };
    CHECK(namedax_test::error_of([&] { namedax::shard_map(index, m, namedax::P("data"_ax), namedax::P("data"_ax))(x); }) ==
          "namedax::shard_map: result 0 has 0 dims, but its out spec has 1 entries");
    namedax::mesh vm{namedax::vectorized<"data">(2)};
    CHECK(namedax_test::error_of([&] { namedax::shard_map(index, vm, namedax::P("data"_ax), namedax::P("data"_ax))(x); }) ==
          "namedax::shard_map: result 0 has 0 dims, but its out spec has 1 entries");
    auto row = [](auto) { return namedax::expand_dims(namedax::axis_index("data"_ax) * 2, 0); };
    CHECK(namedax_test::error_of([&] {
            namedax::shard_map(row, m, namedax::P("data"_ax), namedax::P(namedax::none, "data"_ax))(x);
          }) == "namedax::shard_map: result 0 has 1 dims, but its out spec has 2 entries");
    CHECK_BITWISE(xt::xarray<std::int32_t>(namedax::shard_map(row, m, namedax::P("data"_ax), namedax::P("data"_ax))(x)),
                  (xt::xarray<std::int32_t>{0, 2}));
    auto plain = namedax::shard_map([](auto) { return xt::xarray<double>{1., 2.}; }, m, namedax::P("data"_ax),
                                    namedax::P(namedax::none, "data"_ax));
    CHECK(namedax_test::error_of([&] { plain(x); }) ==
          "namedax::shard_map: result 0 has 1 dims, but its out spec has 2 entries");
    CHECK(namedax_test::error_of([] { namedax::mesh{namedax::devices<"data">(2), namedax::vectorized<"model">(0)}; }) ==
          "namedax::mesh: axis \"model\" has size 0; every mesh axis needs at least one index");
  }

  TEST_CASE("grad outside shard_map (JAX's training step) on a 2-D mesh: closed form, inside, every placement, pytrees") {
    // The loss sum_n (x_n . w - t_n)^2 with the rows of x and t split over "data" and the
    // features of x and w over "model"; its gradient 2 sum_n (x_n . w - t_n) x_n.
    std::mt19937 rng(38);
    const xt::xarray<double> x = namedax_test::random_array<double>(rng, {8, 4});
    const xt::xarray<double> t = namedax_test::random_array<double>(rng, {8});
    const xt::xarray<double> w = namedax_test::random_array<double>(rng, {4});
    xt::xarray<double> closed_form = xt::zeros<double>({4});
    for (std::size_t n = 0; n < 8; ++n) closed_form += 2 * (xt::sum(xt::row(x, n) * w)() - t(n)) * xt::row(x, n);
    auto loss = [](const auto& wb, const auto& xb, const auto& tb) {
      auto r = namedax::psum(namedax::sum(xb * wb, 1), "model"_ax) - tb;
      return namedax::psum(namedax::sum(r * r), "data"_ax);
    };
    const auto specs = std::tuple{namedax::P("model"_ax), namedax::P("data"_ax, "model"_ax), namedax::P("data"_ax)};
    auto outside = [&](const auto& m) {
      return namedax::grad([&](const auto& p) { return namedax::sum(namedax::shard_map(loss, m, specs, namedax::P())(p, x, t)); })(w);
    };
    auto inside = [&](const auto& m) {
      auto step = [&](const auto& wb, const auto& xb, const auto& tb) {
        return namedax::grad([&](const auto& q) { return loss(q, xb, tb); })(wb);
      };
      return namedax::shard_map(step, m, specs, namedax::P("model"_ax))(w, x, t);
    };
    namedax::mesh threads{namedax::devices<"data">(2), namedax::devices<"model">(2)};
    namedax::mesh mixed{namedax::devices<"data">(2), namedax::vectorized<"model">(2)};
    namedax::mesh vectorized{namedax::vectorized<"data">(2), namedax::vectorized<"model">(2)};
    const xt::xarray<double> g_mixed = outside(mixed);
    INFO("grad: ", namedax_test::show(g_mixed), "\n  expected: ", namedax_test::show(closed_form));
    CHECK(xt::amax(xt::abs(g_mixed - closed_form))() < 1e-12 * (1 + xt::amax(xt::abs(closed_form))()));
    CHECK_BITWISE(g_mixed, xt::xarray<double>(inside(mixed)));
    CHECK_BITWISE(g_mixed, outside(threads));
    CHECK_BITWISE(g_mixed, outside(vectorized));
    // A replicated argument (spec P()): its cotangent comes back summed over the mesh.
    auto replicated = [](const auto& wb, const auto& xb) { return namedax::psum(namedax::sum(namedax::sin(xb) * wb), "data"_ax); };
    auto through = [&](const auto& m) {
      return namedax::grad([&](const auto& p) {
        return namedax::sum(namedax::shard_map(replicated, m, std::tuple{namedax::P(), namedax::P("data"_ax)}, namedax::P())(p, x));
      })(w);
    };
    // A pytree argument: the parameters (w, c) as a std::tuple, one spec for both; the loss of
    // w + c, so that both gradients are the closed form at w + c, bit for bit the same.
    const xt::xarray<double> c = namedax_test::random_array<double>(rng, {4});
    xt::xarray<double> at_sum = xt::zeros<double>({4});
    for (std::size_t n = 0; n < 8; ++n) at_sum += 2 * (xt::sum(xt::row(x, n) * (w + c))() - t(n)) * xt::row(x, n);
    auto pair_loss = [&](const auto& params, const auto& xb, const auto& tb) {
      return loss(std::get<0>(params) + std::get<1>(params), xb, tb);
    };
    auto pair_outside = [&](const auto& m) {
      return namedax::grad([&](const auto& params) {
        return namedax::sum(namedax::shard_map(pair_loss, m, specs, namedax::P())(params, x, t));
      })(std::tuple{w, c});
    };
    const auto [gw, gc] = pair_outside(mixed);
    CHECK(xt::amax(xt::abs(gw - at_sum))() < 1e-12 * (1 + xt::amax(xt::abs(at_sum))()));
    CHECK_BITWISE(gw, gc);
    const auto [gw_threads, gc_threads] = pair_outside(threads);
    CHECK_BITWISE(gw, gw_threads);
    CHECK_BITWISE(gc, gc_threads);
    // The same under vmap and pmap, the parameters replicated (in_axes none for the tuple).
    auto per_row = [](const auto& params, const auto& row) {
      return namedax::square(namedax::sum((std::get<0>(params) + std::get<1>(params)) * row));
    };
    auto over_rows = [&](auto map) {
      return namedax::grad([&](const auto& params) {
        return namedax::sum(map(per_row, std::tuple{namedax::none, 0})(params, x));
      })(std::tuple{w, c});
    };
    const auto [vw, vc] = over_rows([](auto f, auto in) { return namedax::vmap<"i">(f, in); });
    const auto [pw, pc] = over_rows([](auto f, auto in) { return namedax::pmap<"i">(f, in); });
    xt::xarray<double> rows_form = xt::zeros<double>({4});
    for (std::size_t n = 0; n < 8; ++n) rows_form += 2 * xt::sum(xt::row(x, n) * (w + c))() * xt::row(x, n);
    CHECK(xt::amax(xt::abs(vw - rows_form))() < 1e-12 * (1 + xt::amax(xt::abs(rows_form))()));
    CHECK_BITWISE(vw, vc);
    CHECK_BITWISE(vw, pw);
    CHECK_BITWISE(vc, pc);
    const xt::xarray<double> g_replicated = through(mixed);
    const xt::xarray<double> expected = xt::sum(xt::sin(x), {0});
    CHECK(xt::amax(xt::abs(g_replicated - expected))() < 1e-12 * (1 + xt::amax(xt::abs(expected))()));
    CHECK_BITWISE(g_replicated, through(threads));
  }
}
