// SPDX-License-Identifier: Apache-2.0
// auth.c - the job secret (read once from the environment) and the
// challenge-response exchange of core/auth.h, with libcrypto's HMAC.

#include "core/auth.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"
#include "core/platform.h"
#include "core/tunables.h"
#include "tp_config.h"

#if TP_HAVE_CRYPTO
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#endif

// The job secret's variables, read by auth_load_locked and
// tp__auth_warn_open below (declared here so every listing has them).
static const tp_tunable auth_tunable_rows[] = {
    {
        .tu_name = "job_token",
        .tu_env = "TP_JOB_TOKEN",
        .tu_def = "",
        .tu_doc = "the job secret every connection proves (empty: none; "
                  "docs/security.md); never shown",
        .tu_accepted = "16..4095 bytes",
        .tu_flags = TP_TUNABLE_EXTERNAL | TP_TUNABLE_SECRET,
    },
    TP_TUNABLE_EXTERN("job_token_file", "TP_JOB_TOKEN_FILE", "",
                      "path of a regular file of mode 0600 or stricter",
                      "a file holding the job secret (instead of "
                      "TP_JOB_TOKEN)"),
    TP_TUNABLE_EXTERN("auth_warn", "TP_AUTH_WARN", "1", "0 or 1",
                      "0: no warning when a listener is open to the network "
                      "without a job secret"),
};

const tp_tunables tp__auth_tunables = {
    .ts_component = "auth",
    .ts_rows = auth_tunable_rows,
    .ts_nrows = TP_ARRAY_LEN(auth_tunable_rows),
    .ts_store = TP_TUNABLES_IN_CONFIG,
};

#define AUTH_MAX_SECRET 4096u

// ---- the secret ---------------------------------------------------------

static pthread_mutex_t g_mtx = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool g_loaded;
static uint8_t g_secret[AUTH_MAX_SECRET];
static size_t g_secret_len;
static char g_secret_err[512]; // non-empty: misconfigured
static atomic_bool g_warned;

static void
auth_bad(const char *fmt, const char *a, const char *b)
{
    snprintf(g_secret_err, sizeof(g_secret_err), fmt, a, b);
}

// Reads the secret file @path into g_secret. Sets g_secret_err on error.
static void
auth_read_file(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        auth_bad("TP_JOB_TOKEN_FILE=%s: cannot open it: %s", path,
                 strerror(errno));
        return;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        auth_bad("TP_JOB_TOKEN_FILE=%s: %s", path, "not a regular file");
        return;
    }
    if ((st.st_mode & 077) != 0) {
        close(fd);
        auth_bad("TP_JOB_TOKEN_FILE=%s: %s", path,
                 "readable or writable by group or others (chmod 600 it)");
        return;
    }
    size_t n = 0;
    while (n < sizeof(g_secret)) {
        ssize_t r = read(fd, g_secret + n, sizeof(g_secret) - n);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0) {
            close(fd);
            auth_bad("TP_JOB_TOKEN_FILE=%s: read: %s", path, strerror(errno));
            return;
        }
        if (r == 0) {
            break;
        }
        n += (size_t)r;
    }
    close(fd);
    if (n == sizeof(g_secret)) {
        auth_bad("TP_JOB_TOKEN_FILE=%s: %s", path,
                 "longer than 4096 bytes (a secret, not a key file)");
        return;
    }
    while (n > 0 && (g_secret[n - 1] == '\n' || g_secret[n - 1] == '\r' ||
                     g_secret[n - 1] == ' ' || g_secret[n - 1] == '\t')) {
        n--;
    }
    g_secret_len = n;
}

