// The GEMM exception of the PTX gate (--fma-in, --fma-count): `gemm_leaves` holds 8
// explicit __fmaf_rn (the unrolled loop), the only fma the gate then allows. Planted:
// PLANT_OTHER adds a kernel `other` with one __fmaf_rn, refused as fma; PLANT_CONTRACTION
// adds a bare a * b + acc to gemm_leaves, which --fmad=true contracts into a ninth
// fma.rn.f32, refused as fma-count.
extern "C" __global__ void gemm_leaves(const float* a, float* out) {
  float acc = 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k) acc = __fmaf_rn(a[k], a[k + 8], acc);
#if defined(PLANT_CONTRACTION)
  acc = a[16] * a[17] + acc;
#endif
  out[0] = acc;
}

#if defined(PLANT_OTHER)
extern "C" __global__ void other(const float* a, float* out) {
  out[0] = __fmaf_rn(a[0], a[1], a[2]);
}
#endif
