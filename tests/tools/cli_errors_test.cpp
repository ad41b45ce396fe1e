// Every way to call `kernel-align` wrongly: exit status 2, one stderr line naming the
// argument, and nothing written.
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <string>
#include <thread>
#include <vector>

#include "cli_harness.hpp"
#include "inode_flags.hpp"

namespace kernel_align::cli::test {
namespace {

using Tokens = std::vector<std::string>;

Tokens operator+(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

constexpr std::int64_t kSeq = 6;

std::string contents(const fs::path& path) {
  std::ostringstream s;
  s << std::ifstream(path, std::ios::binary).rdbuf();
  return s.str();
}

// Everything read from `fd` until end of file.
std::string read_all(int fd) {
  std::string all;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;) all.append(buffer, n);
  return all;
}

const Tokens kRmsNorm{"apply", "qk-rmsnorm", "--x", "x.npy", "--out", "y.npy"};
const Tokens kRmsNormBackward{
    "apply", "qk-rmsnorm-backward", "--x", "x.npy", "--dy", "dy.npy", "--dx", "dx.npy"};
const Tokens kRopeOptions{"--pairing", "interleaved", "--layout", "bshd"};
const Tokens kRopeFromTables = Tokens{"apply",   "multi-axis-rope", "--x",     "x.npy", "--cos",
                                      "cos.npy", "--sin",           "sin.npy", "--out", "y.npy"} +
                               kRopeOptions;
const Tokens kRopeFromPositions =
    Tokens{"apply", "multi-axis-rope", "--x", "x.npy", "--positions", "pos.npy", "--out", "y.npy"} +
    kRopeOptions;
const Tokens kPositions{"positions",  "--layout", "diffusers", "--image",    "64x32",
                        "--text-len", "4",        "--out",     "pos_out.npy"};
const Tokens kTables{"tables", "--positions", "pos.npy", "--cos", "c.npy", "--sin", "s.npy"};

// Valid inputs for every command; each test breaks one thing. x is a BSHD tensor of
// kSeq tokens and 2 heads, usable by qk-rmsnorm and rope alike.
class CliErrorTest : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    kernel_align::test::Rng rng(7);
    write("x.npy", random_array(DType::BF16, {1, kSeq, 2, 128}, rng));
    write("dy.npy", random_array(DType::BF16, {1, kSeq, 2, 128}, rng));
    write("w.npy", random_array(DType::BF16, {128}, rng));
    write("cos.npy", random_array(DType::F32, {kSeq, 64}, rng));
    write("sin.npy", random_array(DType::F32, {kSeq, 64}, rng));
    std::vector<std::int32_t> positions;
    for (std::int32_t t = 0; t < kSeq * 3; ++t) positions.push_back(t % 5 - 2);
    write("pos.npy", int32_array({kSeq, 3}, positions));
  }

  // Replaces x.npy by a BSHD-or-whatever tensor of `shape`.
  void write_x(std::vector<std::int64_t> shape, DType type = DType::BF16) const {
    kernel_align::test::Rng rng(11);
    write("x.npy", random_array(type, std::move(shape), rng));
  }
};

TEST_F(CliErrorTest, NoCommand) {
  expect_bad_argument({}, "command");
}

TEST_F(CliErrorTest, UnknownCommand) {
  expect_bad_argument({"frobnicate"}, "command");
}

TEST_F(CliErrorTest, UnknownOrMissingApplyOperation) {
  expect_bad_argument({"apply", "softmax", "--x", "x.npy"}, "apply");
  expect_bad_argument({"apply"}, "apply");
}

TEST_F(CliErrorTest, UnknownFlag) {
  expect_bad_argument(kRmsNorm + Tokens{"--bogus", "1"}, "--bogus");
  // A flag of another command is unknown here too.
  expect_bad_argument(kRmsNorm + Tokens{"--pairing", "half"}, "--pairing");
}

TEST_F(CliErrorTest, ACommandWithoutFlagsSaysItTakesNone) {
  for (const char* command : {"shapes", "backends"}) {
    expect_bad_argument({command, "--bogus"}, "--bogus");
    expect_bad_argument({command, "stray"}, "stray");
    const std::string err = run({command, "--bogus"}).err;
    EXPECT_NE(err.find("expected nothing after the command (it takes no flags)"), std::string::npos)
        << err;
  }
}

