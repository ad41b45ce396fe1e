// The exception every rejected input raises.
#pragma once

#include <stdexcept>
#include <string>

namespace kernel_align {

// Every rejected input raises this, naming the argument, what was expected and
// what was found, so a caller (or the CLI) can print one clear line. what() is
// "argument '<argument>': expected <expected>, found <found>". An op (ops.hpp) that throws
// it has written none of its outputs. The Python package raises it as a ValueError
// "kernel_align.<op>: <what()>".
class Error : public std::invalid_argument {
 public:
  // argument: the parameter (or member, "weights.text_q", or environment variable,
  // "KERNEL_ALIGN_ISA") at fault; expected, found: phrases completing the message.
  Error(std::string argument, std::string expected, std::string found)
      : std::invalid_argument("argument '" + argument + "': expected " + expected + ", found " +
                              found),
        argument_(std::move(argument)),
        expected_(std::move(expected)),
        found_(std::move(found)) {}

  // The three parts of the message, as given to the constructor.
  const std::string& argument() const { return argument_; }
  const std::string& expected() const { return expected_; }
  const std::string& found() const { return found_; }

 private:
  std::string argument_;
  std::string expected_;
  std::string found_;
};

}  // namespace kernel_align
