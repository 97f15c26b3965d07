// SPDX-License-Identifier: MIT
// namedax::mpi::pmap, run under mpirun: every collective on MPI processes against vmap on the
// same global data, 2-D meshes of processes, processes mixed with vmap and with threads, own
// slices as inputs, and the errors. The data is integer-valued, so that MPI's own order of
// summation cannot show and every comparison is bit for bit. Every process runs every case;
// the program fails when any process fails, or when a test case hangs (its watchdog). Needs an
// even number of processes.
#define DOCTEST_CONFIG_IMPLEMENT
#include "../test_support.hpp"

#include <namedax/mpi.hpp>

#include <xtensor/xview.hpp>

#include <chrono>
#include <complex>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <fstream>
#include <filesystem>
#include <mutex>
#include <new>
#include <stdexcept>
#include <numeric>
#include <thread>

using namespace namedax::literals;
using namedax_test::error_of;

// The nonblocking all-reduces and all-gathers this process starts (namedax's agreements and
// collectives), counted through MPI's profiling interface: these definitions stand in for MPI's own.
std::atomic<long> collective_calls{0};
int MPI_Iallreduce(const void* in, void* out, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                   MPI_Request* request) {
  ++collective_calls;
  return PMPI_Iallreduce(in, out, count, type, op, comm, request);
}
int MPI_Iallgather(const void* in, int in_count, MPI_Datatype in_type, void* out, int out_count, MPI_Datatype out_type,
                   MPI_Comm comm, MPI_Request* request) {
  ++collective_calls;
  return PMPI_Iallgather(in, in_count, in_type, out, out_count, out_type, comm, request);
}

namespace {

std::size_t processes = 0;  // in MPI_COMM_WORLD, set by main
std::size_t world_rank = 0;

/// The leaves of two pytrees (a value, or a tuple or pair of them), each pair bit for bit.
template <class A, class B>
void check_same(const A& actual, const B& expected) {
  if constexpr (requires { std::tuple_size<A>::value; }) {
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      (check_same(std::get<K>(actual), std::get<K>(expected)), ...);
    }(std::make_index_sequence<std::tuple_size_v<A>>{});
  } else {
    CHECK_BITWISE(actual, expected);
  }
}

/// `f` mapped along "i" by MPI processes and by vmap on the same whole arguments.
template <class F, class InAxes = int, class... Args>
void check_like_vmap(F f, InAxes in_axes, const Args&... args) {
  const auto expected = namedax::vmap<"i">(f, in_axes)(args...);
  check_same(namedax::mpi::pmap<"i">(f, in_axes)(args...), expected);
}

/// Random integer values of type T (floating types too: their sums are exact in any order).
template <class T>
xt::xarray<T> whole_numbers(std::mt19937& rng, const std::vector<std::size_t>& shape) {
  if constexpr (std::is_floating_point_v<T>)
    return xt::cast<T>(namedax_test::random_array<std::int32_t>(rng, shape));
  else
    return namedax_test::random_array<T>(rng, shape);
}

/// Groups of two, each in reverse order, so that a rank's position differs from its order:
/// {{3, 0}, {2, 1}} for 4 ranks.
std::vector<std::vector<int>> pairs_reversed(std::size_t n) {
  std::vector<std::vector<int>> groups;
  for (std::size_t k = 0; k < n / 2; ++k) groups.push_back({static_cast<int>(n - 1 - k), static_cast<int>(k)});
  return groups;
}

/// Groups of unequal sizes, for the reductions: {{2}, {3, 1, 0}} for 4 ranks.
std::vector<std::vector<int>> uneven(std::size_t n) {
  std::vector<std::vector<int>> groups{{static_cast<int>(n - 2)}, {}};
  for (std::size_t k = n; k-- > 0;)
    if (k != n - 2) groups[1].push_back(static_cast<int>(k));
  return groups;
}

/// Bool values leave the map as int32: mpi::pmap cannot return bool results yet (it gathers
/// them in a std::vector<bool>, which has no data()).
template <class V>
auto leaving_map(V v) {
  if constexpr (std::is_same_v<typename V::value_type, bool>) return namedax::cast<std::int32_t>(v);
  else return v;
}

/// The message of the collective_error that `f` throws, or why there is none.
template <class F>
std::string collective_error_of(F f) {
  try {
    f();
  } catch (const namedax::collective_error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("another exception: ") + e.what();
  }
  return "no error";
}

/// Makes a hang fail: a test case still running after NAMEDAX_MPI_TEST_TIMEOUT seconds (default
/// 120) ends its process with a message naming it, and mpirun then ends the others.
class watchdog final : public doctest::IReporter {
 public:
  explicit watchdog(const doctest::ContextOptions&) {}
  void test_case_start(const doctest::TestCaseData& test) override { state().arm(test.m_name); }
  void test_case_end(const doctest::CurrentTestCaseStats&) override { state().disarm(); }
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}

 private:
  struct timer {
    std::mutex lock;
    std::condition_variable changed;
    std::string running;  // the test case, empty between cases
    std::uint64_t started = 0;

    void arm(const char* name) {
      std::lock_guard hold(lock);
      running = name, ++started;
      changed.notify_one();
    }
    void disarm() {
      std::lock_guard hold(lock);
      running.clear();
      changed.notify_one();
    }
    void watch(std::chrono::seconds limit) {
      std::unique_lock hold(lock);
      for (;;) {
        changed.wait(hold, [&] { return !running.empty(); });
        const std::uint64_t watched = started;
        if (!changed.wait_for(hold, limit, [&] { return running.empty() || started != watched; })) {
          std::fprintf(stderr, "rank %zu: test case \"%s\" still runs after %lld s: it hangs\n", world_rank,
                       running.c_str(), static_cast<long long>(limit.count()));
          std::fflush(stderr);
          std::_Exit(124);
        }
      }
    }
  };
  // Never destroyed: its thread waits on it until the process ends.
  static timer& state() {
    static timer* const instance = [] {
      auto* t = new timer;
      const char* text = std::getenv("NAMEDAX_MPI_TEST_TIMEOUT");
      const std::chrono::seconds limit(text ? std::atoi(text) : 120);
      std::thread([t, limit] { t->watch(limit); }).detach();
      return t;
    }();
    return *instance;
  }
};
REGISTER_LISTENER("watchdog", 1, watchdog);

/// What every process gets from `map` when process 1 alone fails (or calls something else): an
/// `Own` on process 1, a namedax::collective_error on the others, each naming rank 1.
template <class Own = namedax::error, class F>
void check_every_process_names_rank_1(F map, std::string_view own, std::string_view others) {
  std::string what = "no error";
  bool expected_type = false;
  try {
    map();
  } catch (const std::exception& e) {
    what = e.what();
    expected_type = world_rank == 1 ? dynamic_cast<const Own*>(&e) != nullptr
                                    : dynamic_cast<const namedax::collective_error*>(&e) != nullptr;
  }
  CAPTURE(world_rank);
  CHECK_MESSAGE(expected_type, what);
  CHECK_MESSAGE(what.find(world_rank == 1 ? own : others) != std::string::npos, what);
  CHECK_MESSAGE(what.find("rank 1") != std::string::npos, what);
}

}  // namespace

