#include "npy.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>

#include "kernel_align/error.hpp"
#include "memory.hpp"
#include "messages.hpp"

namespace kernel_align::cli {
namespace {

// The data bytes are used as they are in memory.
static_assert(std::endian::native == std::endian::little, "the .npy code assumes little-endian");

constexpr std::array<char, 6> kMagic{'\x93', 'N', 'U', 'M', 'P', 'Y'};
constexpr std::size_t kPreambleV1 = 10;  // magic, version (2), header length (2)
constexpr std::size_t kPreambleV2 = 12;  // magic, version (2), header length (4)
constexpr std::size_t kDataAlignment = 64;

constexpr std::array<NpyType, 5> kAllTypes{NpyType::F32, NpyType::F16, NpyType::BF16, NpyType::I32,
                                           NpyType::Bool};
constexpr const char* kSupportedDescrs =
    "descr '<f4' (fp32), '<f2' (fp16), '<u2' (bf16 bit patterns), '<i4' (int32) or '|b1' "
    "(bool)";
constexpr const char* kHeaderForm =
    "a .npy header {'descr': <str>, 'fortran_order': <bool>, 'shape': <tuple of ints>}";

std::uint32_t read_le(std::span<const std::byte> bytes) {
  std::uint32_t v = 0;
  for (std::size_t i = bytes.size(); i-- > 0;) {
    v = (v << 8) | std::to_integer<std::uint32_t>(bytes[i]);
  }
  return v;
}

// A recursive-descent reader of the Python dict literal NumPy writes as the header.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& argument, const std::string& source)
      : text_(text), argument_(argument), source_(source) {}

  NpyArray parse() {
    std::optional<std::string> descr;
    std::optional<bool> fortran_order;
    std::optional<std::vector<std::int64_t>> shape;
    expect('{');
    while (!accept('}')) {
      const std::string key = string_literal();
      expect(':');
      if (key == "descr" && !descr) {
        descr = string_literal();
      } else if (key == "fortran_order" && !fortran_order) {
        fortran_order = boolean_literal();
      } else if (key == "shape" && !shape) {
        shape = int_tuple();
      } else {
        fail("one of the keys 'descr', 'fortran_order', 'shape', each once",
             "key " + single_quoted(key));
      }
      if (!accept(',')) {
        expect('}');
        break;
      }
    }
    skip_space();
    if (pos_ != text_.size()) fail("the end of the header", "more text");
    for (const auto& [key, present] : {std::pair{"descr", descr.has_value()},
                                       {"fortran_order", fortran_order.has_value()},
                                       {"shape", shape.has_value()}}) {
      if (!present) fail("key " + single_quoted(key), "the end of the dict");
    }
    return validated(*descr, *fortran_order, std::move(*shape));
  }

 private:
  [[noreturn]] void fail(const std::string& expected, const std::string& found) const {
    throw Error(argument_, kHeaderForm + std::string(" in ") + single_quoted(source_),
                found + " at column " + std::to_string(pos_) + " (" + expected +
                    " expected there) of " + excerpt());
  }

  // The header, quoted, cut after kExcerpt characters: an error stays a readable line
  // whatever the file holds (a header may be 4 GiB).
  std::string excerpt() const {
    constexpr std::size_t kExcerpt = 120;
    const std::string_view header = trimmed();
    if (header.size() <= kExcerpt) return single_quoted(header);
    return single_quoted(header.substr(0, kExcerpt)) + "... (" + std::to_string(header.size()) +
           " characters in all)";
  }

  // The header without the padding NumPy puts before the data.
  std::string_view trimmed() const {
    const std::size_t end = text_.find_last_not_of(" \t\r\n");
    return text_.substr(0, end == std::string_view::npos ? 0 : end + 1);
  }

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool accept(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  void expect(char c) {
    if (!accept(c)) fail(single_quoted(std::string(1, c)), next_found());
  }

  std::string next_found() const {
    return pos_ < text_.size() ? single_quoted(text_.substr(pos_, 1)) : "the end";
  }

  std::string string_literal() {
    skip_space();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
      fail("a string", next_found());
    }
    const char quote = text_[pos_++];
    const std::size_t end = text_.find(quote, pos_);
    if (end == std::string_view::npos) fail("a closing quote", "the end");
    std::string s(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return s;
  }

  bool boolean_literal() {
    skip_space();
    for (const auto& [word, value] : {std::pair{"True", true}, std::pair{"False", false}}) {
      if (text_.substr(pos_).starts_with(word)) {
        pos_ += std::strlen(word);
        return value;
      }
    }
    fail("True or False", next_found());
  }

  std::int64_t int_literal() {
    skip_space();
    std::int64_t v = 0;
    const std::size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const int digit = text_[pos_] - '0';
      if (v > (std::numeric_limits<std::int64_t>::max() - digit) / 10) {
        fail("a dimension below 2^63", "a larger one");
      }
      v = v * 10 + digit;
      ++pos_;
    }
    if (pos_ == start) fail("a non-negative integer", next_found());
    return v;
  }

