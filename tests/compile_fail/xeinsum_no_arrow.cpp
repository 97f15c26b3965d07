// SPDX-License-Identifier: MIT
// A spec needs '->' between its inputs and its output.
// expect-error: namedax::xeinsum: the spec has no '->'
#include <namedax/detail/einsum_spec.hpp>

int main() {
  constexpr auto n = namedax::detail::einsum_spec<"ij,jk">::operand_count;
  return static_cast<int>(n);
}
