// Token positions of both layouts: diffusers' centring and text offset, the seed's
// layout, slices, and every rejected request.
#include "kernel_align/positions.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>
#include <random>
#include <string>

#include "kernel_align/error.hpp"

namespace kernel_align {
namespace {

PositionRequest request_of(PositionLayout layout, std::int64_t text_len,
                           std::vector<ImageGrid> images) {
  PositionRequest request;
  request.layout = layout;
  request.text_len = text_len;
  request.images = std::move(images);
  return request;
}

ImageGrid grid_of(std::int64_t height, std::int64_t width,
                  std::optional<std::int32_t> frame = std::nullopt) {
  ImageGrid grid;
  grid.height = height;
  grid.width = width;
  grid.frame = frame;
  return grid;
}

Position at(std::int32_t frame, std::int32_t height, std::int32_t width) {
  return {frame, height, width};
}

// Expected diffusers layout of one image: rows and columns run from their first
// centred position, row-major.
void expect_image(const std::vector<Position>& positions, std::int64_t first_token,
                  const ImageGrid& grid, std::int32_t frame, std::int32_t first_row,
                  std::int32_t first_column) {
  for (std::int64_t h = 0; h < grid.height; ++h) {
    for (std::int64_t w = 0; w < grid.width; ++w) {
      const auto index = static_cast<std::size_t>(first_token + h * grid.width + w);
      ASSERT_EQ(positions[index], at(frame, static_cast<std::int32_t>(first_row + h),
                                     static_cast<std::int32_t>(first_column + w)))
          << "token " << index;
    }
  }
}

void expect_text(const std::vector<Position>& positions, std::int64_t text_len,
                 std::int32_t offset) {
  for (std::int64_t j = 0; j < text_len; ++j) {
    const auto p = static_cast<std::int32_t>(offset + j);
    ASSERT_EQ(positions[static_cast<std::size_t>(j)], at(p, p, p)) << "text token " << j;
  }
}

TEST(ImageGridTest, FromPixelsIsSixteenPixelsPerToken) {
  const ImageGrid square = ImageGrid::from_pixels(1328, 1328);
  EXPECT_EQ(square.height, 83);
  EXPECT_EQ(square.width, 83);
  EXPECT_FALSE(square.frame.has_value());
  const ImageGrid wide = ImageGrid::from_pixels(1664, 928);
  EXPECT_EQ(wide.height, 58);
  EXPECT_EQ(wide.width, 104);
}

TEST(ImageGridTest, FromPixelsRejectsNonMultiplesOf16) {
  for (const std::int64_t bad : {0L, -16L, 1000L, 17L}) {
    try {
      ImageGrid::from_pixels(bad, 1024);
      FAIL() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "width_px");
      EXPECT_EQ(e.found(), std::to_string(bad));
    }
    try {
      ImageGrid::from_pixels(1024, bad);
      FAIL() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "height_px");
    }
  }
}

struct CentringCase {
  std::int64_t width_px;
  std::int64_t height_px;
  std::int32_t text_offset;  // m
  std::int32_t first_row;    // -ceil(h/2); the last row is floor(h/2) - 1
  std::int32_t last_row;
  std::int32_t first_column;
  std::int32_t last_column;
};

void PrintTo(const CentringCase& c, std::ostream* os) {
  *os << c.width_px << "x" << c.height_px << " px";
}

class DiffusersCentringTest : public ::testing::TestWithParam<CentringCase> {};

TEST_P(DiffusersCentringTest, CentresTheImageAndOffsetsTheText) {
  const CentringCase& c = GetParam();
  const ImageGrid grid = ImageGrid::from_pixels(c.width_px, c.height_px);
  const std::int64_t text_len = 256;
  const PositionRequest request = request_of(PositionLayout::Diffusers, text_len, {grid});
  const std::vector<Position> positions = build_positions(request);

  ASSERT_EQ(sequence_length(request), text_len + grid.height * grid.width);
  ASSERT_EQ(static_cast<std::int64_t>(positions.size()), sequence_length(request));
  expect_text(positions, text_len, c.text_offset);
  expect_image(positions, text_len, grid, 0, c.first_row, c.first_column);
  EXPECT_EQ(positions[static_cast<std::size_t>(text_len)], at(0, c.first_row, c.first_column));
  EXPECT_EQ(positions.back(), at(0, c.last_row, c.last_column));
}

