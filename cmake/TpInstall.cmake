# SPDX-License-Identifier: Apache-2.0
# Install rules: public headers, libtpipe.so (with SONAME) and libtpipe.a, a
# pkg-config file and a CMake package, so that consumers can write either
#
#   find_package(tpipe 0.1 REQUIRED)
#   target_link_libraries(app PRIVATE tpipe::tpipe)        # or tpipe_static
#
# or `cc app.c $(pkg-config --cflags --libs tpipe)`. See docs/building.md.
#
# Components: Runtime (the versioned shared library) and Development
# (headers, libtpipe.so link, libtpipe.a, tpipe.pc, CMake package).
include(CMakePackageConfigHelpers)

set(TP_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/tpipe)

# ---- headers -------------------------------------------------------------
# Only include/tpipe/ is public (STYLE.md §3), plus the generated version.h.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/tpipe/
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tpipe
        COMPONENT Development
        FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_BINARY_DIR}/gen/tpipe/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tpipe
        COMPONENT Development)

# ---- libraries -----------------------------------------------------------
install(TARGETS tpipe tpipe_static EXPORT tpipeTargets
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT Runtime
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT Runtime
                NAMELINK_COMPONENT Development
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT Development
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# ---- dependencies of the static library ----------------------------------
# tpipe and tpipe_static link their dependencies PRIVATE, wrapped in
# $<BUILD_INTERFACE:...> in the top-level CMakeLists.txt: the PkgConfig::
# targets exist only in this build and cannot be exported. The shared library
# needs nothing from them at consumer link time. The static one does, so for
# each dependency we record
#   - how tpipeConfig.cmake finds it again on the consumer's machine,
#   - the imported target name the exported tpipe::tpipe_static links,
#   - its pkg-config module (Requires.private) and -l flags (Libs.private).
#
# Modules of PkgConfig::<PREFIX> targets, for multi-module prefixes where
# FindPkgConfig does not record a single <PREFIX>_MODULE_NAME.
set(_tp_pc_modules_XXHASH libxxhash)
set(_tp_pc_modules_URING liburing)
set(_tp_pc_modules_CRYPTO libcrypto)
set(_tp_pc_modules_PMIX pmix)
set(_tp_pc_modules_IBV libibverbs)
set(_tp_pc_modules_RDMACM librdmacm)
set(_tp_pc_modules_UCXPC ucx)

set(_tp_cfg_lines "")         # CMake code for tpipeConfig.cmake
set(TP_PC_REQUIRES_PRIVATE "")
set(TP_PC_LIBS_PRIVATE "")
set(TP_STATIC_DEPS_DOC "Threads")
set(_tp_install_nccl_module OFF)

foreach(dep IN LISTS TP_DEP_TARGETS)
  if(dep MATCHES "^PkgConfig::(.+)$")
    set(p ${CMAKE_MATCH_1})
    if(${p}_MODULE_NAME)
      set(mods ${${p}_MODULE_NAME})
    elseif(DEFINED _tp_pc_modules_${p})
      set(mods ${_tp_pc_modules_${p}})
    else()
      message(WARNING "TpInstall: no pkg-config module known for ${dep}; "
              "add it to _tp_pc_modules_* in cmake/TpInstall.cmake")
      continue()
    endif()
    set(libs ${${p}_LIBRARIES})
    string(REPLACE ";" " " mods_s "${mods}")
    string(REPLACE ";" " " libs_s "${libs}")
    list(APPEND _tp_cfg_lines "_tpipe_pkg_dep(${p} \"${mods_s}\" \"${libs_s}\")")
    target_link_libraries(tpipe_static INTERFACE
      "$<INSTALL_INTERFACE:$<LINK_ONLY:PkgConfig::tpipe_${p}>>")
    list(APPEND TP_PC_REQUIRES_PRIVATE ${mods})
    foreach(l IN LISTS libs)
      list(APPEND TP_PC_LIBS_PRIVATE -l${l})
    endforeach()
    list(APPEND TP_STATIC_DEPS_DOC ${mods})
  elseif(dep MATCHES "^CUDA::(.+)$")
    list(APPEND _tp_cfg_lines "find_dependency(CUDAToolkit)")
    target_link_libraries(tpipe_static INTERFACE
      "$<INSTALL_INTERFACE:$<LINK_ONLY:${dep}>>")
    list(APPEND TP_PC_LIBS_PRIVATE -l${CMAKE_MATCH_1})
    list(APPEND TP_STATIC_DEPS_DOC ${dep})
  elseif(dep STREQUAL "NCCL::nccl")
    list(APPEND _tp_cfg_lines "_tpipe_find_nccl()")
    target_link_libraries(tpipe_static INTERFACE
      "$<INSTALL_INTERFACE:$<LINK_ONLY:${dep}>>")
    list(APPEND TP_PC_LIBS_PRIVATE -lnccl)
    list(APPEND TP_STATIC_DEPS_DOC ${dep})
    set(_tp_install_nccl_module ON)
  elseif(dep MATCHES "^ucx::(.+)$")
    list(APPEND _tp_cfg_lines "find_dependency(ucx)")
    target_link_libraries(tpipe_static INTERFACE
      "$<INSTALL_INTERFACE:$<LINK_ONLY:${dep}>>")
    list(APPEND TP_PC_REQUIRES_PRIVATE ucx)
    list(APPEND TP_STATIC_DEPS_DOC ${dep})
  elseif(dep MATCHES "^-")
    # A linker flag (-lfoo, -pthread): carried as is.
    target_link_libraries(tpipe_static INTERFACE
      "$<INSTALL_INTERFACE:$<LINK_ONLY:${dep}>>")
    list(APPEND TP_PC_LIBS_PRIVATE ${dep})
    list(APPEND TP_STATIC_DEPS_DOC ${dep})
  elseif(NOT dep MATCHES "::" AND NOT TARGET "${dep}")
    # A plain library, by path (find_library: /usr/lib/.../libm.so) or by
    # name (m): exported as -l<name>, so the package does not carry a path
    # of the build machine.
    set(l "${dep}")
    if(IS_ABSOLUTE "${dep}")
      get_filename_component(l "${dep}" NAME_WE)
      string(REGEX REPLACE "^lib" "" l "${l}")
    endif()
    target_link_libraries(tpipe_static INTERFACE
      "$<INSTALL_INTERFACE:$<LINK_ONLY:${l}>>")
    list(APPEND TP_PC_LIBS_PRIVATE -l${l})
    list(APPEND TP_STATIC_DEPS_DOC lib${l})
  else()
    message(WARNING "TpInstall: dependency ${dep} has no install mapping; "
            "tpipe::tpipe_static and tpipe.pc will not carry it (see "
            "cmake/TpInstall.cmake)")
  endif()
endforeach()
list(APPEND TP_PC_LIBS_PRIVATE -pthread)
list(REMOVE_DUPLICATES _tp_cfg_lines)
list(JOIN _tp_cfg_lines "\n" TP_CONFIG_DEPS)
list(REMOVE_DUPLICATES TP_PC_REQUIRES_PRIVATE)
list(REMOVE_DUPLICATES TP_PC_LIBS_PRIVATE)
string(REPLACE ";" " " TP_PC_REQUIRES_PRIVATE "${TP_PC_REQUIRES_PRIVATE}")
string(REPLACE ";" " " TP_PC_LIBS_PRIVATE "${TP_PC_LIBS_PRIVATE}")
string(REPLACE ";" ", " TP_STATIC_DEPS_DOC "${TP_STATIC_DEPS_DOC}")

# Optional features compiled in: tpipe_FEATURES and tpipe_HAVE_<X> in the
# package, `features` in tpipe.pc.
set(TP_CONFIG_FEATURES "")
set(TP_CONFIG_HAVE "")
# The optional backends built (ucx, ...) are features too, from the same
# list as the registries (cmake/TpBackends.cmake), in the place
# core/version.c gives them: after pmix.
get_property(_tp_backend_features GLOBAL PROPERTY TP_BACKEND_FEATURES)
foreach(f URING CRYPTO PMIX BACKENDS CUDA NCCL BLAS)
  if(f STREQUAL "BACKENDS")
    list(APPEND TP_CONFIG_FEATURES ${_tp_backend_features})
    continue()
  endif()
  if(NOT DEFINED TP_HAVE_${f})
    continue()
  endif()
  if(TP_HAVE_${f})
    string(TOLOWER ${f} lf)
    list(APPEND TP_CONFIG_FEATURES ${lf})
    string(APPEND TP_CONFIG_HAVE "set(tpipe_HAVE_${f} 1)\n")
  else()
    string(APPEND TP_CONFIG_HAVE "set(tpipe_HAVE_${f} 0)\n")
  endif()
endforeach()
# tpipe_HAVE_UCX stays for packages that test it: the ucx transport.
foreach(f UCX)
  if(TP_HAVE_${f})
    string(APPEND TP_CONFIG_HAVE "set(tpipe_HAVE_${f} 1)\n")
  else()
    string(APPEND TP_CONFIG_HAVE "set(tpipe_HAVE_${f} 0)\n")
  endif()
endforeach()
string(REPLACE ";" " " TP_CONFIG_FEATURES "${TP_CONFIG_FEATURES}")

# ---- CMake package -------------------------------------------------------
install(EXPORT tpipeTargets NAMESPACE tpipe::
        DESTINATION ${TP_INSTALL_CMAKEDIR} COMPONENT Development)
configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/tpipeConfig.cmake.in
  ${PROJECT_BINARY_DIR}/gen/tpipeConfig.cmake
  INSTALL_DESTINATION ${TP_INSTALL_CMAKEDIR})