TEST_F(CliErrorTest, BareValue) {
  expect_bad_argument(kPositions + Tokens{"stray"}, "stray");
}

TEST_F(CliErrorTest, MissingValue) {
  expect_bad_argument({"apply", "qk-rmsnorm", "--out", "y.npy", "--x"}, "--x");
  expect_bad_argument({"apply", "qk-rmsnorm", "--x", "--out", "y.npy"}, "--x");
}

TEST_F(CliErrorTest, RepeatedFlag) {
  expect_bad_argument(kRmsNorm + Tokens{"--x", "dy.npy"}, "--x");
}

TEST_F(CliErrorTest, MissingRequiredFlag) {
  expect_bad_argument({"apply", "qk-rmsnorm", "--x", "x.npy"}, "--out");
  expect_bad_argument({"apply", "qk-rmsnorm", "--out", "y.npy"}, "--x");
  expect_bad_argument({"apply", "qk-rmsnorm-backward", "--x", "x.npy", "--dx", "dx.npy"}, "--dy");
  expect_bad_argument({"positions", "--image", "64x32", "--text-len", "4", "--out", "p.npy"},
                      "--layout");
  expect_bad_argument({"positions", "--layout", "seed", "--image", "64x32", "--out", "p.npy"},
                      "--text-len");
  expect_bad_argument(
      {"apply", "adaln-modulation", "--x", "x.npy", "--scale", "x.npy", "--out", "y.npy"},
      "--shift");
  expect_bad_argument({"tables", "--positions", "pos.npy", "--cos", "c.npy"}, "--sin");
  // Neither --positions nor --cos/--sin.
  expect_bad_argument(
      Tokens{"apply", "multi-axis-rope", "--x", "x.npy", "--out", "y.npy"} + kRopeOptions, "--cos");
}

TEST_F(CliErrorTest, MissingFile) {
  expect_bad_argument({"apply", "qk-rmsnorm", "--x", "absent.npy", "--out", "y.npy"}, "--x");
  expect_bad_argument(kRmsNorm + Tokens{"--weight", "absent.npy"}, "--weight");
  // A control character in a name must not break the message into two lines.
  expect_bad_argument({"apply", "qk-rmsnorm", "--x", "two\nlines.npy", "--out", "y.npy"}, "--x");
}

// Sizes are checked before anything is allocated: once std::bad_alloc and a
// length_error were internal errors (exit 1).
TEST_F(CliErrorTest, RequestsAboveTheAvailableMemoryNameTheirFlag) {
  expect_bad_argument({"run", "--heads", "100000000", "--batch", "2"}, "--heads");
  expect_bad_argument({"run", "--batch", "1000000000"}, "--batch");
  expect_bad_argument({"run", "--image", "700000x700000"}, "--image");
  // A file whose reads fail (EIO) and whose reported size is 0.
  expect_bad_argument({"apply", "qk-rmsnorm", "--x", "/proc/self/mem", "--out", "y.npy"}, "--x");
}

TEST_F(CliErrorTest, UnreadableFile) {
  fs::create_directory(work() / "directory.npy");
  expect_bad_argument({"apply", "qk-rmsnorm", "--x", "directory.npy", "--out", "y.npy"}, "--x");
  if (::geteuid() != 0) {  // root reads a file whatever its mode
    ::chmod((work() / "x.npy").c_str(), 0);
    expect_bad_argument(kRmsNorm, "--x");
  }
}

TEST_F(CliErrorTest, WrongDtype) {
  write_x({1, kSeq, 2, 128}, DType::F32);
  write("x_int.npy", int32_array({2}, {1, 2}));
  expect_bad_argument({"apply", "qk-rmsnorm", "--x", "x_int.npy", "--out", "y.npy"}, "--x");
  expect_bad_argument(kRmsNorm + Tokens{"--weight", "pos.npy"}, "--weight");
  // Positions are int32, tables fp32.
  expect_bad_argument({"tables", "--positions", "cos.npy", "--cos", "c.npy", "--sin", "s.npy"},
                      "--positions");
  kernel_align::test::Rng rng(3);
  write("cos_bf16.npy", random_array(DType::BF16, {kSeq, 64}, rng));
  expect_bad_argument(Tokens{"apply", "multi-axis-rope", "--x", "x.npy", "--cos", "cos_bf16.npy",
                             "--sin", "sin.npy", "--out", "y.npy"} +
                          kRopeOptions,
                      "--cos");
}

