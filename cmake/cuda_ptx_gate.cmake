# The PTX gate (docs/ptx-gate.md): compiles a CUDA source to PTX for one virtual
# architecture and adds a ctest that runs scripts/ptx_gate.py on it.
#
#   ka_ptx_gate(NAME <name> SOURCE <file.cu> ARCH <NN[a|f]>
#               [INCLUDES <dir>...] [OPTIONS <nvcc flag>...]
#               [FMA_IN <regex>... [FMA_COUNT <n>...]]
#               [WILL_FAIL [EXPECT <rule>...]])
#
# - Output: ${CMAKE_CURRENT_BINARY_DIR}/<name>.compute_<ARCH>.ptx, built as part of ALL
#   by the target ptx_gate_<name>_ptx (header dependencies tracked through nvcc -MD).
# - nvcc is CMAKE_CUDA_COMPILER (enable_language(CUDA) or check_language(CUDA) first);
#   CMAKE_CUDA_HOST_COMPILER, when set, is passed as -ccbin.
# - Flags: KERNEL_ALIGN_CUDA_DEVICE_FLAGS (the project's device flags, defined below
#   unless the includer defined it first), then OPTIONS. An OPTIONS flag replaces the
#   default flag of the same option (--fmad=true replaces --fmad=false, -O0 replaces -O3);
#   --use_fast_math also drops the defaults it would contradict (fmad, ftz, prec-div,
#   prec-sqrt).
# - Test ptx_gate_<name>: python3 scripts/ptx_gate.py <file.ptx>. With WILL_FAIL it is
#   expected to fail (ctest WILL_FAIL). EXPECT adds ptx_gate_<name>_expect, which passes
#   only if the gate reports each of these rules (fma, contractible, approx, ftz,
#   div.full, mma, float-atomic, fma-count): a WILL_FAIL test alone would also pass on a
#   gate that crashed or a missing file.
# - FMA_IN: fma.rn.f32 allowed inside the PTX functions whose name matches one of these
#   regexes (the linear tree's explicit __fmaf_rn leaves), refused elsewhere as always;
#   FMA_COUNT: each such function must hold exactly <n> of them, and one must exist per
#   regex; one count for every regex, or one per regex, in order (scripts/ptx_gate.py
#   --fma-in, --fma-count).
include_guard(GLOBAL)

if(NOT DEFINED KERNEL_ALIGN_CUDA_DEVICE_FLAGS)
  # Every fp32 operation rounded on its own (docs/contract.md): no FMA contraction,
  # subnormals kept, IEEE division and square root, never --use_fast_math.
  set(KERNEL_ALIGN_CUDA_DEVICE_FLAGS --fmad=false -ftz=false -prec-div=true -prec-sqrt=true
                                     -std=c++20 -O3)
endif()

cmake_path(SET _ka_ptx_gate_script NORMALIZE "${CMAKE_CURRENT_LIST_DIR}/../scripts/ptx_gate.py")
set(KA_PTX_GATE_SCRIPT "${_ka_ptx_gate_script}" CACHE INTERNAL "scripts/ptx_gate.py")

# The option an nvcc flag sets: "--fmad=true" -> fmad, "-O3" -> O, "-std=c++20" -> std.
function(_ka_ptx_gate_option_key flag out)
  string(REGEX REPLACE "^--?" "" key "${flag}")
  if(key MATCHES "^O[0-9s]?$" OR key MATCHES "^optimize(=|$)")
    set(key O)
  else()
    string(REGEX REPLACE "=.*$" "" key "${key}")
  endif()
  if(key STREQUAL "use-fast-math")
    set(key use_fast_math)
  endif()
  set(${out} "${key}" PARENT_SCOPE)
endfunction()