INSTANTIATE_TEST_SUITE_P(IssueShapes, DiffusersCentringTest,
                         ::testing::Values(CentringCase{1024, 1024, 32, -32, 31, -32, 31},
                                           CentringCase{1328, 1328, 41, -42, 40, -42, 40},
                                           CentringCase{1664, 928, 52, -29, 28, -52, 51}));

// Qwen-Image-Edit: the target (frame 0) and a reference image of another size
// (frame 1); the text offset is the maximum over both, here set by the reference.
TEST(DiffusersPositionsTest, EditTargetAndReferenceImage) {
  const ImageGrid target = ImageGrid::from_pixels(1024, 1024);    // 64 x 64, m 32
  const ImageGrid reference = ImageGrid::from_pixels(1664, 928);  // 58 x 104, m 52
  const std::int64_t text_len = 100;
  const PositionRequest request =
      request_of(PositionLayout::Diffusers, text_len, {target, reference});
  const std::vector<Position> positions = build_positions(request);

  ASSERT_EQ(static_cast<std::int64_t>(positions.size()), text_len + 64 * 64 + 58 * 104);
  expect_text(positions, text_len, 52);
  expect_image(positions, text_len, target, 0, -32, -32);
  expect_image(positions, text_len + 64 * 64, reference, 1, -29, -52);
}

TEST(DiffusersPositionsTest, ExplicitFramesMayBeNegative) {
  const ImageGrid first = grid_of(3, 2, -3);
  const ImageGrid second = grid_of(2, 5);  // frame: its index, 1
  const std::vector<Position> positions =
      build_positions(request_of(PositionLayout::Diffusers, 2, {first, second}));
  ASSERT_EQ(positions.size(), 2u + 6u + 10u);
  expect_text(positions, 2, 2);  // m = max(3/2, 2/2, 2/2, 5/2) = 2
  expect_image(positions, 2, first, -3, -2, -1);
  expect_image(positions, 8, second, 1, -1, -3);
}

TEST(SeedPositionsTest, TextOnTheDiagonalThenTheImageFromZero) {
  const ImageGrid grid = grid_of(3, 4);
  const std::vector<Position> positions =
      build_positions(request_of(PositionLayout::Seed, 5, {grid}));
  ASSERT_EQ(positions.size(), 5u + 12u);
  expect_text(positions, 5, 0);
  expect_image(positions, 5, grid, 0, 0, 0);
  // The seed's known defect, kept as it describes it: text token 0 and pixel (0, 0)
  // share the position (0, 0, 0).
  EXPECT_EQ(positions[0], positions[5]);
}

TEST(SeedPositionsTest, IssueShape) {
  const PositionRequest request =
      request_of(PositionLayout::Seed, 256, {ImageGrid::from_pixels(1328, 1328)});
  const std::vector<Position> positions = build_positions(request);
  ASSERT_EQ(positions.size(), 256u + 83u * 83u);
  EXPECT_EQ(positions[255], at(255, 255, 255));
  EXPECT_EQ(positions[256], at(0, 0, 0));
  EXPECT_EQ(positions.back(), at(0, 82, 82));
}

TEST(PositionSliceTest, EqualsTheSameRangeOfTheFullSequence) {
  const std::vector<PositionRequest> requests = {
      request_of(PositionLayout::Diffusers, 256, {ImageGrid::from_pixels(1664, 928)}),
      request_of(PositionLayout::Diffusers, 77,
                 {ImageGrid::from_pixels(1024, 1024), ImageGrid::from_pixels(1328, 1328)}),
      request_of(PositionLayout::Seed, 256, {ImageGrid::from_pixels(1328, 1328)}),
      request_of(PositionLayout::Diffusers, 0, {grid_of(1, 1)})};
  std::mt19937_64 random(20240611);
  for (const PositionRequest& request : requests) {
    const std::vector<Position> full = build_positions(request);
    const auto length = static_cast<std::int64_t>(full.size());
    std::vector<std::pair<std::int64_t, std::int64_t>> ranges = {
        {0, length}, {0, 0}, {length, length}, {length / 2, length / 2}, {0, request.text_len}};
    std::uniform_int_distribution<std::int64_t> index(0, length);
    for (int k = 0; k < 20; ++k) {
      const std::int64_t a = index(random);
      const std::int64_t b = index(random);
      ranges.emplace_back(std::min(a, b), std::max(a, b));
    }
    for (const auto& [start, end] : ranges) {
      PositionRequest slice = request;
      slice.start = start;
      slice.end = end;
      const std::vector<Position> expected(full.begin() + start, full.begin() + end);
      ASSERT_EQ(build_positions(slice), expected) << "[" << start << ", " << end << ")";
    }
    PositionRequest open_end = request;
    open_end.start = length / 3;
    EXPECT_EQ(build_positions(open_end),
              std::vector<Position>(full.begin() + length / 3, full.end()));
  }
}

