#include "cpu/gemm/gemm.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

#include "cpu/gemm/gemm_tile.hpp"
#include "cpu/thread_pool.hpp"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/linear.hpp"

namespace kernel_align::cpu {
namespace {

// Rows of A that one task keeps in L2 (a block of A panels) while it walks its B panels:
// 24 rows x 3072 r x 4 bytes is 288 KB, beside one B panel of 3072 x 32 x 4 = 384 KB
// (measured on a 2 MB L2: 24 rows ran slightly faster than 12, 48 or 96).
constexpr std::int64_t kBlockRows = 24;
// Leaves of r one pass over a block's tiles covers: the B panel's part, 128 r x 32 x 4 =
// 16 KB, then stays in L1 while every A panel of the block uses it.
constexpr std::int64_t kLeavesPerPass = 4;

struct AlignedFree {
  void operator()(float* p) const { ::operator delete[](p, std::align_val_t{64}); }
};
using AlignedFloats = std::unique_ptr<float[], AlignedFree>;

AlignedFloats allocate_floats(std::int64_t count) {
  return AlignedFloats(static_cast<float*>(
      ::operator new[](static_cast<std::size_t>(std::max<std::int64_t>(count, 1)) * sizeof(float),
                       std::align_val_t{64})));
}

bool cpu_has_fma() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

const GemmKernel& kernel_for(Isa isa) {
  switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
    case Isa::Avx512:
      return gemm_kernel_avx512();
    case Isa::Avx2:
      return gemm_kernel_avx2();
#endif
    default:
      return gemm_kernel_portable();
  }
}

// Copies `count` elements of `m` starting at element `offset`, `step` apart, widened to
// fp32 (exact), to dst[0], dst[dst_step], ...
void widen(const detail::GemmMatrix& m, std::int64_t offset, std::int64_t step, std::int64_t count,
           float* dst, std::int64_t dst_step) {
  switch (m.dtype) {
    case DType::F32: {
      const float* src = static_cast<const float*>(m.data) + offset;
      for (std::int64_t i = 0; i < count; ++i) dst[i * dst_step] = src[i * step];
      break;
    }
    case DType::BF16: {
      const auto* src = static_cast<const std::uint16_t*>(m.data) + offset;
      for (std::int64_t i = 0; i < count; ++i)
        dst[i * dst_step] = contract::bf16_to_f32(src[i * step]);
      break;
    }
    case DType::F16: {
      const auto* src = static_cast<const std::uint16_t*>(m.data) + offset;
      for (std::int64_t i = 0; i < count; ++i)
        dst[i * dst_step] = contract::f16_to_f32(src[i * step]);
      break;
    }
  }
}

// A panel of `width` lines of a matrix, r-major: line l (a row of A, a column of B),
// element k at dst[k * width + l]; lines past `lines` are +0. `line_stride` and
// `r_stride` are the matrix's element strides along the lines and along r.
void pack_panel(const detail::GemmMatrix& m, std::int64_t first_line, std::int64_t lines,
                std::int64_t line_stride, std::int64_t r_stride, std::int64_t r, int width,
                float* dst) {
  const std::int64_t present = std::min<std::int64_t>(width, lines - first_line);
  if (r_stride <= line_stride) {
    // Each line is contiguous (or nearly) along r: read lines, scatter by `width`.
    for (std::int64_t l = 0; l < present; ++l) {
      widen(m, (first_line + l) * line_stride, r_stride, r, dst + l, width);
    }
  } else {
    for (std::int64_t k = 0; k < r; ++k) {
      widen(m, first_line * line_stride + k * r_stride, line_stride, present, dst + k * width, 1);
    }
  }
  for (std::int64_t l = present; l < width; ++l) {
    for (std::int64_t k = 0; k < r; ++k) dst[k * width + l] = 0.0f;
  }
}

}  // namespace

Isa gemm_isa(Isa requested) {
  if (requested == Isa::Avx2 && !cpu_has_fma()) return Isa::Portable;
  return requested;
}

