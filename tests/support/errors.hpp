// The argument a call is refused for: the one kernel_align::Error names, or "(accepted)"
// when `call` returns. For tests of bad arguments.
#pragma once

#include <string>

#include "kernel_align/error.hpp"

namespace kernel_align::test {

template <class Call>
std::string rejected_argument(const Call& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.argument();
  }
  return "(accepted)";
}

}  // namespace kernel_align::test
