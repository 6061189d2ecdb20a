// SPDX-License-Identifier: Apache-2.0
// sockaddr.c - parsing and formatting "tcp://HOST:PORT" and choosing the
// interface to listen on (see sockaddr.h). No locks, no static buffers.

#include "sockaddr.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

// ---- splitting -------------------------------------------------------------

static bool
sockaddr_host_char_ok(char ch, bool bracketed)
{
    unsigned char c = (unsigned char)ch;
    if (isalnum(c) || c == '.' || c == '-' || c == '_' || c == '%') {
        return true;
    }
    return bracketed && c == ':';
}

tp_status
tp__sockaddr_split(const char *addr, unsigned flags, tp_hostport *hp_p,
                   tp_error **err_p)
{
    tp_hostport hp;
    memset(&hp, 0, sizeof(hp));
    const char *shown = addr != NULL ? addr : "";
    const char *p = shown;
    const char *sep = strstr(p, "://");
    if (sep != NULL) {
        if (sep - p != 3 || strncasecmp(p, "tcp", 3) != 0) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "tcp: bad address \"%s\": scheme \"%.*s\" "
                                 "is not tcp://",
                                 shown, (int)(sep - p), p);
        }
        p = sep + 3;
    }

    const char *host;
    size_t hlen;
    const char *rest;
    if (*p == '[') {
        const char *close = strchr(p, ']');
        if (close == NULL) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "tcp: bad address \"%s\": missing ']' "
                                 "after the IPv6 address",
                                 shown);
        }
        host = p + 1;
        hlen = (size_t)(close - host);
        rest = close + 1;
        hp.hp_bracketed = true;
        if (hlen == 0) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "tcp: bad address \"%s\": empty IPv6 "
                                 "address in brackets",
                                 shown);
        }
    } else {
        const char *colon = strrchr(p, ':');
        if (colon != NULL && memchr(p, ':', (size_t)(colon - p)) != NULL) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "tcp: bad address \"%s\": IPv6 addresses "
                                 "need brackets, as in tcp://[::1]:5555",
                                 shown);
        }
        host = p;
        hlen = colon != NULL ? (size_t)(colon - p) : strlen(p);
        rest = p + hlen;
    }
    if (hlen >= sizeof(hp.hp_host)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tcp: bad address \"%.64s...\": host name too "
                             "long (%zu bytes, at most %zu)",
                             shown, hlen, sizeof(hp.hp_host) - 1);
    }
    for (size_t i = 0; i < hlen; i++) {
        if (!sockaddr_host_char_ok(host[i], hp.hp_bracketed)) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "tcp: bad address \"%s\": unexpected "
                                 "character '%c' in host",
                                 shown, host[i]);
        }
    }
    memcpy(hp.hp_host, host, hlen);
    hp.hp_host[hlen] = '\0';
    if (hlen == 0 && !(flags & TP_SOCKADDR_EMPTY_HOST)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tcp: bad address \"%s\": missing host "
                             "(expected tcp://HOST:PORT)",
                             shown);
    }

    if (*rest == '\0') {
        // "tcp://" alone (no host, no port) means "choose, any port" when
        // an empty host is allowed.
        if (!(flags & TP_SOCKADDR_NO_PORT) && hlen > 0) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "tcp: bad address \"%s\": missing port "
                                 "(expected tcp://HOST:PORT)",
                                 shown);
        }
        hp.hp_port = 0;
    } else if (*rest != ':') {
        return tp__error_set(err_p, TP_EINVAL,
                             "tcp: bad address \"%s\": unexpected \"%s\" "
                             "after the host (expected :PORT)",
                             shown, rest);
    } else {
        const char *ps = rest + 1;
        unsigned long v = 0;
        bool ok = *ps != '\0' && strlen(ps) <= 5;
        for (const char *q = ps; ok && *q != '\0'; q++) {
            if (*q < '0' || *q > '9') {
                ok = false;
            } else {
                v = v * 10 + (unsigned long)(*q - '0');
            }
        }
        if (!ok || v > 65535) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "tcp: bad address \"%s\": bad port \"%s\" "
                                 "(expected a number 0..65535)",
                                 shown, ps);
        }
        hp.hp_port = (uint16_t)v;
    }
    *hp_p = hp;
    return TP_OK;
}

// ---- numeric / resolved ----------------------------------------------------

static void
sockaddr_set_port(tp_sockaddr *sa, uint16_t port)
{
    if (sa->u.sa.sa_family == AF_INET) {
        sa->u.in4.sin_port = htons(port);
    } else if (sa->u.sa.sa_family == AF_INET6) {
        sa->u.in6.sin6_port = htons(port);
    }
}

