# Defines kernel_align::mpfr, MPFR and GMP as one imported target: by pkg-config, or
# else in CMAKE_PREFIX_PATH / the system paths (machines without pkg-config or mpfr.pc:
# scripts/gpu_check.sh brings unpacked packages). Used by the build (CMakeLists.txt) and
# by the installed package's config (the static library needs MPFR at a consumer's link).
# GLOBAL: a project that uses kernel-align through add_subdirectory links it from its own
# directory, which must see the target too.
if(TARGET kernel_align::mpfr)
  return()
endif()
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(KERNEL_ALIGN_MPFR_PC QUIET IMPORTED_TARGET GLOBAL mpfr)
endif()
add_library(kernel_align::mpfr INTERFACE IMPORTED GLOBAL)
if(TARGET PkgConfig::KERNEL_ALIGN_MPFR_PC)
  target_link_libraries(kernel_align::mpfr INTERFACE PkgConfig::KERNEL_ALIGN_MPFR_PC)
else()
  find_path(MPFR_INCLUDE_DIR mpfr.h REQUIRED)
  find_path(GMP_INCLUDE_DIR gmp.h PATH_SUFFIXES ${CMAKE_LIBRARY_ARCHITECTURE} REQUIRED)
  find_library(MPFR_LIBRARY mpfr REQUIRED)
  find_library(GMP_LIBRARY gmp REQUIRED)
  target_include_directories(kernel_align::mpfr INTERFACE ${MPFR_INCLUDE_DIR} ${GMP_INCLUDE_DIR})
  target_link_libraries(kernel_align::mpfr INTERFACE ${MPFR_LIBRARY} ${GMP_LIBRARY})
  message(STATUS "kernel-align: MPFR without pkg-config: ${MPFR_LIBRARY}")
endif()
