// SPDX-License-Identifier: MIT
// Each collective takes its own options struct: psum given all_gather's options does not compile,
// and the compiler names psum and the options type it cannot take.
// expect-error: no match(ing function)? for call to [^a-z]*(object of type [^a-z]*)?const namedax::psum_fn.*(cannot convert|no known conversion from)[^a-z]*namedax::all_gather_options
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> xs = xt::arange<float>(4);
  auto f = [](auto x) { return namedax::psum(x, "i"_ax, namedax::all_gather_options{.tiled = true}); };
  auto result = namedax::vmap<"i">(f)(xs);
  (void)result;
}
