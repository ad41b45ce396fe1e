// Writing a command's outputs all at once, or not at all.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_args.hpp"

namespace kernel_align::cli {

struct OutputFile {
  std::string argument;  // the flag that named the file, for error messages
  std::filesystem::path path;
  std::vector<std::byte> bytes;
};

// A path that is a regular file or does not exist gets the whole file atomically: a
// temporary file beside it, written, synced and closed with every step checked (with the
// owner, group and mode of the file it replaces, where the process may), then renamed
// over it once every output is complete, so a failure (a full disk) leaves no output
// behind and never a half-written one. A symlink is followed and its target replaced the
// same way. Every output is checked to be replaceable (not immutable or append-only, not
// another user's in a sticky directory, not a mount point, not the same file as another
// output however spelled) before the first rename; a rename that still fails names the
// outputs already replaced. One of the process's open descriptors (/dev/stdout,
// /dev/fd/N, a file it has open for writing, `>> log`) is written through that
// descriptor; a character device or FIFO (/dev/null, a named pipe) through a descriptor
// opened here; every write checked. Anything else (a directory, a block device, a
// socket, an empty path, a descriptor not open for writing) is refused before any byte
// is written. SIGINT, SIGTERM and SIGHUP remove the temporaries before the process ends
// of them (and wait while the renames run); temporaries of dead writers (SIGKILL) in an
// output's directory are removed. One call at a time per process (the signal handling
// is process-wide). Throws kernel_align::Error naming the failing flag.
void write_outputs(const std::vector<OutputFile>& files);

// Refuses (Error naming the flag) a file flag's value that is the trace file
// (KERNEL_ALIGN_TRACE, opened now if it is not yet): a command's trace is never one of
// its inputs, which it would append to, or outputs, whose rename would swallow it.
// Every command checks its Args before it reads or computes anything.
void check_not_the_trace(const Args& args);

}  // namespace kernel_align::cli
