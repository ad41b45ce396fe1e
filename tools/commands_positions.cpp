// kernel-align positions: token positions (frame, height, width) as int32 [S, 3].
#include <cstring>
#include <string>

#include "commands.hpp"
#include "kernel_align/positions.hpp"
#include "output_files.hpp"
#include "tensor_io.hpp"

namespace kernel_align::cli {
namespace {

PositionRequest parse_request(const Args& args) {
  PositionRequest request;
  request.layout = parse_choice<PositionLayout>(
      "--layout", args.required("--layout"),
      {{"seed", PositionLayout::Seed}, {"diffusers", PositionLayout::Diffusers}});
  request.text_len = parse_int<std::int64_t>("--text-len", args.required("--text-len"));
  for (const std::string& image : args.all("--image")) request.images.push_back(parse_image(image));
  const std::vector<std::string> frames = args.all("--frame");
  if (!frames.empty() && frames.size() != request.images.size()) {
    throw Error("--frame",
                "one --frame per --image (" + std::to_string(request.images.size()) + ")",
                std::to_string(frames.size()));
  }
  for (std::size_t k = 0; k < frames.size(); ++k) {
    request.images[k].frame = parse_int<std::int32_t>("--frame", frames[k]);
  }
  if (const auto start = args.optional("--start")) {
    request.start = parse_int<std::int64_t>("--start", *start);
  }
  if (const auto end = args.optional("--end")) request.end = parse_int<std::int64_t>("--end", *end);
  return request;
}

// The library names images by index; every image came from an --image flag.
FlagNames position_flag_names(std::size_t images) {
  FlagNames names{
      {"text_len", "--text-len"}, {"images", "--image"}, {"start", "--start"}, {"end", "--end"}};
  for (std::size_t k = 0; k < images; ++k) {
    const std::string image = "images[" + std::to_string(k) + "]";
    names.emplace(image, "--image");
    names.emplace(image + ".height", "--image");
    names.emplace(image + ".width", "--image");
    names.emplace(image + ".frame", "--frame");
  }
  return names;
}

void run_positions(const Args& args) {
  const std::string& out_path = args.required("--out");
  const PositionRequest request = parse_request(args);
  const std::vector<Position> positions = call_library(position_flag_names(request.images.size()),
                                                       [&] { return build_positions(request); });
  // The library allows an empty slice, but no command accepts an empty array.
  if (positions.empty()) {
    throw Error("--start", "a slice [--start, --end) of at least one token",
                "[" + std::to_string(request.start) + ", " + std::to_string(request.start) + ")");
  }
  static_assert(sizeof(Position) == kPositionAxes * sizeof(std::int32_t));
  NpyArray array =
      make_npy_array(NpyType::I32, {static_cast<std::int64_t>(positions.size()), kPositionAxes});
  std::memcpy(array.data.data(), positions.data(), array.data.size());
  write_outputs({{"--out", out_path, encode_npy(array)}});
}

}  // namespace

Command positions_command() {
  return {"positions",
          "--layout seed|diffusers --image WxH [--image WxH ...] [--frame K ...] --text-len N "
          "[--start A] [--end B] --out pos.npy",
          "int32 token positions [S, 3] (frame, height, width); images in pixels, 16 per token; "
          "--frame K, one per --image in its order, sets that image's frame index (any int32; "
          "default 0, 1, 2, ...; the seed layout takes only 0)",
          {{"--layout"},
           {"--image", true},
           {"--frame", true},
           {"--text-len"},
           {"--start"},
           {"--end"},
           file_flag("--out")},
          run_positions};
}

}  // namespace kernel_align::cli
