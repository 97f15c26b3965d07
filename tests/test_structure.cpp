// SPDX-License-Identifier: MIT
// Structural operations over positional dims against xtensor (or a hand-written loop) applied
// per index, in every placement, on random shapes and element types.
#include "test_support.hpp"

#include <namedax/structure.hpp>

#include <xtensor/xmanipulation.hpp>

#include <limits>
#include <numeric>

using namespace namedax::literals;
using namedax_test::check_every_placement;
using namedax_test::error_of;
using namedax_test::random_array;
using namedax_test::random_shape;

namespace {

/// A random input with two leading dims (the placements map them) and `rank` more.
template <class T>
xt::xarray<T> input(std::mt19937& rng, std::size_t rank, std::size_t largest = 4) {
  return random_array<T>(rng, random_shape(rng, rank + 2, largest));
}

/// The index along "i" at every position of the leading dims of `xs`, for references that
/// need to know it (the mapped functions ask axis_index instead).
template <class T>
xt::xarray<int> index_grid(const xt::xarray<T>& xs) {
  xt::xarray<int> ids = xt::xarray<int>::from_shape({xs.shape()[0], xs.shape()[1]});
  for (std::size_t i = 0; i < ids.shape()[0]; ++i)
    for (std::size_t j = 0; j < ids.shape()[1]; ++j) ids(i, j) = static_cast<int>(i);
  return ids;
}

/// The index along "i" a reference sees: its slice of index_grid holds it everywhere.
int index_of(const xt::xarray<int>& id) { return id.data()[0]; }

/// The fill value of jnp.take in mode "fill", as JAX documents it.
template <class T>
T documented_fill() {
  if constexpr (std::is_same_v<T, bool>) return true;
  else if constexpr (std::is_floating_point_v<T>) return std::numeric_limits<T>::quiet_NaN();
  else if constexpr (std::is_unsigned_v<T>) return std::numeric_limits<T>::max();
  else return std::numeric_limits<T>::lowest();
}

/// Row-major multi-index of element `flat` of `shape`.
inline std::vector<std::size_t> unravel(std::size_t flat, const std::vector<std::size_t>& shape) {
  std::vector<std::size_t> index(shape.size());
  for (std::size_t k = shape.size(); k-- > 0;) index[k] = flat % shape[k], flat /= shape[k];
  return index;
}

template <class E>
std::vector<std::size_t> shape_of(const E& e) {
  return {e.shape().begin(), e.shape().end()};
}

/// jnp.take(a, idx, axis=d), written from its documentation: negative indices count from the
/// end, indices out of [-n, n) read the fill value.
template <class T, class I>
xt::xarray<T> reference_take(const xt::xarray<T>& a, const xt::xarray<I>& idx, std::size_t d) {
  auto shape = shape_of(a);
  const auto ishape = shape_of(idx);
  shape.erase(shape.begin() + static_cast<std::ptrdiff_t>(d));
  shape.insert(shape.begin() + static_cast<std::ptrdiff_t>(d), ishape.begin(), ishape.end());
  xt::xarray<T> out = xt::xarray<T>::from_shape(shape);
  const auto n = static_cast<long long>(a.shape()[d]);
  for (std::size_t e = 0; e < out.size(); ++e) {
    const auto m = unravel(e, shape);
    std::vector<std::size_t> at(m.begin() + static_cast<std::ptrdiff_t>(d),
                                m.begin() + static_cast<std::ptrdiff_t>(d + ishape.size()));
    long long i = static_cast<long long>(idx.element(at.begin(), at.end()));
    if (i < 0) i += n;
    if (i < 0 || i >= n) {
      out.data()[e] = documented_fill<T>();
      continue;
    }
    std::vector<std::size_t> src(m.begin(), m.begin() + static_cast<std::ptrdiff_t>(d));
    src.push_back(static_cast<std::size_t>(i));
    src.insert(src.end(), m.begin() + static_cast<std::ptrdiff_t>(d + ishape.size()), m.end());
    out.data()[e] = a.element(src.begin(), src.end());
  }
  return out;
}

/// jnp.take_along_axis(a, idx, axis=d) from its documentation, the same index rules.
template <class T, class I>
xt::xarray<T> reference_take_along(const xt::xarray<T>& a, const xt::xarray<I>& idx, std::size_t d) {
  std::vector<std::size_t> shape(a.dimension());
  for (std::size_t k = 0; k < shape.size(); ++k)
    shape[k] = k == d ? idx.shape()[k] : std::max(a.shape()[k], idx.shape()[k]);
  xt::xarray<T> out = xt::xarray<T>::from_shape(shape);
  const auto n = static_cast<long long>(a.shape()[d]);
  for (std::size_t e = 0; e < out.size(); ++e) {
    const auto m = unravel(e, shape);
    std::vector<std::size_t> at(m), src(m);
    for (std::size_t k = 0; k < m.size(); ++k) {
      if (idx.shape()[k] == 1) at[k] = 0;
      if (a.shape()[k] == 1) src[k] = 0;
    }
    long long i = static_cast<long long>(idx.element(at.begin(), at.end()));
    if (i < 0) i += n;
    if (i < 0 || i >= n) {
      out.data()[e] = documented_fill<T>();
      continue;
    }
    src[d] = static_cast<std::size_t>(i);
    out.data()[e] = a.element(src.begin(), src.end());
  }
  return out;
}

/// A block of `a`'s last two dims from (r, c) of extents (h, w), every leading dim whole.
template <class A>
auto last_two(A& a, std::size_t r, std::size_t c, std::size_t h, std::size_t w) {
  return xt::strided_view(a, {xt::ellipsis(), xt::range(r, r + h), xt::range(c, c + w)});
}

/// Copies `from` into the view `into` element by element, row-major (assigning an expression
/// to a strided view evaluates it into a temporary of a wrong fixed rank under C++20).
template <class V, class A>
void copy_into(V&& into, const A& from) {
  REQUIRE(std::equal(into.shape().begin(), into.shape().end(), from.shape().begin(), from.shape().end()));
  std::copy(from.begin(), from.end(), into.begin());
}

/// lax.dynamic_slice's clamp, written from its documentation.
std::size_t clamped(long long start, std::size_t extent, std::size_t size) {
  return static_cast<std::size_t>(std::clamp<long long>(start, 0, static_cast<long long>(extent - size)));
}

/// Positional dims of the value in the function a placement runs: the 1-D placements leave
/// "j" positional.
template <class X>
constexpr bool one_map = std::remove_cvref_t<X>::env_type::size == 1;

}  // namespace

