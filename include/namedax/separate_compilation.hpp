// SPDX-License-Identifier: MIT
// The separately compiled part of namedax: include this header in exactly one source file of
// a program whose every unit is compiled with NAMEDAX_SEPARATE_COMPILATION defined.
//
//   // namedax.cpp, the whole of it (the CMake target namedax::compiled compiles it for you)
//   #include <namedax/separate_compilation.hpp>
//
// Header-only use (the default) needs no such file. With NAMEDAX_SEPARATE_COMPILATION, the
// other units declare the sizeable non-template functions of the runtime (device launch,
// error formatting, tracing) without compiling them, and take the kernels of float, double,
// int32 and int64 elements (collective frames, reductions, folds, copies, exchanges) from
// here instead of instantiating them: less code for the optimizer in every unit, the same
// behaviour. Other element types are instantiated where they are used, as header-only.
// This file must be compiled with the same flags (and sanitizers) as the rest of the program.
#pragma once

#if defined(NAMEDAX_DEFINITIONS)
#error "namedax: <namedax/separate_compilation.hpp> must be included before any other namedax header of its unit"
#endif
#ifndef NAMEDAX_SEPARATE_COMPILATION
#define NAMEDAX_SEPARATE_COMPILATION
#endif
#define NAMEDAX_SOURCE  // this unit defines what the others only declare
#include <namedax/namedax.hpp>
