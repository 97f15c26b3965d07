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

TEST_SUITE("contractions through gemm") {
  // The reference: a plain loop over every index of every subscript, summed in double (for
  // floating types) or in T (integers, exact), with sum |x * y| per output element for the
  // error bound. Subscripts of `xs` and `ys` are indexes into x and y; x may have a leading
  // mapped dim of size n (`xs` then starts with 'n' and the output too).
  template <class T>
  struct reference {
    xt::xarray<double> value, magnitude;
    std::size_t summed = 1;  // terms per output element
  };

  template <class T>
  reference<T> naive_einsum(std::string_view xs, const xt::xarray<T>& x, std::string_view ys, const xt::xarray<T>& y,
                            std::string_view out) {
    std::string letters;
    std::array<std::size_t, 26> size{};
    auto note = [&](std::string_view subs, const auto& a) {
      for (std::size_t d = 0; d < subs.size(); ++d)
        if (letters.find(subs[d]) == std::string::npos) letters += subs[d], size[subs[d] - 'a'] = a.shape()[d];
    };
    note(xs, x);
    note(ys, y);
    std::vector<std::size_t> out_shape;
    for (char c : out) out_shape.push_back(size[c - 'a']);
    reference<T> r{xt::zeros<double>(out_shape), xt::zeros<double>(out_shape)};
    for (char c : letters)
      if (out.find(c) == std::string_view::npos) r.summed *= size[c - 'a'];
    std::size_t total = 1;
    for (char c : letters) total *= size[c - 'a'];
    std::array<std::size_t, 26> at{};
    auto offset = [&](std::string_view subs, const auto& a) {
      std::size_t o = 0;
      for (std::size_t d = 0; d < subs.size(); ++d) o += at[subs[d] - 'a'] * a.strides()[d];
      return o;
    };
    auto out_offset = [&] {
      std::size_t o = 0;
      for (std::size_t d = 0; d < out.size(); ++d) o += at[out[d] - 'a'] * r.value.strides()[d];
      return o;
    };
    for (std::size_t flat = 0; flat < total; ++flat) {
      for (std::size_t k = letters.size(), rest = flat; k-- > 0;)
        at[letters[k] - 'a'] = rest % size[letters[k] - 'a'], rest /= size[letters[k] - 'a'];
      const double p = static_cast<double>(x.data()[offset(xs, x)]) * static_cast<double>(y.data()[offset(ys, y)]);
      r.value.data()[out_offset()] += p;
      r.magnitude.data()[out_offset()] += std::abs(p);
    }
    return r;
  }

  // A float sum of K products in any order (gemm's blocking, FMA or not) is within
  // gamma_K * sum |x_k y_k| of the exact sum, gamma_K = K u / (1 - K u) with u = eps / 2; the
  // double reference adds far less than that. So K * eps * sum |x_k y_k| bounds the error.
  // Integers (small values, no overflow) must match exactly.
  template <class T>
  void check_against(const xt::xarray<T>& got, const reference<T>& r) {
    REQUIRE(got.shape() == r.value.shape());
    const double eps = std::numeric_limits<T>::epsilon();
    for (std::size_t e = 0; e < got.size(); ++e) {
      if constexpr (std::is_integral_v<T>) {
        CHECK(static_cast<double>(got.data()[e]) == r.value.data()[e]);
      } else {
        const double bound = static_cast<double>(std::max<std::size_t>(r.summed, 1)) * eps * r.magnitude.data()[e];
        CHECK(std::abs(static_cast<double>(got.data()[e]) - r.value.data()[e]) <= bound);
      }
    }
  }

  /// xeinsum<Spec> with x mapped along "n" (its leading dim) and y shared, against the
  /// reference, and bit for bit between vmap and pmap.
  template <namedax::fixed_string Spec, class T>
  void check_spec(std::string_view xs, const xt::xarray<T>& x, std::string_view ys, const xt::xarray<T>& y,
                  std::string_view out) {
    CAPTURE(std::string(Spec.view()));
    auto f = [&](auto x) { return namedax::xeinsum<Spec>(x, y); };
    auto v = namedax::vmap<"n">(f)(x);
    check_against<T>(v, naive_einsum<T>(xs, x, ys, y, out));
    CHECK_BITWISE(v, namedax::pmap<"n">(f)(x));
  }

  TEST_CASE_TEMPLATE("every grouping of dims against a plain loop, vmap and pmap bit for bit", T, float, double,
                     std::int32_t) {
    std::mt19937 rng(21);
    auto r = [&](std::vector<std::size_t> shape) { return namedax_test::random_array<T>(rng, shape); };
    check_spec<"ij,jk->ik">("nij", r({3, 5, 7}), "jk", r({7, 4}), "nik");            // a matmul
    check_spec<"ij,jk->ki">("nij", r({3, 5, 7}), "jk", r({7, 4}), "nki");            // the output transposed
    check_spec<"ji,kj->ik">("nji", r({2, 7, 5}), "kj", r({4, 7}), "nik");            // both operands transposed
    check_spec<"bij,bjk->bik">("nbij", r({2, 3, 4, 6}), "bjk", r({3, 6, 5}), "nbik");  // a batch dim
    check_spec<"ibj,jkb->bki">("nibj", r({2, 4, 3, 6}), "jkb", r({6, 5, 3}), "nbki");  // batch dims anywhere
    check_spec<"ijk,jkl->il">("nijk", r({2, 3, 4, 5}), "jkl", r({4, 5, 6}), "nil");    // two contracted dims
    check_spec<"ikj,jlk->li">("nikj", r({2, 3, 5, 4}), "jlk", r({4, 6, 5}), "nli");    // ... in other orders
    check_spec<"iaj,jbk->abik">("niaj", r({2, 3, 2, 4}), "jbk", r({4, 3, 5}), "nabik");  // two dims in M and N
    check_spec<"ij,j->i">("nij", r({2, 5, 7}), "j", r({7}), "ni");                    // a matrix-vector product
    check_spec<"i,i->">("ni", r({3, 9}), "i", r({9}), "n");                           // a dot product
    check_spec<"i,j->ij">("ni", r({3, 4}), "j", r({5}), "nij");                       // an outer product (K = 1)
    check_spec<"ij,jk->ik">("nij", r({2, 1, 7}), "jk", r({7, 1}), "nik");            // size-1 M and N
    check_spec<"ij,jk->ik">("nij", r({2, 5, 1}), "jk", r({1, 4}), "nik");            // size-1 K
    check_spec<"ij,jk->ik">("nij", r({2, 5, 0}), "jk", r({0, 4}), "nik");            // K = 0: zeros
    check_spec<"ij,jk->ik">("nij", r({2, 0, 3}), "jk", r({3, 4}), "nik");            // M = 0: empty
    check_spec<"bij,bjk->bik">("nbij", r({2, 0, 3, 3}), "bjk", r({0, 3, 2}), "nbik");  // no batch items
  }

  TEST_CASE_TEMPLATE("non-contiguous views, and both operands mapped", T, float, double, std::int32_t) {
    std::mt19937 rng(22);
    xt::xarray<T> big = namedax_test::random_array<T>(rng, {3, 8, 9});
    xt::xarray<T> wide = namedax_test::random_array<T>(rng, {10, 12});
    auto x = xt::view(big, xt::all(), xt::range(0, 8, 2), xt::range(1, 9));  // (3, 4, 8), rows strided
    auto w = xt::view(wide, xt::range(0, 8), xt::range(0, 12, 3));           // (8, 4), columns strided
    auto wt = xt::transpose(xt::view(wide, xt::range(0, 4), xt::range(0, 8)));  // (8, 4), a transposed view
    auto f = [&](auto x) {
      return std::tuple{namedax::xeinsum<"ij,jk->ik">(x, w), namedax::xeinsum<"ij,jk->ik">(x, wt)};
    };
    const xt::xarray<T> xe = x, we = w, wte = wt;
    auto v = namedax::vmap<"n">(f)(x);
    check_against<T>(std::get<0>(v), naive_einsum<T>("nij", xe, "jk", we, "nik"));
    check_against<T>(std::get<1>(v), naive_einsum<T>("nij", xe, "jk", wte, "nik"));
    auto p = namedax::pmap<"n">(f)(x);
    CHECK_BITWISE(std::get<0>(v), std::get<0>(p));
    CHECK_BITWISE(std::get<1>(v), std::get<1>(p));
    // Both operands mapped: one matmul per index of "n", each its own gemm.
    xt::xarray<T> y = namedax_test::random_array<T>(rng, {3, 8, 5});
    auto g = [](auto x, auto y) { return namedax::xeinsum<"ij,jk->ik">(x, y); };
    auto both = namedax::vmap<"n">(g)(x, y);
    check_against<T>(both, naive_einsum<T>("nij", xe, "njk", y, "nik"));
    CHECK_BITWISE(both, namedax::pmap<"n">(g)(x, y));
  }

  TEST_CASE_TEMPLATE("pdot through gemm: batch, contracted and free dims against a plain loop", T, float, double,
                     std::int32_t) {
    std::mt19937 rng(23);
    auto x = namedax_test::random_array<T>(rng, {2, 4, 3, 5});  // mapped: (c1, b, f)
    auto y = namedax_test::random_array<T>(rng, {3, 4, 6});     // plain: (b, c1, g)
    auto f = [&](auto x) { return namedax::pdot(x, y, namedax::axes(), {{0}, {1}}, {{1}, {0}}); };
    auto v = namedax::vmap<"i">(f)(x);
    check_against<T>(v, naive_einsum<T>("ncbf", x, "bcg", y, "nbfg"));
    CHECK_BITWISE(v, namedax::pmap<"i">(f)(x));
    // And the same contraction written as xeinsum sums in the same order.
    auto e = [&](auto x) { return namedax::xeinsum<"cbf,bcg->bfg">(x, y); };
    CHECK_BITWISE(namedax::vmap<"i">(e)(x), v);
  }

  TEST_CASE("products large enough for threads: strips spread over cores under vmap, in turn on devices, same bits") {
    // OpenBLAS's own threads change its sums (1 and 2 threads differ at 1000 x 700 x 33);
    // namedax's strips of 256 rows or columns do not depend on the thread count.
    std::mt19937 rng(25);
    for (auto shape : std::vector<std::array<std::size_t, 3>>{{1000, 700, 33}, {300, 700, 530}, {40, 900, 700}}) {
      const std::size_t m = shape[0], k = shape[1], n = shape[2];  // named copies: clang captures no bindings
      CAPTURE(m);
      CAPTURE(n);
      auto x = namedax_test::random_array<float>(rng, {2, m, k});
      auto w = namedax_test::random_array<float>(rng, {k, n});
      auto f = [&](auto x) { return namedax::xeinsum<"ij,jk->ik">(x, w); };
      CHECK_BITWISE(namedax::vmap<"n">(f)(x), namedax::pmap<"n">(f)(x));
      // x * 2 is fresh memory with "n" innermost under vmap (packed for gemm), and a
      // contiguous matrix on a device (read in place): the same bits still.
      auto g = [&](auto x) { return namedax::xeinsum<"ij,jk->ik">(x * 2.f, w); };
      CHECK_BITWISE(namedax::vmap<"n">(g)(x), namedax::pmap<"n">(g)(x));
    }
  }

  TEST_CASE("nested maps: every placement of a 2-D mesh gives the same bits") {
    std::mt19937 rng(24);
    auto x = namedax_test::random_array<float>(rng, {2, 3, 6, 7});
    auto w = namedax_test::random_array<float>(rng, {2, 3, 7, 5});
    auto f = [](auto x, auto w) {
      return std::tuple{namedax::xeinsum<"ij,jk->ik">(x, w), namedax::xeinsum<"ij{b},jk{b}->ki">(x, w)};
    };
    auto ref = namedax::vmap<"a">(namedax::vmap<"b">(f))(x, w);
    for (auto placed : {namedax::pmap<"a">(namedax::vmap<"b">(f))(x, w), namedax::vmap<"a">(namedax::pmap<"b">(f))(x, w),
                        namedax::pmap<"a">(namedax::pmap<"b">(f))(x, w)}) {
      CHECK_BITWISE(std::get<0>(placed), std::get<0>(ref));
      CHECK_BITWISE(std::get<1>(placed), std::get<1>(ref));
    }
    const xt::xarray<float> local = std::get<0>(ref);
    check_against<float>(local, naive_einsum<float>("abij", x, "abjk", w, "abik"));
    // Under two vmaps the lanes interleave in the output: x * 2 is fresh memory (packed for
    // gemm, its six lanes in one pass), w the same along "a" (mapped along "b" only: lanes
    // share its packed copy), and products large enough for several strips of 256.
    auto xl = namedax_test::random_array<float>(rng, {2, 3, 40, 30});
    auto wl = namedax_test::random_array<float>(rng, {3, 30, 600});
    auto g = [](auto x, auto w) { return namedax::xeinsum<"ij,jk->ik">(x * 2.f, w); };
    const std::tuple in_axes{0, namedax::none};
    const xt::xarray<float> lanes = namedax::vmap<"a">(namedax::vmap<"b">(g), in_axes)(xl, wl);
    CHECK_BITWISE(lanes, namedax::pmap<"a">(namedax::pmap<"b">(g), in_axes)(xl, wl));
    CHECK_BITWISE(lanes, namedax::pmap<"a">(namedax::vmap<"b">(g), in_axes)(xl, wl));
    xt::xarray<float> wide = xt::xarray<float>::from_shape({2, 3, 30, 600});
    for (std::size_t a = 0; a < 2; ++a) xt::view(wide, a) = wl;
    check_against<float>(lanes, naive_einsum<float>("abij", xt::xarray<float>(xl * 2.f), "abjk", wide, "abik"));
  }
}