TEST_SUITE("collectives on processes against vmap") {
  TEST_CASE_TEMPLATE("psum, pmean, pmax and pmin, with and without groups", T, float, double, std::int32_t, bool) {
    std::mt19937 rng(11);
    const std::size_t n = processes;
    auto x = whole_numbers<T>(rng, {n, 3, 2});
    const auto even = pairs_reversed(n), odd = uneven(n);
    auto f = [&](auto x) {
      return std::tuple{namedax::psum(x, "i"_ax), namedax::pmean(x, "i"_ax), leaving_map(namedax::pmax(x, "i"_ax)),
                        leaving_map(namedax::pmin(x, "i"_ax)), namedax::psum(x, "i"_ax, {.axis_index_groups = even}),
                        namedax::pmean(x, "i"_ax, {.axis_index_groups = odd}),
                        leaving_map(namedax::pmax(x, "i"_ax, {.axis_index_groups = odd})),
                        leaving_map(namedax::pmin(x, "i"_ax, {.axis_index_groups = even})),
                        namedax::psum(x, namedax::axes("i"_ax, 1))};
    };
    check_like_vmap(f, 0, x);
    // A strided view of each process's slice (mapped along dimension 1) goes the same way.
    xt::xarray<T> transposed = xt::transpose(x, {1, 0, 2});
    check_like_vmap(f, 1, transposed);
  }
  TEST_CASE_TEMPLATE("complex elements: psum, pmean and psum_scatter as under vmap", T, std::complex<float>,
                     std::complex<double>) {
    std::mt19937 rng(17);
    const std::size_t n = processes;
    const auto re = namedax_test::random_array<std::int32_t>(rng, {n, n, 2});
    const auto im = namedax_test::random_array<std::int32_t>(rng, {n, n, 2});
    xt::xarray<T> x = xt::xarray<T>::from_shape(re.shape());
    for (std::size_t k = 0; k < x.size(); ++k) x.flat(k) = T(re.flat(k), im.flat(k));  // sums exact in any order
    const auto even = pairs_reversed(n);
    auto f = [&](auto x) {
      return std::tuple{namedax::psum(x, "i"_ax), namedax::pmean(x, "i"_ax),
                        namedax::psum(x, "i"_ax, {.axis_index_groups = even}),
                        namedax::psum_scatter(x, "i"_ax, {.tiled = true})};
    };
    check_like_vmap(f, 0, x);
  }
  TEST_CASE("pmax and pmin propagate NaN, alone and in groups") {
    xt::xarray<float> x = xt::arange<float>(static_cast<float>(processes * 2)).reshape({processes, 2});
    x(1, 0) = std::numeric_limits<float>::quiet_NaN();
    const auto even = pairs_reversed(processes);
    auto f = [&](auto x) {
      return std::tuple{namedax::pmax(x, "i"_ax), namedax::pmin(x, "i"_ax),
                        namedax::pmax(x, "i"_ax, {.axis_index_groups = even}),
                        namedax::pmin(x, "i"_ax, {.axis_index_groups = even})};
    };
    auto [max, min, max_grouped, min_grouped] = namedax::mpi::pmap<"i">(f)(x);
    CHECK(xt::all(xt::isnan(xt::view(max, xt::all(), 0))));
    CHECK(xt::all(xt::isnan(xt::view(min, xt::all(), 0))));
    CHECK(!xt::any(xt::isnan(xt::view(max, xt::all(), 1))));
    // Rank 1 is in the group {n - 2, 1}: only that group sees the NaN.
    for (std::size_t r = 0; r < processes; ++r) {
      const bool with_nan = r == 1 || r == processes - 2;
      CHECK(std::isnan(max_grouped(r, 0)) == with_nan);
      CHECK(std::isnan(min_grouped(r, 0)) == with_nan);
    }
    check_like_vmap(f, 0, x);
  }
  TEST_CASE_TEMPLATE("all_gather along each axis, tiled and in groups", T, float, std::int32_t) {
    std::mt19937 rng(12);
    const std::size_t n = processes;
    auto x = whole_numbers<T>(rng, {n, 2, 3});
    const auto groups = pairs_reversed(n);
    auto f = [&](auto x) {
      return std::tuple{namedax::all_gather(x, "i"_ax), namedax::all_gather(x, "i"_ax, {.axis = 1}),
                        namedax::all_gather(x, "i"_ax, {.axis = -1}), namedax::all_gather(x, "i"_ax, {.tiled = true}),
                        namedax::all_gather(x, "i"_ax, {.axis = 1, .tiled = true}),
                        namedax::all_gather(x, "i"_ax, {.axis_index_groups = groups}),
                        namedax::all_gather(x, "i"_ax, {.axis_index_groups = groups, .axis = 0, .tiled = true})};
    };
    check_like_vmap(f, 0, x);
  }
  TEST_CASE_TEMPLATE("psum_scatter along dimensions 0 and 1, tiled and in groups", T, float, std::int32_t, bool) {
    std::mt19937 rng(13);
    const std::size_t n = processes;
    auto x = whole_numbers<T>(rng, {n, n, n});
    const auto groups = pairs_reversed(n);
    auto f = [&](auto x) {
      return std::tuple{namedax::psum_scatter(x, "i"_ax), namedax::psum_scatter(x, "i"_ax, {.scatter_dimension = 1}),
                        namedax::psum_scatter(x, "i"_ax, {.tiled = true}),
                        namedax::psum_scatter(x, "i"_ax, {.scatter_dimension = 1, .tiled = true}),
                        namedax::psum_scatter(x, "i"_ax, {.axis_index_groups = groups, .tiled = true}),
                        namedax::psum_scatter(x, "i"_ax, {.scatter_dimension = 1, .axis_index_groups = groups, .tiled = true})};
    };
    check_like_vmap(f, 0, x);
  }
  TEST_CASE_TEMPLATE("all_to_all for every split and concat axis, tiled, in groups; pswapaxes", T, double, std::int32_t) {
    std::mt19937 rng(14);
    const std::size_t n = processes;
    auto x = whole_numbers<T>(rng, {n, n, n});
    const auto groups = pairs_reversed(n);
    for (int split : {0, 1})
      for (int concat : {0, 1}) {
        CAPTURE(split);
        CAPTURE(concat);
        auto f = [&](auto x) {
          return std::tuple{namedax::all_to_all(x, "i"_ax, split, concat),
                            namedax::all_to_all(x, "i"_ax, split, concat, {.tiled = true}),
                            namedax::all_to_all(x, "i"_ax, split, concat, {.axis_index_groups = groups, .tiled = true})};
        };
        check_like_vmap(f, 0, x);
      }
    auto swap = [&](auto x) {
      return std::tuple{namedax::pswapaxes(x, "i"_ax, 0), namedax::pswapaxes(x, "i"_ax, 1)};
    };
    check_like_vmap(swap, 0, x);
    // pswapaxes is a distributed transpose.
    xt::xarray<T> square = xt::view(x, xt::all(), xt::all(), 0);
    xt::xarray<T> transposed = xt::transpose(square);
    CHECK_BITWISE(namedax::mpi::pmap<"i">([](auto x) { return namedax::pswapaxes(x, "i"_ax, 0); })(square), transposed);
    // Over a vmap around the processes: all_to_all along the vectorized axis is a view of its
    // operand in another memory order, laid out before the processes gather their results.
    auto outer = [](auto x) { return namedax::all_to_all(x, "v"_ax, 0, 1); };
    const auto y = whole_numbers<T>(rng, {3, n, 3, 2});
    CHECK_BITWISE(namedax::vmap<"v">(namedax::mpi::pmap<"i">(outer))(y), namedax::vmap<"v">(namedax::vmap<"i">(outer))(y));
  }
  TEST_CASE("ppermute (a ring, a partial permutation that zero-fills) and pshuffle") {
    const std::size_t n = processes;
    xt::xarray<float> x = xt::arange<float>(static_cast<float>(n * 2)).reshape({n, 2});
    std::vector<std::pair<int, int>> ring, partial{{0, static_cast<int>(n - 1)}};
    std::vector<int> reversed(n);
    for (std::size_t k = 0; k < n; ++k) {
      ring.emplace_back(static_cast<int>(k), static_cast<int>((k + 1) % n));
      reversed[k] = static_cast<int>(n - 1 - k);
    }
    auto f = [&](auto x) {
      return std::tuple{namedax::ppermute(x, "i"_ax, ring), namedax::ppermute(x, "i"_ax, partial),
                        namedax::pshuffle(x, "i"_ax, reversed)};
    };
    auto [shifted, moved, shuffled] = namedax::mpi::pmap<"i">(f)(x);
    for (std::size_t k = 0; k < n; ++k) {
      CHECK_BITWISE(xt::xarray<float>(xt::view(shifted, (k + 1) % n)), xt::xarray<float>(xt::view(x, k)));
      CHECK_BITWISE(xt::xarray<float>(xt::view(shuffled, k)), xt::xarray<float>(xt::view(x, n - 1 - k)));
      if (k != n - 1) CHECK(xt::all(xt::equal(xt::view(moved, k), 0.f)));
    }
    CHECK_BITWISE(xt::xarray<float>(xt::view(moved, n - 1)), xt::xarray<float>(xt::view(x, 0)));
    check_like_vmap(f, 0, x);
  }
  TEST_CASE("grad through the collectives over processes: the same bits as under vmap") {
    // Whole numbers and a polynomial loss: every sum is exact in any order, so MPI's order
    // cannot show. w is replicated (its gradient summed over the processes), x mapped.
    std::mt19937 rng(31);
    const std::size_t n = processes;
    auto x = whole_numbers<double>(rng, {n, n, 2});
    auto w = whole_numbers<double>(rng, {n, 2});
    auto c = whole_numbers<double>(rng, {n, n, 2});
    std::vector<std::pair<int, int>> ring;
    for (std::size_t k = 0; k < n; ++k) ring.emplace_back(static_cast<int>(k), static_cast<int>((k + 1) % n));
    auto f = [&](auto w, auto x, auto c) {
      return namedax::grad([&](const auto& p, const auto& c) {
        const auto& [w, x] = p;
        auto a = namedax::all_gather(x * w, "i"_ax);
        auto b = namedax::psum_scatter(x * c, "i"_ax, {.scatter_dimension = 0, .tiled = true});
        auto d = namedax::ppermute(x * x, "i"_ax, ring);
        auto e = namedax::all_to_all(x * w, "i"_ax, 0, 0, {.tiled = true});
        auto g = namedax::pdot(x, c, "i"_ax, {{0, 1}, {0, 1}});
        return namedax::psum(namedax::sum(a * a) + namedax::sum(b * b) + namedax::sum(d * c) + namedax::sum(e * e * c), "i"_ax) + g;
      })(std::tuple{w, x}, c);
    };
    check_like_vmap(f, std::tuple{namedax::none, 0, 0}, w, x, c);
  }
  TEST_CASE("grad outside mpi::pmap and outside shard_map on a mesh of processes: the same bits as vmap's") {
    // JAX's training step: the loss sums the per-example losses that the map computes, the
    // parameters a pytree replicated over the processes. Whole numbers: exact in any order.
    std::mt19937 rng(38);
    const std::size_t n = processes;
    const auto x = whole_numbers<double>(rng, {n, 3});
    const auto w = whole_numbers<double>(rng, {3});
    const auto c = whole_numbers<double>(rng, {3});
    auto per_row = [](const auto& params, const auto& row) {
      return namedax::square(namedax::sum((std::get<0>(params) + std::get<1>(params)) * row));
    };
    auto through = [&](auto map) {
      return namedax::grad([&](const auto& params) {
        return namedax::sum(map(per_row, std::tuple{namedax::none, 0})(params, x));
      })(std::tuple{w, c});
    };
    const auto [pw, pc] = through([](auto f, auto in) { return namedax::mpi::pmap<"i">(f, in); });
    const auto [vw, vc] = through([](auto f, auto in) { return namedax::vmap<"i">(f, in); });
    xt::xarray<double> expected = xt::zeros<double>({3});
    for (std::size_t k = 0; k < n; ++k) expected += 2 * xt::sum(xt::row(x, k) * (w + c))() * xt::row(x, k);
    CHECK_BITWISE(vw, expected);
    CHECK_BITWISE(pw, vw);
    CHECK_BITWISE(pc, vc);
    // shard_map over a mesh of the processes: the rows split over them, the loss psum'd.
    namedax::mesh m{namedax::mpi::processes<"i">(n)};
    auto loss = [](const auto& wb, const auto& xb) { return namedax::psum(namedax::sum(namedax::square(xb * wb)), "i"_ax); };
    const xt::xarray<double> sharded = namedax::grad([&](const auto& p) {
      return namedax::sum(namedax::shard_map(loss, m, std::tuple{namedax::P(), namedax::P("i"_ax)}, namedax::P())(p, x));
    })(w);
    CHECK_BITWISE(sharded, xt::xarray<double>(2 * w * xt::sum(x * x, {0})));
  }
  TEST_CASE("grad through pgather, ragged_all_to_all and custom_vjp over processes: the same bits as under vmap") {
    std::mt19937 rng(41);
    const std::size_t n = processes;
    const auto x = whole_numbers<double>(rng, {n, 3});
    const auto c = whole_numbers<double>(rng, {n, 2, 3});
    // Each process reads a neighbour's row and one by a stride, index n out of range.
    xt::xarray<int> ids = xt::xarray<int>::from_shape({n, 2});
    for (std::size_t k = 0; k < n; ++k) ids(k, 0) = static_cast<int>((k + 1) % n), ids(k, 1) = static_cast<int>(3 * k % (n + 1));
    // The user's pullback of 2 x: 3 psum(ct), a collective in the backward pass.
    auto doubled = namedax::custom_vjp([](const auto& a) { return a * 2.0; },
                                       [](const auto& a) { return std::pair{a * 2.0, 0}; },
                                       [](int, const auto& ct) { return namedax::psum(ct, "i"_ax) * 3.0; });
    auto gathered = [&](auto row, auto id, auto weight) {
      return namedax::grad([&](const auto& p) {
        return namedax::psum(namedax::sum(namedax::pgather(doubled(p), id, "i"_ax) * weight), "i"_ax);
      })(row);
    };
    check_like_vmap(gathered, 0, x, ids, c);
    // ragged_all_to_all as an all-to-all of one row each: process i's row j lands in row i of
    // process j; the last output row is written by nobody.
    xt::xarray<int> input_offsets = xt::xarray<int>::from_shape({n, n}), output_offsets = input_offsets;
    const xt::xarray<int> ones = xt::ones<int>({n, n});
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j) input_offsets(i, j) = static_cast<int>(j), output_offsets(i, j) = static_cast<int>(i);
    const auto operand = whole_numbers<double>(rng, {n, n});
    const auto output = whole_numbers<double>(rng, {n, n + 1});
    const auto weight = whole_numbers<double>(rng, {n, n + 1});
    auto exchanged = [&](auto a, auto o, auto io, auto sizes, auto oo, auto w) {
      return namedax::grad(
          [&](const auto& p, const auto& q) {
            return namedax::psum(namedax::sum(namedax::ragged_all_to_all(p, q, io, sizes, oo, sizes, "i"_ax) * w), "i"_ax);
          },
          namedax::argnums<0, 1>)(a, o);
    };
    check_like_vmap(exchanged, 0, operand, output, input_offsets, ones, output_offsets, weight);
    const auto [d_operand, d_output] = namedax::vmap<"i">(exchanged)(operand, output, input_offsets, ones, output_offsets, weight);
    CHECK_BITWISE(d_operand, xt::xarray<double>(xt::transpose(xt::view(weight, xt::all(), xt::range(0, n)))));
    xt::xarray<double> unwritten = xt::zeros<double>({n, n + 1});
    xt::view(unwritten, xt::all(), n) = xt::view(weight, xt::all(), n);
    CHECK_BITWISE(d_output, unwritten);
  }
  TEST_CASE("pbroadcast from every source: each process gets the source's value, exact for NaN, -inf and -0") {
    const std::size_t n = processes;
    xt::xarray<float> x = xt::arange<float>(static_cast<float>(n * 3)).reshape({n, 3});
    x(n - 1, 0) = std::numeric_limits<float>::quiet_NaN();
    x(n - 1, 1) = -std::numeric_limits<float>::infinity();
    x(n - 1, 2) = -0.f;
    xt::xarray<std::int32_t> counts = xt::arange<std::int32_t>(static_cast<std::int32_t>(n)) - 7;
    xt::xarray<bool> flags = xt::equal(counts % 2, 0);
    for (int source = 0; source < static_cast<int>(n); ++source) {
      CAPTURE(source);
      auto f = [source](auto x, auto c, auto b) {
        auto [y, k, f] = namedax::pbroadcast(std::tuple{x, c, b}, "i"_ax, source);
        return std::tuple{y, k, namedax::cast<std::int32_t>(f)};  // bool leaves a process map as int32
      };
      auto [y, k, b] = namedax::mpi::pmap<"i">(f)(x, counts, flags);
      for (std::size_t r = 0; r < n; ++r) {
        CHECK_BITWISE(xt::xarray<float>(xt::view(y, r)), xt::xarray<float>(xt::view(x, source)));
        CHECK(k(r) == counts(static_cast<std::size_t>(source)));
        CHECK(b(r) == (flags(static_cast<std::size_t>(source)) ? 1 : 0));
      }
      check_like_vmap(f, 0, x, counts, flags);
    }
    auto bad = [](auto x) { return namedax::pbroadcast(x, "i"_ax, -1); };
    const std::string message = error_of([&] { namedax::mpi::pmap<"i">(bad)(x); });
    CHECK_MESSAGE(message.find("namedax::pbroadcast: source -1 is out of range for axis ('i',) of size " + std::to_string(n) +
                               "; use indices 0.." + std::to_string(n - 1)) != std::string::npos,
                  message);
    check_like_vmap([](auto x) { return namedax::pbroadcast(x, "i"_ax, 0); }, 0, x);
  }
  TEST_CASE("pargmax, pargmin (ties to the lowest index, in groups), pmax_with_index, axis_index, axis_size") {
    std::mt19937 rng(15);
    const std::size_t n = processes;
    auto x = whole_numbers<std::int32_t>(rng, {n, 4, 3});
    xt::view(x, xt::all(), 0, 0) = 7;  // a tie everywhere
    const auto groups = pairs_reversed(n);
    auto f = [&](auto x) {
      return std::tuple{namedax::pargmax(x, "i"_ax), namedax::pargmin(x, "i"_ax),
                        namedax::pargmax(x, "i"_ax, {.axis_index_groups = groups}),
                        namedax::pmax_with_index(x, "i"_ax).second, x * 0 + namedax::axis_index("i"_ax),
                        x * 0 + namedax::axis_size("i"_ax)};
    };
    auto results = namedax::mpi::pmap<"i">(f)(x);
    CHECK(xt::all(xt::equal(xt::view(std::get<0>(results), xt::all(), 0, 0), 0)));
    check_like_vmap(f, 0, x);
    xt::xarray<std::int32_t> indices = namedax::mpi::pmap<"i">([](auto) { return namedax::axis_index("i"_ax); })(x);
    CHECK_BITWISE(indices, xt::xarray<std::int32_t>(xt::arange<std::int32_t>(static_cast<int>(n))));
  }
  TEST_CASE_TEMPLATE("pdot, xeinsum and pgather", T, float, std::int32_t) {
    std::mt19937 rng(16);
    const std::size_t n = processes;
    auto x = whole_numbers<T>(rng, {n, 3, 2});
    auto y = whole_numbers<T>(rng, {n, 2, 4});
    // Indices into (i, dimension 1 of x), one out of range; and ids that differ per index of i.
    xt::xarray<int> ids{static_cast<int>(2 * n - 1), 0, 3, -1, static_cast<int>(n)};
    xt::xarray<int> per_index = xt::cast<int>(xt::abs(whole_numbers<std::int32_t>(rng, {n, 3}))) % static_cast<int>(n);
    auto f = [&](auto x, auto y, auto own_ids) {
      return std::tuple{namedax::pdot(x, y, "i"_ax, {{1}, {0}}), namedax::pdot(x, y, namedax::axes(), {{1}, {0}}),
                        namedax::xeinsum<"ab{i},bc{i}->ca">(x, y), namedax::xeinsum<"ab{i},bc->ac{i}">(x, y),
                        namedax::pgather(x, ids, namedax::axes("i"_ax, 1)), namedax::pgather(y, own_ids, "i"_ax)};
    };
    check_like_vmap(f, 0, x, y, per_index);
  }
  TEST_CASE("pytrees: tuples as arguments, through collectives and as results") {
    const std::size_t n = processes;
    xt::xarray<int> x = xt::arange<int>(static_cast<int>(n * 3)).reshape({n, 3});
    xt::xarray<double> w{0.5, -1.0};
    auto f = [](auto x, auto w) {
      auto [sx, sw] = namedax::psum(std::tuple{x, w}, "i"_ax);
      auto [doubled, plus_one] = namedax::all_gather(std::tuple{x * 2, x + 1}, "i"_ax);
      auto [largest, negated_smallest] = namedax::pmax(std::pair{x, -x}, "i"_ax);
      return std::tuple{sx, sw, doubled, plus_one, largest, negated_smallest};
    };
    check_like_vmap(f, std::tuple{0, namedax::none}, x, w);
  }
}

