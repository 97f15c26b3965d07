// SPDX-License-Identifier: MIT
// Elementwise operations: every function against xtensor's own on plain slices, in every
// placement and element type, with scalars, plain arrays, values varying along different names
// and axis_index operands; apply; printing; local().
#include "test_support.hpp"

#include <atomic>
#include <cmath>
#include <limits>
#include <mutex>
#include <optional>

using namespace namedax::literals;

namespace {

using namedax_test::check_every_placement;

/// Random values with the special ones functions treat apart: zeros of both signs, +-1, halves
/// (rounding), infinities and NaN for floating types; small nonzero integers when `nonzero`.
template <class T>
xt::xarray<T> inputs(std::mt19937& rng, const std::vector<std::size_t>& shape, bool nonzero = false) {
  xt::xarray<T> a = xt::xarray<T>::from_shape(shape);
  std::uniform_real_distribution<double> real(-4.0, 4.0);
  std::uniform_int_distribution<int> integer(-50, 50), pick(0, 15);
  constexpr double inf = std::numeric_limits<double>::infinity();
  const double special[] = {0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.5, inf, -inf, std::nan(""), 1e3, -1e3};
  for (auto& v : a) {
    if constexpr (std::is_same_v<T, bool>) {
      v = integer(rng) > 0;
    } else if constexpr (std::is_integral_v<T>) {
      v = static_cast<T>(integer(rng));
      if (nonzero && v == 0) v = 1;
    } else {
      const int k = pick(rng);
      v = static_cast<T>(k < 12 ? special[k] : real(rng));
    }
  }
  return a;
}

/// Two leading mapped dims, then 0 to 2 positional ones.
std::vector<std::size_t> mapped_shape(std::mt19937& rng) {
  std::uniform_int_distribution<std::size_t> rank(2, 4);
  return namedax_test::random_shape(rng, rank(rng), 4);
}

/// Calls `g(op)` for the k-th of `ops`; every op must give `g` the same result type.
template <class Ops, class G>
auto visit_at(const Ops& ops, std::size_t k, G g) {
  using R = decltype(g(std::get<0>(ops)));
  std::optional<R> r;
  std::apply([&](const auto&... op) {
    std::size_t j = 0;
    ((j++ == k ? (void)r.emplace(g(op)) : void()), ...);
  }, ops);
  return std::move(*r);
}

/// The plain counterpart of an operand's type, for comparing element types with xtensor's.
template <class X>
struct plain {
  using type = X;
};
template <namedax::NamedValue X>
struct plain<X> {
  using type = xt::xarray<typename X::value_type>;
};
template <namedax::DeferredValue X>
struct plain<X> {
  using type = xt::xarray<std::int32_t>;
};

/// A table of operations, each written once for named and plain operands (xtensor's function
/// on plain ones), checked in every placement against xtensor on plain slices. One mapped
/// function per table and element type, so that the placements are instantiated once, not once
/// per operation: results are compared as float64, and their element types at compile time.
template <class Ops, std::size_t N>
void check_table(const Ops& ops, const std::array<const char*, N>& names, const auto&... args) {
  static_assert(std::tuple_size_v<Ops> == N);
  for (std::size_t k = 0; k < N; ++k) {
    INFO("operation: ", names[k]);
    auto f = [&ops, k](const auto&... xs) {
      return visit_at(ops, k, [&](const auto& op) {
        using got = typename decltype(op(xs...))::value_type;
        using expected = typename decltype(op(std::declval<const typename plain<std::remove_cvref_t<decltype(xs)>>::type&>()...))::value_type;
        static_assert(std::is_same_v<got, expected>, "the element type differs from xtensor's");
        return namedax::eval(namedax::cast<double>(op(xs...)));
      });
    };
    auto ref = [&ops, k](const auto&... xs) {
      return visit_at(ops, k, [&](const auto& op) { return xt::xarray<double>(xt::cast<double>(op(xs...))); });
    };
    check_every_placement(f, ref, args...);
  }
}

// namedax's function for named operands, xtensor's for plain ones.
#define BOTH(fn)                                                                               \
  [](const auto&... a) {                                                                       \
    if constexpr ((namedax::NamedOperand<decltype(a)> || ...)) return namedax::fn(a...);       \
    else return xt::fn(a...);                                                                  \
  }
#define OP1(op) [](const auto& a) { return op a; }
#define OP2(op) [](const auto& a, const auto& b) { return a op b; }
// == and != compare whole arrays in xtensor; elementwise there they are equal and not_equal.
#define OP2_OR(op, fn)                                                                         \
  [](const auto& a, const auto& b) {                                                           \
    if constexpr (namedax::NamedOperand<decltype(a)> || namedax::NamedOperand<decltype(b)>)    \
      return a op b;                                                                           \
    else return xt::fn(a, b);                                                                  \
  }

const auto unary = std::tuple{
    BOTH(abs), BOTH(fabs), BOTH(sign), BOTH(exp), BOTH(exp2), BOTH(expm1), BOTH(log), BOTH(log2), BOTH(log10),
    BOTH(log1p), BOTH(sqrt), BOTH(cbrt), BOTH(square), BOTH(cube), BOTH(sin), BOTH(cos), BOTH(tan), BOTH(asin),
    BOTH(acos), BOTH(atan), BOTH(sinh), BOTH(cosh), BOTH(tanh), BOTH(asinh), BOTH(acosh), BOTH(atanh), BOTH(erf),
    BOTH(erfc), BOTH(tgamma), BOTH(lgamma), BOTH(ceil), BOTH(floor), BOTH(trunc), BOTH(round), BOTH(nearbyint),
    BOTH(rint), BOTH(isnan), BOTH(isinf), BOTH(isfinite), BOTH(deg2rad), BOTH(rad2deg), BOTH(radians),
    BOTH(degrees), BOTH(nan_to_num), OP1(-), OP1(+), OP1(!)};
const std::array<const char*, 47> unary_names{
    "abs", "fabs", "sign", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "cbrt", "square", "cube",
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc",
    "tgamma", "lgamma", "ceil", "floor", "trunc", "round", "nearbyint", "rint", "isnan", "isinf", "isfinite",
    "deg2rad", "rad2deg", "radians", "degrees", "nan_to_num", "unary -", "unary +", "!"};

const auto binary = std::tuple{
    BOTH(maximum), BOTH(minimum), BOTH(fmax), BOTH(fmin), BOTH(fmod), BOTH(remainder), BOTH(pow), BOTH(atan2),
    BOTH(hypot), BOTH(fdim), BOTH(isclose), BOTH(equal), BOTH(not_equal), BOTH(less), BOTH(less_equal),
    BOTH(greater), BOTH(greater_equal), OP2(+), OP2(-), OP2(*), OP2(/), OP2(<), OP2(<=), OP2(>), OP2(>=), OP2_OR(==, equal),
    OP2_OR(!=, not_equal), OP2(&&), OP2(||)};
const std::array<const char*, 29> binary_names{
    "maximum", "minimum", "fmax", "fmin", "fmod", "remainder", "pow", "atan2", "hypot", "fdim", "isclose", "equal",
    "not_equal", "less", "less_equal", "greater", "greater_equal", "+", "-", "*", "/", "<", "<=", ">", ">=", "==",
    "!=", "&&", "||"};

const auto bitwise = std::tuple{OP2(&), OP2(|), OP2(^), OP2(%), BOTH(left_shift), BOTH(right_shift),
                                [](const auto& a, const auto& b) { return (a << 2) + (b >> 1); },
                                [](const auto& a, const auto& b) { return ~a + b * 0; }};
const std::array<const char*, 8> bitwise_names{"&", "|", "^", "%", "left_shift", "right_shift", "<< and >>", "~"};

// The cores of the tables, for the other element types: every function is instantiated for a
// few element types only, so that this file compiles in a few minutes.
const auto unary_core = std::tuple{BOTH(abs),    BOTH(sign),  BOTH(exp),   BOTH(sqrt),  BOTH(square), BOTH(sin),
                                   BOTH(floor),  BOTH(round), BOTH(isnan), BOTH(erf),   OP1(-),       OP1(!)};
const std::array<const char*, 12> unary_core_names{"abs",   "sign",  "exp", "sqrt",    "square", "sin",
                                                   "floor", "round", "isnan", "erf", "unary -", "!"};
const auto binary_core = std::tuple{BOTH(maximum), BOTH(fmod), BOTH(pow), BOTH(atan2), BOTH(isclose), OP2(+), OP2(/),
                                    OP2_OR(==, equal)};
const std::array<const char*, 8> binary_core_names{"maximum", "fmod", "pow", "atan2", "isclose", "+", "/", "=="};

// jnp.clip, which gives hi wherever lo > hi (xtensor's clip gives lo there).
const auto clip_as_jnp = [](const auto& v, const auto& lo, const auto& hi) {
  if constexpr (namedax::NamedOperand<decltype(v)> || namedax::NamedOperand<decltype(lo)> ||
                namedax::NamedOperand<decltype(hi)>)
    return namedax::clip(v, lo, hi);
  else return xt::where(lo > hi, hi, xt::clip(v, lo, hi));
};
const auto ternary = std::tuple{clip_as_jnp, BOTH(fma), BOTH(where)};
const std::array<const char*, 3> ternary_names{"clip", "fma", "where"};

template <class T, class Ops, std::size_t N>
void check_unary_table(std::mt19937& rng, const Ops& ops, const std::array<const char*, N>& names) {
  INFO("element type: ", namedax::detail::dtype_name<T>());
  check_table(ops, names, inputs<T>(rng, mapped_shape(rng)));
}

template <class T, class U, class Ops, std::size_t N>
void check_binary_table(std::mt19937& rng, const Ops& ops, const std::array<const char*, N>& names) {
  INFO("element types: ", namedax::detail::dtype_name<T>(), ", ", namedax::detail::dtype_name<U>());
  const auto shape = mapped_shape(rng);
  // Integer division by zero is undefined: integer divisors are nonzero.
  check_table(ops, names, inputs<T>(rng, shape), inputs<U>(rng, shape, std::is_integral_v<U>));
}

/// Shift counts in [1, 7], within every integer type's width.
template <class T>
xt::xarray<T> shift_counts(std::mt19937& rng, const std::vector<std::size_t>& shape) {
  xt::xarray<T> a = inputs<T>(rng, shape, true);
  for (auto& v : a) v = static_cast<T>((v < 0 ? -v : v) % 7 + 1);
  return a;
}

}  // namespace

