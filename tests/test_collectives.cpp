// SPDX-License-Identifier: MIT
// psum, pmean, pmax, pmin, axis_index and axis_size: JAX's docstring examples in both modes,
// semantics against naive loops, and vmap against pmap bit for bit on random inputs.
#include "test_support.hpp"

#include <boost/hana/define_struct.hpp>

#include <atomic>
#include <cmath>
#include <complex>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>

using namespace namedax::literals;
using namedax_test::both_modes;
using namedax_test::error_of;
using namedax_test::bitwise_equal;

// A pytree node of the user's: gradients of a model, one member per parameter.
template <class T>
struct gradients {
  BOOST_HANA_DEFINE_STRUCT(gradients, (T, weights), (T, bias));
};


TEST_SUITE("docstring examples") {
  TEST_CASE("the worked values of the headers' doc comments, in both modes") {
    // Each quote is the header's (tests/doc_comments.cmake checks that every one is here).
    const xt::xarray<int> x = xt::arange<int>(4);
    auto same = [](std::string_view quote, const auto& got, const auto& expected) {
      INFO(quote);
      CHECK_BITWISE(got.first, expected);
      CHECK_BITWISE(got.second, expected);
    };
    same("psum: With x = [0, 1, 2, 3] mapped along \"i\": [6, 6, 6, 6]",
         both_modes([](auto v) { return namedax::psum(v, "i"_ax); }, x), xt::xarray<int>{6, 6, 6, 6});
    same("pmean: [0, 1, 2, 3] -> [1.5, ...]", both_modes([](auto v) { return namedax::pmean(v, "i"_ax); }, x),
         xt::xarray<float>{1.5f, 1.5f, 1.5f, 1.5f});
    same("all_gather: With x = [0, 1, 2, 3] along \"i\": [0, 1, 2, 3] on every index",
         both_modes([](auto v) { return namedax::all_gather(v, "i"_ax); }, x),
         xt::xarray<int>(xt::broadcast(xt::arange<int>(4), {4, 4})));
    same("psum_scatter: With x the rows of arange(16).reshape(4, 4) along \"i\": [24, 28, 32, 36] on index 0..3",
         both_modes([](auto v) { return namedax::psum_scatter(v, "i"_ax); }, xt::xarray<int>(xt::arange<int>(16).reshape({4, 4}))),
         xt::xarray<int>{24, 28, 32, 36});
    same("pbroadcast: With x = [0, 1, 2, 3] along \"i\" and source 2: [2, 2, 2, 2]",
         both_modes([](auto v) { return namedax::pbroadcast(v, "i"_ax, 2); }, x), xt::xarray<int>{2, 2, 2, 2});
    same("axis_index: Under pmap<\"i\"> over 4 devices: 0, 1, 2, 3 on the devices",
         both_modes([](auto v) { return namedax::eval(v * 0 + namedax::axis_index("i"_ax)); }, x), x);
    const xt::xarray<float> sixths{0.f, 1.f / 6, 2.f / 6, 3.f / 6};
    auto normalize = [](auto v) { return v / namedax::psum(v, "i"_ax); };
    same("vmap: f(xt::xarray<float>{0, 1, 2, 3})  // {0, 1/6, 2/6, 3/6}",
         both_modes(normalize, xt::xarray<float>{0, 1, 2, 3}), sixths);
    namedax::mesh m{namedax::devices<"i">(4)};
    const xt::xarray<float> sharded =
        namedax::shard_map(normalize, m, namedax::P("i"_ax), namedax::P("i"_ax))(xt::xarray<float>{0, 1, 2, 3});
    CHECK_BITWISE(sharded, sixths);  // shard_map's: the same quote
    same("pmap: (xt::arange<int>(4))  // {6, 6, 6, 6}", both_modes([](auto v) { return namedax::psum(v, "i"_ax); }, x),
         xt::xarray<int>{6, 6, 6, 6});
    // all_gather_v: along "i" of size 3: x = [[a, b], [c, _], [d, e]], count = [2, 1, 2]
    const xt::xarray<int> rows{{1, 2}, {3, -1}, {4, 5}}, count{2, 1, 2};
    same("all_gather_v(x, count, \"i\"_ax)  // [a, b, c, d, e] on every index",
         both_modes([](auto v, auto c) { return namedax::pvary(namedax::all_gather_v(v, c, "i"_ax), "i"_ax); }, rows, count),
         xt::xarray<int>(xt::broadcast(xt::xarray<int>{1, 2, 3, 4, 5}, {3, 5})));
    // operator<<: a value of positional shape (2,) under a vmap of size 3, as elementwise.hpp prints it.
    std::string printed;
    namedax::vmap<"i">([&](auto v) {
      std::ostringstream out;
      out << namedax::eval(v * 1.f);
      printed = out.str();
      return v;
    })(xt::xarray<float>(xt::arange<float>(6).reshape({3, 2})));
    INFO(printed);
    CHECK(printed.find("named float32 (2,)") != std::string::npos);
    CHECK(printed.find("axes: i (vmap, size 3)") != std::string::npos);
    CHECK(printed.find("varies along: i") != std::string::npos);
    CHECK(printed.find("value (2, i=3):\n{{ 0.,  2.,  4.},\n { 1.,  3.,  5.}}") != std::string::npos);
  }
  TEST_CASE("JAX docstring, psum: [0, 1, 2, 3] sums to 6 on every index") {
    xt::xarray<int> x = xt::arange<int>(4);
    auto [v, p] = both_modes([](auto x) { return namedax::psum(x, "i"_ax); }, x);
    xt::xarray<int> expected{6, 6, 6, 6};
    CHECK_BITWISE(v, expected);
    CHECK_BITWISE(p, expected);
  }
  TEST_CASE("JAX docstring, psum: x / psum(x) normalizes") {
    xt::xarray<float> x = xt::arange<float>(4);
    auto [v, p] = both_modes([](auto x) { return x / namedax::psum(x, "i"_ax); }, x);
    xt::xarray<float> expected{0.f, 1.f / 6, 2.f / 6, 3.f / 6};
    CHECK_BITWISE(v, expected);
    CHECK_BITWISE(p, expected);
  }
  TEST_CASE("JAX docstring, psum with axis_index_groups [[0, 1], [2, 3]]") {
    xt::xarray<int> x = xt::arange<int>(4);
    auto f = [](auto x) { return namedax::psum(x, "i"_ax, {.axis_index_groups = {{0, 1}, {2, 3}}}); };
    auto [v, p] = both_modes(f, x);
    xt::xarray<int> expected{1, 1, 5, 5};
    CHECK_BITWISE(v, expected);
    CHECK_BITWISE(p, expected);
  }
  TEST_CASE("JAX docstring, psum of a 4x4 array, whole and in groups") {
    xt::xarray<int> x = xt::arange<int>(16).reshape({4, 4});
    auto [v, p] = both_modes([](auto x) { return namedax::psum(x, "i"_ax); }, x);
    xt::xarray<int> row{24, 28, 32, 36};
    xt::xarray<int> expected = xt::stack(xt::xtuple(row, row, row, row));
    CHECK_BITWISE(v, expected);
    CHECK_BITWISE(p, expected);
    auto g = [](auto x) { return namedax::psum(x, "i"_ax, {.axis_index_groups = {{0, 1}, {2, 3}}}); };
    auto [gv, gp] = both_modes(g, x);
    xt::xarray<int> grouped{{4, 6, 8, 10}, {4, 6, 8, 10}, {20, 22, 24, 26}, {20, 22, 24, 26}};
    CHECK_BITWISE(gv, grouped);
    CHECK_BITWISE(gp, grouped);
  }
  TEST_CASE("JAX docstring, pmean: [0, 1, 2, 3] gives 1.5 (float32 from int)") {
    xt::xarray<int> x = xt::arange<int>(4);
    auto [v, p] = both_modes([](auto x) { return namedax::pmean(x, "i"_ax); }, x);
    static_assert(std::is_same_v<decltype(v)::value_type, float>);
    xt::xarray<float> expected{1.5f, 1.5f, 1.5f, 1.5f};
    CHECK_BITWISE(v, expected);
    CHECK_BITWISE(p, expected);
  }
  TEST_CASE("JAX docstring, pmean: x / pmean(x)") {
    xt::xarray<float> x = xt::arange<float>(4);
    auto [v, p] = both_modes([](auto x) { return x / namedax::pmean(x, "i"_ax); }, x);
    xt::xarray<float> expected{0.f, 1.f / 1.5f, 2.f / 1.5f, 3.f / 1.5f};
    CHECK_BITWISE(v, expected);
    CHECK_BITWISE(p, expected);
  }
  TEST_CASE("JAX docstring, axis_index: 4 and 8 devices") {
    for (std::size_t n : {4u, 8u}) {
      xt::xarray<float> zeros = xt::zeros<float>({n});
      auto [v, p] = both_modes([](auto) { return namedax::axis_index("i"_ax); }, zeros);
      xt::xarray<std::int32_t> expected = xt::arange<std::int32_t>(static_cast<int>(n));
      CHECK_BITWISE(v, expected);
      CHECK_BITWISE(p, expected);
    }
  }
  TEST_CASE("JAX docstring, axis_index: nested pmap over i (4) and j (2)") {
    xt::xarray<float> zeros = xt::zeros<float>({4, 2});
    auto inner = [](auto) { return std::tuple{namedax::axis_index("i"_ax), namedax::axis_index("j"_ax)}; };
    xt::xarray<std::int32_t> ei{{0, 0}, {1, 1}, {2, 2}, {3, 3}}, ej{{0, 1}, {0, 1}, {0, 1}, {0, 1}};
    auto [pi, pj] = namedax::pmap<"i">(namedax::pmap<"j">(inner))(zeros);
    CHECK_BITWISE(pi, ei);
    CHECK_BITWISE(pj, ej);
    auto [vi, vj] = namedax::vmap<"i">(namedax::vmap<"j">(inner))(zeros);
    CHECK_BITWISE(vi, ei);
    CHECK_BITWISE(vj, ej);
    auto [mi, mj] = namedax::pmap<"i">(namedax::vmap<"j">(inner))(zeros);
    CHECK_BITWISE(mi, ei);
    CHECK_BITWISE(mj, ej);
  }
}

