#include "output_files.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "kernel_align/error.hpp"
#include "messages.hpp"

namespace kernel_align::cli {
namespace {

namespace fs = std::filesystem;

Error unwritable(const OutputFile& file, const std::string& reason) {
  return Error(file.argument, "a writable output path",
               single_quoted(file.path.string()) + " (" + reason + ")");
}

// Refuses, before anything is written, what would fail or clobber at rename time.
void check_targets(const std::vector<OutputFile>& files) {
  std::vector<fs::path> seen;
  for (const OutputFile& file : files) {
    const fs::path target = fs::absolute(file.path).lexically_normal();
    for (std::size_t i = 0; i < seen.size(); ++i) {
      if (seen[i] == target) {
        throw Error(file.argument, "a path different from that of " + files[i].argument,
                    single_quoted(file.path.string()));
      }
    }
    seen.push_back(target);
    std::error_code error;
    if (fs::is_directory(file.path, error)) throw unwritable(file, "a directory");
  }
}

// ".<name>.tmp.<pid>.<index>": hidden, and unique to this process and output.
fs::path temporary_beside(const fs::path& target, std::size_t index) {
  std::string name = ".";
  name += target.filename().string();
  name += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(index);
  return target.parent_path() / name;
}

// Returns the empty string on success, else the reason of the failure (and then
// leaves no file behind).
std::string write_whole_file(const fs::path& path, const std::vector<std::byte>& bytes) {
  // O_EXCL: never follow or reuse a file someone else made; 0666 lets the umask decide.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) return std::strerror(errno);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string reason = n < 0 ? std::strerror(errno) : "short write";
      ::close(fd);
      ::unlink(path.c_str());
      return reason;
    }
    done += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0) {
    std::string reason = std::strerror(errno);
    ::unlink(path.c_str());
    return reason;
  }
  return {};
}

}  // namespace

void write_outputs(const std::vector<OutputFile>& files) {
  check_targets(files);
  std::vector<fs::path> temporaries;
  const auto remove_temporaries = [&] {
    for (const fs::path& t : temporaries) ::unlink(t.c_str());
  };
  for (const OutputFile& file : files) {
    const fs::path temporary = temporary_beside(file.path, temporaries.size());
    const std::string failure = write_whole_file(temporary, file.bytes);
    if (!failure.empty()) {
      remove_temporaries();
      throw unwritable(file, failure);
    }
    temporaries.push_back(temporary);
  }
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (std::rename(temporaries[i].c_str(), files[i].path.c_str()) != 0) {
      std::string reason = std::strerror(errno);
      remove_temporaries();
      throw unwritable(files[i], reason);
    }
  }
}

}  // namespace kernel_align::cli