static void
auth_load_locked(void)
{
    g_secret_len = 0;
    g_secret_err[0] = '\0';
    const char *tok = getenv("TP_JOB_TOKEN");
    const char *file = getenv("TP_JOB_TOKEN_FILE");
    const char *var = "TP_JOB_TOKEN";
    if (tok != NULL && file != NULL) {
        auth_bad("both %s and %s are set; set one of them", "TP_JOB_TOKEN",
                 "TP_JOB_TOKEN_FILE");
        return;
    }
    if (tok != NULL) {
        size_t n = strlen(tok);
        if (n >= sizeof(g_secret)) {
            auth_bad("%s: %s", var, "longer than 4095 bytes");
            return;
        }
        memcpy(g_secret, tok, n);
        g_secret_len = n;
    } else if (file != NULL) {
        var = "TP_JOB_TOKEN_FILE";
        auth_read_file(file);
        if (g_secret_err[0] != '\0') {
            return;
        }
    } else {
        return; // no secret
    }
    if (g_secret_len < TP_AUTH_MIN_SECRET) {
        char min[32];
        snprintf(min, sizeof(min), "%u", TP_AUTH_MIN_SECRET);
        auth_bad("%s: the job secret is shorter than %s bytes", var, min);
        g_secret_len = 0;
        return;
    }
#if !TP_HAVE_CRYPTO
    auth_bad("%s is set but this tpipe was built without OpenSSL's "
             "libcrypto (install libssl-dev and rebuild; %s)",
             var, "docs/security.md");
    g_secret_len = 0;
#endif
}

static void
auth_load(void)
{
    if (atomic_load_explicit(&g_loaded, memory_order_acquire)) {
        return;
    }
    pthread_mutex_lock(&g_mtx);
    if (!atomic_load_explicit(&g_loaded, memory_order_relaxed)) {
        auth_load_locked();
        atomic_store_explicit(&g_loaded, true, memory_order_release);
    }
    pthread_mutex_unlock(&g_mtx);
}

void
tp__auth_reload(void)
{
    pthread_mutex_lock(&g_mtx);
    auth_load_locked();
    atomic_store_explicit(&g_loaded, true, memory_order_release);
    atomic_store(&g_warned, false);
    pthread_mutex_unlock(&g_mtx);
}

tp_status
tp__auth_enabled(bool *on, tp_error **err_p)
{
    auth_load();
    *on = false;
    if (g_secret_err[0] != '\0') {
        return tp__error_set(err_p, TP_EINVAL, "job secret: %s", g_secret_err);
    }
    *on = g_secret_len > 0;
    return TP_OK;
}

int
tp__auth_decide(uint32_t our_flags, uint32_t peer_flags, bool acceptor,
                const char *what, tp_error **err_p)
{
    bool ours = (our_flags & TP_AUTH_HELLO_FLAG) != 0;
    bool theirs = (peer_flags & TP_AUTH_HELLO_FLAG) != 0;
    if (ours && theirs) {
        return 1;
    }
    if (!ours && !theirs) {
        return 0;
    }
    if (ours) {
        tp__error_set(err_p, TP_EPERM,
                      "%s: the peer presents no job secret (this job is "
                      "authenticated: TP_JOB_TOKEN); %s",
                      what,
                      acceptor ? "unauthenticated connection closed"
                               : "refusing to trust it");
    } else {
        tp__error_set(err_p, TP_EPERM,
                      "%s: the peer requires the job secret; set "
                      "TP_JOB_TOKEN or TP_JOB_TOKEN_FILE to the job's "
                      "secret (tpipe run sets it for its ranks)",
                      what);
    }
    return -1;
}

// ---- the exchange -------------------------------------------------------

static void
auth_nonce(uint8_t *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(p + got, n - got, 0);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0) {
            break;
        }
        got += (size_t)r;
    }
    for (; got < n; got += 8) { // no getrandom: still unpredictable enough
        uint64_t v = tp__random_u64();
        memcpy(p + got, &v, TP_MIN((size_t)8, n - got));
    }
}