TEST_F(CliErrorTest, ShapeMismatch) {
  kernel_align::test::Rng rng(5);
  write("dy_short.npy", random_array(DType::BF16, {1, kSeq, 2, 64}, rng));
  expect_bad_argument(
      {"apply", "qk-rmsnorm-backward", "--x", "x.npy", "--dy", "dy_short.npy", "--dx", "dx.npy"},
      "--dy");
  write("w_short.npy", random_array(DType::BF16, {64}, rng));
  expect_bad_argument(kRmsNorm + Tokens{"--weight", "w_short.npy"}, "--weight");
  // Positions with two columns for three axes.
  write("pos2.npy", int32_array({3, 2}, {0, 0, 1, 1, 2, 2}));
  expect_bad_argument({"tables", "--positions", "pos2.npy", "--cos", "c.npy", "--sin", "s.npy"},
                      "--positions");
}

TEST_F(CliErrorTest, HeadDimIsNotTheSumOfTheAxes) {
  expect_bad_argument(kRopeFromPositions + Tokens{"--axes", "16,56,40"}, "--axes");
}

TEST_F(CliErrorTest, OddDims) {
  expect_bad_argument(kTables + Tokens{"--axes", "16,55,57"}, "--axes");
  expect_bad_argument(kRopeFromPositions + Tokens{"--axes", "16,55,57"}, "--axes");
  write_x({1, kSeq, 2, 127});
  expect_bad_argument(kRmsNorm, "--x");
  expect_bad_argument(kRopeFromTables, "--x");
}

TEST_F(CliErrorTest, SequenceLengthIsNotTheTableRows) {
  kernel_align::test::Rng rng(9);
  write("cos5.npy", random_array(DType::F32, {kSeq - 1, 64}, rng));
  expect_bad_argument(Tokens{"apply", "multi-axis-rope", "--x", "x.npy", "--cos", "cos5.npy",
                             "--sin", "sin.npy", "--out", "y.npy"} +
                          kRopeOptions,
                      "--cos");
  // In layout bhsd the sequence of x [1, 6, 2, 128] is 2 tokens, not 6.
  expect_bad_argument({"apply", "multi-axis-rope", "--x", "x.npy", "--positions", "pos.npy",
                       "--out", "y.npy", "--pairing", "half", "--layout", "bhsd"},
                      "--positions");
  expect_bad_argument(
      {"apply", "multi-axis-rope-backward", "--dy", "x.npy", "--cos", "cos.npy", "--sin", "sin.npy",
       "--dx", "dx.npy", "--pairing", "half", "--layout", "bhsd"},
      "--cos");
}

TEST_F(CliErrorTest, NonFiniteOrNegativeEps) {
  for (const char* eps : {"inf", "-inf", "nan", "1e99"}) {
    expect_bad_argument(kRmsNorm + Tokens{"--eps", eps}, "--eps");
  }
  expect_bad_argument(kRmsNorm + Tokens{"--eps", "-1e-6"}, "--eps");
  expect_bad_argument(kTables + Tokens{"--theta", "inf"}, "--theta");
  expect_bad_argument(kTables + Tokens{"--theta", "0"}, "--theta");
}

// Out of fp32's range is said as such, not as "a finite number".
TEST_F(CliErrorTest, NumbersBeyondFp32SayItOverflowsOrUnderflows) {
  const auto says = [&](const Tokens& args, const std::string& flag, const std::string& what) {
    expect_bad_argument(args, flag);
    const CliResult r = run(args);
    EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
  };
  says(kRmsNorm + Tokens{"--eps", "1e-50"}, "--eps", "underflows fp32 to 0");
  says(kRmsNorm + Tokens{"--eps", "3.5e38"}, "--eps", "overflows fp32 to infinity");
  says(kTables + Tokens{"--theta", "1e-300"}, "--theta", "underflows fp32 to 0");
  says(kTables + Tokens{"--theta", "1e999"}, "--theta", "within the fp32 range");
}

