// The one exception type Hetrain throws for user mistakes. Messages start with the op or
// component in brackets: "[matmul] inner dimensions differ: (32, 64) @ (32, 10)".
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace hetrain {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

/// Throws Error with the streamed arguments as message.
template <class... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(detail::concat(args...));
}

}  // namespace hetrain

/// Internal invariant; a failure is a Hetrain bug, reported as an exception with file:line.
#define HT_ASSERT(cond)                                                                       \
  do {                                                                                        \
    if (!(cond)) ::hetrain::fail("internal error: ", #cond, " at ", __FILE__, ":", __LINE__); \
  } while (0)
