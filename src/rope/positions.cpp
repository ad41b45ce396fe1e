// Token positions of the seed and diffusers layouts (docs/positions-and-tables.md).
#include "kernel_align/positions.hpp"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <string>

#include "kernel_align/error.hpp"

namespace kernel_align {
namespace {

// Positions are int32. Bounding the sequence length S by int32 bounds every position.
constexpr std::int64_t kMaxInt32 = std::numeric_limits<std::int32_t>::max();

// Where one image's tokens sit in the sequence and in position space.
struct ImagePlacement {
  std::int64_t first_token = 0;  // sequence index of its token (row 0, column 0)
  std::int64_t width = 0;        // tokens per row
  std::int64_t tokens = 0;
  std::int32_t frame = 0;
  std::int32_t first_row = 0;  // position of row 0 on the height axis
  std::int32_t first_column = 0;
};

// A validated request: text tokens [0, text_len) first, then the images in order.
struct SequencePlan {
  std::int64_t text_len = 0;
  std::int32_t first_text_position = 0;  // text token j sits at this + j on every axis
  std::vector<ImagePlacement> images;
  std::int64_t length = 0;
};

std::string image_argument(std::size_t index) {
  return "images[" + std::to_string(index) + "]";
}

std::string image_argument(std::size_t index, const char* field) {
  return image_argument(index) + "." + field;
}

void check_grid_side(std::size_t index, const char* field, std::int64_t tokens) {
  if (tokens < 1 || tokens > kMaxInt32) {
    throw Error(image_argument(index, field), "between 1 and 2147483647 tokens",
                std::to_string(tokens));
  }
}

// diffusers (scale_rope=True) centres n rows at -ceil(n/2) .. floor(n/2) - 1.
std::int32_t first_centred_position(std::int64_t n) {
  return static_cast<std::int32_t>(-((n + 1) / 2));
}

SequencePlan plan_sequence(const PositionRequest& request) {
  const bool seed = request.layout == PositionLayout::Seed;
  if (!seed && request.layout != PositionLayout::Diffusers) {
    throw Error("layout", "Seed or Diffusers", std::to_string(static_cast<int>(request.layout)));
  }
  if (request.text_len < 0 || request.text_len > kMaxInt32) {
    throw Error("text_len", "between 0 and 2147483647", std::to_string(request.text_len));
  }
  if (request.images.empty()) throw Error("images", "at least one image", "none");
  if (seed && request.images.size() != 1) {
    throw Error("images", "exactly one image in the seed layout",
                std::to_string(request.images.size()) + " images");
  }

  SequencePlan plan;
  plan.text_len = request.text_len;
  plan.length = request.text_len;
  std::int64_t text_offset = 0;  // diffusers' m: max over images of max(h/2, w/2)
  for (std::size_t k = 0; k < request.images.size(); ++k) {
    const ImageGrid& grid = request.images[k];
    check_grid_side(k, "height", grid.height);
    check_grid_side(k, "width", grid.width);
    ImagePlacement image;
    image.first_token = plan.length;
    image.width = grid.width;
    image.tokens = grid.height * grid.width;  // < 2^62: both sides are below 2^31
    plan.length += image.tokens;
    if (plan.length > kMaxInt32) {
      throw Error(image_argument(k), "a sequence of at most 2147483647 tokens (int32 positions)",
                  std::to_string(plan.length) + " tokens up to this image");
    }
    if (seed) {
      if (grid.frame.value_or(0) != 0) {
        throw Error(image_argument(k, "frame"), "unset or 0 (the seed layout has frame 0)",
                    std::to_string(*grid.frame));
      }
    } else {
      image.frame = grid.frame.value_or(static_cast<std::int32_t>(k));
      image.first_row = first_centred_position(grid.height);
      image.first_column = first_centred_position(grid.width);
      text_offset = std::max({text_offset, grid.height / 2, grid.width / 2});
    }
    plan.images.push_back(image);
  }
  // m <= h*w/2 for the image that sets it, so the last text position
  // m + text_len - 1 is below S <= 2^31 - 1: every position fits int32.
  plan.first_text_position = static_cast<std::int32_t>(text_offset);
  return plan;
}

}  // namespace

ImageGrid ImageGrid::from_pixels(std::int64_t width_px, std::int64_t height_px) {
  const auto check = [](const char* argument, std::int64_t pixels) {
    if (pixels <= 0 || pixels % kPixelsPerToken != 0) {
      throw Error(argument, "a positive multiple of 16 pixels", std::to_string(pixels));
    }
  };
  check("width_px", width_px);
  check("height_px", height_px);
  ImageGrid grid;
  grid.height = height_px / kPixelsPerToken;
  grid.width = width_px / kPixelsPerToken;
  return grid;
}

std::int64_t sequence_length(const PositionRequest& request) {
  return plan_sequence(request).length;
}

std::vector<Position> build_positions(const PositionRequest& request) {
  const SequencePlan plan = plan_sequence(request);
  const std::int64_t start = request.start;
  if (start < 0 || start > plan.length) {
    throw Error("start", "in [0, S] with S = " + std::to_string(plan.length),
                std::to_string(start));
  }
  const std::int64_t end = request.end.value_or(plan.length);
  if (end < start || end > plan.length) {
    throw Error(
        "end",
        "in [start, S] = [" + std::to_string(start) + ", " + std::to_string(plan.length) + "]",
        std::to_string(end));
  }

  std::vector<Position> positions;
  positions.reserve(static_cast<std::size_t>(end - start));
  for (std::int64_t t = start; t < std::min(end, plan.text_len); ++t) {
    const auto p = static_cast<std::int32_t>(plan.first_text_position + t);
    positions.push_back({p, p, p});
  }
  for (const ImagePlacement& image : plan.images) {
    const std::int64_t first = std::max(start, image.first_token);
    const std::int64_t last = std::min(end, image.first_token + image.tokens);
    for (std::int64_t t = first; t < last; ++t) {
      const std::int64_t local = t - image.first_token;
      positions.push_back({image.frame,
                           static_cast<std::int32_t>(image.first_row + local / image.width),
                           static_cast<std::int32_t>(image.first_column + local % image.width)});
    }
  }
  return positions;
}

const char* position_layout_name(PositionLayout l) {
  switch (l) {
    case PositionLayout::Seed:
      return "seed";
    case PositionLayout::Diffusers:
      return "diffusers";
  }
  return "unknown";
}

}  // namespace kernel_align
