// SPDX-License-Identifier: MIT
// An operand's braces come after its subscripts, not before them.
// expect-error: namedax::xeinsum: something follows the braces of an operand
#include <namedax/detail/einsum_spec.hpp>

int main() {
  constexpr auto n = namedax::detail::einsum_spec<"{i}j,jk->ik">::operand_count;
  return static_cast<int>(n);
}