// Every function's element type on int32 and bool operands is xtensor's (checked without
// evaluating anything, which keeps compile time low; the values are checked above for a core).
using int_named = namedax::named<namedax::detail::shared_array<std::int32_t>,
                                 namedax::env<namedax::binding<namedax::axis<"i">, namedax::placement::vectorized>>, 1>;
template <class X, class Ops>
constexpr bool element_types_follow_xtensor(const Ops& ops) {
  return std::apply([](const auto&... op) {
    return (std::is_same_v<typename decltype(op(std::declval<const X&>()))::value_type,
                           typename decltype(op(std::declval<const xt::xarray<std::int32_t>&>()))::value_type> && ...);
  }, ops);
}
template <class X, class Ops>
constexpr bool binary_element_types_follow_xtensor(const Ops& ops) {
  return std::apply([](const auto&... op) {
    return (std::is_same_v<typename decltype(op(std::declval<const X&>(), std::declval<const X&>()))::value_type,
                           typename decltype(op(std::declval<const xt::xarray<std::int32_t>&>(),
                                                std::declval<const xt::xarray<std::int32_t>&>()))::value_type> && ...);
  }, ops);
}
namespace {

/// f mapped along "i" over the elements of `in`, and over the pairs of `a` and `b`.
template <class F, class T>
auto per_element(F f, const xt::xarray<T>& in) {
  return namedax::vmap<"i">([f](auto x) { return namedax::eval(f(x)); })(in);
}
template <class F, class T>
auto per_pair(F f, const xt::xarray<T>& a, const xt::xarray<T>& b) {
  return namedax::vmap<"i">([f](auto x, auto y) { return namedax::eval(f(x, y)); })(a, b);
}

/// A worked value of a doc comment, `quote` as the comment writes it (tests/doc_comments.cmake
/// checks that every one is quoted in a test): `got` equals `expected`, NaN equal to NaN.
template <class G, class E>
void worked_value(std::string_view quote, const G& got, const E& expected) {
  INFO(quote);
  using V = typename G::value_type;
  const xt::xarray<V> want = expected;
  REQUIRE(got.shape() == want.shape());
  if constexpr (std::is_floating_point_v<V>) CHECK(xt::all(xt::isclose(got, want, 1e-6, 1e-7, true)));
  else CHECK(xt::all(xt::equal(got, want)));
}
}  // namespace

static_assert(element_types_follow_xtensor<int_named>(unary));
static_assert(binary_element_types_follow_xtensor<int_named>(binary));