TEST_SUITE("reductions") {
  TEST_CASE("bool inputs sum as int32") {
    xt::xarray<bool> x{true, false, true, true};
    auto [v, p] = both_modes([](auto x) { return namedax::psum(x, "i"_ax); }, x);
    static_assert(std::is_same_v<decltype(v)::value_type, std::int32_t>);
    xt::xarray<std::int32_t> expected{3, 3, 3, 3};
    CHECK_BITWISE(v, expected);
    CHECK_BITWISE(p, expected);
  }
  TEST_CASE("complex values: psum sums, pmean keeps complex64 and complex128 as in JAX, in both modes") {
    using C = std::complex<float>;
    const xt::xarray<C> x{C(1, 2), C(3, -4), C(0, 1)};
    auto [sv, sp] = both_modes([](auto v) { return namedax::psum(v, "i"_ax); }, x);
    const xt::xarray<C> sum{C(4, -1), C(4, -1), C(4, -1)};
    CHECK_BITWISE(sv, sum);
    CHECK_BITWISE(sp, sum);
    auto [mv, mp] = both_modes([](auto v) { return namedax::pmean(v, "i"_ax); }, x);
    static_assert(std::is_same_v<decltype(mv)::value_type, C>);
    CHECK_BITWISE(mv, mp);
    for (const C m : mv) CHECK(std::abs(m - C(4.f / 3, -1.f / 3)) < 1e-6f);
    // complex128 over the name and a positional dim (a divisor of 3 * 2), and a plain value,
    // which every index holds: its mean is itself.
    using Z = std::complex<double>;
    const xt::xarray<Z> y{{Z(1, 1), Z(2, 0)}, {Z(3, -1), Z(4, 2)}, {Z(5, 0), Z(6, -3)}};
    auto f = [](auto v) {
      return std::tuple{namedax::pmean(v, namedax::axes("i"_ax, 0)), namedax::pmean(xt::xarray<Z>{Z(2, -6)}, "i"_ax)};
    };
    for (const auto& [mean, plain] : {namedax::vmap<"i">(f)(y), namedax::pmap<"i">(f)(y)}) {
      static_assert(std::is_same_v<std::remove_cvref_t<decltype(mean)>::value_type, Z>);
      REQUIRE(mean.size() == 3);
      for (const Z m : mean) CHECK(std::abs(m - Z(21. / 6, -1. / 6)) < 1e-12);
      for (const Z p : plain) CHECK(p == Z(2, -6));
    }
  }
  TEST_CASE("pmax and pmin, with NaN propagating") {
    xt::xarray<float> x{{1.f, 5.f}, {7.f, -2.f}, {3.f, 4.f}};
    auto [vmax, pmax] = both_modes([](auto x) { return namedax::pmax(x, "i"_ax); }, x);
    auto [vmin, pmin] = both_modes([](auto x) { return namedax::pmin(x, "i"_ax); }, x);
    xt::xarray<float> emax{{7.f, 5.f}, {7.f, 5.f}, {7.f, 5.f}}, emin{{1.f, -2.f}, {1.f, -2.f}, {1.f, -2.f}};
    CHECK_BITWISE(vmax, emax);
    CHECK_BITWISE(pmax, emax);
    CHECK_BITWISE(vmin, emin);
    CHECK_BITWISE(pmin, emin);
    xt::xarray<float> with_nan{1.f, std::nanf(""), 3.f};
    auto [vn, pn] = both_modes([](auto x) { return namedax::pmax(x, "i"_ax); }, with_nan);
    CHECK(xt::all(xt::isnan(vn)));
    CHECK(xt::all(xt::isnan(pn)));
  }
  TEST_CASE("a value that does not vary along the axis: psum gives size * x, pmax gives x") {
    xt::xarray<float> x = xt::arange<float>(5);
    xt::xarray<float> w{1.5f, -2.f};
    auto f = [](auto, auto w) { return std::tuple{namedax::psum(w, "i"_ax), namedax::pmax(w, "i"_ax)}; };
    for (auto [s, m] : {namedax::vmap<"i">(f, std::tuple{0, namedax::none})(x, w),
                        namedax::pmap<"i">(f, std::tuple{0, namedax::none})(x, w)}) {
      xt::xarray<float> es = xt::xarray<float>{{7.5f, -10.f}, {7.5f, -10.f}, {7.5f, -10.f}, {7.5f, -10.f}, {7.5f, -10.f}};
      xt::xarray<float> em = xt::xarray<float>{{1.5f, -2.f}, {1.5f, -2.f}, {1.5f, -2.f}, {1.5f, -2.f}, {1.5f, -2.f}};
      CHECK_BITWISE(s, es);
      CHECK_BITWISE(m, em);
    }
    // A plain scalar: psum(1, "i") is the axis size, as in JAX.
    auto size = namedax::vmap<"i">([](auto x) { return x * 0 + namedax::psum(1, "i"_ax); })(xt::xarray<int>{0, 0, 0});
    CHECK_BITWISE(size, (xt::xarray<int>{3, 3, 3}));
  }
  TEST_CASE("names mixed with positional axes") {
    xt::xarray<int> x = xt::arange<int>(24).reshape({4, 2, 3});
    auto f = [](auto x) { return namedax::psum(x, namedax::axes("i"_ax, 1)); };
    auto [v, p] = both_modes(f, x);
    // Expected: for each device, sum over i and over positional axis 1 (the size-3 one).
    xt::xarray<int> expected = xt::zeros<int>({4, 2});
    for (std::size_t d = 0; d < 4; ++d)
      for (std::size_t a = 0; a < 2; ++a)
        for (std::size_t i = 0; i < 4; ++i)
          for (std::size_t b = 0; b < 3; ++b) expected(d, a) += x(i, a, b);
    CHECK_BITWISE(v, expected);
    CHECK_BITWISE(p, expected);
    auto mean = [](auto x) { return namedax::pmean(x, namedax::axes(0, "i"_ax)); };
    auto [mv, mp] = both_modes(mean, x);
    xt::xarray<float> emean = xt::zeros<float>({4, 3});
    for (std::size_t d = 0; d < 4; ++d)
      for (std::size_t b = 0; b < 3; ++b) {
        int s = 0;
        for (std::size_t i = 0; i < 4; ++i)
          for (std::size_t a = 0; a < 2; ++a) s += x(i, a, b);
        emean(d, b) = static_cast<float>(s) / 8.f;
      }
    CHECK_BITWISE(mv, emean);
    CHECK_BITWISE(mp, emean);
  }
  TEST_CASE("several names: nested maps, psum over i, over j and over both") {
    xt::xarray<double> x = xt::arange<double>(24).reshape({4, 3, 2});
    auto sums = [](auto x) {
      return std::tuple{namedax::psum(x, "i"_ax), namedax::psum(x, "j"_ax), namedax::psum(x, namedax::axes("i"_ax, "j"_ax))};
    };
    xt::xarray<double> si = xt::zeros<double>({4, 3, 2}), sj = si, sij = si;
    for (std::size_t i = 0; i < 4; ++i)
      for (std::size_t j = 0; j < 3; ++j)
        for (std::size_t k = 0; k < 2; ++k)
          for (std::size_t a = 0; a < 4; ++a)
            for (std::size_t b = 0; b < 3; ++b) {
              if (b == j) si(i, j, k) += x(a, b, k);
              if (a == i) sj(i, j, k) += x(a, b, k);
              sij(i, j, k) += x(a, b, k);
            }
    auto check = [&](auto result) {
      auto [ri, rj, rij] = result;
      CHECK_BITWISE(ri, si);
      CHECK_BITWISE(rj, sj);
      CHECK_BITWISE(rij, sij);
    };
    check(namedax::vmap<"i">(namedax::vmap<"j">(sums))(x));
    check(namedax::pmap<"i">(namedax::vmap<"j">(sums))(x));
    check(namedax::vmap<"i">(namedax::pmap<"j">(sums))(x));
    check(namedax::pmap<"i">(namedax::pmap<"j">(sums))(x));
  }
  TEST_CASE("axis_index over two names is row-major in the order given") {
    xt::xarray<float> zeros = xt::zeros<float>({3, 2});
    auto f = [](auto) {
      return std::tuple{namedax::axis_index(namedax::axes("i"_ax, "j"_ax)), namedax::axis_index(namedax::axes("j"_ax, "i"_ax)),
                        namedax::axis_size(namedax::axes("i"_ax, "j"_ax))};
    };
    xt::xarray<std::int32_t> eij{{0, 1}, {2, 3}, {4, 5}}, eji{{0, 3}, {1, 4}, {2, 5}};
    for (auto [ij, ji, n] : {namedax::vmap<"i">(namedax::vmap<"j">(f))(zeros), namedax::pmap<"i">(namedax::vmap<"j">(f))(zeros),
                             namedax::pmap<"i">(namedax::pmap<"j">(f))(zeros)}) {
      CHECK_BITWISE(ij, eij);
      CHECK_BITWISE(ji, eji);
      CHECK(xt::all(xt::equal(n, 6)));
    }
  }
  TEST_CASE("collectives on axis_index before it meets a mapped value") {
    xt::xarray<float> zeros = xt::zeros<float>({5});
    auto f = [](auto) {
      auto i = namedax::axis_index("i"_ax);
      return std::tuple{namedax::psum(i, "i"_ax), namedax::pmax(i * 2, "i"_ax), i - namedax::pmin(i + 3, "i"_ax)};
    };
    xt::xarray<std::int32_t> sums{10, 10, 10, 10, 10}, maxes{8, 8, 8, 8, 8}, shifted{-3, -2, -1, 0, 1};
    for (auto [s, m, d] : {namedax::vmap<"i">(f)(zeros), namedax::pmap<"i">(f)(zeros)}) {
      CHECK_BITWISE(s, sums);
      CHECK_BITWISE(m, maxes);
      CHECK_BITWISE(d, shifted);
    }
  }
  TEST_CASE("axis_index values are accepted by every collective, contraction, gather and eval") {
    xt::xarray<float> zeros = xt::zeros<float>({4});
    auto f = [](auto) {
      auto i = namedax::axis_index("i"_ax);
      auto row = i * xt::xarray<std::int32_t>{1, 1, 1, 1};  // (4,): [i, i, i, i], still waiting for "i"
      return std::tuple{namedax::all_gather(i, "i"_ax),
                        namedax::ppermute(i, "i"_ax, {{0, 1}, {1, 2}, {2, 3}, {3, 0}}),
                        namedax::pshuffle(i, "i"_ax, {1, 2, 3, 0}),
                        namedax::all_to_all(row, "i"_ax, 0, 0),
                        namedax::psum_scatter(row, "i"_ax),
                        namedax::xeinsum<"j,j->">(row, row),
                        namedax::pdot(row, row, "i"_ax, {{0}, {0}}),
                        namedax::pgather(row, i, namedax::axes(0)),
                        namedax::eval(namedax::expand_dims(i, 0) * 2),
                        namedax::pargmax(i, "i"_ax),
                        namedax::pmean(i, "i"_ax)};
    };
    const xt::xarray<std::int32_t> gathered{{0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}};
    xt::xarray<std::int32_t> doubled = xt::xarray<std::int32_t>::from_shape({4, 1});
    for (int d = 0; d < 4; ++d) doubled(d, 0) = 2 * d;
    for (const auto& r : {namedax::vmap<"i">(f)(zeros), namedax::pmap<"i">(f)(zeros)}) {
      CHECK_BITWISE(std::get<0>(r), gathered);
      CHECK_BITWISE(std::get<1>(r), (xt::xarray<std::int32_t>{3, 0, 1, 2}));
      CHECK_BITWISE(std::get<2>(r), (xt::xarray<std::int32_t>{1, 2, 3, 0}));
      CHECK_BITWISE(std::get<3>(r), gathered);  // index d gets element d of every index's row
      CHECK_BITWISE(std::get<4>(r), (xt::xarray<std::int32_t>{6, 6, 6, 6}));
      CHECK_BITWISE(std::get<5>(r), (xt::xarray<std::int32_t>{0, 4, 16, 36}));
      CHECK_BITWISE(std::get<6>(r), (xt::xarray<std::int32_t>{56, 56, 56, 56}));  // 4 * (0 + 1 + 4 + 9)
      CHECK_BITWISE(std::get<7>(r), (xt::xarray<std::int32_t>{0, 1, 2, 3}));
      CHECK_BITWISE(std::get<8>(r), doubled);
      CHECK_BITWISE(std::get<9>(r), (xt::xarray<std::int32_t>{3, 3, 3, 3}));
      CHECK_BITWISE(std::get<10>(r), (xt::xarray<float>{1.5f, 1.5f, 1.5f, 1.5f}));
    }
  }
  TEST_CASE("groups with uneven sizes: pmean divides by the caller's own group size") {
    xt::xarray<float> x{1.f, 2.f, 3.f, 4.f, 6.f};
    auto f = [](auto x) { return namedax::pmean(x, "i"_ax, {.axis_index_groups = {{0, 2}, {3, 1, 4}}}); };
    auto [v, p] = both_modes(f, x);
    xt::xarray<float> expected{2.f, 4.f, 2.f, 4.f, 4.f};
    CHECK_BITWISE(v, expected);
    CHECK_BITWISE(p, expected);
  }
  TEST_CASE("pytrees: a Boost.Hana struct keeps its shape through collectives and both maps") {
    xt::xarray<float> x = xt::arange<float>(8).reshape({4, 2});
    auto f = [](auto x) {
      gradients<decltype(namedax::eval(x))> g{namedax::eval(x), namedax::eval(x * 2.f)};
      auto averaged = namedax::pmean(g, "i"_ax);
      static_assert(std::is_same_v<decltype(averaged.weights), decltype(averaged.bias)>);
      return averaged;
    };
    auto v = namedax::vmap<"i">(f)(x);
    auto p = namedax::pmap<"i">(f)(x);
    static_assert(std::is_same_v<decltype(v), gradients<xt::xarray<float>>>);
    xt::xarray<float> ew{{3.f, 4.f}, {3.f, 4.f}, {3.f, 4.f}, {3.f, 4.f}};
    CHECK_BITWISE(v.weights, ew);
    CHECK_BITWISE(p.weights, ew);
    CHECK_BITWISE(p.bias, (ew * 2.f));
  }
  TEST_CASE("pytrees: a tuple and an array of values") {
    xt::xarray<int> x = xt::arange<int>(4);
    auto f = [](auto x) {
      auto [a, b] = namedax::psum(std::tuple{x, x * 2}, "i"_ax);
      auto arr = namedax::pmax(std::array{x + 0, x + 1}, "i"_ax);
      return std::tuple{a, b, arr[0], arr[1]};
    };
    for (auto [a, b, c, d] : {namedax::vmap<"i">(f)(x), namedax::pmap<"i">(f)(x)}) {
      CHECK(xt::all(xt::equal(a, 6)));
      CHECK(xt::all(xt::equal(b, 12)));
      CHECK(xt::all(xt::equal(c, 3)));
      CHECK(xt::all(xt::equal(d, 4)));
    }
  }
  TEST_CASE("pytrees: a reduction's leaves meet once among devices, with the bits of one leaf at a time") {
    // Leaves copied into the communicator together (under 4 KiB in all), lent and folded whole
    // by every device, and folded in chunks into shared outputs (256 KiB and more).
    std::mt19937 rng(11);
    const std::vector<std::pair<std::vector<std::size_t>, std::vector<std::size_t>>> shapes{
        {{5, 3}, {5, 2, 2}}, {{5, 3000}, {5, 1}}, {{5, 70000}, {5, 3, 7}}};
    for (const auto& [sa, sb] : shapes) {
      const xt::xarray<float> a = namedax_test::random_array<float>(rng, sa), b = namedax_test::random_array<float>(rng, sb);
      auto together = [](auto a, auto b) {
        return std::tuple{namedax::psum(std::tuple{a, b}, "i"_ax), namedax::pmean(std::pair{a, b}, "i"_ax),
                          namedax::pmax(std::tuple{b, a}, "i"_ax), namedax::pmin(std::tuple{a, b}, "i"_ax)};
      };
      auto apart = [](auto a, auto b) {
        return std::tuple{std::tuple{namedax::psum(a, "i"_ax), namedax::psum(b, "i"_ax)},
                          std::pair{namedax::pmean(a, "i"_ax), namedax::pmean(b, "i"_ax)},
                          std::tuple{namedax::pmax(b, "i"_ax), namedax::pmax(a, "i"_ax)},
                          std::tuple{namedax::pmin(a, "i"_ax), namedax::pmin(b, "i"_ax)}};
      };
      namedax::start_tracing();
      const auto devices = namedax::pmap<"i">(together)(a, b);
      const auto events = namedax::stop_tracing();
      CHECK(events.size() == 5 * 4);  // one exchange per reduction and device, not one per leaf
      const auto leaf_by_leaf = namedax::pmap<"i">(apart)(a, b);
      const auto vectorized = namedax::vmap<"i">(together)(a, b);
      CHECK(namedax_test::tree_bitwise_equal(devices, leaf_by_leaf));
      CHECK(namedax_test::tree_bitwise_equal(devices, vectorized));
    }
  }
  TEST_CASE("pytrees: devices whose leaves split the same total differently get an error naming both shapes") {
    xt::xarray<float> x = xt::ones<float>({2, 4});
    auto f = [](auto x) {
      auto mine = namedax::eval(x);
      auto row = namedax::eval(namedax::expand_dims(mine, 0));
      if (namedax::axis_index("i"_ax) == 0) (void)namedax::psum(std::tuple{mine, row}, "i"_ax);
      else (void)namedax::psum(std::tuple{row, mine}, "i"_ax);
      return mine;
    };
    const std::string e = error_of([&] { namedax::pmap<"i">(f)(x); });
    CHECK(e.find("devices made different collective calls") != std::string::npos);
    CHECK(e.find("psum over ('i',) of 2 leaves of shapes (4,), (1, 4)") != std::string::npos);
    CHECK(e.find("psum over ('i',) of 2 leaves of shapes (1, 4), (4,)") != std::string::npos);
  }
}

