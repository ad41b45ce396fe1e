// What an output path may be and what becomes of it (tools/output_files.hpp): regular
// files and new paths are replaced atomically, symlinks are followed, devices, FIFOs and
// the process's open streams are written through with every write checked, anything else
// is refused, and a failed write or a signal leaves nothing behind.
#include "output_files.hpp"

#include <fcntl.h>
#include <linux/fs.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "inode_flags.hpp"
#include "kernel_align/error.hpp"

namespace kernel_align::cli {
namespace {

namespace fs = std::filesystem;

std::vector<std::byte> bytes_of(const std::string& text) {
  std::vector<std::byte> bytes;
  for (const char c : text) bytes.push_back(static_cast<std::byte>(c));
  return bytes;
}

std::string slurp(const fs::path& path) {
  std::ostringstream s;
  s << std::ifstream(path, std::ios::binary).rdbuf();
  return s.str();
}

class OutputFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "ka_outputs_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path path(const std::string& name) const { return dir_ / name; }

  // The entries of the directory, names only: a failed write leaves no temporary.
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

  // write_outputs' Error, naming `flag`, with `reason` in its text.
  void expect_refused(const std::vector<OutputFile>& files, const std::string& flag,
                      const std::string& reason) const {
    try {
      write_outputs(files);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), flag) << e.what();
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
    }
  }

  // expect_refused in a forked child, once `prepare` (a per-process limit, dropping
  // root) has returned true: the child's exit status is 0 for an Error naming `flag`
  // whose message holds `reason`, 1 for another Error, 2 for none, 3 when `prepare` failed.
  static void expect_refused_in_child(const std::function<bool()>& prepare,
                                      const std::vector<OutputFile>& files, const std::string& flag,
                                      const std::string& reason) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      if (!prepare()) std::_Exit(3);
      try {
        write_outputs(files);
      } catch (const Error& e) {
        std::_Exit(e.argument() == flag && std::string(e.what()).find(reason) != std::string::npos
                       ? 0
                       : 1);
      }
      std::_Exit(2);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "1: wrong error, 2: no error, 3: could not prepare";
  }

  // A character device node like /dev/null (1, 3) or /dev/full (1, 7) in our own
  // directory: the real ones are never put at risk. Needs root (CAP_MKNOD).
  bool make_char_device(const std::string& name, unsigned minor) const {
    return ::mknod(path(name).c_str(), S_IFCHR | 0666, makedev(1, minor)) == 0;
  }

  // Waits (at most 10 s) until the directory holds `count` entries: a child's temporary
  // appeared.
  bool await_entries(std::size_t count) const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (entries().size() < count) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::yield();
    }
    return true;
  }

  fs::path dir_;
};

// A child that writes a regular output and then a FIFO output nobody reads: it stays
// blocked opening the FIFO with its temporary written, until a signal ends it.
pid_t start_blocked_writer(const fs::path& regular, const fs::path& fifo) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    try {
      write_outputs({{"--dx", regular, bytes_of("regular")}, {"--dw", fifo, bytes_of("fifo")}});
    } catch (const Error&) {
      std::_Exit(1);
    }
    std::_Exit(0);
  }
  return pid;
}

// Everything read from `fd` until end of file.
std::string read_all(int fd) {
  std::string all;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;) all.append(buffer, n);
  return all;
}

