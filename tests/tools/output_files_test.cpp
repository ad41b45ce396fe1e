// What an output path may be and what becomes of it (tools/output_files.hpp): regular
// files and new paths are replaced atomically, symlinks are followed, devices and FIFOs
// are written through with every write checked, anything else is refused, and a failed
// write leaves nothing behind.
#include "output_files.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

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

  // A character device node like /dev/null (1, 3) or /dev/full (1, 7) in our own
  // directory: the real ones are never put at risk. Needs root (CAP_MKNOD).
  bool make_char_device(const std::string& name, unsigned minor) const {
    return ::mknod(path(name).c_str(), S_IFCHR | 0666, makedev(1, minor)) == 0;
  }

  fs::path dir_;
};

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
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);  // the write then fails with EFBIG
    const rlimit limit{4096, 4096};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) std::_Exit(3);
    try {
      write_outputs({{"--dx", path("dx.npy"), bytes_of("small")},
                     {"--out", path("y.npy"), std::vector<std::byte>(1 << 16)}});
    } catch (const Error& e) {
      std::_Exit(e.argument() == "--out" &&
                         std::string(e.what()).find(std::strerror(EFBIG)) != std::string::npos
                     ? 0
                     : 1);
    }
    std::_Exit(2);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: wrong error, 2: no error, 3: no limit";
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

}  // namespace
}  // namespace kernel_align::cli
