// Planted: approximate intrinsics. rsqrtf, __expf and __fdividef compile to
// rsqrt.approx, ex2.approx and div.approx; __frsqrt_rn is a software routine built on
// rsqrt.approx.ftz and fma.rn. The gate must refuse them all, even with --fmad=false.
__global__ void planted_approx(const float* a, const float* b, float* out) {
  const int i = static_cast<int>(threadIdx.x);
  out[4 * i + 0] = __frsqrt_rn(a[i]);
  out[4 * i + 1] = rsqrtf(a[i]);
  out[4 * i + 2] = __expf(a[i]);
  out[4 * i + 3] = __fdividef(a[i], b[i]);
}
