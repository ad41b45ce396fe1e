# The CPU backend's kernels (docs/cpu-backend.md), included by src/CMakeLists.txt
# after the kernel_align target is defined. One file per instruction-set path; only
# that file gets the path's flags, and the driver picks a path at run time.
target_sources(kernel_align PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/kernels.cpp
  ${CMAKE_CURRENT_LIST_DIR}/isa/portable.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm/gemm_portable.cpp
)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  target_sources(kernel_align PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/isa/avx2.cpp
    ${CMAKE_CURRENT_LIST_DIR}/isa/avx512.cpp
  )
  # Never -mfma: the contract rounds each product before its sum.
  set(KERNEL_ALIGN_AVX2_FLAGS -mavx2 -mf16c)
  # What detect_best_isa() (src/runtime/settings.cpp) checks before it picks Avx512.
  set(KERNEL_ALIGN_AVX512_FLAGS -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mf16c)
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/isa/avx2.cpp
    PROPERTIES COMPILE_OPTIONS "${KERNEL_ALIGN_AVX2_FLAGS}")
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/isa/avx512.cpp
    PROPERTIES COMPILE_OPTIONS "${KERNEL_ALIGN_AVX512_FLAGS}")
  # The GEMM micro-kernels (gemm/), one file per path. Unlike the row kernels they use
  # fma, explicitly: the linear contract's leaves are fma chains (docs/contract.md,
  # "Linear (GEMM)"); -ffp-contract=off still keeps the compiler from fusing anything else.
  target_sources(kernel_align PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/gemm/gemm_avx2.cpp
    ${CMAKE_CURRENT_LIST_DIR}/gemm/gemm_avx512.cpp
  )
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/gemm/gemm_avx2.cpp
    PROPERTIES COMPILE_OPTIONS "${KERNEL_ALIGN_AVX2_FLAGS};-mfma")
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/gemm/gemm_avx512.cpp
    PROPERTIES COMPILE_OPTIONS "${KERNEL_ALIGN_AVX512_FLAGS};-mfma")
endif()
