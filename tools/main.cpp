#include <iostream>
#include <string>
#include <vector>

#include "cli.hpp"

int main(int argc, char** argv) {
  return kernel_align::cli::main_entry(std::vector<std::string>(argv + 1, argv + argc), std::cout,
                                       std::cerr);
}
