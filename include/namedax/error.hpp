// SPDX-License-Identifier: MIT
// namedax::error, the base of every runtime error the library throws, and its message builder.
#pragma once

#include <charconv>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

// vmap and pmap give the same bits because every rule folds the members in one fixed order.
// -ffast-math (or -fassociative-math alone, which defines no macro) lets the compiler reorder
// those folds differently in each instantiation, so the modes may then differ in the last bits.
// NAMEDAX_STRICT_BIT_IDENTITY makes it an error; NAMEDAX_ALLOW_FAST_MATH silences the warning.
#if defined(__FAST_MATH__) && defined(NAMEDAX_STRICT_BIT_IDENTITY)
#error "namedax: compiled with -ffast-math, which breaks the bit identity of vmap and pmap results (NAMEDAX_STRICT_BIT_IDENTITY is defined)"
#elif defined(__FAST_MATH__) && !defined(NAMEDAX_ALLOW_FAST_MATH)
#warning "namedax: compiled with -ffast-math: vmap and pmap results may differ in their last bits; define NAMEDAX_ALLOW_FAST_MATH to accept it"
#endif

namespace namedax {

/// Thrown for bad input and for failed collectives. Messages read
/// "namedax::<verb>: <what is wrong>; <how to fix it>" and name the axis and sizes.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A device left, threw, or called a different collective, so a collective could not complete.
class collective_error : public error {
 public:
  using error::error;
};

namespace detail {
/// A device's collective aborted because another device failed first (it threw, left, or the
/// devices wait forever): pmap rethrows it only when no device's own error is known.
class collective_abort : public collective_error {
 public:
  using collective_error::collective_error;
};

/// Appends one part of a message: text as it is, numbers as iostreams would print them
/// (without the cost of a stream), pairs and ranges as Python tuples `(2, 3)`.
template <class T>
void write_part(std::string& out, const T& part) {
  if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    out += std::string_view(part);
  } else if constexpr (std::is_same_v<T, char>) {
    out += part;
  } else if constexpr (std::is_same_v<T, bool>) {
    out += part ? '1' : '0';
  } else if constexpr (std::is_arithmetic_v<T>) {
    char digits[64];
    std::to_chars_result end;
    if constexpr (std::is_floating_point_v<T>) end = std::to_chars(digits, digits + sizeof digits, part, std::chars_format::general, 6);
    else end = std::to_chars(digits, digits + sizeof digits, part);
    out.append(digits, end.ptr);
  } else if constexpr (requires { part.first; part.second; }) {
    out += '(', write_part(out, part.first), out += ", ", write_part(out, part.second), out += ')';
  } else if constexpr (requires { part.begin(); part.end(); }) {
    out += '(';
    const char* sep = "";
    for (const auto& v : part) out += sep, write_part(out, v), sep = ", ";
    out += part.size() == 1 ? ",)" : ")";
  } else {
    std::ostringstream text;
    text << part;
    out += text.str();
  }
}

/// Concatenates the parts of a message.
template <class... Parts>
std::string message(const Parts&... parts) {
  std::string out;
  (write_part(out, parts), ...);
  return out;
}

template <class E = error, class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  throw E(message(parts...));
}
}  // namespace detail
}  // namespace namedax