TEST_F(CliErrorTest, RuntimeFlagsOnceEachAndNoEmptyBackend) {
  expect_bad_argument(kRmsNorm + Tokens{"--threads", "2", "--threads", "3"}, "--threads");
  expect_bad_argument(kRmsNorm + Tokens{"--backend", "simd", "--backend", "reference"},
                      "--backend");
  expect_bad_argument(kRmsNorm + Tokens{"--isa", "portable", "--isa", "portable"}, "--isa");
  expect_bad_argument(kRmsNorm + Tokens{"--backend", ""}, "--backend");
  expect_bad_argument(kRmsNorm + Tokens{"--threads", "+4"}, "--threads");
}

TEST_F(CliErrorTest, HelpForAnUnknownCommandIsAnError) {
  expect_bad_argument({"help", "bogus"}, "command");
  expect_bad_argument({"bogus", "--help"}, "command");
  EXPECT_NE(run_ok({"help", "apply"}).find("usage: kernel-align apply multi-axis-rope"),
            std::string::npos);
}

// The library's argument names become the flags the user typed.
TEST_F(CliErrorTest, RunNamesItsFlags) {
  expect_bad_argument({"run", "--text-len", "-1"}, "--text-len");
}

TEST_F(CliErrorTest, EmptyTensor) {
  write("empty.npy", make_npy_array(NpyType::BF16, {0, 128}));
  expect_bad_argument({"apply", "qk-rmsnorm", "--x", "empty.npy", "--out", "y.npy"}, "--x");
}

TEST_F(CliErrorTest, TruncatedNpy) {
  std::vector<std::byte> bytes = encode_npy(read("x.npy"));
  bytes.pop_back();
  write_bytes("x.npy", bytes);
  expect_bad_argument(kRmsNorm, "--x");
  write_bytes("x.npy", {bytes.begin(), bytes.begin() + 20});
  expect_bad_argument(kRmsNorm, "--x");
}

TEST_F(CliErrorTest, MalformedNpy) {
  std::vector<std::byte> bytes = encode_npy(read("x.npy"));
  bytes[12] = std::byte{'!'};  // inside the header dict
  write_bytes("x.npy", bytes);
  expect_bad_argument(kRmsNorm, "--x");
  write_bytes("x.npy", {std::byte{'P'}, std::byte{'K'}, std::byte{3}, std::byte{4}});
  expect_bad_argument(kRmsNorm, "--x");
  // A 10 KB header is quoted in part: the error stays a line one can read.
  const std::string header = "{'descr': '<f4', " + std::string(10000, 'z') + "}";
  std::vector<std::byte> file;
  for (const char c : std::string("\x93NUMPY")) file.push_back(static_cast<std::byte>(c));
  file.push_back(std::byte{2});  // version 2.0: a 4-byte header length
  file.push_back(std::byte{0});
  for (int shift = 0; shift < 32; shift += 8) {
    file.push_back(static_cast<std::byte>((header.size() >> shift) & 0xFF));
  }
  for (const char c : header) file.push_back(static_cast<std::byte>(c));
  write_bytes("x.npy", file);
  expect_bad_argument(kRmsNorm, "--x");
  const CliResult r = run(kRmsNorm);
  EXPECT_LT(r.err.size(), 600u) << r.err;
  EXPECT_NE(r.err.find("characters in all"), std::string::npos) << r.err;
}

TEST_F(CliErrorTest, BadImageSize) {
  for (const char* image : {"1328", "axb", "1328x", "x1328", "1000x1328", "0x16", "-16x16"}) {
    expect_bad_argument({"positions", "--layout", "diffusers", "--image", image, "--text-len", "4",
                         "--out", "p.npy"},
                        "--image");
  }
  expect_bad_argument({"positions", "--layout", "diffusers", "--text-len", "4", "--out", "p.npy"},
                      "--image");
  // The seed layout has one image.
  expect_bad_argument({"positions", "--layout", "seed", "--image", "32x32", "--image", "32x32",
                       "--text-len", "4", "--out", "p.npy"},
                      "--image");
}

