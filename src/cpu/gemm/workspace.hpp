// A float buffer kept between calls (one per thread: thread_local), grown as needed, so
// that a warm call allocates nothing and touches no fresh page. 64-byte aligned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

namespace kernel_align::cpu {

class Workspace {
 public:
  float* get(std::int64_t count) {
    if (count > size_) {
      data_.reset(static_cast<float*>(
          ::operator new[](static_cast<std::size_t>(count) * sizeof(float), std::align_val_t{64})));
      size_ = count;
    }
    return data_.get();
  }

 private:
  struct AlignedFree {
    void operator()(float* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::unique_ptr<float[], AlignedFree> data_;
  std::int64_t size_ = 0;
};

}  // namespace kernel_align::cpu
