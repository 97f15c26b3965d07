// SPDX-License-Identifier: MIT
// A list of axis names that opens with '{' must close with '}'.
// expect-error: namedax::xeinsum: a '[{]' is not closed before the next '->' or the end of the spec
#include <namedax/detail/einsum_spec.hpp>

int main() {
  constexpr auto n = namedax::detail::einsum_spec<"ij{i,jk->ik">::operand_count;
  return static_cast<int>(n);
}