TEST_F(CliErrorTest, NonNumericNumbers) {
  expect_bad_argument(
      {"positions", "--layout", "seed", "--image", "64x32", "--text-len", "four", "--out", "p.npy"},
      "--text-len");
  expect_bad_argument(kPositions + Tokens{"--start", "1.5"}, "--start");
  expect_bad_argument(kPositions + Tokens{"--end", "9z"}, "--end");
  expect_bad_argument(kPositions + Tokens{"--frame", "one"}, "--frame");
  expect_bad_argument(kPositions + Tokens{"--frame", "4294967296"}, "--frame");
  expect_bad_argument(kRmsNorm + Tokens{"--eps", "1e-6x"}, "--eps");
  expect_bad_argument(kTables + Tokens{"--axes", "16,a,56"}, "--axes");
  expect_bad_argument(kTables + Tokens{"--axes", "16,56,"}, "--axes");
  expect_bad_argument(kTables + Tokens{"--theta", "ten"}, "--theta");
}

TEST_F(CliErrorTest, BadChoices) {
  expect_bad_argument(Tokens{"apply", "multi-axis-rope", "--x", "x.npy", "--positions", "pos.npy",
                             "--out", "y.npy", "--pairing", "diagonal", "--layout", "bshd"},
                      "--pairing");
  expect_bad_argument(Tokens{"apply", "multi-axis-rope", "--x", "x.npy", "--positions", "pos.npy",
                             "--out", "y.npy", "--pairing", "half", "--layout", "sbhd"},
                      "--layout");
  expect_bad_argument(kRmsNorm + Tokens{"--mode", "fast"}, "--mode");
  expect_bad_argument(kRmsNorm + Tokens{"--out-dtype", "fp64"}, "--out-dtype");
  expect_bad_argument(
      {"positions", "--layout", "flux", "--image", "64x32", "--text-len", "4", "--out", "p.npy"},
      "--layout");
}

TEST_F(CliErrorTest, PositionsConflictWithCosSin) {
  expect_bad_argument(kRopeFromPositions + Tokens{"--cos", "cos.npy", "--sin", "sin.npy"}, "--cos");
  expect_bad_argument(kRopeFromPositions + Tokens{"--sin", "sin.npy"}, "--sin");
  // --axes and --theta configure tables built from positions only.
  expect_bad_argument(kRopeFromTables + Tokens{"--axes", "16,56,56"}, "--axes");
  expect_bad_argument(kRopeFromTables + Tokens{"--theta", "10000"}, "--theta");
}

TEST_F(CliErrorTest, DwWithoutWeight) {
  expect_bad_argument(kRmsNormBackward + Tokens{"--dw", "dw.npy"}, "--dw");
}

TEST_F(CliErrorTest, RopeNeedsFourDims) {
  write_x({kSeq, 128});
  expect_bad_argument(kRopeFromTables, "--x");
  expect_bad_argument(kRopeFromPositions, "--x");
}

TEST_F(CliErrorTest, FramesDoNotMatchImages) {
  expect_bad_argument(kPositions + Tokens{"--image", "32x32", "--frame", "1"}, "--frame");
  expect_bad_argument({"positions", "--layout", "seed", "--image", "32x32", "--frame", "1",
                       "--text-len", "4", "--out", "p.npy"},
                      "--frame");
}

TEST_F(CliErrorTest, BadSlice) {
  // 4 text tokens + a 2x4 grid: S = 12.
  expect_bad_argument(kPositions + Tokens{"--start", "5", "--end", "5"}, "--start");
  expect_bad_argument(kPositions + Tokens{"--end", "13"}, "--end");
  expect_bad_argument(kPositions + Tokens{"--start", "-1"}, "--start");
  expect_bad_argument(kPositions + Tokens{"--text-len", "-1"}, "--text-len");
}

TEST_F(CliErrorTest, UnwritableOutputsWriteNothing) {
  // The first of two outputs is fine, the second cannot be written: neither appears.
  expect_bad_argument(
      {"tables", "--positions", "pos.npy", "--cos", "c.npy", "--sin", "no_such_dir/s.npy"},
      "--sin");
  expect_bad_argument(kRmsNormBackward + Tokens{"--weight", "w.npy", "--dw", "no_such_dir/dw.npy"},
                      "--dw");
  fs::create_directory(work() / "out_dir");
  expect_bad_argument({"apply", "qk-rmsnorm", "--x", "x.npy", "--out", "out_dir"}, "--out");
  expect_bad_argument({"tables", "--positions", "pos.npy", "--cos", "t.npy", "--sin", "t.npy"},
                      "--sin");
  expect_bad_argument({"apply", "qk-rmsnorm", "--x", "x.npy", "--out", ""}, "--out");
}

