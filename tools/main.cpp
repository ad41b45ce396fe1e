#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "cli.hpp"
#include "kernel_align/error.hpp"

int main(int argc, char** argv) {
  // A reader that went away (a pipe, a FIFO, a socket) is an error naming the output or
  // trace written to (EPIPE, exit 2), as every write is checked: SIGPIPE would end the
  // process without a word (status 141).
  std::signal(SIGPIPE, SIG_IGN);
  const int status = kernel_align::cli::main_entry(std::vector<std::string>(argv + 1, argv + argc),
                                                   std::cout, std::cerr);
  // The same holds for standard output itself (std::cout writes through stdout).
  errno = 0;
  if (std::fflush(stdout) == 0 && std::ferror(stdout) == 0) return status;
  const kernel_align::Error error("stdout", "a standard output that takes every byte",
                                  errno != 0 ? std::strerror(errno) : "a write that failed");
  std::fprintf(stderr, "kernel-align: error: %s\n", error.what());
  return kernel_align::cli::kExitBadArgument;
}
