// SPDX-License-Identifier: MIT
// An axis name may appear once in an operand's braces.
// expect-error: namedax::xeinsum: an axis name appears twice in one operand's braces
#include <namedax/detail/einsum_spec.hpp>

int main() {
  constexpr auto n = namedax::detail::einsum_spec<"ij{batch,batch},jk->ik">::operand_count;
  return static_cast<int>(n);
}
