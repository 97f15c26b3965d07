// SPDX-License-Identifier: MIT
// namedax::async::ppermute over MPI processes, run under mpirun: MPI_Isend and MPI_Irecv at
// the start, MPI_Wait at wait(); the same bits as vmap of the blocking ppermute, rings with two
// handles in flight, and a handle dropped on one process reported on every process. The other
// asynchronous collectives: MPI's nonblocking collectives, the blocking bits in any wait order,
// and a process that fails while one is in flight.
#define DOCTEST_CONFIG_IMPLEMENT
#include "../test_support.hpp"

#include <namedax/mpi.hpp>

#include <atomic>
#include <cstdlib>
#include <new>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>

using namespace namedax::literals;
using pairs_t = std::vector<std::pair<int, int>>;

namespace {

std::size_t processes = 0;
std::size_t world_rank = 0;

// Where the exchange went: the fault hook sees the operation at each point it passes.
std::atomic<int> async_exchanges{0};
void count_exchanges(namedax::detail::fault_point point, std::string_view operation) {
  if (point == namedax::detail::fault_point::exchanged && operation == "async::ppermute") ++async_exchanges;
}
// Collectives whose start left their MPI call in flight (its last fault point, `reading`).
std::atomic<int> calls_left_in_flight{0};
void count_started_calls(namedax::detail::fault_point point, std::string_view) {
  if (point == namedax::detail::fault_point::reading && namedax::detail::process_start_in_progress())
    ++calls_left_in_flight;
}
// Process 1 fails at that point of an asynchronous psum.
void fail_in_flight(namedax::detail::fault_point point, std::string_view operation) {
  if (point == namedax::detail::fault_point::reading && operation == "psum" && world_rank == 1 &&
      namedax::detail::process_start_in_progress())
    throw std::runtime_error("injected with the psum in flight");
}

// Heap blocks of 1 MiB or more: an array of that size that does not come from namedax's pool.
std::atomic<long> large_allocations{0};

pairs_t ring(std::size_t n) {
  pairs_t pairs;
  for (std::size_t k = 0; k < n; ++k) pairs.emplace_back(static_cast<int>(k), static_cast<int>((k + 1) % n));
  return pairs;
}

}  // namespace