  std::vector<std::int64_t> int_tuple() {
    std::vector<std::int64_t> dims;
    expect('(');
    while (!accept(')')) {
      dims.push_back(int_literal());
      if (!accept(',')) {
        expect(')');
        break;
      }
    }
    return dims;
  }

  NpyArray validated(const std::string& descr, bool fortran_order,
                     std::vector<std::int64_t> shape) const {
    NpyArray array;
    array.type = type_of_descr(descr);
    if (fortran_order) {
      throw Error(argument_, "'fortran_order': False (C order)",
                  "True in " + single_quoted(source_));
    }
    if (shape.size() > static_cast<std::size_t>(kNpyMaxRank)) {
      throw Error(argument_, "at most " + std::to_string(kNpyMaxRank) + " dimensions",
                  "shape " + shape_tuple(shape) + " in " + single_quoted(source_));
    }
    std::int64_t numel = 1;
    for (const std::int64_t d : shape) {
      if (d == 0) {
        throw Error(argument_, "a non-empty array",
                    "shape " + shape_tuple(shape) + " in " + single_quoted(source_));
      }
      if (numel > std::numeric_limits<std::int64_t>::max() / 8 / d) {
        throw Error(argument_, "an array of fewer than 2^60 bytes",
                    "shape " + shape_tuple(shape) + " in " + single_quoted(source_));
      }
      numel *= d;
    }
    array.shape = std::move(shape);
    return array;
  }

  NpyType type_of_descr(const std::string& descr) const {
    for (const NpyType t : kAllTypes) {
      if (descr == npy_descr(t)) return t;
    }
    for (const NpyType t : kAllTypes) {
      const std::string_view little = npy_descr(t);
      if (descr.starts_with('>') && std::string_view(descr).substr(1) == little.substr(1)) {
        throw Error(argument_, std::string("little-endian data, ") + kSupportedDescrs,
                    single_quoted(descr) + " (big-endian) in " + single_quoted(source_));
      }
    }
    throw Error(argument_, kSupportedDescrs,
                single_quoted(descr) + " in " + single_quoted(source_));
  }

  std::string_view text_;
  const std::string& argument_;
  const std::string& source_;
  std::size_t pos_ = 0;
};

std::string header_text(const NpyArray& array) {
  return std::string("{'descr': '") + npy_descr(array.type) +
         "', 'fortran_order': False, 'shape': " + shape_tuple(array.shape) + ", }";
}

}  // namespace

std::int64_t NpyArray::numel() const {
  std::int64_t n = 1;
  for (const std::int64_t d : shape) n *= d;
  return n;
}

std::size_t npy_type_size(NpyType t) {
  return t == NpyType::Bool ? 1 : t == NpyType::F16 || t == NpyType::BF16 ? 2 : 4;
}

const char* npy_descr(NpyType t) {
  switch (t) {
    case NpyType::F32:
      return "<f4";
    case NpyType::F16:
      return "<f2";
    case NpyType::BF16:
      return "<u2";
    case NpyType::I32:
      return "<i4";
    case NpyType::Bool:
      return "|b1";
  }
  return "?";
}

NpyArray make_npy_array(NpyType type, std::vector<std::int64_t> shape) {
  NpyArray array{type, std::move(shape), {}};
  array.data.resize(static_cast<std::size_t>(array.numel()) * npy_type_size(type));
  return array;
}

std::string shape_tuple(std::span<const std::int64_t> shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + (shape.size() == 1 ? ",)" : ")");
}