TEST_SUITE("what each process passes and receives") {
  TEST_CASE("its own slice (extent 1) instead of the whole array") {
    std::mt19937 rng(17);
    const std::size_t n = processes;
    auto x = whole_numbers<float>(rng, {n, 3});
    xt::xarray<float> mine = xt::view(x, xt::range(world_rank, world_rank + 1));
    auto f = [](auto x) { return std::tuple{namedax::psum(x, "i"_ax), namedax::all_gather(x, "i"_ax), x * 2.f}; };
    auto [sum, gathered, doubled] = namedax::mpi::pmap<"i">(f)(mine);
    auto [esum, egathered, edoubled] = namedax::vmap<"i">(f)(x);
    auto own = [&](const auto& whole) { return xt::xarray<typename std::decay_t<decltype(whole)>::value_type>(xt::view(whole, xt::range(world_rank, world_rank + 1))); };
    CHECK_BITWISE(sum, own(esum));
    CHECK_BITWISE(gathered, own(egathered));
    CHECK_BITWISE(doubled, own(edoubled));
  }
  TEST_CASE("an axis smaller than the number of processes: each index on a block of processes") {
    const std::size_t n = processes / 2;
    xt::xarray<int> x = xt::arange<int>(static_cast<int>(n * 2)).reshape({n, 2});
    auto f = [](auto x) { return std::tuple{namedax::psum(x, "i"_ax), namedax::ppermute(x, "i"_ax, {{0, 0}}), x + 1}; };
    // axis_size given, since with one index the extent 1 would read as each process's own slice.
    check_same(namedax::mpi::pmap<"i">(f, 0, 0, n)(x), namedax::vmap<"i">(f)(x));
    // Nothing mapped: axis_size gives the size.
    auto g = [](auto w) { return namedax::psum(w * namedax::axis_index("i"_ax), "i"_ax); };
    xt::xarray<int> w{1, 2};
    check_same(namedax::mpi::pmap<"i">(g, namedax::none, 0, n)(w), namedax::vmap<"i">(g, namedax::none, 0, n)(w));
  }
  TEST_CASE("ragged_all_to_all: one MPI_Alltoallv, in groups, overlapping chunks, processes x vmap and x threads") {
    // Random chunks, the same on every process (one seed): operand [n, N, 2], output [n, M, 2],
    // offsets and sizes [n, n]; receiver r lays what it gets in sender order.
    auto make = [](std::size_t n, std::size_t peers, unsigned seed, bool overlap) {
      std::mt19937 rng(seed);
      const std::size_t N = 3 * peers + 1, M = 3 * peers + 2;
      auto op = whole_numbers<float>(rng, {n, N, 2}), out = whole_numbers<float>(rng, {n, M, 2});
      xt::xarray<std::int32_t> io = xt::zeros<std::int32_t>({n, peers}), ss = io, oo = io, rs = io;
      std::uniform_int_distribution<int> size(0, 2), gap(0, 1);
      const std::size_t groups = n / peers;  // groups of consecutive... of stride `groups`: {k, k + groups, ...}
      for (std::size_t s = 0; s < n; ++s)
        for (std::size_t p = 0, at = 0; p < peers; ++p) {
          at += static_cast<std::size_t>(gap(rng));
          ss(s, p) = size(rng), io(s, p) = static_cast<int>(at);
          at += static_cast<std::size_t>(ss(s, p));
        }
      for (std::size_t r = 0; r < n; ++r)
        for (std::size_t q = 0, at = 0; q < peers; ++q) {
          const std::size_t s = r % groups + q * groups, pr = r / groups;  // sender at position q of r's group
          at += overlap ? 0 : static_cast<std::size_t>(gap(rng));
          oo(s, pr) = overlap ? 0 : static_cast<int>(at), rs(r, q) = ss(s, pr);
          at += overlap ? 0 : static_cast<std::size_t>(ss(s, pr));
        }
      return std::tuple{op, out, io, ss, oo, rs};
    };
    auto over_i = [](auto... v) { return namedax::ragged_all_to_all(v..., "i"_ax); };
    for (bool overlap : {false, true}) {
      INFO("overlapping chunks: ", overlap);
      std::apply([&](const auto&... a) { check_like_vmap(over_i, 0, a...); }, make(processes, processes, 5, overlap));
    }
    std::vector<std::vector<int>> groups(2);
    for (std::size_t k = 0; k < processes; ++k) groups[k % 2].push_back(static_cast<int>(k));
    auto grouped = [groups](auto... v) { return namedax::ragged_all_to_all(v..., "i"_ax, {.axis_index_groups = groups}); };
    std::apply([&](const auto&... a) { check_like_vmap(grouped, 0, a...); }, make(processes, processes / 2, 6, false));

    // "i" on 2 blocks of processes, "j" inside them: the exchange over "i" with "j" a batch.
    const std::size_t nj = processes / 2;
    auto [op, out, io, ss, oo, rs] = make(2 * nj, 2, 7, false);
    auto split = [nj](auto a) {
      std::vector<std::size_t> shape{2, nj};
      shape.insert(shape.end(), a.shape().begin() + 1, a.shape().end());
      a.reshape(shape);
      return a;
    };
    // Index (a, b) is flat a * nj + b, and the groups of `make` with 2 peers pair b with
    // nj + b: exchanging over "i" pairs (0, b) with (1, b).
    std::apply(
        [&](const auto&... a) {
          const auto expected = namedax::vmap<"i">(namedax::vmap<"j">(over_i))(a...);
          check_same(namedax::mpi::pmap<"i">(namedax::vmap<"j">(over_i))(a...), expected);
          check_same(namedax::mpi::pmap<"i">(namedax::pmap<"j">(over_i))(a...), expected);
        },
        std::tuple{split(op), split(out), split(io), split(ss), split(oo), split(rs)});
  }
  TEST_CASE("all_gather_v: the counted rows of every process, in order, on every process") {
    std::mt19937 rng(9);
    const std::size_t n = processes;
    const auto x = whole_numbers<float>(rng, {n, 3, 2});
    xt::xarray<std::int32_t> count = xt::zeros<std::int32_t>(std::vector<std::size_t>{n});
    for (std::size_t k = 0; k < n; ++k) count(k) = static_cast<std::int32_t>((k * 7 + 1) % 4);
    auto f = [](auto v, auto c) { return namedax::pvary(namedax::all_gather_v(v, c, "i"_ax), "i"_ax); };
    check_like_vmap(f, 0, x, count);
  }
  TEST_CASE("ragged_all_to_all: recv_sizes that disagree are the same error on every process") {
    const std::size_t n = processes;
    const std::vector<std::size_t> rows{n, 2}, square{n, n};
    xt::xarray<float> op = xt::zeros<float>(rows), out = xt::zeros<float>(rows);
    xt::xarray<std::int32_t> zero = xt::zeros<std::int32_t>(square), ones = xt::ones<std::int32_t>(square);
    auto f = [](auto... v) { return namedax::ragged_all_to_all(v..., "i"_ax); };
    const std::string message = error_of([&] { namedax::mpi::pmap<"i">(f)(op, out, zero, ones, zero, zero); });
    CHECK(message.find("namedax::ragged_all_to_all over axis ('i',): index 0 sending to peer 0 sends 1 rows but the "
                       "peer's recv_sizes[0] is 0") != std::string::npos);
  }
}

