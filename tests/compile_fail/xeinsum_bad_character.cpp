// SPDX-License-Identifier: MIT
// Positional subscripts are lowercase letters; an uppercase letter is not one.
// expect-error: namedax::xeinsum: a character outside braces is not a lowercase letter, a comma or a brace
#include <namedax/detail/einsum_spec.hpp>

int main() {
  constexpr auto n = namedax::detail::einsum_spec<"iJ,jk->ik">::operand_count;
  return static_cast<int>(n);
}