namespace {
// Out of line, so that g++ does not pair the replaced operator new with free() after inlining
// (-Wmismatched-new-delete).
[[gnu::noinline]] void* allocate_counted(std::size_t bytes) {
  if (bytes >= (std::size_t{1} << 20)) ++large_allocations;
  if (void* p = std::malloc(bytes ? bytes : 1)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] void free_counted(void* p) noexcept { std::free(p); }
}  // namespace

void* operator new(std::size_t bytes) { return allocate_counted(bytes); }
void operator delete(void* p) noexcept { free_counted(p); }
void operator delete(void* p, std::size_t) noexcept { free_counted(p); }

TEST_SUITE("async over MPI") {
  TEST_CASE("async::ppermute over processes gives vmap's blocking ppermute, bit for bit, full and partial pairs") {
    std::mt19937 rng(11);  // the same on every process
    for (int trial = 0; trial < 6; ++trial) {
      const std::size_t n = processes;
      std::vector<int> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      pairs_t pairs;
      const std::size_t count = trial % 2 == 0 ? n : n / 2;
      for (std::size_t k = 0; k < count; ++k)
        pairs.emplace_back(order[k], order[(k + 1) % n]);
      if (count < n) pairs.pop_back();  // a partial permutation: some processes get zeros
      const auto x = namedax_test::random_array<float>(rng, {n, 1 + static_cast<std::size_t>(trial), 3});
      auto blocking = [&](auto v) { return namedax::ppermute(v, "i"_ax, pairs); };
      auto started = [&](auto v) {
        auto h = namedax::async::ppermute(v, "i"_ax, pairs);
        auto local = v * 2.0f;  // computed while the blocks travel
        return h.wait() + local * 0.0f;
      };
      CAPTURE(trial);
      namedax::detail::fault_injection() = &count_exchanges;
      async_exchanges = 0;
      const xt::xarray<float> got = namedax::mpi::pmap<"i">(started)(x);
      namedax::detail::fault_injection() = nullptr;
      CHECK(async_exchanges == 1);  // one nonblocking exchange started, not the blocking one
      CHECK_BITWISE(got, namedax::vmap<"i">(blocking)(x));
    }
  }

  TEST_CASE("a ring of n-1 steps over processes with two handles in flight") {
    const std::size_t n = processes;
    std::mt19937 rng(3);
    const auto x = namedax_test::random_array<float>(rng, {n, 4});
    auto f = [n](auto v) {
      auto block = namedax::eval(v);
      auto sum = namedax::eval(v);
      auto a = namedax::async::ppermute(block, "i"_ax, ring(n));
      auto b = namedax::async::ppermute(block * 2.0f, "i"_ax, ring(n));
      for (std::size_t step = 1; step < n; ++step) {
        auto got_a = a.wait();
        auto got_b = b.wait();
        if (step + 1 < n) {
          a = namedax::async::ppermute(got_a, "i"_ax, ring(n));
          b = namedax::async::ppermute(got_b, "i"_ax, ring(n));
        }
        sum = sum + got_a + got_b;
        block = got_a;
      }
      return sum;
    };
    auto reference = [n](auto v) {
      auto block = namedax::eval(v);
      auto doubled = namedax::eval(v * 2.0f);
      auto sum = namedax::eval(v);
      for (std::size_t step = 1; step < n; ++step) {
        auto got = namedax::ppermute(block, "i"_ax, ring(n));
        auto other = namedax::ppermute(doubled, "i"_ax, ring(n));
        sum = sum + got + other;
        block = got;
        doubled = other;
      }
      return sum;
    };
    CHECK_BITWISE(namedax::mpi::pmap<"i">(f)(x), namedax::vmap<"i">(reference)(x));
  }

  TEST_CASE("a handle dropped on one process: every process gets an error naming it, nothing hangs") {
    const std::size_t n = processes;
    xt::xarray<float> x = xt::arange<float>(static_cast<float>(n * 2)).reshape({n, 2});
    auto f = [n](auto v) {
      auto h = namedax::async::ppermute(v, "i"_ax, ring(n));
      if (namedax::axis_index("i"_ax) == 1) return namedax::eval(v);  // drops h
      return namedax::eval(h.wait());
    };
    const std::string e = namedax_test::error_of([&] { namedax::mpi::pmap<"i">(f)(x); });
    INFO(e);
    CHECK(e.find("namedax::async::ppermute over ('i',): a handle was dropped without wait()") != std::string::npos);
    // The next map runs normally.
    auto g = [n](auto v) { return namedax::async::ppermute(v, "i"_ax, ring(n)).wait(); };
    CHECK_BITWISE(namedax::mpi::pmap<"i">(g)(x),
                  namedax::vmap<"i">([n](auto v) { return namedax::ppermute(v, "i"_ax, ring(n)); })(x));
  }

  TEST_CASE("asynchronous collectives over processes are MPI's nonblocking calls: the blocking bits in any wait order") {
    const std::size_t n = processes;
    std::mt19937 rng(21);
    const auto x = namedax_test::random_array<float>(rng, {n, 2 * n, 3});
    const bool reverse = world_rank % 2 == 1;  // odd processes wait in the other order
    // `in_flight`: how many of the two starts leave an MPI call in flight (2, or 0 where the
    // collective is computed at the start).
    auto compare = [&](auto blocking, auto start, int in_flight = 2) {
      namedax::detail::fault_injection() = &count_started_calls;
      calls_left_in_flight = 0;
      const auto got = namedax::mpi::pmap<"i">([&](auto v) {
                      auto first = start(v);
                      auto second = start(namedax::eval(v * 2.0f));  // in flight with the first
                      if (reverse) {
                        auto b = second.wait();
                        return namedax::eval(first.wait() - b);
                      }
                      auto a = first.wait();
                      return namedax::eval(a - second.wait());
                    })(x);
      namedax::detail::fault_injection() = nullptr;
      CHECK(calls_left_in_flight == in_flight);
      CHECK_BITWISE(got, namedax::mpi::pmap<"i">([&](auto v) {
                      return namedax::eval(blocking(v) - blocking(namedax::eval(v * 2.0f)));
                    })(x));
    };
    // MPI_Iallreduce, MPI_Iallgather, MPI_Ireduce_scatter_block, MPI_Ialltoall:
    compare([](auto v) { return namedax::psum(v, "i"_ax); }, [](auto v) { return namedax::async::psum(v, "i"_ax); });
    compare([](auto v) { return namedax::pmean(v, "i"_ax); }, [](auto v) { return namedax::async::pmean(v, "i"_ax); });
    compare([](auto v) { return namedax::pmin(v, "i"_ax); }, [](auto v) { return namedax::async::pmin(v, "i"_ax); });
    compare([](auto v) { return namedax::psum(v > 0.0f, "i"_ax); },  // bools summed as int32
            [](auto v) { return namedax::async::psum(v > 0.0f, "i"_ax); });
    compare([](auto v) { return namedax::all_gather(v, "i"_ax); }, [](auto v) { return namedax::async::all_gather(v, "i"_ax); });
    compare([](auto v) { return namedax::psum_scatter(v, "i"_ax, {.tiled = true}); },
            [](auto v) { return namedax::async::psum_scatter(v, "i"_ax, {.tiled = true}); });
    compare([](auto v) { return namedax::all_to_all(v, "i"_ax, 0, 0, {.tiled = true}); },
            [](auto v) { return namedax::async::all_to_all(v, "i"_ax, 0, 0, {.tiled = true}); });
    compare([](auto v) { return namedax::pdot(v, v, "i"_ax, {{0}, {0}}); },
            [](auto v) { return namedax::async::pdot(v, v, "i"_ax, {{0}, {0}}); });
    // Without a process path for their options (or at all), computed at the start:
    compare([](auto v) { return namedax::all_to_all(v, "i"_ax, 0, 1, {.tiled = true}); },
            [](auto v) { return namedax::async::all_to_all(v, "i"_ax, 0, 1, {.tiled = true}); }, 0);
    compare([](auto v) { return namedax::pbroadcast(v, "i"_ax, 1); },
            [](auto v) { return namedax::async::pbroadcast(v, "i"_ax, 1); }, 0);
    if (n == 4) {
      const namedax::reduce_options pairs{.axis_index_groups = {{0, 2}, {1, 3}}};
      compare([pairs](auto v) { return namedax::psum(v, "i"_ax, pairs); },
              [pairs](auto v) { return namedax::async::psum(v, "i"_ax, pairs); });
    }
  }

  TEST_CASE("the other asynchronous collectives over processes give the blocking bits") {
    const std::size_t n = processes;
    std::mt19937 rng(12);
    const auto x = namedax_test::random_array<float>(rng, {n, 2 * n, 3});
    auto blocking = [](auto v) {
      return namedax::eval(namedax::psum(v, "i"_ax) + namedax::pmax(v, "i"_ax) +
                           namedax::sum(namedax::all_gather(v, "i"_ax), 0) +
                           namedax::all_to_all(v, "i"_ax, 0, 0, {.tiled = true}));
    };
    auto started = [](auto v) {
      auto s = namedax::async::psum(v, "i"_ax);
      auto m = namedax::async::pmax(v, "i"_ax);
      auto g = namedax::async::all_gather(v, "i"_ax);
      auto a = namedax::async::all_to_all(v, "i"_ax, 0, 0, {.tiled = true});
      return namedax::eval(s.wait() + m.wait() + namedax::sum(g.wait(), 0) + a.wait());
    };
    CHECK_BITWISE(namedax::mpi::pmap<"i">(started)(x), namedax::mpi::pmap<"i">(blocking)(x));
    // pargmax and pargmin meet the processes twice: the start leaves the first reduction in
    // flight, the wait makes the second.
    auto arg_blocking = [](auto v) { return namedax::eval(namedax::pargmax(v, "i"_ax) + namedax::pargmin(v, "i"_ax) * 8); };
    auto arg_started = [](auto v) {
      auto a = namedax::async::pargmax(v, "i"_ax);
      auto b = namedax::async::pargmin(v, "i"_ax);
      return namedax::eval(a.wait() + b.wait() * 8);
    };
    CHECK_BITWISE(namedax::mpi::pmap<"i">(arg_started)(x), namedax::mpi::pmap<"i">(arg_blocking)(x));
    // A handle dropped on one process is the same error as for async::ppermute.
    auto dropped = [](auto v) {
      auto h = namedax::async::psum_scatter(v, "i"_ax, {.tiled = true});
      if (namedax::axis_index("i"_ax) == 1) return namedax::eval(v);  // drops h
      const auto chunk = h.wait();
      CHECK(chunk.payload().shape()[0] == 2);
      return namedax::eval(v);
    };
    const std::string e = namedax_test::error_of([&] { namedax::mpi::pmap<"i">(dropped)(x); });
    INFO(e);
    CHECK(e.find("namedax::async::psum_scatter over ('i',): a handle was dropped without wait()") != std::string::npos);
  }

  TEST_CASE("an asynchronous psum over processes called again takes its arrays from the pool: no fresh pages") {
    // A program that starts a psum, computes, then waits, in a loop: after the first rounds
    // every array (the psum's output, the computation's) is a recycled one, whose pages are
    // touched. A fresh one would fault its pages in again in every round.
    const std::size_t n = processes;
    const xt::xarray<float> x = xt::ones<float>({n, std::size_t{1} << 18});  // 1 MiB per process
    long fresh_in_last_round = -1;
    namedax::mpi::pmap<"i">([&](auto v) {
      const auto mine = namedax::eval(v);
      for (int round = 0; round < 4; ++round) {
        large_allocations = 0;
        auto h = namedax::async::psum(mine, "i"_ax);
        auto y = namedax::eval(mine * 0.5f + 1.0f);  // computed meanwhile
        CHECK(namedax::eval(h.wait() + y).payload()(0) == static_cast<float>(n) + 1.5f);
        fresh_in_last_round = large_allocations;
      }
      return mine;
    })(x);
    CHECK(fresh_in_last_round == 0);
  }

  TEST_CASE("a process that fails while its asynchronous psum is in flight fails every process, without a hang") {
    const std::size_t n = processes;
    const xt::xarray<float> x = xt::ones<float>({n, std::size_t{1} << 16});  // past MPI's eager sizes
    auto failing = [](auto v) {
      auto h = namedax::async::psum(v, "i"_ax);
      if (namedax::axis_index("i"_ax) == 1) throw std::runtime_error("process 1 fails with its psum in flight");
      return h.wait();
    };
    std::string e = "no error";
    try {
      namedax::mpi::pmap<"i">(failing)(x);
    } catch (const std::exception& error) {
      e = error.what();
    }
    INFO(e);
    if (world_rank == 1) CHECK(e.find("process 1 fails with its psum in flight (thrown on process i=1 (rank 1))") != std::string::npos);
    else CHECK(e.find("process i=1 (rank 1) threw: process 1 fails with its psum in flight") != std::string::npos);
    // The same failure injected right after the nonblocking call is posted.
    namedax::detail::fault_injection() = &fail_in_flight;
    e = "no error";
    try {
      namedax::mpi::pmap<"i">([](auto v) { return namedax::async::psum(v, "i"_ax).wait(); })(x);
    } catch (const std::exception& error) {
      e = error.what();
    }
    namedax::detail::fault_injection() = nullptr;
    INFO(e);
    if (world_rank == 1) CHECK(e.find("injected with the psum in flight (thrown on process i=1 (rank 1))") != std::string::npos);
    else CHECK(e.find("process i=1 (rank 1) threw: injected with the psum in flight") != std::string::npos);
    // The processes go on: the next collective meets every one of them.
    auto again = [](auto v) { return namedax::async::psum(v, "i"_ax).wait(); };
    CHECK_BITWISE(namedax::mpi::pmap<"i">(again)(x), namedax::mpi::pmap<"i">([](auto v) { return namedax::psum(v, "i"_ax); })(x));
  }
}

int main(int argc, char** argv) {
  namedax::mpi::environment environment(argc, argv);
  processes = static_cast<std::size_t>(environment.size());
  world_rank = static_cast<std::size_t>(environment.rank());
  if (processes < 2) {
    if (world_rank == 0) std::fprintf(stderr, "run the async MPI tests on at least 2 processes\n");
    return 2;
  }
  doctest::Context context(argc, argv);
  if (world_rank != 0) context.setOption("minimal", true);
  const int failed = context.run() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (world_rank == 0)
    std::printf("%zu processes: %s\n", processes, any_failed ? "some process failed" : "every process passed");
  return any_failed;
}
