// SPDX-License-Identifier: MIT
// pdot (and xeinsum, built on it): contractions over positional and named axes against naive
// loops, in both modes and bit for bit between them.
#include "test_support.hpp"

using namespace namedax::literals;
using namedax_test::both_modes;
using namedax_test::error_of;


TEST_SUITE("pdot") {
  TEST_CASE("a tensor-parallel matmul: features sharded along model, summed by pdot") {
    // x (4, 6) @ w (6, 2) with the 6 features split in 3 shards of 2 along "model".
    xt::xarray<double> x = xt::arange<double>(24).reshape({4, 6});
    xt::xarray<double> w = xt::arange<double>(12).reshape({6, 2});
    xt::xarray<double> expected = xt::zeros<double>({4, 2});
    for (std::size_t r = 0; r < 4; ++r)
      for (std::size_t c = 0; c < 2; ++c)
        for (std::size_t k = 0; k < 6; ++k) expected(r, c) += x(r, k) * w(k, c);
    xt::xarray<double> x_shards = xt::transpose(xt::xarray<double>(xt::reshape_view(x, {4, 3, 2})), {1, 0, 2});  // (3, 4, 2)
    xt::xarray<double> w_shards = xt::reshape_view(w, {3, 2, 2});                                            // (3, 2, 2)
    auto f = [](auto x, auto w) { return namedax::pdot(x, w, "model"_ax, {{1}, {0}}); };
    auto v = namedax::vmap<"model">(f)(x_shards, w_shards);
    auto p = namedax::pmap<"model">(f)(x_shards, w_shards);
    for (std::size_t m = 0; m < 3; ++m) CHECK_BITWISE(xt::xarray<double>(xt::view(v, m)), expected);
    CHECK_BITWISE(v, p);
  }

  TEST_CASE("batch dims, several contracted dims, a plain operand, and free dims in order") {
    std::mt19937 rng(11);
    auto x = namedax_test::random_array<float>(rng, {2, 3, 4, 5});  // mapped: (3, 4, 5) = (b, c1, c2)
    auto y = namedax_test::random_array<float>(rng, {5, 3, 4, 2});  // plain: (c2, b, c1, f)
    auto f = [&](auto x) { return namedax::pdot(x, y, namedax::axes(), {{1, 2}, {2, 0}}, {{0}, {1}}); };
    auto v = namedax::vmap<"i">(f)(x);
    REQUIRE(v.shape() == std::vector<std::size_t>{2, 3, 2});  // (i, batch b, y's free f)
    for (std::size_t i = 0; i < 2; ++i)
      for (std::size_t b = 0; b < 3; ++b)
        for (std::size_t o = 0; o < 2; ++o) {
          float acc = 0;
          for (std::size_t c1 = 0; c1 < 4; ++c1)
            for (std::size_t c2 = 0; c2 < 5; ++c2) acc += x(i, b, c1, c2) * y(c2, b, c1, o);
          CHECK(v(i, b, o) == doctest::Approx(acc).epsilon(1e-5));
        }
    CHECK_BITWISE(v, namedax::pmap<"i">(f)(x));
  }

  TEST_CASE("over two names, in a 2-D mesh, every placement agrees bit for bit") {
    std::mt19937 rng(5);
    auto x = namedax_test::random_array<double>(rng, {2, 3, 4});
    auto y = namedax_test::random_array<double>(rng, {2, 3, 4, 2});
    auto f = [](auto x, auto y) {
      return std::tuple{namedax::pdot(x, y, namedax::axes("i"_ax, "j"_ax), {{0}, {0}}), namedax::pdot(x, y, "j"_ax, {{0}, {0}})};
    };
    auto reference = namedax::vmap<"i">(namedax::vmap<"j">(f))(x, y);
    for (auto result : {namedax::pmap<"i">(namedax::vmap<"j">(f))(x, y), namedax::vmap<"i">(namedax::pmap<"j">(f))(x, y),
                        namedax::pmap<"i">(namedax::pmap<"j">(f))(x, y)}) {
      CHECK_BITWISE(std::get<0>(result), std::get<0>(reference));
      CHECK_BITWISE(std::get<1>(result), std::get<1>(reference));
    }
    // The total over both names equals a naive sum.
    double acc = 0;
    for (std::size_t i = 0; i < 2; ++i)
      for (std::size_t j = 0; j < 3; ++j)
        for (std::size_t k = 0; k < 4; ++k) acc += x(i, j, k) * y(i, j, k, 1);
    CHECK(std::get<0>(reference)(1, 2, 1) == doctest::Approx(acc));
  }

  TEST_CASE("shape mismatches name pdot, the dims and the sizes") {
    xt::xarray<float> x = xt::zeros<float>({2, 3, 4}), y = xt::zeros<float>({2, 5, 4});
    auto f = [](auto x, auto y) { return namedax::pdot(x, y, "i"_ax, {{0}, {0}}); };
    CHECK(error_of([&] { namedax::vmap<"i">(f)(x, y); })
              .find("namedax::pdot: contracting dimension 0 of x (size 3) does not match dimension 0 of y (size 5)") !=
          std::string::npos);
    auto g = [](auto x, auto y) { return namedax::pdot(x, y, "i"_ax, {{2}, {0}}); };
    CHECK(error_of([&] { namedax::pmap<"i">(g)(x, y); }).find("namedax::pdot: dimension 2 of x is out of range") !=
          std::string::npos);
  }
}

