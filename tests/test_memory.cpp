// SPDX-License-Identifier: MIT
// Heap use of device collectives, measured by replacing the global operator new: a program of
// its own, since the replacement applies to the whole program.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "test_support.hpp"

#include <atomic>
#include <cstdlib>
#include <new>

using namespace namedax::literals;

namespace {

std::atomic<std::size_t> live_bytes{0}, peak_bytes{0};
// Allocations made by this thread, and the largest of them since it was last reset.
thread_local std::size_t allocations_here = 0, largest_here = 0;

// Each block carries its size in a header as large as the strictest alignment.
constexpr std::size_t header = alignof(std::max_align_t);

/// Raises `maximum` to `value` if it is larger, whichever threads race to raise it.
void raise_to(std::atomic<std::size_t>& maximum, std::size_t value) {
  for (std::size_t seen = maximum.load(); value > seen && !maximum.compare_exchange_weak(seen, value);) {
  }
}

void* counted_allocate(std::size_t n) {
  auto* block = static_cast<unsigned char*>(std::malloc(n + header));
  if (!block) throw std::bad_alloc();
  *reinterpret_cast<std::size_t*>(block) = n;
  ++allocations_here;
  largest_here = std::max(largest_here, n);
  raise_to(peak_bytes, live_bytes.fetch_add(n) + n);
  return block + header;
}

void counted_free(void* p) noexcept {
  if (!p) return;
  auto* block = static_cast<unsigned char*>(p) - header;
  live_bytes.fetch_sub(*reinterpret_cast<std::size_t*>(block));
  std::free(block);
}

/// The largest heap growth, in bytes, while `f` runs.
template <class F>
std::size_t peak_growth(F&& f) {
  const std::size_t before = live_bytes.load();
  peak_bytes.store(before);
  f();
  return peak_bytes.load() - before;
}

/// The elements per device of the 8 x 64 MiB measurements: 64 MiB of float.
constexpr std::size_t async_n = (std::size_t{64} << 20) / sizeof(float);

/// The 8 x 64 MiB input of those measurements: element k is k % 1024.
xt::xarray<float> eight_devices_of_64_mib() {
  xt::xarray<float> x = xt::xarray<float>::from_shape({std::size_t{8}, async_n});
  for (std::size_t k = 0; k < x.size(); ++k) x.data()[k] = static_cast<float>(k % 1024);
  return x;
}

/// pmap over 8 devices of 64 MiB each of `start(operand).wait()`: checks the peak heap growth
/// against `bound` times the data and returns the output.
template <class Start>
xt::xarray<float> async_peak(const std::string& what, double bound, Start start) {
  const xt::xarray<float> x = eight_devices_of_64_mib();
  const double data = static_cast<double>(x.size() * sizeof(float));
  xt::xarray<float> out;
  const std::size_t peak = peak_growth([&] { out = namedax::pmap<"i">([&](auto v) { return start(v).wait(); })(x); });
  MESSAGE(what, ", 8 x 64 MiB: peak heap growth ", peak >> 20, " MiB = ", peak / data, " x the data");
  CHECK(peak / data < bound);
  return out;
}

}  // namespace

void* operator new(std::size_t n) { return counted_allocate(n); }
void* operator new[](std::size_t n) { return counted_allocate(n); }
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_free(p); }

