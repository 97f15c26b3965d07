// SPDX-License-Identifier: MIT
// Fault injection: for every collective and each of its paths among device threads (one-shot,
// lent, chunked, shared outputs, by reference, grouped, a pytree's leaves), one device fails at
// each point of the exchange (before it arrives, after the first barrier, while the others may
// read its payload, while it allocates an output), with every operand form on every device
// (evaluated, strided view, lazy expression, broadcast, and a mix of them). Every device must
// get an error, the first one must reach the caller, and nothing may crash or hang (under the
// sanitizers too). Without a fault, every mix of forms must give vmap's bits.
#include "test_support.hpp"

#include <xtensor/xview.hpp>

#include <array>
#include <atomic>
#include <complex>
#include <cstdint>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>

using namespace namedax::literals;
using namedax::detail::fault_point;

namespace {

constexpr int devices = 4;
constexpr const char* point_names[] = {"arrival", "exchanged", "reading", "allocation"};
constexpr const char* form_names[] = {"evaluated", "strided", "lazy", "broadcast", "mixed"};
constexpr int mixed = 4;  // each device its own form

/// What the injection does in the current run: at `point`, on the device whose body armed it.
struct injection_plan {
  bool active = false;
  fault_point point = fault_point::arrival;
  int device = 0;
  std::atomic<int> fired{0};
  std::array<std::atomic<bool>, devices> failed{};  // which devices saw an error
  // What each device got from the collective under test, when it got anything: a device that
  // did must have got the right values, even when another device failed.
  std::array<std::optional<xt::xarray<float>>, devices> results;
};
injection_plan plan;
thread_local bool armed = false;  // on the target device, around the collective under test

void inject(fault_point point, std::string_view operation) {
  if (!armed || point != plan.point) return;
  armed = false;
  ++plan.fired;
  if (point == fault_point::allocation) throw std::bad_alloc();
  throw std::runtime_error(namedax::detail::message("injected fault at ", point_names[static_cast<int>(point)], " of ",
                                                    operation));
}

/// Installs the hook for the scope of a test case.
struct hook_scope {
  hook_scope() { namedax::detail::fault_injection() = &inject; }
  ~hook_scope() { namedax::detail::fault_injection() = nullptr; }
};

/// This device's index along "i" (device mode only: SPMD control flow).
int device_index() {
  int d = 0;
  for (int k = 1; k < devices; ++k)
    if (namedax::axis_index("i"_ax) == k) d = k;
  return d;
}

/// Calls g with the operand in one of the forms: `x0` is the member mapped from a contiguous
/// array, `xs` the same values mapped from a transposed copy (a strided view).
template <class X0, class XS, class G>
auto with_form(int form, const X0& x0, const XS& xs, G g) {
  static const xt::xarray<float> zeros = xt::zeros<float>({1});
  switch (form) {
    case 0: return g(namedax::eval(x0));
    case 1: return g(xs);
    case 2: return g(x0 * 1.0f);
    default: return g(x0 + zeros);
  }
}

std::size_t cases_run = 0, faults_run = 0;

/// Runs one collective (`collective(operand)` gives a named float value) on 4 devices with
/// members of `member_shape`, in every form assignment, without and with each fault.
template <class Collective>
void run_case(const char* name, std::vector<std::size_t> member_shape, Collective collective) {
  std::mt19937 rng(7);
  std::vector<std::size_t> shape{devices};
  shape.insert(shape.end(), member_shape.begin(), member_shape.end());
  const xt::xarray<float> x = namedax_test::random_array<float>(rng, shape);
  std::vector<std::size_t> order;
  for (std::size_t d = 1; d < shape.size(); ++d) order.push_back(d);
  order.push_back(0);
  const xt::xarray<float> xs = xt::transpose(x, order);
  const auto in_axes = std::tuple{0, static_cast<int>(member_shape.size())};

  const xt::xarray<float> reference =
      namedax::vmap<"i">([&](auto x0, auto) { return namedax::eval(collective(namedax::eval(x0))); }, in_axes)(x, xs);
  for (int assignment = 0; assignment <= mixed; ++assignment) {
    auto body = [&](auto x0, auto strided) {
      const int d = device_index();
      return with_form(assignment == mixed ? d : assignment, x0, strided, [&](const auto& operand) {
        if (plan.active && d == plan.device) armed = true;
        try {
          auto result = namedax::eval(collective(operand));
          armed = false;
          plan.results[static_cast<std::size_t>(d)] = xt::xarray<float>(result.payload());
          // A later collective: a device that finished the faulty one learns of the fault here.
          (void)namedax::pmax(x0, "i"_ax);
          return result;
        } catch (...) {
          armed = false;
          plan.failed[static_cast<std::size_t>(d)] = true;
          throw;
        }
      });
    };
    INFO(std::string(name), ", operands ", std::string(form_names[assignment]));
    plan.active = false;
    CHECK_BITWISE(namedax::pmap<"i">(body, in_axes)(x, xs), reference);
    ++cases_run;

    for (int point = 0; point < 4; ++point)
      for (int device : {0, devices - 1}) {
        INFO("fault at ", std::string(point_names[point]), " on device ", device);
        plan.active = true, plan.point = static_cast<fault_point>(point), plan.device = device, plan.fired = 0;
        for (auto& f : plan.failed) f = false;
        for (auto& r : plan.results) r.reset();
        std::string caught = "no error";
        try {
          const xt::xarray<float> out = namedax::pmap<"i">(body, in_axes)(x, xs);
          // An output shared from device 0 is allocated there alone: another device allocates none.
          if (plan.fired == 0) CHECK_BITWISE(out, reference);
        } catch (const std::bad_alloc&) {
          caught = "bad_alloc";
        } catch (const std::exception& e) {
          caught = e.what();
        }
        ++faults_run;
        if (plan.point != fault_point::allocation) REQUIRE(plan.fired == 1);
        if (plan.fired == 0) continue;
        if (plan.point == fault_point::allocation) CHECK(caught == "bad_alloc");
        else CHECK(caught.find("injected fault at") != std::string::npos);
        for (int k = 0; k < devices; ++k) {
          INFO("device ", k);
          CHECK(plan.failed[static_cast<std::size_t>(k)]);
          if (const auto& got = plan.results[static_cast<std::size_t>(k)])
            CHECK_BITWISE(*got, xt::xarray<float>(xt::view(reference, k)));
        }
      }
  }
  plan.active = false;
}

}  // namespace