# Before 1.0 a minor release may break the API (semver), so only the same
# MAJOR.MINOR satisfies a request.
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/gen/tpipeConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/gen/tpipeConfig.cmake
              ${PROJECT_BINARY_DIR}/gen/tpipeConfigVersion.cmake
        DESTINATION ${TP_INSTALL_CMAKEDIR} COMPONENT Development)
if(_tp_install_nccl_module)
  install(FILES ${PROJECT_SOURCE_DIR}/cmake/FindNCCL.cmake
          DESTINATION ${TP_INSTALL_CMAKEDIR} COMPONENT Development)
endif()

# ---- pkg-config ----------------------------------------------------------
# The prefix is written at install time, so `cmake --install --prefix DIR`
# gives a tpipe.pc that points into DIR. The configure-time pass leaves the
# @TP_PC_PREFIX@ marker in place for the install-time pass.
foreach(d LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${d}}")
    set(TP_PC_${d} "${CMAKE_INSTALL_${d}}")
  else()
    set(TP_PC_${d} "\${prefix}/${CMAKE_INSTALL_${d}}")
  endif()
endforeach()
set(TP_PC_PREFIX "@TP_PC_PREFIX@")
configure_file(${PROJECT_SOURCE_DIR}/cmake/tpipe.pc.in
               ${PROJECT_BINARY_DIR}/gen/tpipe.pc.in @ONLY)
install(CODE "
  set(TP_PC_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
  configure_file(\"${PROJECT_BINARY_DIR}/gen/tpipe.pc.in\"
                 \"${PROJECT_BINARY_DIR}/gen/install/tpipe.pc\" @ONLY)
" COMPONENT Development)
install(FILES ${PROJECT_BINARY_DIR}/gen/install/tpipe.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT Development)
