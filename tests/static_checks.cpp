// SPDX-License-Identifier: MIT
// Compile-time checks: axis names, tag types, axis lists, environments and the types of
// named values and collective results. Building this program is the test.
#include <namedax/namedax.hpp>

using namespace namedax::literals;

NAMEDAX_AXIS(batch);

namespace {
using i_t = namedax::axis<"i">;
using j_t = namedax::axis<"j">;

// Axis names and their spellings.
static_assert(std::is_same_v<decltype("i"_ax), i_t>);
static_assert(namedax::Axis<i_t> && namedax::Axis<batch_t> && !namedax::Axis<int>);
static_assert(std::is_same_v<namedax::canonical_axis_t<batch_t>, namedax::axis<"batch">>);
static_assert(namedax::same_axis<batch_t, namedax::axis<"batch">> && !namedax::same_axis<i_t, j_t>);
static_assert(i_t::name == "i" && batch_t::name == "batch");

// Axis lists mix names and positional ints; names keep their order.
constexpr auto list = namedax::axes("i"_ax, 0, "j"_ax, -1);
static_assert(std::is_same_v<std::remove_cvref_t<decltype(list)>, namedax::axis_list<2, i_t, j_t>>);
static_assert(list.positional[0] == 0 && list.positional[1] == -1);
static_assert(namedax::AxisArgument<i_t> && namedax::AxisArgument<decltype(list)> && !namedax::AxisArgument<int>);
template <class T>
concept axes_accepts = requires(T t) { namedax::axes(t); };
static_assert(axes_accepts<int> && axes_accepts<i_t> && !axes_accepts<double>);  // only names and ints

// Environments: masks, placements and the trailing payload slots of vectorized axes.
using env2 = namedax::env<namedax::binding<i_t, namedax::placement::devices>,
                          namedax::binding<j_t, namedax::placement::vectorized>,
                          namedax::binding<batch_t, namedax::placement::vectorized, 8>>;
static_assert(env2::index_of("j") == 1 && env2::index_of("k") == -1);
static_assert(env2::vectorized_count == 2 && env2::vectorized_mask == 0b110 && env2::device_mask == 0b001);
static_assert(env2::vectorized_slot(1) == 0 && env2::vectorized_slot(2) == 1);
static_assert(env2::mask_of<batch_t, i_t>() == 0b101);
static_assert(env2::extents[2] == 8 && env2::extents[0] == namedax::dynamic_extent);
static_assert(namedax::BoundAxis<j_t, env2> && !namedax::BoundAxis<namedax::axis<"k">, env2>);

// Merging environments: the longer of two nested ones.
using env1 = namedax::env<namedax::binding<i_t, namedax::placement::devices>>;
static_assert(std::is_same_v<namedax::detail::env_merge_t<env1, env2>, env2>);
static_assert(namedax::detail::environments_are_nested<env1, env2>);
using other = namedax::env<namedax::binding<j_t, namedax::placement::devices>>;
static_assert(!namedax::detail::environments_are_nested<env1, other>);
using static4 = namedax::env<namedax::binding<i_t, namedax::placement::devices, 4>>;
using static5 = namedax::env<namedax::binding<i_t, namedax::placement::devices, 5>>;
static_assert(!namedax::detail::sizes_agree_for_same_axis<static4, static5>);
static_assert(namedax::detail::sizes_agree_for_same_axis<static4, env1>);

// Result types: a psum without groups no longer varies along its axis; with groups it does;
// broadcasting by name takes the union of the names.
using payload = namedax::detail::shared_array<float>;
using along_i = namedax::named<payload, env2, 0b001>;
using along_j = namedax::named<payload, env2, 0b010>;
static_assert(decltype(std::declval<along_i>() + std::declval<along_j>())::varying == 0b011);
static_assert(decltype(std::declval<along_i>() * 2.f)::varying == 0b001);
static_assert(std::is_same_v<decltype(std::declval<along_i>() < 1.f)::value_type, bool>);
static_assert(namedax::NamedValue<along_i> && !namedax::NamedValue<float>);
static_assert(namedax::DeferredValue<decltype(namedax::axis_index("i"_ax))>);
static_assert(namedax::DeferredValue<decltype(namedax::axis_index("i"_ax) + 1)>);
static_assert(namedax::NamedValue<decltype(namedax::axis_index("i"_ax) + std::declval<along_j>())>);
static_assert(decltype(namedax::axis_index("i"_ax) + std::declval<along_j>())::varying == 0b011);
// A value computed from axis_index alone names its element type, its names and which of them
// it varies along, not the operations that made it: a ring's step index has axis_index's
// type, and a collective over another name only adds that name.
using index_i = decltype(namedax::axis_index("i"_ax));
static_assert(std::is_same_v<decltype((namedax::axis_index("i"_ax) - 1 + 4) % 4 * 2), index_i>);
static_assert(std::is_same_v<decltype(namedax::psum((namedax::axis_index("i"_ax) + 1) * 3, "j"_ax)),
                             namedax::deferred<std::int32_t, 0b01, namedax::axis<"i">, namedax::axis<"j">>>);
static_assert(std::is_same_v<decltype(namedax::psum(namedax::axis_index("i"_ax), "i"_ax) * 2),
                             namedax::deferred<std::int32_t, 0b0, namedax::axis<"i">>>);
}  // namespace

int main() {
  // Result types of collectives, checked where they need an environment at run time.
  xt::xarray<float> x = xt::zeros<float>({2, 3});
  auto f = [](auto x) {
    using X = decltype(x);
    static_assert(X::varying == 0b11);  // along i (outer) and j (inner)
    static_assert(decltype(namedax::psum(x, "i"_ax))::varying == 0b10);
    static_assert(decltype(namedax::pmean(x, namedax::axes("i"_ax, "j"_ax)))::varying == 0);
    static_assert(decltype(namedax::pmax(x, "i"_ax, {}))::varying == 0b10);  // options without groups
    static_assert(decltype(namedax::pmax(x, "i"_ax, {.axis_index_groups = {{0}}}))::varying == 0b11);  // groups: may differ
    static_assert(decltype(namedax::all_gather(x, "j"_ax))::varying == 0b01);
    static_assert(decltype(namedax::all_gather(x, "j"_ax, {.axis = 1}))::varying == 0b01);
    static_assert(decltype(namedax::all_gather(x, "j"_ax, {.axis_index_groups = {{0}}, .axis = 1}))::varying == 0b11);
    static_assert(decltype(namedax::psum_scatter(x, "i"_ax, {.tiled = true}))::varying == 0b11);
    static_assert(std::is_same_v<typename decltype(namedax::pmean(namedax::cast<int>(x), "i"_ax))::value_type, float>);
    static_assert(std::is_same_v<typename decltype(namedax::psum(x > 0.f, "j"_ax))::value_type, std::int32_t>);
    return x;
  };
  auto out = namedax::pmap<"i">(namedax::vmap<"j">(f))(x);
  return out.shape() == std::vector<std::size_t>{2, 3} ? 0 : 1;
}
