// Token positions (frame, height, width) in sequence order, as the model sees them.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

namespace kernel_align {

// Pixels per token side: 8x VAE downsampling, then 2x2 patches.
inline constexpr int kPixelsPerToken = 16;

// One image of the sequence: its token grid (height x width tokens, each 1 to 2^31 - 1;
// an Error names images[k].height or .width otherwise) and its frame.
struct ImageGrid {
  std::int64_t height = 0;  // tokens
  std::int64_t width = 0;   // tokens
  // diffusers layout: the frame index of this image; default its index in the list.
  // The seed layout: unset or 0 (Error "images[k].frame" otherwise).
  std::optional<std::int32_t> frame;

  // An image of width x height pixels (both positive multiples of 16: Error naming
  // width_px or height_px otherwise), frame unset.
  static ImageGrid from_pixels(std::int64_t width_px, std::int64_t height_px);
};

// How positions are assigned: the seed's or diffusers' Qwen-Image layout.
enum class PositionLayout : unsigned char {
  // The seed: text j at (j, j, j) first, then one image at (0, h, w), h, w from 0.
  Seed,
  // diffusers' QwenEmbedRope(scale_rope=True): sequence [text, image 0, image 1, ...];
  // image k at frame k, h and w centred: n rows sit at -ceil(n/2) .. floor(n/2)-1;
  // text j at (m + j) on all axes, m = max over images of max(h/2, w/2) (floor).
  Diffusers,
};

// The sequence to build positions for: text_len text tokens and the images, in the
// layout's order, S = text_len + the sum of the images' tokens (at most 2^31 - 1).
struct PositionRequest {
  PositionLayout layout = PositionLayout::Diffusers;
  std::int64_t text_len = 0;      // 0 to 2^31 - 1 (Error "text_len")
  std::vector<ImageGrid> images;  // at least one; exactly one in the seed layout ("images")
  // Sequence slice [start, end); end defaults to the full length. 0 <= start <= end <= S
  // (Error "start" or "end" otherwise).
  std::int64_t start = 0;
  std::optional<std::int64_t> end;
};

// Axes of a position: frame, height, width (the columns of the positions tensor).
inline constexpr int kPositionAxes = 3;
// One token's position (frame, height, width).
using Position = std::array<std::int32_t, kPositionAxes>;

// S, the full sequence's length, without building it. Errors as build_positions
// (except start and end, not read).
std::int64_t sequence_length(const PositionRequest& request);

// Positions of tokens [start, end). Equal, element for element, to the same range
// of the full sequence. Error naming the member of `request` that is out of range.
std::vector<Position> build_positions(const PositionRequest& request);

// "seed", "diffusers": the layout's name in the CLI and the Python operators.
const char* position_layout_name(PositionLayout l);

}  // namespace kernel_align