// HMAC-SHA256(secret, "tpipe-auth-1" | label | role | n1 | n2).
static void
auth_mac(const char *label, bool acceptor, const uint8_t *n1, const uint8_t *n2,
         uint8_t *out)
{
    uint8_t msg[12 + 16 + 1 + 2 * TP_AUTH_NONCE_LEN];
    size_t off = 0;
    memcpy(msg, "tpipe-auth-1", 12);
    off = 12;
    memset(msg + off, 0, 16);
    memcpy(msg + off, label, TP_MIN(strlen(label), (size_t)16));
    off += 16;
    msg[off++] = acceptor ? 'A' : 'C';
    memcpy(msg + off, n1, TP_AUTH_NONCE_LEN);
    off += TP_AUTH_NONCE_LEN;
    memcpy(msg + off, n2, TP_AUTH_NONCE_LEN);
    off += TP_AUTH_NONCE_LEN;
#if TP_HAVE_CRYPTO
    unsigned len = TP_AUTH_MAC_LEN;
    if (HMAC(EVP_sha256(), g_secret, (int)g_secret_len, msg, off, out, &len) ==
        NULL) {
        memset(out, 0, TP_AUTH_MAC_LEN); // never verifies against a real one
    }
#else
    TP_UNUSED(off);
    memset(out, 0, TP_AUTH_MAC_LEN); // unreachable: no secret loads
#endif
}

static bool
auth_equal(const uint8_t *a, const uint8_t *b, size_t n)
{
#if TP_HAVE_CRYPTO
    return CRYPTO_memcmp(a, b, n) == 0;
#else
    uint8_t d = 0;
    for (size_t i = 0; i < n; i++) {
        d |= (uint8_t)(a[i] ^ b[i]);
    }
    return d == 0;
#endif
}

void
tp__auth_start(tp__auth *a, bool acceptor, const char *label)
{
    memset(a, 0, sizeof(*a));
    a->a_acceptor = acceptor;
    snprintf(a->a_label, sizeof(a->a_label), "%s", label);
    auth_nonce(a->a_out, TP_AUTH_NONCE_LEN);
    a->a_out_ready = TP_AUTH_NONCE_LEN;
}

size_t
tp__auth_out(tp__auth *a, const uint8_t **p)
{
    *p = a->a_out + a->a_sent;
    return a->a_out_ready - a->a_sent;
}

void
tp__auth_sent(tp__auth *a, size_t n)
{
    a->a_sent += n;
}

size_t
tp__auth_in(tp__auth *a, uint8_t **p)
{
    *p = a->a_in + a->a_rcvd;
    return sizeof(a->a_in) - a->a_rcvd;
}

tp_status
tp__auth_received(tp__auth *a, size_t n, const char *peer, tp_error **err_p)
{
    bool had_nonce = a->a_rcvd >= TP_AUTH_NONCE_LEN;
    a->a_rcvd += n;
    if (!had_nonce && a->a_rcvd >= TP_AUTH_NONCE_LEN) {
        // Our MAC over (our nonce, their nonce) may go now.
        auth_mac(a->a_label, a->a_acceptor, a->a_out, a->a_in,
                 a->a_out + TP_AUTH_NONCE_LEN);
        a->a_out_ready = sizeof(a->a_out);
    }
    if (a->a_rcvd == sizeof(a->a_in)) {
        uint8_t want[TP_AUTH_MAC_LEN];
        auth_mac(a->a_label, !a->a_acceptor, a->a_in, a->a_out, want);
        if (!auth_equal(want, a->a_in + TP_AUTH_NONCE_LEN, TP_AUTH_MAC_LEN)) {
            return tp__error_set(err_p, TP_EPERM,
                                 "%s: authentication failed: the peer does "
                                 "not hold this job's secret",
                                 peer);
        }
        a->a_ok = true;
    }
    return TP_OK;
}

bool
tp__auth_done(const tp__auth *a)
{
    return a->a_ok && a->a_sent == sizeof(a->a_out);
}

