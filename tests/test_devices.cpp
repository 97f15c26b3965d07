// SPDX-License-Identifier: MIT
// Device mode: many more devices than cores, and errors instead of hangs when a device
// throws, leaves early, or calls a different collective.
#include "test_support.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <variant>

using namespace namedax::literals;

namespace {

/// A small, strict JSON reader: enough to prove a trace file is JSON and to look inside it.
struct json {
  using array = std::vector<json>;
  using object = std::map<std::string, json>;
  std::variant<std::nullptr_t, bool, double, std::string, array, object> value;

  const json& operator[](const std::string& key) const { return std::get<object>(value).at(key); }
  const array& items() const { return std::get<array>(value); }
  const std::string& text() const { return std::get<std::string>(value); }
  double number() const { return std::get<double>(value); }
  bool has(const std::string& key) const { return std::get<object>(value).count(key) > 0; }

  static json parse(std::string_view in) {
    std::size_t at = 0;
    json v = read(in, at);
    skip(in, at);
    if (at != in.size()) throw std::runtime_error("text after the JSON value");
    return v;
  }

 private:
  static void skip(std::string_view in, std::size_t& at) {
    while (at < in.size() && (in[at] == ' ' || in[at] == '\n' || in[at] == '\t' || in[at] == '\r')) ++at;
  }
  static void expect(std::string_view in, std::size_t& at, std::string_view word) {
    if (in.substr(at, word.size()) != word) throw std::runtime_error("bad JSON at " + std::to_string(at));
    at += word.size();
  }
  static std::string read_string(std::string_view in, std::size_t& at) {
    expect(in, at, "\"");
    std::string out;
    while (at < in.size() && in[at] != '"') {
      if (static_cast<unsigned char>(in[at]) < 0x20) throw std::runtime_error("control character in a JSON string");
      if (in[at] == '\\') {
        ++at;
        if (at >= in.size()) break;
        if (in[at] == 'u') out += '?', at += 4;
        else out += in[at] == 'n' ? '\n' : in[at];
      } else {
        out += in[at];
      }
      ++at;
    }
    expect(in, at, "\"");
    return out;
  }
  static json read(std::string_view in, std::size_t& at) {
    skip(in, at);
    if (at >= in.size()) throw std::runtime_error("JSON ends early");
    const char c = in[at];
    if (c == '{') {
      object o;
      ++at, skip(in, at);
      if (in[at] == '}') return ++at, json{o};
      for (;;) {
        skip(in, at);
        std::string key = read_string(in, at);
        skip(in, at), expect(in, at, ":");
        o.emplace(std::move(key), read(in, at));
        skip(in, at);
        if (in[at] == '}') return ++at, json{o};
        expect(in, at, ",");
      }
    }
    if (c == '[') {
      array a;
      ++at, skip(in, at);
      if (in[at] == ']') return ++at, json{a};
      for (;;) {
        a.push_back(read(in, at));
        skip(in, at);
        if (in[at] == ']') return ++at, json{a};
        expect(in, at, ",");
      }
    }
    if (c == '"') return json{read_string(in, at)};
    if (in.substr(at, 4) == "true") return at += 4, json{true};
    if (in.substr(at, 5) == "false") return at += 5, json{false};
    if (in.substr(at, 4) == "null") return at += 4, json{nullptr};
    std::size_t end = at;
    while (end < in.size() && std::string_view("+-0123456789.eE").find(in[end]) != std::string_view::npos) ++end;
    if (end == at) throw std::runtime_error("bad JSON value at " + std::to_string(at));
    double v = std::stod(std::string(in.substr(at, end - at)));
    at = end;
    return json{v};
  }
};

std::string read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

/// Checks a Chrome trace: one named track per device, and `per_device` collectives on each,
/// numbered 0, 1, ... in order; returns the collective names of the first track.
std::vector<std::string> check_trace(const json& trace, std::size_t devices, std::size_t per_device) {
  std::map<double, std::string> tracks;
  std::map<double, std::vector<const json*>> events;
  for (const json& e : trace["traceEvents"].items()) {
    if (e["ph"].text() == "M") {
      CHECK(e["name"].text() == "thread_name");
      tracks[e["tid"].number()] = e["args"]["name"].text();
    } else {
      CHECK(e["ph"].text() == "X");
      CHECK(e["dur"].number() >= e["args"]["wait_us"].number());
      CHECK(e["args"].has("axes"));
      CHECK(e["args"].has("shape"));
      CHECK(e["args"].has("dtype"));
      events[e["tid"].number()].push_back(&e);
    }
  }
  CHECK(tracks.size() == devices);
  CHECK(events.size() == devices);
  std::vector<std::string> names;
  for (const auto& [tid, list] : events) {
    CHECK(tracks.count(tid) == 1);
    CHECK(list.size() == per_device);
    for (std::size_t k = 0; k < list.size(); ++k) {
      CHECK((*list[k])["args"]["sequence"].number() == static_cast<double>(k));
      if (tid == events.begin()->first) names.push_back((*list[k])["name"].text());
    }
  }
  return names;
}

}  // namespace

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

  TEST_CASE("64 devices on this machine complete all_gather and all_to_all") {
    xt::xarray<int> x = xt::arange<int>(64 * 64).reshape({64, 64});
    auto gather = [](auto x) { return namedax::all_gather(x, "i"_ax, {.tiled = true}); };
    auto swap = [](auto x) { return namedax::all_to_all(x, "i"_ax, 0, 0); };
    auto gathered = namedax::pmap<"i">(gather)(x);
    CHECK_BITWISE(gathered, namedax::vmap<"i">(gather)(x));
    CHECK(gathered.shape() == std::vector<std::size_t>{64, 64 * 64});
    CHECK(gathered(63, 64 * 64 - 1) == 64 * 64 - 1);
    auto swapped = namedax::pmap<"i">(swap)(x);
    CHECK_BITWISE(swapped, namedax::vmap<"i">(swap)(x));
    CHECK_BITWISE(swapped, xt::xarray<int>(xt::transpose(x)));
  }

  TEST_CASE("large reductions: reduce-scatter then all-gather gives the bits of vmap") {
    // Payloads from 256 KiB take the chunked path; lengths that N does not divide, several
    // names, NaN for pmax, and a strided payload (which takes the one-shot rule) included.
    std::mt19937 random(7);
    std::uniform_real_distribution<float> value(-1, 1);
    for (std::size_t n : {2u, 3u, 5u}) {
      CAPTURE(n);
      const std::size_t length = (std::size_t{300} << 10) / sizeof(float) + n + 1;
      xt::xarray<float> x = xt::xarray<float>::from_shape({n, length});
      for (auto& v : x) v = value(random);
      x(n - 1, 17) = std::numeric_limits<float>::quiet_NaN();
      auto sums = [](auto x) { return std::tuple{namedax::psum(x, "i"_ax), namedax::pmean(x, "i"_ax)}; };
      auto [vs, vm] = namedax::vmap<"i">(sums)(x);
      auto [ps, pm] = namedax::pmap<"i">(sums)(x);
      CHECK_BITWISE(ps, vs);
      CHECK_BITWISE(pm, vm);
      auto extremes = [](auto x) { return std::tuple{namedax::pmax(x, "i"_ax), namedax::pmin(x, "i"_ax)}; };
      auto [vx, vn] = namedax::vmap<"i">(extremes)(x);
      auto [px, pn] = namedax::pmap<"i">(extremes)(x);
      CHECK_BITWISE(px, vx);
      CHECK_BITWISE(pn, vn);
      CHECK(std::isnan(px(0, 17)));
      xt::xarray<float> columns = xt::transpose(x);  // mapped along dim 1: each slice is strided
      auto psum_only = [](auto x) { return namedax::psum(x, "i"_ax); };
      CHECK_BITWISE(namedax::pmap<"i">(psum_only, 1)(columns), namedax::vmap<"i">(psum_only, 1)(columns));
    }
    xt::xarray<double> y = xt::xarray<double>::from_shape({2, 3, 20000});
    for (auto& v : y) v = value(random);
    auto both = [](auto y) { return namedax::psum(y, namedax::axes("i"_ax, "j"_ax)); };
    CHECK_BITWISE(namedax::pmap<"i">(namedax::pmap<"j">(both))(y), namedax::vmap<"i">(namedax::vmap<"j">(both))(y));
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
      CHECK_THROWS_WITH_AS(namedax::pmap<"i">(f)(x), doctest::Contains("(thrown on device i=3)"), std::runtime_error);
    }
  }

  TEST_CASE("the first exception, thrown deep in nested pmaps, is the one rethrown, with its device") {
    xt::xarray<float> x = xt::zeros<float>({2, 3});
    auto f = [](auto x) {
      if (namedax::axis_index("i"_ax) == 1 && namedax::axis_index("j"_ax) == 2) throw std::invalid_argument("bad shard");
      return namedax::eval(x + namedax::psum(x, "i"_ax) + namedax::psum(x, "j"_ax));
    };
    for (int repeat = 0; repeat < 5; ++repeat)
      CHECK_THROWS_WITH_AS(namedax::pmap<"i">(namedax::pmap<"j">(f))(x),
                           doctest::Contains("bad shard (thrown on device i=1,j=2)"), std::invalid_argument);
  }

  TEST_CASE("an exception of the user's own type is rethrown as that type") {
    struct shard_error {
      int device;
    };
    xt::xarray<float> x = xt::arange<float>(4);
    auto f = [](auto x) {
      if (namedax::axis_index("i"_ax) == 2) throw shard_error{2};
      return namedax::psum(x, "i"_ax);
    };
    try {
      namedax::pmap<"i">(f)(x);
      FAIL("no exception");
    } catch (const shard_error& e) {
      CHECK(e.device == 2);
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
      // and what every device did last
      CHECK(what.find("last collectives each device entered:") != std::string::npos);
      CHECK(what.find("device i=2: #0 pmax over ('i',)") != std::string::npos);
      CHECK(what.find("device i=0: #0 psum over ('i',)") != std::string::npos);
    }
  }

  TEST_CASE("devices that differ in dtype, axes or parameters of the same collective get an error") {
    xt::xarray<float> x = xt::arange<float>(8).reshape({4, 2});
    auto expect = [&](auto f, const char* mine, const char* theirs) {
      const std::string what = namedax_test::error_of([&] { namedax::pmap<"i">(f)(x); });
      CHECK_MESSAGE(what.find("different collective calls") != std::string::npos, what);
      CHECK_MESSAGE(what.find(mine) != std::string::npos, what);
      CHECK_MESSAGE(what.find(theirs) != std::string::npos, what);
    };
    auto dtype = [](auto x) {
      if (namedax::axis_index("i"_ax) == 1) return namedax::eval(namedax::cast<float>(namedax::psum(namedax::cast<double>(x), "i"_ax)));
      return namedax::eval(namedax::psum(x, "i"_ax));
    };
    expect(dtype, "type float64", "type float32");
    auto axis = [](auto x) {
      if (namedax::axis_index("i"_ax) == 0) return namedax::eval(namedax::all_gather(x, "i"_ax, {.axis = 1}));
      return namedax::eval(namedax::all_gather(x, "i"_ax, {.axis = 0}));
    };
    expect(axis, "all_gather over ('i',) at axis 1", "all_gather over ('i',) at axis 0");
    auto pairs = [](auto x) {
      if (namedax::axis_index("i"_ax) == 2) return namedax::eval(namedax::ppermute(x, "i"_ax, {{0, 1}, {1, 0}}));
      return namedax::eval(namedax::ppermute(x, "i"_ax, {{0, 1}, {1, 2}, {2, 3}, {3, 0}}));
    };
    expect(pairs, "with pairs ((0, 1), (1, 0))", "with pairs ((0, 1), (1, 2), (2, 3), (3, 0))");
    auto groups = [](auto x) {
      if (namedax::axis_index("i"_ax) == 3) return namedax::eval(namedax::psum(x, "i"_ax, {.axis_index_groups = {{0, 1}, {2, 3}}}));
      return namedax::eval(namedax::psum(x, "i"_ax, {.axis_index_groups = {{0, 2}, {1, 3}}}));
    };
    expect(groups, "with groups ((0, 1), (2, 3))", "with groups ((0, 2), (1, 3))");
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

  TEST_CASE("an inner pmap run again with another size meets only its own devices") {
    // Each outer device runs pmap<"j"> over 3 then 2 devices, and over 2 then 3: the inner
    // maps' collectives span their own devices, over j within one map, over i across the
    // outer devices' maps of the same call.
    const xt::xarray<int> x = {1, 10};
    for (const auto& sizes : {std::pair{3, 2}, std::pair{2, 3}}) {
      const int first = sizes.first, second = sizes.second;
      CAPTURE(first);
      CAPTURE(second);
      auto inner = [](auto x, auto y) {
        auto v = namedax::eval(x * (y + 1));
        return namedax::eval(namedax::psum(v, "j"_ax) * 100 + namedax::psum(v, "i"_ax));
      };
      auto f = [&](auto x) {
        const xt::xarray<int> ys_first = xt::arange<int>(first), ys_second = xt::arange<int>(second);
        auto a = namedax::pmap<"j">(inner, std::tuple{namedax::none, 0})(x, ys_first);
        auto b = namedax::pmap<"j">(inner, std::tuple{namedax::none, 0})(x, ys_second);
        return std::tuple{a, b};
      };
      auto [a, b] = namedax::pmap<"i">(f)(x);
      auto expected = [&](int n) {
        xt::xarray<int> e = xt::zeros<int>({2, n});
        for (int i = 0; i < 2; ++i)
          for (int j = 0; j < n; ++j) e(i, j) = x(i) * n * (n + 1) / 2 * 100 + (x(0) + x(1)) * (j + 1);
        return e;
      };
      CHECK_BITWISE(a, expected(first));
      CHECK_BITWISE(b, expected(second));
    }
  }

  TEST_CASE("an inner pmap run again and again does not keep the communicators of its earlier runs") {
    // Each run of pmap<"j"> over 3 devices meets in 5 communicators (one over j per outer
    // device, one over i per index of j); its last member to finish frees each of them.
    const xt::xarray<int> x = {1, 10}, ys = xt::arange<int>(3);
    static std::atomic<std::size_t> most{0};
    most = 0;
    // Counted by the inner devices once they met in their run's communicators, so that the count
    // cannot miss them; at most the other outer device's next run has begun meanwhile.
    auto inner = [](auto x, auto y) {
      auto out = namedax::eval(namedax::psum(x * y, "j"_ax) + namedax::psum(x * y, "i"_ax));
      namedax::detail::world& w = *namedax::detail::find_frame("i")->shared;
      std::lock_guard guard(w.lock);
      for (std::size_t now = w.communicators.size(), seen = most; now > seen && !most.compare_exchange_weak(seen, now);) {
      }
      return out;
    };
    auto f = [&](auto x) {
      for (int run = 0; run < 20; ++run) namedax::pmap<"j">(inner, std::tuple{namedax::none, 0})(x, ys);
      return namedax::eval(x);
    };
    namedax::pmap<"i">(f)(x);
    const std::size_t largest = most;
    CHECK(largest > 0);
    CHECK(largest <= 2 * 5);  // this run's and at most the next one's
  }

  TEST_CASE("an outer device that starts its next inner pmap late is not taken for one that left") {
    // While device i=1's next run waits for device i=0's, the records of i=0's last run (same
    // paths, finished) must not read as devices that returned without meeting it.
    const xt::xarray<int> x = {1, 10}, ys = xt::arange<int>(3);
    auto inner = [](auto x, auto y) { return namedax::eval(namedax::psum(x * y, "i"_ax)); };
    auto f = [&](auto x) {
      auto run = [&] {
        if (namedax::axis_index("i"_ax) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(30));
        return namedax::pmap<"j">(inner, std::tuple{namedax::none, 0})(x, ys);
      };
      (void)run(), (void)run();
      return namedax::eval(run());
    };
    CHECK_BITWISE(namedax::pmap<"i">(f)(x), (xt::xarray<int>{{0, 11, 22}, {0, 11, 22}}));
  }

  TEST_CASE("a map that rebinds the axis of an enclosing map is an error") {
    // Over plain data the inner map's types do not show the outer axis (with named arguments
    // it does not compile: see compile_fail/axis_bound_twice.cpp, pmap_axis_bound_twice.cpp).
    const xt::xarray<int> x = {1, 2, 3, 4};
    auto inner = [](auto y) { return namedax::psum(y, "i"_ax); };
    auto rebinding = [](const char* outer_verb, const char* inner_verb) {
      return namedax::detail::message("namedax::", inner_verb, "<\"i\">: axis 'i' is already bound by an enclosing namedax::",
                                      outer_verb, "<\"i\">; give the inner map an axis name of its own");
    };
    auto pmap_inside = [&](auto) { return namedax::pmap<"i">(inner)(x); };
    auto vmap_inside = [&](auto) { return namedax::vmap<"i">(inner)(x); };
    CHECK(namedax_test::error_of([&] { namedax::pmap<"i">(pmap_inside)(x); }) == rebinding("pmap", "pmap"));
    CHECK(namedax_test::error_of([&] { namedax::pmap<"i">(vmap_inside)(x); }) == rebinding("pmap", "vmap"));
    CHECK(namedax_test::error_of([&] { namedax::vmap<"i">(pmap_inside)(x); }) == rebinding("vmap", "pmap"));
    CHECK(namedax_test::error_of([&] { namedax::vmap<"i">(vmap_inside)(x); }) == rebinding("vmap", "vmap"));
    // with another map between them
    auto deeper = [&](auto) { return namedax::pmap<"j">(pmap_inside)(x); };
    CHECK(namedax_test::error_of([&] { namedax::pmap<"i">(deeper)(x); }) == rebinding("pmap", "pmap"));
    // and a map of another name inside works as before: each outer device sums its own copy
    auto other = [&](auto) { return namedax::pmap<"j">([](auto y) { return namedax::psum(y, "j"_ax); })(x); };
    CHECK_BITWISE(namedax::pmap<"i">(other)(x), xt::xarray<int>(xt::zeros<int>({4, 4}) + 10));
  }

  TEST_CASE("a device thread that cannot start is a namedax::error, and the devices that started are joined") {
    struct reset_hook {
      ~reset_hook() { namedax::detail::before_device_start = nullptr; }
    } reset;
    static std::atomic<long> failing{-1};  // the device whose start fails; -1: the first on a thread of its own
    static std::atomic<long> failed{-1};
    const std::system_error refusal(std::make_error_code(std::errc::resource_unavailable_try_again), "thread");
    namedax::detail::before_device_start = [](std::size_t d, bool own_thread) {
      long none = -1;
      if (static_cast<long>(d) == failing || (failing == -1 && own_thread && failed.compare_exchange_strong(none, static_cast<long>(d))))
        throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again), "thread");
    };
    auto expected = [&](long k, std::size_t n) {
      return namedax::detail::message("namedax::pmap<\"i\">: could not start device thread ", k, " of ", n, ": ",
                                      refusal.what(), "; use fewer devices, or allow the process more threads or memory");
    };
    auto f = [](auto x) { return namedax::psum(x, "i"_ax); };  // devices that started wait for the others
    const xt::xarray<int> x = xt::arange<int>(8);
    for (long k : {0, 5, 7}) {
      CAPTURE(k);
      failing = k;
      CHECK(namedax_test::error_of([&] { namedax::pmap<"i">(f)(x); }) == expected(k, 8));
      // in a nested map (whose 2 outer devices start), the outer pmap rethrows it
      const xt::xarray<int> xy = xt::zeros<int>({2, 8});
      if (k > 1) CHECK(namedax_test::error_of([&] { namedax::pmap<"j">(namedax::pmap<"i">(f))(xy); }) == expected(k, 8));
    }
    // More devices than a task arena runs at once: those it cannot start get threads of their own.
    failing = -1;
    const xt::xarray<int> wide = xt::arange<int>(300);
    const std::string what = namedax_test::error_of([&] { namedax::pmap<"i">(f)(wide); });
    REQUIRE(failed >= 0);
    CHECK(what == expected(failed, 300));
    namedax::detail::before_device_start = nullptr;
    CHECK_BITWISE(namedax::pmap<"i">(f)(x), xt::xarray<int>(xt::zeros<int>({8}) + 28));
  }
}

