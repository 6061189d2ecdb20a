# SPDX-License-Identifier: Apache-2.0
# TpBackends.cmake - the backend registries, generated from one file per
# backend folder (docs/backends.md).
#
# Each transport/<name>/backend.cmake and channel/<name>/backend.cmake calls
#
#   tp_backend(NAME tcp            # the ops' name, what users ask for
#              ORDER 20            # preference, lower = better (unique)
#              OPS tp__transport_tcp_ops   # the ops table it defines
#              SOURCES tcp.c conn.c        # relative to its folder
#              [CONDITION TP_HAVE_UCX])    # built only when this is true
#
# tp_backends_collect(KIND) (KIND transport or channel, called from that
# folder's CMakeLists.txt) reads them all, adds the sources of the enabled
# ones to TP_SOURCES, and writes gen/tp_<KIND>_list.inc: the extern
# declarations and the table, best first, that <KIND>/registry.c includes.
# Backends with a CONDITION are optional features: their names join
# tp_build_features(), `tpipe info`, `tpipe --version` and pkg-config's
# `features` (global property TP_BACKEND_FEATURES, in registry order,
# transports first).

function(tp_backend)
  cmake_parse_arguments(B "" "NAME;ORDER;OPS;CONDITION" "SOURCES" ${ARGN})
  if(B_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "${TP_BACKEND_FILE}: tp_backend: unknown arguments "
            "'${B_UNPARSED_ARGUMENTS}'")
  endif()
  foreach(f NAME ORDER OPS SOURCES)
    if(NOT B_${f})
      message(FATAL_ERROR "${TP_BACKEND_FILE}: tp_backend: ${f} missing")
    endif()
  endforeach()
  if(NOT B_NAME MATCHES "^[a-z][a-z0-9_]*$" OR NOT B_OPS MATCHES
     "^tp__[a-z0-9_]+_ops$" OR NOT B_ORDER MATCHES "^[0-9]+$")
    message(FATAL_ERROR "${TP_BACKEND_FILE}: tp_backend: NAME must be "
            "[a-z][a-z0-9_]*, OPS tp__*_ops, ORDER a number (got "
            "'${B_NAME}', '${B_OPS}', '${B_ORDER}')")
  endif()
  string(LENGTH "${B_NAME}" len)
  if(len GREATER 31)
    message(FATAL_ERROR "${TP_BACKEND_FILE}: tp_backend: NAME '${B_NAME}' "
            "is longer than the wire's 31 bytes")
  endif()
  foreach(f NAME ORDER OPS CONDITION SOURCES)
    set(TP_BACKEND_${f} "${B_${f}}" PARENT_SCOPE)
  endforeach()
  set(TP_BACKEND_DECLARED 1 PARENT_SCOPE)
endfunction()