// @host (an IPv4 literal, or an IPv6 literal without brackets, optionally
// with %scope) and @port to a socket address. Returns TP_EAGAIN without
// touching @sa_p or @err_p if @host is not numeric (so the caller may
// resolve it), TP_EINVAL for a bad scope.
static tp_status
sockaddr_numeric(const char *host, uint16_t port, tp_sockaddr *sa_p,
                 tp_error **err_p)
{
    tp_sockaddr sa;
    memset(&sa, 0, sizeof(sa));
    struct in_addr a4;
    if (inet_pton(AF_INET, host, &a4) == 1) {
        sa.u.in4.sin_family = AF_INET;
        sa.u.in4.sin_port = htons(port);
        sa.u.in4.sin_addr = a4;
        sa.len = sizeof(sa.u.in4);
        *sa_p = sa;
        return TP_OK;
    }
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", host);
    char *pct = strchr(buf, '%');
    if (pct != NULL) {
        *pct = '\0';
    }
    struct in6_addr a6;
    if (inet_pton(AF_INET6, buf, &a6) != 1) {
        if (pct != NULL) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "tcp: bad host \"%s\": a %%scope is only "
                                 "valid on an IPv6 address",
                                 host);
        }
        return TP_EAGAIN; // not numeric
    }
    sa.u.in6.sin6_family = AF_INET6;
    sa.u.in6.sin6_port = htons(port);
    sa.u.in6.sin6_addr = a6;
    if (pct != NULL) {
        const char *scope = pct + 1;
        char *end = NULL;
        unsigned long idx = 0;
        if (*scope >= '0' && *scope <= '9') {
            errno = 0;
            idx = strtoul(scope, &end, 10);
            if (*end != '\0' || errno != 0 || idx > UINT32_MAX) {
                idx = 0;
            }
        } else if (*scope != '\0') {
            idx = if_nametoindex(scope);
        }
        if (idx == 0) {
            char list[512];
            tp__sockaddr_list_ifaces(list, sizeof(list));
            return tp__error_set(err_p, TP_EINVAL,
                                 "tcp: bad host \"[%s]\": unknown interface "
                                 "\"%s\" in the scope (interfaces: %s)",
                                 host, scope, list);
        }
        sa.u.in6.sin6_scope_id = (uint32_t)idx;
    }
    sa.len = sizeof(sa.u.in6);
    *sa_p = sa;
    return TP_OK;
}

static void
sockaddr_lower_first(char *s)
{
    if (s[0] != '\0' && s[1] != '\0' && islower((unsigned char)s[1])) {
        s[0] = (char)tolower((unsigned char)s[0]);
    }
}

// Resolves @host with getaddrinfo (BLOCKS; only where blocking is fine).
// @family: AF_UNSPEC, AF_INET or AF_INET6. The first result is used.
// Errors: TP_EINVAL (unknown name, with gai_strerror).
static tp_status
sockaddr_resolve(const char *host, uint16_t port, int family, tp_sockaddr *sa_p,
                 tp_error **err_p)
{
    struct addrinfo hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = family;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_protocol = IPPROTO_TCP;
    struct addrinfo *res = NULL;
    int rv = getaddrinfo(host, NULL, &hints, &res);
    if (rv != 0 || res == NULL) {
        if (rv == EAI_SYSTEM) {
            return tp__error_errno(err_p, errno,
                                   "tcp: cannot resolve host \"%s\"", host);
        }
        char msg[128];
        snprintf(msg, sizeof(msg), "%s",
                 rv != 0 ? gai_strerror(rv) : "no address");
        sockaddr_lower_first(msg);
        if (res != NULL) {
            freeaddrinfo(res);
        }
        return tp__error_set(err_p, TP_EINVAL,
                             "tcp: cannot resolve host \"%s\": %s", host, msg);
    }
    tp_sockaddr sa;
    memset(&sa, 0, sizeof(sa));
    struct addrinfo *ai = res;
    // Prefer IPv4 when both families came back and none was asked for,
    // so "localhost" behaves the same on every host.
    if (family == AF_UNSPEC) {
        for (struct addrinfo *a = res; a != NULL; a = a->ai_next) {
            if (a->ai_family == AF_INET) {
                ai = a;
                break;
            }
        }
    }
    tp__sockaddr_from_sys(&sa, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(res);
    if (sa.len == 0) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tcp: cannot resolve host \"%s\": no IPv4 or "
                             "IPv6 address",
                             host);
    }
    sockaddr_set_port(&sa, port);
    *sa_p = sa;
    return TP_OK;
}

