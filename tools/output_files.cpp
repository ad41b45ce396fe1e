#include "output_files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

#include "kernel_align/error.hpp"
#include "kernel_align/registry.hpp"
#include "messages.hpp"

namespace kernel_align::cli {
namespace {

namespace fs = std::filesystem;

// Linux's limit on symlinks followed in one path lookup (MAXSYMLINKS).
constexpr int kMaxSymlinks = 40;

Error unwritable(const OutputFile& file, const std::string& reason) {
  return Error(file.argument, "a writable output path",
               single_quoted(file.path.string()) + " (" + reason + ")");
}

// Where and how one output is written.
struct Target {
  fs::path path;               // the file itself, after following symlinks
  bool through = false;        // a character device or FIFO: written through, not replaced
  std::optional<mode_t> mode;  // permissions of the regular file it replaces
};

// Follows `file.path` to what it names, and refuses what cannot take an output: a
// directory, a block device, a socket, a symlink loop.
Target resolve(const OutputFile& file) {
  if (file.path.empty()) throw unwritable(file, "an empty path");
  fs::path path = file.path;
  for (int links = 0; links <= kMaxSymlinks; ++links) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) {
      if (errno == ENOENT) return {path, false, std::nullopt};  // a new file
      throw unwritable(file, std::strerror(errno));
    }
    if (S_ISLNK(st.st_mode)) {
      std::error_code error;
      const fs::path link = fs::read_symlink(path, error);
      if (error) throw unwritable(file, error.message());
      path = link.is_absolute() ? link : path.parent_path() / link;
      continue;
    }
    if (S_ISREG(st.st_mode)) return {path, false, st.st_mode & 07777};
    if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) return {path, true, std::nullopt};
    const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISBLK(st.st_mode)  ? "a block device, which is never written"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "not a regular file";
    throw unwritable(file, kind);
  }
  throw unwritable(file, std::strerror(ELOOP));
}

// Writes every byte to `fd` and closes it; "" on success, else why not.
std::string write_and_close(int fd, const std::vector<std::byte>& bytes, bool sync) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string reason = n < 0 ? std::strerror(errno) : "short write";
      ::close(fd);
      return reason;
    }
    done += static_cast<std::size_t>(n);
  }
  // A full disk may only show at fsync or close (delayed allocation, NFS).
  if (sync && ::fsync(fd) != 0) {
    std::string reason = std::strerror(errno);
    ::close(fd);
    return reason;
  }
  if (::close(fd) != 0) return std::strerror(errno);
  return {};
}

// ".<name>.tmp.<pid>.<index>": hidden, and unique to this process and output.
fs::path temporary_beside(const fs::path& target, std::size_t index) {
  std::string name = ".";
  name += target.filename().string();
  name += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(index);
  return target.parent_path() / name;
}

// The whole file at `path`, created here (never an existing one), with `mode` when
// given; "" on success, else why not, and then no file is left behind.
std::string write_new_file(const fs::path& path, const std::vector<std::byte>& bytes,
                           std::optional<mode_t> mode) {
  // O_EXCL: never follow or reuse a file someone else made; 0666 lets the umask decide.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) return std::strerror(errno);
  std::string failure;
  if (mode && ::fchmod(fd, *mode) != 0) {
    failure = std::strerror(errno);
    ::close(fd);
  } else {
    failure = write_and_close(fd, bytes, true);
  }
  if (!failure.empty()) ::unlink(path.c_str());
  return failure;
}

}  // namespace

void check_not_the_trace(const Args& args) {
  const std::string trace = trace_path();
  struct stat traced {};
  if (trace.empty() || ::stat(trace.c_str(), &traced) != 0) return;
  for (const auto& [flag, path] : args.file_paths()) {
    struct stat file {};
    if (::stat(path.c_str(), &file) == 0 && S_ISREG(file.st_mode) && file.st_dev == traced.st_dev &&
        file.st_ino == traced.st_ino) {
      throw Error(flag, "a file other than the trace file " + single_quoted(trace),
                  single_quoted(path) + ", which is that file");
    }
  }
}

void write_outputs(const std::vector<OutputFile>& files) {
  // Every refusal comes before any byte is written.
  std::vector<Target> targets;
  for (const OutputFile& file : files) {
    Target target = resolve(file);
    const fs::path absolute = fs::absolute(target.path).lexically_normal();
    for (std::size_t i = 0; i < targets.size(); ++i) {
      if (!target.through && fs::absolute(targets[i].path).lexically_normal() == absolute) {
        throw Error(file.argument, "a path different from that of " + files[i].argument,
                    single_quoted(file.path.string()));
      }
    }
    targets.push_back(std::move(target));
  }

  std::vector<fs::path> temporaries(files.size());
  const auto remove_temporaries = [&] {
    for (const fs::path& t : temporaries) {
      if (!t.empty()) ::unlink(t.c_str());
    }
  };
  // Regular files go to temporaries first: a full disk fails here, with no target touched.
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (targets[i].through) continue;
    const fs::path temporary = temporary_beside(targets[i].path, i);
    const std::string failure = write_new_file(temporary, files[i].bytes, targets[i].mode);
    if (!failure.empty()) {
      remove_temporaries();
      throw unwritable(files[i], failure);
    }
    temporaries[i] = temporary;
  }
  // Devices and FIFOs (/dev/null, /dev/stdout, a pipe) cannot be replaced: written
  // through, every write and the close checked (/dev/full: ENOSPC).
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (!targets[i].through) continue;
    const int fd = ::open(targets[i].path.c_str(), O_WRONLY | O_NOCTTY | O_CLOEXEC);
    const std::string failure =
        fd < 0 ? std::strerror(errno) : write_and_close(fd, files[i].bytes, false);
    if (!failure.empty()) {
      remove_temporaries();
      throw unwritable(files[i], failure);
    }
  }
  // Renames replace regular files atomically: a reader sees the old file or the new one.
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (targets[i].through) continue;
    if (std::rename(temporaries[i].c_str(), targets[i].path.c_str()) != 0) {
      std::string reason = std::strerror(errno);
      remove_temporaries();
      throw unwritable(files[i], reason);
    }
    temporaries[i].clear();
  }
}

}  // namespace kernel_align::cli
