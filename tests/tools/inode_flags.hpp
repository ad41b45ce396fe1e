// Inode flags (chattr +i, +a) set for the scope of a test: a directory holding an
// immutable file cannot be removed, so every flag set here is cleared again.
#pragma once

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <filesystem>
#include <utility>

namespace kernel_align::cli::test {

// Sets (`on`) or clears `flags` (FS_IMMUTABLE_FL, FS_APPEND_FL) of `path`; false where the
// process may not (it lacks CAP_LINUX_IMMUTABLE) or the file system has no such flags.
inline bool change_inode_flags(const std::filesystem::path& path, int flags, bool on) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  int current = 0;  // the kernel reads and writes an int, whatever the ioctl's type says
  bool changed = ::ioctl(fd, FS_IOC_GETFLAGS, &current) == 0;
  if (changed) {
    current = on ? (current | flags) : (current & ~flags);
    changed = ::ioctl(fd, FS_IOC_SETFLAGS, &current) == 0;
  }
  ::close(fd);
  return changed;
}

class ScopedInodeFlags {
 public:
  ScopedInodeFlags(std::filesystem::path path, int flags)
      : path_(std::move(path)), flags_(flags), set_(change_inode_flags(path_, flags_, true)) {}
  ~ScopedInodeFlags() {
    if (set_) change_inode_flags(path_, flags_, false);
  }
  ScopedInodeFlags(const ScopedInodeFlags&) = delete;
  ScopedInodeFlags& operator=(const ScopedInodeFlags&) = delete;

  // Whether the flags were set (else the test skips).
  bool set() const { return set_; }

 private:
  std::filesystem::path path_;
  int flags_;
  bool set_;
};

}  // namespace kernel_align::cli::test