tp_status
tp__sockaddr_from_hostport(const tp_hostport *hp, const char *addr,
                           unsigned flags, tp_sockaddr *sa_p, tp_error **err_p)
{
    const char *shown = addr != NULL ? addr : hp->hp_host;
    tp_sockaddr sa;
    tp_status st = sockaddr_numeric(hp->hp_host, hp->hp_port, &sa, err_p);
    if (st == TP_OK && hp->hp_bracketed && sa.u.sa.sa_family != AF_INET6) {
        st = TP_EAGAIN; // "[1.2.3.4]": brackets are for IPv6 only
    }
    if (st == TP_OK) {
        *sa_p = sa;
        return TP_OK;
    }
    if (st != TP_EAGAIN) {
        return st;
    }
    if (hp->hp_bracketed) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tcp: bad address \"%s\": \"%s\" in brackets "
                             "is not an IPv6 address",
                             shown, hp->hp_host);
    }
    if (!(flags & TP_SOCKADDR_RESOLVE)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tcp: bad address \"%s\": \"%s\" is not a "
                             "numeric IPv4 or IPv6 address",
                             shown, hp->hp_host);
    }
    return sockaddr_resolve(hp->hp_host, hp->hp_port, AF_UNSPEC, sa_p, err_p);
}

tp_status
tp__sockaddr_parse(const char *addr, unsigned flags, tp_sockaddr *sa_p,
                   tp_error **err_p)
{
    tp_hostport hp;
    tp_status st =
        tp__sockaddr_split(addr, flags & TP_SOCKADDR_NO_PORT, &hp, err_p);
    if (st != TP_OK) {
        return st;
    }
    return tp__sockaddr_from_hostport(&hp, addr, flags, sa_p, err_p);
}

// ---- formatting ------------------------------------------------------------

void
tp__sockaddr_from_sys(tp_sockaddr *sa, const struct sockaddr *sys,
                      socklen_t len)
{
    memset(sa, 0, sizeof(*sa));
    if (sys->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        memcpy(&sa->u.in4, sys, sizeof(struct sockaddr_in));
        sa->len = sizeof(struct sockaddr_in);
    } else if (sys->sa_family == AF_INET6 &&
               len >= sizeof(struct sockaddr_in6)) {
        memcpy(&sa->u.in6, sys, sizeof(struct sockaddr_in6));
        sa->len = sizeof(struct sockaddr_in6);
    }
}

uint16_t
tp__sockaddr_port(const tp_sockaddr *sa)
{
    switch (sa->u.sa.sa_family) {
    case AF_INET:
        return ntohs(sa->u.in4.sin_port);
    case AF_INET6:
        return ntohs(sa->u.in6.sin6_port);
    default:
        return 0;
    }
}

void
tp__sockaddr_format_host(const tp_sockaddr *sa, char *buf, size_t len)
{
    char ip[INET6_ADDRSTRLEN];
    if (sa->u.sa.sa_family == AF_INET) {
        inet_ntop(AF_INET, &sa->u.in4.sin_addr, ip, sizeof(ip));
        snprintf(buf, len, "%s", ip);
    } else if (sa->u.sa.sa_family == AF_INET6) {
        inet_ntop(AF_INET6, &sa->u.in6.sin6_addr, ip, sizeof(ip));
        uint32_t scope = sa->u.in6.sin6_scope_id;
        if (scope == 0) {
            snprintf(buf, len, "[%s]", ip);
            return;
        }
        char name[IF_NAMESIZE];
        if (if_indextoname(scope, name) != NULL) {
            snprintf(buf, len, "[%s%%%s]", ip, name);
        } else {
            snprintf(buf, len, "[%s%%%u]", ip, scope);
        }
    } else {
        snprintf(buf, len, "?");
    }
}

void
tp__sockaddr_format(const tp_sockaddr *sa, char *buf, size_t len)
{
    char host[TP_SOCKADDR_STRLEN];
    tp__sockaddr_format_host(sa, host, sizeof(host));
    if (sa->u.sa.sa_family != AF_INET && sa->u.sa.sa_family != AF_INET6) {
        snprintf(buf, len, "?");
        return;
    }
    // A buffer too small for "host:port" gets a truncated text (used in
    // messages only); the check keeps gcc's -Wformat-truncation quiet.
    int n = snprintf(buf, len, "%s:%u", host, (unsigned)tp__sockaddr_port(sa));
    if (n < 0 && len > 0) {
        buf[0] = '\0';
    }
}

