// Planted: a plain float multiply whose product is stored before any add, and a plain
// add of loaded values. nvcc cannot fuse them in PTX, so it emits bare mul.f32 and
// add.f32, which carry no rounding modifier: ptxas may still contract them with a
// neighbour into FFMA. The gate must refuse them.
__global__ void planted_bare_mul(const float* a, const float* b, float* product, float* sum) {
  const int i = static_cast<int>(threadIdx.x);
  product[i] = a[i] * b[i];
  sum[i] = a[i] + b[i];
}
