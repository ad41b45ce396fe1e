// Planted: contract-clean arithmetic compiled with -ftz=true. Every fp32 instruction
// then carries .ftz (subnormals flushed to zero), which the gate must refuse.
__global__ void planted_ftz(const float* a, const float* b, float* out) {
  const int i = static_cast<int>(threadIdx.x);
  const float p = __fmul_rn(a[i], b[i]);
  const float s = __fadd_rn(p, a[i]);
  out[i] = __fsqrt_rn(__fdiv_rn(s, b[i]));
}