TEST_SUITE("elementwise") {
  TEST_CASE("unary functions and operators match xtensor in every placement and element type") {
    std::mt19937 rng(11);
    check_unary_table<float>(rng, unary, unary_names);
    check_unary_table<std::int32_t>(rng, unary_core, unary_core_names);
    check_unary_table<double>(rng, unary_core, unary_core_names);
    check_unary_table<std::int8_t>(rng, unary_core, unary_core_names);
    check_unary_table<bool>(rng, unary_core, unary_core_names);
  }

  TEST_CASE("sigmoid and signbit, which xtensor lacks, match a naive loop") {
    std::mt19937 rng(12);
    auto x = inputs<float>(rng, mapped_shape(rng));
    auto naive = [](const auto& x) {
      xt::xarray<float> s = xt::xarray<float>::from_shape(x.shape());
      xt::xarray<bool> b = xt::xarray<bool>::from_shape(x.shape());
      for (std::size_t k = 0; k < x.size(); ++k) {
        const float v = x.data()[k];
        s.data()[k] = v >= 0 ? 1.f / (1.f + std::exp(-v)) : std::exp(v) / (1.f + std::exp(v));
        b.data()[k] = std::signbit(v);
      }
      return std::pair{s, b};
    };
    check_every_placement([](auto x) { return namedax::eval(namedax::sigmoid(x)); },
                          [&](const auto& x) { return naive(x).first; }, x);
    check_every_placement([](auto x) { return namedax::eval(namedax::signbit(x)); },
                          [&](const auto& x) { return naive(x).second; }, x);
    // Large |x|: no overflow, exact limits; integers give float64.
    const xt::xarray<float> wide{-1e4f, -100.f, 0.f, 100.f, 1e4f};
    auto [v, p] = namedax_test::both_modes([](auto x) { return namedax::sigmoid(x); }, wide);
    CHECK_BITWISE(v, p);
    CHECK(v(0) == 0.f);
    CHECK(v(2) == 0.5f);
    CHECK(v(4) == 1.f);
    auto integers = namedax::vmap<"i">([](auto x) { return namedax::sigmoid(x); })(xt::xarray<int>{0, 1});
    static_assert(std::is_same_v<decltype(integers)::value_type, double>);
  }

  TEST_CASE("lgamma leaves the global signgam alone, so that device threads may call it at once") {
    // std::lgamma writes signgam, a data race when the devices of a pmap evaluate it together.
    const xt::xarray<double> x{-0.5, 0.5, 3.0, -2.5};
    const xt::xarray<float> xf{-0.5f, 0.5f};
    signgam = 7;
    auto [v, p] = namedax_test::both_modes([](auto x) { return namedax::lgamma(x); }, x);
    auto [vf, pf] = namedax_test::both_modes([](auto x) { return namedax::lgamma(x); }, xf);
    CHECK(signgam == 7);
    CHECK_BITWISE(v, p);
    CHECK_BITWISE(vf, pf);
    for (std::size_t k = 0; k < x.size(); ++k) CHECK(v(k) == std::lgamma(x(k)));
    CHECK(vf(0) == std::lgamma(-0.5f));
    auto integers = namedax::vmap<"i">([](auto x) { return namedax::lgamma(x); })(xt::xarray<int>{1, 5});
    static_assert(std::is_same_v<decltype(integers)::value_type, double>);
    CHECK(integers(1) == std::lgamma(5.0));
  }

  TEST_CASE("the worked values of elementwise.hpp's doc comments") {
    constexpr double pi = 3.14159265358979323846;
    constexpr float nan = std::numeric_limits<float>::quiet_NaN();
    using f = xt::xarray<float>;
    using d = xt::xarray<double>;
    using b = xt::xarray<bool>;
    worked_value("{-2, 3} -> {2, 3}", per_element([](auto x) { return namedax::abs(x); }, xt::xarray<int>{-2, 3}),
                 xt::xarray<int>{2, 3});
    worked_value("{-2.f, 0.f, 5.f} -> {-1.f, 0.f, 1.f}", per_element([](auto x) { return namedax::sign(x); }, f{-2.f, 0.f, 5.f}),
                 f{-1.f, 0.f, 1.f});
    worked_value("{-5.f, 5.f} -> {-2.f, 2.f}", per_element([](auto x) { return namedax::fmod(x, 3.f); }, f{-5.f, 5.f}),
                 f{-2.f, 2.f});
    worked_value("{0.f, 1.f} -> {1.f, 2.7182817f}", per_element([](auto x) { return namedax::exp(x); }, f{0.f, 1.f}),
                 f{1.f, 2.7182817f});
    worked_value("{0.f} -> {0.5f}", per_element([](auto x) { return namedax::sigmoid(x); }, f{0.f}), f{0.5f});
    worked_value("{2.f, 3.f} -> {4.f, 9.f}", per_element([](auto x) { return namedax::pow(x, 2.f); }, f{2.f, 3.f}),
                 f{4.f, 9.f});
    worked_value("{4.f, 9.f} -> {2.f, 3.f}", per_element([](auto x) { return namedax::sqrt(x); }, f{4.f, 9.f}), f{2.f, 3.f});
    worked_value("{-8.} -> {-2.}", per_element([](auto x) { return namedax::cbrt(x); }, d{-8.}), d{-2.});
    worked_value("(3, 4) -> 5", per_pair([](auto x, auto y) { return namedax::hypot(x, y); }, d{3.}, d{4.}), d{5.});
    worked_value("{0., pi / 2} -> {0., 1.}", per_element([](auto x) { return namedax::sin(x); }, d{0., pi / 2}), d{0., 1.});
    worked_value("{0.} -> {1.}", per_element([](auto x) { return namedax::cos(x); }, d{0.}), d{1.});
    worked_value("(1, -1) -> 3 pi / 4", per_pair([](auto y, auto x) { return namedax::atan2(y, x); }, d{1.}, d{-1.}),
                 d{3 * pi / 4});
    worked_value("{0.f} -> {0.f}", per_element([](auto x) { return namedax::tanh(x); }, f{0.f}), f{0.f});
    worked_value("{0.f} -> {0.f}", per_element([](auto x) { return namedax::erf(x); }, f{0.f}), f{0.f});
    worked_value("{180.} -> {pi}", per_element([](auto x) { return namedax::deg2rad(x); }, d{180.}), d{pi});
    worked_value("{180.} -> {pi}", per_element([](auto x) { return namedax::radians(x); }, d{180.}), d{pi});
    worked_value("{pi} -> {180.}", per_element([](auto x) { return namedax::rad2deg(x); }, d{pi}), d{180.});
    worked_value("{pi} -> {180.}", per_element([](auto x) { return namedax::degrees(x); }, d{pi}), d{180.});
    worked_value("{5.} -> {24.}", per_element([](auto x) { return namedax::tgamma(x); }, d{5.}), d{24.});
    worked_value("{1.2f, -1.2f} -> {2.f, -1.f}", per_element([](auto x) { return namedax::ceil(x); }, f{1.2f, -1.2f}),
                 f{2.f, -1.f});
    worked_value("{1.2f, -1.2f} -> {1.f, -2.f}", per_element([](auto x) { return namedax::floor(x); }, f{1.2f, -1.2f}),
                 f{1.f, -2.f});
    worked_value("{1.7f, -1.7f} -> {1.f, -1.f}", per_element([](auto x) { return namedax::trunc(x); }, f{1.7f, -1.7f}),
                 f{1.f, -1.f});
    worked_value("{0.5f, 2.5f} -> {1.f, 3.f}", per_element([](auto x) { return namedax::round(x); }, f{0.5f, 2.5f}),
                 f{1.f, 3.f});
    worked_value("{0.5f, 2.5f} -> {0.f, 2.f}", per_element([](auto x) { return namedax::nearbyint(x); }, f{0.5f, 2.5f}),
                 f{0.f, 2.f});
    worked_value("{NaN, 1.f} -> {true, false}", per_element([](auto x) { return namedax::isnan(x); }, f{nan, 1.f}),
                 b{true, false});
    worked_value("{-0.f, 0.f, -1.f} -> {true, false, true}",
                 per_element([](auto x) { return namedax::signbit(x); }, f{-0.f, 0.f, -1.f}), b{true, false, true});
    constexpr float inf = std::numeric_limits<float>::infinity(), big = std::numeric_limits<float>::max();
    worked_value("NaN -> 0, +-inf -> the largest finite values",
                 per_element([](auto x) { return namedax::nan_to_num(x); }, f{nan, inf, -inf}), f{0.f, big, -big});
  }

  TEST_CASE("binary functions and operators match xtensor, in every placement and element type") {
    std::mt19937 rng(13);
    check_binary_table<float, float>(rng, binary, binary_names);
    check_binary_table<std::int32_t, std::int32_t>(rng, binary_core, binary_core_names);
    check_binary_table<double, double>(rng, binary_core, binary_core_names);
    check_binary_table<std::int8_t, std::int8_t>(rng, binary_core, binary_core_names);
    check_binary_table<float, std::int32_t>(rng, binary_core, binary_core_names);
  }

  TEST_CASE("bitwise operators and shifts on integers") {
    std::mt19937 rng(14);
    auto run = [&]<class T>(T) {
      INFO("element type: ", namedax::detail::dtype_name<T>());
      const auto shape = mapped_shape(rng);
      check_table(bitwise, bitwise_names, inputs<T>(rng, shape), shift_counts<T>(rng, shape));
    };
    run(std::int32_t{});
    run(std::uint8_t{});
  }

  TEST_CASE("clip, fma and where, with every operand named") {
    std::mt19937 rng(15);
    auto run = [&]<class T>(T) {
      INFO("element type: ", namedax::detail::dtype_name<T>());
      const auto shape = mapped_shape(rng);
      check_table(ternary, ternary_names, inputs<T>(rng, shape), inputs<T>(rng, shape), inputs<T>(rng, shape));
    };
    run(float{});
    run(std::int32_t{});
  }

  TEST_CASE("a named value with scalars, plain arrays that broadcast, and axis_index") {
    std::mt19937 rng(16);
    const std::vector<std::size_t> shape{3, 2, 4};
    auto x = inputs<float>(rng, shape);
    const xt::xarray<float> row = inputs<float>(rng, {4});          // broadcasts along the last dim
    const xt::xarray<float> column = inputs<float>(rng, {5, 1, 1});  // adds a leading dim
    // axis_index("i"_ax) per slice: a helper argument the mapped function ignores.
    xt::xarray<std::int32_t> index = xt::zeros<std::int32_t>({3, 2, 1});
    for (std::size_t i = 0; i < 3; ++i) xt::view(index, i) = static_cast<std::int32_t>(i);

    auto ops = std::tuple{BOTH(maximum), BOTH(atan2), OP2(*), OP2(<)};
    const std::array<const char*, 4> names{"maximum", "atan2", "*", "<"};
    for (std::size_t k = 0; k < names.size(); ++k) {
      INFO("operation: ", names[k]);
      auto with = [&](const auto& other) {
        auto f = [&ops, k, other](auto x) {
          return visit_at(ops, k, [&](const auto& op) { return namedax::eval(namedax::cast<double>(op(x, other))); });
        };
        auto ref = [&ops, k, other](const auto& x) {
          return visit_at(ops, k, [&](const auto& op) { return xt::xarray<double>(xt::cast<double>(op(x, other))); });
        };
        check_every_placement(f, ref, x);
      };
      with(1.5f);
      with(2.0);  // a double scalar: float64 results, as in C++
      with(row);
      with(column);
      auto g = [&ops, k](auto x, auto) {
        return visit_at(ops, k, [&](const auto& op) {
          return namedax::eval(namedax::cast<double>(op(namedax::axis_index("i"_ax), x)));
        });
      };
      auto ref = [&ops, k](const auto& x, const auto& i) {
        return visit_at(ops, k, [&](const auto& op) { return xt::xarray<double>(xt::cast<double>(op(i, x))); });
      };
      check_every_placement(g, ref, x, index);
    }
    // Clip limits from axis_index and a scalar; a function of axis_index alone waits for the map.
    check_every_placement([](auto x, auto) { return namedax::eval(namedax::clip(x, -1.f, namedax::axis_index("i"_ax))); },
                          [](const auto& x, const auto& i) { return xt::xarray<float>(xt::clip(x, -1.f, i)); }, x, index);
    auto alone = [](auto x) { return std::tuple{namedax::eval(x), namedax::sqrt(namedax::axis_index("i"_ax) * 4)}; };
    auto [xv, roots] = namedax::vmap<"i">(alone)(x);
    CHECK_BITWISE(roots, (xt::xarray<double>{0., 2., std::sqrt(8.)}));
    CHECK_BITWISE(std::get<1>(namedax::pmap<"i">(alone)(x)), roots);
  }

  TEST_CASE("operands varying along different names give their outer combination") {
    // a varies along i, b along j: inside a 2-D map op(a, b) at (i, j) is op(a[i], b[j]),
    // with `a` captured from the outer map or passed to the inner one unmapped.
    std::mt19937 rng(17);
    const auto a = inputs<float>(rng, {3, 2});
    const auto b = inputs<float>(rng, {4, 2});
    auto ops = std::tuple{BOTH(atan2), OP2(-),
                          [](const auto& p, const auto& q) {
                            if constexpr (namedax::NamedOperand<decltype(p)>) return namedax::where(p < q, p, q * 2.f);
                            else return xt::where(p < q, p, q * 2.f);
                          }};
    const std::array<const char*, 3> names{"atan2", "-", "where"};
    // The expected values: a and b spread over (i, j), compared slice by slice.
    auto spread = [](const auto& v, bool leading) {
      xt::xarray<float> e = v;
      const std::size_t n = v.shape()[0], m = v.shape()[1];
      e.reshape(leading ? std::vector<std::size_t>{n, 1, m} : std::vector<std::size_t>{1, n, m});
      return xt::xarray<float>(xt::broadcast(e, std::vector<std::size_t>{3, 4, m}));
    };
    const auto a2 = spread(a, true), b2 = spread(b, false);
    auto map = []<bool Devices, namedax::fixed_string Name>(auto f, auto in) {
      if constexpr (Devices) return namedax::pmap<Name>(f, in);
      else return namedax::vmap<Name>(f, in);
    };
    auto run = [&]<bool Outer, bool Inner, bool Capture>(std::size_t k) {
      auto g = [&ops, k](const auto& p, const auto& q) {
        return visit_at(ops, k, [&](const auto& op) {
          if constexpr (namedax::NamedOperand<decltype(p)>) return namedax::eval(namedax::cast<double>(op(p, q)));
          else return xt::xarray<double>(xt::cast<double>(op(p, q)));
        });
      };
      auto outer = [=](auto ai, auto bs) {
        if constexpr (Capture) return map.template operator()<Inner, "j">([=](auto bj) { return g(ai, bj); }, 0)(bs);
        else return map.template operator()<Inner, "j">(g, std::tuple{namedax::none, 0})(ai, bs);
      };
      xt::xarray<double> got = map.template operator()<Outer, "i">(outer, std::tuple{0, namedax::none})(a, b);
      INFO("operation: ", names[k], ", outer ", Outer ? "pmap" : "vmap", ", inner ", Inner ? "pmap" : "vmap",
           Capture ? ", captured" : ", passed");
      CHECK_BITWISE(got, namedax_test::per_index<2>(g, a2, b2));
    };
    for (std::size_t k = 0; k < names.size(); ++k) {
      run.template operator()<false, false, true>(k);
      run.template operator()<false, true, true>(k);
      run.template operator()<true, false, true>(k);
      run.template operator()<true, true, true>(k);
      run.template operator()<false, false, false>(k);
      run.template operator()<true, true, false>(k);
    }
  }
}

