#include <cstdint>

#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/rope.hpp"
#include "reference/kernels.hpp"
#include "reference/reference.hpp"

namespace kernel_align::reference {

void multi_axis_rope(const detail::RopeProblem& p) {
  const int half = p.d / 2;
  const bool interleaved = p.options.pairing == Pairing::Interleaved;
  const auto* cos = static_cast<const float*>(p.cos.data);
  const auto* sin = static_cast<const float*>(p.sin.data);
  const auto& is = p.in_strides;
  const auto& os = p.out_strides;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t s = 0; s < p.seq; ++s) {
      for (std::int64_t h = 0; h < p.heads; ++h) {
        const std::int64_t in_base = b * is.stride_batch + s * is.stride_seq + h * is.stride_head;
        const std::int64_t out_base = b * os.stride_batch + s * os.stride_seq + h * os.stride_head;
        for (int i = 0; i < half; ++i) {
          // Element indices of pair i within the row.
          const std::int64_t first = interleaved ? 2 * i : i;
          const std::int64_t second = interleaved ? 2 * i + 1 : i + half;
          const float a = contract::load_f32(p.in.dtype, p.in.data, in_base + first * is.stride_d);
          const float c = cos[s * p.cos.strides[0] + i * p.cos.strides[1]];
          const float sn = sin[s * p.sin.strides[0] + i * p.sin.strides[1]];
          const float bv =
              contract::load_f32(p.in.dtype, p.in.data, in_base + second * is.stride_d);
          const auto y = p.transpose ? contract::rope_rotate_transpose(a, bv, c, sn)
                                     : contract::rope_rotate(a, bv, c, sn);
          contract::store_output(p.out.dtype, p.out.data, out_base + first * os.stride_d, y.first);
          contract::store_output(p.out.dtype, p.out.data, out_base + second * os.stride_d,
                                 y.second);
        }
      }
    }
  }
}

void add_multi_axis_rope_kernels(registry::Kernels& k) {
  const auto rope = [](const detail::RopeProblem& p, registry::Execution& exec) {
    record_scalar(exec, {detail::row_count(p.in)});
    multi_axis_rope(p);
  };
  k.set<OpType::MultiAxisRope, Direction::Forward>(rope);
  k.set<OpType::MultiAxisRope, Direction::Backward>(rope);
}

}  // namespace kernel_align::reference
