// SPDX-License-Identifier: MIT
// Every named axis in the output must come from an input operand.
// expect-error: namedax::xeinsum: a named axis appears in the output but in no input
#include <namedax/detail/einsum_spec.hpp>

int main() {
  constexpr auto n = namedax::detail::einsum_spec<"ij{i},jk->ik{model}">::operand_count;
  return static_cast<int>(n);
}
