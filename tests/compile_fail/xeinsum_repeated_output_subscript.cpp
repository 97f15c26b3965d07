// SPDX-License-Identifier: MIT
// A subscript may appear once in the output.
// expect-error: namedax::xeinsum: a subscript appears twice in the output
#include <namedax/detail/einsum_spec.hpp>

int main() {
  constexpr auto n = namedax::detail::einsum_spec<"ij,jk->iki">::operand_count;
  return static_cast<int>(n);
}
