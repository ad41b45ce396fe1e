// Token positions (frame, height, width) in sequence order, as the model sees them.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

namespace kernel_align {

// Pixels per token side: 8x VAE downsampling, then 2x2 patches.
inline constexpr int kPixelsPerToken = 16;

struct ImageGrid {
  std::int64_t height = 0;  // tokens
  std::int64_t width = 0;   // tokens
  // diffusers layout: the frame index of this image; default its index in the list.
  std::optional<std::int32_t> frame;

  // An image of width x height pixels (both multiples of 16).
  static ImageGrid from_pixels(std::int64_t width_px, std::int64_t height_px);
};

enum class PositionLayout : unsigned char {
  // The seed: text j at (j, j, j) first, then one image at (0, h, w), h, w from 0.
  Seed,
  // diffusers' QwenEmbedRope(scale_rope=True): sequence [text, image 0, image 1, ...];
  // image k at frame k, h and w centred: n rows sit at -ceil(n/2) .. floor(n/2)-1;
  // text j at (m + j) on all axes, m = max over images of max(h/2, w/2) (floor).
  Diffusers,
};

struct PositionRequest {
  PositionLayout layout = PositionLayout::Diffusers;
  std::int64_t text_len = 0;
  std::vector<ImageGrid> images;
  // Sequence slice [start, end); end defaults to the full length.
  std::int64_t start = 0;
  std::optional<std::int64_t> end;
};

inline constexpr int kPositionAxes = 3;
using Position = std::array<std::int32_t, kPositionAxes>;

std::int64_t sequence_length(const PositionRequest& request);

// Positions of tokens [start, end). Equal, element for element, to the same range
// of the full sequence.
std::vector<Position> build_positions(const PositionRequest& request);

const char* position_layout_name(PositionLayout l);

}  // namespace kernel_align
