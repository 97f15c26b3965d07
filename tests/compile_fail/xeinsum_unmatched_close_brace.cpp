// SPDX-License-Identifier: MIT
// A '}' must close a '{' that lists axis names.
// expect-error: namedax::xeinsum: a '}' closes no '[{]'
#include <namedax/detail/einsum_spec.hpp>

int main() {
  constexpr auto n = namedax::detail::einsum_spec<"ij},jk->ik">::operand_count;
  return static_cast<int>(n);
}
