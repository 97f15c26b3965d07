// SPDX-License-Identifier: MIT
// An axis name inside braces cannot be empty, as between two commas.
// expect-error: namedax::xeinsum: an axis name inside braces is empty
#include <namedax/detail/einsum_spec.hpp>

int main() {
  constexpr auto n = namedax::detail::einsum_spec<"ij{i,,j},jk->ik">::operand_count;
  return static_cast<int>(n);
}