TEST_SUITE("bad input") {
  TEST_CASE("groups that miss, repeat or overflow indices name psum, the axis and the size") {
    xt::xarray<int> x = xt::arange<int>(4);
    auto with = [&](std::vector<std::vector<int>> groups) {
      auto f = [groups](auto x) { return namedax::psum(x, "i"_ax, {.axis_index_groups = groups}); };
      return std::pair{error_of([&] { namedax::vmap<"i">(f)(x); }), error_of([&] { namedax::pmap<"i">(f)(x); })};
    };
    for (auto [v, p] : {with({{0, 1}, {2}}), with({{0, 1}, {1, 2, 3}}), with({{0, 1}, {2, 7}})}) {
      CHECK(v.find("namedax::psum") != std::string::npos);
      CHECK(v.find("'i'") != std::string::npos);
      CHECK(v.find("size 4") != std::string::npos);
      CHECK(p.find("namedax::psum") != std::string::npos);
    }
    CHECK(with({{0, 1}, {2}}).first.find("do not contain index 3") != std::string::npos);
    CHECK(with({{0, 1}, {1, 2, 3}}).first.find("index 1 twice") != std::string::npos);
    CHECK(with({{0, 1}, {2, 7}}).first.find("index 7") != std::string::npos);
  }
  TEST_CASE("groups with positional axes, and positional axes out of range") {
    xt::xarray<int> x = xt::arange<int>(8).reshape({4, 2});
    auto grouped = [](auto x) { return namedax::psum(x, namedax::axes("i"_ax, 0), {.axis_index_groups = {{0, 1, 2, 3}}}); };
    CHECK(error_of([&] { namedax::vmap<"i">(grouped)(x); }).find("positional") != std::string::npos);
    auto out_of_range = [](auto x) { return namedax::psum(x, namedax::axes("i"_ax, 3)); };
    auto message = error_of([&] { namedax::pmap<"i">(out_of_range)(x); });
    CHECK(message.find("namedax::psum: positional axis 3 is out of range for a value of positional rank 1") != std::string::npos);
  }
}