// A device at the output path is written through, never replaced; a full one
// (/dev/full's numbers, made here so the real one is not at risk) is exit 2 naming the flag.
TEST_F(CliErrorTest, DeviceOutputsAreWrittenThroughAndAFullOneIsAnError) {
  if (::mknod((work() / "null").c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0 ||
      ::mknod((work() / "full").c_str(), S_IFCHR | 0666, makedev(1, 7)) != 0) {
    GTEST_SKIP() << "mknod of a character device needs root: " << std::strerror(errno);
  }
  run_ok({"apply", "qk-rmsnorm", "--x", "x.npy", "--out", "null"});
  EXPECT_FALSE(fs::is_regular_file(work() / "null"));
  expect_bad_argument(kRmsNormBackward + Tokens{"--weight", "w.npy", "--dw", "full"}, "--dw");
}

// A thread count beyond every integer type is said as given (before: "found -1"), on the
// command line and in the environment.
TEST_F(CliErrorTest, AThreadCountBeyondEveryIntegerIsSaidAsGiven) {
  for (const std::string huge : {"99999999999999999999", "-99999999999999999999"}) {
    expect_bad_argument(kRmsNorm + Tokens{"--threads", huge}, "--threads");
    const CliResult flag = run(kRmsNorm + Tokens{"--threads", huge});
    EXPECT_NE(flag.err.find("found " + huge + "\n"), std::string::npos) << flag.err;
    ::setenv("KERNEL_ALIGN_NUM_THREADS", huge.c_str(), 1);
    const CliResult variable = run(kRmsNorm);
    ::unsetenv("KERNEL_ALIGN_NUM_THREADS");
    EXPECT_EQ(variable.status, 2);
    EXPECT_NE(variable.err.find("argument 'KERNEL_ALIGN_NUM_THREADS'"), std::string::npos)
        << variable.err;
    EXPECT_NE(variable.err.find("found " + huge + "\n"), std::string::npos) << variable.err;
  }
}

// Two outputs naming one file through a symlinked directory (before: accepted, one output
// lost).
TEST_F(CliErrorTest, TwoOutputsNamingOneFileThroughALinkedDirectory) {
  fs::create_directory(work() / "d");
  fs::create_directory_symlink("d", work() / "e");
  expect_bad_argument({"tables", "--positions", "pos.npy", "--cos", "d/x.npy", "--sin", "e/x.npy"},
                      "--sin");
  expect_bad_argument({"apply", "qk-rmsnorm-backward", "--x", "x.npy", "--dy", "dy.npy", "--weight",
                       "w.npy", "--dx", "d/g.npy", "--dw", "e/g.npy"},
                      "--dw");
}

// An output that is also an input is read first, then replaced like any output.
TEST_F(CliErrorTest, AnOutputThatIsAnInputIsReplacedAfterItWasRead) {
  run_ok({"apply", "qk-rmsnorm", "--x", "x.npy", "--out", "y.npy"});
  run_ok({"apply", "qk-rmsnorm", "--x", "x.npy", "--out", "x.npy"});
  EXPECT_EQ(contents(work() / "x.npy"), contents(work() / "y.npy"));
}

// An output that cannot be replaced (immutable, append-only) refuses the whole command
// before any output is replaced (before: --cos or --dx was already replaced).
TEST_F(CliErrorTest, AnOutputThatCannotBeReplacedLeavesEveryOutputUntouched) {
  run_ok({"tables", "--positions", "pos.npy", "--cos", "c.npy", "--sin", "s.npy"});
  run_ok(kRmsNormBackward + Tokens{"--weight", "w.npy", "--dw", "dw.npy"});
  // Contents no run gives: a replaced first output would show.
  write_bytes("c.npy", {std::byte{1}});
  write_bytes("dx.npy", {std::byte{2}});
  for (const int flag : {FS_IMMUTABLE_FL, FS_APPEND_FL}) {
    const ScopedInodeFlags sin(work() / "s.npy", flag);
    const ScopedInodeFlags dw(work() / "dw.npy", flag);
    if (!sin.set() || !dw.set()) GTEST_SKIP() << "cannot set inode flags (chattr) here";
    expect_bad_argument(kTables, "--sin");
    expect_bad_argument(kRmsNormBackward + Tokens{"--weight", "w.npy", "--dw", "dw.npy"}, "--dw");
  }
}

// /dev/stdout, /proc/self/fd/1 and /dev/fd/1 are the standard output the command was
// given: a pipe gets the .npy (before: "No such file or directory"), a file opened for
// append (>>) is appended to (before: replaced by the .npy alone).
TEST_F(CliErrorTest, StandardOutputPathsAreWrittenThroughTheStream) {
  run_ok(kRmsNorm);
  const std::string npy = contents(work() / "y.npy");
  for (const std::string path : {"/dev/stdout", "/proc/self/fd/1", "/dev/fd/1"}) {
    int pipe_fds[2];
    ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
    const CliResult r =
        run_with_stdout({"apply", "qk-rmsnorm", "--x", "x.npy", "--out", path}, pipe_fds[1]);
    ::close(pipe_fds[1]);
    EXPECT_EQ(r.status, 0) << path << ": " << r.err;
    EXPECT_TRUE(read_all(pipe_fds[0]) == npy) << path;  // (bytes not printed)
    ::close(pipe_fds[0]);
  }
  std::ofstream(work() / "log") << "earlier\n";
  const int log = ::open((work() / "log").c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  ASSERT_GE(log, 0);
  const CliResult r =
      run_with_stdout({"apply", "qk-rmsnorm", "--x", "x.npy", "--out", "/dev/stdout"}, log);
  ::close(log);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contents(work() / "log") == "earlier\n" + npy);
}

// SIGPIPE is ignored: an output or standard output whose reader is gone is exit 2 naming
// it (before: killed by SIGPIPE, status 141, nothing said).
TEST_F(CliErrorTest, APipeWithoutReaderIsAnErrorNamingTheFlag) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
  ::close(pipe_fds[0]);
  const CliResult out =
      run_with_stdout({"apply", "qk-rmsnorm", "--x", "x.npy", "--out", "/dev/stdout"}, pipe_fds[1]);
  EXPECT_EQ(out.status, 2);
  EXPECT_EQ(out.err.rfind("kernel-align: error: argument '--out': ", 0), 0u) << out.err;
  EXPECT_NE(out.err.find(std::strerror(EPIPE)), std::string::npos) << out.err;
  const CliResult shapes = run_with_stdout({"shapes"}, pipe_fds[1]);
  ::close(pipe_fds[1]);
  EXPECT_EQ(shapes.status, 2);
  EXPECT_EQ(shapes.err.rfind("kernel-align: error: argument 'stdout': ", 0), 0u) << shapes.err;
  EXPECT_NE(shapes.err.find(std::strerror(EPIPE)), std::string::npos) << shapes.err;
}

