// SPDX-License-Identifier: MIT
// -ffast-math reorders the folds that make vmap and pmap bit-identical; with
// NAMEDAX_STRICT_BIT_IDENTITY that does not compile. (The macro below is what -ffast-math defines.)
// expect-error: namedax: compiled with -ffast-math, which breaks the bit identity
#define __FAST_MATH__ 1
#define NAMEDAX_STRICT_BIT_IDENTITY
#include <namedax/namedax.hpp>

int main() { return 0; }