function(ka_ptx_gate)
  cmake_parse_arguments(PARSE_ARGV 0 ARG "WILL_FAIL" "NAME;SOURCE;ARCH"
                        "INCLUDES;OPTIONS;EXPECT;FMA_IN;FMA_COUNT")
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "ka_ptx_gate: unknown arguments: ${ARG_UNPARSED_ARGUMENTS}")
  endif()
  foreach(required NAME SOURCE ARCH)
    if(NOT ARG_${required})
      message(FATAL_ERROR "ka_ptx_gate: ${required} is required")
    endif()
  endforeach()
  if(NOT ARG_ARCH MATCHES "^[0-9]+[af]?$")
    message(FATAL_ERROR "ka_ptx_gate(${ARG_NAME}): ARCH takes one architecture number "
                        "(90, 90a, 100f), not '${ARG_ARCH}'; call once per architecture")
  endif()
  if(ARG_EXPECT AND NOT ARG_WILL_FAIL)
    message(FATAL_ERROR "ka_ptx_gate(${ARG_NAME}): EXPECT needs WILL_FAIL")
  endif()
  if(DEFINED ARG_FMA_COUNT AND NOT ARG_FMA_IN)
    message(FATAL_ERROR "ka_ptx_gate(${ARG_NAME}): FMA_COUNT needs FMA_IN")
  endif()
  set(gate_options "")
  foreach(regex IN LISTS ARG_FMA_IN)
    list(APPEND gate_options --fma-in "${regex}")
  endforeach()
  foreach(count IN LISTS ARG_FMA_COUNT)
    list(APPEND gate_options --fma-count "${count}")
  endforeach()
  if(NOT CMAKE_CUDA_COMPILER)
    message(FATAL_ERROR "ka_ptx_gate(${ARG_NAME}): CMAKE_CUDA_COMPILER is not set; "
                        "enable_language(CUDA) first")
  endif()

  # Defaults, less those OPTIONS overrides.
  set(overridden "")
  foreach(flag IN LISTS ARG_OPTIONS)
    _ka_ptx_gate_option_key("${flag}" key)
    list(APPEND overridden "${key}")
    if(key STREQUAL "use_fast_math")
      list(APPEND overridden fmad ftz prec-div prec-sqrt)
    endif()
  endforeach()
  set(flags "")
  foreach(flag IN LISTS KERNEL_ALIGN_CUDA_DEVICE_FLAGS)
    _ka_ptx_gate_option_key("${flag}" key)
    if(NOT key IN_LIST overridden)
      list(APPEND flags "${flag}")
    endif()
  endforeach()
  list(APPEND flags ${ARG_OPTIONS})
  if(CMAKE_CUDA_HOST_COMPILER)
    list(PREPEND flags -ccbin "${CMAKE_CUDA_HOST_COMPILER}")
  endif()
  foreach(dir IN LISTS ARG_INCLUDES)
    get_filename_component(dir "${dir}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    list(APPEND flags "-I${dir}")
  endforeach()

  # Python only where a gate is declared (the tests), not wherever this file is included.
  find_package(Python3 3.8 REQUIRED COMPONENTS Interpreter)

  get_filename_component(source "${ARG_SOURCE}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
  set(ptx "${CMAKE_CURRENT_BINARY_DIR}/${ARG_NAME}.compute_${ARG_ARCH}.ptx")
  add_custom_command(
    OUTPUT "${ptx}"
    COMMAND "${CMAKE_CUDA_COMPILER}" -ptx "--gpu-architecture=compute_${ARG_ARCH}" ${flags}
            -MD -MF "${ptx}.d" "${source}" -o "${ptx}"
    DEPENDS "${source}"
    DEPFILE "${ptx}.d"
    COMMENT "PTX gate: ${ARG_NAME} -> compute_${ARG_ARCH} PTX"
    VERBATIM)
  add_custom_target(ptx_gate_${ARG_NAME}_ptx ALL DEPENDS "${ptx}")

  add_test(NAME ptx_gate_${ARG_NAME} COMMAND "${Python3_EXECUTABLE}" "${KA_PTX_GATE_SCRIPT}"
                                             ${gate_options} "${ptx}")
  set_tests_properties(ptx_gate_${ARG_NAME} PROPERTIES LABELS ptx_gate)
  if(ARG_WILL_FAIL)
    set_tests_properties(ptx_gate_${ARG_NAME} PROPERTIES WILL_FAIL TRUE)
  endif()
  if(ARG_EXPECT)
    set(expect "")
    foreach(rule IN LISTS ARG_EXPECT)
      list(APPEND expect --expect "${rule}")
    endforeach()
    add_test(NAME ptx_gate_${ARG_NAME}_expect
             COMMAND "${Python3_EXECUTABLE}" "${KA_PTX_GATE_SCRIPT}" ${gate_options} ${expect}
                     "${ptx}")
    set_tests_properties(ptx_gate_${ARG_NAME}_expect PROPERTIES LABELS ptx_gate)
  endif()
endfunction()