function(tp_backends_collect kind)
  # CONFIGURE_DEPENDS: a new backend folder re-runs configure. (Not in
  # script mode, where tests/layers/backends_check.sh runs this.)
  set(dep CONFIGURE_DEPENDS)
  if(CMAKE_SCRIPT_MODE_FILE)
    set(dep "")
  endif()
  file(GLOB files ${dep} ${CMAKE_CURRENT_SOURCE_DIR}/*/backend.cmake)
  list(SORT files)
  set(entries "")
  set(names "")
  set(orders "")
  foreach(file ${files})
    get_filename_component(dir ${file} DIRECTORY)
    foreach(f NAME ORDER OPS CONDITION SOURCES DECLARED)
      unset(TP_BACKEND_${f})
    endforeach()
    set(TP_BACKEND_FILE ${file})
    include(${file})
    if(NOT TP_BACKEND_DECLARED)
      message(FATAL_ERROR "${file}: does not call tp_backend()")
    endif()
    if(TP_BACKEND_NAME IN_LIST names)
      message(FATAL_ERROR "${file}: ${kind} '${TP_BACKEND_NAME}' declared "
              "twice")
    endif()
    if(TP_BACKEND_ORDER IN_LIST orders)
      message(FATAL_ERROR "${file}: ${kind} ORDER ${TP_BACKEND_ORDER} is "
              "taken by another backend (orders are unique)")
    endif()
    list(APPEND names ${TP_BACKEND_NAME})
    list(APPEND orders ${TP_BACKEND_ORDER})
    set(optional 0)
    if(TP_BACKEND_CONDITION)
      set(optional 1)
      if(NOT ${TP_BACKEND_CONDITION})
        message(STATUS "${kind} ${TP_BACKEND_NAME}: not built "
                "(${TP_BACKEND_CONDITION} is false)")
        continue()
      endif()
    endif()
    # Zero-padded order first, so a plain sort puts the best first.
    string(LENGTH "${TP_BACKEND_ORDER}" olen)
    math(EXPR pad "8 - ${olen}")
    string(REPEAT "0" ${pad} zeros)
    list(APPEND entries
         "${zeros}${TP_BACKEND_ORDER}|${TP_BACKEND_NAME}|${TP_BACKEND_OPS}|${optional}")
    foreach(src ${TP_BACKEND_SOURCES})
      list(APPEND TP_SOURCES ${dir}/${src})
    endforeach()
  endforeach()
  list(SORT entries)

  set(externs "")
  set(table "")
  set(built "")
  set(always "")
  get_property(features GLOBAL PROPERTY TP_BACKEND_FEATURES)
  foreach(e ${entries})
    string(REPLACE "|" ";" e "${e}")
    list(GET e 1 name)
    list(GET e 2 ops)
    list(GET e 3 optional)
    string(APPEND externs "extern const tp_${kind}_ops ${ops};\n")
    string(APPEND table "    &${ops}, // ${name}\n")
    list(APPEND built ${name})
    if(optional)
      list(APPEND features ${name})
    else()
      list(APPEND always ${name})
    endif()
  endforeach()
  if(NOT built)
    message(FATAL_ERROR "no ${kind} backend is enabled")
  endif()
  # A context offers them all in one brochure: at most TP_WIRE_MAX_BACKENDS
  # of each kind (pipe/wire.h, the one constant; tp_context_create checks
  # it too).
  file(STRINGS ${PROJECT_SOURCE_DIR}/pipe/wire.h bound_line
       REGEX "^#define TP_WIRE_MAX_BACKENDS +[0-9]+u")
  string(REGEX MATCH "[0-9]+" bound "${bound_line}")
  list(LENGTH built nbuilt)
  if(NOT bound)
    message(FATAL_ERROR "TpBackends: TP_WIRE_MAX_BACKENDS not found in "
            "pipe/wire.h")
  elseif(nbuilt GREATER bound)
    message(FATAL_ERROR "${nbuilt} ${kind} backends are enabled, more than "
            "the ${bound} a pipe's brochure carries (TP_WIRE_MAX_BACKENDS, "
            "pipe/wire.h)")
  endif()
  set_property(GLOBAL PROPERTY TP_BACKEND_FEATURES "${features}")
  # For tests that need a name per backend: TP_<kind>_BACKENDS (built, best
  # first) and TP_<kind>_BACKENDS_ALWAYS (those without a CONDITION).
  set_property(GLOBAL PROPERTY TP_${kind}_BACKENDS "${built}")
  set_property(GLOBAL PROPERTY TP_${kind}_BACKENDS_ALWAYS "${always}")
  string(REPLACE ";" ", " built_s "${built}")
  message(STATUS "${kind} backends, best first: ${built_s}")
  file(CONFIGURE OUTPUT ${CMAKE_BINARY_DIR}/gen/tp_${kind}_list.inc
       CONTENT "// Generated by cmake/TpBackends.cmake from \
${kind}/*/backend.cmake: do not edit.
// The ${kind} backends built, best first (ORDER); included by
// ${kind}/registry.c only.
${externs}
static const tp_${kind}_ops *const ${kind}_registry[] = {
${table}};
" @ONLY)
  set(TP_SOURCES ${TP_SOURCES} PARENT_SCOPE)
endfunction()

# After every layer: gen/tp_backend_features.h, the optional backends built
# as one string literal (" ucx"), for core/version.c.
function(tp_backends_write_features)
  get_property(features GLOBAL PROPERTY TP_BACKEND_FEATURES)
  set(s "")
  foreach(f ${features})
    string(APPEND s " ${f}")
  endforeach()
  file(CONFIGURE OUTPUT ${CMAKE_BINARY_DIR}/gen/tp_backend_features.h
       CONTENT "// Generated by cmake/TpBackends.cmake: do not edit.
// The optional backends built (those with a CONDITION), registry order.
#define TP_BACKEND_FEATURES \"${s}\"
" @ONLY)
endfunction()