#define NAMEDAX_ELEMENT_TYPES float, double, std::int32_t, std::int8_t, bool
// Fewer for the operations that only move elements the same way whatever their type, to keep
// this file's compile time in check.
#define NAMEDAX_SOME_ELEMENT_TYPES float, std::int8_t, bool

TEST_SUITE("structure") {
  TEST_CASE_TEMPLATE("view: xtensor slices of positional dims, in every placement", T, NAMEDAX_ELEMENT_TYPES) {
    std::mt19937 rng(11);
    for (int trial = 0; trial < 3; ++trial) {
      const auto xs = input<T>(rng, 3);
      check_every_placement([](auto x) { return namedax::view(x, xt::range(1, 3), 0); },
                            [](const auto& a) { return xt::view(a, xt::range(1, 3), 0); }, xs);
      // The ellipsis covers positional dims only: the stepped range reaches the last of them.
      check_every_placement([](auto x) { return namedax::view(x, xt::ellipsis(), xt::range(0, 5, 2)); },
                            [](const auto& a) { return xt::strided_view(a, {xt::ellipsis(), xt::range(0, 5, 2)}); }, xs);
      check_every_placement([](auto x) { return namedax::eval(namedax::view(x, xt::all(), xt::newaxis(), -1)); },
                            [](const auto& a) { return xt::view(a, xt::all(), xt::newaxis(), a.shape()[1] - 1); }, xs);
      check_every_placement([](auto x) { return namedax::view(x, xt::keep(0, 0), xt::all(), xt::drop(0)); },
                            [](const auto& a) { return xt::view(a, xt::keep(0, 0), xt::all(), xt::drop(0)); }, xs);
    }
  }

  TEST_CASE("view makes no copy: the result reads the value's memory") {
    xt::xarray<float> xs = xt::arange<float>(24);
    xs.reshape({4, 6});
    bool same_memory = false, same_after_eval = false;
    auto f = [&](auto x) {
      auto v = namedax::view(x, xt::range(2, 5));
      same_memory = &v.payload()(0, 1) == &x.payload()(2, 1);
      auto owned = namedax::eval(x * 2.f);
      auto w = namedax::view(owned, xt::ellipsis(), 3);
      same_after_eval = &w.payload()(2) == owned.payload().data() + 3 * 4 + 2;  // (3, 2) of (6, 4)
      return v;
    };
    auto r = namedax::vmap<"i">(f)(xs);
    CHECK(same_memory);
    CHECK(same_after_eval);
    CHECK_BITWISE(r, xt::xarray<float>(xt::view(xs, xt::all(), xt::range(2, 5))));
    // The reshape family is made of views too, of a value in memory of its own.
    bool reshape_same = false, permute_same = false;
    auto g = [&](auto x) {
      auto owned = namedax::eval(x + 1.f);
      auto r2 = namedax::reshape(owned, {2, 3});
      reshape_same = &r2.payload()(1, 0, 0) == owned.payload().data() + 3 * 4;
      auto p = namedax::permute_dims(r2, {1, 0});
      permute_same = &p.payload()(2, 1, 0) == owned.payload().data() + 5 * 4;
      return p;
    };
    (void)namedax::vmap<"i">(g)(xs);
    CHECK(reshape_same);
    CHECK(permute_same);
  }

  TEST_CASE_TEMPLATE("dynamic_slice at axis_index(\"i\") * b: each index its own block, clamped", T, NAMEDAX_ELEMENT_TYPES) {
    std::mt19937 rng(12);
    for (int trial = 0; trial < 4; ++trial) {
      const auto xs = input<T>(rng, 2, 5);
      const auto ids = index_grid(xs);
      const std::size_t rows = xs.shape()[2], cols = xs.shape()[3];
      const std::size_t b = std::uniform_int_distribution<std::size_t>(1, rows)(rng);
      const std::size_t w = std::uniform_int_distribution<std::size_t>(1, cols)(rng);
      const int shift = trial - 2;  // negative starts clamp to 0, large ones to the end
      auto f = [b, w, shift](auto x, auto) {
        auto start = namedax::axis_index("i"_ax) * static_cast<int>(b) + shift;
        if constexpr (one_map<decltype(x)>)
          return namedax::dynamic_slice(x, std::tuple{0, start, shift}, std::array<std::size_t, 3>{x.shape()[0], b, w});
        else
          return namedax::dynamic_slice(x, std::tuple{start, shift}, std::array<std::size_t, 2>{b, w});
      };
      auto ref = [b, w, shift](const auto& a, const xt::xarray<int>& id) {
        const std::size_t r = a.dimension();
        const auto s = clamped(static_cast<long long>(index_of(id)) * static_cast<long long>(b) + shift, a.shape()[r - 2], b);
        const auto c = clamped(shift, a.shape()[r - 1], w);
        return last_two(a, s, c, b, w);
      };
      check_every_placement(f, ref, xs, ids);
      // Plain int starts: a view of each index's value.
      auto g = [b, w](auto x) {
        if constexpr (one_map<decltype(x)>)
          return namedax::dynamic_slice(x, std::array{0, -1, 100}, std::array<std::size_t, 3>{x.shape()[0], b, w});
        else
          return namedax::dynamic_slice(x, std::array{-1, 100}, std::array<std::size_t, 2>{b, w});
      };
      check_every_placement(
          g, [b, w](const auto& a) { return last_two(a, 0, a.shape()[a.dimension() - 1] - w, b, w); }, xs);
    }
  }

  TEST_CASE("dynamic_slice: starts from a mapped integer array, and all-axis_index starts") {
    xt::xarray<float> xs = xt::arange<float>(3 * 4 * 2);
    xs.reshape({3, 4, 2});
    const xt::xarray<int> starts = {3, -2, 1};
    auto f = [](auto x, auto s) { return namedax::dynamic_slice(x, std::tuple{s, 0}, std::array<std::size_t, 2>{2, 2}); };
    // Written from lax.dynamic_slice's clamp: 3 -> 2, -2 -> 0, 1 -> 1.
    xt::xarray<float> expected = xt::stack(xt::xtuple(xt::view(xs, 0, xt::range(2, 4)), xt::view(xs, 1, xt::range(0, 2)),
                                                      xt::view(xs, 2, xt::range(1, 3))));
    auto [v, p] = namedax_test::both_modes(f, xs, starts);
    CHECK_BITWISE(v, expected);
    CHECK_BITWISE(p, expected);
    // A std::array of axis_index values: block i of size 1 along both dims.
    auto g = [](auto x) {
      auto i = namedax::axis_index("i"_ax);
      return namedax::dynamic_slice(x, std::array{i, i}, std::array<std::size_t, 2>{1, 1});
    };
    auto [gv, gp] = namedax_test::both_modes(g, xs);
    xt::xarray<float> diagonal = xt::xarray<float>::from_shape({3, 1, 1});
    diagonal(0, 0, 0) = 0.f, diagonal(1, 0, 0) = 11.f, diagonal(2, 0, 0) = 21.f;  // (0, 0), (1, 1), (2, 1 clamped)
    CHECK_BITWISE(gv, diagonal);
    CHECK_BITWISE(gp, diagonal);
  }

  TEST_CASE_TEMPLATE("dynamic_update_slice at axis_index(\"i\") * b, clamped, varying along both operands", T,
                     NAMEDAX_ELEMENT_TYPES) {
    std::mt19937 rng(13);
    for (int trial = 0; trial < 3; ++trial) {
      const auto xs = input<T>(rng, 2, 5);
      const auto ids = index_grid(xs);
      const std::size_t rows = xs.shape()[2], cols = xs.shape()[3];
      const std::size_t b = std::uniform_int_distribution<std::size_t>(1, rows)(rng);
      const std::size_t w = std::uniform_int_distribution<std::size_t>(1, cols)(rng);
      const auto ups = random_array<T>(rng, {xs.shape()[0], xs.shape()[1], b, w});
      auto f = [b](auto x, auto up, auto) {
        auto start = namedax::axis_index("i"_ax) * static_cast<int>(b) + 1;
        if constexpr (one_map<decltype(x)>) return namedax::dynamic_update_slice(x, up, std::tuple{0, start, 1});
        else return namedax::dynamic_update_slice(x, up, std::tuple{start, 1});
      };
      auto ref = [b, w](const auto& a, const auto& up, const xt::xarray<int>& id) {
        auto out = a;
        const std::size_t r = a.dimension();
        const auto s = clamped(static_cast<long long>(index_of(id)) * static_cast<long long>(b) + 1, a.shape()[r - 2], b);
        copy_into(last_two(out, s, clamped(1, a.shape()[r - 1], w), b, w), up);
        return out;
      };
      check_every_placement(f, ref, xs, ups, ids);
      // An update that does not vary along "i" into a value that does.
      const auto fixed = random_array<T>(rng, {b, w});
      auto g = [fixed](auto x) {
        if constexpr (one_map<decltype(x)>) {
          xt::xarray<T> up = xt::broadcast(fixed, {x.shape()[0], fixed.shape()[0], fixed.shape()[1]});
          return namedax::dynamic_update_slice(x, up, std::array{0, 0, 0});
        } else {
          return namedax::dynamic_update_slice(x, fixed, std::array{0, 0});
        }
      };
      check_every_placement(g, [fixed](const auto& a) {
        auto out = a;
        auto into = last_two(out, 0, 0, fixed.shape()[0], fixed.shape()[1]);
        copy_into(into, xt::xarray<T>(xt::broadcast(fixed, shape_of(into))));
        return out;
      }, xs);
    }
  }

  TEST_CASE("dynamic_update_slice into a plain array: the result varies along the update's names") {
    const xt::xarray<float> rows = {{1.f, 2.f}, {3.f, 4.f}, {5.f, 6.f}};
    const xt::xarray<float> zeros = xt::zeros<float>({3, 2});
    auto f = [&zeros](auto row) {
      auto i = namedax::axis_index("i"_ax);
      return namedax::dynamic_update_slice(zeros, namedax::reshape(row, {1, 2}), std::tuple{i, 0});
    };
    xt::xarray<float> expected = xt::zeros<float>({3, 3, 2});
    for (std::size_t i = 0; i < 3; ++i)
      for (std::size_t j = 0; j < 2; ++j) expected(i, i, j) = rows(i, j);
    auto [v, p] = namedax_test::both_modes(f, rows);
    CHECK_BITWISE(v, expected);
    CHECK_BITWISE(p, expected);
  }

  TEST_CASE_TEMPLATE("concat and stack: a value varying along \"i\" with ones that do not", T, NAMEDAX_ELEMENT_TYPES) {
    std::mt19937 rng(14);
    for (int trial = 0; trial < 3; ++trial) {
      const auto xs = input<T>(rng, 2);
      const auto ids = index_grid(xs);
      // A plain array (varies along nothing) and one from axis_index (along "i" only).
      auto plain_like = [](const auto& shape, std::size_t extent) {
        std::vector<std::size_t> s(shape.begin(), shape.end());
        s.back() = extent;
        xt::xarray<T> p = xt::xarray<T>::from_shape(s);
        p.fill(static_cast<T>(7));
        return p;
      };
      auto f = [plain_like](auto x, auto) {
        const auto shape = x.shape();
        auto from_index = namedax::broadcast_to(namedax::cast<T>(namedax::axis_index("i"_ax)), plain_like(shape, 1).shape());
        return namedax::concat(std::tuple{x, plain_like(shape, 2), from_index}, -1);
      };
      auto ref = [plain_like](const auto& a, const xt::xarray<int>& id) {
        xt::xarray<T> from_index = plain_like(a.shape(), 1);
        from_index.fill(static_cast<T>(index_of(id)));
        return xt::xarray<T>(xt::concatenate(xt::xtuple(a, plain_like(a.shape(), 2), from_index), a.dimension() - 1));
      };
      check_every_placement(f, ref, xs, ids);
      check_every_placement(
          [](auto x) {
            std::array values{namedax::eval(x), namedax::eval(namedax::flip(x, 0))};
            return namedax::concat(values, 0);
          },
          [](const auto& a) { return xt::xarray<T>(xt::concatenate(xt::xtuple(a, xt::flip(a, 0)), 0)); }, xs);
      check_every_placement(
          [plain_like](auto x) {
            return namedax::stack(std::tuple{x, plain_like(x.shape(), x.shape().back()), namedax::flip(x, -1)}, 1);
          },
          [plain_like](const auto& a) {
            return xt::xarray<T>(xt::stack(xt::xtuple(a, plain_like(a.shape(), a.shape().back()), xt::flip(a, a.dimension() - 1)), 1));
          },
          xs);
    }
  }

  TEST_CASE_TEMPLATE("the reshape family: reshape, permute_dims, moveaxis, swapaxes, squeeze, broadcast_to", T,
                     NAMEDAX_SOME_ELEMENT_TYPES) {
    std::mt19937 rng(15);
    for (int trial = 0; trial < 3; ++trial) {
      auto shape = random_shape(rng, 5, 4);
      shape[3] = 1;  // a dim of extent 1 to squeeze and broadcast
      const auto xs = random_array<T>(rng, shape);
      auto merged = [](const auto& s) {
        std::vector<std::ptrdiff_t> out(s.begin(), s.end() - 2);
        out.push_back(-1);
        return out;
      };
      auto merged_extents = [](const auto& s) {
        std::vector<std::size_t> out(s.begin(), s.end() - 2);
        out.push_back(s[s.size() - 2] * s.back());
        return out;
      };
      check_every_placement([merged](auto x) { return namedax::reshape(x, merged(x.shape())); },
                            [merged_extents](const auto& a) { return xt::xarray<T>(xt::reshape_view(a, merged_extents(a.shape()))); }, xs);
      // Through an owned value (a view) and through a lazy one (one copy).
      check_every_placement([](auto x) { return namedax::reshape(namedax::eval(x), {-1}); },
                            [](const auto& a) { return xt::xarray<T>(xt::reshape_view(a, std::vector<std::size_t>{a.size()})); }, xs);
      check_every_placement([](auto x) { return namedax::reshape(namedax::flip(x, 0), {-1}); },
                            [](const auto& a) {
                              xt::xarray<T> flipped = xt::flip(a, 0);
                              return xt::xarray<T>(xt::reshape_view(flipped, std::vector<std::size_t>{a.size()}));
                            },
                            xs);
      auto reversed = [](std::size_t r) {
        std::vector<std::size_t> p(r);
        for (std::size_t k = 0; k < r; ++k) p[k] = r - 1 - k;
        return p;
      };
      check_every_placement([reversed](auto x) { return namedax::permute_dims(x, reversed(x.dimension())); },
                            [reversed](const auto& a) { return xt::xarray<T>(xt::transpose(a, reversed(a.dimension()))); }, xs);
      auto moved = [](std::size_t r) {
        std::vector<std::size_t> p;
        for (std::size_t k = 1; k < r; ++k) p.push_back(k);
        p.push_back(0);
        return p;
      };
      check_every_placement([](auto x) { return namedax::moveaxis(x, 0, -1); },
                            [moved](const auto& a) { return xt::xarray<T>(xt::transpose(a, moved(a.dimension()))); }, xs);
      check_every_placement([](auto x) { return namedax::swapaxes(x, 0, -2); },
                            [](const auto& a) {
                              std::vector<std::size_t> p(a.dimension());
                              std::iota(p.begin(), p.end(), std::size_t{0});
                              std::swap(p[0], p[a.dimension() - 2]);
                              return xt::xarray<T>(xt::transpose(a, p));
                            }, xs);
      check_every_placement([](auto x) { return namedax::squeeze(x, {-2}); },
                            [](const auto& a) { return xt::xarray<T>(xt::squeeze(a, a.dimension() - 2)); }, xs);
      check_every_placement([](auto x) { return namedax::squeeze(x); },
                            [](const auto& a) { return xt::xarray<T>(xt::squeeze(a)); }, xs);
      auto widened = [](const auto& s) {
        std::vector<std::ptrdiff_t> out{2};
        out.insert(out.end(), s.begin(), s.end());
        out[out.size() - 2] = 3;
        return out;
      };
      check_every_placement([widened](auto x) { return namedax::broadcast_to(x, widened(x.shape())); },
                            [widened](const auto& a) {
                              const auto w = widened(a.shape());
                              return xt::xarray<T>(xt::broadcast(a, std::vector<std::size_t>(w.begin(), w.end())));
                            },
                            xs);
    }
  }

  TEST_CASE_TEMPLATE("flip, roll and pad", T, NAMEDAX_SOME_ELEMENT_TYPES) {
    std::mt19937 rng(16);
    for (int trial = 0; trial < 3; ++trial) {
      const auto xs = input<T>(rng, 2, 5);
      check_every_placement([](auto x) { return namedax::flip(x, -1); },
                            [](const auto& a) { return xt::xarray<T>(xt::flip(a, a.dimension() - 1)); }, xs);
      check_every_placement([](auto x) { return namedax::flip(x); },
                            [](const auto& a) {
                              xt::xarray<T> out = a;
                              for (std::size_t k = 0; k < a.dimension(); ++k) out = xt::flip(out, k);
                              return out;
                            },
                            xs);
      const int shift = std::uniform_int_distribution<int>(-7, 7)(rng);
      check_every_placement([shift](auto x) { return namedax::roll(x, shift, -1); },
                            [shift](const auto& a) {
                              // jnp.roll: element k moves to (k + shift) mod n.
                              xt::xarray<T> out = a;
                              const auto n = static_cast<long long>(a.shape().back());
                              for (long long k = 0; k < n; ++k) {
                                const auto to = static_cast<std::size_t>(((k + shift) % n + n) % n);
                                copy_into(xt::strided_view(out, {xt::ellipsis(), to}), xt::strided_view(a, {xt::ellipsis(), static_cast<std::size_t>(k)}));
                              }
                              return out;
                            },
                            xs);
      std::uniform_int_distribution<std::size_t> width(0, 2);
      const std::pair<std::size_t, std::size_t> last{width(rng), width(rng)}, before_last{width(rng), width(rng)};
      auto widths = [last, before_last](std::size_t rank) {
        namedax::pad_widths p(rank, {0, 1});
        p[rank - 2] = before_last, p[rank - 1] = last;
        return p;
      };
      check_every_placement([widths](auto x) { return namedax::pad(x, widths(x.dimension()), 3); },
                            [widths](const auto& a) {
                              const auto p = widths(a.dimension());
                              std::vector<std::size_t> shape(a.shape().begin(), a.shape().end());
                              xt::xstrided_slice_vector inside;
                              for (std::size_t k = 0; k < shape.size(); ++k) {
                                inside.push_back(xt::range(p[k].first, p[k].first + shape[k]));
                                shape[k] += p[k].first + p[k].second;
                              }
                              xt::xarray<T> out = xt::xarray<T>::from_shape(shape);
                              out.fill(static_cast<T>(3));
                              copy_into(xt::strided_view(out, inside), a);
                              return out;
                            },
                            xs);
    }
  }

  TEST_CASE_TEMPLATE("take and take_along_axis with named indices: negative from the end, out of range fills", T,
                     NAMEDAX_ELEMENT_TYPES) {
    std::mt19937 rng(17);
    for (int trial = 0; trial < 3; ++trial) {
      const auto xs = input<T>(rng, 2, 4);
      const auto n = static_cast<int>(xs.shape()[3]);
      std::uniform_int_distribution<int> pick(-n - 1, n);
      xt::xarray<int> idx = xt::xarray<int>::from_shape({xs.shape()[0], xs.shape()[1], 3});
      for (auto& v : idx) v = pick(rng);
      check_every_placement([](auto x, auto i) { return namedax::take(x, i, -1); },
                            [](const auto& a, const auto& i) { return reference_take(a, i, a.dimension() - 1); }, xs, idx);
      // axis_index as the index: row i of each value, the fill value past the last row.
      const auto ids = index_grid(xs);
      check_every_placement([](auto x, auto) { return namedax::take(x, namedax::axis_index("i"_ax), -2); },
                            [](const auto& a, const xt::xarray<int>& id) {
                              return reference_take(a, xt::xarray<int>(index_of(id)), a.dimension() - 2);
                            },
                            xs, ids);
      // A plain index array, the same on every index.
      const xt::xarray<std::int64_t> plain = {{-1, 0}, {n, 1}};
      check_every_placement([plain](auto x) { return namedax::take(x, plain, -1); },
                            [plain](const auto& a) { return reference_take(a, plain, a.dimension() - 1); }, xs);
      xt::xarray<std::int8_t> along = xt::xarray<std::int8_t>::from_shape({xs.shape()[0], xs.shape()[1], 1, 5});
      for (auto& v : along) v = static_cast<std::int8_t>(pick(rng));
      check_every_placement([](auto x, auto i) { return namedax::take_along_axis(x, i); },
                            [](const auto& a, const auto& i) { return reference_take_along(a, i, a.dimension() - 1); }, xs,
                            along);
    }
  }

  TEST_CASE("take: jnp.take's documented behaviour on a worked example") {
    // jnp.take(x, jnp.array([2, -1, 3, -4]), axis=0) with x = [10, 20, 30]: 30, 30, NaN, NaN.
    xt::xarray<float> xs = {{10.f, 20.f, 30.f}, {1.f, 2.f, 3.f}};
    const xt::xarray<int> idx = {2, -1, 3, -4};
    auto f = [idx](auto x) { return namedax::take(x, idx, 0); };
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const xt::xarray<float> expected = {{30.f, 30.f, nan, nan}, {3.f, 3.f, nan, nan}};
    auto [v, p] = namedax_test::both_modes(f, xs);
    CHECK_BITWISE(v, expected);
    CHECK_BITWISE(p, expected);
  }

  TEST_CASE("bad dims and sizes are errors that name them") {
    xt::xarray<float> xs = xt::zeros<float>({2, 3, 4});
    auto message = [&](auto f) { return error_of([&] { (void)namedax::vmap<"i">(f)(xs); }); };
    CHECK(message([](auto x) { return namedax::view(x, 0, 0, 0); }) ==
          "namedax::view: 3 slices select dims of a value of positional shape (3, 4); give at most one slice per "
          "positional dim (the vmap axes are not sliced)");
    CHECK(message([](auto x) { return namedax::view(x, 3); }) ==
          "namedax::view: index 3 is out of range for dim 0 of extent 3; pass an index in [-3, 3)");
    CHECK(message([](auto x) { return namedax::dynamic_slice(x, std::array{0, 0}, std::array<std::size_t, 2>{2, 5}); }) ==
          "namedax::dynamic_slice: slice size 5 along dim 1 exceeds the extent 4 (positional shape (3, 4)); a slice must "
          "fit in the value");
    CHECK(message([](auto x) { return namedax::dynamic_slice(x, std::array{0}, std::array<std::size_t, 1>{2}); }) ==
          "namedax::dynamic_slice: 1 start indices and 1 slice size for a value of positional shape (3, 4); give one start "
          "and one size per positional dim");
    CHECK(message([](auto x) { return namedax::dynamic_update_slice(x, xt::xarray<float>::from_shape({4, 1}), std::array{0, 0}); }) ==
          "namedax::dynamic_update_slice: update extent 4 along dim 0 exceeds the extent 3 (positional shape (3, 4)); a "
          "slice must fit in the value");
    CHECK(message([](auto x) { return namedax::concat(std::tuple{x, xt::xarray<float>::from_shape({2, 3})}, 0); }) ==
          "namedax::concat: value 1 has positional shape (2, 3) and value 0 has (3, 4); the shapes must match except "
          "along the dim joined, dim 0");
    CHECK(message([](auto x) { return namedax::concat(std::tuple{x, x}, 2); }) ==
          "namedax::concat: dim 2 is out of range for a value of positional rank 2; pass a dim in [-2, 2)");
    CHECK(message([](auto x) { return namedax::stack(std::tuple{x, x}, -4); }) ==
          "namedax::stack: dim -4 is out of range for a new dim among 2 positional dims; pass a dim in [-3, 2]");
    CHECK(message([](auto x) { return namedax::reshape(x, {5, -1}); }) ==
          "namedax::reshape: cannot reshape positional shape (3, 4) (12 elements) to (5, -1); the -1 must stand for a "
          "whole extent");
    CHECK(message([](auto x) { return namedax::reshape(x, {-1, -1}); }) ==
          "namedax::reshape: cannot reshape positional shape (3, 4) to (-1, -1); give extents of 0 or more and at most one -1");
    CHECK(message([](auto x) { return namedax::permute_dims(x, {1, 1}); }) ==
          "namedax::permute_dims: axes (1, 1) name dim 1 twice; give a permutation of the positional dims");
    CHECK(message([](auto x) { return namedax::squeeze(x, {0}); }) ==
          "namedax::squeeze: dim 0 has extent 3 in positional shape (3, 4); squeeze only dims of extent 1");
    CHECK(message([](auto x) { return namedax::broadcast_to(x, {3, 5}); }) ==
          "namedax::broadcast_to: positional shape (3, 4) does not broadcast to (3, 5); aligned on the right, each dim "
          "must have extent 1 or the target's");
    CHECK(message([](auto x) { return namedax::roll(x, 1, 2); }) ==
          "namedax::roll: dim 2 is out of range for a value of positional rank 2; pass a dim in [-2, 2)");
    CHECK(message([](auto x) { return namedax::pad(x, {{1, 1}, {1, 1}, {1, 1}}); }) ==
          "namedax::pad: 3 (before, after) pairs for a value of positional shape (3, 4); give one pair per positional "
          "dim, or one pair for all");
    // Sizes and widths that would wrap: an error before anything is allocated.
    CHECK(message([](auto x) { return namedax::pad(x, {{-1, 2}}, 0.f); }) ==
          "namedax::pad: widths (-1, 2) for dim 0 of positional shape (3, 4); widths must be >= 0 (to crop, take a view "
          "or a dynamic_slice)");
    static constexpr std::ptrdiff_t huge = std::numeric_limits<std::ptrdiff_t>::max();
    CHECK(message([](auto x) { return namedax::pad(x, {{0, 0}, {huge, huge}}, 0.f); }) ==
          "namedax::pad: widths (9223372036854775807, 9223372036854775807) for dim 1 of positional shape (3, 4) give an "
          "extent past what std::size_t holds");
    CHECK(message([](auto x) { return namedax::pad(x, {{0, 0}, {std::ptrdiff_t{1} << 61, 0}}, 0.f); }) ==
          "namedax::pad: an array of shape (3, 2305843009213693956, 2) with elements of 4 bytes has more bytes than memory "
          "can address; its size overflows std::size_t");
    CHECK(message([](auto x) { return namedax::reshape(x, {(std::ptrdiff_t{1} << 62) + 3, 4}); }) ==
          "namedax::reshape: cannot reshape positional shape (3, 4) (12 elements) to (4611686018427387907, 4); its extents "
          "multiply past what std::size_t holds");
    CHECK(message([](auto x) { return namedax::broadcast_to(x, {std::ptrdiff_t{1} << 62, 3, 4}); }) ==
          "namedax::broadcast_to: an array of shape (4611686018427387904, 3, 4, 2) with elements of 4 bytes has more "
          "bytes than memory can address; its size overflows std::size_t");
    CHECK(message([](auto x) { return namedax::take_along_axis(x, xt::xarray<int>{0}); }) ==
          "namedax::take_along_axis: indices of positional shape (1,) for a value of positional shape (3, 4); give "
          "indices of the value's rank");
    CHECK(message([](auto x) { return namedax::take(x, 0, -3); }) ==
          "namedax::take: dim -3 is out of range for a value of positional rank 2; pass a dim in [-2, 2)");
  }

  TEST_CASE("slices that xtensor takes unchecked are errors naming the slice, the dim and its extent, in every placement") {
    // xtensor reads an xt::keep index past the dim, miscounts an xt::drop list that is out of
    // range, repeated or out of order, and divides by a range's step of 0 (SIGFPE).
    const xt::xarray<float> xs = xt::zeros<float>({2, 3, 4});
    const namedax::mesh m{namedax::devices<"i">(2)};
    auto messages = [&](auto f) {
      return std::vector{error_of([&] { (void)namedax::vmap<"i">(f)(xs); }), error_of([&] { (void)namedax::pmap<"i">(f)(xs); }),
                         error_of([&] {
                           // Blocks of shape (3, 1, 4): f sees (3, 4), as in the maps.
                           auto g = [f](auto x) { return f(namedax::squeeze(x, {1})); };
                           (void)namedax::shard_map(g, m, namedax::P(namedax::none, "i"_ax), namedax::P(namedax::none, "i"_ax))(
                               xt::xarray<float>(xt::zeros<float>({3, 2, 4})));
                         })};
    };
    auto all_say = [](const std::vector<std::string>& got, const std::string& expected) {
      for (const auto& text : got) CHECK(text == expected);
    };
    all_say(messages([](auto x) { return namedax::eval(namedax::view(x, xt::keep(0, 7))); }),
            "namedax::view: xt::keep index 7 is out of range for dim 0 of extent 3; pass indices in [-3, 3)");
    all_say(messages([](auto x) { return namedax::eval(namedax::view(x, xt::all(), xt::keep(-5))); }),
            "namedax::view: xt::keep index -5 is out of range for dim 1 of extent 4; pass indices in [-4, 4)");
    for (auto message : {"namedax::view: xt::drop indices for dim 0 of extent 3 are out of range, repeated or out of "
                         "order; give distinct indices in [-3, 3), in increasing order"}) {
      all_say(messages([](auto x) { return namedax::eval(namedax::view(x, xt::drop(9))); }), message);
      all_say(messages([](auto x) { return namedax::eval(namedax::view(x, xt::drop(1, 1))); }), message);
      all_say(messages([](auto x) { return namedax::eval(namedax::view(x, xt::drop(2, 0))); }), message);
    }
    all_say(messages([](auto x) { return namedax::eval(namedax::view(x, xt::range(0, 3, 0))); }),
            "namedax::view: xt::range with step 0 for dim 0; give a nonzero step");
    all_say(messages([](auto x) { return namedax::eval(namedax::view(x, xt::ellipsis(), xt::range(4, 0, 0))); }),
            "namedax::view: xt::range with step 0 for dim 1; give a nonzero step");
    // What the checks let through still reads the right elements.
    auto [kept, dropped] = namedax::vmap<"i">([](auto x) {
      return std::pair{namedax::eval(namedax::view(x, xt::keep(-1, 0, 0))), namedax::eval(namedax::view(x, xt::drop(-3, 2)))};
    })(xt::xarray<float>(xt::arange<float>(24).reshape({2, 3, 4})));
    CHECK(kept == xt::xarray<float>(xt::view(xt::arange<float>(24).reshape({2, 3, 4}), xt::all(), xt::keep(2, 0, 0))));
    CHECK(dropped == xt::xarray<float>(xt::view(xt::arange<float>(24).reshape({2, 3, 4}), xt::all(), xt::keep(1))));
  }

  TEST_CASE("concat and stack of a single value") {
    const xt::xarray<float> xs = xt::arange<float>(6).reshape({2, 3});
    auto [c, s] = namedax::vmap<"i">([](auto x) { return std::pair{namedax::concat(std::tuple{x}, 0), namedax::stack(std::tuple{x}, 1)}; })(xs);
    CHECK(c == xs);
    xt::xarray<float> stacked = xs;
    stacked.reshape({2, 3, 1});
    CHECK(s == stacked);
  }
}
