// The options of the operators (ops.hpp): which roundings the norm performs, how RoPE
// pairs and lays out elements, and the option structs the calls take. Plain enums and
// aggregates: this header pulls in nothing of the library's arithmetic.
#pragma once

#include <string>
#include <string_view>

#include <cstdint>

namespace kernel_align {

// Largest head dimension D (the last dim) any op accepts; D is even, 2 to kMaxHeadDim.
inline constexpr int kMaxHeadDim = 4096;

// Which roundings the RMSNorm forward performs (docs/contract.md section 3).
enum class NormMode : unsigned char {
  Single,     // y = out(x * rstd * w): one rounding, the seed's semantics
  Diffusers,  // t = weight_dtype(x * rstd); y = out(t * w): diffusers' RMSNorm
};

// Which elements RoPE rotates together.
enum class Pairing : unsigned char {
  Half,         // (x[i], x[i + D/2]): rotate-half, the seed
  Interleaved,  // (x[2i], x[2i + 1]): adjacent pairs, diffusers' Qwen-Image
};

// The order of a 4-D q/k tensor's dims.
enum class Layout : unsigned char {
  BSHD,  // [batch, sequence, heads, head_dim]: diffusers
  BHSD,  // [batch, heads, sequence, head_dim]
};

// qk_rmsnorm_forward / _backward.
struct RmsNormOptions {
  float eps = 1e-6f;                 // added to the mean square: finite and >= 0 (Error "eps")
  NormMode mode = NormMode::Single;  // which roundings the forward (and so dw) performs
};

// multi_axis_rope_forward / _backward.
struct RopeOptions {
  Pairing pairing = Pairing::Interleaved;  // which elements rotate together
  Layout layout = Layout::BSHD;            // which dim of x is the sequence (the table row)
};

// qk_norm_rope_forward / _backward: the norm's and RoPE's options, and how many leading
// sequence positions are text (they take the text weights; the rest the image weights).
struct QkNormRopeOptions {
  float eps = 1e-6f;                       // as RmsNormOptions::eps
  NormMode mode = NormMode::Diffusers;     // as RmsNormOptions::mode (default: diffusers')
  Pairing pairing = Pairing::Interleaved;  // as RopeOptions::pairing
  Layout layout = Layout::BSHD;            // as RopeOptions::layout
  std::int64_t text_len = 0;               // 0 to S (Error "text_len" otherwise)
};

// The activation linear applies after its bias (docs/contract.md section 10).
enum class Activation : unsigned char {
  None,
  GeluTanh,  // tanh-approximated GELU: diffusers' FeedForward(activation_fn="gelu-approximate")
  Silu,      // x * sigmoid(x)
};

// linear_forward / _backward.
struct LinearOptions {
  Activation activation = Activation::None;
};

// attention_forward / _backward: which dims of q, k, v (and the outputs) are the
// sequence and the heads.
struct AttentionOptions {
  Layout layout = Layout::BSHD;  // diffusers' processors hold [B, S, H, D]; SDPA takes BHSD
};

// adaln_modulation_forward / _backward.
struct AdaLnOptions {
  float eps = 1e-6f;                    // added to the variance: finite and >= 0 (Error "eps")
  NormMode mode = NormMode::Diffusers;  // which roundings the forward (and so dscale) performs
};

// activation_forward / _backward: the elementwise activation (docs/contract.md section 14).
struct ActivationOptions {
  Activation activation = Activation::Silu;
};

// flow_sde_step / flow_sde_logp: one step of Flow-GRPO's SDE sampler from sigma to
// sigma_prev (docs/contract.md section 15). sigma and sigma_max have no default: left at
// 0 they are refused (Error "sigma", "sigma_max").
struct FlowSdeOptions {
  float sigma = 0.0f;        // this step's sigma, in (0, 1]
  float sigma_prev = 0.0f;   // the next step's, in [0, sigma): 0 for the last step
  float noise_level = 0.7f;  // Flow-GRPO's default; finite and > 0
  float sigma_max = 0.0f;    // the scheduler's sigmas[1], standing in for sigma = 1; in (0, 1)
};

// Which way latent_normalize maps the VAE's latents (docs/contract.md section 16), each
// as Qwen-Image's pipelines write it.
enum class LatentTransform : unsigned char {
  Normalize,    // (z - mean) / std: the edit pipeline's encoded image latents
  Denormalize,  // z / (1 / std) + mean: the latents the pipelines hand the VAE's decoder
};

// latent_normalize_forward / _backward.
struct LatentNormalizeOptions {
  LatentTransform transform = LatentTransform::Normalize;
};

// true_cfg_forward / _backward: the guidance scale (the pipelines' true_cfg_scale).
struct TrueCfgOptions {
  float scale = 4.0f;  // Qwen-Image's default; finite (Error "scale")
};

// adaln_gate_residual_forward / _backward.
struct GateResidualOptions {
  NormMode mode = NormMode::Diffusers;  // whether the forward rounds gate * y before the add
};

// The names the trace, the CLI and the Python package use: "single"/"diffusers",
// "half"/"interleaved", "bshd"/"bhsd" (the Python package's option strings).
const char* norm_mode_name(NormMode m);
const char* pairing_name(Pairing p);
const char* layout_name(Layout l);
// "none", "gelu_tanh", "silu".
const char* activation_name(Activation a);
// "normalize", "denormalize".
const char* latent_transform_name(LatentTransform t);

// The value whose name (above) is `text`; otherwise an Error naming `argument` (as the
// front end spells it: "--layout", "layout"), the choices and `text`. The names and their
// order come from one list, the op's descriptor, for every front end.
NormMode norm_mode_from_name(std::string_view text, const std::string& argument = "mode");
Pairing pairing_from_name(std::string_view text, const std::string& argument = "pairing");
Layout layout_from_name(std::string_view text, const std::string& argument = "layout");
Activation activation_from_name(std::string_view text, const std::string& argument = "activation");
LatentTransform latent_transform_from_name(std::string_view text,
                                           const std::string& argument = "transform");

}  // namespace kernel_align