TEST_SUITE("pgather") {
  TEST_CASE("a sharded embedding lookup: rows spread along a named axis, read from any shard") {
    xt::xarray<float> table = xt::arange<float>(12).reshape({3, 2, 2});  // 3 shards x 2 rows x dim 2
    xt::xarray<int> ids{5, 0, 3, 7};                                      // global rows; 7 is out of range
    auto f = [&](auto shard) { return namedax::pgather(shard, ids, namedax::axes("shard"_ax, 0)); };
    auto v = namedax::vmap<"shard">(f)(table);
    auto p = namedax::pmap<"shard">(f)(table);
    CHECK_BITWISE(v, p);
    for (std::size_t s = 0; s < 3; ++s) {
      CHECK(v(s, 0, 0) == 10.f);
      CHECK(v(s, 0, 1) == 11.f);
      CHECK(v(s, 1, 1) == 1.f);
      CHECK(v(s, 2, 0) == 6.f);
      CHECK(std::isnan(v(s, 3, 0)));
    }
  }
  TEST_CASE("positional gather; out-of-range fills per type; indices that vary along the axis") {
    xt::xarray<int> x = xt::arange<int>(6).reshape({2, 3});
    auto g = [](auto row) { return namedax::pgather(row, xt::xarray<int>{2, 0, -1}, namedax::axes(0)); };
    xt::xarray<int> expected{{2, 0, std::numeric_limits<int>::lowest()}, {5, 3, std::numeric_limits<int>::lowest()}};
    CHECK_BITWISE(namedax::vmap<"i">(g)(x), expected);
    CHECK_BITWISE(namedax::pmap<"i">(g)(x), expected);
    xt::xarray<bool> flags{{true, false}, {false, false}};
    auto b = [](auto row) { return namedax::pgather(row, 9, namedax::axes(0)); };
    CHECK(xt::all(namedax::vmap<"i">(b)(flags)));  // out of range reads true
    // Each index of "i" reads the element of "i" its own idx names: a permutation by gather.
    xt::xarray<int> src{10, 11, 12, 13};
    xt::xarray<int> idx{3, 0, 0, 2};
    auto h = [](auto s, auto i) { return namedax::pgather(s, i, "i"_ax); };
    xt::xarray<int> gathered{13, 10, 10, 12};
    CHECK_BITWISE(namedax::vmap<"i">(h)(src, idx), gathered);
    CHECK_BITWISE(namedax::pmap<"i">(h)(src, idx), gathered);
  }
  TEST_CASE("names and positional axes flatten in the order written, like a tuple of names") {
    xt::xarray<int> src{{0, 1, 2}, {10, 11, 12}};  // "i" of size 2, each index a row of 3
    xt::xarray<int> idx{4, 1, 3, 6};               // 6 is out of range for 2 x 3
    constexpr int lowest = std::numeric_limits<int>::lowest();
    auto names_first = [&](auto row) { return namedax::pgather(row, idx, namedax::axes("i"_ax, 0)); };
    auto positional_first = [&](auto row) { return namedax::pgather(row, idx, namedax::axes(0, "i"_ax)); };
    // ("i", 0): index i * 3 + p; (0, "i"): index p * 2 + i.
    xt::xarray<int> by_name{{11, 1, 10, lowest}, {11, 1, 10, lowest}}, by_position{{2, 10, 11, lowest}, {2, 10, 11, lowest}};
    CHECK_BITWISE(namedax::vmap<"i">(names_first)(src), by_name);
    CHECK_BITWISE(namedax::pmap<"i">(names_first)(src), by_name);
    CHECK_BITWISE(namedax::vmap<"i">(positional_first)(src), by_position);
    CHECK_BITWISE(namedax::pmap<"i">(positional_first)(src), by_position);
  }
  TEST_CASE("out of range, unsigned types read their largest value, as lax.gather fills") {
    auto g = [](auto row) { return namedax::pgather(row, xt::xarray<int>{1, 7, -1}, namedax::axes(0)); };
    xt::xarray<std::uint32_t> x{{5u, 6u}, {7u, 8u}};
    constexpr std::uint32_t largest = std::numeric_limits<std::uint32_t>::max();
    xt::xarray<std::uint32_t> expected{{6u, largest, largest}, {8u, largest, largest}};
    CHECK_BITWISE(namedax::vmap<"i">(g)(x), expected);
    CHECK_BITWISE(namedax::pmap<"i">(g)(x), expected);
    xt::xarray<std::uint8_t> bytes{{5, 6}, {7, 8}};
    xt::xarray<std::uint8_t> expected_bytes{{6, 255, 255}, {8, 255, 255}};
    CHECK_BITWISE(namedax::vmap<"i">(g)(bytes), expected_bytes);
    CHECK_BITWISE(namedax::pmap<"i">(g)(bytes), expected_bytes);
  }
  TEST_CASE("over two names row-major, in every placement of a 2-D mesh") {
    xt::xarray<double> x = xt::arange<double>(12).reshape({2, 3, 2});
    auto f = [](auto x) { return namedax::pgather(x, xt::xarray<int>{5, 1, 3}, namedax::axes("i"_ax, "j"_ax)); };
    auto reference = namedax::vmap<"i">(namedax::vmap<"j">(f))(x);
    CHECK(reference(1, 2, 0, 1) == 11.0);  // rank 5 = (i=1, j=2), element 1
    CHECK(reference(0, 0, 1, 0) == 2.0);   // rank 1 = (0, 1)
    CHECK_BITWISE(namedax::pmap<"i">(namedax::vmap<"j">(f))(x), reference);
    CHECK_BITWISE(namedax::vmap<"i">(namedax::pmap<"j">(f))(x), reference);
    CHECK_BITWISE(namedax::pmap<"i">(namedax::pmap<"j">(f))(x), reference);
  }
}