TEST_SUITE("meshes") {
  // A 2-D mesh of ni x nj: 2 x (processes / 2).
  auto mesh_collectives = [](auto x) {
    auto both = namedax::axes("i"_ax, "j"_ax);
    return std::tuple{namedax::psum(x, "i"_ax), namedax::psum(x, "j"_ax), namedax::pmean(x, both),
                      namedax::all_gather(x, both), namedax::all_gather(x, "j"_ax, {.axis = 1}),
                      namedax::psum_scatter(x, "i"_ax, {.tiled = true}), namedax::all_to_all(x, both, 0, 0),
                      namedax::ppermute(x, "i"_ax, {{0, 1}, {1, 0}}), namedax::pargmax(x, namedax::axes("j"_ax, "i"_ax)),
                      namedax::axis_index(both) + x * 0};
  };
  // Positional shape (processes, 2): dimension 0 splits among all ranks, or by 2 along i.
  xt::xarray<float> mesh_input(std::size_t nj) {
    std::mt19937 rng(18);
    return whole_numbers<float>(rng, {2, nj, 2 * nj, 2});
  }

  // pbroadcast over i, j and both (row-major and reversed), on every kind of 2-D mesh.
  auto mesh_broadcasts = [](auto x) {
    return std::tuple{namedax::pbroadcast(x, "i"_ax, 1), namedax::pbroadcast(x, "j"_ax, 0),
                      namedax::pbroadcast(x, namedax::axes("i"_ax, "j"_ax), 1),
                      namedax::pbroadcast(x, namedax::axes("j"_ax, "i"_ax), 1)};
  };
  TEST_CASE("pbroadcast on processes x processes, processes x vmap and processes x threads") {
    const auto x = mesh_input(processes / 2);
    auto expected = namedax::vmap<"i">(namedax::vmap<"j">(mesh_broadcasts))(x);
    check_same(namedax::mpi::pmap<"i">(namedax::mpi::pmap<"j">(mesh_broadcasts))(x), expected);
    check_same(namedax::mpi::pmap<"i">(namedax::vmap<"j">(mesh_broadcasts))(x), expected);
    check_same(namedax::mpi::pmap<"i">(namedax::pmap<"j">(mesh_broadcasts))(x), expected);
  }
  TEST_CASE("processes x processes: mpi::pmap of mpi::pmap, collectives over i, j and both") {
    const auto x = mesh_input(processes / 2);
    auto expected = namedax::vmap<"i">(namedax::vmap<"j">(mesh_collectives))(x);
    check_same(namedax::mpi::pmap<"i">(namedax::mpi::pmap<"j">(mesh_collectives))(x), expected);
  }
  TEST_CASE("processes x vmap: collectives over the process axis, the vectorized axis and both") {
    // "i" on 2 blocks of processes (each computes its index of "i"), "j" vectorized in each.
    const auto x = mesh_input(processes / 2);
    auto expected = namedax::vmap<"i">(namedax::vmap<"j">(mesh_collectives))(x);
    check_same(namedax::mpi::pmap<"i">(namedax::vmap<"j">(mesh_collectives))(x), expected);
  }
  TEST_CASE("processes x threads: collectives over the thread axis, the process axis and both") {
    const std::size_t nj = processes / 2;
    const auto x = mesh_input(nj);
    std::vector<std::pair<int, int>> ring;
    for (std::size_t k = 0; k < nj; ++k) ring.emplace_back(static_cast<int>(k), static_cast<int>((k + 1) % nj));
    auto f = [&](auto x) {
      return std::tuple{namedax::psum(x, "j"_ax), namedax::all_gather(x, "j"_ax),
                        namedax::all_to_all(x, "j"_ax, 0, 1, {.tiled = true}), namedax::ppermute(x, "j"_ax, ring),
                        namedax::pmax(x, "j"_ax)};
    };
    check_same(namedax::mpi::pmap<"i">(namedax::pmap<"j">(f))(x), namedax::vmap<"i">(namedax::vmap<"j">(f))(x));
    // The thread axis and the process axis in one mesh: every collective of the 2-D set.
    check_same(namedax::mpi::pmap<"i">(namedax::pmap<"j">(mesh_collectives))(x),
               namedax::vmap<"i">(namedax::vmap<"j">(mesh_collectives))(x));
  }

  TEST_CASE("shard_map on a mesh of processes x threads and of processes x processes, against a vectorized mesh") {
    // Rows split over ("i", "j"); the result of each block: its psum over "i", the gathered
    // blocks along "j", and the total over both (one value, out spec P()).
    const std::size_t nj = processes / 2;
    std::mt19937 rng(18);
    const auto x = whole_numbers<float>(rng, {2 * nj * 3, 2});
    auto f = [](auto block) {
      return std::tuple{namedax::psum(block, "i"_ax), namedax::all_gather(block, "j"_ax, {.tiled = true}),
                        namedax::psum(block, namedax::axes("i"_ax, "j"_ax))};
    };
    const auto in_specs = namedax::P(namedax::axes("i"_ax, "j"_ax));
    const auto out_specs = std::tuple{namedax::P("j"_ax), namedax::P("i"_ax), namedax::P()};
    namedax::mesh vectorized{namedax::vectorized<"i">(2), namedax::vectorized<"j">(nj)};
    const auto expected = namedax::shard_map(f, vectorized, in_specs, out_specs)(x);
    namedax::mesh threads{namedax::mpi::processes<"i">(2), namedax::devices<"j">(nj)};
    check_same(namedax::shard_map(f, threads, in_specs, out_specs)(x), expected);
    namedax::mesh both{namedax::mpi::processes<"i">(2), namedax::mpi::processes<"j">(nj)};
    check_same(namedax::shard_map(f, both, in_specs, out_specs)(x), expected);
    // The total against plain loops: block (i, j) holds the 3 rows from (i * nj + j) * 3.
    xt::xarray<float> total = xt::zeros<float>({3, 2});
    for (std::size_t b = 0; b < 2 * nj; ++b) total += xt::view(x, xt::range(b * 3, b * 3 + 3), xt::all());
    CHECK_BITWISE(std::get<1>(expected), x);  // each "i" half gathered along "j", concatenated over "i"
    CHECK_BITWISE(std::get<2>(expected), total);
  }
}

