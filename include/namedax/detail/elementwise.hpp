// SPDX-License-Identifier: MIT
// Helpers behind namedax/elementwise.hpp: the macros that lift xtensor's elementwise functions
// to named values.
#pragma once
// IWYU pragma: private, include <namedax/elementwise.hpp>

#include <namedax/named_array.hpp>

#include <xtensor/xmath.hpp>
#include <xtensor/xoperation.hpp>

#include <utility>

#define NAMEDAX_FWD(x) std::forward<decltype(x)>(x)
