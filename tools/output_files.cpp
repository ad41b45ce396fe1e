#include "output_files.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/fs.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string_view>

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

bool same_file(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

fs::path directory_of(const fs::path& path) {
  return path.has_parent_path() ? path.parent_path() : fs::path(".");
}

// Where and how one output is written.
struct Target {
  fs::path path;         // the file itself, after following symlinks
  bool through = false;  // a device, FIFO or open stream: written through, not replaced
  int stream = -1;       // the descriptor of this process it is written through, if any
  std::optional<struct stat> existing;  // the regular file it replaces
  struct stat directory {};             // the directory it is replaced in
};

// N when `path` is N in the directory of this process's descriptors: /proc/self/fd/N,
// /dev/fd/N, /dev/stdout's /proc/self/fd/1. Known by the directory's identity, as its
// entries for pipes and sockets are links to no path ("pipe:[1234]").
std::optional<int> descriptor_number(const fs::path& path) {
  const std::string name = path.filename().string();
  int fd = -1;
  if (!parse_whole(name, fd) || fd < 0 || name != std::to_string(fd)) return std::nullopt;
  struct stat directory {};
  if (::stat(directory_of(path).c_str(), &directory) != 0) return std::nullopt;
  for (const char* own : {"/proc/self/fd", "/proc/thread-self/fd"}) {
    struct stat descriptors {};
    if (::stat(own, &descriptors) == 0 && same_file(directory, descriptors)) return fd;
  }
  return std::nullopt;
}

bool open_for_writing(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && (flags & O_ACCMODE) != O_RDONLY;
}

// The lowest descriptor of this process open for writing on the file `st` (`>> log`, a
// terminal): an output naming that file is written through it, as it is already a stream
// of ours (replacing it would swallow what was appended, or write under its offset).
std::optional<int> open_descriptor_of(const struct stat& st) {
  DIR* descriptors = ::opendir("/proc/self/fd");
  if (descriptors == nullptr) return std::nullopt;
  std::optional<int> found;
  while (const dirent* entry = ::readdir(descriptors)) {
    int fd = -1;
    struct stat open {};
    if (parse_whole(std::string_view(entry->d_name), fd) && fd != ::dirfd(descriptors) &&
        ::fstat(fd, &open) == 0 && same_file(open, st) && open_for_writing(fd) &&
        (!found || fd < *found)) {
      found = fd;
    }
  }
  ::closedir(descriptors);
  return found;
}

// Follows `file.path` to what it names, and refuses what cannot take an output: a
// directory, a block device, a socket, a symlink loop, a descriptor not open for writing.
Target resolve(const OutputFile& file) {
  if (file.path.empty()) throw unwritable(file, "an empty path");
  fs::path path = file.path;
  for (int links = 0; links <= kMaxSymlinks; ++links) {
    if (const std::optional<int> fd = descriptor_number(path)) {
      const std::string descriptor = "descriptor " + std::to_string(*fd);
      if (::fcntl(*fd, F_GETFD) < 0)
        throw unwritable(file, descriptor + " is not an open descriptor");
      if (!open_for_writing(*fd)) throw unwritable(file, descriptor + " is not open for writing");
      return {path, true, *fd, std::nullopt};
    }
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) {
      if (errno == ENOENT) return {path, false, -1, std::nullopt};  // a new file
      throw unwritable(file, std::strerror(errno));
    }
    if (S_ISLNK(st.st_mode)) {
      std::error_code error;
      const fs::path link = fs::read_symlink(path, error);
      if (error) throw unwritable(file, error.message());
      path = link.is_absolute() ? link : path.parent_path() / link;
      continue;
    }
    if (S_ISREG(st.st_mode) || S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
      if (const std::optional<int> fd = open_descriptor_of(st))
        return {path, true, *fd, std::nullopt};
    }
    if (S_ISREG(st.st_mode)) return {path, false, -1, st};
    if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) return {path, true, -1, std::nullopt};
    const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISBLK(st.st_mode)  ? "a block device, which is never written"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "not a regular file";
    throw unwritable(file, kind);
  }
  throw unwritable(file, std::strerror(ELOOP));
}