void
tp__sockaddr_format_url(const tp_sockaddr *sa, const char *scheme, char *buf,
                        size_t len)
{
    char s[TP_SOCKADDR_STRLEN];
    tp__sockaddr_format(sa, s, sizeof(s));
    snprintf(buf, len, "%s://%s", scheme, s);
}

// ---- interfaces ------------------------------------------------------------

static bool
sockaddr_is_link_local(const struct sockaddr *a)
{
    if (a->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)a;
        return IN6_IS_ADDR_LINKLOCAL(&s6->sin6_addr);
    }
    if (a->sa_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)a;
        return (ntohl(s4->sin_addr.s_addr) & 0xffff0000u) == 0xa9fe0000u;
    }
    return false;
}

static bool
sockaddr_is_inet(const struct ifaddrs *ifa)
{
    return ifa->ifa_addr != NULL && (ifa->ifa_addr->sa_family == AF_INET ||
                                     ifa->ifa_addr->sa_family == AF_INET6);
}

// An interface address in URL host form; a link-local IPv6 address gets
// the interface as its scope.
static void
sockaddr_ifa_host(const struct ifaddrs *ifa, char *buf, size_t len)
{
    tp_sockaddr sa;
    tp__sockaddr_from_sys(&sa, ifa->ifa_addr,
                          ifa->ifa_addr->sa_family == AF_INET
                              ? sizeof(struct sockaddr_in)
                              : sizeof(struct sockaddr_in6));
    if (sa.u.sa.sa_family == AF_INET6 && sockaddr_is_link_local(&sa.u.sa) &&
        sa.u.in6.sin6_scope_id == 0) {
        sa.u.in6.sin6_scope_id = if_nametoindex(ifa->ifa_name);
    }
    tp__sockaddr_format_host(&sa, buf, len);
}

void
tp__sockaddr_list_ifaces(char *buf, size_t len)
{
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) {
        snprintf(buf, len, "(getifaddrs failed: %s)", strerror(errno));
        return;
    }
    size_t off = 0;
    buf[0] = '\0';
    for (struct ifaddrs *a = ifs; a != NULL && off < len; a = a->ifa_next) {
        // Each name once, at its first appearance.
        bool seen = false;
        for (struct ifaddrs *b = ifs; b != a; b = b->ifa_next) {
            if (strcmp(a->ifa_name, b->ifa_name) == 0) {
                seen = true;
                break;
            }
        }
        if (seen) {
            continue;
        }
        int n = snprintf(buf + off, len - off, "%s%s (", off ? ", " : "",
                         a->ifa_name);
        off = n < 0 ? len : off + (size_t)n;
        int naddr = 0;
        for (struct ifaddrs *b = a; b != NULL && off < len; b = b->ifa_next) {
            if (strcmp(a->ifa_name, b->ifa_name) != 0 || !sockaddr_is_inet(b)) {
                continue;
            }
            char host[TP_SOCKADDR_STRLEN];
            sockaddr_ifa_host(b, host, sizeof(host));
            n = snprintf(buf + off, len - off, "%s%s", naddr ? ", " : "", host);
            off = n < 0 ? len : off + (size_t)n;
            naddr++;
        }
        if (off < len) {
            n = snprintf(buf + off, len - off, "%s)",
                         naddr ? "" : "no address");
            off = n < 0 ? len : off + (size_t)n;
        }
    }
    if (buf[0] == '\0') {
        snprintf(buf, len, "(none)");
    }
    freeifaddrs(ifs);
}

// Class of an interface address for the automatic choice: lower is better.
static int
sockaddr_addr_class(const struct sockaddr *a, int family)
{
    if (sockaddr_is_link_local(a)) {
        return a->sa_family == family ? 2 : 3;
    }
    return a->sa_family == family ? 0 : 1;
}

