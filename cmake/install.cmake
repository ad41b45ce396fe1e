# `cmake --install`: the static library with its public headers, the CMake package
# (find_package(kernel_align CONFIG) gives kernel_align::kernel_align, the same name as
# the alias inside this build), the CLI and the docs. Consumers: examples/cmake-consumer.
include(CMakePackageConfigHelpers)

# The public headers are include/kernel_align/*.hpp and the generated version.hpp;
# include/kernel_align/contract/ is the backends' arithmetic and stays inside.
file(GLOB kernel_align_public_headers CONFIGURE_DEPENDS
     ${PROJECT_SOURCE_DIR}/include/kernel_align/*.hpp)
install(FILES ${kernel_align_public_headers}
              ${PROJECT_BINARY_DIR}/include/kernel_align/version.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kernel_align)

set(package_dir ${CMAKE_INSTALL_LIBDIR}/cmake/kernel_align)
install(TARGETS kernel_align EXPORT kernel_alignTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT kernel_alignTargets NAMESPACE kernel_align:: DESTINATION ${package_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kernel_alignConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/kernel_alignConfig.cmake
                              INSTALL_DESTINATION ${package_dir})
# 0.x: a minor release may change the API (CHANGELOG.md), so only the same minor matches.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kernel_alignConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kernel_alignConfig.cmake
              ${PROJECT_BINARY_DIR}/kernel_alignConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/kernel_align_mpfr.cmake
        DESTINATION ${package_dir})

install(TARGETS kernel-align RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/CHANGELOG.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR})