TEST_F(OutputFiles, NewAndRegularFilesAreReplacedWholeKeepingTheirMode) {
  write_outputs({{"--out", path("y.npy"), bytes_of("first")}});
  EXPECT_EQ(slurp(path("y.npy")), "first");
  fs::permissions(path("y.npy"),
                  fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  write_outputs({{"--out", path("y.npy"), bytes_of("second")}});
  EXPECT_EQ(slurp(path("y.npy")), "second");
  EXPECT_EQ(fs::status(path("y.npy")).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  EXPECT_EQ(entries(), std::vector<std::string>{"y.npy"});
}

TEST_F(OutputFiles, ASymlinkIsFollowedAndItsTargetReplaced) {
  fs::create_directory(path("real"));
  std::ofstream(path("real/y.npy")) << "old";
  fs::create_symlink("real/y.npy", path("link.npy"));
  write_outputs({{"--out", path("link.npy"), bytes_of("new")}});
  EXPECT_TRUE(fs::is_symlink(path("link.npy")));
  EXPECT_EQ(slurp(path("real/y.npy")), "new");
  // A dangling link: its target is created.
  fs::create_symlink("real/z.npy", path("dangling.npy"));
  write_outputs({{"--out", path("dangling.npy"), bytes_of("made")}});
  EXPECT_TRUE(fs::is_symlink(path("dangling.npy")));
  EXPECT_EQ(slurp(path("real/z.npy")), "made");
  // Two flags that reach one file through a link.
  expect_refused(
      {{"--dx", path("real/y.npy"), bytes_of("a")}, {"--dw", path("link.npy"), bytes_of("b")}},
      "--dw", "different from that of --dx");
  // A loop.
  fs::create_symlink("loop_b", path("loop_a"));
  fs::create_symlink("loop_a", path("loop_b"));
  expect_refused({{"--out", path("loop_a"), bytes_of("x")}}, "--out", std::strerror(ELOOP));
}

TEST_F(OutputFiles, DirectoriesSocketsAndEmptyPathsAreRefusedBeforeAnyWrite) {
  fs::create_directory(path("out_dir"));
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path("socket").c_str(), sizeof address.sun_path - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address), 0);
  for (const auto& [name, reason] :
       {std::pair{"out_dir", "a directory"}, std::pair{"socket", "a socket"}}) {
    // The first output is fine; nothing of it may appear either.
    expect_refused({{"--dx", path("dx.npy"), bytes_of("a")}, {"--dw", path(name), bytes_of("b")}},
                   "--dw", reason);
    EXPECT_FALSE(fs::exists(path("dx.npy")));
  }
  ::close(fd);
  expect_refused({{"--out", fs::path(), bytes_of("x")}}, "--out", "an empty path");
}