TEST_SUITE("xeinsum") {
  TEST_CASE("a sharded matmul, equal bit for bit to pdot, with the output in the order written") {
    std::mt19937 rng(2);
    auto x = namedax_test::random_array<float>(rng, {3, 4, 2});  // (model, rows, features per shard)
    auto w = namedax_test::random_array<float>(rng, {3, 2, 5});
    auto f = [](auto x, auto w) {
      return std::tuple{namedax::xeinsum<"ij{model},jk{model}->ik">(x, w), namedax::pdot(x, w, "model"_ax, {{1}, {0}}),
                        namedax::xeinsum<"ij{model},jk{model}->ki">(x, w)};
    };
    for (auto [e, d, t] : {namedax::vmap<"model">(f)(x, w), namedax::pmap<"model">(f)(x, w)}) {
      CHECK_BITWISE(e, d);
      xt::xarray<float> transposed = xt::transpose(e, {0, 2, 1});
      CHECK_BITWISE(t, transposed);
    }
  }
  TEST_CASE("a name only one input has is summed there; a name in the output stays") {
    xt::xarray<double> x = xt::arange<double>(6).reshape({2, 3});  // mapped along "a": (3,) each
    xt::xarray<double> y{1.0, 2.0, 3.0};
    auto f = [&](auto x) {
      return std::tuple{namedax::xeinsum<"i{a},i->i">(x, y), namedax::xeinsum<"i{a},i->i{a}">(x, y),
                        namedax::xeinsum<"i{a}->">(x)};
    };
    for (auto [summed, kept, total] : {namedax::vmap<"a">(f)(x), namedax::pmap<"a">(f)(x)}) {
      // summed: (x0 + x1) * y on both indices; kept: x_a * y; total: sum of everything.
      xt::xarray<double> es{{3.0, 10.0, 21.0}, {3.0, 10.0, 21.0}}, ek{{0.0, 2.0, 6.0}, {3.0, 8.0, 15.0}}, et{15.0, 15.0};
      CHECK_BITWISE(summed, es);
      CHECK_BITWISE(kept, ek);
      CHECK_BITWISE(total, et);
    }
  }
  TEST_CASE("three operands against a naive loop") {
    std::mt19937 rng(9);
    auto a = namedax_test::random_array<int>(rng, {2, 3, 4});
    auto b = namedax_test::random_array<int>(rng, {4, 5});
    auto c = namedax_test::random_array<int>(rng, {5, 3});
    auto f = [&](auto a) { return namedax::xeinsum<"ij,jk,kl->li">(a, b, c); };
    auto v = namedax::vmap<"n">(f)(a);
    for (std::size_t n = 0; n < 2; ++n)
      for (std::size_t l = 0; l < 3; ++l)
        for (std::size_t i = 0; i < 3; ++i) {
          int acc = 0;
          for (std::size_t j = 0; j < 4; ++j)
            for (std::size_t k = 0; k < 5; ++k) acc += a(n, i, j) * b(j, k) * c(k, l);
          CHECK(v(n, l, i) == acc);
        }
    CHECK_BITWISE(v, namedax::pmap<"n">(f)(a));
  }
  TEST_CASE("operands that do not fit the spec get an error naming the subscript and sizes") {
    xt::xarray<float> x = xt::zeros<float>({2, 3}), y = xt::zeros<float>({4, 2});
    auto f = [&](auto x) { return namedax::xeinsum<"j,jk->k">(x, y); };
    CHECK(error_of([&] { namedax::vmap<"i">(f)(x); }).find("namedax::xeinsum: subscript 'j' has size 3 in operand 0 and 4 in operand 1") !=
          std::string::npos);
    auto g = [&](auto x) { return namedax::xeinsum<"jk->k">(x); };
    CHECK(error_of([&] { namedax::pmap<"i">(g)(x); }).find("namedax::xeinsum: operand 0 has positional rank 1 but its spec 'jk' names 2 dims") !=
          std::string::npos);
  }
}