// FS_IMMUTABLE_FL, FS_APPEND_FL... of `path` (chattr); 0 where unknown (no such flags on
// the file system, a file the process may not open).
int inode_flags(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return 0;
  int flags = 0;  // the kernel reads and writes an int, whatever the ioctl's type says
  if (::ioctl(fd, FS_IOC_GETFLAGS, &flags) != 0) flags = 0;
  ::close(fd);
  return flags;
}

bool has_capability(int capability) {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  std::array<__user_cap_data_struct, _LINUX_CAPABILITY_U32S_3> data{};
  return ::syscall(SYS_capget, &header, data.data()) == 0 &&
         (data[capability / 32].effective & (1u << (capability % 32))) != 0;
}

bool is_mount_point(const fs::path& path) {
  struct statx st {};
  return ::statx(AT_FDCWD, path.c_str(), AT_SYMLINK_NOFOLLOW, STATX_TYPE, &st) == 0 &&
         (st.stx_attributes_mask & st.stx_attributes & STATX_ATTR_MOUNT_ROOT) != 0;
}

// Refuses an output whose rename would fail for a reason known beforehand (the kernel's
// rules for removing and creating names), so that a command writes all of its outputs or
// none: no rename starts while another output cannot be replaced. Records the directory.
void check_replaceable(const OutputFile& file, Target& target) {
  const fs::path directory = directory_of(target.path);
  if (::stat(directory.c_str(), &target.directory) != 0) {
    throw unwritable(file, std::strerror(errno));
  }
  const int directory_flags = inode_flags(directory);
  if ((directory_flags & FS_IMMUTABLE_FL) != 0) {
    throw unwritable(file, "in an immutable directory (chattr +i)");
  }
  if ((directory_flags & FS_APPEND_FL) != 0) {
    throw unwritable(file, "in an append-only directory (chattr +a), where no name is replaced");
  }
  if (!target.existing) return;
  const int flags = inode_flags(target.path);
  if ((flags & FS_IMMUTABLE_FL) != 0) throw unwritable(file, "an immutable file (chattr +i)");
  if ((flags & FS_APPEND_FL) != 0) throw unwritable(file, "an append-only file (chattr +a)");
  // The sticky bit (/tmp): only the file's owner, the directory's owner or a process with
  // CAP_FOWNER may replace a file there.
  const uid_t me = ::geteuid();
  if ((target.directory.st_mode & S_ISVTX) != 0 && target.existing->st_uid != me &&
      target.directory.st_uid != me && !has_capability(CAP_FOWNER)) {
    throw unwritable(file,
                     "a file of another user in a sticky directory, which only its owner "
                     "may replace");
  }
  if (is_mount_point(target.path)) {
    throw unwritable(file, "a mount point (a bind-mounted file), which a rename cannot replace");
  }
}

// Whether two outputs to be replaced are one file: the same name in the same directory
// (whatever symlinks or bind mounts lead there), or two names of one existing file.
bool same_output(const Target& a, const Target& b) {
  return (same_file(a.directory, b.directory) && a.path.filename() == b.path.filename()) ||
         (a.existing && b.existing && same_file(*a.existing, *b.existing));
}

// ".<name>.tmp.<pid>.<index>": hidden, and unique to this process and output.
fs::path temporary_beside(const fs::path& target, std::size_t index) {
  std::string name = ".";
  name += target.filename().string();
  name += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(index);
  return target.parent_path() / name;
}

