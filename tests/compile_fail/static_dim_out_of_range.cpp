// SPDX-License-Identifier: MIT
// A mapped xt::xtensor<float, 2> gives values of positional rank 1 in their type: a dim given
// as namedax::dim<K> beyond that rank does not compile.
// expect-error: namedax: a positional dim is out of range for the rank the value's type gives it
#include <namedax/namedax.hpp>
#include <xtensor/xtensor.hpp>

using namespace namedax::literals;

int main() {
  xt::xtensor<float, 2> xs = xt::zeros<float>({4, 3});
  auto f = [](auto x) { return namedax::sum(x * 2.f, namedax::dim<1>); };
  auto result = namedax::vmap<"i">(f)(xs);
  (void)result;
}
