// SPDX-License-Identifier: MIT
// namedax::error, the base of every runtime error the library throws, and its message builder.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

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
template <class T>
void write_part(std::ostringstream& out, const T& part);

template <class T>
void write_part(std::ostringstream& out, const T& part) {
  if constexpr (requires { part.first; part.second; }) {
    out << '(', write_part(out, part.first), out << ", ", write_part(out, part.second), out << ')';
  } else if constexpr (requires { part.begin(); part.end(); } && !std::is_convertible_v<T, std::string_view>) {
    out << '(';
    const char* sep = "";
    for (const auto& v : part) out << sep, write_part(out, v), sep = ", ";
    out << (part.size() == 1 ? ",)" : ")");
  } else {
    out << part;
  }
}

/// Concatenates the parts of a message; ranges print as Python tuples `(2, 3)`.
template <class... Parts>
std::string message(const Parts&... parts) {
  std::ostringstream out;
  (write_part(out, parts), ...);
  return out.str();
}

template <class E = error, class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  throw E(message(parts...));
}
}  // namespace detail
}  // namespace namedax