// The pid in a name of temporary_beside's form.
std::optional<pid_t> temporary_writer(std::string_view name) {
  const std::size_t tmp = name.rfind(".tmp.");
  if (!name.starts_with('.') || tmp == std::string_view::npos || tmp < 2) return std::nullopt;
  const std::string_view numbers = name.substr(tmp + 5);
  const std::size_t dot = numbers.find('.');
  pid_t pid = 0;
  std::size_t index = 0;
  if (dot == std::string_view::npos || !parse_whole(numbers.substr(0, dot), pid) ||
      !parse_whole(numbers.substr(dot + 1), index) || pid <= 0) {
    return std::nullopt;
  }
  return pid;
}

// Removes the temporaries in `directory` that writers left behind (SIGKILL, a crash, a
// power cut): those of processes that are gone. A pid may be another pid namespace's (a
// directory shared with a container), so each writer holds a lock on its temporary until
// the rename, and a locked one is kept. Run before this process makes its own temporaries:
// one with its pid is an earlier process's.
void remove_stale_temporaries(const fs::path& directory) {
  DIR* entries = ::opendir(directory.c_str());
  if (entries == nullptr) return;
  const int dir = ::dirfd(entries);
  while (const dirent* entry = ::readdir(entries)) {
    const std::optional<pid_t> pid = temporary_writer(entry->d_name);
    if (!pid || (*pid != ::getpid() && (::kill(*pid, 0) == 0 || errno != ESRCH))) continue;
    const int fd =
        ::openat(dir, entry->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st {};
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      ::unlinkat(dir, entry->d_name, 0);
    }
    ::close(fd);
  }
  ::closedir(entries);
}

// Writes every byte to `fd`; "" on success, else why not.
std::string write_all(int fd, const std::vector<std::byte>& bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? std::strerror(errno) : "short write";
    done += static_cast<std::size_t>(n);
  }
  return {};
}

// Gives the new file `fd` the owner, group and mode of the file it replaces. Where the
// process may not give it away (EPERM: not root) it keeps the group if the process may,
// else the file is the process's like any it makes. The chown comes first: it clears the
// set-user- and set-group-ID bits.
std::string keep_owner_and_mode(int fd, const struct stat& replaced) {
  [[maybe_unused]] const bool owned = ::fchown(fd, replaced.st_uid, replaced.st_gid) == 0 ||
                                      ::fchown(fd, static_cast<uid_t>(-1), replaced.st_gid) == 0;
  if (::fchmod(fd, replaced.st_mode & 07777) != 0) return std::strerror(errno);
  return {};
}

// Catchable signals that end the process: Ctrl-C, kill, a closed terminal.
constexpr std::array<int, 3> kEndingSignals{SIGINT, SIGTERM, SIGHUP};

// What write_outputs is doing, as its signal handler sees it.
enum Phase : int {
  kWriting,   // a signal removes the temporaries and ends the process
  kRenaming,  // a signal waits until the renames are done: they are never split
  kEnding,    // a handler is removing the temporaries: the renames must not start
};

// What the handler reads (a handler may only use lock-free atomics and plain data set
// before it was installed): the phase, a signal deferred, the temporaries' paths.
std::atomic<int> g_phase{kWriting};
std::atomic<int> g_deferred_signal{0};
std::atomic<const char* const*> g_temporary_paths{nullptr};
std::atomic<std::size_t> g_temporary_count{0};

extern "C" void remove_temporaries_and_end(int signal) {
  int phase = kWriting;
  if (!g_phase.compare_exchange_strong(phase, kEnding)) {
    if (phase == kRenaming) g_deferred_signal.store(signal);
    return;  // kEnding: another thread's handler is ending the process
  }
  const char* const* paths = g_temporary_paths.load();
  for (std::size_t i = 0; paths != nullptr && i < g_temporary_count.load(); ++i) {
    ::unlink(paths[i]);  // one not made yet is simply absent
  }
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  ::sigaction(signal, &default_action, nullptr);
  ::raise(signal);  // delivered when the handler returns: the process ends of it
}

