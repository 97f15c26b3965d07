// SPDX-License-Identifier: MIT
// Asynchronous ppermute: the same bits as the blocking one in every placement, rings with
// handles in flight, and the ways a program can misuse a handle (never waited, waited twice,
// a device that throws or fails at each point of the exchange, dropped by a std::vector, many
// dropped by namedax::async::handles), each ending in a clear error and never in a hang.
#include "test_support.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
extern char** environ;  // NOLINT: POSIX declares it in no header
#endif

using namespace namedax::literals;
using namedax::detail::fault_point;
using pairs_t = std::vector<std::pair<int, int>>;

namespace {

/// A random set of pairs over n indices: a permutation of a random subset of sources.
pairs_t random_pairs(std::mt19937& rng, int n, bool full) {
  std::vector<int> sources(static_cast<std::size_t>(n)), destinations(static_cast<std::size_t>(n));
  std::iota(sources.begin(), sources.end(), 0);
  std::iota(destinations.begin(), destinations.end(), 0);
  std::shuffle(sources.begin(), sources.end(), rng);
  std::shuffle(destinations.begin(), destinations.end(), rng);
  const int count = full ? n : std::uniform_int_distribution<int>(0, n - 1)(rng);
  pairs_t pairs;
  for (int k = 0; k < count; ++k) pairs.emplace_back(sources[static_cast<std::size_t>(k)], destinations[static_cast<std::size_t>(k)]);
  return pairs;
}

pairs_t ring(int n) {
  pairs_t pairs;
  for (int k = 0; k < n; ++k) pairs.emplace_back(k, (k + 1) % n);
  return pairs;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// The index of this device along "i" (device mode only).
int device_index(int n) {
  int d = 0;
  for (int k = 1; k < n; ++k)
    if (namedax::axis_index("i"_ax) == k) d = k;
  return d;
}

template <class T>
void check_same_as_blocking(std::mt19937& rng, int n, const std::vector<std::size_t>& inner, const pairs_t& pairs) {
  std::vector<std::size_t> shape{static_cast<std::size_t>(n)};
  shape.insert(shape.end(), inner.begin(), inner.end());
  const auto xs = namedax_test::random_array<T>(rng, shape);
  auto blocking = [&](auto x) { return namedax::ppermute(x, "i"_ax, pairs); };
  auto started = [&](auto x) {
    auto h = namedax::async::ppermute(x, "i"_ax, pairs);
    static_assert(std::is_same_v<decltype(h.wait()), decltype(namedax::ppermute(x, "i"_ax, pairs))>);
    return h.wait();
  };
  // A strided operand (a transposed copy's view) and a lazy one take the same path.
  auto lazy = [&](auto x) {
    auto h = namedax::async::ppermute(x * T(1), "i"_ax, pairs);
    return h.wait();
  };
  const xt::xarray<T> expected = namedax::vmap<"i">(blocking)(xs);
  CHECK_BITWISE(namedax::pmap<"i">(blocking)(xs), expected);
  CHECK_BITWISE(namedax::vmap<"i">(started)(xs), expected);
  CHECK_BITWISE(namedax::pmap<"i">(started)(xs), expected);
  CHECK_BITWISE(namedax::pmap<"i">(lazy)(xs), expected);
  // The same values mapped from dim 1 of a transposed copy: a strided view on each device.
  if (!inner.empty()) {
    std::vector<std::size_t> order(shape.size());
    std::iota(order.begin(), order.end(), 0);
    std::swap(order[0], order[1]);
    const xt::xarray<T> moved = xt::transpose(xs, order);
    CHECK_BITWISE(namedax::pmap<"i">(started, 1)(moved), expected);
  }
  // Devices that receive nothing get zeros, as JAX's pmap gives.
  const xt::xarray<T> mine = namedax::pmap<"i">(started)(xs);
  std::vector<bool> receives(static_cast<std::size_t>(n), false);
  for (auto [s, d] : pairs) receives[static_cast<std::size_t>(d)] = true;
  for (int d = 0; d < n; ++d) {
    const xt::xarray<T> row = xt::view(mine, d);
    if (!receives[static_cast<std::size_t>(d)]) CHECK(xt::all(xt::equal(row, T{})));
  }
}

}  // namespace

TEST_SUITE("async") {
  TEST_CASE("async::ppermute gives the blocking ppermute's bits under vmap and pmap, on random shapes and pairs") {
    std::mt19937 rng(20261204);
    for (int trial = 0; trial < 24; ++trial) {
      const int n = std::uniform_int_distribution<int>(1, 6)(rng);
      const auto inner = namedax_test::random_shape(rng, static_cast<std::size_t>(trial % 3), 7);
      const auto pairs = random_pairs(rng, n, trial % 2 == 0);
      INFO("trial ", trial, ", n ", n, ", pairs ", pairs.size());
      if (trial % 3 == 0) check_same_as_blocking<float>(rng, n, inner, pairs);
      else if (trial % 3 == 1) check_same_as_blocking<double>(rng, n, inner, pairs);
      else check_same_as_blocking<std::int32_t>(rng, n, inner, pairs);
    }
    // A large block, lent by reference as the blocking one does.
    check_same_as_blocking<float>(rng, 4, {300, 50}, ring(4));
  }

  TEST_CASE("a ring shift started, computed over, and waited (docs/guide.md)") {
    xt::xarray<float> x = xt::arange<float>(8).reshape({4, 2});
    auto f = [](auto x) {
      auto h = namedax::async::ppermute(x, "i"_ax, {{0, 1}, {1, 2}, {2, 3}, {3, 0}});
      auto local = x * 10.0f;  // computed while the block travels
      return local + h.wait();
    };
    xt::xarray<float> expected{{6.f, 17.f}, {20.f, 31.f}, {42.f, 53.f}, {64.f, 75.f}};
    CHECK_BITWISE(namedax::vmap<"i">(f)(x), expected);
    CHECK_BITWISE(namedax::pmap<"i">(f)(x), expected);
  }

  TEST_CASE("a pytree's leaves: the blocking ppermute's bits, one exchange per leaf among device threads") {
    std::mt19937 rng(5);
    const auto xs = namedax_test::random_array<float>(rng, {4, 3});
    const auto ys = namedax_test::random_array<std::int32_t>(rng, {4, 2, 2});
    const pairs_t pairs{{0, 2}, {2, 1}, {1, 0}};
    auto started = [&](auto x, auto y) {
      auto h = namedax::async::ppermute(std::tuple{x, y * 2}, "i"_ax, pairs);
      auto p = namedax::async::ppermute(std::pair{y, x + 1.0f}, "i"_ax, pairs);
      auto nested = namedax::async::ppermute(std::tuple{x, std::pair{y, y}}, "i"_ax, pairs);  // at the start
      auto [a, b] = h.wait();
      auto [c, d] = p.wait();
      auto [e, f] = nested.wait();
      return std::tuple{a, b, c, d, e, f.first, f.second};
    };
    auto blocking = [&](auto x, auto y) {
      auto [a, b] = namedax::ppermute(std::tuple{x, y * 2}, "i"_ax, pairs);
      auto [c, d] = namedax::ppermute(std::pair{y, x + 1.0f}, "i"_ax, pairs);
      auto [e, f] = namedax::ppermute(std::tuple{x, std::pair{y, y}}, "i"_ax, pairs);
      return std::tuple{a, b, c, d, e, f.first, f.second};
    };
    const auto expected = namedax::vmap<"i">(blocking)(xs, ys);
    CHECK(namedax_test::tree_bitwise_equal(namedax::pmap<"i">(started)(xs, ys), expected));
    CHECK(namedax_test::tree_bitwise_equal(namedax::vmap<"i">(started)(xs, ys), expected));
    // Each leaf is an exchange in flight: four pairs fit in the eight, a fifth does not.
    auto pairs_in_flight = [&](auto x, int count) {
      std::vector<namedax::async::handle<decltype(namedax::ppermute(std::pair{x, x}, "i"_ax, pairs))>> hs;
      for (int k = 0; k < count; ++k) hs.push_back(namedax::async::ppermute(std::pair{x, x * float(k)}, "i"_ax, pairs));
      auto sum = namedax::eval(x * 0.0f);
      for (auto& h : hs) {
        auto [u, v] = h.wait();
        sum = sum + u + v;
      }
      return sum;
    };
    CHECK_NOTHROW(namedax::pmap<"i">([&](auto x) { return pairs_in_flight(x, 4); })(xs));
    const std::string e = namedax_test::error_of([&] { namedax::pmap<"i">([&](auto x) { return pairs_in_flight(x, 5); })(xs); });
    CHECK(contains(e, "at most 8 may be in flight"));
  }

  TEST_CASE("a permutation known at compile time") {
    xt::xarray<int> x{10, 11, 12, 13};
    auto f = [](auto x) { return namedax::async::ppermute(x, "i"_ax, namedax::static_perm<0, 1, 1, 2, 2, 3>).wait(); };
    xt::xarray<int> expected{0, 10, 11, 12};
    CHECK_BITWISE(namedax::vmap<"i">(f)(x), expected);
    CHECK_BITWISE(namedax::pmap<"i">(f)(x), expected);
  }

  TEST_CASE("an empty permutation written {} sends nothing: zeros, as JAX's perm=[]") {
    xt::xarray<int> x{10, 11, 12, 13};
    auto f = [](auto x) { return namedax::async::ppermute(x, "i"_ax, {}).wait(); };
    const xt::xarray<int> zeros{0, 0, 0, 0};
    CHECK_BITWISE(namedax::vmap<"i">(f)(x), zeros);
    CHECK_BITWISE(namedax::pmap<"i">(f)(x), zeros);
  }

  TEST_CASE("the sent block is captured at start: rebinding the operand before wait changes nothing") {
    xt::xarray<float> xs = xt::arange<float>(12).reshape({4, 3});
    auto f = [](auto x) {
      auto acc = namedax::eval(x);
      auto h = namedax::async::ppermute(acc, "i"_ax, ring(4));
      acc = acc * 100.0f;  // a new array: the one sent is never written
      auto got = h.wait();
      return got + acc * 0.0f;
    };
    auto expected = namedax::vmap<"i">([](auto x) { return namedax::ppermute(x, "i"_ax, ring(4)); })(xs);
    CHECK_BITWISE(namedax::pmap<"i">(f)(xs), expected);
    CHECK_BITWISE(namedax::vmap<"i">(f)(xs), expected);
  }

  TEST_CASE("a ring of n-1 steps with two handles in flight gives every device every block, as all_gather does") {
    for (int n : {2, 3, 4, 7}) {
      INFO("devices: ", n);
      std::mt19937 rng(static_cast<unsigned>(n));
      const auto xs = namedax_test::random_array<float>(rng, {static_cast<std::size_t>(n), 5});
      // Two rings at once: the block goes around one way, its double the other way; step s+1 of
      // both is started before step s is waited, so up to four handles are in flight.
      auto f = [n](auto x) {
        const auto forward = ring(n);
        pairs_t backward;
        for (auto [s, d] : forward) backward.emplace_back(d, s);
        auto block = namedax::eval(x);
        auto sum = namedax::eval(x);
        auto a = namedax::async::ppermute(block, "i"_ax, forward);
        auto b = namedax::async::ppermute(block * 2.0f, "i"_ax, backward);
        for (int step = 1; step < n; ++step) {
          auto got_a = a.wait();
          auto got_b = b.wait();
          if (step + 1 < n) {
            a = namedax::async::ppermute(got_a, "i"_ax, forward);
            b = namedax::async::ppermute(got_b, "i"_ax, backward);
          }
          sum = sum + got_a + got_b * 0.0f;
          block = got_a;
        }
        return sum;
      };
      auto reference = [n](auto x) {
        auto block = namedax::eval(x);
        auto sum = namedax::eval(x);
        for (int step = 1; step < n; ++step) {
          auto got = namedax::ppermute(block, "i"_ax, ring(n));
          auto other = namedax::ppermute(block * 2.0f, "i"_ax, ring(n));
          sum = sum + got + other * 0.0f;
          block = got;
        }
        return sum;
      };
      const xt::xarray<float> expected = namedax::vmap<"i">(reference)(xs);
      CHECK_BITWISE(namedax::pmap<"i">(f)(xs), expected);
      CHECK_BITWISE(namedax::vmap<"i">(f)(xs), expected);
      // Every device holds the sum of every block (in ring order, so compare with a tolerance).
      xt::xarray<float> total = xt::sum(xs, {0});
      for (int d = 0; d < n; ++d) CHECK(xt::allclose(xt::view(expected, d), total, 1e-4, 1e-2));
    }
  }

  TEST_CASE("a fast sender of a later call waits for its turn: blocks arrive in the receiver's call order") {
    xt::xarray<float> xs = xt::arange<float>(8).reshape({4, 2});
    // Device 2 receives nothing and sends to device 0 in calls 1..9, so it runs ahead, while
    // device 0 waits for call 0's block from device 1, which starts late. Call 8 uses the slot
    // of call 0: device 2 must not leave its block there before device 0 took call 0's.
    auto f = [](auto x) {
      if (device_index(4) == 1) std::this_thread::sleep_for(std::chrono::milliseconds(30));
      auto sum = namedax::eval(namedax::async::ppermute(x, "i"_ax, {{1, 0}}).wait());
      for (int k = 1; k <= 9; ++k)
        sum = sum * 3.0f + namedax::async::ppermute(x + float(k), "i"_ax, {{2, 0}}).wait();
      return sum;
    };
    auto reference = [](auto x) {
      auto sum = namedax::eval(namedax::ppermute(x, "i"_ax, {{1, 0}}));
      for (int k = 1; k <= 9; ++k) sum = sum * 3.0f + namedax::ppermute(x + float(k), "i"_ax, {{2, 0}});
      return sum;
    };
    const xt::xarray<float> expected = namedax::vmap<"i">(reference)(xs);
    CHECK_BITWISE(namedax::pmap<"i">(f)(xs), expected);
  }

  TEST_CASE("async::ppermute in nested maps and over two names gives the blocking bits in every placement") {
    std::mt19937 rng(7);
    const auto xs = namedax_test::random_array<float>(rng, {3, 2, 4});
    const pairs_t over_i{{0, 2}, {2, 1}, {1, 0}}, over_both{{0, 5}, {5, 1}, {1, 0}, {3, 4}};
    auto blocking = [&](auto x) {
      return namedax::ppermute(namedax::ppermute(x, "i"_ax, over_i), namedax::axes("i"_ax, "j"_ax), over_both);
    };
    auto started = [&](auto x) {
      auto a = namedax::async::ppermute(x, "i"_ax, over_i);
      auto first = a.wait();
      auto b = namedax::async::ppermute(first, namedax::axes("i"_ax, "j"_ax), over_both);
      return b.wait();
    };
    using namedax::pmap;
    using namedax::vmap;
    const xt::xarray<float> expected = vmap<"i">(vmap<"j">(blocking))(xs);
    CHECK_BITWISE(pmap<"i">(pmap<"j">(blocking))(xs), expected);
    CHECK_BITWISE(vmap<"i">(vmap<"j">(started))(xs), expected);
    CHECK_BITWISE(pmap<"i">(pmap<"j">(started))(xs), expected);
    CHECK_BITWISE(pmap<"i">(vmap<"j">(started))(xs), expected);
    CHECK_BITWISE(vmap<"i">(pmap<"j">(started))(xs), expected);
  }

  TEST_CASE("eight handles may be in flight over one axis; a ninth is an error naming the device and the limit") {
    xt::xarray<float> xs = xt::arange<float>(8).reshape({4, 2});
    auto eight = [](auto x) {
      std::array<namedax::async::handle<decltype(namedax::ppermute(x, "i"_ax, ring(4)))>, 8> hs;
      for (int k = 0; k < 8; ++k) hs[static_cast<std::size_t>(k)] = namedax::async::ppermute(x + float(k), "i"_ax, ring(4));
      auto sum = namedax::eval(x * 0.0f);
      for (auto& h : hs) sum = sum + h.wait();
      return sum;
    };
    auto reference = [](auto x) {
      auto sum = namedax::eval(x * 0.0f);
      for (int k = 0; k < 8; ++k) sum = sum + namedax::ppermute(x + float(k), "i"_ax, ring(4));
      return sum;
    };
    CHECK_BITWISE(namedax::pmap<"i">(eight)(xs), namedax::vmap<"i">(reference)(xs));
    auto nine = [](auto x) {
      std::array<namedax::async::handle<decltype(namedax::ppermute(x, "i"_ax, ring(4)))>, 9> hs;
      for (int k = 0; k < 9; ++k) hs[static_cast<std::size_t>(k)] = namedax::async::ppermute(x, "i"_ax, ring(4));
      for (auto& h : hs) (void)h.wait();
      return x;
    };
    const std::string e = namedax_test::error_of([&] { namedax::pmap<"i">(nine)(xs); });
    INFO(e);
    CHECK(contains(e, "namedax::async::ppermute over ('i',)"));
    CHECK(contains(e, "in flight; at most 8"));
    CHECK(contains(e, "device i="));
  }

  TEST_CASE("a handle dropped without wait is an error naming async ppermute, the axis and the device") {
    xt::xarray<float> xs = xt::arange<float>(8).reshape({4, 2});
    // Only device 2 drops its handle; the others wait for theirs (device 2's block was sent).
    auto f = [](auto x) {
      {
        auto h = namedax::async::ppermute(x, "i"_ax, ring(4));
        if (device_index(4) != 2) return namedax::eval(h.wait());
      }
      return namedax::eval(x);
    };
    const std::string e = namedax_test::error_of([&] { namedax::pmap<"i">(f)(xs); });
    INFO(e);
    CHECK(contains(e, "namedax::async::ppermute over ('i',): a handle was dropped without wait() on device i=2"));
    // Every device drops its handle, and then calls a blocking collective: still one clear error.
    auto g = [](auto x) {
      { auto h = namedax::async::ppermute(x, "i"_ax, ring(4)); }
      return namedax::psum(x, "i"_ax);
    };
    const std::string e2 = namedax_test::error_of([&] { namedax::pmap<"i">(g)(xs); });
    CHECK(contains(e2, "a handle was dropped without wait() on device i="));
    // Under vmap nothing is in flight, but the same program gets the same error.
    const std::string e3 = namedax_test::error_of([&] { namedax::vmap<"i">(g)(xs); });
    CHECK(contains(e3, "namedax::async::ppermute over ('i',): a handle was dropped without wait()"));
    // Moved from, then dropped: no exchange is pending in the moved-from handle.
    auto moved = [](auto x) {
      auto h = namedax::async::ppermute(x, "i"_ax, ring(4));
      auto other = std::move(h);
      CHECK(!h.pending());
      CHECK(other.pending());
      return other.wait();
    };
    CHECK_BITWISE(namedax::pmap<"i">(moved)(xs), namedax::vmap<"i">(moved)(xs));
  }

  TEST_CASE("a second wait on a handle is an error, in both modes") {
    xt::xarray<float> xs = xt::arange<float>(8).reshape({4, 2});
    auto f = [](auto x) {
      auto h = namedax::async::ppermute(x, "i"_ax, ring(4));
      auto first = h.wait();
      return first + h.wait();
    };
    for (const std::string& e : {namedax_test::error_of([&] { namedax::pmap<"i">(f)(xs); }),
                                namedax_test::error_of([&] { namedax::vmap<"i">(f)(xs); })}) {
      INFO(e);
      CHECK(contains(e, "namedax::async::ppermute over ('i',): wait() was called on a handle that holds no exchange"));
    }
    const std::string e = namedax_test::error_of([&] { namedax::pmap<"i">(f)(xs); });
    CHECK(contains(e, "on device i="));
  }

  TEST_CASE("a device that throws while its exchange is in flight: its error reaches the caller, nothing hangs") {
    xt::xarray<float> xs = xt::arange<float>(8).reshape({4, 2});
    for (int thrower = 0; thrower < 4; ++thrower) {
      auto f = [thrower](auto x) {
        auto h = namedax::async::ppermute(x, "i"_ax, ring(4));
        auto h2 = namedax::async::ppermute(x * 2.0f, "i"_ax, ring(4));
        if (device_index(4) == thrower) throw std::runtime_error("thrown while two exchanges are in flight");
        auto a = h.wait();
        auto b = h2.wait();
        // The others go on to a second round, which the thrower never starts.
        auto h3 = namedax::async::ppermute(a + b, "i"_ax, ring(4));
        return h3.wait();
      };
      bool thrown = false;
      try {
        namedax::pmap<"i">(f)(xs);
      } catch (const std::runtime_error& e) {
        thrown = true;
        CHECK(contains(e.what(), "thrown while two exchanges are in flight"));
        CHECK(contains(e.what(), "device i=" + std::to_string(thrower)));
      }
      CHECK(thrown);
    }
  }

  TEST_CASE("waiting for a device that never starts the exchange, or starts a different one, is an error") {
    xt::xarray<float> xs = xt::arange<float>(8).reshape({4, 2});
    // Device 1 returns without starting: device 2 waits for its block.
    auto returns = [](auto x) {
      if (device_index(4) == 1) return namedax::eval(x);
      auto h = namedax::async::ppermute(x, "i"_ax, ring(4));
      return namedax::eval(h.wait());
    };
    const std::string e1 = namedax_test::error_of([&] { namedax::pmap<"i">(returns)(xs); });
    INFO(e1);
    CHECK(contains(e1, "device i=1 returned from the mapped function while device i=2 waits for it in "
                       "namedax::async::ppermute over ('i',)"));
    // Device 1 calls a blocking psum first, the others after the exchange: a deadlock (device 2
    // waits for device 1's block, device 1 for device 2 in psum), reported.
    auto other = [](auto x) {
      if (device_index(4) == 1) {
        auto s = namedax::eval(namedax::psum(x, "i"_ax) + x);
        return namedax::eval(namedax::async::ppermute(s, "i"_ax, ring(4)).wait());
      }
      auto h = namedax::async::ppermute(x, "i"_ax, ring(4));
      auto got = namedax::eval(h.wait());
      return namedax::eval(namedax::psum(got, "i"_ax) + x);
    };
    const std::string e2 = namedax_test::error_of([&] { namedax::pmap<"i">(other)(xs); });
    INFO(e2);
    CHECK(contains(e2, "cannot complete"));
    // Device 3 sends a block of another shape.
    auto shapes = [](auto x) {
      auto y = namedax::eval(namedax::concat(std::tuple{x, x}, 0));
      auto h = device_index(4) == 3 ? namedax::async::ppermute(y, "i"_ax, ring(4))
                                    : namedax::async::ppermute(namedax::eval(x * 1.0f), "i"_ax, ring(4));
      return namedax::eval(h.wait());
    };
    const std::string e3 = namedax_test::error_of([&] { namedax::pmap<"i">(shapes)(xs); });
    INFO(e3);
    CHECK(contains(e3, "different asynchronous calls"));
    // Device 0 receives device 3's block, device 3 receives device 2's: either reports both calls.
    CHECK(contains(e3, "sent a block from async::ppermute over ('i',) with pairs"));
    CHECK(contains(e3, "of payload shape (4,) and type float32"));
    CHECK(contains(e3, "of payload shape (2,) and type float32"));
    // Device 0 receives nothing in its call, but device 3 sends to it.
    auto pairs = [](auto x) {
      auto h = device_index(4) == 0 ? namedax::async::ppermute(x, "i"_ax, {{0, 1}, {1, 2}, {2, 3}})
                                    : namedax::async::ppermute(x, "i"_ax, ring(4));
      return namedax::eval(h.wait());
    };
    // Whichever finds it first, in runs that race differently: device 3 as it sends, device 0 as
    // it passes its slot on, or device 1 as it compares device 0's call with its own.
    for (int run = 0; run < 12; ++run) {
      const std::string e4 = namedax_test::error_of([&] { namedax::pmap<"i">(pairs)(xs); });
      INFO(e4);
      CHECK(contains(e4, "namedax::async::ppermute over ('i',)"));
      CHECK((contains(e4, "receives nothing") ||
             (contains(e4, "different asynchronous calls") && contains(e4, "with pairs ((0, 1), (1, 2), (2, 3)) of"))));
    }
  }

  TEST_CASE("a mismatch of asynchronous calls is final for the map: caught on every device, later exchanges report it") {
    xt::xarray<float> xs = xt::arange<float>(4);
    // Device 2 receives nothing in its call, but device 1 sends to it in the others' ring; devices
    // 0 and 3 take no part in the mismatch. Every device catches what its first exchange throws,
    // then starts a correct one.
    std::array<std::string, 4> later;
    auto f = [&later](auto x) {
      const int d = device_index(4);
      if (d == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));  // device 2 passes its slot on first
      try {
        auto h = d == 2 ? namedax::async::ppermute(x, "i"_ax, {{0, 1}, {1, 0}}) : namedax::async::ppermute(x, "i"_ax, ring(4));
        (void)h.wait();
      } catch (const namedax::collective_error&) {
      }
      try {
        return namedax::eval(namedax::async::ppermute(x, "i"_ax, ring(4)).wait());
      } catch (const namedax::collective_error& e) {
        later[static_cast<std::size_t>(d)] = e.what();
        throw;
      }
    };
    const std::string e = namedax_test::error_of([&] { namedax::pmap<"i">(f)(xs); });
    INFO(e);
    CHECK(contains(e, "namedax::async::ppermute over ('i',)"));
    CHECK(contains(e, "receives nothing"));
    CHECK(!contains(e, "timed out"));
    CHECK(!contains(e, "cannot complete"));
    // A later exchange that fails is aborted with the mismatch as its reason; it is never reported
    // as a mismatch of its own, and never waits for the deadlock report.
    for (std::size_t d = 0; d < 4; ++d) {
      INFO("device ", d, ": ", later[d]);
      if (later[d].empty()) continue;
      CHECK(contains(later[d], "was aborted"));
      CHECK(contains(later[d], "receives nothing"));
      CHECK(!contains(later[d], "cannot complete"));
    }
    // Every device catches what its exchange throws and returns: pmap reports the failure all the
    // same, the mismatch or, if device 3 sees it first, device 2 returning while it waits.
    auto caught = [](auto x) {
      const int d = device_index(4);
      if (d == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      try {
        auto h = d == 2 ? namedax::async::ppermute(x, "i"_ax, {{0, 1}, {1, 0}}) : namedax::async::ppermute(x, "i"_ax, ring(4));
        (void)h.wait();
      } catch (const namedax::collective_error&) {
      }
      return namedax::eval(x);
    };
    const std::string all_caught = namedax_test::error_of([&] { namedax::pmap<"i">(caught)(xs); });
    INFO(all_caught);
    CHECK((contains(all_caught, "receives nothing") ||
           contains(all_caught, "device i=2 returned from the mapped function while device i=3 waits for it")));
  }

  TEST_CASE("bad pairs are an error from the calling thread, before anything is sent") {
    xt::xarray<float> xs = xt::arange<float>(8).reshape({4, 2});
    auto f = [](auto x) { return namedax::async::ppermute(x, "i"_ax, {{0, 1}, {1, 1}}).wait(); };
    for (const std::string& e : {namedax_test::error_of([&] { namedax::pmap<"i">(f)(xs); }),
                                namedax_test::error_of([&] { namedax::vmap<"i">(f)(xs); })}) {
      INFO(e);
      CHECK(contains(e, "destination 1 appears twice"));
    }
  }
}

namespace {

// Fault injection at each point of the exchange, on one device, as tests/test_faults.cpp does
// for the blocking collectives.
struct async_plan {
  fault_point point = fault_point::arrival;
  std::atomic<int> fired{0};
};
async_plan plan;
thread_local bool armed = false;
constexpr const char* point_names[] = {"arrival", "exchanged", "reading", "allocation"};

void inject(fault_point point, std::string_view operation) {
  if (!armed || point != plan.point || !operation.starts_with("async::")) return;
  armed = false;
  ++plan.fired;
  throw std::runtime_error(std::string("injected fault at ") + point_names[static_cast<int>(point)]);
}

}  // namespace

namespace {

// The two orders in which a receiver that drops its handle and the sender of its block may
// meet, forced with the fault points as pauses: the sender posts only once the receiver has
// given up (the slot is marked abandoned, and the sender passes it on), or the receiver gives
// up only once the block was posted (it drops the block).
enum class drop_order { before_the_block, after_the_block };
std::atomic<bool> receiver_dropped{false}, sender_posted{false};
thread_local drop_order sender_role_order = drop_order::before_the_block;
thread_local bool sender_role = false;

void pause_sender(fault_point point, std::string_view operation) {
  if (!sender_role || !operation.starts_with("async::")) return;
  if (point == fault_point::arrival && sender_role_order == drop_order::before_the_block)
    while (!receiver_dropped.load()) std::this_thread::yield();
  if (point == fault_point::exchanged && sender_role_order == drop_order::after_the_block) sender_posted = true;
}

}  // namespace

TEST_SUITE("async") {
  TEST_CASE("a receiver drops its handle before its block is posted, or after: the same error, nothing hangs") {
    namedax::detail::fault_injection() = &pause_sender;
    struct restore {
      ~restore() { namedax::detail::fault_injection() = nullptr; }
    } restore_hook;
    xt::xarray<float> xs = xt::arange<float>(8).reshape({4, 2});
    for (drop_order order : {drop_order::before_the_block, drop_order::after_the_block}) {
      INFO("order ", static_cast<int>(order));
      receiver_dropped = false, sender_posted = false;
      // Device 1 sends to device 2 (the ring d -> d + 1), which drops its handle.
      auto f = [order](auto x) {
        const int d = device_index(4);
        sender_role = d == 1, sender_role_order = order;
        // Dropping the handle throws; the sender is told once the drop has happened.
        struct tell_sender {
          bool dropping;
          ~tell_sender() {
            if (dropping) receiver_dropped = true;
          }
        } tell{d == 2};
        {
          // The handle goes out of scope before the value is returned: clang++ leaks a
          // returned value when a local's destructor throws (llvm-project#12658).
          auto h = namedax::async::ppermute(x, "i"_ax, ring(4));
          if (d != 2) return namedax::eval(h.wait());
          if (order == drop_order::after_the_block)
            while (!sender_posted.load()) std::this_thread::yield();
        }
        return namedax::eval(x);
      };
      const std::string e = namedax_test::error_of([&] { namedax::pmap<"i">(f)(xs); });
      CHECK(contains(e, "namedax::async::ppermute over ('i',): a handle was dropped without wait() on device i=2"));
      CHECK(receiver_dropped.load());
      if (order == drop_order::after_the_block) CHECK(sender_posted.load());
      // The mailbox is usable again: the next map over the same axis gives the blocking bits.
      auto again = [](auto x) { return namedax::async::ppermute(x, "i"_ax, ring(4)).wait(); };
      CHECK_BITWISE(namedax::pmap<"i">(again)(xs), namedax::vmap<"i">(again)(xs));
    }
  }

  TEST_CASE("a device that fails at any point of an async ppermute fails the map cleanly, in any step of a ring") {
    namedax::detail::fault_injection() = &inject;
    struct restore {
      ~restore() { namedax::detail::fault_injection() = nullptr; }
    } restore_hook;
    int runs = 0, faulted = 0;
    // A ring of 3 steps, the next block started before the current one is waited; one leaf, or
    // a pair (two exchanges per handle).
    auto ring_of = [](auto pair, int d, int victim, int step, auto x) {
      auto start = [&](const auto& b) {
        if constexpr (decltype(pair)::value) return namedax::async::ppermute(std::pair{b, b * 2.0f}, "i"_ax, ring(4));
        else return namedax::async::ppermute(b, "i"_ax, ring(4));
      };
      auto block = namedax::eval(x);
      auto next = start(block);
      for (int s = 0; s < 3; ++s) {
        auto h = std::move(next);
        armed = d == victim && s + 1 == step;
        if (s + 1 < 3) next = start(block);
        armed = armed || (d == victim && s == step);
        if constexpr (decltype(pair)::value) block = h.wait().first;
        else block = h.wait();
        armed = false;
      }
      return block;
    };
    for (fault_point point : {fault_point::arrival, fault_point::exchanged, fault_point::reading}) {
      for (int victim : {0, 3}) {
        for (int step : {0, 1, 2}) {
          for (std::size_t length : {std::size_t{3}, std::size_t{3000}}) {
            for (bool pair : {false, true}) {
              plan.point = point;
              plan.fired = 0;
              xt::xarray<float> xs = xt::ones<float>({std::size_t{4}, length});
              std::array<std::atomic<int>, 4> failed{};
              auto f = [&](auto x) {
                const int d = device_index(4);
                try {
                  if (pair) return ring_of(std::true_type{}, d, victim, step, x);
                  return ring_of(std::false_type{}, d, victim, step, x);
                } catch (...) {
                  armed = false;
                  ++failed[static_cast<std::size_t>(d)];
                  throw;
                }
              };
              INFO("point ", point_names[static_cast<int>(point)], ", device ", victim, ", step ", step, ", length ",
                   length, pair ? ", a pair" : ", one leaf");
              bool thrown = false;
              std::string error;
              INFO(error);
              std::optional<xt::xarray<float>> got;
              try {
                got = namedax::pmap<"i">(f)(xs);
              } catch (const std::runtime_error& e) {
                thrown = true;
                error = e.what();
                CHECK(contains(error, "injected fault at "));
              }
              ++runs;
              if (plan.fired == 1) {
                ++faulted;
                CHECK(thrown);
                CHECK(failed[static_cast<std::size_t>(victim)] == 1);
              } else {
                CHECK(!thrown);
                REQUIRE(got.has_value());
                CHECK_BITWISE(*got, xs);  // ones, moved around the ring
              }
            }
          }
        }
      }
    }
    MESSAGE(runs, " runs with a fault armed, ", faulted, " with a fault");
    // A start fails at steps 1 and 2 only (step 0's start comes before the loop); a wait at any.
    CHECK(runs == 72);
    CHECK(faulted == 2 * (2 * 2 * 2 * 2 + 3 * 2 * 2));
  }
}

namespace {

/// Every asynchronous collective against its blocking form on one random array mapped along
/// "i" over n indices: the same type, and the same bits under vmap and pmap. A device computes
/// between start and wait, and starts a second collective before it waits for the first.
template <class T>
void check_collectives_same_as_blocking(std::mt19937& rng, int n) {
  const std::size_t a = std::uniform_int_distribution<std::size_t>(1, 3)(rng);
  const std::size_t b = std::uniform_int_distribution<std::size_t>(0, 4)(rng);
  const std::size_t u = static_cast<std::size_t>(n);
  const auto xs = namedax_test::random_array<T>(rng, {u, u * a, b});
  auto same = [&](auto blocking, auto started) {
    using R = typename decltype(namedax::vmap<"i">(blocking)(xs))::value_type;
    const xt::xarray<R> expected = namedax::vmap<"i">(blocking)(xs);
    CHECK_BITWISE(namedax::pmap<"i">(started)(xs), expected);
    CHECK_BITWISE(namedax::vmap<"i">(started)(xs), expected);
  };
  // `blocking(x)` and `start(x)` for one collective with its arguments.
  auto both = [&](auto blocking, auto start) {
    same(blocking, [=](auto x) {
      auto h = start(x);
      static_assert(std::is_same_v<decltype(h.wait()), decltype(blocking(x))>);
      auto second = start(x * T(1));  // in flight with the first
      auto meanwhile = namedax::eval(x + x);
      (void)meanwhile;
      auto out = h.wait();
      CHECK_BITWISE(second.wait().payload(), out.payload());
      return out;
    });
  };
  both([](auto x) { return namedax::psum(x, "i"_ax); }, [](auto x) { return namedax::async::psum(x, "i"_ax); });
  both([](auto x) { return namedax::pmean(x, "i"_ax); }, [](auto x) { return namedax::async::pmean(x, "i"_ax); });
  both([](auto x) { return namedax::pmax(x, "i"_ax); }, [](auto x) { return namedax::async::pmax(x, "i"_ax); });
  both([](auto x) { return namedax::pmin(x, "i"_ax, {}); }, [](auto x) { return namedax::async::pmin(x, "i"_ax, {}); });
  both([](auto x) { return namedax::all_gather(x, "i"_ax); },
       [](auto x) { return namedax::async::all_gather(x, "i"_ax); });
  both([](auto x) { return namedax::all_gather(x, "i"_ax, {.axis = 1, .tiled = true}); },
       [](auto x) { return namedax::async::all_gather(x, "i"_ax, {.axis = 1, .tiled = true}); });
  both([](auto x) { return namedax::psum_scatter(x, "i"_ax, {.tiled = true}); },
       [](auto x) { return namedax::async::psum_scatter(x, "i"_ax, {.tiled = true}); });
  both([](auto x) { return namedax::all_to_all(x, "i"_ax, 0, 1, {.tiled = true}); },
       [](auto x) { return namedax::async::all_to_all(x, "i"_ax, 0, 1, {.tiled = true}); });
  both([](auto x) { return namedax::pbroadcast(x, "i"_ax, 0); },
       [](auto x) { return namedax::async::pbroadcast(x, "i"_ax, 0); });
  both([](auto x) { return namedax::pdot(x, x, "i"_ax, {{0}, {0}}); },
       [](auto x) { return namedax::async::pdot(x, x, "i"_ax, {{0}, {0}}); });
  const xt::xarray<T> w = namedax_test::random_array<T>(rng, {b, 3});  // plain, the same on every index
  both([w](auto x) { return namedax::pdot(x, w, "i"_ax, {{1}, {0}}); },
       [w](auto x) { return namedax::async::pdot(x, w, "i"_ax, {{1}, {0}}); });
  both([](auto x) { return namedax::pargmax(x, "i"_ax); }, [](auto x) { return namedax::async::pargmax(x, "i"_ax); });
  both([](auto x) { return namedax::pargmin(x, "i"_ax); }, [](auto x) { return namedax::async::pargmin(x, "i"_ax); });
  std::vector<int> perm(u);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  both([perm](auto x) { return namedax::pshuffle(x, "i"_ax, perm); },
       [perm](auto x) { return namedax::async::pshuffle(x, "i"_ax, perm); });
  if (a == 1) {  // the positional dim equals the axis size
    both([](auto x) { return namedax::psum_scatter(x, "i"_ax, {.scatter_dimension = 0}); },
         [](auto x) { return namedax::async::psum_scatter(x, "i"_ax, {.scatter_dimension = 0}); });
    both([](auto x) { return namedax::pswapaxes(x, "i"_ax, 0); },
         [](auto x) { return namedax::async::pswapaxes(x, "i"_ax, 0); });
  }
  if (n == 4) {  // groups: a result typed as varying along the axes
    const namedax::reduce_options pairs{.axis_index_groups = {{0, 2}, {1, 3}}};
    both([pairs](auto x) { return namedax::psum(x, "i"_ax, pairs); },
         [pairs](auto x) { return namedax::async::psum(x, "i"_ax, pairs); });
    both([pairs](auto x) { return namedax::pargmax(x, "i"_ax, pairs); },
         [pairs](auto x) { return namedax::async::pargmax(x, "i"_ax, pairs); });
    const namedax::all_gather_options gathered{.axis_index_groups = {{3, 1}, {0, 2}}, .tiled = true};
    both([gathered](auto x) { return namedax::all_gather(x, "i"_ax, gathered); },
         [gathered](auto x) { return namedax::async::all_gather(x, "i"_ax, gathered); });
  }
}

}  // namespace

TEST_SUITE("async collectives") {
  TEST_CASE("every asynchronous collective gives its blocking form's type and bits under vmap and pmap") {
    std::mt19937 rng(1204);
    for (int trial = 0; trial < 12; ++trial) {
      const int n = std::uniform_int_distribution<int>(1, 5)(rng);
      INFO("trial ", trial, ", n ", n);
      if (trial % 3 == 0) check_collectives_same_as_blocking<float>(rng, n);
      else if (trial % 3 == 1) check_collectives_same_as_blocking<double>(rng, n);
      else check_collectives_same_as_blocking<std::int32_t>(rng, n);
    }
    check_collectives_same_as_blocking<float>(rng, 4);  // with groups
  }

  TEST_CASE("asynchronous collectives of pytrees, in nested maps, and of bools give the blocking bits") {
    const xt::xarray<float> xs = namedax_test::random_array<float>(*std::make_unique<std::mt19937>(7), {4, 3, 5});
    // A pair whose second leaf does not vary along "i" (it meets no device) and a bool sum,
    // which psum reads as int32 (run at start).
    auto blocking = [](auto x) {
      auto [s, m] = namedax::psum(std::pair{x, namedax::pmax(x, "i"_ax)}, "i"_ax);
      auto [g, h] = namedax::all_gather(std::tuple{x, x * 2.0f}, "i"_ax);
      auto count = namedax::psum(x > 0.0f, "i"_ax);
      return namedax::eval(s + m + namedax::sum(g, 0) + namedax::sum(h, 0) + count);
    };
    auto started = [](auto x) {
      auto hp = namedax::async::psum(std::pair{x, namedax::pmax(x, "i"_ax)}, "i"_ax);
      auto hg = namedax::async::all_gather(std::tuple{x, x * 2.0f}, "i"_ax);
      auto hc = namedax::async::psum(x > 0.0f, "i"_ax);
      auto count = hc.wait();
      auto [g, h] = hg.wait();  // waited in another order than started
      auto [s, m] = hp.wait();
      return namedax::eval(s + m + namedax::sum(g, 0) + namedax::sum(h, 0) + count);
    };
    const xt::xarray<float> expected = namedax::vmap<"i">(blocking)(xs);
    CHECK_BITWISE(namedax::pmap<"i">(blocking)(xs), expected);
    CHECK_BITWISE(namedax::pmap<"i">(started)(xs), expected);
    CHECK_BITWISE(namedax::vmap<"i">(started)(xs), expected);
    // Over a device axis and a vectorized one at once: "j" is read in place, "i" from the blocks.
    auto both_axes = [](auto x) {
      auto h = namedax::async::psum(x, namedax::axes("i"_ax, "j"_ax));
      auto g = namedax::async::all_gather(x, namedax::axes("j"_ax, "i"_ax));
      return namedax::eval(h.wait() + namedax::sum(g.wait(), 0));
    };
    auto both_blocking = [](auto x) {
      return namedax::eval(namedax::psum(x, namedax::axes("i"_ax, "j"_ax)) +
                           namedax::sum(namedax::all_gather(x, namedax::axes("j"_ax, "i"_ax)), 0));
    };
    const xt::xarray<float> nested = namedax::vmap<"i">(namedax::vmap<"j">(both_blocking))(xs);
    CHECK_BITWISE(namedax::pmap<"i">(namedax::vmap<"j">(both_axes))(xs), nested);
    CHECK_BITWISE(namedax::vmap<"i">(namedax::pmap<"j">(both_axes))(xs), nested);
    CHECK_BITWISE(namedax::pmap<"i">(namedax::pmap<"j">(both_axes))(xs), nested);
  }

  TEST_CASE("a large asynchronous reduction is folded once: every device's result is one shared array") {
    // 300 000 floats per device: the size from which the blocking reduction folds in chunks.
    std::mt19937 rng(1206);
    const std::size_t n = 4;
    const xt::xarray<float> xs = namedax_test::random_array<float>(rng, {n, 3, 100000});
    std::array<const void*, n> seen{};
    auto started = [&](auto x) {
      auto hs = namedax::async::psum(x, "i"_ax);
      auto hm = namedax::async::pmean(x, "i"_ax);
      auto hx = namedax::async::pmax(std::pair{x, x * 2.f}, "i"_ax);
      auto [big, twice] = hx.wait();  // waited in reverse order: each wait folds its own call
      auto mean = hm.wait();
      auto sum = hs.wait();
      seen[static_cast<std::size_t>(device_index(static_cast<int>(n)))] = sum.payload().data();
      return std::tuple{sum, mean, big, twice};
    };
    auto blocking = [](auto x) {
      return std::tuple{namedax::psum(x, "i"_ax), namedax::pmean(x, "i"_ax), namedax::pmax(x, "i"_ax),
                        namedax::pmax(x * 2.f, "i"_ax)};
    };
    const auto [s, m, b, t] = namedax::pmap<"i">(started)(xs);
    const auto [es, em, eb, et] = namedax::vmap<"i">(blocking)(xs);
    CHECK_BITWISE(s, es);
    CHECK_BITWISE(m, em);
    CHECK_BITWISE(b, eb);
    CHECK_BITWISE(t, et);
    CHECK(seen[0] != nullptr);
    for (std::size_t d = 1; d < n; ++d) CHECK(seen[d] == seen[0]);
    // Below that size each device folds its own (the pieces would cost more than they save),
    // with the same bits.
    const xt::xarray<float> small = namedax_test::random_array<float>(rng, {n, 7});
    auto small_sum = [](auto x) { return namedax::async::psum(x, "i"_ax).wait(); };
    CHECK_BITWISE(namedax::pmap<"i">(small_sum)(small), namedax::vmap<"i">(small_sum)(small));
  }

  TEST_CASE("async::pargmax and pargmin with ties, NaN and signed zeros, over device and vectorized axes at once") {
    // Values from a small set, so that indices tie, some hold NaN, and +0 meets -0.
    std::mt19937 rng(1205);
    const float pick[] = {-1.f, 0.f, -0.f, 2.f, 2.f, std::nanf("")};
    xt::xarray<float> xs = xt::xarray<float>::from_shape({4, 3, 6});
    for (auto& v : xs) v = pick[std::uniform_int_distribution<int>(0, 5)(rng)];
    // JAX's semantics by hand: the lowest index holding the extreme; the largest int32 where any
    // index holds a NaN.
    auto by_hand = [&](bool max) {
      xt::xarray<std::int32_t> r = xt::xarray<std::int32_t>::from_shape({3, 6});
      for (std::size_t c = 0; c < 3; ++c)
        for (std::size_t d = 0; d < 6; ++d) {
          std::int32_t at = 0;
          bool nan = false;
          for (std::size_t i = 0; i < 4; ++i) {
            const float v = xs(i, c, d), best = xs(at, c, d);
            nan = nan || std::isnan(v);
            if (max ? best < v : v < best) at = static_cast<std::int32_t>(i);
          }
          r(c, d) = nan ? std::numeric_limits<std::int32_t>::max() : at;
        }
      return r;
    };
    const auto max_by_hand = by_hand(true), min_by_hand = by_hand(false);
    REQUIRE(xt::any(xt::equal(max_by_hand, std::numeric_limits<std::int32_t>::max())));  // NaN reached
    auto flat = [](auto x) {
      auto hmax = namedax::async::pargmax(x, "i"_ax);
      auto hmin = namedax::async::pargmin(x, "i"_ax);
      auto min = hmin.wait();  // in the other order than started
      return std::pair{hmax.wait(), min};
    };
    auto flat_blocking = [](auto x) { return std::pair{namedax::pargmax(x, "i"_ax), namedax::pargmin(x, "i"_ax)}; };
    for (const auto& [max, min] : {namedax::vmap<"i">(flat_blocking)(xs), namedax::pmap<"i">(flat)(xs),
                                   namedax::vmap<"i">(flat)(xs)}) {
      CHECK_BITWISE(max, xt::xarray<std::int32_t>(xt::broadcast(max_by_hand, {4, 3, 6})));
      CHECK_BITWISE(min, xt::xarray<std::int32_t>(xt::broadcast(min_by_hand, {4, 3, 6})));
    }
    // A pytree over ("i", "j"): "i" among devices or vectorized, "j" the other way or the same.
    auto nested_blocking = [](auto x) { return namedax::pargmax(std::pair{x, -x}, namedax::axes("i"_ax, "j"_ax)); };
    auto nested = [](auto x) { return namedax::async::pargmax(std::pair{x, -x}, namedax::axes("i"_ax, "j"_ax)).wait(); };
    const auto expected = namedax::vmap<"i">(namedax::vmap<"j">(nested_blocking))(xs);
    for (const auto& [a, b] : {namedax::pmap<"i">(namedax::vmap<"j">(nested))(xs),
                               namedax::vmap<"i">(namedax::pmap<"j">(nested))(xs),
                               namedax::pmap<"i">(namedax::pmap<"j">(nested))(xs)}) {
      CHECK_BITWISE(a, expected.first);
      CHECK_BITWISE(b, expected.second);
    }
  }

  TEST_CASE("async::pgather gives pgather's bits: a plain idx, an idx varying along the axis, one of an inner map") {
    std::mt19937 rng(1206);
    const auto table = namedax_test::random_array<float>(rng, {4, 3, 2});  // 4 shards x 3 rows x 2
    const xt::xarray<int> ids{5, 0, 11, 12, 3};                              // 12 is out of range: NaN
    auto lookup = [&](auto shard) { return namedax::pgather(shard, ids, namedax::axes("shard"_ax, 0)); };
    auto started = [&](auto shard) {
      auto h = namedax::async::pgather(shard, ids, namedax::axes("shard"_ax, 0));
      auto meanwhile = namedax::eval(shard * 2.f);
      static_assert(std::is_same_v<decltype(h.wait()), decltype(lookup(shard))>);
      (void)meanwhile;
      return h.wait();
    };
    const xt::xarray<float> expected = namedax::vmap<"shard">(lookup)(table);
    REQUIRE(std::isnan(expected(0, 3, 0)));
    CHECK_BITWISE(namedax::pmap<"shard">(started)(table), expected);
    CHECK_BITWISE(namedax::vmap<"shard">(started)(table), expected);

    // Each index reads with its own idx, taken at the start: rebinding it before wait() changes nothing.
    const xt::xarray<int> own{{3, 0}, {0, 1}, {2, 2}, {1, 3}};
    auto each = [](auto s, auto i) { return namedax::pgather(s, i, "shard"_ax); };
    auto each_started = [](auto s, auto i) {
      auto index = namedax::eval(i);
      auto h = namedax::async::pgather(s, index, "shard"_ax);
      index += 1;
      return h.wait();
    };
    const xt::xarray<float> own_expected = namedax::vmap<"shard">(each)(table, own);
    CHECK_BITWISE(namedax::pmap<"shard">(each_started)(table, own), own_expected);
    CHECK_BITWISE(namedax::vmap<"shard">(each_started)(table, own), own_expected);

    // idx from an inner map, src from the outer one: run at the start, the same bits.
    const xt::xarray<int> inner_ids{{0, 3}, {2, 1}};
    auto nested = [&](bool async) {
      return [&, async](auto s) {
        auto inner = [async](auto outer, auto i) {
          if (async) return namedax::async::pgather(outer, i, "shard"_ax).wait();
          return namedax::pgather(outer, i, "shard"_ax);
        };
        return namedax::vmap<"j">(inner, std::tuple{namedax::none, 0})(s, inner_ids);
      };
    };
    const xt::xarray<float> nested_expected = namedax::vmap<"shard">(nested(false))(table);
    CHECK_BITWISE(namedax::pmap<"shard">(nested(true))(table), nested_expected);
    CHECK_BITWISE(namedax::vmap<"shard">(nested(true))(table), nested_expected);
  }

  TEST_CASE("asynchronous collectives misused: dropped, waited twice, a device that never starts, different calls") {
    xt::xarray<float> xs = xt::arange<float>(8).reshape({4, 2});
    auto dropped = [](auto x) {
      { auto h = namedax::async::all_gather(x, "i"_ax); }
      return namedax::psum(x, "i"_ax);
    };
    for (const std::string& e : {namedax_test::error_of([&] { namedax::pmap<"i">(dropped)(xs); }),
                                namedax_test::error_of([&] { namedax::vmap<"i">(dropped)(xs); })}) {
      INFO(e);
      CHECK(contains(e, "namedax::async::all_gather over ('i',): a handle was dropped without wait()"));
    }
    auto twice = [](auto x) {
      auto h = namedax::async::psum(x, "i"_ax);
      auto first = h.wait();
      return first + h.wait();
    };
    for (const std::string& e : {namedax_test::error_of([&] { namedax::pmap<"i">(twice)(xs); }),
                                namedax_test::error_of([&] { namedax::vmap<"i">(twice)(xs); })}) {
      INFO(e);
      CHECK(contains(e, "namedax::async::psum over ('i',): wait() was called on a handle that holds no exchange"));
    }
    auto returns = [](auto x) {
      if (device_index(4) == 1) return namedax::eval(x);
      return namedax::eval(namedax::async::psum_scatter(x, "i"_ax, {.tiled = true}).wait());
    };
    const std::string e1 = namedax_test::error_of([&] { namedax::pmap<"i">(returns)(xs); });
    INFO(e1);
    CHECK(contains(e1, "device i=1 returned from the mapped function while device i="));
    CHECK(contains(e1, "namedax::async::psum_scatter over ('i',)"));
    // Device 2 gathers along another axis: the receivers compare the calls.
    auto differs = [](auto x) {
      auto h = device_index(4) == 2 ? namedax::async::all_gather(x, "i"_ax, {.axis = 1})
                                    : namedax::async::all_gather(x, "i"_ax);
      return namedax::eval(namedax::sum(h.wait()));
    };
    const std::string e2 = namedax_test::error_of([&] { namedax::pmap<"i">(differs)(xs); });
    INFO(e2);
    CHECK(contains(e2, "different asynchronous calls"));
    CHECK(contains(e2, "async::all_gather over ('i',) at axis 1"));
    // Device 1 gathers along "i" and dim 0, the others along "i" alone: the same blocks travel,
    // and the receivers tell the calls apart by the dims, as the blocking pgather's devices do.
    auto other_dims = [](auto x) {
      const xt::xarray<int> at{1};
      if (device_index(4) == 1)
        return namedax::eval(namedax::sum(namedax::async::pgather(x, at, namedax::axes("i"_ax, 0)).wait()));
      return namedax::eval(namedax::sum(namedax::async::pgather(x, at, "i"_ax).wait()));
    };
    const std::string e4 = namedax_test::error_of([&] { namedax::pmap<"i">(other_dims)(xs); });
    INFO(e4);
    CHECK(contains(e4, "different asynchronous calls"));
    CHECK(contains(e4, "along dims (0"));
    // A bad option is reported by every device's wait, as the blocking collective reports it.
    auto bad = [](auto x) { return namedax::async::psum_scatter(x, "i"_ax, {.scatter_dimension = 3}).wait(); };
    const std::string e3 = namedax_test::error_of([&] { namedax::pmap<"i">(bad)(xs); });
    INFO(e3);
    CHECK(contains(e3, "scatter_dimension"));
  }

  TEST_CASE("a device that fails at any point of an asynchronous all-reduce, gather, all_to_all, pargmax, pgather or ragged exchange fails the map") {
    namedax::detail::fault_injection() = &inject;
    struct restore {
      ~restore() { namedax::detail::fault_injection() = nullptr; }
    } restore_hook;
    int faulted = 0;
    for (fault_point point : {fault_point::arrival, fault_point::exchanged, fault_point::reading}) {
      for (int victim : {0, 3}) {
        for (int verb = 0; verb < 7; ++verb) {
          plan.point = point;
          plan.fired = 0;
          const xt::xarray<float> xs = xt::ones<float>({std::size_t{4}, std::size_t{8}});
          std::array<std::atomic<int>, 4> failed{};
          auto f = [&](auto x) {
            const int d = device_index(4);
            auto start = [&](auto v) {
              // Each typed as varying along "i", as the all_to_all's result is.
              if (verb == 0) return namedax::eval(v + namedax::async::psum(v, "i"_ax).wait());
              if (verb == 1) return namedax::eval(v + namedax::sum(namedax::async::all_gather(v, "i"_ax).wait(), 0));
              if (verb == 2) return namedax::eval(v + namedax::async::all_to_all(v, "i"_ax, 0, 0, {.tiled = true}).wait() * 4.0f);
              if (verb == 3) return namedax::eval(v + namedax::cast<float>(namedax::async::pargmax(v, "i"_ax).wait()));
              if (verb == 4) {
                const xt::xarray<int> rows{1, 30};
                return namedax::eval(v + namedax::sum(namedax::async::pgather(v, rows, namedax::axes("i"_ax, 0)).wait(), 0));
              }
              if (verb == 5) {  // row e of every index to row e of index e (the last sender wins)
                const xt::xarray<int> at{0, 1, 2, 3}, one{1, 1, 1, 1};
                return namedax::eval(v + namedax::async::ragged_all_to_all(v, v, at, one, at, one, "i"_ax).wait());
              }
              const xt::xarray<int> count(3);  // a 0-d array: each index sends its first 3 rows
              return namedax::eval(v + namedax::sum(namedax::async::all_gather_v(v, count, "i"_ax).wait(), 0));
            };
            try {
              armed = d == victim;
              auto out = start(x);
              armed = false;
              return out;
            } catch (...) {
              armed = false;
              ++failed[static_cast<std::size_t>(d)];
              throw;
            }
          };
          INFO("point ", point_names[static_cast<int>(point)], ", device ", victim, ", verb ", verb);
          bool thrown = false;
          try {
            namedax::pmap<"i">(f)(xs);
          } catch (const std::runtime_error& e) {
            thrown = true;
            CHECK(contains(e.what(), "injected fault at "));
          }
          CHECK(plan.fired == 1);
          CHECK(thrown);
          CHECK(failed[static_cast<std::size_t>(victim)] == 1);
          faulted += plan.fired;
        }
      }
    }
    CHECK(faulted == 3 * 2 * 7);
  }
}

namespace {

/// What a child process of this test program wrote to stderr, and how it ended.
struct child_outcome {
  std::string err;
  int status = 0;
  bool timed_out = false;
};

#if defined(__linux__)
/// Runs this test program again (its own executable) on the one skipped test case `test_case`,
/// with NAMEDAX_TEST_CHILD=`mode` in its environment: a fresh process, so that what it does
/// (end by std::terminate) touches neither this process nor its TBB threads, which a fork()
/// would copy half-alive. Its stderr comes back through a pipe; its stdout (doctest's report)
/// is dropped. A child still running after a minute is killed and reported as timed out.
child_outcome run_child(const std::string& test_case, const std::string& mode) {
  std::vector<std::string> env_text;
  for (char** e = environ; *e; ++e)
    if (!std::string_view(*e).starts_with("NAMEDAX_TEST_CHILD=")) env_text.emplace_back(*e);
  env_text.push_back("NAMEDAX_TEST_CHILD=" + mode);
  std::vector<char*> envp;
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string arg0 = "namedax_tests", arg1 = "--no-skip", arg2 = "--test-case=" + test_case;
  std::array<char*, 4> argv{arg0.data(), arg1.data(), arg2.data(), nullptr};

  child_outcome out;
  int fds[2];
  REQUIRE(pipe2(fds, O_CLOEXEC) == 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);  // dup2 clears O_CLOEXEC
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  REQUIRE(spawned == 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  char buffer[4096];
  for (;;) {
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      const ssize_t n = read(fds[0], buffer, sizeof buffer);
      if (n <= 0) break;  // end of file: the child is gone
      out.err.append(buffer, static_cast<std::size_t>(n));
    } else if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      out.timed_out = true;
      break;
    }
  }
  close(fds[0]);
  waitpid(pid, &out.status, 0);
  return out;
}
#endif

std::size_t count_of(const std::string& text, const std::string& part) {
  std::size_t n = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

/// Calls std::terminate while an exception unwinds past it: an exception in flight, none active
/// (through a pointer the optimizer cannot follow, which would otherwise let the compiler end
/// the program its own way).
struct terminates_when_destroyed {
  ~terminates_when_destroyed() {
    void (*volatile end)() = std::terminate;
    end();
  }
};

}  // namespace

TEST_SUITE("async") {
  // Run only by the test below, in a child process of its own (skipped in a plain run).
  TEST_CASE("child process: pending handles in a std::vector dropped" * doctest::skip()) {
    const char* mode = std::getenv("NAMEDAX_TEST_CHILD");
    if (!mode) return;
    std::signal(SIGABRT, SIG_DFL);  // doctest's handler would report a crash before the abort
    xt::xarray<float> xs = xt::arange<float>(8).reshape({4, 2});
    const std::string m = mode;
    if (m == "pmap") {
      // Device 2 keeps its pending handles in a std::vector, whose destructor may not throw;
      // the others wait on theirs (device 2 left its blocks at the start).
      namedax::pmap<"i">([](auto x) {
        std::vector<decltype(namedax::async::psum(x, "i"_ax))> hs;
        hs.push_back(namedax::async::psum(x, "i"_ax));
        hs.push_back(namedax::async::psum(x * 2.0f, "i"_ax));
        if (device_index(4) != 2)
          for (auto& h : hs) (void)h.wait();
        return namedax::eval(x);
      })(xs);
    } else if (m == "vmap" || m == "catch") {
      auto drops = [](auto x) {
        std::vector<decltype(namedax::async::psum(x, "i"_ax))> hs;
        hs.push_back(namedax::async::psum(x, "i"_ax));
        return namedax::eval(x);
      };
      if (m == "vmap") namedax::vmap<"i">(drops)(xs);
      // In a catch block, the exception it handles is the active one, not the handle's.
      try {
        throw std::runtime_error("handled");
      } catch (const std::runtime_error&) {
        namedax::vmap<"i">(drops)(xs);
      }
    } else if (m == "stale") {
      // A dropped handle's error, caught and gone, is not reported when the program later
      // ends for another reason, even with another exception in flight.
      const std::string e = namedax_test::error_of([&] {
        namedax::vmap<"i">([](auto x) {
          { auto h = namedax::async::psum(x, "i"_ax); }
          return namedax::eval(x);
        })(xs);
      });
      if (!contains(e, "a handle was dropped without wait()")) std::exit(3);
      try {
        terminates_when_destroyed t;
        throw std::runtime_error("another error");
      } catch (...) {
      }
    }
  }

  TEST_CASE("a pending handle dropped by a std::vector ends the program with a namedax line that names it") {
#if defined(__linux__)
    const std::string line = "namedax: terminating: namedax::async::psum over ('i',): a handle was dropped without "
                             "wait()";
    const std::string rest = "; call wait() on every handle an asynchronous collective returns (thrown by a "
                             "destructor where no exception may leave, such as a std::vector's: keep many handles in "
                             "a namedax::async::handles)\n";
    const std::string child = "child process: pending handles in a std::vector dropped";
    for (const std::string mode : {"pmap", "vmap", "catch", "stale"}) {
      INFO("mode ", mode);
      const child_outcome c = run_child(child, mode);
      INFO("the child's stderr: ", c.err);
      CHECK(!c.timed_out);
      REQUIRE(WIFSIGNALED(c.status));
      CHECK(WTERMSIG(c.status) == SIGABRT);
      if (mode == "pmap") {
        CHECK(contains(c.err, line + " on device i=2" + rest));
        CHECK(count_of(c.err, "namedax: terminating:") == 1);
      } else if (mode == "vmap" || mode == "catch") {
        CHECK(contains(c.err, line + rest));
        CHECK(count_of(c.err, "namedax: terminating:") == 1);
      } else {
        CHECK(!contains(c.err, "namedax:"));
      }
    }
#else
    MESSAGE("runs a child process through /proc/self/exe: Linux only");
#endif
  }

  TEST_CASE("async::handles: wait_all gives the blocking collectives' bits, in the order started") {
    std::mt19937 rng(37);
    const auto xs = namedax_test::random_array<float>(rng, {4, 3});
    std::array<std::size_t, 4> sizes{};
    auto started = [&](auto x) {
      namedax::async::handles<decltype(namedax::psum(x, "i"_ax))> hs;
      for (int k = 0; k < 3; ++k) hs.push_back(namedax::async::psum(x * (k + 1.0f), "i"_ax));
      auto sums = hs.wait_all();
      sizes[static_cast<std::size_t>(device_index(4))] = sums.size() * 10 + hs.size();  // 3 results, none held
      namedax::async::handles<decltype(namedax::ppermute(x, "i"_ax, ring(4)))> ring_steps;
      ring_steps.push_back(namedax::async::ppermute(x, "i"_ax, ring(4)));
      ring_steps.push_back(namedax::async::ppermute(x + 1.0f, "i"_ax, ring(4)));
      auto shifted = ring_steps.wait_all();
      return std::tuple{sums[0], sums[1], sums[2], shifted[0], shifted[1]};
    };
    auto blocking = [](auto x) {
      return std::tuple{namedax::psum(x * 1.0f, "i"_ax), namedax::psum(x * 2.0f, "i"_ax),
                        namedax::psum(x * 3.0f, "i"_ax), namedax::ppermute(x, "i"_ax, ring(4)),
                        namedax::ppermute(x + 1.0f, "i"_ax, ring(4))};
    };
    const auto expected = namedax::vmap<"i">(blocking)(xs);
    CHECK(namedax_test::tree_bitwise_equal(namedax::pmap<"i">(started)(xs), expected));
    CHECK(sizes == std::array<std::size_t, 4>{30, 30, 30, 30});
    CHECK(namedax_test::tree_bitwise_equal(namedax::vmap<"i">([](auto x) {
      namedax::async::handles<decltype(namedax::psum(x, "i"_ax))> hs;
      for (int k = 0; k < 3; ++k) hs.push_back(namedax::async::psum(x * (k + 1.0f), "i"_ax));
      auto sums = hs.wait_all();
      return std::tuple{sums[0], sums[1], sums[2], namedax::ppermute(x, "i"_ax, ring(4)),
                        namedax::ppermute(x + 1.0f, "i"_ax, ring(4))};
    })(xs), expected));
  }

  TEST_CASE("async::handles dropped with handles pending: one collective_error naming the count and the first, nothing hangs") {
    xt::xarray<float> xs = xt::arange<float>(8).reshape({4, 2});
    auto expected_error = [](const std::string& counts, const std::string& first) {
      return "namedax::async::handles: " + counts + " handles were dropped without wait(), the first " + first +
             "; call wait_all() (or wait() on each handle) before they go away";
    };
    // Every device waits on its first handle and drops two: each catches exactly one error,
    // naming the first handle not waited (a pmax), then goes on with a blocking psum and a
    // second round of handles: the mailboxes were left usable.
    std::array<std::string, 4> errors;
    std::array<int, 4> caught{};
    bool on_devices = true;
    auto each_drops = [&](auto x) {
      const int d = on_devices ? device_index(4) : 0;
      try {
        namedax::async::handles<decltype(namedax::psum(x, "i"_ax))> hs;
        hs.push_back(namedax::async::psum(x, "i"_ax));
        hs.push_back(namedax::async::pmax(x, "i"_ax));
        hs.push_back(namedax::async::pmin(x, "i"_ax));
        (void)hs[0].wait();
      } catch (const namedax::collective_error& e) {
        ++caught[static_cast<std::size_t>(d)];
        errors[static_cast<std::size_t>(d)] = e.what();
      }
      namedax::async::handles<decltype(namedax::psum(x, "i"_ax))> again;
      again.push_back(namedax::async::psum(x * 3.0f, "i"_ax));
      return namedax::psum(x, "i"_ax) + again.wait_all()[0];
    };
    const xt::xarray<float> expected =
        namedax::vmap<"i">([](auto x) { return namedax::psum(x, "i"_ax) + namedax::psum(x * 3.0f, "i"_ax); })(xs);
    CHECK_BITWISE(namedax::pmap<"i">(each_drops)(xs), expected);
    for (int d = 0; d < 4; ++d) {
      CHECK(caught[static_cast<std::size_t>(d)] == 1);
      CHECK(errors[static_cast<std::size_t>(d)] ==
            expected_error("2 of 3", "namedax::async::pmax over ('i',) on device i=" + std::to_string(d)));
    }
    caught = {}, errors = {}, on_devices = false;
    CHECK_BITWISE(namedax::vmap<"i">(each_drops)(xs), expected);
    CHECK(caught[0] == 1);
    CHECK(errors[0] == expected_error("2 of 3", "namedax::async::pmax over ('i',)"));

    // Only device 2 drops its three handles, uncaught; the others wait on theirs (its blocks
    // were left at the start): the map reports device 2's one error, and nobody hangs.
    auto one_drops = [](auto x) {
      {
        namedax::async::handles<decltype(namedax::psum(x, "i"_ax))> hs;
        for (int k = 0; k < 3; ++k) hs.push_back(namedax::async::psum(x * (k + 1.0f), "i"_ax));
        if (device_index(4) != 2) return namedax::eval(hs.wait_all()[2]);
      }
      return namedax::eval(namedax::psum(x, "i"_ax));
    };
    const std::string e = namedax_test::error_of([&] { namedax::pmap<"i">(one_drops)(xs); });
    CHECK(e == expected_error("3 of 3", "namedax::async::psum over ('i',) on device i=2"));
    // The mailboxes are usable again: the next map gives the blocking bits.
    auto again = [](auto x) {
      namedax::async::handles<decltype(namedax::psum(x, "i"_ax))> hs;
      hs.push_back(namedax::async::psum(x, "i"_ax));
      return hs.wait_all()[0];
    };
    CHECK_BITWISE(namedax::pmap<"i">(again)(xs), namedax::vmap<"i">([](auto x) { return namedax::psum(x, "i"_ax); })(xs));

    // Assigned over while pending: the same one error; moved from: nothing to report.
    auto assigned = [](auto x) {
      namedax::async::handles<decltype(namedax::psum(x, "i"_ax))> hs, other;
      hs.push_back(namedax::async::psum(x, "i"_ax));
      other.push_back(namedax::async::psum(x * 2.0f, "i"_ax));
      auto moved = std::move(other);
      CHECK(other.empty());
      hs = std::move(moved);
      return namedax::eval(x);
    };
    CHECK(namedax_test::error_of([&] { namedax::vmap<"i">(assigned)(xs); }) ==
          expected_error("1 of 1", "namedax::async::psum over ('i',)"));

    // An exception unwinding past pending handles is the error reported, not the handles.
    auto throws = [](auto x) {
      namedax::async::handles<decltype(namedax::psum(x, "i"_ax))> hs;
      hs.push_back(namedax::async::psum(x, "i"_ax));
      hs.push_back(namedax::async::psum(x, "i"_ax));
      if (device_index(4) == 1) throw std::runtime_error("thrown with two handles pending");
      return hs.wait_all()[1];
    };
    for (int mode = 0; mode < 2; ++mode) {
      std::string thrown = "no error";
      try {
        if (mode == 0) namedax::pmap<"i">(throws)(xs);
        else namedax::vmap<"i">([](auto x) {
          namedax::async::handles<decltype(namedax::psum(x, "i"_ax))> hs;
          hs.push_back(namedax::async::psum(x, "i"_ax));
          hs.push_back(namedax::async::psum(x, "i"_ax));
          throw std::runtime_error("thrown with two handles pending");
          return hs.wait_all()[0];  // never reached
        })(xs);
      } catch (const std::runtime_error& ex) {
        thrown = ex.what();
      }
      INFO("mode ", mode, ": ", thrown);
      CHECK(contains(thrown, "thrown with two handles pending"));
      CHECK(!contains(thrown, "namedax::async::handles"));
    }

    // wait_all on a handle waited already: that wait's error, the others cancelled silently.
    auto waited_twice = [](auto x) {
      namedax::async::handles<decltype(namedax::psum(x, "i"_ax))> hs;
      hs.push_back(namedax::async::psum(x, "i"_ax));
      hs.push_back(namedax::async::psum(x, "i"_ax));
      (void)hs[0].wait();
      return hs.wait_all()[1];
    };
    for (const std::string& e2 : {namedax_test::error_of([&] { namedax::pmap<"i">(waited_twice)(xs); }),
                                 namedax_test::error_of([&] { namedax::vmap<"i">(waited_twice)(xs); })}) {
      INFO(e2);
      CHECK(contains(e2, "namedax::async::psum over ('i',): wait() was called on a handle that holds no exchange"));
      CHECK(!contains(e2, "namedax::async::handles"));
    }
    CHECK_BITWISE(namedax::pmap<"i">(again)(xs), namedax::vmap<"i">(again)(xs));
  }
}
