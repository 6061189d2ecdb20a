# SPDX-License-Identifier: Apache-2.0
# BLAS for autograd's matmul (cblas_sgemm/dgemm): TP_WITH_BLAS=AUTO|ON|OFF.
# Loaded at run time (autograd/blas.c); the build needs cblas.h only.
# Looks for OpenBLAS through pkg-config (openblas, then cblas). Sets
# TP_HAVE_BLAS; autograd/ passes it to its own sources as a compile
# definition, and the imported target joins TP_DEP_TARGETS.
set(TP_WITH_BLAS AUTO CACHE STRING "Use BLAS: AUTO|ON|OFF")
set_property(CACHE TP_WITH_BLAS PROPERTY STRINGS AUTO ON OFF)

set(TP_BLAS_OK 0)
set(TP_BLAS_DETAIL "")
if(NOT TP_WITH_BLAS STREQUAL "OFF")
  pkg_check_modules(TPBLAS IMPORTED_TARGET openblas)
  if(TPBLAS_FOUND)
    set(TP_BLAS_DETAIL "OpenBLAS ${TPBLAS_VERSION}")
  else()
    pkg_check_modules(TPBLAS IMPORTED_TARGET cblas)
    if(TPBLAS_FOUND)
      set(TP_BLAS_DETAIL "cblas ${TPBLAS_VERSION}")
    endif()
  endif()
  if(TPBLAS_FOUND)
    # The header must be there too (a runtime-only package has none).
    find_path(TP_CBLAS_INCLUDE cblas.h HINTS ${TPBLAS_INCLUDE_DIRS})
    if(TP_CBLAS_INCLUDE)
      set(TP_BLAS_OK 1)
    endif()
  endif()
endif()
if(TP_BLAS_OK)
  set(TP_BLAS_DETAIL "${TP_BLAS_DETAIL}, loaded at first matmul")
endif()
tp_feature(BLAS TP_BLAS_OK "${TP_BLAS_DETAIL}")
# Not linked: autograd/blas.c loads it with dlopen at the first matmul,
# after choosing OpenBLAS's kernels for this CPU (OPENBLAS_CORETYPE); only
# the header is needed here.
if(TP_HAVE_BLAS)
  include_directories(${TP_CBLAS_INCLUDE})
endif()

# The tensor kernels use libm (exp, log, tanh, pow).
find_library(TP_LIBM m)
if(TP_LIBM)
  list(APPEND TP_DEP_TARGETS ${TP_LIBM})
endif()