void gemm(const detail::GemmProblem& p, int threads, Isa isa) {
  if (p.m == 0 || p.n == 0) return;
  const GemmKernel& kernel = kernel_for(gemm_isa(isa));
  const int mr = kernel.mr;
  const int nr = kernel.nr;
  const std::int64_t m_panels = (p.m + mr - 1) / mr;
  const std::int64_t n_panels = (p.n + nr - 1) / nr;
  const std::int64_t a_panel_size = p.r * mr;
  const std::int64_t b_panel_size = p.r * nr;
  ThreadPool& pool = ThreadPool::instance();

  const AlignedFloats packed_b = allocate_floats(n_panels * b_panel_size);
  pool.run(threads, n_panels, [&](std::int64_t panel) {
    pack_panel(p.b, panel * nr, p.n, p.b.col_stride, p.b.row_stride, p.r, nr,
               packed_b.get() + panel * b_panel_size);
  });
  const AlignedFloats packed_a = allocate_floats(m_panels * a_panel_size);
  pool.run(threads, m_panels, [&](std::int64_t panel) {
    pack_panel(p.a, panel * mr, p.m, p.a.row_stride, p.a.col_stride, p.r, mr,
               packed_a.get() + panel * a_panel_size);
  });
  std::vector<float> bias;
  if (p.bias) {
    bias.assign(static_cast<std::size_t>(n_panels * nr), 0.0f);
    widen(*p.bias, 0, p.bias->col_stride, p.n, bias.data(), 1);
  }
  std::vector<std::uint8_t> merges(static_cast<std::size_t>(contract::linear_leaf_count(p.r)));
  contract::LinearTreeSchedule schedule(p.r);
  for (std::uint8_t& count : merges)
    count = static_cast<std::uint8_t>(schedule.merges_after_leaf());

  // Tasks: a block of A panels times a run of B panels. Which thread runs a task, and
  // how C is cut into tasks, change no output bit: every element's operations are its
  // tile's, and a tile is the same wherever it is computed.
  const std::int64_t panels_per_block = std::max<std::int64_t>(1, kBlockRows / mr);
  const std::int64_t m_blocks = (m_panels + panels_per_block - 1) / panels_per_block;
  const std::int64_t wanted_tasks = 4 * static_cast<std::int64_t>(threads);
  const std::int64_t n_runs =
      std::min(n_panels, std::max<std::int64_t>(1, (wanted_tasks + m_blocks - 1) / m_blocks));
  const std::int64_t panels_per_run = (n_panels + n_runs - 1) / n_runs;
  const std::int64_t stack_size = contract::linear_tree_depth(p.r) * mr * nr;
  const std::int64_t leaves = contract::linear_leaf_count(p.r);

  pool.run(threads, m_blocks * n_runs, [&](std::int64_t task) {
    const std::int64_t block = task / n_runs;
    const std::int64_t run = task % n_runs;
    // One stack per tile of the block, in L2.
    const AlignedFloats stacks = allocate_floats(panels_per_block * stack_size);
    std::vector<int> depths(static_cast<std::size_t>(panels_per_block));
    GemmTile tile{};
    tile.r = p.r;
    tile.merges = merges.data();
    tile.activation = p.activation;
    tile.c = p.c;
    tile.c_dtype = p.c_dtype;
    tile.c_row_stride = p.c_row_stride;
    tile.c_col_stride = p.c_col_stride;
    const std::int64_t panel_end = std::min(n_panels, (run + 1) * panels_per_run);
    const std::int64_t block_end = std::min(m_panels, (block + 1) * panels_per_block);
    for (std::int64_t np = run * panels_per_run; np < panel_end; ++np) {
      tile.b_panel = packed_b.get() + np * b_panel_size;
      tile.cols = static_cast<int>(std::min<std::int64_t>(nr, p.n - np * nr));
      tile.bias = p.bias ? bias.data() + np * nr : nullptr;
      std::fill(depths.begin(), depths.end(), 0);
      // Leaves in passes (at least one pass: R = 0 still stores its +0 sums).
      std::int64_t leaf = 0;
      do {
        tile.leaf_begin = leaf;
        tile.leaf_end = std::min(leaves, leaf + kLeavesPerPass);
        for (std::int64_t mp = block * panels_per_block; mp < block_end; ++mp) {
          const std::int64_t in_block = mp - block * panels_per_block;
          tile.a_panel = packed_a.get() + mp * a_panel_size;
          tile.stack = stacks.get() + in_block * stack_size;
          tile.depth = &depths[static_cast<std::size_t>(in_block)];
          tile.rows = static_cast<int>(std::min<std::int64_t>(mr, p.m - mp * mr));
          tile.c_offset = mp * mr * p.c_row_stride + np * nr * p.c_col_stride;
          kernel.run_tile(tile);
        }
        leaf = tile.leaf_end;
      } while (leaf < leaves);
    }
  });
}

}  // namespace kernel_align::cpu