TEST_SUITE("differential") {
  // vmap and pmap agree bit for bit, on random shapes, sizes, dtypes and options.
  template <class T>
  void differential_run(std::mt19937& rng) {
    std::uniform_int_distribution<std::size_t> size_of(1, 8), rank_of(1, 3), extent(1, 4);
    const std::size_t n = size_of(rng);
    std::vector<std::size_t> shape{n};
    for (std::size_t k = rank_of(rng); k > 0; --k) shape.push_back(extent(rng));
    auto x = namedax_test::random_array<T>(rng, shape);
    // Random groups: a shuffled partition of 0..n-1 into a few groups.
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<std::vector<int>> groups(std::uniform_int_distribution<std::size_t>(1, n)(rng));
    for (std::size_t k = 0; k < n; ++k) groups[k % groups.size()].push_back(order[k]);
    const int rank = static_cast<int>(shape.size()) - 1;
    const int positional = std::uniform_int_distribution<int>(-rank, rank - 1)(rng);
    CAPTURE(n);
    CAPTURE(rank);
    CAPTURE(positional);

    auto f = [&](auto x) {
      return std::tuple{namedax::psum(x, "i"_ax),
                        namedax::pmean(x, "i"_ax),
                        namedax::pmax(x, "i"_ax),
                        namedax::pmin(x, "i"_ax),
                        namedax::psum(x, namedax::axes("i"_ax, positional)),
                        namedax::pmean(x, namedax::axes(positional, "i"_ax)),
                        namedax::psum(x, "i"_ax, {.axis_index_groups = groups}),
                        namedax::pmean(x, "i"_ax, {.axis_index_groups = groups}),
                        namedax::pmax(x, "i"_ax, {.axis_index_groups = groups}),
                        namedax::pmin(x, "i"_ax, {.axis_index_groups = groups}),
                        x * namedax::axis_index("i"_ax) / namedax::psum(x * x + 1, "i"_ax)};
    };
    auto v = namedax::vmap<"i">(f)(x);
    auto p = namedax::pmap<"i">(f)(x);
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      ([&] { CHECK_BITWISE(std::get<K>(v), std::get<K>(p)); }(), ...);
    }(std::make_index_sequence<std::tuple_size_v<decltype(v)>>{});
    // And against a naive loop for the plain psum, summing in index order.
    xt::xarray<typename std::decay_t<decltype(std::get<0>(v))>::value_type> expected = xt::zeros_like(std::get<0>(v));
    for (std::size_t d = 0; d < n; ++d)
      for (std::size_t i = 0; i < n; ++i) xt::view(expected, d) += xt::view(x, i);
    CHECK_BITWISE(std::get<0>(v), expected);
  }

  TEST_CASE_TEMPLATE("vmap and pmap agree bitwise on random inputs", T, float, double, std::int32_t, bool) {
    std::mt19937 rng(20261202);
    for (int run = 0; run < 12; ++run) differential_run<T>(rng);
  }
}

TEST_SUITE("vectorized fast paths") {
  // The index `i` along dimension `axis` of x (a slice that drops the dimension).
  template <class X>
  auto slice_along(const X& x, std::size_t axis, std::size_t i) {
    xt::xstrided_slice_vector at(x.dimension(), xt::all());
    at[axis] = i;
    return xt::strided_view(x, at);
  }

  // Shapes that send the kernels down every path: lines longer than a tile (2048 elements for
  // reductions, 256 for elementwise tiles, 32 for transposed copies), dims of size 1, and the
  // named axis first, in the middle and last.
  TEST_CASE_TEMPLATE("reductions and x / psum(x) with the named axis anywhere match naive loops and pmap", T, float,
                     double, std::int32_t, bool) {
    using S = std::conditional_t<std::is_same_v<T, bool>, std::int32_t, T>;  // what psum accumulates in
    std::mt19937 rng(20261202);
    for (const auto& shape : std::vector<std::vector<std::size_t>>{{4, 1, 2100}, {3, 40, 5}, {1, 600, 6}, {2, 3, 1}, {5, 70, 33}})
      for (std::size_t axis = 0; axis < 3; ++axis) {
        INFO("shape ", shape[0], "x", shape[1], "x", shape[2], ", named axis ", axis);
        const xt::xarray<T> x = namedax_test::random_array<T>(rng, shape);
        const int at = static_cast<int>(axis);
        auto reduce = [](auto v) { return std::tuple{namedax::psum(v, "i"_ax), namedax::pmax(v, "i"_ax), namedax::pmin(v, "i"_ax)}; };
        auto [vs, vmax, vmin] = namedax::vmap<"i">(reduce, at, at)(x);
        // pmap for the shapes whose named axis is a handful of devices (not 600 threads).
        const bool few_devices = shape[axis] <= 8;
        if (few_devices) {
          auto [ps, pmax, pmin] = namedax::pmap<"i">(reduce, at, at)(x);
          CHECK_BITWISE(vs, ps);
          CHECK_BITWISE(vmax, pmax);
          CHECK_BITWISE(vmin, pmin);
        }
        // Members added in index order, element by element.
        xt::xarray<S> sum = xt::cast<S>(slice_along(x, axis, 0));
        for (std::size_t i = 1; i < shape[axis]; ++i) sum = xt::cast<S>(sum + xt::cast<S>(slice_along(x, axis, i)));
        for (std::size_t i = 0; i < shape[axis]; ++i) CHECK_BITWISE(slice_along(vs, axis, i), sum);
        if constexpr (std::is_floating_point_v<T>) {
          auto normalize = [](auto v) { return v / namedax::psum(v, "i"_ax); };
          auto vn = namedax::vmap<"i">(normalize, at, at)(x);
          if (few_devices) CHECK_BITWISE(vn, namedax::pmap<"i">(normalize, at, at)(x));
          for (std::size_t i = 0; i < shape[axis]; ++i)
            CHECK_BITWISE(slice_along(vn, axis, i), xt::xarray<T>(slice_along(x, axis, i) / sum));
        }
      }
  }

  // The SIMD folds against a naive loop: axis sizes and element counts that no batch width
  // divides, NaN of either sign at the first, a middle and the last member (the last one past
  // the members that fill whole batches) and in the elements past the last whole batch, two
  // NaNs in one element (the later wins), +0 and -0 ties, integers of two widths; the named
  // axis first, in the middle and last.
  template <bool Max, class T>
  T naive_extreme(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(b)) return b;
      if (std::isnan(a)) return a;
    }
    return (Max ? a < b : b < a) ? b : a;
  }
  template <class T>
  bool same_or_both_nan(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(a) && std::isnan(b)) return true;
    }
    return std::memcmp(&a, &b, sizeof(T)) == 0;
  }

  TEST_CASE_TEMPLATE("psum, pmax and pmin of odd sizes with NaN anywhere match a naive loop and pmap", T, float,
                     double, std::int32_t, std::int16_t) {
    std::mt19937 rng(11);
    const std::size_t rows = 3, cols = 13, elements = rows * cols;
    for (std::size_t n : {3u, 5u, 9u, 17u})
      for (std::size_t axis = 0; axis < 3; ++axis) {
        INFO("axis size ", n, ", named axis at ", axis);
        // The members along the first dimension, then moved to position `axis`.
        xt::xarray<T> front = namedax_test::random_array<T>(rng, {n, rows, cols});
        auto at = [&](std::size_t member, std::size_t element) -> T& { return front.data()[member * elements + element]; };
        if constexpr (std::is_floating_point_v<T>) {
          const T nan = std::numeric_limits<T>::quiet_NaN();
          at(0, 0) = nan;
          at(n / 2, 1) = -nan;
          at(n - 1, elements - 1) = -nan;
          at(1, elements - 2) = nan, at(n - 1, elements - 2) = -nan;
          for (std::size_t i = 0; i < n; ++i) at(i, 5) = i % 2 ? T(0) : -T(0), at(i, 6) = i % 2 ? -T(0) : T(0);
        }
        const std::vector<std::size_t> order = axis == 0 ? std::vector<std::size_t>{0, 1, 2}
                                               : axis == 1 ? std::vector<std::size_t>{1, 0, 2}
                                                           : std::vector<std::size_t>{1, 2, 0};
        const xt::xarray<T> x = xt::transpose(front, order);
        auto reduce = [](auto v) { return std::tuple{namedax::psum(v, "i"_ax), namedax::pmax(v, "i"_ax), namedax::pmin(v, "i"_ax)}; };
        const int in_axis = static_cast<int>(axis);
        auto [vs, vmax, vmin] = namedax::vmap<"i">(reduce, in_axis, 0)(x);
        auto [ps, pmax, pmin] = namedax::pmap<"i">(reduce, in_axis, 0)(x);
        CHECK_BITWISE(vmax, pmax);
        CHECK_BITWISE(vmin, pmin);
        for (std::size_t e = 0; e < elements; ++e) {
          T sum = at(0, e), largest = at(0, e), smallest = at(0, e);
          for (std::size_t i = 1; i < n; ++i)
            sum = static_cast<T>(sum + at(i, e)), largest = naive_extreme<true>(largest, at(i, e)),
            smallest = naive_extreme<false>(smallest, at(i, e));
          for (std::size_t i = 0; i < n; ++i) {
            INFO("element ", e, ", index ", i);
            CHECK(same_or_both_nan(vs.data()[i * elements + e], sum));
            CHECK(same_or_both_nan(ps.data()[i * elements + e], sum));
            CHECK(std::memcmp(&vmax.data()[i * elements + e], &largest, sizeof(T)) == 0);
            CHECK(std::memcmp(&vmin.data()[i * elements + e], &smallest, sizeof(T)) == 0);
          }
        }
      }
  }

  TEST_CASE("pmax and pmin propagate NaN from any member, with the named axis first or last") {
    for (std::size_t axis : {0u, 1u})
      for (std::size_t member : {0u, 2u, 4u}) {
        xt::xarray<float> x = xt::ones<float>(axis == 0 ? std::vector<std::size_t>{5, 3000} : std::vector<std::size_t>{3000, 5});
        const std::size_t element = 2999;
        (axis == 0 ? x(member, element) : x(element, member)) = std::nanf("");
        const int at = static_cast<int>(axis);
        auto extremes = [](auto v) { return std::tuple{namedax::pmax(v, "i"_ax), namedax::pmin(v, "i"_ax)}; };
        auto [vmax, vmin] = namedax::vmap<"i">(extremes, at, 0)(x);
        auto [pmax, pmin] = namedax::pmap<"i">(extremes, at, 0)(x);
        CHECK_BITWISE(vmax, pmax);
        CHECK_BITWISE(vmin, pmin);
        CHECK(std::isnan(vmax(1, element)));
        CHECK(std::isnan(vmin(1, element)));
        CHECK(vmax(1, element - 1) == 1.f);
      }
  }

  TEST_CASE_TEMPLATE("all_gather and all_to_all with the named axis anywhere agree with pmap", T, float, std::int32_t, bool) {
    std::mt19937 rng(7);
    const std::size_t n = 4;
    for (std::size_t axis = 0; axis < 3; ++axis)
      for (std::size_t length : {1u, 3u, 40u}) {
        INFO("named axis ", axis, ", length ", length);
        std::vector<std::size_t> shape{n, length * n};
        shape.insert(shape.begin() + static_cast<std::ptrdiff_t>(axis), n);
        const xt::xarray<T> x = namedax_test::random_array<T>(rng, shape);
        const int at = static_cast<int>(axis);
        for (int concat : {0, 1}) {
          auto untiled = [concat](auto v) { return namedax::all_to_all(v, "i"_ax, 0, concat); };
          CHECK_BITWISE(namedax::vmap<"i">(untiled, at, at)(x), namedax::pmap<"i">(untiled, at, at)(x));
          auto tiled = [concat](auto v) { return namedax::all_to_all(v, "i"_ax, 1, concat, {.tiled = true}); };
          CHECK_BITWISE(namedax::vmap<"i">(tiled, at, at)(x), namedax::pmap<"i">(tiled, at, at)(x));
          auto gather = [concat](auto v) { return namedax::all_gather(v, "i"_ax, {.axis = concat}); };
          CHECK_BITWISE(namedax::vmap<"i">(gather, at, 0)(x), namedax::pmap<"i">(gather, at, 0)(x));
        }
        // A strided view as the mapped argument, and an output stacked at another position.
        auto every_other = xt::view(x, xt::all(), xt::all(), xt::range(0, static_cast<std::ptrdiff_t>(x.shape()[2]), 2));
        auto swap = [](auto v) { return namedax::all_to_all(v, "i"_ax, 0, 0); };
        if (axis != 0) continue;  // the split axis keeps size n only when the view thins the last dim
        CHECK_BITWISE(namedax::vmap<"i">(swap, 0, 1)(every_other), namedax::pmap<"i">(swap, 0, 1)(every_other));
      }
  }

  TEST_CASE("untiled all_to_all under vmap is a view of its operand: no element moves, the operand lives as long") {
    std::mt19937 rng(11);
    const std::size_t n = 4;
    const xt::xarray<float> x = namedax_test::random_array<float>(rng, {n, n, n, 5});
    auto split0 = [](auto v) { return namedax::all_to_all(v, "i"_ax, 0, 1); };
    // The result reads the caller's array in place: its elements are x's.
    const float* seen = nullptr;
    auto watched = [&](auto v) {
      auto r = namedax::all_to_all(v, "i"_ax, 0, 1);
      seen = namedax::detail::block_of(r.payload()).data;
      return r;
    };
    CHECK_BITWISE(namedax::vmap<"i">(watched)(x), namedax::pmap<"i">(split0)(x));
    CHECK((seen >= x.data() && seen < x.data() + x.size()));
    // The operand is a temporary, or a lazy expression, gone before the result is read.
    auto of_temporary = [](auto v) {
      auto r = [&] {
        auto doubled = namedax::eval(v * 2.f);
        return namedax::all_to_all(doubled, "i"_ax, 1, 0);
      }();
      return r + namedax::all_to_all(v - 1.f, "i"_ax, 0, 1);
    };
    CHECK_BITWISE(namedax::vmap<"i">(of_temporary)(x), namedax::pmap<"i">(of_temporary)(x));
    // Rebound, reduced, gathered, exchanged again, read through a negative stride (flip).
    auto used = [](auto v) {
      auto r = namedax::all_to_all(v, "i"_ax, 0, 0);
      r = r * 3.f;
      auto back = namedax::all_to_all(namedax::all_to_all(v, "i"_ax, 1, 1), "i"_ax, 0, 0);
      auto flipped = namedax::all_to_all(namedax::flip(v, 0), "i"_ax, 0, 0);
      return std::tuple{r + namedax::psum(back, "i"_ax), namedax::all_gather(back, "i"_ax), flipped,
                        namedax::pswapaxes(v, "i"_ax, 0)};
    };
    const auto [a, b, c, d] = namedax::vmap<"i">(used)(x);
    const auto [pa, pb, pc, pd] = namedax::pmap<"i">(used)(x);
    CHECK_BITWISE(a, pa);
    CHECK_BITWISE(b, pb);
    CHECK_BITWISE(c, pc);
    CHECK_BITWISE(d, pd);
    // Inside device threads, and around them; written into the caller's array.
    auto inner = [](auto v) { return namedax::all_to_all(v, "i"_ax, 1, 0); };
    const xt::xarray<float> y = namedax_test::random_array<float>(rng, {2, n, 3, n});
    const auto expected = namedax::pmap<"j">(namedax::pmap<"i">(inner))(y);
    CHECK_BITWISE(namedax::pmap<"j">(namedax::vmap<"i">(inner))(y), expected);
    auto outer_inner = [](auto w) { return namedax::all_to_all(w, "i"_ax, 0, 0); };
    const xt::xarray<float> z = namedax_test::random_array<float>(rng, {n, 2, n, 3});
    CHECK_BITWISE(namedax::vmap<"i">(namedax::pmap<"j">(outer_inner))(z),
                  namedax::pmap<"i">(namedax::pmap<"j">(outer_inner))(z));
    xt::xarray<float> out;
    namedax::vmap<"i">(split0).into(out)(x);
    CHECK_BITWISE(out, namedax::pmap<"i">(split0)(x));
    // On device threads the result is the rule's own array, which eval shares, not copies.
    std::atomic<int> shared{0};
    auto held = [&](auto v) {
      auto r = namedax::all_to_all(v, "i"_ax, 0, 1);
      auto e = namedax::eval(r);
      if (e.payload().data() == r.payload().data()) ++shared;
      return e;
    };
    CHECK_BITWISE(namedax::pmap<"i">(held)(x), namedax::pmap<"i">(split0)(x));
    CHECK(shared.load() == static_cast<int>(n));
  }
}

