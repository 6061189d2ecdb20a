# SPDX-License-Identifier: Apache-2.0
# tp_warning_flags: STYLE.md §12 warnings (+ -Werror with TP_WERROR).
# tp_sanitize_flags: TP_SANITIZE (e.g. "address,undefined" or "thread").
add_library(tp_warning_flags INTERFACE)
target_compile_options(tp_warning_flags INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wundef -Wstrict-prototypes
  -Wmissing-prototypes -Wno-unused-parameter)
if(TP_WERROR)
  target_compile_options(tp_warning_flags INTERFACE -Werror)
endif()

add_library(tp_sanitize_flags INTERFACE)
if(TP_SANITIZE)
  target_compile_options(tp_sanitize_flags INTERFACE
    -fsanitize=${TP_SANITIZE} -fno-omit-frame-pointer
    -fno-sanitize-recover=all)
  target_link_options(tp_sanitize_flags INTERFACE -fsanitize=${TP_SANITIZE})
  # Sanitize everything, library objects included.
  add_compile_options(-fsanitize=${TP_SANITIZE} -fno-omit-frame-pointer
                      -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${TP_SANITIZE})
endif()
