// Planted: a plain a * b + c on floats. Compiled with --fmad=true (nvcc's default) the
// multiply and add are fused into fma.rn.f32, which the gate must refuse.
__global__ void planted_contractible(const float* a, const float* b, const float* c, float* out) {
  const int i = static_cast<int>(threadIdx.x);
  out[i] = a[i] * b[i] + c[i];
}