namespace {
/// One collective of the size-0 table: `make(axis)` is the mapped function over that axis;
/// `per_index` the input's shape at each index; `result` JAX's result shape over an axis of size 0.
struct empty_axis_case {
  std::string name;
  std::function<std::vector<std::size_t>()> vmapped, nested;  // result shapes under vmap<i>, pmap<i>(vmap<j>)
  std::vector<std::size_t> result;
};

template <class Make>
empty_axis_case empty_axis_entry(std::string name, Make make, std::vector<std::size_t> per_index,
                                 std::vector<std::size_t> result) {
  auto shape_of = [](const auto& r) { return std::vector<std::size_t>(r.shape().begin(), r.shape().end()); };
  std::vector<std::size_t> outer = per_index, nested = per_index;
  outer.insert(outer.begin(), 0);
  nested.insert(nested.begin(), {2, 0});
  return {name,
          [=] { return shape_of(namedax::vmap<"i">(make("i"_ax))(xt::xarray<float>::from_shape(outer))); },
          [=] { return shape_of(namedax::pmap<"i">(namedax::vmap<"j">(make("j"_ax)))(xt::xarray<float>::from_shape(nested))); },
          result};
}
}  // namespace

TEST_SUITE("degenerate sizes") {
  TEST_CASE("every collective over a vmap axis of size 0 gives JAX's empty result, also inside pmap") {
    using V = std::vector<std::size_t>;
    const std::vector<empty_axis_case> table{
        empty_axis_entry("psum", [](auto a) { return [a](auto x) { return namedax::psum(x, a); }; }, {4}, {0, 4}),
        empty_axis_entry("pmean", [](auto a) { return [a](auto x) { return namedax::pmean(x, a); }; }, {4}, {0, 4}),
        empty_axis_entry("pmax", [](auto a) { return [a](auto x) { return namedax::pmax(x, a); }; }, {4}, {0, 4}),
        empty_axis_entry("pmin", [](auto a) { return [a](auto x) { return namedax::pmin(x, a); }; }, {4}, {0, 4}),
        empty_axis_entry("psum grouped", [](auto a) { return [a](auto x) { return namedax::psum(x, a, {.axis_index_groups = {}}); }; },
                         {4}, {0, 4}),
        empty_axis_entry("pargmax", [](auto a) { return [a](auto x) { return namedax::pargmax(x, a); }; }, {4}, {0, 4}),
        empty_axis_entry("pargmin", [](auto a) { return [a](auto x) { return namedax::pargmin(x, a); }; }, {4}, {0, 4}),
        empty_axis_entry("all_gather", [](auto a) { return [a](auto x) { return namedax::all_gather(x, a); }; }, {4}, {0, 0, 4}),
        empty_axis_entry("all_gather tiled", [](auto a) { return [a](auto x) { return namedax::all_gather(x, a, {.tiled = true}); }; },
                         {4}, {0, 0}),
        empty_axis_entry("psum_scatter", [](auto a) { return [a](auto x) { return namedax::psum_scatter(x, a); }; }, {0, 4}, {0, 4}),
        empty_axis_entry("psum_scatter tiled",
                         [](auto a) { return [a](auto x) { return namedax::psum_scatter(x, a, {.tiled = true}); }; }, {0, 4}, {0, 0, 4}),
        empty_axis_entry("all_to_all", [](auto a) { return [a](auto x) { return namedax::all_to_all(x, a, 0, 1); }; }, {0, 4},
                         {0, 4, 0}),
        empty_axis_entry("all_to_all tiled",
                         [](auto a) { return [a](auto x) { return namedax::all_to_all(x, a, 0, 1, {.tiled = true}); }; }, {0, 4},
                         {0, 0, 0}),
        empty_axis_entry("pswapaxes", [](auto a) { return [a](auto x) { return namedax::pswapaxes(x, a, 0); }; }, {0, 4}, {0, 0, 4}),
        empty_axis_entry("ppermute", [](auto a) { return [a](auto x) { return namedax::ppermute(x, a, std::vector<std::pair<int, int>>{}); }; },
                         {4}, {0, 4}),
        empty_axis_entry("pshuffle", [](auto a) { return [a](auto x) { return namedax::pshuffle(x, a, std::vector<int>{}); }; }, {4},
                         {0, 4}),
        empty_axis_entry("axis_index", [](auto a) { return [a](auto) { return namedax::axis_index(a); }; }, {4}, {0}),
        empty_axis_entry("pdot", [](auto a) { return [a](auto x) { return namedax::pdot(x, x, a, {{0}, {0}}); }; }, {4}, {0}),
        empty_axis_entry("pgather", [](auto a) { return [a](auto x) { return namedax::pgather(x, xt::xarray<int>{0, 1}, a); }; }, {4},
                         {0, 2, 4}),
        empty_axis_entry("elementwise", [](auto) { return [](auto x) { return x * 2.f + 1.f; }; }, {4}, {0, 4}),
    };
    for (const auto& c : table) {
      CAPTURE(c.name);
      CHECK(c.vmapped() == c.result);
      V nested = c.result;
      nested.insert(nested.begin(), 2);
      CHECK(c.nested() == nested);
    }
    auto einsum = [](auto x) { return namedax::xeinsum<"j{i},j{i}->">(x, x); };
    CHECK(namedax::vmap<"i">(einsum)(xt::xarray<float>::from_shape({0, 4})).shape() == V{0});
    // Tiled, the split dim must be a multiple of the axis size, and the only multiple of 0 is 0.
    auto tiled = [](auto x) { return namedax::all_to_all(x, "i"_ax, 0, 0, {.tiled = true}); };
    CHECK(namedax_test::error_of([&] { namedax::vmap<"i">(tiled)(xt::xarray<float>::from_shape({0, 4})); }) ==
          "namedax::all_to_all: the size of split_axis 0 (4) must be divisible by the size of axis ('i',) (0)");
    // An index named over an axis of size 0 is out of range, and the message says no index is valid.
    const auto empty = xt::xarray<float>::from_shape({0, 4});
    auto moved = [](auto x) { return namedax::ppermute(x, "i"_ax, {{0, 1}}); };
    CHECK(namedax_test::error_of([&] { namedax::vmap<"i">(moved)(empty); }) ==
          "namedax::ppermute: the pair (0, 1) is out of range for axis ('i',) of size 0; the axis has no index");
    auto shuffled = [](auto x) { return namedax::pshuffle(x, "i"_ax, {0}); };
    CHECK(namedax_test::error_of([&] { namedax::vmap<"i">(shuffled)(empty); }) ==
          "namedax::pshuffle: (0,) is not a permutation of no index for axis ('i',) of size 0");
    auto grouped = [](auto x) { return namedax::psum(x, "i"_ax, {.axis_index_groups = {{0}}}); };
    CHECK(namedax_test::error_of([&] { namedax::vmap<"i">(grouped)(empty); }).find(
              "contain index 0, which is out of range; the axis has no index") != std::string::npos);
    // pmap needs a device per index.
    auto psum = [](auto x) { return namedax::psum(x, "i"_ax); };
    CHECK(namedax_test::error_of([&] { namedax::pmap<"i">(psum)(xt::xarray<float>::from_shape({0, 4})); }) ==
          "namedax::pmap<\"i\">: cannot map over zero devices");
  }
  TEST_CASE("a reduction over an empty positional axis gives the identity: 0, -inf / +inf, the lowest / largest integer") {
    auto reduce = [](auto x) {
      return std::tuple{namedax::psum(x, namedax::axes(0)), namedax::pmax(x, namedax::axes(0)), namedax::pmin(x, namedax::axes(0)),
                        namedax::pmax(x, namedax::axes("i"_ax, 0)), namedax::pmin(x, namedax::axes("i"_ax, 0))};
    };
    constexpr float inf = std::numeric_limits<float>::infinity();
    for (auto [s, mx, mn, amx, amn] : {namedax::vmap<"i">(reduce)(xt::xarray<float>::from_shape({3, 0, 2})),
                                       namedax::pmap<"i">(reduce)(xt::xarray<float>::from_shape({3, 0, 2}))}) {
      CHECK_BITWISE(s, (xt::xarray<float>{{0.f, 0.f}, {0.f, 0.f}, {0.f, 0.f}}));
      CHECK_BITWISE(mx, (xt::xarray<float>{{-inf, -inf}, {-inf, -inf}, {-inf, -inf}}));
      CHECK_BITWISE(mn, (xt::xarray<float>{{inf, inf}, {inf, inf}, {inf, inf}}));
      CHECK_BITWISE(amx, (xt::xarray<float>{{-inf, -inf}, {-inf, -inf}, {-inf, -inf}}));
      CHECK_BITWISE(amn, (xt::xarray<float>{{inf, inf}, {inf, inf}, {inf, inf}}));
    }
    constexpr int lowest = std::numeric_limits<int>::lowest(), largest = std::numeric_limits<int>::max();
    for (auto [s, mx, mn, amx, amn] : {namedax::vmap<"i">(reduce)(xt::xarray<int>::from_shape({2, 0})),
                                       namedax::pmap<"i">(reduce)(xt::xarray<int>::from_shape({2, 0}))}) {
      CHECK_BITWISE(s, (xt::xarray<int>{0, 0}));
      CHECK_BITWISE(mx, (xt::xarray<int>{lowest, lowest}));
      CHECK_BITWISE(mn, (xt::xarray<int>{largest, largest}));
      CHECK_BITWISE(amx, (xt::xarray<int>{lowest, lowest}));
      CHECK_BITWISE(amn, (xt::xarray<int>{largest, largest}));
    }
  }
  TEST_CASE("integer sums wrap as JAX's do, in every mode and path, bit for bit") {
    constexpr std::int32_t big = std::numeric_limits<std::int32_t>::max();
    const std::int32_t wrapped = static_cast<std::int32_t>(std::uint32_t(big) * 3u + 5u);  // 3 (2^31 - 1) + 5, modulo 2^32
    // Long enough for the batch loops, with the named axis first and last.
    xt::xarray<std::int32_t> x = xt::xarray<std::int32_t>::from_shape({4, 37});
    for (std::size_t k = 0; k < 37; ++k) x(0, k) = big, x(1, k) = big, x(2, k) = big, x(3, k) = 5;
    auto f = [](auto x) { return namedax::psum(x, "i"_ax); };
    xt::xarray<std::int32_t> expected = xt::xarray<std::int32_t>::from_shape({4, 37});
    expected.fill(wrapped);
    CHECK_BITWISE(namedax::vmap<"i">(f)(x), expected);
    CHECK_BITWISE(namedax::pmap<"i">(f)(x), expected);
    xt::xarray<std::int32_t> xt_ = xt::transpose(x);
    xt::xarray<std::int32_t> expected_t = xt::transpose(expected);
    CHECK_BITWISE(namedax::vmap<"i">(f, 1, 1)(xt_), expected_t);
    // Positional: the same sum over dim 0 of each index's (4, 37) block.
    auto g = [](auto x) { return namedax::psum(x, namedax::axes(0)); };
    auto stacked = xt::xarray<std::int32_t>(xt::stack(xt::xtuple(x, x)));
    xt::xarray<std::int32_t> expected_g = xt::view(expected, xt::range(0, 2), xt::all());
    CHECK_BITWISE(namedax::vmap<"i">(g)(stacked), expected_g);
    CHECK_BITWISE(namedax::pmap<"i">(g)(stacked), expected_g);
    // A value that does not vary: size * x wraps too.
    auto h = [](auto, auto w) { return namedax::psum(w, "i"_ax); };
    xt::xarray<std::int32_t> w{big};
    const std::int32_t three_big = static_cast<std::int32_t>(std::uint32_t(big) * 3u);
    auto expected_h = xt::xarray<std::int32_t>::from_shape({3, 1});
    expected_h.fill(three_big);
    for (auto r : {namedax::vmap<"i">(h, std::tuple{0, namedax::none})(xt::xarray<int>{0, 0, 0}, w),
                   namedax::pmap<"i">(h, std::tuple{0, namedax::none})(xt::xarray<int>{0, 0, 0}, w)})
      CHECK_BITWISE(r, expected_h);
    auto scalar = [](auto x) { return x * 0 + namedax::psum(std::numeric_limits<std::int32_t>::max(), "i"_ax); };
    CHECK(namedax::vmap<"i">(scalar)(xt::xarray<int>{0, 0, 0})(0) == three_big);
    // Contractions: big * 3 + 5 * 1 over two indices of "i".
    xt::xarray<std::int32_t> a{big, 5}, b{3, 1};
    a.reshape({2, 1}), b.reshape({2, 1});
    auto contract = [](auto a, auto b) {
      return std::tuple{namedax::pdot(a, b, "i"_ax, {{0}, {0}}), namedax::xeinsum<"j{i},j{i}->">(a, b)};
    };
    const std::int32_t dot = static_cast<std::int32_t>(std::uint32_t(big) * 3u + 5u);
    for (auto [d, e] : {namedax::vmap<"i">(contract)(a, b), namedax::pmap<"i">(contract)(a, b)}) {
      CHECK_BITWISE(d, (xt::xarray<std::int32_t>{dot, dot}));
      CHECK_BITWISE(e, (xt::xarray<std::int32_t>{dot, dot}));
    }
  }
}