TEST_SUITE("faults") {
  TEST_CASE("a device that fails at any point of any collective, with operands in any form, fails the map cleanly") {
    hook_scope hook;
    using V = std::vector<std::size_t>;
    const std::vector<std::vector<int>> halves{{0, 1}, {2, 3}};
    // Reductions: one shot (copied into the communicator), lent, chunked, grouped, a pytree.
    run_case("psum, one shot", V{3}, [](const auto& v) { return namedax::psum(v, "i"_ax); });
    run_case("psum, lent", V{2000}, [](const auto& v) { return namedax::psum(v, "i"_ax); });
    run_case("psum, chunked", V{70000}, [](const auto& v) { return namedax::psum(v, "i"_ax); });
    run_case("pmean, lent", V{2000}, [](const auto& v) { return namedax::pmean(v, "i"_ax); });
    run_case("pmax, one shot", V{5}, [](const auto& v) { return namedax::pmax(v, "i"_ax); });
    run_case("pmin, lent", V{2000}, [](const auto& v) { return namedax::pmin(v, "i"_ax); });
    run_case("psum, grouped", V{2000}, [&](const auto& v) { return namedax::psum(v, "i"_ax, {.axis_index_groups = halves}); });
    run_case("psum of a pair", V{2000}, [](const auto& v) {
      auto [a, b] = namedax::psum(std::pair{v, v * 2.0f}, "i"_ax);
      return a + b;
    });
    // Gathers and exchanges: the rule's frame, shared outputs, groups.
    run_case("all_gather, one shot", V{3}, [](const auto& v) { return namedax::all_gather(v, "i"_ax); });
    run_case("all_gather, shared output", V{2000}, [](const auto& v) { return namedax::all_gather(v, "i"_ax); });
    run_case("all_gather, grouped", V{2000}, [&](const auto& v) {
      return namedax::all_gather(v, "i"_ax, {.axis_index_groups = halves});
    });
    run_case("psum_scatter", V{4, 500}, [](const auto& v) { return namedax::psum_scatter(v, "i"_ax); });
    run_case("all_to_all", V{4, 500}, [](const auto& v) { return namedax::all_to_all(v, "i"_ax, 0, 0); });
    run_case("pargmax", V{2000}, [](const auto& v) { return namedax::cast<float>(namedax::pargmax(v, "i"_ax)); });
    // Moves by reference: one leaf, a pytree, a shuffle.
    run_case("ppermute", V{2000}, [](const auto& v) { return namedax::ppermute(v, "i"_ax, {{0, 1}, {1, 2}, {2, 3}, {3, 0}}); });
    run_case("ppermute of a pair", V{3}, [](const auto& v) {
      auto [a, b] = namedax::ppermute(std::pair{v, v * 2.0f}, "i"_ax, {{0, 2}, {2, 0}});
      return a + b;
    });
    run_case("pshuffle", V{3}, [](const auto& v) { return namedax::pshuffle(v, "i"_ax, {3, 2, 1, 0}); });
    // A broadcast from one device: small, large, and a pair.
    run_case("pbroadcast, one shot", V{3}, [](const auto& v) { return namedax::pbroadcast(v, "i"_ax, 2); });
    run_case("pbroadcast, lent", V{2000}, [](const auto& v) { return namedax::pbroadcast(v, "i"_ax, 1); });
    run_case("pbroadcast of a pair", V{3}, [](const auto& v) {
      auto [a, b] = namedax::pbroadcast(std::pair{v, v * 2.0f}, "i"_ax, 3);
      return a + b;
    });
    MESSAGE(cases_run, " runs without a fault and ", faults_run, " with one");
    CHECK(faults_run == cases_run * 8);
  }

  TEST_CASE("element types of one size but different kinds never meet in one exchange") {
    // int8 and int16 once shared the name "int" in the signature: the devices exchanged
    // payloads of different sizes. Each type now has JAX's name.
    const xt::xarray<float> x = xt::ones<float>({4, 6000});
    auto f = [](auto v) {
      if (device_index() == 0) return namedax::eval(namedax::cast<float>(namedax::psum(namedax::cast<std::int8_t>(v), "i"_ax)));
      return namedax::eval(namedax::cast<float>(namedax::psum(namedax::cast<std::int16_t>(v), "i"_ax)));
    };
    const std::string text = namedax_test::error_of([&] { (void)namedax::pmap<"i">(f)(x); });
    CHECK(text.find("devices made different collective calls") != std::string::npos);
    CHECK(text.find("and type int8") != std::string::npos);
    CHECK(text.find("and type int16") != std::string::npos);
    CHECK(namedax::detail::dtype_name<std::uint8_t>() == "uint8");
    CHECK(namedax::detail::dtype_name<std::uint16_t>() == "uint16");
    CHECK(namedax::detail::dtype_name<std::complex<double>>() == "complex128");
  }

  TEST_CASE("devices that catch a mismatch go on: each mismatch is reported with its own calls") {
    const xt::xarray<float> x = {1.f, 2.f, 3.f, 4.f};
    std::array<std::string, devices> first, second;
    auto f = [&](auto v) {
      const int d = device_index();
      auto mismatch = [&](auto odd_call) {
        try {
          if (d == 2) odd_call();
          else (void)namedax::psum(v, "i"_ax);
        } catch (const namedax::collective_error& e) {
          return std::string(e.what());
        }
        return std::string("no error");
      };
      first[static_cast<std::size_t>(d)] = mismatch([&] { (void)namedax::pmax(v, "i"_ax); });
      second[static_cast<std::size_t>(d)] = mismatch([&] { (void)namedax::all_gather(v, "i"_ax); });
      return namedax::eval(namedax::psum(v, "i"_ax) + namedax::pmin(v, "i"_ax));
    };
    CHECK_BITWISE(namedax::pmap<"i">(f)(x), (xt::xarray<float>{11.f, 11.f, 11.f, 11.f}));
    for (std::size_t d = 0; d < devices; ++d) {
      INFO("device ", d, ": ", first[d], " / ", second[d]);
      CHECK(first[d].find("device i=2 called pmax over ('i',)") != std::string::npos);
      CHECK(second[d].find("device i=2 called all_gather over ('i',)") != std::string::npos);
    }
  }
}