TEST_SUITE("differential") {
  template <class T>
  void contraction_run(std::mt19937& rng) {
    std::uniform_int_distribution<std::size_t> size_of(1, 8), extent(1, 4);
    const std::size_t n = size_of(rng), a = extent(rng), b = extent(rng), c = extent(rng);
    auto x = namedax_test::random_array<T>(rng, {n, a, b});
    auto y = namedax_test::random_array<T>(rng, {n, b, c});
    xt::xarray<int> ids = xt::xarray<int>::from_shape({3});
    std::uniform_int_distribution<int> id(-1, static_cast<int>(n * a));  // includes out-of-range ones
    for (auto& v : ids) v = id(rng);
    CAPTURE(n);
    CAPTURE(a);
    CAPTURE(b);
    CAPTURE(c);
    auto f = [&](auto x, auto y) {
      return std::tuple{namedax::pdot(x, y, "i"_ax, {{1}, {0}}), namedax::pdot(x, y, namedax::axes(), {{1}, {0}}),
                        namedax::xeinsum<"ab{i},bc{i}->ca">(x, y), namedax::xeinsum<"ab{i},bc->ac{i}">(x, y),
                        namedax::pgather(x, ids, namedax::axes("i"_ax, 0)), namedax::pgather(x, ids % static_cast<int>(a), namedax::axes(0))};
    };
    auto v = namedax::vmap<"i">(f)(x, y);
    auto p = namedax::pmap<"i">(f)(x, y);
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      ([&] { CHECK_BITWISE(std::get<K>(v), std::get<K>(p)); }(), ...);
    }(std::make_index_sequence<std::tuple_size_v<decltype(v)>>{});
  }

  TEST_CASE_TEMPLATE("vmap and pmap agree bitwise on pdot, xeinsum and pgather", T, float, double, std::int32_t) {
    std::mt19937 rng(13);
    for (int run = 0; run < 10; ++run) contraction_run<T>(rng);
  }
}
