// SPDX-License-Identifier: MIT
// A subscript may appear once per operand, since diagonals are not supported.
// expect-error: namedax::xeinsum: a subscript appears twice in one input operand
#include <namedax/detail/einsum_spec.hpp>

int main() {
  constexpr auto n = namedax::detail::einsum_spec<"ii,jk->ik">::operand_count;
  return static_cast<int>(n);
}
