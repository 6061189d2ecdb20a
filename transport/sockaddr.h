/* SPDX-License-Identifier: Apache-2.0 */
/* sockaddr.h - socket addresses for the tcp transport (and later the store
 * and shm): parsing "tcp://HOST:PORT", formatting, and choosing the
 * interface to listen on.
 *
 * Address forms accepted by tp__sockaddr_parse (the "tcp://" prefix is
 * optional; any other scheme is an error):
 *   tcp://192.0.2.1:5555         IPv4
 *   tcp://[::1]:5555             IPv6, always in brackets
 *   tcp://[fe80::1%eth0]:5555    IPv6 with a scope (interface name or index)
 *   tcp://node7:5555             a host name, resolved with getaddrinfo
 *                                (blocking) only if TP_SOCKADDR_RESOLVE
 *   tcp://:5555, tcp://          no host: tp__sockaddr_split with
 *                                TP_SOCKADDR_EMPTY_HOST only (listen)
 * Ports are decimal 0..65535. Errors are TP_EINVAL with a message naming
 * the address and what is wrong with it.
 *
 * Formatting: "192.0.2.1:5555", "[::1]:5555", "[fe80::1%eth0]:5555" (the
 * scope is written as the interface name when it still exists, else as a
 * number), so the result parses back to the same address.
 *
 * Thread safety: every function here is reentrant (no static buffers).
 */
#ifndef TP_TRANSPORT_SOCKADDR_H
#define TP_TRANSPORT_SOCKADDR_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "core/config.h"
#include "core/error.h"

// Big enough for "[<v6>%<ifname>]:65535" and "tcp://" in front of it.
#define TP_SOCKADDR_STRLEN 96

typedef struct tp_sockaddr {
    union {
        struct sockaddr sa;
        struct sockaddr_in in4;
        struct sockaddr_in6 in6;
        struct sockaddr_storage ss;
    } u;
    socklen_t len; // 0: unset
} tp_sockaddr;

// Flags of tp__sockaddr_parse.
#define TP_SOCKADDR_RESOLVE    0x1u // host names allowed (getaddrinfo, blocks)
#define TP_SOCKADDR_EMPTY_HOST 0x2u // "tcp://:PORT" and "tcp://" allowed
#define TP_SOCKADDR_NO_PORT    0x4u // a missing port means port 0

// A split address: host text (no brackets, may hold "%scope") and port.
typedef struct tp_hostport {
    char hp_host[256];
    uint16_t hp_port;
    bool hp_bracketed; // the host was written as [v6]
} tp_hostport;

// Splits @addr ("tcp://HOST:PORT") into host and port without resolving.
// @flags: TP_SOCKADDR_EMPTY_HOST, TP_SOCKADDR_NO_PORT. Errors: TP_EINVAL.
tp_status tp__sockaddr_split(const char *addr, unsigned flags,
                             tp_hostport *hp_p, tp_error **err_p);

// A split address to a socket address: numeric hosts directly, host names
// with getaddrinfo (BLOCKS) if @flags has TP_SOCKADDR_RESOLVE, else
// TP_EINVAL. Brackets must hold an IPv6 address. @addr (may be NULL) is
// the original text, for messages.
tp_status tp__sockaddr_from_hostport(const tp_hostport *hp, const char *addr,
                                     unsigned flags, tp_sockaddr *sa_p,
                                     tp_error **err_p);

// Parses @addr into a socket address; see the forms above. @flags:
// TP_SOCKADDR_RESOLVE (host names allowed; blocks), TP_SOCKADDR_NO_PORT.
// A host is required. Errors: TP_EINVAL.
tp_status tp__sockaddr_parse(const char *addr, unsigned flags,
                             tp_sockaddr *sa_p, tp_error **err_p);

// "192.0.2.1:5555", "[::1]:5555", "[fe80::1%eth0]:5555"; "?" if unknown.
void tp__sockaddr_format(const tp_sockaddr *sa, char *buf, size_t len);
// The host part alone in URL form: "192.0.2.1", "[::1]", "[fe80::1%eth0]".
void tp__sockaddr_format_host(const tp_sockaddr *sa, char *buf, size_t len);
// "<scheme>://" + tp__sockaddr_format.
void tp__sockaddr_format_url(const tp_sockaddr *sa, const char *scheme,
                             char *buf, size_t len);
uint16_t tp__sockaddr_port(const tp_sockaddr *sa);
// Builds a tp_sockaddr from a kernel-filled sockaddr of @len bytes.
void tp__sockaddr_from_sys(tp_sockaddr *sa, const struct sockaddr *sys,
                           socklen_t len);

// Chooses the host to listen on when the address names none:
//  1. cfg->socket_addr (TP_SOCKET_ADDR) if set: that host;
//  2. else cfg->socket_ifname (TP_SOCKET_IFNAME): the first address of
//     that interface in @family_pref (AF_INET by default, i.e. for
//     AF_UNSPEC), else of the other family (a global IPv6 address before a
//     link-local one, which gets its %scope);
//  3. else the first interface that is up, running and not loopback with a
//     routable address (preferred family first, then the other; link-local
//     addresses last);
//  4. else loopback (127.0.0.1, or ::1 if @family_pref is AF_INET6).
// Writes the host in URL form ("192.0.2.2", "[fd00::2]", "[fe80::1%eth0]")
// to @addr_out and a lowercase reason ("TP_SOCKET_IFNAME=eth0",
// "eth0 is the first up, running, non-loopback interface") to @why.
// Errors: TP_EINVAL if TP_SOCKET_IFNAME names an interface that does not
// exist or has no address (the message lists the interfaces there are),
// or TP_SOCKET_ADDR is malformed; TP_EIO if getifaddrs fails.
// Any thread; reads the interface list (getifaddrs) each call.
tp_status tp__sockaddr_choose(const tp_config *cfg, int family_pref,
                              char *addr_out, size_t len, char *why,
                              size_t why_len, tp_error **err_p);

// "lo (127.0.0.1), eth0 (192.0.2.2, fd00::2)": every interface and its
// addresses, for error messages and `tpipe info`. "(none)" if there are
// none; "(getifaddrs failed: ...)" on error.
void tp__sockaddr_list_ifaces(char *buf, size_t len);

#endif
