#pragma once

namespace kernel_align::contract {

// Bumped whenever any result bit an op may produce changes. docs/contract.md is
// the normative text of this version.
inline constexpr int kVersion = 3;
inline constexpr const char* kVersionString = "kernel-align-contract/3";

}  // namespace kernel_align::contract
