# `cmake --install build [--prefix P]`: the public headers, the libraries, gzrun, gz-train and
# gz-bench, and a CMake package so that another project does
#
#   find_package(Guozhuang REQUIRED)                   # Guozhuang::torch (+ train) where LibTorch is found
#   target_link_libraries(app PRIVATE Guozhuang::torch)
#   find_package(Guozhuang REQUIRED COMPONENTS comm)   # LibTorch-free: Guozhuang::comm, never looks for LibTorch
#
# Two export sets, so a LibTorch-free consumer never needs LibTorch: GuozhuangCommTargets (core,
# store, comm, the gzrun executable) and GuozhuangTorchTargets (torch, train). The libraries are
# static (the default); their dependencies (Gloo, MPI, LibTorch, yaml-cpp, ...) are found again by
# GuozhuangConfig.cmake. examples/cpp is a consumer, built by scripts/test.sh.
include(CMakePackageConfigHelpers)
set(GZ_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/Guozhuang)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/gz DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS gz_core gz_store gz_comm EXPORT GuozhuangCommTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS gzrun gz-bench EXPORT GuozhuangCommTargets RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT GuozhuangCommTargets NAMESPACE Guozhuang:: DESTINATION ${GZ_INSTALL_CMAKEDIR})
if(GZ_WITH_TORCH)
  install(TARGETS gz_torch gz_train EXPORT GuozhuangTorchTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(TARGETS gz-train EXPORT GuozhuangTorchTargets RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  install(EXPORT GuozhuangTorchTargets NAMESPACE Guozhuang:: DESTINATION ${GZ_INSTALL_CMAKEDIR})
endif()

# What the config must find again for the consumer (the dependencies the libraries were built with).
set(GZ_PACKAGE_WITH_GLOO ${GZ_WITH_GLOO})
set(GZ_PACKAGE_WITH_MPI ${GZ_WITH_MPI})
set(GZ_PACKAGE_WITH_NCCL ${GZ_WITH_NCCL})
set(GZ_PACKAGE_WITH_TORCH ${GZ_WITH_TORCH})
set(GZ_PACKAGE_TORCH_VERSION "${Torch_VERSION}")
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/GuozhuangConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/GuozhuangConfig.cmake INSTALL_DESTINATION ${GZ_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/GuozhuangConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/GuozhuangConfig.cmake ${PROJECT_BINARY_DIR}/GuozhuangConfigVersion.cmake
        DESTINATION ${GZ_INSTALL_CMAKEDIR})

# A Debian package of the same install: `cpack -G DEB --config build/CPackConfig.cmake`.
set(CPACK_PACKAGE_NAME guozhuang)
set(CPACK_PACKAGE_VENDOR "Guozhuang")
set(CPACK_PACKAGE_CONTACT "Guozhuang maintainers")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Distributed data-parallel training for C++/LibTorch (headers, static libraries, gzrun)")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS OFF)  # the -dev dependencies below pull in every run-time library
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libgloo-dev, libopenmpi-dev, libssl-dev, nlohmann-json3-dev")
if(GZ_WITH_TORCH)
  set(CPACK_DEBIAN_PACKAGE_DEPENDS "${CPACK_DEBIAN_PACKAGE_DEPENDS}, libtorch-dev, libyaml-cpp-dev, libpng-dev, libjpeg-dev, zlib1g-dev")
endif()
include(CPack)
