// SPDX-License-Identifier: MIT
// Axis names as types: fixed_string, axis<"i">, the "i"_ax literal, tag types and axis lists.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <string_view>
#include <type_traits>

namespace namedax {

/// A string usable as a template argument: `axis<"batch">`.
template <std::size_t N>
struct fixed_string {
  char data[N]{};
  consteval fixed_string(const char (&text)[N]) { std::copy_n(text, N, data); }
  [[nodiscard]] constexpr std::string_view view() const { return {data, N - 1}; }
};

/// The type of the axis called `Name`. Tag types derived from it name the same axis:
/// `inline constexpr struct batch_t final : namedax::axis<"batch"> {} batch;`
template <fixed_string Name>
struct axis {
  static constexpr std::string_view name = Name.view();
};

namespace detail {
template <fixed_string Name>
axis<Name> canonical_axis_of(const axis<Name>*);
}  // namespace detail

/// An axis name: `axis<"i">` or a tag type derived from one.
template <class A>
concept Axis = requires { detail::canonical_axis_of(static_cast<const std::remove_cvref_t<A>*>(nullptr)); };

/// `axis<"i">` for any spelling of the axis "i" (a tag type or the axis itself).
template <Axis A>
using canonical_axis_t = decltype(detail::canonical_axis_of(static_cast<const std::remove_cvref_t<A>*>(nullptr)));

/// Two spellings name the same axis when their names are equal.
template <class A, class B>
inline constexpr bool same_axis = std::remove_cvref_t<A>::name == std::remove_cvref_t<B>::name;

namespace literals {
/// `"i"_ax` is `namedax::axis<"i">{}`. constexpr rather than consteval: clang 14 does not
/// evaluate a consteval literal operator called in a generic lambda, and fails to link.
template <fixed_string Name>
constexpr axis<Name> operator""_ax() { return {}; }
}  // namespace literals

/// Positional and named axes together, as JAX's `axes=("i", "j", 0)`:
/// `namedax::axes("i"_ax, "j"_ax, 0)`. Names keep the order given (it fixes row-major
/// indices over several names); positional axes are runtime ints.
namespace detail {
template <class... T>
struct type_list {};

template <class A, class... Rest>
inline constexpr bool occurs_once_in = (std::size_t{same_axis<A, Rest>} + ... + 0) == 1;

// Named so that a failing static_assert prints the offending axes.
template <class... Names>
inline constexpr bool axes_are_distinct = (occurs_once_in<Names, Names...> && ...);
}  // namespace detail

template <std::size_t Positional, Axis... Names>
struct axis_list {
  static_assert(detail::axes_are_distinct<Names...>,
                "namedax::axes: an axis name is given twice; name each axis once");
  std::array<int, Positional> positional{};
  /// How many names precede each positional axis as written: pgather flattens in that order.
  /// Unless `axes` says otherwise, the names come first.
  std::array<std::size_t, Positional> names_before = [] {
    std::array<std::size_t, Positional> all_names{};
    all_names.fill(sizeof...(Names));
    return all_names;
  }();
  static constexpr std::size_t named_count = sizeof...(Names);
};

namespace detail {
template <std::size_t K, class List, class... Rest>
struct make_axis_list;
template <std::size_t K, class... Names>
struct make_axis_list<K, type_list<Names...>> {
  using type = axis_list<K, Names...>;
};
template <std::size_t K, class... Names, class First, class... Rest>
struct make_axis_list<K, type_list<Names...>, First, Rest...>
    : std::conditional_t<Axis<First>, make_axis_list<K, type_list<Names..., std::remove_cvref_t<First>>, Rest...>,
                         make_axis_list<K, type_list<Names...>, Rest...>> {};
}  // namespace detail

namespace detail {
/// A string where an axis belongs (`psum(x, "i")`, JAX's spelling): accepted by the
/// signatures only so that to_axis_list can say how axis names are written.
template <class T>
inline constexpr bool is_string_axis = !Axis<T> && std::is_convertible_v<const T&, std::string_view>;
}  // namespace detail

/// Build an axis list from names and positional ints: `axes("i"_ax, 0, "j"_ax)`.
template <class... Args>
  requires((Axis<Args> || std::is_integral_v<Args> || detail::is_string_axis<Args>) && ...)
constexpr auto axes([[maybe_unused]] Args... args) {
  static_assert((!detail::is_string_axis<Args> && ...),
                "namedax::axes: axis names are types, written \"i\"_ax (with using namespace namedax::literals) or "
                "namedax::axis<\"i\">{}, not the string \"i\"");
  constexpr std::size_t positional = (std::size_t{std::is_integral_v<Args>} + ... + 0);
  using list = typename detail::make_axis_list<positional, detail::type_list<>, Args...>::type;
  list result;
  [[maybe_unused]] std::size_t next = 0, names = 0;
  ([&] {
    if constexpr (std::is_integral_v<Args>) result.names_before[next] = names, result.positional[next++] = static_cast<int>(args);
    else ++names;
  }(), ...);
  return result;
}

namespace detail {
template <class T>
inline constexpr bool is_axis_list = false;
template <std::size_t K, class... Names>
inline constexpr bool is_axis_list<axis_list<K, Names...>> = true;
}  // namespace detail


/// Anything a collective accepts as its axis argument: one name, or `axes(...)`. (A string
/// is let through, to fail with a message that says how to write the name.)
template <class T>
concept AxisArgument = Axis<T> || detail::is_axis_list<std::remove_cvref_t<T>> ||
                       detail::is_string_axis<std::remove_cvref_t<T>>;

namespace detail {
/// One name becomes a list of one.
template <AxisArgument T>
constexpr auto to_axis_list(const T& a) {
  static_assert(!is_string_axis<T>, "namedax: axis names are types, written \"i\"_ax (with using namespace "
                                    "namedax::literals) or namedax::axis<\"i\">{}, not the string \"i\"");
  if constexpr (Axis<T>) return axis_list<0, std::remove_cvref_t<T>>{};
  else if constexpr (is_string_axis<T>) return axis_list<0>{};
  else return a;
}
}  // namespace detail

}  // namespace namedax

/// Declares a tag type `name_t` and a constant `name` for the axis "name":
/// `NAMEDAX_AXIS(batch);` then `psum(x, batch)`.
#define NAMEDAX_AXIS(name)                          \
  inline constexpr struct name##_t final : ::namedax::axis<#name> { \
  } name {}
