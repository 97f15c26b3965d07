// SPDX-License-Identifier: MIT
// The umbrella header: axis names, named values, vmap and pmap, and the collectives.
#pragma once

#include <namedax/axis.hpp>
#include <namedax/collectives.hpp>
#include <namedax/error.hpp>
#include <namedax/map.hpp>
#include <namedax/named_array.hpp>
#include <namedax/named_shape.hpp>
#include <namedax/xeinsum.hpp>
