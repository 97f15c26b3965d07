// SPDX-License-Identifier: MIT
// Named values: broadcasting by name, scalars and xtensor arrays mixing in, lazy expressions
// that outlive their operands, and SPMD values.
#include "test_support.hpp"

#include <xtensor/xtensor.hpp>

using namespace namedax::literals;

TEST_SUITE("named values") {
  TEST_CASE("arithmetic broadcasts by name, whatever order the names came in") {
    // a varies along i only, b along j only: a + b varies along both, as an outer sum.
    xt::xarray<int> a{0, 10, 20}, b{1, 2};
    auto f = [](auto a, auto b) {
      auto outer = [](auto b, auto a) { return std::tuple{a + b, b - a, a * b}; };
      return namedax::vmap<"j">(outer, std::tuple{0, namedax::none})(b, a);
    };
    auto check = [&](auto result) {
      auto [sum, difference, product] = result;
      xt::xarray<int> es{{1, 2}, {11, 12}, {21, 22}}, ed{{1, 2}, {-9, -8}, {-19, -18}}, ep{{0, 0}, {10, 20}, {20, 40}};
      CHECK_BITWISE(sum, es);
      CHECK_BITWISE(difference, ed);
      CHECK_BITWISE(product, ep);
    };
    check(namedax::vmap<"i">(f, std::tuple{0, namedax::none})(a, b));
    check(namedax::pmap<"i">(f, std::tuple{0, namedax::none})(a, b));
  }

  TEST_CASE("positional dims broadcast NumPy-style, right-aligned, under the names") {
    xt::xarray<float> x = xt::arange<float>(6).reshape({3, 2});  // mapped along dim 0: each slice (2,)
    xt::xarray<float> m{{1.f, 2.f}, {3.f, 4.f}, {5.f, 6.f}, {7.f, 8.f}};  // plain (4, 2)
    auto f = [&](auto x) { return x * m + 1.f; };                          // (4, 2) per index
    auto v = namedax::vmap<"i">(f)(x);
    auto p = namedax::pmap<"i">(f)(x);
    REQUIRE(v.shape() == std::vector<std::size_t>{3, 4, 2});
    for (std::size_t i = 0; i < 3; ++i)
      for (std::size_t r = 0; r < 4; ++r)
        for (std::size_t c = 0; c < 2; ++c) CHECK(v(i, r, c) == x(i, c) * m(r, c) + 1.f);
    CHECK_BITWISE(v, p);
  }

  TEST_CASE("comparisons, where, unary functions and casts") {
    xt::xarray<float> x{-2.f, -0.5f, 0.f, 3.f};
    auto f = [](auto x) {
      auto positive = x > 0.f;
      return std::tuple{namedax::where(positive, x, -x), namedax::cast<int>(x == 0.f), namedax::exp(x * 0.f),
                        namedax::maximum(x, 0.f), -x, namedax::sqrt(namedax::square(x))};
    };
    for (auto [absolute, is_zero, ones, relu, negated, root] : {namedax::vmap<"i">(f)(x), namedax::pmap<"i">(f)(x)}) {
      CHECK_BITWISE(absolute, (xt::xarray<float>{2.f, 0.5f, -0.f, 3.f}));  // where(0 > 0, 0, -0)
      CHECK_BITWISE(is_zero, (xt::xarray<int>{0, 0, 1, 0}));
      CHECK_BITWISE(ones, (xt::xarray<float>{1.f, 1.f, 1.f, 1.f}));
      CHECK_BITWISE(relu, (xt::xarray<float>{0.f, 0.f, 0.f, 3.f}));
      CHECK_BITWISE(negated, (xt::xarray<float>{2.f, 0.5f, -0.f, -3.f}));
      CHECK_BITWISE(root, (xt::xarray<float>{2.f, 0.5f, 0.f, 3.f}));
    }
  }

  TEST_CASE("remainders, also of axis_index: a position within blocks of 3") {
    xt::xarray<int> x = xt::arange<int>(6) * 10;
    auto f = [](auto x) { return namedax::eval(x % 7 + namedax::axis_index("i"_ax) % 3); };
    const xt::xarray<int> expected{0, 4, 8, 2, 6, 3};  // (0, 3, 6, 2, 5, 1) + (0, 1, 2, 0, 1, 2)
    CHECK_BITWISE(namedax::vmap<"i">(f)(x), expected);
    CHECK_BITWISE(namedax::pmap<"i">(f)(x), expected);
  }

  TEST_CASE("a value computed from axis_index alone, over two names in every mix of placements") {
    // Computed where it is written, for every index of both names, then resolved where it
    // meets x: the device's index along a device axis, a vectorized dim along a vmap axis.
    xt::xarray<int> x = xt::zeros<int>({2, 3});
    auto f = [](auto x) {
      auto ij = namedax::axis_index(namedax::axes("i"_ax, "j"_ax));  // i * 3 + j
      auto step = (ij * 5 - 1 + 6) % 6;                                // a ring's step, 0..5
      auto j_total = namedax::psum(namedax::axis_index("j"_ax), "j"_ax);  // 0 + 1 + 2, along i too
      return namedax::eval(x + step * 10 + j_total);
    };
    xt::xarray<int> expected = xt::zeros<int>({2, 3});
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j) expected(i, j) = ((i * 3 + j) * 5 + 5) % 6 * 10 + 3;
    auto vv = namedax::vmap<"i">(namedax::vmap<"j">(f));
    auto pv = namedax::pmap<"i">(namedax::vmap<"j">(f));
    auto vp = namedax::vmap<"i">(namedax::pmap<"j">(f));
    auto pp = namedax::pmap<"i">(namedax::pmap<"j">(f));
    CHECK_BITWISE(vv(x), expected);
    CHECK_BITWISE(pv(x), expected);
    CHECK_BITWISE(vp(x), expected);
    CHECK_BITWISE(pp(x), expected);
    // Returned from the maps on its own, it is stacked like any result.
    auto alone = [](auto) { return (namedax::axis_index(namedax::axes("i"_ax, "j"_ax)) * 5 - 1 + 6) % 6; };
    xt::xarray<int> steps = (expected - 3) / 10;
    CHECK_BITWISE(namedax::pmap<"i">(namedax::vmap<"j">(alone))(x), steps);
    CHECK_BITWISE(namedax::vmap<"i">(namedax::pmap<"j">(alone))(x), steps);
  }

  TEST_CASE("a lazy expression outlives the locals it was built from") {
    xt::xarray<double> x = xt::arange<double>(5);
    auto f = [](auto x) {
      auto scaled = x * 2.0;                 // a lazy expression in a local
      auto total = namedax::psum(x, "i"_ax);  // a collective result in a local
      return scaled / total + 1.0;           // returned after both locals are gone
    };
    xt::xarray<double> expected = xt::arange<double>(5) * 2.0 / 10.0 + 1.0;
    CHECK_BITWISE(namedax::vmap<"i">(f)(x), expected);
    CHECK_BITWISE(namedax::pmap<"i">(f)(x), expected);
  }

  TEST_CASE("eval and expand_dims keep the names") {
    xt::xarray<float> x = xt::arange<float>(6).reshape({2, 3});
    auto f = [](auto x) {
      auto e = namedax::eval(x + 1.f);
      static_assert(decltype(e)::varying == decltype(x)::varying);
      auto column = namedax::expand_dims(e, 1);  // (3,) -> (3, 1)
      CHECK(column.shape() == std::vector<std::size_t>{3, 1});
      return column * xt::xarray<float>{1.f, 10.f};  // (3, 2)
    };
    auto v = namedax::vmap<"i">(f)(x);
    REQUIRE(v.shape() == std::vector<std::size_t>{2, 3, 2});
    CHECK(v(1, 2, 1) == (x(1, 2) + 1.f) * 10.f);
    CHECK_BITWISE(v, namedax::pmap<"i">(f)(x));
  }

  TEST_CASE("SPMD control flow: one value per device under pmap") {
    xt::xarray<int> x{5, 6, 7, 8};
    auto f = [](auto x) {
      // axis_index is concrete on each device: rank-0 style branching works as in MPI.
      int extra = 0;
      if (namedax::axis_index("i"_ax) == 0) extra = 100;
      if (x.value() > 6) extra += 1;
      return x + extra;
    };
    CHECK_BITWISE(namedax::pmap<"i">(f)(x), (xt::xarray<int>{105, 6, 8, 9}));
  }

  TEST_CASE("a condition on axis_index under vmap is a clear runtime error") {
    xt::xarray<int> x{5, 6};
    auto f = [](auto x) {
      if (namedax::axis_index("i"_ax) == 0) return namedax::eval(x + 1);
      return namedax::eval(x + 0);
    };
    CHECK_THROWS_WITH_AS(namedax::vmap<"i">(f)(x), doctest::Contains("is many values under vmap"), namedax::error);
  }

  TEST_CASE("a broadcast whose element count overflows std::size_t is an error naming the shapes") {
    constexpr std::size_t big = std::size_t{1} << 32;
    auto f = [](auto x) { return x * xt::ones<float>({big, big}); };
    xt::xarray<float> x{1.f, 2.f};
    const std::string plain = "namedax: a value of shape (4294967296, 4294967296) has more elements than std::size_t "
                              "counts; slice or reduce its operands first";
    CHECK(namedax_test::error_of([&] { namedax::vmap<"i">(f)(x); }) == plain);
    CHECK(namedax_test::error_of([&] { namedax::pmap<"i">(f)(x); }) == plain);
    // Operands that fit in memory, whose broadcast does not: 2^21 x 2^22 x 2^21 elements.
    auto a = xt::xarray<float>::from_shape({2, std::size_t{1} << 21, 1, 1});
    auto b = xt::xarray<float>::from_shape({std::size_t{1} << 22, 1});
    auto c = xt::xarray<float>::from_shape({std::size_t{1} << 21});
    auto g = [](auto a, auto b, auto c) { return a * b * c; };
    const std::string named = "namedax: operands of shapes (2097152, 4194304, 1) and (2097152,) broadcast to shape "
                              "(2097152, 4194304, 2097152), which has more elements than std::size_t counts; slice or "
                              "reduce an operand first";
    const auto in_axes = std::tuple{0, namedax::none, namedax::none};
    CHECK(namedax_test::error_of([&] { namedax::vmap<"i">(g, in_axes)(a, b, c); }) == named);
    CHECK(namedax_test::error_of([&] { namedax::pmap<"i">(g, in_axes)(a, b, c); }) == named);
    // 2^63 elements at each index, the same at both: stacked under vmap, 2^64.
    auto same = [](auto, auto a, auto b, auto c) { return a * b * c; };
    auto d = xt::xarray<float>::from_shape({std::size_t{1} << 21, 1, 1});
    auto e = xt::xarray<float>::from_shape({std::size_t{1} << 21, 1});
    const auto unmapped = std::tuple{0, namedax::none, namedax::none, namedax::none};
    CHECK(namedax_test::error_of([&] { namedax::vmap<"i">(same, unmapped)(xt::xarray<float>{1.f, 2.f}, d, e, c); }) ==
          "namedax::vmap<\"i\">: stacking 2 results of shape (2097152, 2097152, 2097152) gives more elements than "
          "std::size_t counts; slice or reduce the results first");
  }

  TEST_CASE("operands whose positional shapes do not broadcast: a namedax::error naming them, not xtensor's") {
    // xtensor would say "Incompatible dimension of arrays" with the payloads' shapes, the vmap
    // dims at their end included.
    const xt::xarray<float> a = xt::zeros<float>({2, 3}), b = xt::zeros<float>({2, 4});
    auto add = [](auto x, auto y) { return namedax::eval(x + y); };
    const std::string mapped = "namedax: operands of shapes (3,) and (4,) do not broadcast (aligned on the right, each "
                               "dim must have extent 1 or the other's)";
    CHECK(namedax_test::error_of([&] { (void)namedax::vmap<"i">(add)(a, b); }) == mapped);
    CHECK(namedax_test::error_of([&] { (void)namedax::pmap<"i">(add)(a, b); }) == mapped);
    auto plain = [](auto x) { return namedax::eval(namedax::psum(x, "i"_ax) * xt::xarray<float>{1, 2}); };
    const std::string with_plain = "namedax: operands of shapes (3,) and (2,) do not broadcast (aligned on the right, "
                                   "each dim must have extent 1 or the other's)";
    CHECK(namedax_test::error_of([&] { (void)namedax::vmap<"i">(plain)(a); }) == with_plain);
    CHECK(namedax_test::error_of([&] { (void)namedax::pmap<"i">(plain)(a); }) == with_plain);
  }

  TEST_CASE("static sizes: a mismatch with the arguments is an error naming the sizes") {
    xt::xarray<float> x = xt::zeros<float>({5});
    auto f = [](auto x) { return x; };
    auto static5 = namedax::vmap<"i", 5>(f);
    auto static4 = namedax::vmap<"i", 4>(f);
    auto static4_devices = namedax::pmap<"i", 4>(f);
    CHECK_BITWISE(static5(x), x);
    CHECK_THROWS_WITH_AS(static4(x), doctest::Contains("static size 4 but the arguments give 5"), namedax::error);
    CHECK_THROWS_WITH_AS(static4_devices(x), doctest::Contains("static size 4 but the arguments give 5"),
                         namedax::error);
  }

  TEST_CASE("rebinding: an owning value takes updates in a loop, widening, in both modes") {
    xt::xarray<float> xs = xt::arange<float>(12).reshape({4, 3});
    auto f = [](auto x) {
      auto acc = namedax::eval(x * 0.f);  // varies along "i", owns its data
      for (int k = 0; k < 3; ++k) acc += x;
      acc = namedax::psum(acc, "i"_ax);  // the same along "i": widens
      acc = acc + namedax::cast<float>(namedax::axis_index("i"_ax));
      acc *= 2.f;
      acc -= 1.f;
      acc /= 2.f;
      return acc;
    };
    // 3 * column sums + i, then * 2 - 1, / 2.
    xt::xarray<float> expected = xt::xarray<float>::from_shape({4, 3});
    const float sums[] = {54.f, 66.f, 78.f};
    for (std::size_t i = 0; i < 4; ++i)
      for (std::size_t j = 0; j < 3; ++j) expected(i, j) = ((sums[j] + static_cast<float>(i)) * 2.f - 1.f) / 2.f;
    auto [a, b] = namedax_test::both_modes(f, xs);
    CHECK_BITWISE(a, expected);
    CHECK_BITWISE(b, expected);
  }

  TEST_CASE("rebinding replaces the data, never writes it: a value sharing it keeps its own") {
    xt::xarray<float> xs = xt::arange<float>(4);
    auto f = [](auto x) {
      auto a = namedax::eval(x);
      auto b = a;  // shares a's data
      b += 10.f;
      b = 5.f;  // a scalar: b becomes a scalar of a's element type
      return std::tuple{a, b};
    };
    auto [v, p] = namedax_test::both_modes(f, xs);
    CHECK_BITWISE(std::get<0>(v), xs);
    CHECK_BITWISE(std::get<0>(p), xs);
    CHECK_BITWISE(std::get<1>(v), xt::xarray<float>({5.f, 5.f, 5.f, 5.f}));
    CHECK_BITWISE(std::get<1>(p), xt::xarray<float>({5.f, 5.f, 5.f, 5.f}));
  }

  TEST_CASE("a mapped fixed-rank argument keeps its rank in its type, with the same results") {
    xt::xtensor<float, 3> fixed = xt::arange<float>(24).reshape({2, 3, 4});
    xt::xarray<float> dynamic = fixed;
    auto f = [](auto x) {
      // 2 from the xtensor (its rank 3 less the mapped dim), unknown from the xarray.
      constexpr std::size_t rank = namedax::detail::static_positional_rank<decltype(x)>();
      static_assert(rank == 2 || rank == namedax::dynamic_extent);
      return namedax::expand_dims(namedax::psum(x * 2.f, "i"_ax) + x, namedax::dim<1>);
    };
    auto g = [](auto x) {
      // An argument of an inner map is the outer value evaluated: its rank is known at run time.
      static_assert(namedax::detail::static_positional_rank<decltype(x * x)>() == namedax::dynamic_extent);
      return namedax::psum(x, "j"_ax) * x;
    };
    CHECK_BITWISE(namedax::vmap<"i">(f)(fixed), namedax::vmap<"i">(f)(dynamic));
    CHECK_BITWISE(namedax::pmap<"i">(f)(fixed), namedax::vmap<"i">(f)(dynamic));
    CHECK_BITWISE(namedax::vmap<"i">(namedax::pmap<"j">(g))(fixed), namedax::pmap<"i">(namedax::vmap<"j">(g))(dynamic));
  }
}
