// SPDX-License-Identifier: MIT
// The doctest runner of the runtime tests.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