// A FIFO whose reader leaves early, as --out (an output larger than the pipe's buffer) and
// as run's --trace (the buffer cut to one page, smaller than the run's records).
TEST_F(CliErrorTest, AFifoWhoseReaderLeavesIsAnErrorNamingTheFlag) {
  ASSERT_EQ(::mkfifo((work() / "fifo").c_str(), 0644), 0) << std::strerror(errno);
  const auto open_and_leave = [&] {
    const int fd = ::open((work() / "fifo").c_str(), O_RDONLY | O_CLOEXEC);
    ::fcntl(fd, F_SETPIPE_SZ, 4096);
    ::close(fd);
  };
  write_x({1, 512, 2, 128});  // 256 KiB of bf16
  std::thread reader(open_and_leave);
  const CliResult out = run({"apply", "qk-rmsnorm", "--x", "x.npy", "--out", "fifo"});
  reader.join();
  EXPECT_EQ(out.status, 2);
  EXPECT_EQ(out.err.rfind("kernel-align: error: argument '--out': ", 0), 0u) << out.err;
  EXPECT_NE(out.err.find(std::strerror(EPIPE)), std::string::npos) << out.err;

  reader = std::thread(open_and_leave);
  const CliResult trace = run({"run", "--image", "256x256", "--text-len", "16", "--heads", "4",
                               "--batch", "3", "--trace", "fifo"});
  reader.join();
  EXPECT_EQ(trace.status, 2);
  EXPECT_NE(trace.err.find("kernel-align: error: argument '--trace': "), std::string::npos)
      << trace.err;
  EXPECT_NE(trace.err.find(std::strerror(EPIPE)), std::string::npos) << trace.err;
}

}  // namespace
}  // namespace kernel_align::cli::test