TEST_SUITE("errors") {
  TEST_CASE("bad input is a namedax::error on every process, in the collective's words") {
    const std::size_t n = processes;
    xt::xarray<int> x = xt::arange<int>(static_cast<int>(n));
    auto bad_groups = [](auto x) { return namedax::psum(x, "i"_ax, {.axis_index_groups = {{0, 1}, {1}}}); };
    const std::string message = error_of([&] { namedax::mpi::pmap<"i">(bad_groups)(x); });
    CHECK_MESSAGE(message.find("namedax::psum") != std::string::npos, message);
    CHECK_MESSAGE(message.find("index 1 twice") != std::string::npos, message);
    auto bad_perm = [](auto x) { return namedax::ppermute(x, "i"_ax, {{0, 1}, {0, 2}}); };
    CHECK(error_of([&] { namedax::mpi::pmap<"i">(bad_perm)(x); }).find("namedax::ppermute") != std::string::npos);
    const auto spread = error_of([&] { namedax::mpi::pmap<"i">(bad_groups)(xt::xarray<int>{1, 2, 3}); });
    CHECK_MESSAGE(spread.find("cannot be spread over") != std::string::npos, spread);
    // And the processes still work together afterwards.
    check_like_vmap([](auto x) { return namedax::psum(x, "i"_ax); }, 0, x);
  }
  TEST_CASE("an MPI error becomes a namedax::error with MPI's own error string") {
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    namedax::mpi::detail::channel channel(comm);  // takes the communicator over
    float in = 1, out = 0;
    const std::string what = error_of([&] { channel.sendrecv(&in, 1000, &out, -1, sizeof(float)); });
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(MPI_ERR_RANK, text, &length);
    CHECK_MESSAGE(what.find("namedax::mpi: MPI_Sendrecv failed: ") != std::string::npos, what);
    CHECK_MESSAGE(what.find(std::string(text, static_cast<std::size_t>(length))) != std::string::npos, what);
  }
  TEST_CASE("a process that throws: the others get a collective_error naming it, nobody hangs") {
    xt::xarray<float> x = xt::arange<float>(static_cast<float>(processes));
    auto f = [](auto x) {
      if (namedax::axis_index("i"_ax) == 1) throw std::runtime_error("bad shard");
      return namedax::psum(x, "i"_ax);
    };
    // Each process writes its flight record on the failure, where the variable says.
    const std::string record = (std::filesystem::temp_directory_path() / "namedax_test_flight_record").string();
    const std::string mine = record + "." + std::to_string(world_rank);
    std::filesystem::remove(mine);
    setenv("NAMEDAX_MPI_FLIGHT_RECORD", record.c_str(), 1);
    struct unset {
      ~unset() { unsetenv("NAMEDAX_MPI_FLIGHT_RECORD"); }
    } unset_at_exit;
    if (world_rank == 1) {
      try {
        namedax::mpi::pmap<"i">(f)(x);
        FAIL("no error");
      } catch (const std::runtime_error& e) {
        const std::string what = e.what();
        CHECK_MESSAGE(what.find("bad shard (thrown on process i=1 (rank 1))") != std::string::npos, what);
        CHECK(dynamic_cast<const namedax::collective_error*>(&e) == nullptr);
      }
    } else {
      const std::string what = collective_error_of([&] { namedax::mpi::pmap<"i">(f)(x); });
      CHECK_MESSAGE(what.find("process i=1 (rank 1) threw: bad shard") != std::string::npos, what);
    }
    std::ifstream file(mine);
    std::stringstream text;
    text << file.rdbuf();
    CHECK_MESSAGE(text.str().find("namedax flight record of process ") != std::string::npos, text.str());
    CHECK_MESSAGE(text.str().find(": namedax::mpi::pmap<\"i\"> [namedax::mpi::pmap<\"i\"> of axis size ") !=
                      std::string::npos,
                  text.str());
    CHECK_MESSAGE(text.str().find("then: process i=1 (rank 1) threw: bad shard") != std::string::npos, text.str());
    std::filesystem::remove(mine);
    check_like_vmap([](auto x) { return namedax::psum(x, "i"_ax); }, 0, x);
  }
  TEST_CASE("processes that call different collectives get a collective_error naming both calls") {
    xt::xarray<float> x = xt::arange<float>(static_cast<float>(processes));
    auto f = [](auto x) {
      if (namedax::axis_index("i"_ax) == 1) return namedax::pmax(x, "i"_ax);
      return namedax::psum(x, "i"_ax);
    };
    const std::string what = collective_error_of([&] { namedax::mpi::pmap<"i">(f)(x); });
    CHECK_MESSAGE(what.find("different calls") != std::string::npos, what);
    CHECK_MESSAGE(what.find("psum over ('i',)") != std::string::npos, what);
    CHECK_MESSAGE(what.find("pmax over ('i',)") != std::string::npos, what);
    CHECK_MESSAGE(what.find("process i=1 (rank 1)") != std::string::npos, what);
    // The same collective with different shapes.
    auto g = [](auto x) {
      xt::xarray<float> ones = xt::ones<float>({namedax::axis_index("i"_ax) == 0 ? 2u : 3u});
      return namedax::all_gather(x * ones, "i"_ax);
    };
    CHECK(collective_error_of([&] { namedax::mpi::pmap<"i">(g)(x); }).find("different calls") != std::string::npos);
    check_like_vmap([](auto x) { return namedax::psum(x, "i"_ax); }, 0, x);
    // A collective matmul whose ring meets other shapes on process 1: named as the function called.
    const xt::xarray<float> rows = xt::ones<float>({processes, 2 * processes, std::size_t{3}});
    const xt::xarray<float> right = xt::ones<float>({processes, std::size_t{3}, std::size_t{2}});
    auto wider = [](auto x, auto w) {
      if (namedax::axis_index("i"_ax) == 1)
        return namedax::eval(namedax::matmul_reduce_scatter(x, namedax::concat(std::tuple{w, w}, 1), "i"_ax));
      return namedax::eval(namedax::matmul_reduce_scatter(x, w, "i"_ax));
    };
    const std::string ring = collective_error_of([&] { namedax::mpi::pmap<"i">(wider)(rows, right); });
    CHECK_MESSAGE(ring.find("different calls") != std::string::npos, ring);
    CHECK_MESSAGE(ring.find("(in namedax::matmul_reduce_scatter)") != std::string::npos, ring);
  }
}