TEST_SUITE("tracing") {
  TEST_CASE("a trace has one track per device and one event per collective, and parses as JSON") {
    xt::xarray<float> x = xt::arange<float>(2 * 3 * 4).reshape({2, 3, 4});
    auto f = [](auto x) {
      auto s = namedax::psum(x, "i"_ax);
      auto g = namedax::all_gather(x, namedax::axes("i"_ax, "j"_ax), {.tiled = true});
      return std::tuple{namedax::eval(s), namedax::eval(g), namedax::eval(namedax::ppermute(x, "j"_ax, {{0, 1}, {1, 2}, {2, 0}}))};
    };
    namedax::start_tracing();
    namedax::pmap<"i">(namedax::pmap<"j">(f))(x);
    const auto events = namedax::stop_tracing();
    REQUIRE(events.size() == 6 * 3);
    CHECK(events.front().device == "i=0,j=0");
    CHECK(events.front().op == "psum");
    CHECK(events.front().axes == "('i',)");
    CHECK(events.front().shape == "(4,)");
    CHECK(events.front().dtype == "float32");
    CHECK(events[1].parameters == " at axis 0, tiled");
    CHECK(events.back().device == "i=1,j=2");

    const std::string path = "namedax_trace_test.json";
    namedax::write_chrome_trace(path, events);
    const json trace = json::parse(read_file(path));
    std::remove(path.c_str());
    CHECK(check_trace(trace, 6, 3) == std::vector<std::string>{"psum", "all_gather", "ppermute"});

    // Recording is off again: nothing more is kept.
    namedax::pmap<"i">(namedax::pmap<"j">(f))(x);
    namedax::start_tracing();
    CHECK(namedax::stop_tracing().empty());
  }

  TEST_CASE("NAMEDAX_TRACE records every pmap and writes the file" * doctest::skip()) {
    const char* path = std::getenv("NAMEDAX_TRACE");
    REQUIRE_MESSAGE(path != nullptr, "run this test with NAMEDAX_TRACE set (CTest does)");
    xt::xarray<int> x = xt::arange<int>(8);
    auto f = [](auto x) { return namedax::pmax(namedax::psum(x, "i"_ax) + x, "i"_ax); };
    namedax::pmap<"i">(f)(x);
    const json trace = json::parse(read_file(path));
    CHECK(check_trace(trace, 8, 2) == std::vector<std::string>{"psum", "pmax"});
  }

  TEST_CASE("the JSON writer escapes what it must") {
    namedax::trace_event e{"i=0", "psum", "('a\"b',)", "", "(2,)", "float32", 0, 1.5, 0.25, 2.0};
    const json trace = json::parse(namedax::chrome_trace_json(std::vector{e}));
    CHECK(trace["traceEvents"].items()[1]["args"]["axes"].text() == "('a\"b',)");
    CHECK(trace["traceEvents"].items()[1]["ts"].number() == 1.5);
  }
}