TEST_SUITE("memory") {
  TEST_CASE("8 devices x 64 MiB: psum, psum_scatter and all_to_all need no copies beyond their outputs") {
    constexpr std::size_t devices = 8, per_device = 64 << 20, n = async_n;
    const xt::xarray<float> x = eight_devices_of_64_mib();
    const double data = static_cast<double>(devices * per_device);

    // psum: one result (64 MiB) that all 8 devices share, and the stacked output (8 x 64 MiB):
    // 1.125x the data.
    xt::xarray<float> out;
    const std::size_t psum_peak = peak_growth([&] { out = namedax::pmap<"i">([](auto v) { return namedax::psum(v, "i"_ax); })(x); });
    CHECK(out(7, n - 1) == 8.0f * static_cast<float>((n - 1) % 1024));
    MESSAGE("psum, 8 x 64 MiB: peak heap growth ", psum_peak >> 20, " MiB = ", psum_peak / data, " x the data");
    CHECK(psum_peak / data < 1.15);
    out = xt::xarray<float>();

    // A reduce-scatter: each device keeps an eighth, so the outputs are small.
    const std::size_t scatter_peak = peak_growth(
        [&] { out = namedax::pmap<"i">([](auto v) { return namedax::psum_scatter(v, "i"_ax, {.tiled = true}); })(x); });
    CHECK(out.shape() == std::vector<std::size_t>{devices, n / devices});
    MESSAGE("psum_scatter, 8 x 64 MiB: peak heap growth ", scatter_peak >> 20, " MiB = ", scatter_peak / data, " x the data");
    CHECK(scatter_peak / data < 0.30);
    out = xt::xarray<float>();

    // all_to_all moves every element once: outputs only.
    const std::size_t a2a_peak =
        peak_growth([&] { out = namedax::pmap<"i">([](auto v) { return namedax::all_to_all(v, "i"_ax, 0, 0, {.tiled = true}); })(x); });
    CHECK(out.shape() == x.shape());
    MESSAGE("all_to_all, 8 x 64 MiB: peak heap growth ", a2a_peak >> 20, " MiB = ", a2a_peak / data, " x the data");
    CHECK(a2a_peak / data < 2.05);
  }

  // A start evaluates each device's operand (a mapped argument is a view) and leaves it for
  // every member by reference, and each wait computes its device's result from the members'
  // blocks. Measured from a cold pool (CTest runs each case in a process of its own): the
  // evaluated operands (1 x the data), the results and the stacked output. A copy of the
  // operands in the mailbox would add 1 x the data, a copy per lane 8 x. A large reduction's
  // waits fold one sum together and share it (1/8 x), as the blocking psum does: 2.125 x in
  // all, where a sum of each device's own would make it 3 x.
  TEST_CASE("8 devices x 64 MiB: async::psum holds the operands, one shared sum and the output, no copy") {
    auto sums = async_peak("async::psum", 2.2, [](const auto& v) { return namedax::async::psum(v, "i"_ax); });
    CHECK(sums(7, async_n - 1) == 8.0f * static_cast<float>((async_n - 1) % 1024));
  }
  TEST_CASE("8 devices x 64 MiB: async::psum_scatter holds the operands and an eighth of them, no copy") {
    auto scattered = async_peak("async::psum_scatter", 1.30,
                                [](const auto& v) { return namedax::async::psum_scatter(v, "i"_ax, {.tiled = true}); });
    CHECK(scattered.shape() == std::vector<std::size_t>{8, async_n / 8});
  }
  TEST_CASE("8 devices x 64 MiB: async::all_to_all holds the operands, the results and the output, no copy") {
    auto moved = async_peak("async::all_to_all", 3.05,
                            [](const auto& v) { return namedax::async::all_to_all(v, "i"_ax, 0, 0, {.tiled = true}); });
    CHECK(moved.shape() == std::vector<std::size_t>{8, async_n});
  }

  TEST_CASE("a contraction called again writes into a recycled array") {
    // xeinsum's and pdot's results come from the pool: after the first calls, a product on a
    // device thread or under vmap allocates nothing as large as its 1 MiB output (a fresh one
    // is 256 page faults, about as long as the 512 x 512 product itself on virtual machines).
    constexpr std::size_t n = 512, devices = 2, output_bytes = n * n * sizeof(float);
    const xt::xarray<float> x = xt::ones<float>({devices, n, n});
    std::atomic<std::size_t> largest{0};
    auto f = [&](auto a, auto b) {
      auto products = [&] {
        (void)namedax::eval(namedax::xeinsum<"ij,jk->ik">(a, b));
        (void)namedax::pdot(a, b, "i"_ax, {{1}, {0}});
      };
      for (int warm = 0; warm < 4; ++warm) products();
      largest_here = 0;
      products();
      raise_to(largest, largest_here);
      return namedax::eval(a);
    };
    (void)namedax::pmap<"i">(f)(x, x);
    MESSAGE("pmap: largest allocation of a later call ", largest.load(), " bytes");
    CHECK(largest.load() < output_bytes);
    largest = 0;
    (void)namedax::vmap<"i">(f)(x, x);
    MESSAGE("vmap: largest allocation of a later call ", largest.load(), " bytes");
    CHECK(largest.load() < output_bytes * devices);
  }

  TEST_CASE("a device collective called again allocates nothing") {
    // Outputs come back to the pool when dropped, and result objects, control blocks, texts
    // and scratch are recycled: after the first calls (which size the buffers and fill the
    // free lists of the threads that make results and of those that drop them), a call of
    // psum and ppermute (of one leaf and of two), pmean, pmax, all_gather, psum_scatter or
    // all_to_all on a device thread performs no heap allocation at all, for a 4-byte and for a
    // 4 MiB payload.
    static const std::vector<std::pair<int, int>> ring{{0, 1}, {1, 2}, {2, 3}, {3, 0}};
    constexpr std::size_t devices = 4;
    for (std::size_t n : {std::size_t{1}, std::size_t{4} << 18}) {
      xt::xarray<float> x = xt::ones<float>({devices, n});
      std::atomic<std::size_t> counted{0}, largest{0};
      auto f = [&](auto slice) {
        const auto mine = namedax::eval(slice);
        auto all = [&] {
          (void)namedax::psum(mine, "i"_ax);
          (void)namedax::psum(std::tuple{mine, mine}, "i"_ax);  // two leaves, one exchange
          (void)namedax::pmean(mine, "i"_ax);
          (void)namedax::pmax(mine, "i"_ax);
          (void)namedax::all_gather(mine, "i"_ax);
          (void)namedax::all_gather(mine, "i"_ax, {.tiled = true});
          (void)namedax::ppermute(mine, "i"_ax, ring);
          (void)namedax::ppermute(std::pair{mine, mine}, "i"_ax, ring);  // two leaves, one exchange
          if (n % devices == 0) {
            (void)namedax::psum_scatter(mine, "i"_ax, {.tiled = true});
            (void)namedax::all_to_all(mine, "i"_ax, 0, 0, {.tiled = true});
          }
        };
        for (int warm = 0; warm < 16; ++warm) all();
        const std::size_t before = allocations_here;
        largest_here = 0;
        all();
        counted += allocations_here - before;
        raise_to(largest, largest_here);
        return mine;
      };
      (void)namedax::pmap<"i">(f)(x);
      MESSAGE("4 devices x ", n * sizeof(float), " bytes: ", counted.load(), " allocations in a call of every collective (largest ",
              largest.load(), " bytes)");
      CHECK(counted.load() == 0);
    }
  }
}