TEST_SUITE("small all-reduces and all-gathers: the agreement carries the payload") {
  TEST_CASE("a small all-reduce or all-gather over every process is one MPI call; a larger one, or in groups, two") {
    const std::size_t n = processes;
    long calls = -1;
    // The MPI_Iallreduce and MPI_Iallgather calls of one collective inside a process map.
    auto counted = [&calls](auto collective) {
      return [&calls, collective](auto v) {
        const long before = collective_calls;
        auto r = collective(v);  // a collective over processes runs when it is called
        calls = collective_calls - before;
        return r;
      };
    };
    const xt::xarray<float> fits = xt::ones<float>({n, std::size_t{256}});  // 1 KiB per process
    const xt::xarray<float> larger = xt::ones<float>({n, std::size_t{257}});
    const xt::xarray<double> doubles = xt::ones<double>({n, std::size_t{128}});
    auto sum = [](auto v) { return namedax::psum(v, "i"_ax); };
    auto expect_calls = [&](auto collective, const auto& x, long expected) {
      calls = -1;
      (void)namedax::mpi::pmap<"i">(counted(collective))(x);
      CHECK(calls == expected);
    };
    expect_calls(sum, fits, 1);
    expect_calls([](auto v) { return namedax::pmax(v, "i"_ax); }, fits, 1);
    expect_calls([](auto v) { return namedax::pmin(v, "i"_ax); }, doubles, 1);
    expect_calls([](auto v) { return namedax::pmean(v, "i"_ax); }, doubles, 1);
    expect_calls([](auto v) { return namedax::psum(std::tuple{v, v}, "i"_ax); }, xt::ones<float>({n, std::size_t{4}}), 1);
    expect_calls(sum, larger, 2);  // the agreement, then MPI_Allreduce
    expect_calls([&](auto v) { return namedax::psum(v, "i"_ax, {.axis_index_groups = pairs_reversed(n)}); }, fits, 2);
    // An all-gather whose blocks together fit 1 KiB.
    auto gather = [](auto v) { return namedax::all_gather(v, "i"_ax); };
    expect_calls(gather, xt::ones<float>({n, 256 / n}), 1);
    expect_calls([](auto v) { return namedax::all_gather(v, "i"_ax, {.tiled = true}); }, xt::ones<double>({n, 128 / n}), 1);
    expect_calls(gather, xt::ones<float>({n, 256 / n + 1}), 2);
    expect_calls([&](auto v) { return namedax::all_gather(v, "i"_ax, {.axis_index_groups = pairs_reversed(n)}); },
                 xt::ones<float>({n, std::size_t{2}}), 2);
  }

  TEST_CASE_TEMPLATE("small psum, pmax, pmin, pmean and all_gather over processes: the device path's bits", T, float,
                     double, std::int32_t, std::int64_t) {
    std::mt19937 rng(37);
    const std::size_t n = processes;
    auto f = [](auto x) {
      return std::tuple{namedax::psum(x, "i"_ax), namedax::pmax(x, "i"_ax), namedax::pmin(x, "i"_ax),
                        namedax::pmean(x, "i"_ax), namedax::psum(std::tuple{x, x}, "i"_ax), namedax::all_gather(x, "i"_ax)};
    };
    // A scalar, a few elements, and as many as 1 KiB holds (and one more: the other path).
    for (std::size_t elements : {std::size_t{0}, std::size_t{1}, std::size_t{7}, 1024 / sizeof(T), 1024 / sizeof(T) + 1}) {
      CAPTURE(elements);
      xt::xarray<T> x = elements ? whole_numbers<T>(rng, {n, elements}) : whole_numbers<T>(rng, {n});
      if constexpr (std::is_floating_point_v<T>) {
        if (elements > 2) {
          x(1, 0) = std::numeric_limits<T>::quiet_NaN();
          x(0, 1) = std::numeric_limits<T>::infinity(), x(n - 1, 1) = -std::numeric_limits<T>::infinity();
        }
      } else if (elements > 2) {
        x(1, 0) = std::numeric_limits<T>::max(), x(0, 1) = std::numeric_limits<T>::min();
      }
      check_same(namedax::mpi::pmap<"i">(f)(x), namedax::pmap<"i">(f)(x));
    }
  }

  TEST_CASE("processes that disagree on a small all-reduce all get the same collective_error, and nobody hangs") {
    const std::size_t n = processes;
    const xt::xarray<float> x = xt::ones<float>({n, std::size_t{1000}});
    const auto first = [](std::size_t k) { return xt::range(std::size_t{0}, k); };
    // Process 1 calls `odd`, the others `even`; the error names both calls.
    auto check_disagreement = [&](auto even, auto odd, const std::string& calls) {
      auto f = [&](auto v) {
        if (namedax::axis_index("i"_ax) == 1) (void)namedax::eval(odd(v));
        else (void)namedax::eval(even(v));
        return v;
      };
      const std::string what = collective_error_of([&] { namedax::mpi::pmap<"i">(f)(x); });
      CAPTURE(world_rank);
      CHECK_MESSAGE(what.find("processes made different calls at the same point: process i=0 (rank 0) called " + calls) !=
                        std::string::npos,
                    what);
      CHECK_MESSAGE(what.find("; every process must make the same collective calls in the same order") != std::string::npos,
                    what);
    };
    auto psum_of = [&](std::size_t k) { return [&, k](auto v) { return namedax::psum(namedax::view(v, first(k)), "i"_ax); }; };
    check_disagreement(psum_of(3), psum_of(5),
                       "psum over ('i',) of payload shape (3,) and type float32, process i=1 (rank 1) called psum over "
                       "('i',) of payload shape (5,) and type float32");
    check_disagreement(psum_of(8), [&](auto v) { return namedax::pmax(namedax::view(v, first(8)), "i"_ax); },
                       "psum over ('i',) of payload shape (8,) and type float32, process i=1 (rank 1) called pmax "
                       "over ('i',) of payload shape (8,) and type float32");
    // A payload the agreement carries against one it does not, against another collective, and
    // against the same bytes of another type.
    check_disagreement(psum_of(8), psum_of(1000),
                       "psum over ('i',) of payload shape (8,) and type float32, process i=1 (rank 1) called psum over "
                       "('i',) of payload shape (1000,) and type float32");
    check_disagreement(psum_of(8), [&](auto v) { return namedax::all_gather(namedax::view(v, first(8)), "i"_ax); },
                       "psum over ('i',) of payload shape (8,) and type float32, process i=1 (rank 1) called all_gather");
    check_disagreement(psum_of(8),
                       [&](auto v) { return namedax::psum(namedax::cast<double>(namedax::view(v, first(4))), "i"_ax); },
                       "psum over ('i',) of payload shape (8,) and type float32, process i=1 (rank 1) called psum over "
                       "('i',) of payload shape (4,) and type float64");
    // And the processes still work together afterwards.
    check_like_vmap([](auto v) { return namedax::psum(v, "i"_ax); }, 0, x);
  }
}

