// SPDX-License-Identifier: MIT
// einsum_spec<"ij{i},jk{i}->ik">: an xeinsum spec parsed at compile time into each operand's
// positional subscripts and named axes, with one diagnostic per kind of mistake.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <namedax/axis.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <string_view>
#include <type_traits>
#include <utility>

namespace namedax::detail {

// Grammar, as JAX's XeinsumSpecParser reads it:
//   spec := args "->" arg     args := arg ("," arg)*     arg := [a-z]* ("{" name ("," name)* "}")?
// A name is a non-empty run of characters other than ',', '{', '}' and whitespace; "{}" means
// no names. Like JAX, the spec is split at "->" first, and an empty operand between commas
// ("ij,,jk" or a trailing ",") is a scalar operand; only an empty input list is an error.

/// The first mistake found in a spec; `none` for a valid one.
enum class einsum_error {
  none,
  no_arrow,
  two_arrows,
  no_inputs,
  bad_character,
  unmatched_close_brace,
  unterminated_brace,
  nested_brace,
  empty_axis_name,
  space_in_axis_name,
  text_after_braces,
  two_outputs,
  subscript_twice_in_operand,
  axis_twice_in_operand,
  subscript_twice_in_output,
  output_subscript_not_in_inputs,
  output_axis_not_in_inputs,
};

/// Characters [begin, end) of the spec.
struct einsum_range {
  std::size_t begin = 0;
  std::size_t end = 0;
  [[nodiscard]] constexpr std::string_view in(std::string_view spec) const { return spec.substr(begin, end - begin); }
};

/// One operand: its subscripts are contiguous in the spec; its names are
/// `names[first_name, first_name + name_count)` of the parse.
struct einsum_operand {
  einsum_range subscripts{};
  std::size_t first_name = 0;
  std::size_t name_count = 0;
};

// Offsets rather than strings, so that the result is a literal type whose size depends only
// on the spec's length. `Cap` bounds operands (at most one per comma, plus the output) and
// names (each takes at least two characters).
template <std::size_t Cap>
struct einsum_parse {
  einsum_error error = einsum_error::none;
  einsum_range fault{};  // the part of the spec that the diagnostic prints
  std::size_t operand_count = 0;  // inputs; operands[operand_count] is the output
  std::array<einsum_operand, Cap> operands{};
  std::array<einsum_range, Cap> names{};
  std::size_t name_count = 0;
};

constexpr bool einsum_is_subscript(char c) { return c >= 'a' && c <= 'z'; }
constexpr bool einsum_is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// A UTF-8 sequence is reported whole, so that a stray 'é' prints as itself.
// Plain loops instead of std::string_view::find: under -fsanitize=address, g++ 12 cannot
// evaluate find's pointer comparisons on a template argument's text at compile time.
constexpr bool einsum_contains(std::string_view text, char c) {
  for (char t : text)
    if (t == c) return true;
  return false;
}

constexpr std::size_t einsum_character_end(std::string_view s, std::size_t pos) {
  ++pos;
  while (pos < s.size() && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) ++pos;
  return pos;
}

// One pass over the text, then one over the operands. It stops at the first mistake, so that
// a user sees one diagnostic at a time.
template <std::size_t Cap>
consteval einsum_parse<Cap> parse_einsum_spec(std::string_view s) {
  einsum_parse<Cap> r;
  // Keeps only the mistake: no partial operands, so that einsum_spec's members stay well-formed.
  auto fail = [&](einsum_error e, std::size_t begin, std::size_t end) {
    r = einsum_parse<Cap>{};
    r.error = e;
    r.fault = {begin, end};
    return false;
  };

  // Like JAX, split at "->" before anything else.
  auto parse_arrow = [&](std::size_t& arrow) {
    std::size_t arrows = 0;
    for (std::size_t p = 0; p + 1 < s.size(); ++p)
      if (s[p] == '-' && s[p + 1] == '>' && arrows++ == 0) arrow = p;
    if (arrows == 0) return fail(einsum_error::no_arrow, 0, s.size());
    if (arrows > 1) return fail(einsum_error::two_arrows, 0, s.size());
    if (arrow == 0) return fail(einsum_error::no_inputs, 0, s.size());
    return true;
  };

  // Appends the operands of s[begin, end) to r.operands; the output section holds exactly one.
  auto parse_section = [&](std::size_t begin, std::size_t end, bool output) {
    for (std::size_t pos = begin;; ++pos) {  // ++pos steps over the ',' between operands
      einsum_operand op;
      op.subscripts.begin = pos;
      while (pos < end && einsum_is_subscript(s[pos])) ++pos;
      op.subscripts.end = pos;
      op.first_name = r.name_count;
      const std::size_t brace = pos;
      const bool braced = pos < end && s[pos] == '{';
      if (braced) {
        ++pos;
        if (pos < end && s[pos] == '}') {
          ++pos;  // "{}": no names
        } else {
          for (bool closed = false; !closed;) {
            const std::size_t name = pos;
            while (pos < end && s[pos] != ',' && s[pos] != '{' && s[pos] != '}' && !einsum_is_space(s[pos])) ++pos;
            if (pos == end) return fail(einsum_error::unterminated_brace, brace, end);
            if (s[pos] == '{') return fail(einsum_error::nested_brace, brace, pos + 1);
            if (einsum_is_space(s[pos])) return fail(einsum_error::space_in_axis_name, brace, pos + 1);
            if (pos == name) return fail(einsum_error::empty_axis_name, brace, pos + 1);
            r.names[r.name_count++] = {name, pos};
            closed = s[pos++] == '}';
          }
        }
      }
      op.name_count = r.name_count - op.first_name;
      r.operands[r.operand_count++] = op;
      if (pos == end) return true;
      if (s[pos] == ',') {
        if (output) return fail(einsum_error::two_outputs, begin, end);
        continue;
      }
      if (braced) return fail(einsum_error::text_after_braces, brace, pos + 1);
      if (s[pos] == '}') return fail(einsum_error::unmatched_close_brace, pos, pos + 1);
      return fail(einsum_error::bad_character, pos, einsum_character_end(s, pos));
    }
  };

  auto name_of = [&](std::size_t n) { return r.names[n].in(s); };

  // Within one operand, each subscript and each name once; r.operands[inputs] is the output.
  auto check_operands = [&](std::size_t inputs) {
    for (std::size_t k = 0; k <= inputs; ++k) {
      const einsum_operand& op = r.operands[k];
      for (std::size_t p = op.subscripts.begin; p < op.subscripts.end; ++p)
        if (einsum_contains(einsum_range{op.subscripts.begin, p}.in(s), s[p]))
          return fail(k == inputs ? einsum_error::subscript_twice_in_output
                                  : einsum_error::subscript_twice_in_operand,
                      p, p + 1);
      for (std::size_t a = op.first_name; a < op.first_name + op.name_count; ++a)
        for (std::size_t b = op.first_name; b < a; ++b)
          if (name_of(a) == name_of(b))
            return fail(einsum_error::axis_twice_in_operand, r.names[a].begin, r.names[a].end);
    }
    return true;
  };

  // The output takes every subscript and every name from some input.
  auto check_output = [&](std::size_t inputs) {
    const einsum_operand& out = r.operands[inputs];
    for (std::size_t p = out.subscripts.begin; p < out.subscripts.end; ++p) {
      bool found = false;
      for (std::size_t k = 0; k < inputs && !found; ++k)
        found = einsum_contains(r.operands[k].subscripts.in(s), s[p]);
      if (!found) return fail(einsum_error::output_subscript_not_in_inputs, p, p + 1);
    }
    for (std::size_t a = out.first_name; a < out.first_name + out.name_count; ++a) {
      bool found = false;
      for (std::size_t b = 0; b < out.first_name && !found; ++b) found = name_of(a) == name_of(b);
      if (!found) return fail(einsum_error::output_axis_not_in_inputs, r.names[a].begin, r.names[a].end);
    }
    return true;
  };

  std::size_t arrow = 0;
  if (!parse_arrow(arrow) || !parse_section(0, arrow, false)) return r;
  const std::size_t inputs = r.operand_count;
  if (!parse_section(arrow + 2, s.size(), true) || !check_operands(inputs) || !check_output(inputs)) return r;
  r.operand_count = inputs;  // the output is not an operand of xeinsum
  return r;
}

/// The parse of `Spec`, computed once per spec.
template <fixed_string Spec>
inline constexpr auto einsum_parsed = parse_einsum_spec<Spec.view().size() + 2>(Spec.view());

// fixed_string has only a constructor from a char array, so a piece of a spec is copied into
// an array of its own length first.
template <std::size_t Length>
consteval fixed_string<Length + 1> make_fixed_string(std::string_view text) {
  char chars[Length + 1]{};
  std::copy_n(text.data(), Length, chars);
  return fixed_string<Length + 1>(chars);
}

/// Characters [Begin, End) of `Spec` as a fixed_string: `axis<einsum_text<Spec, B, E>>` is
/// the same type as `axis<"name">` written by hand.
template <fixed_string Spec, std::size_t Begin, std::size_t End>
inline constexpr auto einsum_text = make_fixed_string<End - Begin>(einsum_range{Begin, End}.in(Spec.view()));

template <fixed_string Spec, std::size_t First, std::size_t... I>
auto einsum_names_of(std::index_sequence<I...>)
    -> type_list<axis<einsum_text<Spec, einsum_parsed<Spec>.names[First + I].begin,
                                  einsum_parsed<Spec>.names[First + I].end>>...>;

template <fixed_string Spec, std::size_t K>
using einsum_operand_names =
    decltype(einsum_names_of<Spec, einsum_parsed<Spec>.operands[K].first_name>(
        std::make_index_sequence<einsum_parsed<Spec>.operands[K].name_count>{}));

// Named-predicate diagnostics: each mistake is a type, instantiated with the part of the spec
// at fault (as characters, or as the axis), so both g++ and clang++ print the culprit.
template <class... T>
inline constexpr bool einsum_rejected = false;

template <char... Spec>
struct xeinsum_spec_without_arrow {
  static_assert(einsum_rejected<xeinsum_spec_without_arrow>,
                "namedax::xeinsum: the spec has no '->'; write the inputs, then '->', then the output, as in "
                "'ij,jk->ik'");
};
template <char... Spec>
struct xeinsum_spec_with_two_arrows {
  static_assert(einsum_rejected<xeinsum_spec_with_two_arrows>,
                "namedax::xeinsum: the spec has more than one '->'; an xeinsum has one output, so write '->' "
                "once, as in 'ij,jk->ik'");
};
template <char... Spec>
struct xeinsum_spec_without_inputs {
  static_assert(einsum_rejected<xeinsum_spec_without_inputs>,
                "namedax::xeinsum: the spec has no input operand before '->'; write one operand per array "
                "passed to xeinsum, as in 'ij->ji'");
};
template <char... Character>
struct xeinsum_bad_character {
  static_assert(einsum_rejected<xeinsum_bad_character>,
                "namedax::xeinsum: a character outside braces is not a lowercase letter, a comma or a brace; "
                "write subscripts as a-z with no spaces and put axis names in braces, as in 'ij{batch}'");
};
template <char... Brace>
struct xeinsum_unmatched_close_brace {
  static_assert(einsum_rejected<xeinsum_unmatched_close_brace>,
                "namedax::xeinsum: a '}' closes no '{'; open the list of axis names with '{', as in "
                "'ij{batch}'");
};
template <char... Braces>
struct xeinsum_unterminated_brace {
  static_assert(einsum_rejected<xeinsum_unterminated_brace>,
                "namedax::xeinsum: a '{' is not closed before the next '->' or the end of the spec; end the "
                "list of axis names with '}', as in 'ij{batch,model}'");
};
template <char... Braces>
struct xeinsum_nested_brace {
  static_assert(einsum_rejected<xeinsum_nested_brace>,
                "namedax::xeinsum: a '{' inside braces; braces hold one flat list of axis names, as in "
                "'{batch,model}'");
};
template <char... Braces>
struct xeinsum_empty_axis_name {
  static_assert(einsum_rejected<xeinsum_empty_axis_name>,
                "namedax::xeinsum: an axis name inside braces is empty; separate names with single commas and "
                "put none right after '{' or before '}', as in '{batch,model}' (or '{}' for no names)");
};
template <char... Braces>
struct xeinsum_space_in_axis_name {
  static_assert(einsum_rejected<xeinsum_space_in_axis_name>,
                "namedax::xeinsum: an axis name inside braces contains whitespace; write the names without "
                "spaces, as in '{batch,model}'");
};
template <char... Operand>
struct xeinsum_text_after_braces {
  static_assert(einsum_rejected<xeinsum_text_after_braces>,
                "namedax::xeinsum: something follows the braces of an operand; write an operand's subscripts "
                "first and one list of axis names last, as in 'ij{batch,model}'");
};
template <char... Output>
struct xeinsum_two_outputs {
  static_assert(einsum_rejected<xeinsum_two_outputs>,
                "namedax::xeinsum: the output after '->' has a comma; an xeinsum has one output operand, so "
                "remove the comma");
};
template <char... Subscript>
struct xeinsum_subscript_twice_in_operand {
  static_assert(einsum_rejected<xeinsum_subscript_twice_in_operand>,
                "namedax::xeinsum: a subscript appears twice in one input operand; diagonals are not "
                "supported, so use each letter once per operand");
};
template <Axis A>
struct xeinsum_axis_twice_in_operand {
  static_assert(einsum_rejected<xeinsum_axis_twice_in_operand>,
                "namedax::xeinsum: an axis name appears twice in one operand's braces; name each axis once "
                "per operand");
};
template <char... Subscript>
struct xeinsum_subscript_twice_in_output {
  static_assert(einsum_rejected<xeinsum_subscript_twice_in_output>,
                "namedax::xeinsum: a subscript appears twice in the output; write each output subscript once");
};
template <char... Subscript>
struct xeinsum_output_subscript_not_in_inputs {
  static_assert(einsum_rejected<xeinsum_output_subscript_not_in_inputs>,
                "namedax::xeinsum: a subscript appears in the output but in no input; use in the output only "
                "letters that some input operand has");
};
template <Axis A>
struct xeinsum_output_axis_not_in_inputs {
  static_assert(einsum_rejected<xeinsum_output_axis_not_in_inputs>,
                "namedax::xeinsum: a named axis appears in the output but in no input; name in the output only "
                "axes that some input operand names in its braces");
};

/// The mistake of a valid spec.
struct einsum_no_mistake {};

// The type that names the spec's mistake, with the part at fault. Only the matching branch
// is instantiated, and only as a name: completing the type is what fires its static_assert.
template <einsum_error E, fixed_string Spec, std::size_t Begin, std::size_t... I>
constexpr auto einsum_mistake_of(std::index_sequence<I...>) {
  using enum einsum_error;
  using axis_at_fault = axis<einsum_text<Spec, Begin, Begin + sizeof...(I)>>;
  if constexpr (E == none) return std::type_identity<einsum_no_mistake>{};
  else if constexpr (E == no_arrow) return std::type_identity<xeinsum_spec_without_arrow<Spec.data[Begin + I]...>>{};
  else if constexpr (E == two_arrows)
    return std::type_identity<xeinsum_spec_with_two_arrows<Spec.data[Begin + I]...>>{};
  else if constexpr (E == no_inputs)
    return std::type_identity<xeinsum_spec_without_inputs<Spec.data[Begin + I]...>>{};
  else if constexpr (E == bad_character) return std::type_identity<xeinsum_bad_character<Spec.data[Begin + I]...>>{};
  else if constexpr (E == unmatched_close_brace)
    return std::type_identity<xeinsum_unmatched_close_brace<Spec.data[Begin + I]...>>{};
  else if constexpr (E == unterminated_brace)
    return std::type_identity<xeinsum_unterminated_brace<Spec.data[Begin + I]...>>{};
  else if constexpr (E == nested_brace) return std::type_identity<xeinsum_nested_brace<Spec.data[Begin + I]...>>{};
  else if constexpr (E == empty_axis_name)
    return std::type_identity<xeinsum_empty_axis_name<Spec.data[Begin + I]...>>{};
  else if constexpr (E == space_in_axis_name)
    return std::type_identity<xeinsum_space_in_axis_name<Spec.data[Begin + I]...>>{};
  else if constexpr (E == text_after_braces)
    return std::type_identity<xeinsum_text_after_braces<Spec.data[Begin + I]...>>{};
  else if constexpr (E == two_outputs) return std::type_identity<xeinsum_two_outputs<Spec.data[Begin + I]...>>{};
  else if constexpr (E == subscript_twice_in_operand)
    return std::type_identity<xeinsum_subscript_twice_in_operand<Spec.data[Begin + I]...>>{};
  else if constexpr (E == axis_twice_in_operand)
    return std::type_identity<xeinsum_axis_twice_in_operand<axis_at_fault>>{};
  else if constexpr (E == subscript_twice_in_output)
    return std::type_identity<xeinsum_subscript_twice_in_output<Spec.data[Begin + I]...>>{};
  else if constexpr (E == output_subscript_not_in_inputs)
    return std::type_identity<xeinsum_output_subscript_not_in_inputs<Spec.data[Begin + I]...>>{};
  else if constexpr (E == output_axis_not_in_inputs)
    return std::type_identity<xeinsum_output_axis_not_in_inputs<axis_at_fault>>{};
}

template <fixed_string Spec>
using einsum_mistake_t =
    typename decltype(einsum_mistake_of<einsum_parsed<Spec>.error, Spec, einsum_parsed<Spec>.fault.begin>(
        std::make_index_sequence<einsum_parsed<Spec>.fault.end - einsum_parsed<Spec>.fault.begin>{}))::type;

/// An xeinsum spec, parsed: `einsum_spec<"ij{i},jk{i}->ik">` has two operands,
/// `subscripts<0> == "ij"`, `names<0>` is `type_list<axis<"i">>`, `output_subscripts == "ik"`
/// and `output_names` is `type_list<>`. A malformed spec fails to compile with a
/// "namedax::xeinsum: ..." diagnostic naming the mistake.
template <fixed_string Spec>
struct einsum_spec {
  // Completing the mistake's type fires its static_assert, which says what is wrong; a valid
  // spec's is an empty struct. Asserted on a type, not a constant expression, so that clang++
  // reports the mistake once.
  static_assert(sizeof(einsum_mistake_t<Spec>) != 0);

  /// Operands left of "->".
  static constexpr std::size_t operand_count = einsum_parsed<Spec>.operand_count;

  /// The positional subscripts of operand K, in order: "ij".
  template <std::size_t K>
    requires(K < operand_count)
  static constexpr std::string_view subscripts = einsum_parsed<Spec>.operands[K].subscripts.in(Spec.view());

  /// The named axes of operand K as written in its braces: `type_list<axis<"i">, ...>`.
  template <std::size_t K>
    requires(K < operand_count)
  using names = einsum_operand_names<Spec, K>;

  /// The positional subscripts of the output: "ik".
  static constexpr std::string_view output_subscripts =
      einsum_parsed<Spec>.operands[operand_count].subscripts.in(Spec.view());

  /// The named axes of the output, as written in its braces.
  using output_names = einsum_operand_names<Spec, operand_count>;
};

}  // namespace namedax::detail
