#include "cpu/gemm/gemm.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "api/float_env.hpp"
#include "cpu/gemm/gemm_tile.hpp"
#include "cpu/gemm/workspace.hpp"
#include "cpu/thread_pool.hpp"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/linear.hpp"

namespace kernel_align::cpu {
namespace {

// The loop nest of a task (BLIS's, with K blocked into passes of whole leaves): for each
// group of kPanelsPerGroup B panels, for each pass of kLeavesPerPass leaves, for each B
// panel of the group, for each A panel of the block: the tile's leaves of the pass. A
// pass's part of the block's A panels (192 rows x 128 r = 96 KB) stays in L2 while the
// group's B panels use it, and a B panel's part (128 r x 32 = 16 KB) stays in L1 while
// every A panel of the block uses it; the tree's state of each tile of the block and
// group (its stack, at most linear_tree_depth(R) tiles) waits in L2 between passes.
// Measured (docs/performance.md, "2026-12-07, day"): B read from L3 once per 96 rows
// bounded the micro-kernel at about 60% of the FMA peak; 192 rows and groups of 4 panels
// read each byte of A and of B from L3 about once per 128 columns or 192 rows.
constexpr std::int64_t kBlockRows = 192;
constexpr std::int64_t kPanelsPerGroup = 4;
constexpr std::int64_t kLeavesPerPass = 4;

bool cpu_has_fma() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

const GemmPath& path_for(Isa isa) {
  switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
    case Isa::Avx512:
      return gemm_path_avx512();
    case Isa::Avx2:
      return gemm_path_avx2();
#endif
    default:
      return gemm_path_portable();
  }
}

// The micro-kernel for M rows: the main one (the path's last), except for a few rows
// (at most 16, where the call streams the weight and the padding of the main kernel's
// rows would cost compute): the kernel that pads M the least, the larger on a tie.
const GemmKernel& kernel_for(const GemmPath& path, std::int64_t m) {
  const GemmKernel& main = path.kernels[path.kernel_count - 1];
  if (m > 16) return main;
  const GemmKernel* best = &main;
  std::int64_t best_rows = (m + main.mr - 1) / main.mr * main.mr;
  for (int i = path.kernel_count - 2; i >= 0; --i) {
    const GemmKernel& k = path.kernels[i];
    const std::int64_t rows = (m + k.mr - 1) / k.mr * k.mr;
    if (rows < best_rows) {
      best = &k;
      best_rows = rows;
    }
  }
  return *best;
}

// Copies `count` elements of `m` starting at element `offset`, `step` apart, widened to
// fp32 (exact), to dst[0], dst[dst_step], ...
void widen(const detail::GemmMatrix& m, std::int64_t offset, std::int64_t step, std::int64_t count,
           float* dst, std::int64_t dst_step) {
  switch (m.dtype) {
    case DType::F32: {
      const float* src = static_cast<const float*>(m.data) + offset;
      if (step == 1 && dst_step == 1) {
        // Lines contiguous in memory (B of P V, A of P^T dO): a copy.
        std::copy(src, src + count, dst);
        break;
      }
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
    case DType::Bool:  // never a GEMM operand (validation)
      break;
  }
}

// Part [k_begin, k_end) of a panel of `width` lines of a matrix, r-major: line l (a row
// of A, a column of B), element k at dst[(k - k_begin) * width + l]; lines past `lines`
// are +0. `line_stride` and `r_stride` are the matrix's element strides along the lines
// and along r.
void pack_panel(const GemmPath& path, const detail::GemmMatrix& m, std::int64_t first_line,
                std::int64_t lines, std::int64_t line_stride, std::int64_t r_stride,
                std::int64_t k_begin, std::int64_t k_end, int width, float* dst) {
  const std::int64_t present = std::min<std::int64_t>(width, lines - first_line);
  const std::int64_t r = k_end - k_begin;
  if (r_stride == 1 && path.pack_lines != nullptr) {
    path.pack_lines({m.data, m.dtype, first_line * line_stride + k_begin, line_stride,
                     static_cast<int>(present), width, k_begin, k_end, dst});
    return;
  }
  if (r_stride <= line_stride) {
    // Each line is contiguous (or nearly) along r: read lines, scatter by `width`.
    for (std::int64_t l = 0; l < present; ++l) {
      widen(m, (first_line + l) * line_stride + k_begin * r_stride, r_stride, r, dst + l, width);
    }
  } else {
    for (std::int64_t k = 0; k < r; ++k) {
      widen(m, first_line * line_stride + (k_begin + k) * r_stride, line_stride, present,
            dst + k * width, 1);
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
  const GemmPath& path = path_for(gemm_isa(isa));
  const GemmKernel& kernel = kernel_for(path, p.m);
  const int mr = kernel.mr;
  const int nr = kernel.nr;
  const std::int64_t m_panels = (p.m + mr - 1) / mr;
  const std::int64_t n_panels = (p.n + nr - 1) / nr;
  const std::int64_t a_panel_size = p.r * mr;
  const std::int64_t b_panel_size = p.r * nr;
  const std::int64_t leaves = contract::linear_leaf_count(p.r);
  ThreadPool& pool = ThreadPool::instance();

  // The calling thread's buffers (the workers only read them during the call, through
  // the local pointers below: a thread_local named in a task would be the worker's own).
  thread_local Workspace a_space, b_space, bias_space;
  thread_local std::vector<std::uint8_t> merges;
  merges.resize(static_cast<std::size_t>(leaves));
  contract::LinearTreeSchedule schedule(p.r);
  for (std::uint8_t& count : merges)
    count = static_cast<std::uint8_t>(schedule.merges_after_leaf());
  // A local pointer: inside the tasks' lambda `merges` would name the worker's own.
  const std::uint8_t* const merge_counts = merges.data();
  float* const bias = p.bias ? bias_space.get(n_panels * nr) : nullptr;
  if (p.bias) {
    std::fill(bias, bias + n_panels * nr, 0.0f);
    widen(*p.bias, 0, p.bias->col_stride, p.n, bias, 1);
  }

  // Tasks: a block of A panels times a run of B panels. Which thread runs a task, and
  // how C is cut into tasks, change no output bit: every element's operations are its
  // tile's, and a tile is the same wherever it is computed.
  const std::int64_t panels_per_block = std::max<std::int64_t>(1, kBlockRows / mr);
  const std::int64_t m_blocks = (m_panels + panels_per_block - 1) / panels_per_block;
  // One block: each B panel serves one task, which packs it itself, pass by pass, into
  // L1 (the weight is read once, straight from the caller's memory). Else B is packed
  // once for all blocks.
  const bool pack_b_in_task = m_blocks == 1;
  // Groups serve A's reuse; one block streaming the weight reads its panels one by one
  // (more concurrent streams over the weight's rows would defeat the hardware prefetch).
  const std::int64_t panels_per_group = pack_b_in_task ? 1 : kPanelsPerGroup;
  const std::int64_t wanted_tasks = 4 * static_cast<std::int64_t>(threads);
  const std::int64_t n_runs =
      std::min(n_panels, std::max<std::int64_t>(1, (wanted_tasks + m_blocks - 1) / m_blocks));
  const std::int64_t panels_per_run = (n_panels + n_runs - 1) / n_runs;
  const std::int64_t stack_size = contract::linear_tree_depth(p.r) * mr * nr;

  float* const packed_b = pack_b_in_task ? nullptr : b_space.get(n_panels * b_panel_size);
  if (!pack_b_in_task) {
    pool.run(threads, n_panels, [&](std::int64_t panel) {
      pack_panel(path, p.b, panel * nr, p.n, p.b.col_stride, p.b.row_stride, 0, p.r, nr,
                 packed_b + panel * b_panel_size);
    });
  }
  float* const packed_a = a_space.get(m_panels * a_panel_size);
  pool.run(threads, m_panels, [&](std::int64_t panel) {
    pack_panel(path, p.a, panel * mr, p.m, p.a.row_stride, p.a.col_stride, 0, p.r, mr,
               packed_a + panel * a_panel_size);
  });

  pool.run(threads, m_blocks * n_runs, [&](std::int64_t task) {
    // Pool threads compute under the contract's floating-point environment whatever they
    // inherited (no flush-to-zero, round to nearest), as the calling thread does.
    const detail::ContractFloatEnvironment env;
    const std::int64_t block = task / n_runs;
    const std::int64_t run = task % n_runs;
    // One stack per tile of the block and group, in L2, and the B chunk a pass packs.
    thread_local Workspace stack_space, chunk_space;
    thread_local std::vector<int> depths;
    float* const stacks = stack_space.get(panels_per_group * panels_per_block * stack_size);
    float* const chunk =
        pack_b_in_task ? chunk_space.get(kLeavesPerPass * contract::kLinearLeaf * nr) : nullptr;
    depths.resize(static_cast<std::size_t>(panels_per_group * panels_per_block));
    GemmTile tile{};
    tile.r = p.r;
    tile.merges = merge_counts;
    tile.activation = p.activation;
    tile.grad = p.grad_out ? p.grad_out->data : nullptr;
    tile.grad_dtype = p.grad_out ? p.grad_out->dtype : DType::F32;
    tile.grad_row_stride = p.grad_out ? p.grad_out->row_stride : 0;
    tile.grad_col_stride = p.grad_out ? p.grad_out->col_stride : 0;
    tile.c = p.c;
    tile.c_dtype = p.c_dtype;
    tile.c_row_stride = p.c_row_stride;
    tile.c_col_stride = p.c_col_stride;
    const std::int64_t panel_end = std::min(n_panels, (run + 1) * panels_per_run);
    const std::int64_t block_end = std::min(m_panels, (block + 1) * panels_per_block);
    for (std::int64_t group = run * panels_per_run; group < panel_end; group += panels_per_group) {
      const std::int64_t group_end = std::min(panel_end, group + panels_per_group);
      std::fill(depths.begin(), depths.end(), 0);
      // Leaves in passes (at least one pass: R = 0 still stores its +0 sums).
      std::int64_t leaf = 0;
      do {
        tile.leaf_begin = leaf;
        tile.leaf_end = std::min(leaves, leaf + kLeavesPerPass);
        for (std::int64_t np = group; np < group_end; ++np) {
          tile.cols = static_cast<int>(std::min<std::int64_t>(nr, p.n - np * nr));
          tile.bias = p.bias ? bias + np * nr : nullptr;
          if (pack_b_in_task) {
            const std::int64_t k_begin = contract::linear_leaf_begin(tile.leaf_begin);
            pack_panel(path, p.b, np * nr, p.n, p.b.col_stride, p.b.row_stride, k_begin,
                       std::min(p.r, contract::linear_leaf_begin(tile.leaf_end)), nr, chunk);
            tile.b_panel = chunk;
            tile.b_first_r = k_begin;
          } else {
            tile.b_panel = packed_b + np * b_panel_size;
            tile.b_first_r = 0;
          }
          // The packed B part the next (panel, pass) reads from memory, fetched into L2 by
          // the block's first two tiles, a cache line per step (a pass's part of a panel is
          // 2 x 128 lines).
          const float* next_b = nullptr;
          if (!pack_b_in_task && np + 1 < group_end) {
            next_b = packed_b + (np + 1) * b_panel_size +
                     contract::linear_leaf_begin(tile.leaf_begin) * nr;
          } else if (!pack_b_in_task && tile.leaf_end < leaves) {
            next_b =
                packed_b + group * b_panel_size + contract::linear_leaf_begin(tile.leaf_end) * nr;
          }
          for (std::int64_t mp = block * panels_per_block; mp < block_end; ++mp) {
            const std::int64_t in_block = mp - block * panels_per_block;
            const std::int64_t in_group = (np - group) * panels_per_block + in_block;
            tile.a_panel = packed_a + mp * a_panel_size;
            tile.b_prefetch =
                next_b != nullptr && in_block < 2
                    ? next_b + in_block * kLeavesPerPass * contract::kLinearLeaf * nr / 2
                    : nullptr;
            tile.stack = stacks + in_group * stack_size;
            tile.depth = &depths[static_cast<std::size_t>(in_group)];
            tile.rows = static_cast<int>(std::min<std::int64_t>(mr, p.m - mp * mr));
            tile.c_offset = mp * mr * p.c_row_stride + np * nr * p.c_col_stride;
            tile.grad_offset = mp * mr * tile.grad_row_stride + np * nr * tile.grad_col_stride;
            kernel.run_tile(tile);
          }
        }
        leaf = tile.leaf_end;
      } while (leaf < leaves);
    }
  });
}

}  // namespace kernel_align::cpu

namespace kernel_align::cpu {

void gemm_epilogue_activation(Isa isa, contract::Activation activation, const float* z,
                              const float* dy, float* out, std::int64_t count) {
  path_for(gemm_isa(isa)).activation(activation, z, dy, out, count);
}

void gemm_attention_probabilities(Isa isa, float* row, std::int64_t n, float scale) {
  path_for(gemm_isa(isa)).attention_probabilities(row, n, scale);
}

const FlowSdeKernels& gemm_flow_sde_kernels(Isa isa) {
  return path_for(gemm_isa(isa)).flow_sde;
}

LatentNormalizeRow gemm_latent_normalize_row(Isa isa) {
  return path_for(gemm_isa(isa)).latent_normalize;
}

const LatentPackPairs& gemm_latent_pack_pairs(Isa isa) {
  return path_for(gemm_isa(isa)).latent_pack_pairs;
}

}  // namespace kernel_align::cpu