tp_status
tp__auth_pump(tp__auth *a, tp__auth_io io, void *ctx, bool send_only,
              const char *peer, bool *done_p, tp_error **err_p)
{
    *done_p = false;
    for (;;) {
        bool progress = false;
        const uint8_t *op;
        size_t nout = tp__auth_out(a, &op);
        if (nout > 0) {
            ssize_t n = io(ctx, true, (void *)op, nout);
            if (n > 0) {
                tp__auth_sent(a, (size_t)n);
                progress = true;
            } else if (n < 0 && errno == EINTR) {
                progress = true;
            } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
                return tp__error_errno(
                    err_p, errno, "%s: sending the job-secret proof", peer);
            }
        }
        uint8_t *ip;
        size_t nin = send_only ? 0 : tp__auth_in(a, &ip);
        if (nin > 0) {
            ssize_t n = io(ctx, false, ip, nin);
            if (n > 0) {
                tp_status st = tp__auth_received(a, (size_t)n, peer, err_p);
                if (st != TP_OK) {
                    return st;
                }
                progress = true;
            } else if (n == 0) {
                return tp__error_set(err_p, TP_EPERM,
                                     "%s: closed by the peer during "
                                     "authentication (it does not accept "
                                     "this job secret, or has none)",
                                     peer);
            } else if (errno == EINTR) {
                progress = true;
            } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
                return tp__error_errno(
                    err_p, errno, "%s: reading the job-secret proof", peer);
            }
        }
        if (tp__auth_done(a)) {
            *done_p = true;
            return TP_OK;
        }
        if (!progress) {
            return TP_OK; // wait for the socket
        }
    }
}

// tp__auth_io over a socket.
static ssize_t
auth_fd_io(void *ctx, bool send_, void *buf, size_t len)
{
    int fd = *(const int *)ctx;
    return send_ ? send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT)
                 : recv(fd, buf, len, MSG_DONTWAIT);
}

tp_status
tp__auth_run_fd(int fd, bool acceptor, const char *label, uint64_t deadline_ns,
                const char *peer, tp_error **err_p)
{
    tp__auth a;
    tp__auth_start(&a, acceptor, label);
    for (;;) {
        bool done = false;
        tp_status st =
            tp__auth_pump(&a, auth_fd_io, &fd, false, peer, &done, err_p);
        if (st != TP_OK || done) {
            return st;
        }
        if (deadline_ns != UINT64_MAX && tp__now_ns() >= deadline_ns) {
            return tp__error_set(err_p, TP_ETIMEDOUT,
                                 "%s: authentication timed out (%zu of %zu "
                                 "bytes received)",
                                 peer, a.a_rcvd, sizeof(a.a_in));
        }
        const uint8_t *op;
        struct pollfd pfd = {
            .fd = fd,
            .events = (short)(POLLIN | (tp__auth_out(&a, &op) ? POLLOUT : 0))};
        int ms =
            deadline_ns == UINT64_MAX
                ? -1
                : (int)TP_MIN(tp__ms_left(deadline_ns), (int64_t)INT32_MAX);
        if (poll(&pfd, 1, ms) < 0 && errno != EINTR) {
            return tp__error_errno(err_p, errno, "%s: authentication: poll",
                                   peer);
        }
    }
}

static bool
auth_is_local(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    }
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) {
            return true;
        }
        return IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) &&
               in6->sin6_addr.s6_addr[12] == 127;
    }
    return true; // unix sockets and the like: file permissions guard them
}

void
tp__auth_warn_open(const char *what, const struct sockaddr *sa)
{
    bool on = false;
    if (tp__auth_enabled(&on, NULL) != TP_OK || on || auth_is_local(sa)) {
        return;
    }
    const char *quiet = getenv("TP_AUTH_WARN");
    if (quiet != NULL && strcmp(quiet, "0") == 0) {
        return; // tools that only probe (tpipe info)
    }
    if (atomic_exchange(&g_warned, true)) {
        return;
    }
#define AUTH_OPEN_FMT                                                          \
    "%s accepts connections from the network without a job secret: anyone "    \
    "who can reach it can run this job's functions and read its store; set "   \
    "TP_JOB_TOKEN (or TP_JOB_TOKEN_FILE) in every rank (tpipe run does it; "   \
    "docs/security.md)"
    if (tp__log_enabled(TP_LOG_LEVEL_WARN)) {
        TP_LOG_WARN("TP-AUTH-OPEN", AUTH_OPEN_FMT, what);
    } else {
        // Logging is off by default; this one is worth a line anyway.
        fprintf(stderr, "tpipe: warning: " AUTH_OPEN_FMT "\n", what);
    }
#undef AUTH_OPEN_FMT
}