NpyArray parse_npy(std::span<const std::byte> file, const std::string& argument,
                   const std::string& source) {
  const auto truncated = [&](const std::string& expected) {
    return Error(
        argument, expected,
        single_quoted(source) + " of " + std::to_string(file.size()) + " bytes (truncated)");
  };
  if (file.size() < kMagic.size() || std::memcmp(file.data(), kMagic.data(), kMagic.size()) != 0) {
    throw Error(argument, "a .npy file (starting with \\x93NUMPY)",
                single_quoted(source) + ", which does not start with it");
  }
  if (file.size() < kPreambleV1) throw truncated("a .npy preamble of 10 bytes");
  const int major = std::to_integer<int>(file[6]);
  const int minor = std::to_integer<int>(file[7]);
  if ((major < 1 || major > 3) || minor != 0) {
    throw Error(
        argument, ".npy format version 1.0, 2.0 or 3.0",
        std::to_string(major) + "." + std::to_string(minor) + " in " + single_quoted(source));
  }
  const std::size_t preamble = major == 1 ? kPreambleV1 : kPreambleV2;
  if (file.size() < preamble) {
    throw truncated("a .npy preamble of " + std::to_string(preamble) + " bytes");
  }
  const std::size_t header_size = read_le(file.subspan(8, preamble - 8));
  if (file.size() - preamble < header_size) {
    throw truncated("a .npy header of " + std::to_string(header_size) + " bytes");
  }
  const std::string_view header(reinterpret_cast<const char*>(file.data() + preamble), header_size);
  NpyArray array = HeaderParser(header, argument, source).parse();

  const std::span<const std::byte> data = file.subspan(preamble + header_size);
  const std::size_t expected_bytes =
      static_cast<std::size_t>(array.numel()) * npy_type_size(array.type);
  if (data.size() != expected_bytes) {
    throw Error(argument,
                std::to_string(expected_bytes) + " data bytes for shape " +
                    shape_tuple(array.shape) + " " + npy_descr(array.type),
                std::to_string(data.size()) + " in " + single_quoted(source) +
                    (data.size() < expected_bytes ? " (truncated)" : ""));
  }
  array.data.assign(data.begin(), data.end());
  return array;
}

NpyArray read_npy(const std::filesystem::path& path, const std::string& argument) {
  const std::string name = path.string();
  const auto unreadable = [&](const std::string& reason) {
    return Error(argument, "a readable .npy file", single_quoted(name) + " (" + reason + ")");
  };
  struct File {
    int fd;
    ~File() {
      if (fd >= 0) ::close(fd);
    }
  } const file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) throw unreadable(std::strerror(errno));
  struct stat st {};
  if (::fstat(file.fd, &st) != 0) throw unreadable(std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw unreadable("not a regular file");
  // The file and the array parsed from it are both held for a moment.
  const auto size = static_cast<std::uint64_t>(st.st_size);
  check_fits_in_memory(argument, checked_product({size, 2}), single_quoted(name));
  // read(2) until the end, whatever st_size says: files under /proc report 0 (and
  // /proc/self/mem fails with EIO, which is then the error).
  std::vector<std::byte> bytes;
  constexpr std::uint64_t kChunk = std::uint64_t{1} << 20;
  while (true) {
    const std::size_t used = bytes.size();
    if (used > size) {
      check_fits_in_memory(argument, checked_product({used + kChunk, 2}), single_quoted(name));
    }
    // Room for the rest of what st_size announced, or one more chunk past it.
    bytes.resize(used + std::max(kChunk, used < size ? size - used : 0));
    const ssize_t n = ::read(file.fd, bytes.data() + used, bytes.size() - used);
    bytes.resize(used + static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw unreadable(std::strerror(errno));
    if (n == 0) break;
  }
  return parse_npy(bytes, argument, name);
}

std::vector<std::byte> encode_npy(const NpyArray& array) {
  std::string header = header_text(array);
  // Pad with spaces so that preamble + header (ending in '\n') fills whole 64-byte blocks.
  const std::size_t unpadded = kPreambleV1 + header.size() + 1;
  header.append((kDataAlignment - unpadded % kDataAlignment) % kDataAlignment, ' ');
  header += '\n';

  std::vector<std::byte> file;
  file.reserve(kPreambleV1 + header.size() + array.data.size());
  for (const char c : kMagic) file.push_back(static_cast<std::byte>(c));
  file.push_back(std::byte{1});
  file.push_back(std::byte{0});
  file.push_back(static_cast<std::byte>(header.size() & 0xFF));
  file.push_back(static_cast<std::byte>(header.size() >> 8));
  for (const char c : header) file.push_back(static_cast<std::byte>(c));
  file.insert(file.end(), array.data.begin(), array.data.end());
  return file;
}

}  // namespace kernel_align::cli