namespace {
/// A functor with state and a template call, as users write them.
struct scaled_difference {
  float scale;
  template <class T, class U>
  auto operator()(T a, U b) const {
    return (a - b) * scale;
  }
};

/// Counts its calls on this thread: a device's own evaluation, whatever the others do.
std::size_t& calls() {
  thread_local std::size_t count = 0;
  return count;
}
struct counting_square {
  float operator()(float v) const {
    ++calls();
    return v * v;
  }
};

/// What the mapped functions printed, from every device thread.
struct printed {
  std::mutex lock;
  std::vector<std::string> texts;
  void add(const auto& x) {
    std::lock_guard guard(lock);
    texts.push_back(namedax_test::show(x));
  }
};
}  // namespace

TEST_SUITE("apply, printing and local") {
  TEST_CASE("apply lifts a lambda, a user functor and an xtensor functor, in every placement") {
    std::mt19937 rng(21);
    const auto shape = mapped_shape(rng);
    auto x = inputs<float>(rng, shape), y = inputs<float>(rng, shape);
    auto hinge = [](float v, float w) { return v > w ? static_cast<double>(v - w) : 0.0; };
    check_every_placement([hinge](auto x, auto y) { return namedax::eval(namedax::apply(hinge, x, y)); },
                          [hinge](const auto& x, const auto& y) { return xt::xarray<double>(xt::make_lambda_xfunction(hinge, x, y)); },
                          x, y);
    check_every_placement(
        [](auto x, auto y) { return namedax::eval(namedax::apply(scaled_difference{0.5f}, x, y)); },
        [](const auto& x, const auto& y) { return xt::xarray<float>((x - y) * 0.5f); }, x, y);
    check_every_placement([](auto x) { return namedax::eval(namedax::apply(xt::math::sin_fun{}, x)); },
                          [](const auto& x) { return xt::xarray<float>(xt::sin(x)); }, x);
    // With a scalar, a plain array and axis_index; the element type is the function's result.
    const xt::xarray<float> row = inputs<float>(rng, {shape.back()});
    auto mixed = [row](auto x) {
      auto r = namedax::apply([](float v, int i, float w, double s) { return v * static_cast<float>(i) + w + s; }, x,
                              namedax::axis_index("i"_ax), row, 0.25);
      static_assert(std::is_same_v<typename decltype(r)::value_type, double>);
      return namedax::eval(r);
    };
    xt::xarray<double> expected = xt::xarray<double>::from_shape(shape);
    for (std::size_t i = 0; i < shape[0]; ++i)
      xt::view(expected, i) = xt::view(x, i) * static_cast<float>(i) + row + 0.25;
    CHECK_BITWISE(namedax::vmap<"i">(mixed)(x), expected);
    CHECK_BITWISE(namedax::pmap<"i">(mixed)(x), expected);
    // Of axis_index alone: waits for the map, like any elementwise function of it.
    auto index_only = [](auto x) {
      return std::tuple{namedax::eval(x), namedax::apply([](int i) { return i * 10; }, namedax::axis_index("i"_ax))};
    };
    CHECK_BITWISE(std::get<1>(namedax::vmap<"i">(index_only)(x)), xt::arange<int>(shape[0]) * 10);
    CHECK_BITWISE(std::get<1>(namedax::pmap<"i">(index_only)(x)), xt::arange<int>(shape[0]) * 10);
  }

  TEST_CASE("apply builds a lazy expression: nothing runs until it is evaluated") {
    const xt::xarray<float> x = xt::arange<float>(12).reshape({3, 4});
    std::atomic<int> eager{0}, uncounted{0};
    auto f = [&](auto x) {
      const std::size_t before = calls();
      auto y = namedax::apply(counting_square{}, x);
      auto z = y + 1.f;  // still lazy
      if (calls() != before) ++eager;
      auto e = namedax::eval(z);
      if (calls() == before) ++uncounted;
      return e;
    };
    const xt::xarray<float> expected = x * x + 1.f;
    CHECK_BITWISE(namedax::vmap<"i">(f)(x), expected);
    CHECK_BITWISE(namedax::pmap<"i">(f)(x), expected);
    CHECK(eager == 0);
    CHECK(uncounted == 0);
    // Returned unevaluated, the map evaluates it.
    CHECK_BITWISE(namedax::pmap<"i">([](auto x) { return namedax::apply(counting_square{}, x); })(x), x * x);
  }

  TEST_CASE("operator<< prints the dtype, the axes with their placement, the names varied along and the value") {
    const xt::xarray<int> x{{0, 1}, {2, 3}, {4, 5}};
    printed out;
    auto f = [&](auto x) {
      out.add(x);
      out.add(namedax::psum(x, "i"_ax));
      return namedax::eval(x);
    };
    namedax::vmap<"i">(f)(x);
    REQUIRE(out.texts.size() == 2);
    CHECK(out.texts[0] == "named int32 (2,)\n  axes: i (vmap, size 3)\n  varies along: i\n  value (2, i=3):\n"
                          "{{0, 2, 4},\n {1, 3, 5}}");
    CHECK(out.texts[1] == "named int32 (2,)\n  axes: i (vmap, size 3)\n  varies along: none\n  value (2, i=1):\n"
                          "{{6},\n {9}}");
    out.texts.clear();
    namedax::pmap<"i">(f)(x);
    REQUIRE(out.texts.size() == 6);
    std::sort(out.texts.begin(), out.texts.end());
    CHECK(out.texts[0] == "named int32 (2,)\n  axes: i (pmap, device 0 of 3)\n  varies along: i\n  value (2,):\n{0, 1}");
    CHECK(out.texts[2] == "named int32 (2,)\n  axes: i (pmap, device 1 of 3)\n  varies along: i\n  value (2,):\n{2, 3}");
    CHECK(out.texts[5] == "named int32 (2,)\n  axes: i (pmap, device 2 of 3)\n  varies along: none\n  value (2,):\n{6, 9}");
    // A 2-D mesh, an int8 value (printed as numbers) and a bool one.
    out.texts.clear();
    const xt::xarray<std::int8_t> small{{1, 2}, {3, 4}};
    namedax::pmap<"i">(namedax::vmap<"j">([&](auto x) {
      out.add(x);
      out.add(x > std::int8_t{2});
      return namedax::eval(x);
    }))(small);
    REQUIRE(out.texts.size() == 4);
    std::sort(out.texts.begin(), out.texts.end());
    CHECK(out.texts[0] == "named bool ()\n  axes: i (pmap, device 0 of 2), j (vmap, size 2)\n  varies along: i, j\n"
                          "  value (j=2,):\n{false, false}");
    CHECK(out.texts[2] == "named int8 ()\n  axes: i (pmap, device 0 of 2), j (vmap, size 2)\n  varies along: i, j\n"
                          "  value (j=2,):\n{1, 2}");
  }

  TEST_CASE("local gives this device's value, the same in both modes") {
    std::mt19937 rng(23);
    const auto x = inputs<double>(rng, {4, 3});
    std::mutex lock;
    std::vector<xt::xarray<double>> seen;
    auto f = [&](auto x) {
      auto total = namedax::psum(x, "i"_ax);  // the same at every index: one local value
      xt::xarray<double> mine = namedax::local(total);
      static_assert(std::is_same_v<decltype(mine), xt::xarray<double>>);
      std::lock_guard guard(lock);
      seen.push_back(mine);
      return namedax::eval(x);
    };
    namedax::vmap<"i">(f)(x);
    namedax::pmap<"i">(f)(x);
    REQUIRE(seen.size() == 5);
    xt::xarray<double> expected = xt::zeros<double>({3});
    for (std::size_t i = 0; i < 4; ++i) expected += xt::view(x, i);  // psum's order: index 0 first
    for (const auto& s : seen) CHECK_BITWISE(s, seen[0]);
    CHECK(seen[0].shape() == std::vector<std::size_t>{3});
    CHECK(xt::allclose(seen[0], expected));
    // Under pmap a value varying along the device axis is this device's slice.
    std::atomic<int> wrong{0};
    xt::xarray<int> indices = xt::arange<int>(4);
    indices.reshape({4, 1});
    namedax::pmap<"i">([&](auto v, auto i) {
      if (!namedax_test::bitwise_equal(namedax::local(v), xt::view(x, namedax::local(i)(0)))) ++wrong;
      return namedax::eval(v);
    })(x, indices);
    CHECK(wrong == 0);
  }
}

