// SPDX-License-Identifier: MIT
// A spec needs at least one input operand before '->'.
// expect-error: namedax::xeinsum: the spec has no input operand before '->'
#include <namedax/detail/einsum_spec.hpp>

int main() {
  constexpr auto n = namedax::detail::einsum_spec<"->ij">::operand_count;
  return static_cast<int>(n);
}
