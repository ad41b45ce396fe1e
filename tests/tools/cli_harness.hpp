// Runs the built `kernel-align` binary (KA_CLI_PATH) in a fresh directory per test
// and captures its exit status, stdout and stderr.
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "npy.hpp"
#include "support/tensors.hpp"
#include "tensor_io.hpp"

namespace kernel_align::cli::test {

namespace fs = std::filesystem;

struct CliResult {
  int status = -1;
  std::string out;
  std::string err;
};

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "ka_cli_test_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    root_ = pattern;
    work_ = root_ / "work";
    fs::create_directory(work_);
  }

  void TearDown() override { fs::remove_all(root_); }

  // The binary with `args`, run in work_, the directory all relative paths name.
  CliResult run(const std::vector<std::string>& args) const {
    return run_concurrently({args}).front();
  }

  // Every command started at once (each in its own process), then all awaited.
  std::vector<CliResult> run_concurrently(
      const std::vector<std::vector<std::string>>& commands) const {
    std::vector<pid_t> pids;
    for (std::size_t i = 0; i < commands.size(); ++i) pids.push_back(start(commands[i], i));
    std::vector<CliResult> results;
    for (std::size_t i = 0; i < pids.size(); ++i) {
      CliResult& result = results.emplace_back();
      int wait_status = 0;
      if (pids[i] < 0 || ::waitpid(pids[i], &wait_status, 0) != pids[i] ||
          !WIFEXITED(wait_status)) {
        ADD_FAILURE() << "could not run " << KA_CLI_PATH;
        continue;
      }
      result.status = WEXITSTATUS(wait_status);
      result.out = slurp(stream_path("stdout", i));
      result.err = slurp(stream_path("stderr", i));
    }
    return results;
  }

  // The binary with `args` and the descriptor `stdout_fd` as its standard output (a pipe,
  // a file opened for append): its status and stderr (`out` stays empty).
  CliResult run_with_stdout(const std::vector<std::string>& args, int stdout_fd) const {
    CliResult result;
    int wait_status = 0;
    const pid_t pid = start(args, 0, stdout_fd);
    if (pid < 0 || ::waitpid(pid, &wait_status, 0) != pid || !WIFEXITED(wait_status)) {
      ADD_FAILURE() << "could not run " << KA_CLI_PATH;
      return result;
    }
    result.status = WEXITSTATUS(wait_status);
    result.err = slurp(stream_path("stderr", 0));
    return result;
  }

  // Asserts the run succeeded and returns its stdout.
  std::string run_ok(const std::vector<std::string>& args) const {
    const CliResult r = run(args);
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.err, "");
    return r.out;
  }

  // The contract of every rejected argument: status 2, exactly one stderr line of the
  // form "kernel-align: error: argument '<flag>': expected ..., found ...", nothing on
  // stdout and no file created, changed or left behind.
  void expect_bad_argument(const std::vector<std::string>& args, const std::string& flag) const {
    const auto before = snapshot();
    const CliResult r = run(args);
    EXPECT_EQ(r.status, 2);
    EXPECT_EQ(r.out, "");
    const std::string prefix = "kernel-align: error: argument '" + flag + "': expected ";
    EXPECT_EQ(r.err.substr(0, prefix.size()), prefix) << r.err;
    EXPECT_NE(r.err.find(", found "), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_TRUE(r.err.ends_with('\n')) << r.err;
    EXPECT_EQ(snapshot(), before) << "the failed command touched the directory";
  }

  void write_bytes(const std::string& name, const std::vector<std::byte>& bytes) const {
    std::ofstream(work_ / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
  }

  void write(const std::string& name, const NpyArray& array) const {
    write_bytes(name, encode_npy(array));
  }

  NpyArray read(const std::string& name) const { return read_npy(work_ / name, name); }

  bool exists(const std::string& name) const { return fs::exists(work_ / name); }

  const fs::path& work() const { return work_; }

 private:
  static std::string slurp(const fs::path& path) {
    std::ostringstream s;
    s << std::ifstream(path, std::ios::binary).rdbuf();
    return s.str();
  }

  // Every entry of work_ (recursively): its relative name, size and a hash of its bytes.
  std::set<std::tuple<std::string, std::size_t, std::size_t>> snapshot() const {
    std::set<std::tuple<std::string, std::size_t, std::size_t>> entries;
    for (const auto& e : fs::recursive_directory_iterator(work_)) {
      const std::string bytes = e.is_regular_file() ? slurp(e.path()) : "<directory>";
      entries.emplace(fs::relative(e.path(), work_).string(), bytes.size(),
                      std::hash<std::string>{}(bytes));
    }
    return entries;
  }

  fs::path stream_path(const char* stream, std::size_t index) const {
    return root_ / (stream + std::to_string(index));
  }

  // Forks the binary with `args`; its stdout and stderr go to files numbered `index`, or
  // its stdout to `stdout_fd` where given.
  pid_t start(const std::vector<std::string>& args, std::size_t index, int stdout_fd = -1) const {
    const fs::path out_path = stream_path("stdout", index);
    const fs::path err_path = stream_path("stderr", index);
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int out =
          stdout_fd >= 0 ? stdout_fd : ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out < 0 || err < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0 ||
          ::chdir(work_.c_str()) != 0) {
        std::_Exit(127);
      }
      std::vector<char*> argv{const_cast<char*>(KA_CLI_PATH)};
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(KA_CLI_PATH, argv.data());
      std::_Exit(127);
    }
    return pid;
  }

  fs::path root_;  // holds work_ and the captured streams
  fs::path work_;
};

// Values spread over several binades (kernel_align::test::Rng), stored in `type`.
inline NpyArray random_array(DType type, std::vector<std::int64_t> shape,
                             kernel_align::test::Rng& rng) {
  NpyArray array = make_npy_array(npy_type_of(type), std::move(shape));
  for (std::int64_t i = 0; i < array.numel(); ++i) {
    contract::store_output(type, array.data.data(), i, static_cast<float>(rng.spread(3)));
  }
  return array;
}

// An int32 array with the given values.
inline NpyArray int32_array(std::vector<std::int64_t> shape,
                            const std::vector<std::int32_t>& values) {
  NpyArray array = make_npy_array(NpyType::I32, std::move(shape));
  std::memcpy(array.data.data(), values.data(), array.data.size());
  return array;
}

// A view of `array` built here, not with the code under test.
template <class Pointer>
BasicTensorView<Pointer> test_view(Pointer data, DType type,
                                   const std::vector<std::int64_t>& shape) {
  BasicTensorView<Pointer> v;
  v.data = data;
  v.dtype = type;
  v.rank = static_cast<int>(shape.size());
  std::int64_t step = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    v.shape[d] = shape[d];
    v.strides[d] = step;
    step *= shape[d];
  }
  return v;
}

}  // namespace kernel_align::cli::test
