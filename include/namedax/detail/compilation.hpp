// SPDX-License-Identifier: MIT
// The macros of the optional separate compilation (see <namedax/separate_compilation.hpp>).
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

// Header-only (the default), every function is defined in the headers. With
// NAMEDAX_SEPARATE_COMPILATION, the sizeable non-template functions of the runtime are declared
// only, and the kernels of the common element types are explicit instantiation declarations
// (`extern template`), so that a unit compiles neither; the one unit that includes
// <namedax/separate_compilation.hpp> (which defines NAMEDAX_SOURCE) defines both, once.
//   NAMEDAX_DECL          what precedes such a function: `inline`, or nothing when compiled separately
//   NAMEDAX_DEFINITIONS   whether this unit sees the function's body
//   NAMEDAX_EXTERN        `extern` before an explicit instantiation in a unit that uses the library,
//                         nothing in the one that defines it
//   NAMEDAX_FOR_EACH_ELEMENT_TYPE(M)   M(T) for each element type instantiated in advance
//   NAMEDAX_FOR_EACH_ELEMENT_FOLD(M)   M(T, Op) for each of them and each fold of the all-reduces
//                                      (sum_op, max_op, min_op)
#if !defined(NAMEDAX_SEPARATE_COMPILATION)
#define NAMEDAX_DECL inline
#define NAMEDAX_DEFINITIONS 1
#elif defined(NAMEDAX_SOURCE)
#define NAMEDAX_DECL
#define NAMEDAX_DEFINITIONS 1
#define NAMEDAX_EXTERN
#else
#define NAMEDAX_DECL
#define NAMEDAX_DEFINITIONS 0
#define NAMEDAX_EXTERN extern
#endif

#define NAMEDAX_FOR_EACH_ELEMENT_TYPE(M) M(float) M(double) M(std::int32_t) M(std::int64_t)
#define NAMEDAX_FOR_EACH_FOLD_OF(M, T) M(T, sum_op) M(T, max_op) M(T, min_op)
#define NAMEDAX_FOR_EACH_ELEMENT_FOLD(M)                                                                       \
  NAMEDAX_FOR_EACH_FOLD_OF(M, float)                                                                           \
  NAMEDAX_FOR_EACH_FOLD_OF(M, double) NAMEDAX_FOR_EACH_FOLD_OF(M, std::int32_t) NAMEDAX_FOR_EACH_FOLD_OF(M, std::int64_t)

namespace namedax::detail {

/// A reference to a callable of one index: a pointer to the caller's callable and a function
/// that calls it, so that a function that runs it (launch_devices, for_each_task) is compiled
/// once per program, or once in the separately compiled part, rather than once per callable.
/// The callable must outlive every call.
class index_body {
 public:
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, index_body> && std::is_invocable_v<F&, std::size_t>)
  index_body(F&& f) noexcept  // NOLINT(google-explicit-constructor): a lambda converts where one is taken
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* object, std::size_t i) { (*static_cast<std::remove_reference_t<F>*>(object))(i); }) {}
  void operator()(std::size_t i) const { call_(object_, i); }

 private:
  void* object_;
  void (*call_)(void*, std::size_t);
};

}  // namespace namedax::detail
