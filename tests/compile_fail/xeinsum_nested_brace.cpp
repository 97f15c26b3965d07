// SPDX-License-Identifier: MIT
// Braces hold a flat list of axis names and cannot nest.
// expect-error: namedax::xeinsum: a '[{]' inside braces
#include <namedax/detail/einsum_spec.hpp>

int main() {
  constexpr auto n = namedax::detail::einsum_spec<"ij{i{j}},jk->ik">::operand_count;
  return static_cast<int>(n);
}
