// SPDX-License-Identifier: MIT
// The umbrella header: axis names, named values and their array operations, vmap and pmap, the
// collectives and their transposes.
#pragma once

#include <namedax/async.hpp>
#include <namedax/autodiff.hpp>
#include <namedax/axis.hpp>
#include <namedax/collective_matmul.hpp>
#include <namedax/collectives.hpp>
#include <namedax/elementwise.hpp>
#include <namedax/error.hpp>
#include <namedax/map.hpp>
#include <namedax/mesh.hpp>
#include <namedax/named_array.hpp>
#include <namedax/named_shape.hpp>
#include <namedax/pytree.hpp>
#include <namedax/ragged.hpp>
#include <namedax/reductions.hpp>
#include <namedax/structure.hpp>
#include <namedax/transpose.hpp>
#include <namedax/trace.hpp>
#include <namedax/xeinsum.hpp>
