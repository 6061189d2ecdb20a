// SPDX-License-Identifier: Apache-2.0
// consumer - uses only the installed public API of libtpipe.
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <tpipe/tpipe.h>

int
main(void)
{
    const char *v = tp_version_string();
    tp_error *none = tp_error_ref(NULL);

    // The header the program was compiled with and the library it runs
    // with must agree.
    if (v == NULL || strcmp(v, TP_VERSION) != 0) {
        printf("version mismatch: header %s, library %s\n", TP_VERSION,
               v ? v : "(null)");
        return 1;
    }
    printf("tpipe %s\n", v);
    printf("%s\n", tp_status_name(TP_ECLOSED));
    printf("tp_error(NULL): status %s, errno %d, message \"%s\", cause %s, "
           "ref %s\n",
           tp_status_name(tp_error_status(NULL)), tp_error_errno(NULL),
           tp_error_message(NULL),
           tp_error_cause(NULL) == NULL ? "NULL" : "set",
           none == NULL ? "NULL" : "set");
    tp_error_unref(NULL);

    // The introspection lists (tpipe/info.h): every build has tcp.
    tp_backend_info tr[TP_INFO_MAX];
    size_t n = 0;
    bool tcp = false;
    if (tp_info_transports(0, tr, TP_INFO_MAX, &n, NULL) != TP_OK || n == 0) {
        printf("tp_info_transports failed\n");
        return 1;
    }
    for (size_t i = 0; i < n && i < TP_INFO_MAX; i++) {
        tcp = tcp || strcmp(tr[i].name, "tcp") == 0;
    }
    printf("tp_info_transports: tcp %s\n", tcp ? "listed" : "missing");
    return tcp ? 0 : 1;
}
