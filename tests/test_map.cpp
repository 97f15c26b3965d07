// SPDX-License-Identifier: MIT
// vmap and pmap: in_axes, out_axes, axis_size, tuple outputs, outputs that do not vary,
// nesting, and their errors.
#include "test_support.hpp"

#include <boost/hana/define_struct.hpp>
#include <xtensor/xfixed.hpp>

using namespace namedax::literals;
using namedax_test::error_of;

namespace {
/// Parameters with a member type each, as the maps rebuild them around views.
template <class W, class B>
struct layer {
  BOOST_HANA_DEFINE_STRUCT(layer, (W, w), (B, b));
};
}  // namespace

TEST_SUITE("maps") {
  TEST_CASE("in_axes per argument and out_axes") {
    xt::xarray<int> a = xt::arange<int>(6).reshape({2, 3});  // mapped along dim 1 (size 3)
    xt::xarray<int> b{100, 200, 300};                        // mapped along dim 0
    auto f = [](auto a, auto b) { return a + b; };           // (2,) per index
    auto v = namedax::vmap<"i">(f, std::tuple{1, 0})(a, b);
    auto p = namedax::pmap<"i">(f, std::tuple{1, 0})(a, b);
    xt::xarray<int> expected{{100, 103}, {201, 204}, {302, 305}};
    CHECK_BITWISE(v, expected);
    CHECK_BITWISE(p, expected);
    auto v1 = namedax::vmap<"i">(f, std::tuple{1, 0}, 1)(a, b);  // out_axes 1
    auto p1 = namedax::pmap<"i">(f, std::tuple{1, -1}, -1)(a, b);
    xt::xarray<int> transposed = xt::transpose(expected);
    CHECK_BITWISE(v1, transposed);
    CHECK_BITWISE(p1, transposed);
  }

  TEST_CASE("an output that does not vary along the axis is broadcast, as in JAX") {
    xt::xarray<float> x = xt::arange<float>(3);
    auto f = [](auto) { return xt::xarray<float>{7.f, 8.f}; };
    xt::xarray<float> expected{{7.f, 8.f}, {7.f, 8.f}, {7.f, 8.f}};
    CHECK_BITWISE(namedax::vmap<"i">(f)(x), expected);
    CHECK_BITWISE(namedax::pmap<"i">(f)(x), expected);
    auto constant = [](auto) { return 2.5; };
    CHECK_BITWISE(namedax::pmap<"i">(constant)(x), (xt::xarray<double>{2.5, 2.5, 2.5}));
  }

  TEST_CASE("nothing mapped: axis_size gives the size") {
    xt::xarray<float> w{1.f, 2.f};
    auto f = [](auto w) { return w * namedax::axis_index("i"_ax); };
    xt::xarray<float> expected{{0.f, 0.f}, {1.f, 2.f}, {2.f, 4.f}};
    CHECK_BITWISE(namedax::vmap<"i">(f, namedax::none, 0, 3)(w), expected);
    CHECK_BITWISE(namedax::pmap<"i">(f, namedax::none, 0, 3)(w), expected);
    CHECK_THROWS_WITH_AS(namedax::vmap<"i">(f, namedax::none)(w), doctest::Contains("pass axis_size"), namedax::error);
  }

  TEST_CASE("an axis_size that contradicts the mapped arguments is an error naming both sizes") {
    xt::xarray<float> x = xt::zeros<float>({4});
    auto f = [](auto x) { return x + 1.f; };
    CHECK(namedax_test::error_of([&] { namedax::vmap<"i">(f, 0, 0, 5)(x); }) ==
          "namedax::vmap<\"i\">: the arguments give axis size 4 but axis_size is 5");
    CHECK(namedax_test::error_of([&] { namedax::pmap<"i">(f, 0, 0, 5)(x); }) ==
          "namedax::pmap<\"i\">: the arguments give axis size 4 but axis_size is 5");
    CHECK(namedax::vmap<"i">(f, 0, 0, 4)(x).shape() == std::vector<std::size_t>{4});  // agreeing is fine
  }

  TEST_CASE("mapped arguments of different sizes are an error naming both") {
    xt::xarray<float> a = xt::zeros<float>({4}), b = xt::zeros<float>({3});
    auto f = [](auto a, auto b) { return a + b; };
    for (auto message : {doctest::Contains("namedax::vmap<\"i\">: mapped arguments differ in size along the axis: "
                                           "argument 0 has 4, argument 1 has 3")}) {
      CHECK_THROWS_WITH_AS(namedax::vmap<"i">(f)(a, b), message, namedax::error);
    }
    CHECK_THROWS_WITH_AS(namedax::pmap<"i">(f)(a, b), doctest::Contains("argument 0 has 4, argument 1 has 3"),
                         namedax::error);
    CHECK_THROWS_WITH_AS(namedax::vmap<"i">(f, 1)(a, a), doctest::Contains("in_axes of argument 0 is 1, out of range"),
                         namedax::error);
  }

  TEST_CASE("nested pytree outputs: a tuple of a value, a pair and an array, stacked leaf by leaf") {
    xt::xarray<float> x = xt::arange<float>(8).reshape({4, 2});
    auto f = [](auto v) {
      return std::tuple{namedax::psum(v, "i"_ax),
                        std::pair{v * 2.f, std::tuple{namedax::eval(v + 1.f), namedax::axis_index("i"_ax)}},
                        std::array{namedax::eval(v), namedax::eval(-v)}};
    };
    const auto vectorized = namedax::vmap<"i">(f)(x);
    const auto devices = namedax::pmap<"i">(f)(x);
    // out_axes applies to every leaf.
    auto g = [](auto v) { return std::pair{v * 2.f, std::tuple{namedax::eval(v + 1.f)}}; };
    const auto moved = namedax::pmap<"i">(g, 0, 1)(x);
    for (const auto& out : {vectorized, devices}) {
      const auto& [sum, pair, array] = out;
      CHECK_BITWISE(sum, xt::xarray<float>(xt::broadcast(xt::sum(x, {0}), {4, 2})));
      CHECK_BITWISE(pair.first, xt::xarray<float>(x * 2.f));
      CHECK_BITWISE(std::get<0>(pair.second), xt::xarray<float>(x + 1.f));
      CHECK_BITWISE(std::get<1>(pair.second), (xt::xarray<std::int32_t>{0, 1, 2, 3}));
      CHECK_BITWISE(array[1], xt::xarray<float>(-x));
    }
    CHECK_BITWISE(std::get<0>(moved.second), xt::xarray<float>(xt::transpose(x + 1.f)));
  }
  TEST_CASE("nested maps: every mix of vmap and pmap, outputs stacked outermost first") {
    xt::xarray<int> x = xt::arange<int>(12).reshape({3, 4});
    auto f = [](auto x) { return x * 10 + namedax::axis_index("j"_ax); };
    xt::xarray<int> expected = x * 10 + xt::xarray<int>{0, 1, 2, 3};
    CHECK_BITWISE(namedax::vmap<"i">(namedax::vmap<"j">(f))(x), expected);
    CHECK_BITWISE(namedax::vmap<"i">(namedax::pmap<"j">(f))(x), expected);
    CHECK_BITWISE(namedax::pmap<"i">(namedax::vmap<"j">(f))(x), expected);
    CHECK_BITWISE(namedax::pmap<"i">(namedax::pmap<"j">(f))(x), expected);
    // The inner map over dim 1 of the original, out_axes moving it first.
    auto g = namedax::vmap<"i">(namedax::pmap<"j">(f, 0, 0), 1, 1);
    xt::xarray<int> swapped = xt::transpose(x);
    xt::xarray<int> column = xt::arange<int>(4).reshape({4, 1});
    CHECK_BITWISE(g(swapped), (swapped * 10 + column));
  }

  TEST_CASE("psum over an outer vmap axis from inside an inner pmap (pmap<i>(vmap<j>) and back)") {
    xt::xarray<double> x = xt::arange<double>(12).reshape({4, 3});
    auto f = [](auto x) { return std::tuple{x / namedax::psum(x, "i"_ax), namedax::psum(x, "j"_ax)}; };
    auto [a1, b1] = namedax::vmap<"i">(namedax::vmap<"j">(f))(x);
    auto [a2, b2] = namedax::pmap<"i">(namedax::vmap<"j">(f))(x);
    auto [a3, b3] = namedax::vmap<"i">(namedax::pmap<"j">(f))(x);
    CHECK_BITWISE(a1, a2);
    CHECK_BITWISE(a1, a3);
    CHECK_BITWISE(b1, b2);
    CHECK_BITWISE(b1, b3);
    CHECK(a1(1, 2) == doctest::Approx(5.0 / (2 + 5 + 8 + 11)));
    CHECK(b1(1, 2) == 3 + 4 + 5);
  }

  TEST_CASE("a device that ran an inner map to its end still meets the other devices (pmap<b> around vmap<i> and pmap<i>)") {
    // Each inner map returns before the device's next collective over "b": the device must
    // still be known as itself then.
    const xt::xarray<double> x = xt::arange<double>(24).reshape({2, 4, 3});
    auto f = [](const auto& block) {
      const auto doubled = namedax::vmap<"i">([](const auto& row) { return row * 2.0; })(block);
      const auto first = namedax::psum(doubled, "b"_ax);
      const auto tripled = namedax::pmap<"i">([](const auto& row) { return row * 3.0; })(block);
      return namedax::eval(first + namedax::psum(tripled, "b"_ax));
    };
    const xt::xarray<double> expected = xt::broadcast(5.0 * xt::sum(x, {0}), x.shape());
    CHECK_BITWISE(namedax::pmap<"b">(f)(x), expected);
    CHECK_BITWISE(namedax::vmap<"b">(f)(x), expected);
  }

  TEST_CASE("a captured outer value in an inner map that receives a named argument") {
    xt::xarray<int> x = xt::arange<int>(6).reshape({2, 3});
    auto outer = [](auto row) {
      auto scale = namedax::axis_index("i"_ax) + 1;  // varies along i only
      auto inner = [&](auto v) { return v * scale; };
      return namedax::vmap<"j">(inner)(row);
    };
    xt::xarray<int> expected{{0, 1, 2}, {6, 8, 10}};
    CHECK_BITWISE(namedax::vmap<"i">(outer)(x), expected);
    CHECK_BITWISE(namedax::pmap<"i">(outer)(x), expected);
  }

  TEST_CASE("pytree arguments: in_axes is a prefix of the argument list, leaf by leaf") {
    xt::xarray<double> w = xt::arange<double>(6).reshape({2, 3});  // mapped along dim 1
    xt::xarray<double> b{10., 20.};                                 // not mapped
    xt::xarray<double> x = xt::arange<double>(3);                   // mapped along dim 0
    auto f = [](const auto& params, const auto& pair) {
      return params.w * pair.first + params.b + pair.second;
    };
    const layer<xt::xarray<double>, xt::xarray<double>> params{w, b};
    const auto in_axes = std::tuple{std::tuple{1, namedax::none}, std::pair{0, namedax::none}};
    const std::pair<xt::xarray<double>, double> pair{x, 0.5};
    xt::xarray<double> expected = xt::transpose(w * x + xt::view(b, xt::all(), xt::newaxis()) + 0.5);
    CHECK_BITWISE(namedax::vmap<"i">(f, in_axes)(params, pair), expected);
    CHECK_BITWISE(namedax::pmap<"i">(f, in_axes)(params, pair), expected);
    // Nested: the outer map takes dim 0 of every array leaf; the scalar is not mapped.
    const layer<xt::xarray<double>, xt::xarray<double>> batched{xt::stack(xt::xtuple(w, w + 1.)), xt::stack(xt::xtuple(b, b))};
    const std::pair<xt::xarray<double>, double> pairs{xt::stack(xt::xtuple(x, x)), 0.5};
    const auto outer_axes = std::tuple{0, std::pair{0, namedax::none}};
    xt::xarray<double> second = xt::transpose((w + 1.) * x + xt::view(b, xt::all(), xt::newaxis()) + 0.5);
    xt::xarray<double> both = xt::stack(xt::xtuple(expected, second));
    CHECK_BITWISE(namedax::pmap<"j">(namedax::vmap<"i">(f, in_axes), outer_axes)(batched, pairs), both);
    CHECK_BITWISE(namedax::vmap<"j">(namedax::pmap<"i">(f, in_axes), outer_axes)(batched, pairs), both);
  }

  TEST_CASE("out_axes per result; none returns a result that does not vary once, unstacked") {
    xt::xarray<int> x = xt::arange<int>(6).reshape({3, 2});
    auto f = [](auto v) { return std::tuple{v * 2, namedax::psum(v, "i"_ax), std::pair{v, namedax::pmax(v, "i"_ax)}}; };
    const auto out_axes = std::tuple{1, namedax::none, std::pair{0, namedax::none}};
    xt::xarray<int> doubled = xt::transpose(x * 2);
    xt::xarray<int> sum = xt::sum(x, {0});
    xt::xarray<int> max = xt::amax(x, {0});
    auto check = [&](const auto& out) {
      CHECK_BITWISE(std::get<0>(out), doubled);
      CHECK_BITWISE(std::get<1>(out), sum);
      CHECK_BITWISE(std::get<2>(out).first, x);
      CHECK_BITWISE(std::get<2>(out).second, max);
    };
    check(namedax::vmap<"i">(f, 0, out_axes)(x));
    check(namedax::pmap<"i">(f, 0, out_axes)(x));
    // Inside an outer map, the unstacked result keeps varying along the outer axis only.
    xt::xarray<int> xs = xt::stack(xt::xtuple(x, x + 1));
    auto g = [&](auto v) { return namedax::vmap<"i">(f, 0, out_axes)(v); };
    const auto [d, s, p] = namedax::pmap<"j">(g)(xs);
    CHECK_BITWISE(s, xt::xarray<int>(xt::stack(xt::xtuple(sum, sum + 3))));
    CHECK_BITWISE(p.second, xt::xarray<int>(xt::stack(xt::xtuple(max, max + 1))));
    CHECK_BITWISE(d, xt::xarray<int>(xt::stack(xt::xtuple(doubled, doubled + 2))));
  }

  TEST_CASE("a pytree leaf of another size along the axis is an error naming the argument and the leaf") {
    xt::xarray<float> a = xt::zeros<float>({4}), b = xt::zeros<float>({3});
    auto f = [](auto a, auto pair) { return a + pair.first + pair.second; };
    CHECK(namedax_test::error_of([&] { namedax::vmap<"i">(f)(a, std::pair{a, b}); }) ==
          "namedax::vmap<\"i\">: mapped arguments differ in size along the axis: argument 0 has 4, argument 1, leaf 1 "
          "has 3 (positional shape (3,))");
    CHECK_THROWS_WITH_AS(namedax::pmap<"i">(f, std::tuple{0, std::pair{0, 1}})(a, std::pair{a, a}),
                         doctest::Contains("in_axes of argument 1, leaf 1 is 1, out of range for 1 position (valid: -1 to 0)"),
                         namedax::error);
    // A value of rank 0 has nothing to map: the message says so and what to write instead.
    xt::xarray<float> scalar = 3.f;
    CHECK(namedax_test::error_of([&] { namedax::pmap<"i">(f, std::tuple{0, 0})(scalar, std::pair{a, a}); }) ==
          "namedax::pmap<\"i\">: in_axes of argument 0 is 0, but the value has no positional dim; give it in_axes "
          "namedax::none");
    // out_axes name the result leaf they are wrong for.
    auto g = [](auto v) { return std::pair{v, v * 2.f}; };
    for (auto message : {"namedax::vmap<\"i\">: out_axes of result 1 is 2, out of range for 1 position (valid: -1 to 0)",
                         "namedax::pmap<\"i\">: out_axes of result 1 is 2, out of range for 1 position (valid: -1 to 0)"}) {
      const bool vectorized = std::string_view(message).find("vmap") != std::string_view::npos;
      auto out_axes = std::pair{0, 2};
      CHECK(namedax_test::error_of([&] {
              vectorized ? (void)namedax::vmap<"i">(g, 0, out_axes)(a) : (void)namedax::pmap<"i">(g, 0, out_axes)(a);
            }) == message);
    }
  }

  TEST_CASE("into: results written into the caller's arrays, the same bits, the same memory on every call") {
    xt::xarray<float> x = xt::arange<float>(12).reshape({4, 3});
    auto f = [](auto v) { return std::tuple{v / namedax::psum(v, "i"_ax), namedax::pmax(v, "i"_ax)}; };
    const auto out_axes = std::tuple{1, namedax::none};
    for (int mode = 0; mode < 2; ++mode) {
      INFO((mode == 0 ? "vmap" : "pmap"));
      auto run = [&](const auto& map) {
        const auto [expected, max] = map(x);
        xt::xarray<float> a, b;  // empty: the first call sizes them
        map.into(std::tie(a, b))(x);
        CHECK_BITWISE(a, expected);
        CHECK_BITWISE(b, max);
        const float* memory = a.data();
        map.into(std::tie(a, b))(x + 1.f);
        CHECK(a.data() == memory);  // the second call reuses the array
        CHECK_BITWISE(b, xt::xarray<float>(max + 1.f));
        // A column-major array of the right shape is written through its own strides.
        xt::xarray<float, xt::layout_type::column_major> c = xt::zeros<float>({3, 4});
        xt::xarray<float> d;
        map.into(std::tie(c, d))(x);
        CHECK(xt::xarray<float>(c) == expected);
      };
      if (mode == 0) run(namedax::vmap<"i">(f, 0, out_axes));
      else run(namedax::pmap<"i">(f, 0, out_axes));
    }
    // One result: the array itself.
    xt::xarray<float> y;
    namedax::pmap<"i">([](auto v) { return v * 2.f; }).into(y)(x);
    CHECK_BITWISE(y, xt::xarray<float>(x * 2.f));

    // An in-place step, the output also the argument: each index's row reversed, as a fresh map gives
    // it (the vectorized map once read the rows it had already written).
    auto reversed = [](auto v) { return namedax::flip(v, 0); };
    const xt::xarray<float> expected = namedax::vmap<"i">(reversed)(x);
    xt::xarray<float> a = x, b = x;
    namedax::vmap<"i">(reversed).into(a)(a);
    namedax::pmap<"i">(reversed).into(b)(b);
    CHECK_BITWISE(a, expected);
    CHECK_BITWISE(b, expected);
    // A pair written over the argument and another array, the argument a member of a tuple.
    xt::xarray<float> c = x, d;
    auto with_sum = [](const auto& args) { return std::pair{namedax::flip(std::get<0>(args), 0), namedax::sum(std::get<0>(args))}; };
    namedax::vmap<"i">(with_sum).into(std::tie(c, d))(std::tuple{c});
    CHECK_BITWISE(c, expected);
    // The argument an adaptor of the output's memory (xt::adapt, of any rank or a fixed shape), or
    // a member of a std::tie: its copy holds elements of its own all the same.
    auto in_place = [&](const auto& map, const auto& pair_map) {
      xt::xarray<float> e = x, g = x, h, k = x, m = x;
      map.into(e)(xt::adapt(e.data(), e.size(), xt::no_ownership(), std::vector<std::size_t>{4, 3}));
      map.into(k)(xt::adapt(k.data(), k.size(), xt::no_ownership(), std::array<std::size_t, 2>{4, 3}));
      map.into(m)(xt::adapt(m.data(), xt::xshape<4, 3>{}));
      pair_map.into(std::tie(g, h))(std::tie(g));
      for (const auto* written : {&e, &g, &k, &m}) CHECK_BITWISE(*written, expected);
    };
    in_place(namedax::vmap<"i">(reversed), namedax::vmap<"i">(with_sum));
    in_place(namedax::pmap<"i">(reversed), namedax::pmap<"i">(with_sum));
  }

  TEST_CASE("into: an array of another fixed rank or fixed shape than the result is an error naming both, not a resize") {
    // xtensor's resize checks neither (a write past the array, or a crash).
    const xt::xarray<float> x = xt::arange<float>(6).reshape({2, 3});
    auto same = [](auto v) { return v; };
    auto pair = [](auto v) { return std::pair{v, namedax::sum(v)}; };
    for (const bool vectorized : {true, false}) {
      const std::string verb = vectorized ? "namedax::vmap<\"i\">" : "namedax::pmap<\"i\">";
      auto run = [&](auto f, auto&& out) {
        return error_of([&] {
          if (vectorized) namedax::vmap<"i">(f).into(out)(x);
          else namedax::pmap<"i">(f).into(out)(x);
        });
      };
      xt::xtensor<float, 1> vector;
      CHECK(run(same, vector) == verb + ": into: output 0 is an array of rank 1 and cannot hold result 0 of shape (2, 3); "
                                        "give an array of rank 2, or an xt::xarray");
      xt::xarray<float> first;
      xt::xtensor<float, 2> second;
      CHECK(run(pair, std::tie(first, second)) == verb + ": into: output 1 is an array of rank 2 and cannot hold result 1 of "
                                                          "shape (2,); give an array of rank 1, or an xt::xarray");
      xt::xtensor_fixed<float, xt::xshape<3, 2>> fixed;
      CHECK(run(same, fixed) == verb + ": into: output 0 has the fixed shape (3, 2) and cannot hold result 0 of shape (2, "
                                       "3); give an array of that shape, or an xt::xarray");
      // Arrays that fit are written.
      xt::xtensor_fixed<float, xt::xshape<2, 3>> fits;
      xt::xtensor<float, 1> sums;
      CHECK(run(same, fits) == "no error");
      CHECK(fits == x);
      CHECK(run(pair, std::tie(fits, sums)) == "no error");
      CHECK(sums == xt::xtensor<float, 1>{3, 12});
    }
  }
}
