// SPDX-License-Identifier: MIT
// Compile-time checks of the xeinsum spec parser: operand counts, positional subscripts and
// named axes of each operand and of the output. Building this program is the test.
#include <namedax/detail/einsum_spec.hpp>

#include <cstddef>
#include <type_traits>

NAMEDAX_AXIS(batch);

namespace {
using namedax::axis;
using namedax::detail::type_list;
template <namedax::fixed_string Spec>
using spec = namedax::detail::einsum_spec<Spec>;

// Named axes on both inputs, contracted away: the output has only subscripts.
using s1 = spec<"ij{i},jk{i}->ik">;
static_assert(s1::operand_count == 2);
static_assert(s1::subscripts<0> == "ij" && s1::subscripts<1> == "jk");
static_assert(std::is_same_v<s1::names<0>, type_list<axis<"i">>>);
static_assert(std::is_same_v<s1::names<1>, type_list<axis<"i">>>);
static_assert(s1::output_subscripts == "ik");
static_assert(std::is_same_v<s1::output_names, type_list<>>);

// No braces at all: a plain einsum.
using s2 = spec<"ij,jk->ik">;
static_assert(s2::operand_count == 2);
static_assert(s2::subscripts<0> == "ij" && s2::subscripts<1> == "jk" && s2::output_subscripts == "ik");
static_assert(std::is_same_v<s2::names<0>, type_list<>> && std::is_same_v<s2::names<1>, type_list<>>);
static_assert(std::is_same_v<s2::output_names, type_list<>>);

// An empty brace pair means no names.
using s3 = spec<"i{i}->{}">;
static_assert(s3::operand_count == 1);
static_assert(s3::subscripts<0> == "i" && s3::output_subscripts.empty());
static_assert(std::is_same_v<s3::names<0>, type_list<axis<"i">>>);
static_assert(std::is_same_v<s3::output_names, type_list<>>);

// Names only, and an empty output: a reduction to a scalar.
using s4 = spec<"{i}->">;
static_assert(s4::operand_count == 1);
static_assert(s4::subscripts<0>.empty() && s4::output_subscripts.empty());
static_assert(std::is_same_v<s4::names<0>, type_list<axis<"i">>>);
static_assert(std::is_same_v<s4::output_names, type_list<>>);

// Several names keep the order written in the braces.
using s5 = spec<"ab{x,y},b{y}->a{x}">;
static_assert(s5::operand_count == 2);
static_assert(s5::subscripts<0> == "ab" && s5::subscripts<1> == "b" && s5::output_subscripts == "a");
static_assert(std::is_same_v<s5::names<0>, type_list<axis<"x">, axis<"y">>>);
static_assert(std::is_same_v<s5::names<1>, type_list<axis<"y">>>);
static_assert(std::is_same_v<s5::output_names, type_list<axis<"x">>>);
using s5_reversed = spec<"{y,x}->{x,y}">;
static_assert(std::is_same_v<s5_reversed::names<0>, type_list<axis<"y">, axis<"x">>>);
static_assert(std::is_same_v<s5_reversed::output_names, type_list<axis<"x">, axis<"y">>>);

// Long names, and a named axis kept in the output.
using s6 = spec<"{batch}->{batch}">;
static_assert(s6::operand_count == 1);
static_assert(s6::subscripts<0>.empty() && s6::output_subscripts.empty());
static_assert(std::is_same_v<s6::names<0>, type_list<axis<"batch">>>);
static_assert(std::is_same_v<s6::output_names, type_list<axis<"batch">>>);
static_assert(std::is_same_v<spec<"i{batch,model}->i{model}">::names<0>,
                             type_list<axis<"batch">, axis<"model">>>);
// A name is any run of characters other than ',', '{', '}' and whitespace.
static_assert(std::is_same_v<spec<"i{Layer_2,x-y}->{x-y}">::names<0>, type_list<axis<"Layer_2">, axis<"x-y">>>);

// A transpose.
using s7 = spec<"ijk->kji">;
static_assert(s7::operand_count == 1 && s7::subscripts<0> == "ijk" && s7::output_subscripts == "kji");
static_assert(std::is_same_v<s7::names<0>, type_list<>> && std::is_same_v<s7::output_names, type_list<>>);

// Three or more operands.
using s8 = spec<"ij,jk,kl->il">;
static_assert(s8::operand_count == 3);
static_assert(s8::subscripts<0> == "ij" && s8::subscripts<1> == "jk" && s8::subscripts<2> == "kl");
static_assert(s8::output_subscripts == "il");
using s9 = spec<"a{p},b{q},c{r},d->abcd{r,p}">;
static_assert(s9::operand_count == 4 && s9::subscripts<3> == "d");
static_assert(std::is_same_v<s9::names<2>, type_list<axis<"r">>> && std::is_same_v<s9::names<3>, type_list<>>);
static_assert(std::is_same_v<s9::output_names, type_list<axis<"r">, axis<"p">>>);

// As in JAX, an empty operand between commas (or after a trailing one) is a scalar.
using s10 = spec<"ij,->ij">;
static_assert(s10::operand_count == 2 && s10::subscripts<1>.empty());
static_assert(std::is_same_v<s10::names<1>, type_list<>>);

// Names parsed from a spec are the very types that users spell, tag types included.
static_assert(std::is_same_v<s6::output_names, type_list<namedax::canonical_axis_t<batch_t>>>);

// Operands past the last are not there.
template <class S, std::size_t K>
concept has_operand = requires { S::template subscripts<K>; typename S::template names<K>; };
static_assert(has_operand<s8, 2> && !has_operand<s8, 3> && !has_operand<s4, 1>);
}  // namespace

int main() { return 0; }