namespace {

/// One row of Python's division: a, b, a // b and a % b, written out by hand (-0.0 where
/// Python's float result is -0.0; an integer type reads it as 0).
using division_row = std::array<double, 4>;

const std::vector<division_row> integer_division_rows{
    {-7, 2, -4, 1}, {7, -2, -4, -1}, {-7, -2, 3, -1}, {7, 2, 3, 1},  {-1, 4, -1, 3}, {5, -3, -2, -1},
    {-5, 3, -2, 1}, {0, -3, -0.0, -0.0}, {6, -3, -2, -0.0}, {-6, 4, -2, 2}, {2, 5, 0, 2},  {-2, 5, -1, 3}};
const std::vector<division_row> float_division_rows{
    {-5.5, 2, -3, 0.5}, {5.5, -2, -3, -0.5}, {-7.5, 2, -4, 0.5}, {7.5, 2, 3, 1.5}, {-0.0, 3, -0.0, 0}};

/// floor_divide and mod of the rows' a and b mapped along "i", in vmap and pmap, against the
/// rows' quotients and remainders, bit for bit (so the signs of zeros count).
template <class T>
void check_python_division(const std::vector<division_row>& rows) {
  INFO("element type: ", namedax::detail::dtype_name<T>());
  xt::xarray<T> a = xt::xarray<T>::from_shape({rows.size()}), b = a, q = a, r = a;
  for (std::size_t k = 0; k < rows.size(); ++k) {
    a(k) = static_cast<T>(rows[k][0]), b(k) = static_cast<T>(rows[k][1]);
    q(k) = static_cast<T>(rows[k][2]), r(k) = static_cast<T>(rows[k][3]);
  }
  auto f = [](auto x, auto y) {
    auto quotient = namedax::floor_divide(x, y);
    auto remainder = namedax::mod(x, y);
    static_assert(std::is_same_v<typename decltype(quotient)::value_type, T>);
    static_assert(std::is_same_v<typename decltype(remainder)::value_type, T>);
    return std::tuple{namedax::eval(quotient), namedax::eval(remainder)};
  };
  auto [vq, vr] = namedax::vmap<"i">(f)(a, b);
  auto [pq, pr] = namedax::pmap<"i">(f)(a, b);
  CHECK_BITWISE(vq, q);
  CHECK_BITWISE(vr, r);
  CHECK_BITWISE(pq, q);
  CHECK_BITWISE(pr, r);
}

/// The minimum integer divided by -1 wraps to itself, remainder 0 (JAX), in both modes.
template <class T>
void check_minimum_by_minus_one() {
  INFO("element type: ", namedax::detail::dtype_name<T>());
  constexpr T low = std::numeric_limits<T>::min();
  const xt::xarray<T> a{low, low, low};
  const xt::xarray<T> b{-1, 2, -2};
  const xt::xarray<T> q{low, static_cast<T>(low / 2), static_cast<T>(-(low / 2))};
  const xt::xarray<T> r{0, 0, 0};
  auto f = [](auto x, auto y) { return std::tuple{namedax::floor_divide(x, y), namedax::mod(x, y)}; };
  for (const auto& [gq, gr] : {namedax::vmap<"i">(f)(a, b), namedax::pmap<"i">(f)(a, b)}) {
    CHECK_BITWISE(gq, q);
    CHECK_BITWISE(gr, r);
  }
}

}  // namespace

