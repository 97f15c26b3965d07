// SPDX-License-Identifier: MIT
// unpack(t, f): f called on the elements of a tuple-like t, as std::apply, without its layers
// (std::__invoke, and a noexcept specification that asks is_nothrow_invocable of every call):
// the maps and pytrees call it for each value type and function, so its cost is paid often.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

namespace namedax::detail {

template <class Tuple, class F>
constexpr decltype(auto) unpack(Tuple&& t, F&& f) {
  return [&]<std::size_t... I>(std::index_sequence<I...>) -> decltype(auto) {
    return std::forward<F>(f)(std::get<I>(std::forward<Tuple>(t))...);
  }(std::make_index_sequence<std::tuple_size_v<std::remove_cvref_t<Tuple>>>{});
}

}  // namespace namedax::detail
