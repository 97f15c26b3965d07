// SPDX-License-Identifier: MIT
// Device mode: many more devices than cores, and errors instead of hangs when a device
// throws, leaves early, or calls a different collective.
#include "test_support.hpp"

#include <chrono>
#include <stdexcept>
#include <thread>

using namespace namedax::literals;

TEST_SUITE("devices") {
  TEST_CASE("16, 32 and 64 devices on this machine complete psum") {
    for (int n : {16, 32, 64}) {
      CAPTURE(n);
      xt::xarray<double> x = xt::arange<double>(n * 3).reshape({static_cast<std::size_t>(n), 3});
      auto f = [](auto x) { return namedax::psum(x, "i"_ax); };
      auto p = namedax::pmap<"i">(f)(x);
      CHECK_BITWISE(p, namedax::vmap<"i">(f)(x));
      xt::xarray<double> column_sums = xt::sum(x, {0});
      CHECK(p(n - 1, 2) == column_sums(2));
    }
  }

  TEST_CASE("many collectives in a row keep devices in step") {
    xt::xarray<int> x = xt::arange<int>(8);
    auto f = [](auto x) {
      auto acc = namedax::eval(x);
      for (int k = 0; k < 200; ++k) acc = namedax::eval(namedax::pmax(acc, "i"_ax) - acc + x);
      return acc;
    };
    CHECK_BITWISE(namedax::pmap<"i">(f)(x), namedax::vmap<"i">(f)(x));
  }

  TEST_CASE("an exception in one device aborts the collective for all and pmap rethrows it") {
    xt::xarray<float> x = xt::arange<float>(8);
    for (int where : {0, 1, 2}) {  // before, during (between two), after the collective
      CAPTURE(where);
      auto f = [where](auto x) {
        const bool bad = static_cast<bool>(namedax::axis_index("i"_ax) == 3);
        if (where == 0 && bad) throw std::runtime_error("device three failed before");
        auto s = namedax::psum(x, "i"_ax);
        if (where == 1 && bad) throw std::runtime_error("device three failed between");
        auto t = namedax::psum(s, "i"_ax);
        if (where == 2 && bad) throw std::runtime_error("device three failed after");
        return t;
      };
      CHECK_THROWS_WITH_AS(namedax::pmap<"i">(f)(x), doctest::Contains("device three failed"), std::runtime_error);
    }
  }

  TEST_CASE("devices that call different collectives get an error naming both calls") {
    xt::xarray<float> x = xt::arange<float>(4);
    auto f = [](auto x) {
      if (namedax::axis_index("i"_ax) == 2) return namedax::pmax(x, "i"_ax);
      return namedax::psum(x, "i"_ax);
    };
    try {
      namedax::pmap<"i">(f)(x);
      FAIL("no error");
    } catch (const namedax::collective_error& e) {
      std::string what = e.what();
      CHECK(what.find("different collective calls") != std::string::npos);
      CHECK(what.find("psum over ('i',)") != std::string::npos);
      CHECK(what.find("pmax over ('i',)") != std::string::npos);
      CHECK(what.find("device i=2") != std::string::npos);
    }
  }

  TEST_CASE("devices that call the same collective with different shapes get an error") {
    xt::xarray<float> x = xt::arange<float>(4);
    auto f = [](auto x) {
      if (namedax::axis_index("i"_ax) == 1) return namedax::psum(xt::xarray<float>{1.f, 2.f} * x, "i"_ax);
      return namedax::psum(xt::xarray<float>{1.f, 2.f, 3.f} * x, "i"_ax);
    };
    CHECK_THROWS_WITH_AS(namedax::pmap<"i">(f)(x), doctest::Contains("different collective calls"),
                         namedax::collective_error);
  }

  TEST_CASE("a device that returns while others wait in a collective is reported") {
    xt::xarray<float> x = xt::arange<float>(4);
    auto f = [](auto x) {
      auto out = namedax::eval(x);
      if (!(namedax::axis_index("i"_ax) == 1)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let device 1 leave first
        out = namedax::eval(x + namedax::psum(x, "i"_ax));
      }
      return out;
    };
    CHECK_THROWS_WITH_AS(namedax::pmap<"i">(f)(x), doctest::Contains("device i=1 returned from the mapped function"),
                         namedax::collective_error);
  }

  TEST_CASE("devices waiting in collectives over different axes: a deadlock, reported") {
    xt::xarray<float> x = xt::zeros<float>({2, 2});
    // On a 2x2 mesh, (0,0) and (1,1) reduce over j while (0,1) and (1,0) reduce over i: each
    // waits for a partner who waits elsewhere, in a cycle.
    auto f = [](auto x) {
      if (namedax::axis_index("i"_ax) + namedax::axis_index("j"_ax) == 1) return namedax::eval(x + namedax::psum(x, "i"_ax));
      return namedax::eval(x + namedax::psum(x, "j"_ax));
    };
    CHECK_THROWS_WITH_AS(namedax::pmap<"i">(namedax::pmap<"j">(f))(x),
                         doctest::Contains("every running device waits in a collective that cannot complete"),
                         namedax::collective_error);
  }

  TEST_CASE("a collective over an outer axis entered by only some devices of the inner map") {
    xt::xarray<float> x = xt::zeros<float>({2, 3});
    auto f = [](auto x) {
      if (namedax::axis_index("j"_ax) == 2) return namedax::eval(x);
      return namedax::eval(x + namedax::psum(x, "i"_ax));
    };
    // Devices (i, 2) leave; devices (i, 0) and (i, 1) still meet each other and complete.
    auto p = namedax::pmap<"i">(namedax::pmap<"j">(f))(x);
    CHECK(p.shape() == std::vector<std::size_t>{2, 3});
    auto g = [](auto x) {
      if (namedax::axis_index("i"_ax) == 1 && namedax::axis_index("j"_ax) == 2) return namedax::eval(x);
      return namedax::eval(x + namedax::psum(x, "i"_ax));
    };
    CHECK_THROWS_WITH_AS(namedax::pmap<"i">(namedax::pmap<"j">(g))(x),
                         doctest::Contains("device i=1,j=2 returned from the mapped function"),
                         namedax::collective_error);
  }

  TEST_CASE("a pmap can run again after a failed one") {
    xt::xarray<int> x = xt::arange<int>(4);
    auto bad = [](auto x) {
      if (namedax::axis_index("i"_ax) == 0) throw std::runtime_error("boom");
      return namedax::psum(x, "i"_ax);
    };
    CHECK_THROWS_AS(namedax::pmap<"i">(bad)(x), std::runtime_error);
    auto good = [](auto x) { return namedax::psum(x, "i"_ax); };
    CHECK_BITWISE(namedax::pmap<"i">(good)(x), (xt::xarray<int>{6, 6, 6, 6}));
  }
}
