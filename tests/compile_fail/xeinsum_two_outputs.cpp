// SPDX-License-Identifier: MIT
// An xeinsum has one output, so the output cannot be a comma-separated list.
// expect-error: namedax::xeinsum: the output after '->' has a comma
#include <namedax/detail/einsum_spec.hpp>

int main() {
  constexpr auto n = namedax::detail::einsum_spec<"ij,jk->i,k">::operand_count;
  return static_cast<int>(n);
}