// The temporaries of one write_outputs call (one at a time in a process): each made
// beside its target, locked, then renamed over it; any left are removed at destruction,
// or by a handler of SIGINT, SIGTERM and SIGHUP, which then ends the process with that
// signal as it would have ended without the handler.
class Temporaries {
 public:
  explicit Temporaries(const std::vector<Target>& targets)
      : made_(targets.size()), locks_(targets.size(), -1) {
    for (std::size_t i = 0; i < targets.size(); ++i) {
      paths_.push_back(targets[i].through ? std::string()
                                          : temporary_beside(targets[i].path, i).string());
    }
    for (const std::string& p : paths_) c_paths_.push_back(p.c_str());
    g_deferred_signal = 0;
    g_phase = kWriting;
    g_temporary_paths = nullptr;
    g_temporary_count = c_paths_.size();
    g_temporary_paths = c_paths_.data();
    struct sigaction handler {};
    handler.sa_handler = remove_temporaries_and_end;
    handler.sa_flags = SA_RESTART;
    sigemptyset(&handler.sa_mask);
    for (const int s : kEndingSignals) sigaddset(&handler.sa_mask, s);
    for (std::size_t i = 0; i < kEndingSignals.size(); ++i) {
      // An ignored signal (nohup's SIGHUP) stays ignored.
      installed_[i] = ::sigaction(kEndingSignals[i], nullptr, &previous_[i]) == 0 &&
                      previous_[i].sa_handler != SIG_IGN &&
                      ::sigaction(kEndingSignals[i], &handler, nullptr) == 0;
    }
  }

  ~Temporaries() {
    hold_signals();
    for (std::size_t i = 0; i < paths_.size(); ++i) {
      if (made_[i]) ::unlink(paths_[i].c_str());
      if (locks_[i] >= 0) ::close(locks_[i]);
    }
    for (std::size_t i = 0; i < kEndingSignals.size(); ++i) {
      if (installed_[i]) ::sigaction(kEndingSignals[i], &previous_[i], nullptr);
    }
    g_temporary_paths = nullptr;
    g_phase = kWriting;
    if (const int signal = g_deferred_signal.exchange(0)) ::raise(signal);
  }

  Temporaries(const Temporaries&) = delete;
  Temporaries& operator=(const Temporaries&) = delete;

  // The whole file of output `i` with the owner and mode of `replaced` where given; "" on
  // success, else why not, and then the temporary is gone.
  std::string make(std::size_t i, const std::vector<std::byte>& bytes,
                   const std::optional<struct stat>& replaced) {
    // O_EXCL: never follow or reuse a file someone else made; 0666 lets the umask decide.
    const int fd = ::open(paths_[i].c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) return std::strerror(errno);
    made_[i] = true;
    // Held (by a second descriptor, which outlives the checked close) until the rename,
    // so that no other process takes the temporary for a dead one's. Best effort: a file
    // system without locks has no such protection.
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) locks_[i] = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    std::string failure = replaced ? keep_owner_and_mode(fd, *replaced) : std::string();
    if (failure.empty()) failure = write_all(fd, bytes);
    // A full disk may only show at fsync or close (delayed allocation, NFS).
    if (failure.empty() && ::fsync(fd) != 0) failure = std::strerror(errno);
    if (::close(fd) != 0 && failure.empty()) failure = std::strerror(errno);
    if (!failure.empty()) remove(i);
    return failure;
  }

  // Renames temporary `i` over `target`; "" on success, else why not.
  std::string rename_to(std::size_t i, const fs::path& target) {
    if (std::rename(paths_[i].c_str(), target.c_str()) != 0) return std::strerror(errno);
    made_[i] = false;
    return {};
  }

  // From here a signal waits until the destructor, which raises it again: the renames are
  // done all together (or fail), never cut in between by Ctrl-C.
  void hold_signals() {
    int phase = kWriting;
    if (!g_phase.compare_exchange_strong(phase, kRenaming) && phase == kEnding) {
      for (;;) ::pause();  // a handler on another thread is ending the process
    }
  }

 private:
  void remove(std::size_t i) {
    if (made_[i]) ::unlink(paths_[i].c_str());
    made_[i] = false;
  }

  std::vector<std::string> paths_;  // "" for outputs written through
  std::vector<const char*> c_paths_;
  std::vector<bool> made_;
  std::vector<int> locks_;
  std::array<struct sigaction, kEndingSignals.size()> previous_{};
  std::array<bool, kEndingSignals.size()> installed_{};
};