TEST_SUITE("elementwise") {
  TEST_CASE("mod and floor_divide are Python's % and //: int32, int64, float and double, vmap and pmap") {
    check_python_division<std::int32_t>(integer_division_rows);
    check_python_division<std::int64_t>(integer_division_rows);
    std::vector<division_row> floats = integer_division_rows;
    floats.insert(floats.end(), float_division_rows.begin(), float_division_rows.end());
    check_python_division<float>(floats);
    // 1 // 0.1 is 9 in Python (0.1 is a little more than a tenth), where floor(1 / 0.1) is 10.
    floats.push_back({1.0, 0.1, 9.0, 0.09999999999999995});
    check_python_division<double>(floats);
    check_minimum_by_minus_one<std::int32_t>();
    check_minimum_by_minus_one<std::int64_t>();
  }

  TEST_CASE("the worked values of mod's and floor_divide's doc comments") {
    using i = xt::xarray<int>;
    using d = xt::xarray<double>;
    auto mod = [](auto x, auto y) { return namedax::mod(x, y); };
    auto floor_divide = [](auto x, auto y) { return namedax::floor_divide(x, y); };
    worked_value("(-1, 4) -> 3", per_pair(mod, i{-1}, i{4}), i{3});
    worked_value("(5, -3) -> -1", per_pair(mod, i{5}, i{-3}), i{-1});
    worked_value("(-5.5, 2.) -> 0.5", per_pair(mod, d{-5.5}, d{2.}), d{0.5});
    worked_value("(-7, 2) -> -4", per_pair(floor_divide, i{-7}, i{2}), i{-4});
    worked_value("(7, -2) -> -4", per_pair(floor_divide, i{7}, i{-2}), i{-4});
    worked_value("(-7.5, 2.) -> -4", per_pair(floor_divide, d{-7.5}, d{2.}), d{-4.});
  }

  TEST_CASE("mod and floor_divide by a float zero give IEEE's values; by an integer zero, an error") {
    const xt::xarray<double> a{1., -1., 0.}, zero{0., 0., 0.};
    auto f = [](auto x, auto y) { return std::tuple{namedax::floor_divide(x, y), namedax::mod(x, y)}; };
    for (const auto& [q, r] : {namedax::vmap<"i">(f)(a, zero), namedax::pmap<"i">(f)(a, zero)}) {
      CHECK(q(0) == std::numeric_limits<double>::infinity());
      CHECK(q(1) == -std::numeric_limits<double>::infinity());
      CHECK(std::isnan(q(2)));
      CHECK(xt::all(xt::isnan(r)));
    }
    const xt::xarray<std::int32_t> n{5, -5, 7}, d{2, 0, 3};
    const xt::xarray<std::int64_t> n64{5, -5, 7}, d64{2, 0, 3};
    auto mod = [](auto x, auto y) { return namedax::mod(x, y); };
    auto floor_divide = [](auto x, auto y) { return namedax::floor_divide(x, y); };
    const std::string mod_message = "namedax::mod: integer division by zero (int32); make the divisor nonzero first, "
                                    "e.g. namedax::where(b == 0, 1, b)";
    const std::string divide_message = "namedax::floor_divide: integer division by zero (int64); make the divisor "
                                       "nonzero first, e.g. namedax::where(b == 0, 1, b)";
    CHECK(namedax_test::error_of([&] { namedax::vmap<"i">(mod)(n, d); }) == mod_message);
    CHECK(namedax_test::error_of([&] { namedax::pmap<"i">(mod)(n, d); }).find(mod_message) != std::string::npos);
    CHECK(namedax_test::error_of([&] { namedax::vmap<"i">(floor_divide)(n64, d64); }) == divide_message);
    CHECK(namedax_test::error_of([&] { namedax::pmap<"i">(floor_divide)(n64, d64); }).find(divide_message) !=
          std::string::npos);
    // Masked first, as the message says: no error.
    auto masked = [](auto x, auto y) { return namedax::mod(x, namedax::where(y == 0, 1, y)); };
    CHECK_BITWISE(namedax::vmap<"i">(masked)(n, d), (xt::xarray<std::int32_t>{1, 0, 1}));
  }

  TEST_CASE("mod and floor_divide with scalars, plain arrays, names and axis_index, in every map") {
    const xt::xarray<std::int32_t> x{-1, 0, 5, -5};
    const xt::xarray<std::int64_t> y{2, -2, 3, -3};
    auto f = [](auto x, auto y) {
      auto by_four = namedax::mod(x, 4);  // int32 and int: int32
      auto seven = namedax::floor_divide(-7, y);  // int and int64: int64
      static_assert(std::is_same_v<typename decltype(by_four)::value_type, std::int32_t>);
      static_assert(std::is_same_v<typename decltype(seven)::value_type, std::int64_t>);
      return std::tuple{namedax::eval(by_four), namedax::eval(namedax::mod(-7, y)), namedax::eval(seven),
                        namedax::eval(namedax::mod(x, xt::xarray<std::int32_t>{3, -3})),  // broadcasts: (4, 2)
                        namedax::mod(namedax::axis_index("i"_ax) - 1, 4),                 // waits for the map
                        namedax::eval(x * 0 + namedax::floor_divide(namedax::axis_index("i"_ax) - 2, 3))};
    };
    const xt::xarray<std::int32_t> by_four{3, 0, 1, 3}, mod_seven{1, -1, 2, -1};
    const xt::xarray<std::int64_t> seven{-4, 3, -3, 2};
    const xt::xarray<std::int32_t> by_row{{2, -1}, {0, 0}, {2, -1}, {1, -2}};
    const xt::xarray<std::int32_t> before{3, 0, 1, 2}, thirds{-1, -1, 0, 0};
    for (const auto& [a, b, c, e, g, h] : {namedax::vmap<"i">(f)(x, y), namedax::pmap<"i">(f)(x, y)}) {
      CHECK_BITWISE(a, by_four);
      CHECK_BITWISE(b, (xt::xarray<std::int64_t>(mod_seven)));
      CHECK_BITWISE(c, seven);
      CHECK_BITWISE(e, by_row);
      CHECK_BITWISE(g, before);
      CHECK_BITWISE(h, thirds);
    }
    // shard_map, on devices and vectorized: the index before, cyclically (JAX's (i - 1) % 4).
    auto previous = [](auto v) { return namedax::eval(v * 0 + namedax::mod(namedax::axis_index("i"_ax) - 1, 4)); };
    const xt::xarray<std::int32_t> zeros = xt::zeros<std::int32_t>({4});
    namedax::mesh on_devices{namedax::devices<"i">(4)};
    namedax::mesh vectorized{namedax::vectorized<"i">(4)};
    CHECK_BITWISE(namedax::shard_map(previous, on_devices, namedax::P("i"_ax), namedax::P("i"_ax))(zeros), before);
    CHECK_BITWISE(namedax::shard_map(previous, vectorized, namedax::P("i"_ax), namedax::P("i"_ax))(zeros), before);
    // Floats, a varying along "i" and b along "j": the outer combination mod(a[i], b[j]).
    const xt::xarray<float> a{-5.5f, 5.5f, 7.5f}, b{2.f, -2.f};
    const xt::xarray<float> outer{{0.5f, -1.5f}, {1.5f, -0.5f}, {1.5f, -0.5f}};
    auto inner = [&b](auto ai) {
      auto mod = [](auto p, auto q) { return namedax::mod(p, q); };
      return namedax::vmap<"j">(mod, std::tuple{namedax::none, 0})(ai, b);
    };
    CHECK_BITWISE(namedax::vmap<"i">(inner)(a), outer);
    CHECK_BITWISE(namedax::pmap<"i">(inner)(a), outer);
  }

  TEST_CASE("zeros_like and full_like keep the names, the element type and what varies") {
    const xt::xarray<float> x{{1.f, 2.f}, {3.f, 4.f}, {5.f, 6.f}};
    const xt::xarray<std::int32_t> n{{1, -2}, {3, 4}, {-5, 6}};
    auto f = [](auto x, auto n) {
      auto zeros = namedax::zeros_like(x);
      auto halves = namedax::full_like(x, 0.5);  // float, from a double
      auto twos = namedax::full_like(n, 2.9);    // int32: 2, as static_cast
      auto total = namedax::zeros_like(namedax::psum(x, "i"_ax));
      static_assert(std::is_same_v<typename decltype(zeros)::value_type, float>);
      static_assert(std::is_same_v<typename decltype(twos)::value_type, std::int32_t>);
      static_assert(decltype(zeros)::varying != 0 && decltype(twos)::varying != 0);
      static_assert(decltype(total)::varying == 0);  // psum's is the same along "i": so are its zeros
      (void)total;
      auto acc = namedax::zeros_like(x);  // owns its data: a loop carry
      for (int k = 0; k < 3; ++k) acc += x;
      return std::tuple{zeros, halves, twos, acc, namedax::full_like(namedax::axis_index("i"_ax), 7)};
    };
    const xt::xarray<float> zeros = xt::zeros<float>({3, 2}), halves = xt::xarray<float>(xt::full_like(x, 0.5f));
    const xt::xarray<std::int32_t> twos = xt::xarray<std::int32_t>(xt::full_like(n, 2)), sevens{7, 7, 7};
    const xt::xarray<float> thrice = x * 3.f;
    for (const auto& [z, h, t, acc, s] : {namedax::vmap<"i">(f)(x, n), namedax::pmap<"i">(f)(x, n)}) {
      CHECK_BITWISE(z, zeros);
      CHECK_BITWISE(h, halves);
      CHECK_BITWISE(t, twos);
      CHECK_BITWISE(acc, thrice);
      CHECK_BITWISE(s, sevens);
    }
    // Two names: varying along "i" only, as x, under vmap of vmap and pmap of vmap.
    const xt::xarray<int> two = xt::zeros<int>({2});
    auto g = [&two](auto x) { return namedax::vmap<"j">([x](auto) { return namedax::full_like(x, -1.f); })(two); };
    const xt::xarray<float> minus_ones = xt::xarray<float>(xt::full_like(xt::xarray<float>::from_shape({3, 2, 2}), -1.f));
    CHECK_BITWISE(namedax::vmap<"i">(g)(x), minus_ones);
    CHECK_BITWISE(namedax::pmap<"i">(g)(x), minus_ones);
    // Plain values: an xt::xarray of the element type, a scalar of the scalar's type.
    auto plain = namedax::zeros_like(xt::xarray<double>{{1., 2.}});
    static_assert(std::is_same_v<decltype(plain), xt::xarray<double>>);
    CHECK_BITWISE(plain, (xt::xarray<double>{{0., 0.}}));
    auto filled = namedax::full_like(xt::xarray<std::int64_t>{1, 2, 3}, -2.5);
    static_assert(std::is_same_v<decltype(filled), xt::xarray<std::int64_t>>);
    CHECK_BITWISE(filled, (xt::xarray<std::int64_t>{-2, -2, -2}));
    static_assert(std::is_same_v<decltype(namedax::full_like(3.5f, 2)), float>);
    CHECK(namedax::full_like(3.5f, 2) == 2.f);
    CHECK(namedax::zeros_like(7) == 0);
  }
}
