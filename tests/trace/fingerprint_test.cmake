# Kernel fingerprints (docs/trace.md): the same source gives the same fingerprint on
# every run and from any checkout location; a change to a backend's source changes that
# backend's fingerprint only; a change to a contract header or to the flags changes it.
cmake_minimum_required(VERSION 3.25)

set(flags_simd "-ffp-contract=off -fno-fast-math avx2: -mavx2 -mf16c")
set(flags_reference "-ffp-contract=off -fno-fast-math")
set(flags_cuda "--fmad=false -ftz=false -prec-div=true -prec-sqrt=true")

# fingerprints(<prefix> <root> [simd flags]): sets <prefix>_simd, <prefix>_reference and
# <prefix>_cuda.
function(fingerprints prefix root)
  set(simd_flags "${flags_simd}")
  if(ARGC GREATER 2)
    set(simd_flags "${ARGV2}")
  endif()
  set(out "${WORK}/${prefix}.hpp")
  execute_process(
    COMMAND ${CMAKE_COMMAND} -DROOT=${root} -DOUT=${out} "-DSIMD_FLAGS=${simd_flags}"
            "-DREFERENCE_FLAGS=${flags_reference}" "-DCUDA_FLAGS=${flags_cuda}" -P ${SCRIPT}
    RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "fingerprint.cmake failed on ${root}")
  endif()
  file(READ "${out}" header)
  string(REGEX MATCH "kSimd\\[\\] = \"([0-9a-f]+)\"" _ "${header}")
  set(${prefix}_simd "${CMAKE_MATCH_1}" PARENT_SCOPE)
  string(REGEX MATCH "kReference\\[\\] = \"([0-9a-f]+)\"" _ "${header}")
  set(${prefix}_reference "${CMAKE_MATCH_1}" PARENT_SCOPE)
  string(REGEX MATCH "kCuda\\[\\] = \"([0-9a-f]+)\"" _ "${header}")
  set(${prefix}_cuda "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

function(expect_equal a b what)
  if(NOT "${a}" STREQUAL "${b}")
    message(FATAL_ERROR "${what}: expected equal fingerprints, got ${a} and ${b}")
  endif()
  message(STATUS "ok: ${what} (${a})")
endfunction()
function(expect_different a b what)
  if("${a}" STREQUAL "${b}")
    message(FATAL_ERROR "${what}: expected different fingerprints, both are ${a}")
  endif()
  message(STATUS "ok: ${what} (${a} -> ${b})")
endfunction()

file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

fingerprints(first "${ROOT}")
fingerprints(second "${ROOT}")
if(NOT first_simd MATCHES "^[0-9a-f]+$" OR NOT first_reference MATCHES "^[0-9a-f]+$")
  message(FATAL_ERROR "no fingerprints in the generated header")
endif()
expect_equal("${first_simd}" "${second_simd}" "simd, same source twice")
expect_equal("${first_reference}" "${second_reference}" "reference, same source twice")

# A copy of the covered files elsewhere: the same fingerprints.
set(copy "${WORK}/copy")
file(COPY "${ROOT}/include/kernel_align/contract" DESTINATION "${copy}/include/kernel_align")
file(COPY "${ROOT}/src/reference" "${ROOT}/src/cpu" "${ROOT}/src/cuda" DESTINATION "${copy}/src")
fingerprints(copied "${copy}")
expect_equal("${first_simd}" "${copied_simd}" "simd, another checkout location")
expect_equal("${first_reference}" "${copied_reference}" "reference, another checkout location")
expect_equal("${first_cuda}" "${copied_cuda}" "cuda, another checkout location")

# A change in the CUDA kernels: cuda changes, the CPU backends do not.
file(APPEND "${copy}/src/cuda/device/kernels.cuh" "// edited\n")
fingerprints(cuda_edit "${copy}")
expect_different("${copied_cuda}" "${cuda_edit_cuda}" "cuda after a kernel source edit")
expect_equal("${copied_simd}" "${cuda_edit_simd}" "simd after a cuda edit")

# A change in the simd kernels: simd changes, reference does not.
file(APPEND "${copy}/src/cpu/isa/row_kernels.hpp" "// edited\n")
fingerprints(kernel_edit "${copy}")
expect_different("${copied_simd}" "${kernel_edit_simd}" "simd after a kernel source edit")
expect_equal("${copied_reference}" "${kernel_edit_reference}" "reference after a simd edit")

# A change in a contract header: both change.
file(APPEND "${copy}/include/kernel_align/contract/rmsnorm.hpp" "// edited\n")
fingerprints(contract_edit "${copy}")
expect_different("${kernel_edit_simd}" "${contract_edit_simd}" "simd after a contract edit")
expect_different("${kernel_edit_reference}" "${contract_edit_reference}"
                 "reference after a contract edit")
expect_different("${kernel_edit_cuda}" "${contract_edit_cuda}" "cuda after a contract edit")

# Other flags: simd changes.
fingerprints(other_flags "${ROOT}" "-ffp-contract=fast avx2: -mavx2 -mf16c -mfma")
expect_different("${first_simd}" "${other_flags_simd}" "simd with other flags")