TEST_F(OutputFiles, AFifoIsWrittenThroughAndStaysAFifo) {
  ASSERT_EQ(::mkfifo(path("pipe").c_str(), 0644), 0) << std::strerror(errno);
  std::string received;
  std::thread reader([&] { received = slurp(path("pipe")); });
  write_outputs({{"--out", path("pipe"), bytes_of("through the pipe")}});
  reader.join();
  EXPECT_EQ(received, "through the pipe");
  struct stat st {};
  ASSERT_EQ(::lstat(path("pipe").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

TEST_F(OutputFiles, DeviceNodesAreWrittenThroughAndAFullDeviceIsAnError) {
  if (!make_char_device("null", 3) || !make_char_device("full", 7)) {
    GTEST_SKIP() << "mknod of a character device needs root: " << std::strerror(errno);
  }
  write_outputs({{"--out", path("null"), bytes_of("discarded")}});
  struct stat st {};
  ASSERT_EQ(::lstat(path("null").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << "the device node was replaced";
  // ENOSPC names the flag, and the other (regular) output never appears.
  expect_refused({{"--dx", path("dx.npy"), bytes_of("a")}, {"--dw", path("full"), bytes_of("b")}},
                 "--dw", std::strerror(ENOSPC));
  EXPECT_FALSE(fs::exists(path("dx.npy")));
  ASSERT_EQ(::lstat(path("full").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
}

// A write that fails part way (here the file size limit, as a full disk would) leaves
// neither the target nor a temporary, and the old file is kept. Run in a child: the
// limit is per process.
TEST_F(OutputFiles, AFailedWriteLeavesTheOldFileAndNoTemporary) {
  std::ofstream(path("y.npy")) << "old contents";
  expect_refused_in_child(
      [] {
        std::signal(SIGXFSZ, SIG_IGN);  // the write then fails with EFBIG
        const rlimit limit{4096, 4096};
        return ::setrlimit(RLIMIT_FSIZE, &limit) == 0;
      },
      {{"--dx", path("dx.npy"), bytes_of("small")},
       {"--out", path("y.npy"), std::vector<std::byte>(1 << 16)}},
      "--out", std::strerror(EFBIG));
  EXPECT_EQ(slurp(path("y.npy")), "old contents");
  EXPECT_EQ(entries(), std::vector<std::string>{"y.npy"});
}

// The directory of an output vanishes after its temporary was written, before the rename
// (a FIFO output, written through in between, holds write_outputs there until the test
// has removed the directory): an Error naming that output's flag, nothing left behind.
TEST_F(OutputFiles, AnOutputDirectoryThatVanishesIsAnError) {
  fs::create_directory(path("vanishing"));
  ASSERT_EQ(::mkfifo(path("pipe").c_str(), 0644), 0) << std::strerror(errno);
  std::string received;
  std::thread remover([&] {
    // The temporary appears first (regular outputs are written before write-throughs).
    while (fs::is_empty(path("vanishing"))) std::this_thread::yield();
    fs::remove_all(path("vanishing"));
    received = slurp(path("pipe"));  // lets the write-through proceed
  });
  expect_refused({{"--dx", path("vanishing/dx.npy"), bytes_of("regular")},
                  {"--dw", path("pipe"), bytes_of("through")}},
                 "--dx", std::strerror(ENOENT));
  remover.join();
  EXPECT_FALSE(fs::exists(path("vanishing")));
  EXPECT_EQ(received, "through");  // a written-through output is not atomic (documented)
}

// A path naming one of the process's open, writable descriptors (/dev/fd/N,
// /proc/self/fd/N, /dev/stdout, or another name of the same file) is written through that
// descriptor: a pipe or a socket gets the bytes, a file opened for append is appended to,
// never replaced. A descriptor that is closed or read-only is refused. Before, the pipe
// and the socket were "No such file or directory" and the file was replaced.
TEST_F(OutputFiles, AnOpenStreamIsWrittenThroughNeverReplaced) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
  write_outputs({{"--out", "/dev/fd/" + std::to_string(pipe_fds[1]), bytes_of("into a pipe")}});
  ::close(pipe_fds[1]);
  EXPECT_EQ(read_all(pipe_fds[0]), "into a pipe");
  ::close(pipe_fds[0]);

  int sockets[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets), 0);
  write_outputs({{"--out", "/proc/self/fd/" + std::to_string(sockets[0]), bytes_of("socket")}});
  ::close(sockets[0]);
  EXPECT_EQ(read_all(sockets[1]), "socket");
  ::close(sockets[1]);

  std::ofstream(path("log")) << "earlier\n";
  struct stat before {};
  ASSERT_EQ(::stat(path("log").c_str(), &before), 0);
  const int log = ::open(path("log").c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  ASSERT_GE(log, 0);
  write_outputs({{"--out", "/dev/fd/" + std::to_string(log), bytes_of("by descriptor\n")}});
  write_outputs({{"--out", path("log"), bytes_of("by name\n")}});  // the same open file
  ::close(log);
  EXPECT_EQ(slurp(path("log")), "earlier\nby descriptor\nby name\n");
  struct stat after {};
  ASSERT_EQ(::stat(path("log").c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino) << "the file behind the stream was replaced";

  const int read_only = ::open(path("log").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(read_only, 0);
  const std::string read_only_path = "/dev/fd/" + std::to_string(read_only);
  expect_refused({{"--out", read_only_path, bytes_of("x")}}, "--out", "not open for writing");
  ::close(read_only);
  expect_refused({{"--out", read_only_path, bytes_of("x")}}, "--out", "not an open descriptor");
  EXPECT_EQ(slurp(path("log")), "earlier\nby descriptor\nby name\n");
  EXPECT_EQ(entries(), std::vector<std::string>{"log"});
}

// Every output is checked before the first rename: an immutable or append-only file, or
// one in an append-only directory, refuses the command and no other output is replaced
// (before, --cos was already renamed into place when --sin's rename failed).
TEST_F(OutputFiles, AnOutputThatCannotBeReplacedRefusesTheOthersToo) {
  fs::create_directory(path("append_only"));
  std::ofstream(path("cos.npy")) << "old cos";
  std::ofstream(path("sin.npy")) << "old sin";
  std::ofstream(path("append_only/sin.npy")) << "old sin";
  for (const auto& [flagged, sin, flag, reason] :
       {std::tuple{"sin.npy", "sin.npy", FS_IMMUTABLE_FL, "immutable"},
        std::tuple{"sin.npy", "sin.npy", FS_APPEND_FL, "append-only"},
        std::tuple{"append_only", "append_only/sin.npy", FS_APPEND_FL, "append-only directory"}}) {
    const test::ScopedInodeFlags flags(path(flagged), flag);
    if (!flags.set()) GTEST_SKIP() << "cannot set inode flags (chattr) here";
    expect_refused({{"--cos", path("cos.npy"), bytes_of("new cos")},
                    {"--sin", path(sin), bytes_of("new sin")}},
                   "--sin", reason);
    EXPECT_EQ(slurp(path("cos.npy")), "old cos") << reason;
    EXPECT_EQ(slurp(path(sin)), "old sin") << reason;
    EXPECT_EQ(entries(), (std::vector<std::string>{"append_only", "cos.npy", "sin.npy"}));
    EXPECT_TRUE(fs::exists(path("append_only/sin.npy")));
    EXPECT_EQ(std::distance(fs::directory_iterator(path("append_only")), {}), 1) << reason;
  }
}

// The sticky-directory rule (in a directory like /tmp, a file of another user can only be
// replaced by the directory's or the file's owner, or with CAP_FOWNER) is checked before
// the first rename too. In a child that drops root for nobody's ids.
TEST_F(OutputFiles, AnotherUsersFileInAStickyDirectoryRefusesTheOthersToo) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to make files of other users";
  constexpr uid_t kNobody = 65534;
  constexpr uid_t kOther = 1234;
  fs::permissions(dir_, fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
  fs::create_directory(path("sticky"));
  fs::permissions(path("sticky"), fs::perms::all | fs::perms::sticky_bit);
  std::ofstream(path("sticky/sin.npy")) << "old sin";
  ASSERT_EQ(::chown(path("sticky/sin.npy").c_str(), kOther, kOther), 0) << std::strerror(errno);
  fs::permissions(path("sticky/sin.npy"), fs::perms::all & ~fs::perms::owner_exec &
                                              ~fs::perms::group_exec & ~fs::perms::others_exec);
  expect_refused_in_child([] { return ::setgid(kNobody) == 0 && ::setuid(kNobody) == 0; },
                          {{"--cos", path("sticky/cos.npy"), bytes_of("new cos")},
                           {"--sin", path("sticky/sin.npy"), bytes_of("new sin")}},
                          "--sin", "sticky directory");
  EXPECT_FALSE(fs::exists(path("sticky/cos.npy"))) << "--cos was replaced";
  EXPECT_EQ(slurp(path("sticky/sin.npy")), "old sin");
  EXPECT_EQ(std::distance(fs::directory_iterator(path("sticky")), {}), 1);
}

// What no check can foresee (the directory of --sin vanishes after the checks, as an I/O
// error at its rename would fail it): the error names --sin and says that --cos was
// already replaced.
TEST_F(OutputFiles, ARenameFailingAfterAnotherSaysWhichOutputsWereReplaced) {
  fs::create_directory(path("vanishing"));
  ASSERT_EQ(::mkfifo(path("pipe").c_str(), 0644), 0) << std::strerror(errno);
  std::thread remover([&] {
    while (fs::is_empty(path("vanishing"))) std::this_thread::yield();
    fs::remove_all(path("vanishing"));
    slurp(path("pipe"));  // lets the write-through, then the renames, proceed
  });
  expect_refused({{"--cos", path("cos.npy"), bytes_of("cos")},
                  {"--sin", path("vanishing/sin.npy"), bytes_of("sin")},
                  {"--out", path("pipe"), bytes_of("through")}},
                 "--sin", "--cos was already replaced");
  remover.join();
  EXPECT_EQ(slurp(path("cos.npy")), "cos");
  EXPECT_EQ(entries(), (std::vector<std::string>{"cos.npy", "pipe"}));
}

// Two flags naming one file are refused however the paths spell it: through a symlinked
// directory, or as two hard links of one file (identity of the directory and of an
// existing file, not spelling). Before, the first output was lost in silence.
TEST_F(OutputFiles, TwoOutputsNamingOneFileThroughALinkedDirectoryAreRefused) {
  fs::create_directory(path("d"));
  fs::create_directory_symlink("d", path("e"));
  expect_refused(
      {{"--cos", path("d/x.npy"), bytes_of("cos")}, {"--sin", path("e/x.npy"), bytes_of("sin")}},
      "--sin", "different from that of --cos");
  EXPECT_FALSE(fs::exists(path("d/x.npy")));
  std::ofstream(path("d/a.npy")) << "old";
  fs::create_hard_link(path("d/a.npy"), path("d/b.npy"));
  expect_refused(
      {{"--dx", path("d/a.npy"), bytes_of("dx")}, {"--dw", path("e/b.npy"), bytes_of("dw")}},
      "--dw", "different from that of --dx");
  EXPECT_EQ(slurp(path("d/a.npy")), "old");
  EXPECT_EQ(std::distance(fs::directory_iterator(path("d")), {}), 2);
}

// Bind mounts: two outputs through a directory mounted at a second place are one file (as
// through a symlink), and a file with another bind-mounted over it, which a rename cannot
// replace (EBUSY), is refused before the first rename. In a child with a mount namespace
// of its own, so that no mount outlives it.
TEST_F(OutputFiles, BindMountsAreSeenThrough) {
  fs::create_directory(path("d"));
  fs::create_directory(path("m"));
  std::ofstream(path("cos.npy")) << "old cos";
  std::ofstream(path("sin.npy")) << "old sin";
  std::ofstream(path("other.npy")) << "other";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount(path("d").c_str(), path("m").c_str(), nullptr, MS_BIND, nullptr) != 0 ||
        ::mount(path("other.npy").c_str(), path("sin.npy").c_str(), nullptr, MS_BIND, nullptr) !=
            0) {
      std::_Exit(4);
    }
    const auto refused = [](const std::vector<OutputFile>& files, const std::string& reason) {
      try {
        write_outputs(files);
      } catch (const Error& e) {
        return e.argument() == "--sin" && std::string(e.what()).find(reason) != std::string::npos;
      }
      return false;
    };
    const bool one_file = refused(
        {{"--cos", path("d/x.npy"), bytes_of("cos")}, {"--sin", path("m/x.npy"), bytes_of("sin")}},
        "different from that of --cos");
    const bool mount_point = refused({{"--cos", path("cos.npy"), bytes_of("new cos")},
                                      {"--sin", path("sin.npy"), bytes_of("new sin")}},
                                     "mount point");
    std::_Exit((one_file ? 0 : 1) | (mount_point ? 0 : 2));
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 4) GTEST_SKIP() << "cannot bind-mount here (needs CAP_SYS_ADMIN)";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: one file through two mounts accepted, 2: the mount "
                                       "point not refused by name";
  EXPECT_FALSE(fs::exists(path("d/x.npy")));
  EXPECT_EQ(slurp(path("cos.npy")), "old cos");
  EXPECT_EQ(slurp(path("sin.npy")), "old sin");
}

// SIGINT, SIGTERM or SIGHUP while temporaries exist (the child is held at a FIFO output
// nobody reads): they are removed and the process dies of that signal, as it would have.
TEST_F(OutputFiles, ACaughtSignalRemovesTheTemporaries) {
  ASSERT_EQ(::mkfifo(path("pipe").c_str(), 0644), 0) << std::strerror(errno);
  for (const int signal : {SIGINT, SIGTERM, SIGHUP}) {
    const pid_t pid = start_blocked_writer(path("dx.npy"), path("pipe"));
    ASSERT_GE(pid, 0);
    const bool temporary_appeared = await_entries(2);
    ::kill(pid, signal);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(temporary_appeared) << ::strsignal(signal);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == signal) << ::strsignal(signal);
    EXPECT_EQ(entries(), std::vector<std::string>{"pipe"}) << ::strsignal(signal);
  }
}

// A SIGKILLed writer's temporary stays; the next write into its directory removes it. A
// temporary of a live process, or one locked (each writer holds a lock on its temporaries:
// a pid may be another pid namespace's), and other names are kept.
TEST_F(OutputFiles, TemporariesOfDeadWritersAreRemovedByTheNextWrite) {
  ASSERT_EQ(::mkfifo(path("pipe").c_str(), 0644), 0) << std::strerror(errno);
  const pid_t killed = start_blocked_writer(path("dx.npy"), path("pipe"));
  ASSERT_GE(killed, 0);
  const bool temporary_appeared = await_entries(2);
  ::kill(killed, SIGKILL);
  ASSERT_EQ(::waitpid(killed, nullptr, 0), killed);
  ASSERT_TRUE(temporary_appeared);
  const std::string dead = std::to_string(killed);
  const std::vector<std::string> kept{
      ".held.npy.tmp." + dead + ".0", ".live.npy.tmp." + std::to_string(::getppid()) + ".1",
      ".odd.npy.tmp." + dead + ".x", "other.npy.tmp." + dead + ".0"};
  for (const std::string& name : kept) std::ofstream(path(name)) << "kept";
  const int held = ::open(path(kept[0]).c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);
  write_outputs({{"--out", path("y.npy"), bytes_of("new")}});
  ::close(held);
  std::vector<std::string> expected = kept;
  expected.insert(expected.end(), {"pipe", "y.npy"});
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(entries(), expected);
}

// Replacing another user's file (as root) keeps its owner and group, and its mode with
// the set-group-ID bit (which a chown after the chmod would clear). Before, the new file
// was root's.
TEST_F(OutputFiles, ReplacingAnotherUsersFileKeepsItsOwnerGroupAndMode) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to make files of other users";
  std::ofstream(path("y.npy")) << "old";
  ASSERT_EQ(::chown(path("y.npy").c_str(), 1234, 5678), 0) << std::strerror(errno);
  ASSERT_EQ(::chmod(path("y.npy").c_str(), 02750), 0);
  write_outputs({{"--out", path("y.npy"), bytes_of("new")}});
  struct stat st {};
  ASSERT_EQ(::stat(path("y.npy").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 1234u);
  EXPECT_EQ(st.st_gid, 5678u);
  EXPECT_EQ(st.st_mode & 07777, 02750u);
  EXPECT_EQ(slurp(path("y.npy")), "new");
}

}  // namespace
}  // namespace kernel_align::cli
