// cos/sin tables of multi-axis RoPE, bit-identical on every machine: every step is
// correctly rounded to fp32 (MPFR), no platform libm is involved.
#pragma once

#include <cstdint>
#include <vector>

namespace kernel_align {

// The rotary embedding's axes and base: Qwen-Image's (16, 56, 56) and 10000 by default.
struct RopeTableSpec {
  // One dim per axis (frame, height, width), at least one axis; each even, 2 to 4096, the
  // sum (the head dim D) at most 4096 (Error "spec.axes_dim[a]" or "spec.axes_dim").
  std::vector<int> axes_dim{16, 56, 56};
  float theta = 10000.0f;  // finite and > 0 (Error "spec.theta")
};

// The tables build_rope_tables returns, in the form the ops take (fp32 [S, D/2]).
struct RopeTables {
  std::int64_t rows = 0;     // S
  std::int64_t columns = 0;  // D / 2
  std::vector<float> cos;    // [rows, columns] row-major
  std::vector<float> sin;    // [rows, columns] row-major
};

// positions: [rows, axes] row-major int32, one column per axis of `spec`.
// Column c of axis a (offset o_a = sum of earlier dims / 2, i = c - o_a):
//   e = fp32(2i) / fp32(dim_a); p = theta^e; inv = 1 / p; angle = fp32(pos) * inv;
//   cos = cos(angle), sin = sin(angle); each step rounded once to fp32, nearest-even.
// rows: 1 to 2^31 - 1 (Error "rows"), positions not null (Error "positions"), spec as above.
RopeTables build_rope_tables(const std::int32_t* positions, std::int64_t rows,
                             const RopeTableSpec& spec = {});

// The fp32 inverse frequency of column i of an axis of dimension `dim`: 1 / theta^(2i/dim),
// as build_rope_tables computes it. Error naming dim (even, 2 to 4096), i (0 to dim/2 - 1)
// or theta (finite, > 0).
float rope_inverse_frequency(int i, int dim, float theta);

// The sinusoidal timestep embedding of diffusers' `Timesteps` (get_timestep_embedding),
// Qwen-Image's by default (256 channels, cos first, no frequency shift, scale 1000).
struct TimestepEmbeddingSpec {
  int channels = 256;                 // even, 2 to 4096 (Error "spec.channels")
  bool flip_sin_to_cos = true;        // the cos half first
  float downscale_freq_shift = 0.0f;  // channels/2 - shift > 0 (Error "spec.downscale_freq_shift")
  float scale = 1000.0f;              // finite (Error "spec.scale")
  float max_period = 10000.0f;        // finite and > 0 (Error "spec.max_period")
};

// [n, channels] fp32, row-major: row r the embedding of timesteps[r]. With h =
// channels/2, column i < h of the sin half (and of the cos half), as diffusers computes it
// in fp32, every step rounded once to fp32, nearest-even (MPFR, no libm):
//   l = ln(max_period) rounded to double, then to fp32 (torch's conversion of math.log);
//   e = -l * i; e = e / fp32(h - shift); f = exp(e); a = t * f; a = fp32(scale) * a;
//   sin(a), cos(a).
// Row r is [cos | sin] with flip_sin_to_cos, else [sin | cos]. n: 1 to 2^31 - 1 (Error
// "n"), timesteps not null (Error "timesteps") and finite (Error "timesteps[r]").
std::vector<float> build_timestep_embedding(const float* timesteps, std::int64_t n,
                                            const TimestepEmbeddingSpec& spec = {});

// The per-step constants of Flow-GRPO's SDE step of the flow-matching Euler scheduler
// (`sde_step_with_logprob`), from sigma, the next step's sigma_prev, the noise level and
// sigma_max (the scheduler's sigmas[1], which stands in for sigma where sigma = 1). With
// dt = sigma_prev - sigma, s' = (sigma = 1 ? sigma_max : sigma) and
// std^2 = sigma / (1 - s') * noise_level^2:
//   mean = x * x_scale + v * v_scale      x_scale = 1 + std^2 dt / (2 sigma)
//                                         v_scale = (1 + std^2 (1 - sigma) / (2 sigma)) dt
//   prev = mean + noise_scale * noise     noise_scale = std sqrt(-dt)
//   logp element = -(prev - mean)^2 * inverse_two_variance + log_normalizer
//                                         inverse_two_variance = 1 / (2 std^2 (-dt))
//                                         log_normalizer = -ln(std sqrt(-dt)) - ln(sqrt(2 pi))
// Each constant is its expression on the fp32 inputs computed in MPFR at 256 bits (relative
// error below 2^-250), then rounded once to fp32, nearest-even: no libm, so the same bits on
// every machine.
struct FlowSdeCoefficients {
  float x_scale;
  float v_scale;
  float noise_scale;
  float inverse_two_variance;
  float log_normalizer;
};

// The constants of the step from sigma to sigma_prev (above). Errors name sigma (in (0, 1]),
// sigma_prev (in [0, sigma)), noise_level (finite, > 0) and sigma_max (in (0, 1)).
FlowSdeCoefficients flow_sde_coefficients(float sigma, float sigma_prev, float noise_level,
                                          float sigma_max);

}  // namespace kernel_align