// Writes an output that is not replaced: through this process's descriptor, or a device
// or FIFO opened here. "" on success, else why not.
std::string write_through(const Target& target, const std::vector<std::byte>& bytes) {
  if (target.stream >= 0) {
    std::fflush(nullptr);  // what the command printed before comes first
    return write_all(target.stream, bytes);
  }
  const int fd = ::open(target.path.c_str(), O_WRONLY | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return std::strerror(errno);
  std::string failure = write_all(fd, bytes);
  if (::close(fd) != 0 && failure.empty()) failure = std::strerror(errno);
  return failure;
}

}  // namespace

void check_not_the_trace(const Args& args) {
  const std::string trace = trace_path();
  struct stat traced {};
  if (trace.empty() || ::stat(trace.c_str(), &traced) != 0) return;
  for (const auto& [flag, path] : args.file_paths()) {
    struct stat file {};
    if (::stat(path.c_str(), &file) == 0 && S_ISREG(file.st_mode) && same_file(file, traced)) {
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
    if (!target.through) {
      check_replaceable(file, target);
      for (std::size_t i = 0; i < targets.size(); ++i) {
        if (!targets[i].through && same_output(targets[i], target)) {
          throw Error(file.argument, "a path different from that of " + files[i].argument,
                      single_quoted(file.path.string()) + ", which names the same file");
        }
      }
    }
    targets.push_back(std::move(target));
  }

  for (std::size_t i = 0; i < targets.size(); ++i) {
    bool seen = targets[i].through;
    for (std::size_t j = 0; j < i && !seen; ++j) {
      seen = !targets[j].through && same_file(targets[j].directory, targets[i].directory);
    }
    if (!seen) remove_stale_temporaries(directory_of(targets[i].path));
  }

  Temporaries temporaries(targets);
  // Regular files go to temporaries first: a full disk fails here, with no target touched.
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (targets[i].through) continue;
    const std::string failure = temporaries.make(i, files[i].bytes, targets[i].existing);
    if (!failure.empty()) throw unwritable(files[i], failure);
  }
  // Devices, FIFOs and open streams (/dev/null, a pipe, `>> log`) cannot be replaced:
  // written through, every write checked (/dev/full: ENOSPC; a pipe whose reader left:
  // EPIPE, SIGPIPE being ignored).
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (!targets[i].through) continue;
    const std::string failure = write_through(targets[i], files[i].bytes);
    if (!failure.empty()) throw unwritable(files[i], failure);
  }
  // Renames replace regular files atomically: a reader sees the old file or the new one.
  // Every output was checked to be replaceable; what still fails here (an I/O error, a
  // directory removed meanwhile) is said with the outputs already replaced.
  temporaries.hold_signals();
  std::string replaced;
  std::size_t replaced_count = 0;
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (targets[i].through) continue;
    std::string failure = temporaries.rename_to(i, targets[i].path);
    if (!failure.empty()) {
      if (replaced_count > 0) {
        failure += "; " + replaced + (replaced_count == 1 ? " was" : " were") + " already replaced";
      }
      throw unwritable(files[i], failure);
    }
    replaced += (replaced.empty() ? "" : ", ") + files[i].argument;
    ++replaced_count;
  }
}

}  // namespace kernel_align::cli
