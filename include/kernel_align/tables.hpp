// cos/sin tables of multi-axis RoPE, bit-identical on every machine: every step is
// correctly rounded to fp32 (MPFR), no platform libm is involved.
#pragma once

#include <cstdint>
#include <vector>

namespace kernel_align {

struct RopeTableSpec {
  std::vector<int> axes_dim{16, 56, 56};  // each even and positive; sum = head_dim D
  float theta = 10000.0f;
};

struct RopeTables {
  std::int64_t rows = 0;     // S
  std::int64_t columns = 0;  // D / 2
  std::vector<float> cos;    // [rows, columns] row-major
  std::vector<float> sin;
};

// positions: [rows, axes] row-major int32, one column per axis of `spec`.
// Column c of axis a (offset o_a = sum of earlier dims / 2, i = c - o_a):
//   e = fp32(2i) / fp32(dim_a); p = theta^e; inv = 1 / p; angle = fp32(pos) * inv;
//   cos = cos(angle), sin = sin(angle); each step rounded once to fp32, nearest-even.
RopeTables build_rope_tables(const std::int32_t* positions, std::int64_t rows,
                             const RopeTableSpec& spec = {});

// The fp32 inverse frequency of column i of an axis of dimension `dim`.
float rope_inverse_frequency(int i, int dim, float theta);

}  // namespace kernel_align