TEST_SUITE("one process fails alone") {
  TEST_CASE("its own arguments fail a check: every process raises a namedax::error naming it") {
    const std::size_t n = processes;
    xt::xarray<float> x = xt::arange<float>(static_cast<float>(n));
    auto f = [](auto x) { return namedax::psum(x, "i"_ax); };
    const bool odd = world_rank == 1;
    // An in_axes out of range on process 1 alone.
    check_every_process_names_rank_1(
        [&] { namedax::mpi::pmap<"i">(f, odd ? 3 : 0)(x); },
        "namedax::mpi::pmap<\"i\">: in_axes of argument 0 is 3, out of range for 1 position (valid: -1 to 0) "
        "(thrown on process rank 1)",
        "namedax::mpi::pmap<\"i\"> on process i=" + std::to_string(world_rank) + " (rank " + std::to_string(world_rank) +
            "): process rank 1 threw: namedax::mpi::pmap<\"i\">: in_axes of argument 0 is 3, out of range for 1 position (valid: -1 to 0)");
    // A size that does not divide the processes, on process 1 alone.
    xt::xarray<float> longer = xt::arange<float>(static_cast<float>(n + 1));
    check_every_process_names_rank_1(
        [&] { namedax::mpi::pmap<"i">(f)(odd ? longer : x); },
        "namedax::mpi::pmap<\"i\">: an axis of size " + std::to_string(n + 1) + " cannot be spread over " +
            std::to_string(n) + " processes; the number of processes must be a multiple of the axis size (thrown on "
            "process rank 1)",
        "process rank 1 threw: namedax::mpi::pmap<\"i\">: an axis of size " + std::to_string(n + 1));
    // Process 1 passes its own slice, the others the whole array: no process fails a check, but
    // they would exchange different results.
    xt::xarray<float> mine = xt::view(x, xt::range(world_rank, world_rank + 1));
    const std::string call = "namedax::mpi::pmap<\"i\"> of axis size " + std::to_string(n);
    const std::string whole_and_own = "process i=0 (rank 0) called " + call +
                                      " on the whole arguments with out_axes 0, process i=1 (rank 1) called " + call +
                                      " on its own slices with out_axes 0";
    check_every_process_names_rank_1<namedax::collective_error>([&] { namedax::mpi::pmap<"i">(f)(odd ? mine : x); },
                                                                whole_and_own, whole_and_own);
    // An out_axes out of range on process 1, which only stacking the results would find.
    auto pair = [](auto x) { return std::tuple{namedax::psum(x, "i"_ax), x}; };
    const std::string out_axes_5 = "process i=1 (rank 1) called " + call + " on the whole arguments with out_axes 5";
    check_every_process_names_rank_1<namedax::collective_error>(
        [&] { namedax::mpi::pmap<"i">(pair, 0, odd ? 5 : 0)(x); }, out_axes_5, out_axes_5);
    // An inner process map whose in_axes is out of range on process 1 (i = 1 / (processes / 2)).
    xt::xarray<float> grid = xt::ones<float>({std::size_t{2}, n / 2, std::size_t{3}});
    auto inner = [&](auto x) { return namedax::mpi::pmap<"j">([](auto x) { return namedax::psum(x, "j"_ax); }, odd ? 5 : 0)(x); };
    const std::string rank_1 = "process i=" + std::to_string(1 / (n / 2)) + " (rank 1)";
    check_every_process_names_rank_1(
        [&] { namedax::mpi::pmap<"i">(inner)(grid); },
        "namedax::mpi::pmap<\"j\">: in_axes of argument 0 is 5, out of range for 2 positions (valid: -2 to 1) "
        "(thrown on " + rank_1 + ")",
        rank_1 + " threw: namedax::mpi::pmap<\"j\">: in_axes of argument 0 is 5, out of range for 2 positions (valid: -2 to 1)");
    // And the processes still work together afterwards.
    check_like_vmap(f, 0, x);
  }
  TEST_CASE("psum of int8 on one process and int16 on the others is a collective_error everywhere") {
    xt::xarray<int> x = xt::arange<int>(static_cast<int>(processes));
    auto f = [](auto x) {
      if (namedax::axis_index("i"_ax) == 1)
        return namedax::eval(namedax::cast<std::int32_t>(namedax::psum(namedax::cast<std::int8_t>(x), "i"_ax)));
      return namedax::eval(namedax::cast<std::int32_t>(namedax::psum(namedax::cast<std::int16_t>(x), "i"_ax)));
    };
    const std::string what = collective_error_of([&] { namedax::mpi::pmap<"i">(f)(x); });
    CHECK_MESSAGE(what.find("processes made different calls at the same point: process i=0 (rank 0) called psum over "
                            "('i',) of payload shape () and type int16, process i=1 (rank 1) called psum over ('i',) of "
                            "payload shape () and type int8") != std::string::npos,
                  what);
    check_like_vmap([](auto x) { return namedax::psum(x, "i"_ax); }, 0, x);
  }
  TEST_CASE("user code throws on one process at each stage: every process raises an error naming it") {
    xt::xarray<float> x = xt::arange<float>(static_cast<float>(processes));
    for (int stage = 0; stage < 3; ++stage) {
      CAPTURE(stage);
      // Before any collective, between two, or after the last (the others have returned).
      auto f = [stage](auto x) {
        const bool throws = static_cast<bool>(namedax::axis_index("i"_ax) == 1);
        if (throws && stage == 0) throw std::runtime_error("bad shard");
        auto s = namedax::psum(x, "i"_ax);
        if (throws && stage == 1) throw std::runtime_error("bad shard");
        auto m = namedax::pmax(s, "i"_ax);
        if (throws && stage == 2) throw std::runtime_error("bad shard");
        return m;
      };
      std::string what;
      try {
        namedax::mpi::pmap<"i">(f)(x);
        what = "no error";
      } catch (const std::exception& e) {
        what = e.what();
        const bool collective = dynamic_cast<const namedax::collective_error*>(&e) != nullptr;
        CHECK(collective == (world_rank != 1));
      }
      CHECK_MESSAGE(what.find(world_rank == 1 ? "bad shard (thrown on process i=1 (rank 1))"
                                              : "process i=1 (rank 1) threw: bad shard") != std::string::npos,
                    what);
    }
    // In the arguments: process 1 gives an expression that throws as the map evaluates it.
    auto throwing = xt::make_lambda_xfunction([](float) -> float { throw std::runtime_error("bad value"); }, x);
    auto sum = [](auto x) { return namedax::psum(x, "i"_ax); };
    check_every_process_names_rank_1<std::runtime_error>(
        [&] { world_rank == 1 ? namedax::mpi::pmap<"i">(sum)(throwing) : namedax::mpi::pmap<"i">(sum)(x); },
        "bad value (thrown on process rank 1)", "process rank 1 threw: bad value");
    check_like_vmap([](auto x) { return namedax::psum(x, "i"_ax); }, 0, x);
  }
  TEST_CASE("a device thread of one process throws, or its pmap's arguments fail a check: every process raises an error") {
    xt::xarray<float> x = xt::ones<float>({processes, std::size_t{2}});
    auto f = [](auto x) {
      if (namedax::axis_index("i"_ax) == 1 && namedax::axis_index("j"_ax) == 1) throw std::runtime_error("bad device");
      return namedax::psum(x, namedax::axes("i"_ax, "j"_ax));
    };
    check_every_process_names_rank_1<std::runtime_error>([&] { namedax::mpi::pmap<"i">(namedax::pmap<"j">(f))(x); },
                                                         "bad device", "process i=1 (rank 1) threw: bad device");
    auto sum = [](auto x) { return namedax::psum(x, namedax::axes("i"_ax, "j"_ax)); };
    const int in_axis = world_rank == 1 ? 4 : 0;
    check_every_process_names_rank_1(
        [&] { namedax::mpi::pmap<"i">([&](auto x) { return namedax::pmap<"j">(sum, in_axis)(x); })(x); },
        "namedax::pmap<\"j\">: in_axes of argument 0 is 4, out of range for 1 position (valid: -1 to 0) (thrown on "
        "process i=1 (rank 1))",
        "process i=1 (rank 1) threw: namedax::pmap<\"j\">: in_axes of argument 0 is 4, out of range for 1 position (valid: -1 to 0)");
    check_same(namedax::mpi::pmap<"i">(namedax::pmap<"j">(sum))(x), namedax::vmap<"i">(namedax::vmap<"j">(sum))(x));
  }
}

