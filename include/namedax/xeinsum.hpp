// SPDX-License-Identifier: MIT
// xeinsum: einsum with named axes in braces, "ij{i},jk{i}->ik"; the spec is parsed at compile
// time, so a malformed spec, or an output name no input has, does not compile.
#pragma once

#include <namedax/collectives.hpp>
#include <namedax/detail/einsum.hpp>
#include <namedax/detail/einsum_spec.hpp>
#include <namedax/detail/traced.hpp>

#include <span>

namespace namedax {
namespace detail {
template <class A, class List>
inline constexpr bool list_has = false;
template <class A, class... Ns>
inline constexpr bool list_has<A, type_list<Ns...>> = (same_axis<A, Ns> || ...);

/// The names of `List` that `Excluded` does not have.
template <class List, class Excluded>
struct list_minus;
template <class... Ns, class Excluded>
struct list_minus<type_list<Ns...>, Excluded>
    : type_list_cat<type_list<>, std::conditional_t<list_has<Ns, Excluded>, type_list<>, type_list<Ns>>...> {};
template <class List, class Excluded>
using list_minus_t = typename list_minus<List, Excluded>::type;

/// The names of either list, each once.
template <class A, class B>
using list_union_t = typename type_list_cat<A, list_minus_t<B, A>>::type;

template <class... Lists>
struct union_of {
  using type = type_list<>;
};
template <class First, class... Rest>
struct union_of<First, Rest...> {
  using type = list_union_t<First, typename union_of<Rest...>::type>;
};

/// The union of the names of every operand of `Spec` but K.
template <class Spec, std::size_t K, class Indices>
struct names_of_others;
template <class Spec, std::size_t K, std::size_t... J>
struct names_of_others<Spec, K, std::index_sequence<J...>>
    : union_of<std::conditional_t<J == K, type_list<>, typename Spec::template names<J>>...> {};

template <class List>
struct as_axes;
template <class... Ns>
struct as_axes<type_list<Ns...>> {
  using type = axis_list<0, Ns...>;
};

// Named so that a failing static_assert prints the operand's position, its rank and the
// number of subscripts the spec gives it.
template <std::size_t Operand, std::size_t Rank, std::size_t Subscripts>
inline constexpr bool operand_rank_matches_spec = Rank == dynamic_extent || Rank == Subscripts;

/// The product of named values (or plain ones) over positional subscripts (one string per
/// operand, letters only), with output subscripts `output`: einsum on each index.
template <class... Ys>
auto local_einsum(std::string_view verb, std::span<const std::string_view> subscripts, std::string_view output,
                  const Ys&... ys) {
  using Env = typename merged_env<env<>, Ys...>::type;
  using R = std::common_type_t<value_type_of_t<Ys>...>;
  auto payloads = std::tuple{payload_in<Env>(ys)...};
  std::array<xt::xarray<R>, sizeof...(Ys)> storage;
  auto blocks = [&]<std::size_t... K>(std::index_sequence<K...>) {
    return std::array<strided_block<R>, sizeof...(Ys)>{block_in_memory<R>(std::get<K>(payloads), storage[K])...};
  }(std::index_sequence_for<Ys...>{});
  auto product = einsum_product<R>(verb, blocks, subscripts, output, Env::vectorized_count, Env::device_mask != 0);
  constexpr axis_mask varying = (mask_of<Ys>() | ... | 0);
  return make_named<shared_array<R>, Env, varying>(share_array<R>(std::move(product)));
}

/// psum over the names of `List`, or the value itself when there are none.
template <class List, class X>
auto psum_over(const X& x) {
  if constexpr (std::is_same_v<List, type_list<>>) return x;
  else return psum(x, typename as_axes<List>::type{});
}
}  // namespace detail

/// einsum with named axes: lowercase letters are positional subscripts, names in braces are
/// named axes. A subscript or name in only one input and not in the output is summed over
/// in that input; one in several inputs and not in the output is contracted (named: a psum
/// of the product, as pdot). Positional dims come out in the order the output spec writes
/// them; any number of operands.
///   namedax::xeinsum<"ij{model},jk{model}->ik">(x, w)  // x @ w, features sharded along "model"
template <fixed_string Spec>
struct xeinsum_fn {
  static constexpr std::string_view name = "xeinsum";
  using spec = detail::einsum_spec<Spec>;

  template <class... Xs>
    requires((Operand<Xs> || Traced<Xs>) && ...)
  auto operator()(const Xs&... xs) const {
    // A malformed spec is reported by its own diagnostic alone: nothing else is checked or run.
    if constexpr (detail::einsum_parsed<Spec>.error != detail::einsum_error::none) {
      return spec::operand_count;
    } else {
      static_assert(sizeof...(Xs) == spec::operand_count,
                    "namedax::xeinsum: the spec names a different number of operands than were given; give one "
                    "operand per comma-separated input spec");
      return detail::when_resolved(
          [](const auto&... ys) { return run(std::make_index_sequence<sizeof...(Xs)>{}, ys...); }, xs...);
    }
  }

 private:
  template <std::size_t K, class X>
  static constexpr void check_rank() {
    static_assert(detail::operand_rank_matches_spec<K, detail::static_positional_rank<X>(),
                                                    spec::template subscripts<K>.size()>,
                  "namedax::xeinsum: an operand's type fixes its rank, and the spec gives it another number of "
                  "subscripts; write one subscript per positional dimension of that operand");
  }

  template <std::size_t... K, class... Xs>
  static auto run(std::index_sequence<K...>, const Xs&... xs) {
    (check_rank<K, Xs>(), ...);
    using all_names = typename detail::union_of<typename spec::template names<K>...>::type;
    using output_names = typename spec::output_names;
    using Env = typename detail::merged_env<env<>, Xs...>::type;
    [&]<class... Names>(detail::type_list<Names...>) {
      detail::require_bound<xeinsum_fn, Env, Names...>();
    }(all_names{});
    // A name only one input has, and the output lacks, is summed in that input first.
    auto reduced = std::tuple{detail::psum_over<only_in<K, sizeof...(Xs)>>(xs)...};
    using once = typename detail::union_of<only_in<K, sizeof...(Xs)>...>::type;
    using contracted = detail::list_minus_t<detail::list_minus_t<all_names, output_names>, once>;

    const std::array<std::string_view, sizeof...(Xs)> subscripts{spec::template subscripts<K>...};
    if constexpr ((Traced<Xs> || ...)) {
      // Differentiated: the local product records its own pullback; the psums record theirs.
      using rule = detail::derivative<detail::rule::einsum, typename detail::dependent<decltype(reduced), xeinsum_fn>::type>;
      return detail::psum_over<contracted>(rule::apply(subscripts, spec::output_subscripts, std::get<K>(reduced)...));
    } else {
      return detail::psum_over<contracted>(
          detail::local_einsum(name, std::span<const std::string_view>(subscripts), spec::output_subscripts,
                               std::get<K>(reduced)...));
    }
  }

  /// The names operand K has that no other operand, nor the output, has.
  template <std::size_t K, std::size_t N>
  using only_in = detail::list_minus_t<
      detail::list_minus_t<typename spec::template names<K>, typename spec::output_names>,
      typename detail::names_of_others<spec, K, std::make_index_sequence<N>>::type>;
};

template <fixed_string Spec>
inline constexpr xeinsum_fn<Spec> xeinsum{};

}  // namespace namedax
