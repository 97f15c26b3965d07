// SPDX-License-Identifier: MIT
// A spec has exactly one '->', since an xeinsum has one output.
// expect-error: namedax::xeinsum: the spec has more than one '->'
#include <namedax/detail/einsum_spec.hpp>

int main() {
  constexpr auto n = namedax::detail::einsum_spec<"ij->jk->ik">::operand_count;
  return static_cast<int>(n);
}