TEST(PositionLayoutTest, Names) {
  EXPECT_STREQ(position_layout_name(PositionLayout::Seed), "seed");
  EXPECT_STREQ(position_layout_name(PositionLayout::Diffusers), "diffusers");
}

// The argument an invalid request is rejected for.
std::string rejected_argument(const PositionRequest& request) {
  try {
    build_positions(request);
  } catch (const Error& e) {
    return e.argument();
  }
  return "(accepted)";
}

TEST(PositionErrorTest, RejectsInvalidRequests) {
  const ImageGrid grid = grid_of(4, 4);
  const auto diffusers = [](std::int64_t text_len, std::vector<ImageGrid> images) {
    return request_of(PositionLayout::Diffusers, text_len, std::move(images));
  };
  EXPECT_EQ(rejected_argument(diffusers(-1, {grid})), "text_len");
  EXPECT_EQ(rejected_argument(diffusers(std::int64_t{1} << 31, {grid})), "text_len");
  EXPECT_EQ(rejected_argument(diffusers(4, {})), "images");
  EXPECT_EQ(rejected_argument(diffusers(4, {grid_of(0, 4)})), "images[0].height");
  EXPECT_EQ(rejected_argument(diffusers(4, {grid, grid_of(4, -2)})), "images[1].width");
  EXPECT_EQ(rejected_argument(diffusers(4, {grid_of(4, std::int64_t{1} << 31)})),
            "images[0].width");
  EXPECT_EQ(rejected_argument(diffusers(4, {grid, grid_of(65536, 65536)})), "images[1]");
  EXPECT_EQ(rejected_argument(request_of(PositionLayout::Seed, 4, {grid, grid})), "images");
  EXPECT_EQ(rejected_argument(request_of(PositionLayout::Seed, 4, {grid_of(4, 4, 1)})),
            "images[0].frame");
  EXPECT_EQ(rejected_argument(request_of(static_cast<PositionLayout>(7), 4, {grid})), "layout");

  const PositionRequest valid = diffusers(4, {grid});  // S = 20
  const auto sliced = [&](std::int64_t start, std::optional<std::int64_t> end) {
    PositionRequest request = valid;
    request.start = start;
    request.end = end;
    return request;
  };
  EXPECT_EQ(rejected_argument(sliced(-1, 5)), "start");
  EXPECT_EQ(rejected_argument(sliced(21, std::nullopt)), "start");
  EXPECT_EQ(rejected_argument(sliced(0, 21)), "end");
  EXPECT_EQ(rejected_argument(sliced(6, 5)), "end");
  EXPECT_EQ(rejected_argument(sliced(0, -1)), "end");
  EXPECT_EQ(rejected_argument(sliced(20, std::nullopt)), "(accepted)");
}

TEST(PositionErrorTest, ErrorSaysWhatWasExpectedAndFound) {
  try {
    build_positions(request_of(PositionLayout::Diffusers, -3, {grid_of(1, 1)}));
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "text_len");
    EXPECT_EQ(e.found(), "-3");
    EXPECT_NE(std::string(e.what()).find("text_len"), std::string::npos);
  }
}

TEST(PositionErrorTest, SequenceLengthValidatesToo) {
  EXPECT_THROW(sequence_length(request_of(PositionLayout::Diffusers, 1, {})), Error);
  EXPECT_EQ(sequence_length(request_of(PositionLayout::Seed, 7, {grid_of(2, 3)})), 13);
}

}  // namespace
}  // namespace kernel_align