namespace {

/// Fault injection on process 1: at `point`, the first time a collective under test reaches it.
struct process_fault {
  std::atomic<bool> armed{false}, used{false};  // armed once per run, by the first device thread
  namedax::detail::fault_point point = namedax::detail::fault_point::arrival;
  std::atomic<int> fired{0};
};
process_fault injected;
constexpr const char* fault_point_names[] = {"arrival", "exchanged", "reading", "allocation"};

void inject_on_process(namedax::detail::fault_point point, std::string_view operation) {
  if (point != injected.point || !injected.armed.exchange(false)) return;
  ++injected.fired;
  if (point == namedax::detail::fault_point::allocation) throw std::bad_alloc();
  throw std::runtime_error(namedax::detail::message("injected fault at ", fault_point_names[static_cast<int>(point)],
                                                    " of ", operation));
}

/// Runs `map` with a fault at `point` on process 1, armed around `collective` in the mapped
/// function: process 1 must raise its own exception, every other process a collective_error
/// naming it, and none may hang (the watchdog).
template <class Map>
void check_fault_on_process_1(namedax::detail::fault_point point, Map map) {
  namedax::detail::fault_injection() = &inject_on_process;
  injected.point = point, injected.fired = 0, injected.used = false;
  std::string what = "no error";
  bool collective = false;
  try {
    map();
  } catch (const std::exception& e) {
    what = e.what();
    collective = dynamic_cast<const namedax::collective_error*>(&e) != nullptr;
  }
  injected.armed = false;
  namedax::detail::fault_injection() = nullptr;
  const std::string at = fault_point_names[static_cast<int>(point)];
  CAPTURE(world_rank);
  CAPTURE(at);
  if (world_rank == 1) {
    CHECK(injected.fired == 1);
    CHECK_MESSAGE(what.find(point == namedax::detail::fault_point::allocation ? "bad_alloc" : "injected fault at ") !=
                      std::string::npos,
                  what);
  } else {
    CHECK_MESSAGE(collective, what);
    CHECK_MESSAGE(what.find("process i=1 (rank 1) threw: ") != std::string::npos, what);
  }
}

/// `collective` mapped over "i" by processes, with the fault armed on process 1 around it.
template <class C>
auto armed_around(C collective) {
  return [collective](auto x) {
    if (world_rank == 1 && !injected.used.exchange(true)) injected.armed = true;
    auto y = collective(x);  // a collective runs when it is called
    if (!namedax::detail::current_device()) injected.armed = false;  // device threads: after the map
    return y;
  };
}

}  // namespace

TEST_SUITE("fault injection on one process") {
  using namedax::detail::fault_point;
  constexpr fault_point process_points[] = {fault_point::arrival, fault_point::exchanged, fault_point::allocation};

  TEST_CASE("each process path: a fault on process 1 at each point makes every process raise an error naming it") {
    const std::size_t n = processes;
    const xt::xarray<float> x = xt::arange<float>(static_cast<float>(n * n * 2)).reshape({n, n, std::size_t{2}});
    std::vector<std::pair<int, int>> ring;
    for (std::size_t k = 0; k < n; ++k) ring.emplace_back(static_cast<int>(k), static_cast<int>((k + 1) % n));
    const auto groups = pairs_reversed(n);
    auto run = [&](const std::string& path, auto collective) {
      CAPTURE(path);
      for (fault_point point : process_points)
        check_fault_on_process_1(point, [&] { namedax::mpi::pmap<"i">(armed_around(collective))(x); });
      // A later process map works: namedax makes new communicators after a failure.
      check_like_vmap(collective, 0, x);
    };
    run("reduction (MPI_Allreduce)", [](auto x) { return namedax::psum(x, "i"_ax); });
    run("reduction in groups", [&](auto x) { return namedax::pmax(x, "i"_ax, {.axis_index_groups = groups}); });
    run("fused pytree reduction", [](auto x) { return namedax::psum(std::tuple{x, x * 2.0f}, "i"_ax); });
    run("all_gather (MPI_Allgather)", [](auto x) { return namedax::all_gather(x, "i"_ax); });
    run("all_gather along axis 1 (gathering every member)",
        [](auto x) { return namedax::all_gather(x, "i"_ax, {.axis = 1}); });
    run("psum_scatter (MPI_Reduce_scatter_block)",
        [](auto x) { return namedax::psum_scatter(x, "i"_ax, {.tiled = true}); });
    run("all_to_all (MPI_Alltoall)", [](auto x) { return namedax::all_to_all(x, "i"_ax, 0, 0, {.tiled = true}); });
    run("ppermute (MPI_Sendrecv)", [&](auto x) { return namedax::ppermute(x, "i"_ax, ring); });
  }
  TEST_CASE("device threads inside processes (the funnel): a fault on process 1 at each point") {
    const xt::xarray<float> x = xt::arange<float>(static_cast<float>(processes * 2 * 3)).reshape({processes, std::size_t{2}, std::size_t{3}});
    auto sum = [](auto x) { return namedax::psum(x, namedax::axes("i"_ax, "j"_ax)); };
    for (fault_point point : {fault_point::arrival, fault_point::exchanged, fault_point::reading, fault_point::allocation})
      check_fault_on_process_1(point, [&] { namedax::mpi::pmap<"i">(namedax::pmap<"j">(armed_around(sum)))(x); });
    check_same(namedax::mpi::pmap<"i">(namedax::pmap<"j">(sum))(x), namedax::vmap<"i">(namedax::vmap<"j">(sum))(x));
  }
}

namespace {
/// Makes process 2 late to its call, after the agreement: its partners wait meanwhile.
void delay_process_2(namedax::detail::fault_point point, std::string_view) {
  if (point == namedax::detail::fault_point::exchanged && world_rank == 2)
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
}
}  // namespace

TEST_SUITE("fault injection on one process") {
  TEST_CASE("a process that fails after completing a call does not cut that call short on the others") {
    // Process 1 completes its ppermute (from process 0) and then throws, while process 3 still
    // waits for the late process 2: process 3's call must complete, and the failure reach it at
    // the next agreement. A notice that stopped it would also cross into a later collective.
    if (processes < 4) return;
    const xt::xarray<float> x = xt::arange<float>(static_cast<float>(processes * 2)).reshape({processes, std::size_t{2}});
    bool returned = false;
    auto f = [&](auto v) {
      auto moved = namedax::eval(namedax::ppermute(v, "i"_ax, {{0, 1}, {2, 3}}));
      returned = true;
      if (world_rank == 1) throw std::runtime_error("process 1 fails after its ppermute");
      return moved;
    };
    namedax::detail::fault_injection() = &delay_process_2;
    std::string what = "no error";
    try {
      (void)namedax::mpi::pmap<"i">(f)(x);
    } catch (const std::exception& e) {
      what = e.what();
    }
    namedax::detail::fault_injection() = nullptr;
    CAPTURE(world_rank);
    CAPTURE(what);
    CHECK(returned);
    CHECK(what.find("process 1 fails after its ppermute") != std::string::npos);
  }
}

TEST_SUITE("differential") {
  // Random shapes, axis sizes (divisors of the number of processes), groups and permutations,
  // the same on every process (one seed).
  template <class T>
  void random_run(std::mt19937& rng) {
    std::vector<std::size_t> sizes;
    for (std::size_t d = 1; d <= processes; ++d)
      if (processes % d == 0) sizes.push_back(d);
    const std::size_t n = sizes[std::uniform_int_distribution<std::size_t>(0, sizes.size() - 1)(rng)];
    std::uniform_int_distribution<std::size_t> extent(1, 3);
    const std::size_t a = extent(rng), b = extent(rng);
    auto x = whole_numbers<T>(rng, {n, n * a, b});
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    const std::size_t per = n % 2 == 0 && std::uniform_int_distribution<int>(0, 1)(rng) ? n / 2 : n;
    std::vector<std::vector<int>> groups(n / per);
    for (std::size_t k = 0; k < n; ++k) groups[k / per].push_back(order[k]);
    std::vector<std::pair<int, int>> perm;
    for (std::size_t k = 0; k + 1 < n; k += 2) perm.emplace_back(order[k], order[k + 1]);
    const int axis = std::uniform_int_distribution<int>(0, 2)(rng);
    CAPTURE(n);
    CAPTURE(a);
    CAPTURE(b);
    CAPTURE(per);
    auto f = [&](auto x) {
      return std::tuple{namedax::psum(x, "i"_ax, {.axis_index_groups = groups}),
                        namedax::pmean(x, namedax::axes("i"_ax, 1)),
                        namedax::pmin(x, "i"_ax),
                        namedax::all_gather(x, "i"_ax, {.axis = axis}),
                        namedax::all_gather(x, "i"_ax, {.axis_index_groups = groups, .axis = axis % 2, .tiled = true}),
                        namedax::psum_scatter(x, "i"_ax, {.scatter_dimension = 0, .axis_index_groups = groups, .tiled = true}),
                        namedax::all_to_all(x, "i"_ax, 0, 1, {.tiled = true}),
                        namedax::all_to_all(x, "i"_ax, 0, 0, {.axis_index_groups = groups, .tiled = true}),
                        namedax::ppermute(x, "i"_ax, perm),
                        namedax::pargmin(x, "i"_ax, {.axis_index_groups = groups})};
    };
    check_same(namedax::mpi::pmap<"i">(f, 0, 0, n)(x), namedax::vmap<"i">(f)(x));
  }

  TEST_CASE_TEMPLATE("random shapes, sizes, groups and permutations against vmap", T, float, std::int32_t) {
    std::mt19937 rng(20261203);
    for (int run = 0; run < 8; ++run) random_run<T>(rng);
  }
}

int main(int argc, char** argv) {
  namedax::mpi::environment environment(argc, argv);
  processes = static_cast<std::size_t>(environment.size());
  world_rank = static_cast<std::size_t>(environment.rank());
  if (processes % 2 != 0) {
    if (world_rank == 0) std::fprintf(stderr, "run the MPI tests on an even number of processes\n");
    return 2;
  }
  doctest::Context context(argc, argv);
  if (world_rank != 0) context.setOption("minimal", true);  // the other processes report failures only
  const int failed = context.run() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (world_rank == 0)
    std::printf("%zu processes: %s\n", processes, any_failed ? "some process failed" : "every process passed");
  return any_failed;
}
