#pragma once

namespace kernel_align::contract {

// Bumped whenever any result bit an op may produce changes. docs/contract.md is
// the normative text of this version.
inline constexpr int kVersion = 2;
inline constexpr const char* kVersionString = "kernel-align-contract/2";

}  // namespace kernel_align::contract