// JAX's current names: pbroadcast from a source, all_gather_invariant, pcast, and axis_index
// and axis_size over a tuple of names. Expected values written by hand from JAX's docs.
namespace {
/// Whether named value type V varies along any of the names.
template <class V, class... Names>
constexpr bool varies_along(Names...) {
  return (V::varying & V::env_type::template mask_of<Names...>()) != 0;
}
}  // namespace

TEST_SUITE("JAX's current names") {
  TEST_CASE("pbroadcast: axis of 4, source 2, every index gets x[2], exact for NaN, infinities and -0") {
    constexpr float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    xt::xarray<float> x{{0.f, 1.f, 2.f}, {3.f, 4.f, 5.f}, {nan, -inf, -0.f}, {9.f, 10.f, 11.f}};
    auto f = [](auto x) {
      auto y = namedax::pbroadcast(x, "i"_ax, 2);
      static_assert(!varies_along<decltype(y)>("i"_ax), "pbroadcast's result is the same along the axis");
      return y;
    };
    auto [v, p] = both_modes(f, x);
    xt::xarray<float> expected{{nan, -inf, -0.f}, {nan, -inf, -0.f}, {nan, -inf, -0.f}, {nan, -inf, -0.f}};
    CHECK_BITWISE(v, expected);
    CHECK_BITWISE(p, expected);
    // Every source, against a naive copy of row s, with the mapped axis last too.
    for (int s = 0; s < 4; ++s) {
      auto g = [s](auto x) { return namedax::pbroadcast(x, "i"_ax, s); };
      xt::xarray<float> row = xt::view(x, s, xt::all());
      xt::xarray<float> all = xt::stack(xt::xtuple(row, row, row, row));
      CHECK_BITWISE(namedax::vmap<"i">(g)(x), all);
      CHECK_BITWISE(namedax::pmap<"i">(g)(x), all);
      xt::xarray<float> xt_ = xt::transpose(x);
      CHECK_BITWISE(namedax::vmap<"i">(g, 1, 0)(xt_), all);
    }
  }
  TEST_CASE("pbroadcast: pmap of vmap, vmap of vmap and pmap of pmap agree bit for bit, over i, j and (i, j)") {
    // x[i][j] = 10 i + j, a (4, 2, 3) array: "i" of 4, "j" of 2, then a positional dim of 3.
    xt::xarray<double> x = xt::arange<double>(24).reshape({4, 2, 3});
    x(2, 1, 0) = std::numeric_limits<double>::quiet_NaN();
    auto f = [](auto x) {
      return std::tuple{namedax::pbroadcast(x, "i"_ax, 2), namedax::pbroadcast(x, "j"_ax, 1),
                        namedax::pbroadcast(x, namedax::axes("i"_ax, "j"_ax), 5),
                        namedax::pbroadcast(x, namedax::axes("j"_ax, "i"_ax), 6)};
    };
    xt::xarray<double> ei = xt::empty<double>({4, 2, 3}), ej = ei, eij = ei, eji = ei;
    for (std::size_t i = 0; i < 4; ++i)
      for (std::size_t j = 0; j < 2; ++j)
        for (std::size_t k = 0; k < 3; ++k) {
          ei(i, j, k) = x(2, j, k);
          ej(i, j, k) = x(i, 1, k);
          eij(i, j, k) = x(2, 1, k);  // 5 = 2 * size_j + 1
          eji(i, j, k) = x(2, 1, k);  // 6 = 1 * size_i + 2, over ("j", "i")
        }
    auto vv = namedax::vmap<"i">(namedax::vmap<"j">(f))(x);
    auto pv = namedax::pmap<"i">(namedax::vmap<"j">(f))(x);
    auto pp = namedax::pmap<"i">(namedax::pmap<"j">(f))(x);
    auto vp = namedax::vmap<"i">(namedax::pmap<"j">(f))(x);
    for (const auto& [a, b, c, d] : {vv, pv, pp, vp}) {
      CHECK_BITWISE(a, ei);
      CHECK_BITWISE(b, ej);
      CHECK_BITWISE(c, eij);
      CHECK_BITWISE(d, eji);
    }
  }
  TEST_CASE("pbroadcast: bool stays bool, int is copied, and payloads past the inline size are lent") {
    xt::xarray<bool> b{false, true, false, false};
    auto fb = [](auto x) { return namedax::pbroadcast(x, "i"_ax, 1); };
    auto [bv, bp] = both_modes(fb, b);
    static_assert(std::is_same_v<decltype(bv)::value_type, bool>);
    CHECK_BITWISE(bv, (xt::xarray<bool>{true, true, true, true}));
    CHECK_BITWISE(bp, (xt::xarray<bool>{true, true, true, true}));
    constexpr std::int32_t lowest = std::numeric_limits<std::int32_t>::min();
    xt::xarray<std::int32_t> i{7, lowest, -3, 12};
    auto fi = [](auto x) { return namedax::pbroadcast(x, "i"_ax, 1); };
    auto [iv, ip] = both_modes(fi, i);
    CHECK_BITWISE(iv, (xt::xarray<std::int32_t>{lowest, lowest, lowest, lowest}));
    CHECK_BITWISE(ip, (xt::xarray<std::int32_t>{lowest, lowest, lowest, lowest}));
    // 8 KB per device: lent by pointer, not copied into the communicator.
    xt::xarray<float> big = xt::arange<float>(4 * 2048).reshape({4, 2048});
    auto fbig = [](auto x) { return namedax::pbroadcast(x * 1.f, "i"_ax, 3); };
    xt::xarray<float> last = xt::view(big, 3, xt::all());
    xt::xarray<float> expected = xt::stack(xt::xtuple(last, last, last, last));
    auto [gv, gp] = both_modes(fbig, big);
    CHECK_BITWISE(gv, expected);
    CHECK_BITWISE(gp, expected);
  }
  TEST_CASE("pbroadcast: pytrees (a tuple and a Boost.Hana struct) keep their shape") {
    xt::xarray<float> x = xt::arange<float>(8).reshape({4, 2});
    auto f = [](auto x) {
      auto [a, b] = namedax::pbroadcast(std::tuple{x, x * 2.f}, "i"_ax, 3);
      gradients<decltype(namedax::eval(x))> g{namedax::eval(x), namedax::eval(x + 1.f)};
      auto h = namedax::pbroadcast(g, "i"_ax, 0);
      return std::tuple{a, b, h.weights, h.bias};
    };
    xt::xarray<float> ea{{6.f, 7.f}, {6.f, 7.f}, {6.f, 7.f}, {6.f, 7.f}};
    xt::xarray<float> ew{{0.f, 1.f}, {0.f, 1.f}, {0.f, 1.f}, {0.f, 1.f}};
    for (const auto& [a, b, w, c] : {namedax::vmap<"i">(f)(x), namedax::pmap<"i">(f)(x)}) {
      CHECK_BITWISE(a, ea);
      CHECK_BITWISE(b, (ea * 2.f));
      CHECK_BITWISE(w, ew);
      CHECK_BITWISE(c, (ew + 1.f));
    }
  }
  TEST_CASE("pbroadcast of a value that does not vary along the axis is that value") {
    xt::xarray<int> x{1, 2, 3, 4};
    auto f = [](auto x) { return namedax::pbroadcast(namedax::psum(x, "i"_ax), "i"_ax, 3); };
    auto [v, p] = both_modes(f, x);
    CHECK_BITWISE(v, (xt::xarray<int>{10, 10, 10, 10}));
    CHECK_BITWISE(p, (xt::xarray<int>{10, 10, 10, 10}));
    auto g = [](auto, auto w) { return namedax::pbroadcast(w, "i"_ax, 1); };
    xt::xarray<int> w{5, 6};
    xt::xarray<int> expected{{5, 6}, {5, 6}, {5, 6}, {5, 6}};
    CHECK_BITWISE(namedax::vmap<"i">(g, std::tuple{0, namedax::none})(x, w), expected);
    CHECK_BITWISE(namedax::pmap<"i">(g, std::tuple{0, namedax::none})(x, w), expected);
  }
  TEST_CASE("pbroadcast: a source out of range names pbroadcast, the axis and its size, in both modes") {
    xt::xarray<float> x = xt::arange<float>(4);
    for (int source : {-1, 4, 100}) {
      auto f = [source](auto x) { return namedax::pbroadcast(x, "i"_ax, source); };
      const std::string expected = "namedax::pbroadcast: source " + std::to_string(source) +
                                   " is out of range for axis ('i',) of size 4; use indices 0..3";
      CHECK(error_of([&] { namedax::vmap<"i">(f)(x); }) == expected);
      CHECK(error_of([&] { namedax::pmap<"i">(f)(x); }) == expected);
    }
    // Over two names, the size is the product.
    auto two = [](auto x) { return namedax::pbroadcast(x, namedax::axes("i"_ax, "j"_ax), 8); };
    xt::xarray<float> y = xt::zeros<float>({4, 2});
    CHECK(error_of([&] { namedax::pmap<"i">(namedax::vmap<"j">(two))(y); }) ==
          "namedax::pbroadcast: source 8 is out of range for axis ('i', 'j') of size 8; use indices 0..7");
    // One device with a bad source, the others waiting in the exchange: every device leaves.
    auto one_bad = [](auto x) {
      int source = 1;
      if (namedax::axis_index("i"_ax) == 0) source = 9;
      return namedax::pbroadcast(x, "i"_ax, source);
    };
    CHECK(error_of([&] { namedax::pmap<"i">(one_bad)(x); }).find("namedax::pbroadcast: source 9") != std::string::npos);
    // Devices that name different (valid) sources meet a mismatch, not a broadcast.
    auto differ = [](auto x) {
      int source = 1;
      if (namedax::axis_index("i"_ax) == 0) source = 0;
      return namedax::pbroadcast(x, "i"_ax, source);
    };
    const auto mismatch = error_of([&] { namedax::pmap<"i">(differ)(x); });
    CHECK(mismatch.find("from source 0") != std::string::npos);
    CHECK(mismatch.find("from source 1") != std::string::npos);
  }
  TEST_CASE("pbroadcast(x, axes) without a source is the deprecated spelling of pvary, and still works") {
    xt::xarray<int> x{1, 2, 3, 4};
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
    auto f = [](auto x) {
      auto y = namedax::pbroadcast(namedax::psum(x, "i"_ax), "i"_ax);
      static_assert(varies_along<decltype(y)>("i"_ax));
      return namedax::psum(y, "i"_ax);
    };
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
    auto [v, p] = both_modes(f, x);
    CHECK_BITWISE(v, (xt::xarray<int>{40, 40, 40, 40}));
    CHECK_BITWISE(p, (xt::xarray<int>{40, 40, 40, 40}));
  }
  TEST_CASE("all_gather_invariant: [0, 1, 2, 3] on every index, typed invariant, the bits of all_gather") {
    xt::xarray<int> x = xt::arange<int>(4);
    auto f = [](auto x) {
      auto g = namedax::all_gather_invariant(x, "i"_ax);
      static_assert(!varies_along<decltype(g)>("i"_ax));
      return g;
    };
    auto [v, p] = both_modes(f, x);
    xt::xarray<int> row{0, 1, 2, 3};
    xt::xarray<int> expected = xt::stack(xt::xtuple(row, row, row, row));
    CHECK_BITWISE(v, expected);
    CHECK_BITWISE(p, expected);
    // With options, tiled and at an axis; a pytree; bool; against all_gather.
    xt::xarray<int> counting = xt::arange<int>(24).reshape({4, 3, 2});
    xt::xarray<bool> m = xt::equal(counting % 3, 0);
    auto g = [](auto x) {
      return std::tuple{namedax::all_gather_invariant(x, "i"_ax, {.axis = 1, .tiled = true}),
                        namedax::all_gather(x, "i"_ax, {.axis = 1, .tiled = true}),
                        namedax::all_gather_invariant(std::tuple{x, x}, "i"_ax, {.axis = 2})};
    };
    for (const auto& [a, b, t] : {namedax::vmap<"i">(g)(m), namedax::pmap<"i">(g)(m)}) {
      CHECK(a.shape() == std::vector<std::size_t>{4, 3, 8});
      CHECK_BITWISE(a, b);
      CHECK(std::get<0>(t).shape() == std::vector<std::size_t>{4, 3, 2, 4});
      CHECK_BITWISE(std::get<0>(t), std::get<1>(t));
    }
    CHECK(namedax_test::tree_bitwise_equal(namedax::vmap<"i">(g)(m), namedax::pmap<"i">(g)(m)));
  }
  TEST_CASE("pcast to varying is pvary: the same data, typed as varying") {
    xt::xarray<float> x{1.f, 2.f, 3.f, 4.f};
    auto f = [](auto x) {
      auto s = namedax::psum(x, "i"_ax);
      auto c = namedax::pcast(s, "i"_ax, namedax::pcast_to::varying);
      static_assert(varies_along<decltype(c)>("i"_ax));
      static_assert(std::is_same_v<decltype(c), decltype(namedax::pvary(s, "i"_ax))>);
      return std::tuple{c, namedax::psum(c, "i"_ax)};
    };
    for (const auto& [c, s] : {namedax::vmap<"i">(f)(x), namedax::pmap<"i">(f)(x)}) {
      CHECK_BITWISE(c, (xt::xarray<float>{10.f, 10.f, 10.f, 10.f}));
      CHECK_BITWISE(s, (xt::xarray<float>{40.f, 40.f, 40.f, 40.f}));
    }
  }
  TEST_CASE("pvary of a plain array or scalar: the value at every index, varying, under vmap, pmap and shard_map") {
    const xt::xarray<float> x{{1.f, 2.f, 3.f}, {4.f, 5.f, 6.f}, {7.f, 8.f, 9.f}, {10.f, 11.f, 12.f}};
    auto f = [](auto x) {
      // The loop carry that starts from a constant (JAX: acc = pvary(jnp.zeros(3), 'i')).
      auto acc = namedax::pvary(xt::zeros<float>({3}), "i"_ax);
      static_assert(namedax::DeferredValue<decltype(acc)>);  // it waits for the map's environment
      auto carry = namedax::eval(acc + x);
      static_assert(varies_along<decltype(carry)>("i"_ax));
      for (int k = 0; k < 2; ++k) carry += x;
      auto ones = namedax::zeros_like(x);
      ones = namedax::pvary(xt::xarray<float>{1.f, 1.f, 1.f}, "i"_ax);  // a named variable takes it
      ones += x;
      const auto row = namedax::pvary(xt::xarray<float>{0.5f, -1.f, 2.f}, "i"_ax);
      return std::tuple{row, carry, ones, namedax::psum(namedax::pvary(2, "i"_ax), "i"_ax),
                        namedax::psum(row, "i"_ax), namedax::pcast(3.f, "i"_ax, namedax::pcast_to::varying)};
    };
    const xt::xarray<float> rows{{0.5f, -1.f, 2.f}, {0.5f, -1.f, 2.f}, {0.5f, -1.f, 2.f}, {0.5f, -1.f, 2.f}};
    const xt::xarray<float> sums{{2.f, -4.f, 8.f}, {2.f, -4.f, 8.f}, {2.f, -4.f, 8.f}, {2.f, -4.f, 8.f}};
    const xt::xarray<float> thrice = x * 3.f, plus_one = x + 1.f;
    for (const auto& [r, carry, ones, eights, s, threes] : {namedax::vmap<"i">(f)(x), namedax::pmap<"i">(f)(x)}) {
      CHECK_BITWISE(r, rows);
      CHECK_BITWISE(carry, thrice);
      CHECK_BITWISE(ones, plus_one);
      CHECK_BITWISE(eights, (xt::xarray<int>{8, 8, 8, 8}));
      CHECK_BITWISE(s, sums);
      CHECK_BITWISE(threes, (xt::xarray<float>{3.f, 3.f, 3.f, 3.f}));
    }
    // Inside pmap of vmap, along both names and along the inner one.
    auto g = [](auto x) {
      auto both = namedax::pvary(xt::xarray<float>{1.f, 2.f, 3.f}, namedax::axes("i"_ax, "j"_ax));
      auto inner = namedax::pvary(10.f, "j"_ax);
      return std::tuple{namedax::eval(both + x), namedax::psum(both, namedax::axes("i"_ax, "j"_ax)),
                        namedax::psum(inner, "j"_ax)};
    };
    xt::xarray<float> x2 = x;
    x2.reshape({2, 2, 3});
    const xt::xarray<float> twelve{{{12.f, 24.f, 36.f}, {12.f, 24.f, 36.f}}, {{12.f, 24.f, 36.f}, {12.f, 24.f, 36.f}}};
    for (const auto& [added, total, twenty] : {namedax::pmap<"i">(namedax::vmap<"j">(g))(x2),
                                               namedax::vmap<"i">(namedax::vmap<"j">(g))(x2)}) {
      CHECK_BITWISE(added, (xt::xarray<float>(x2 + xt::xarray<float>{1.f, 2.f, 3.f})));
      CHECK_BITWISE(total, (xt::xarray<float>(twelve / 3.f * xt::xarray<float>{1.f, 1.f, 1.f})));
      CHECK_BITWISE(twenty, (xt::xarray<float>{{20.f, 20.f}, {20.f, 20.f}}));
    }
    // shard_map, on devices and on a mixed mesh: each block plus the constant row.
    auto h = [](auto block) {
      return namedax::eval(namedax::pvary(xt::xarray<float>{1.f, 2.f, 3.f}, namedax::axes("i"_ax, "j"_ax)) + block);
    };
    const xt::xarray<float> expected = x + xt::xarray<float>{1.f, 2.f, 3.f};
    namedax::mesh devices{namedax::devices<"i">(2), namedax::devices<"j">(2)};
    namedax::mesh mixed{namedax::devices<"i">(2), namedax::vectorized<"j">(2)};
    const auto spec = namedax::P(namedax::axes("i"_ax, "j"_ax));
    CHECK_BITWISE(namedax::shard_map(h, devices, spec, spec)(x), expected);
    CHECK_BITWISE(namedax::shard_map(h, mixed, spec, spec)(x), expected);
    // Outside a map that binds the axis: the error of a collective on a plain value.
    CHECK(error_of([] { (void)namedax::pvary(xt::xarray<float>{1.f}, "i"_ax); }) ==
          "namedax::pvary: axis 'i' is not bound by an enclosing vmap or pmap; wrap the function in "
          "namedax::vmap<\"i\"> or namedax::pmap<\"i\">");
    // Within a map of another axis (combined with its values, it would not compile: the type
    // says which name it awaits).
    CHECK(error_of([&] { namedax::vmap<"j">([](auto v) { (void)namedax::pvary(1.f, "i"_ax); return v; })(x); }) ==
          "namedax::pvary: axis 'i' is not bound by an enclosing vmap or pmap; wrap the function in "
          "namedax::vmap<\"i\"> or namedax::pmap<\"i\">");
    CHECK(error_of([&] { namedax::pmap<"j">([](auto v) { (void)namedax::pcast(1.f, "i"_ax, namedax::pcast_to::varying); return v; })(x); })
              .find("namedax::pcast: axis 'i' is not bound by an enclosing vmap or pmap") != std::string::npos);
  }
  TEST_CASE("axis_size and axis_index over a std::tuple of names equal the axes(...) form") {
    xt::xarray<float> zeros = xt::zeros<float>({4, 2});
    auto f = [](auto x) {
      CHECK(namedax::axis_size(std::tuple{"i"_ax, "j"_ax}) == 8);
      CHECK(namedax::axis_size(std::tuple{"j"_ax}) == 2);
      return std::tuple{x * 0.f + namedax::axis_index(std::tuple{"i"_ax, "j"_ax}),
                        x * 0.f + namedax::axis_index(namedax::axes("i"_ax, "j"_ax)),
                        x * 0.f + namedax::axis_index(std::tuple{"j"_ax, "i"_ax})};
    };
    xt::xarray<float> ij{{0.f, 1.f}, {2.f, 3.f}, {4.f, 5.f}, {6.f, 7.f}};
    xt::xarray<float> ji{{0.f, 4.f}, {1.f, 5.f}, {2.f, 6.f}, {3.f, 7.f}};
    for (const auto& [a, b, c] : {namedax::vmap<"i">(namedax::vmap<"j">(f))(zeros), namedax::pmap<"i">(namedax::vmap<"j">(f))(zeros),
                                  namedax::pmap<"i">(namedax::pmap<"j">(f))(zeros)}) {
      CHECK_BITWISE(a, ij);
      CHECK_BITWISE(b, ij);
      CHECK_BITWISE(c, ji);
    }
  }
}
