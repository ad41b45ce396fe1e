#include "kernel_align/version.hpp"

#include "kernel_align/contract/version.hpp"

namespace kernel_align {

const char* version() {
  return KERNEL_ALIGN_VERSION_STRING;
}

const char* contract_version() {
  return contract::kVersionString;
}

}  // namespace kernel_align
