// SPDX-License-Identifier: MIT
// The source of the namedax::compiled library (see <namedax/separate_compilation.hpp>).
#include <namedax/separate_compilation.hpp>
