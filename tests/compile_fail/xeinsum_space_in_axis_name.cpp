// SPDX-License-Identifier: MIT
// Axis names inside braces cannot contain whitespace.
// expect-error: namedax::xeinsum: an axis name inside braces contains whitespace
#include <namedax/detail/einsum_spec.hpp>

int main() {
  constexpr auto n = namedax::detail::einsum_spec<"ij{i, j},jk->ik">::operand_count;
  return static_cast<int>(n);
}