static tp_status
sockaddr_choose_addr(const char *value, char *addr_out, size_t len,
                     tp_error **err_p)
{
    char host[256];
    snprintf(host, sizeof(host), "%s", value);
    size_t hl = strlen(host);
    if (strstr(host, "://") != NULL) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tcp: TP_SOCKET_ADDR=%s: expected a host "
                             "address without scheme or port, as in "
                             "192.0.2.1 or fe80::1%%eth0",
                             value);
    }
    if (host[0] == '[') {
        if (hl < 3 || host[hl - 1] != ']') {
            return tp__error_set(err_p, TP_EINVAL,
                                 "tcp: TP_SOCKET_ADDR=%s: expected a host "
                                 "address without port",
                                 value);
        }
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    tp_sockaddr sa;
    tp_status st = sockaddr_numeric(host, 0, &sa, err_p);
    if (st == TP_OK) {
        tp__sockaddr_format_host(&sa, addr_out, len);
        return TP_OK;
    }
    if (st != TP_EAGAIN) {
        return tp__error_wrap(err_p, st, "tcp: TP_SOCKET_ADDR=%s", value);
    }
    for (const char *q = host; *q != '\0'; q++) {
        if (!sockaddr_host_char_ok(*q, false) || *q == '%' || *q == ':') {
            return tp__error_set(err_p, TP_EINVAL,
                                 "tcp: TP_SOCKET_ADDR=%s: not an IP address "
                                 "or host name (no port allowed)",
                                 value);
        }
    }
    snprintf(addr_out, len, "%s", host); // a host name; listen resolves it
    return TP_OK;
}

tp_status
tp__sockaddr_choose(const tp_config *cfg, int family_pref, char *addr_out,
                    size_t len, char *why, size_t why_len, tp_error **err_p)
{
    int fam = family_pref == AF_INET6 ? AF_INET6 : AF_INET;
    if (cfg != NULL && cfg->socket_addr[0] != '\0') {
        tp_status st =
            sockaddr_choose_addr(cfg->socket_addr, addr_out, len, err_p);
        if (st == TP_OK) {
            snprintf(why, why_len, "TP_SOCKET_ADDR=%s", cfg->socket_addr);
        }
        return st;
    }
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) {
        return tp__error_errno(err_p, errno, "tcp: getifaddrs");
    }
    tp_status st = TP_OK;
    const struct ifaddrs *best = NULL;
    int best_class = 99;
    if (cfg != NULL && cfg->socket_ifname[0] != '\0') {
        const char *name = cfg->socket_ifname;
        bool exists = false;
        unsigned flags = 0;
        for (const struct ifaddrs *a = ifs; a != NULL; a = a->ifa_next) {
            if (strcmp(a->ifa_name, name) != 0) {
                continue;
            }
            exists = true;
            flags = a->ifa_flags;
            if (!sockaddr_is_inet(a)) {
                continue;
            }
            int c = sockaddr_addr_class(a->ifa_addr, fam);
            if (c < best_class) {
                best = a;
                best_class = c;
            }
        }
        if (best == NULL) {
            char list[768];
            tp__sockaddr_list_ifaces(list, sizeof(list));
            st = tp__error_set(err_p, TP_EINVAL,
                               "tcp: TP_SOCKET_IFNAME=%s: %s (interfaces: "
                               "%s)",
                               name,
                               exists ? "the interface has no IPv4 or IPv6 "
                                        "address"
                                      : "no such interface",
                               list);
            goto out;
        }
        sockaddr_ifa_host(best, addr_out, len);
        snprintf(why, why_len, "TP_SOCKET_IFNAME=%s%s", name,
                 (flags & IFF_UP) ? "" : " (warning: interface is down)");
        goto out;
    }
    for (const struct ifaddrs *a = ifs; a != NULL; a = a->ifa_next) {
        if (!sockaddr_is_inet(a) || (a->ifa_flags & IFF_LOOPBACK) ||
            !(a->ifa_flags & IFF_UP) || !(a->ifa_flags & IFF_RUNNING)) {
            continue;
        }
        int c = sockaddr_addr_class(a->ifa_addr, fam);
        if (c < best_class) {
            best = a;
            best_class = c;
        }
    }
    if (best != NULL) {
        sockaddr_ifa_host(best, addr_out, len);
        snprintf(why, why_len,
                 "%s is the first up, running, non-loopback interface with "
                 "%s address (set TP_SOCKET_IFNAME or TP_SOCKET_ADDR to "
                 "choose another)",
                 best->ifa_name,
                 best_class == 0   ? (fam == AF_INET ? "an IPv4" : "an IPv6")
                 : best_class == 1 ? "a routable"
                                   : "only a link-local");
        goto out;
    }
    snprintf(addr_out, len, "%s", fam == AF_INET6 ? "[::1]" : "127.0.0.1");
    snprintf(why, why_len,
             "no up, running, non-loopback interface has an address; "
             "using loopback");
out:
    freeifaddrs(ifs);
    return st;
}
