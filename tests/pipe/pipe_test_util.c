// SPDX-License-Identifier: Apache-2.0
// pipe_test_util.c - pipe_test's helpers (pipe_test.h): the pair under
// test from the environment, contexts and pipes allowed only that pair, and
// messages filled with a pattern and checked on arrival.

#include "tp_test.h"

#include <tpipe/pipe.h>

#include "pipe_test.h"
#include "tp_test_op.h"
#include "tp_test_pipe.h"

static const char *
env_or(const char *name, const char *def)
{
    const char *v = getenv(name);
    return (v != NULL && *v != '\0') ? v : def;
}

const char *
tr_name(void)
{
    return env_or("TP_PIPE_TRANSPORT", "tcp");
}

const char *
ch_name(void)
{
    return env_or("TP_PIPE_CHANNEL", "basic");
}

bool
in_process_only(void)
{
    return strcmp(ch_name(), "xth") == 0;
}

// A context allowed exactly the pair under test. Skips if the channel or
// transport cannot work here, with the context's reason.
tp_context *
make_ctx(const char *name)
{
    tp_context_options o;
    tp_context_options_init(&o);
    o.name = name;
    o.transports = tr_name();
    o.channels = ch_name();
    tp_context *ctx = NULL;
    tp_error *err = NULL;
    tp_status st = tp_context_create(&o, &ctx, &err);
    if (st != TP_OK) {
        tp_test_skip("transport %s not usable here: %s", tr_name(),
                     tp_error_message(err));
    }
    char *rep = tp_context_report(ctx);
    char line[64];
    snprintf(line, sizeof(line), "channel %s: usable", ch_name());
    if (strstr(rep, line) == NULL) {
        char copy[2048];
        snprintf(copy, sizeof(copy), "%s", rep);
        free(rep);
        tp_context_destroy(ctx);
        tp_test_skip("channel %s not usable here:\n%s", ch_name(), copy);
    }
    free(rep);
    return ctx;
}

static const char *
listen_url(void)
{
    return strcmp(tr_name(), "tcp") == 0 ? "tcp://127.0.0.1:0" : NULL;
}

tp_pipe_listener *
make_listener(tp_context *ctx)
{
    tp_pipe_listener *l = NULL;
    tp_error *err = NULL;
    const char *url = listen_url();
    TP_CHECK_OK(
        tp_context_listen(ctx, url ? &url : NULL, url ? 1 : 0, &l, &err), err);
    return l;
}

// A pipe between two contexts of this process, each allowed the pair.
void
pair_open(tp_test_pair *pr)
{
    tp_context *a = make_ctx("alice");
    tp_context *b = make_ctx("bob");
    tp_test_pair_open(pr, a, b, listen_url(), WAIT_MS);
}

// A pattern that differs per byte offset and per seed, 8 bytes per step
// (xorshift64), so 256 MiB tensors fill and check quickly.
static uint64_t
pattern_word(uint64_t i, uint32_t seed)
{
    uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ ((uint64_t)seed << 32);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    return x;
}

static void
fill(uint8_t *p, uint64_t n, uint32_t seed)
{
    if (n == 0) {
        return; // p may be NULL
    }
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w = pattern_word(i / 8, seed);
        memcpy(p + i, &w, 8);
    }
    uint64_t w = pattern_word(i / 8, seed);
    memcpy(p + i, &w, n - i);
}

static bool
check_fill(const uint8_t *p, uint64_t n, uint32_t seed)
{
    if (n == 0) {
        return true;
    }
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w = pattern_word(i / 8, seed);
        if (memcmp(p + i, &w, 8) != 0) {
            return false;
        }
    }
    uint64_t w = pattern_word(i / 8, seed);
    return memcmp(p + i, &w, n - i) == 0;
}

// A message with @np payloads and @nt tensors of the given sizes, filled.
tp_message *
make_msg(uint32_t np, const uint64_t *psz, uint32_t nt, const uint64_t *tsz,
         uint32_t seed)
{
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(np, nt, &m), NULL);
    char *meta = malloc(64);
    snprintf(meta, 64, "meta-%u", seed);
    m->metadata = meta;
    m->metadata_len = strlen(meta);
    for (uint32_t i = 0; i < np; i++) {
        m->payloads[i].len = psz[i];
        m->payloads[i].data = psz[i] ? malloc(psz[i]) : NULL;
        fill(m->payloads[i].data, psz[i], seed * 100 + i);
    }
    for (uint32_t i = 0; i < nt; i++) {
        m->tensors[i].len = tsz[i];
        m->tensors[i].data = tsz[i] ? malloc(tsz[i]) : NULL;
        fill(m->tensors[i].data, tsz[i], seed * 100 + 50 + i);
    }
    return m;
}

void
free_sent(tp_message *m)
{
    for (uint32_t i = 0; i < m->npayloads; i++) {
        free(m->payloads[i].data);
    }
    for (uint32_t i = 0; i < m->ntensors; i++) {
        free(m->tensors[i].data);
    }
    free(m->metadata);
    m->metadata = NULL;
    tp_message_destroy(m);
}

// Reads one message from @p and checks it against what make_msg built.
void
recv_check(tp_pipe *p, uint32_t np, const uint64_t *psz, uint32_t nt,
           const uint64_t *tsz, uint32_t seed)
{
    op rd;
    op_init(&rd, WAIT_MS);
    tp_pipe_read_descriptor(p, rd.aio);
    op_wait(&rd, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(rd.aio), tp_aio_error(rd.aio));
    tp_message *m = tp_aio_get_output(rd.aio, 0);
    TP_CHECK(m != NULL);
    char meta[64];
    snprintf(meta, sizeof(meta), "meta-%u", seed);
    TP_CHECK_EQ(m->metadata_len, strlen(meta));
    TP_CHECK(memcmp(m->metadata, meta, strlen(meta)) == 0);
    TP_CHECK_EQ(m->npayloads, np);
    TP_CHECK_EQ(m->ntensors, nt);
    for (uint32_t i = 0; i < np; i++) {
        TP_CHECK_EQ(m->payloads[i].len, psz[i]);
    }
    for (uint32_t i = 0; i < nt; i++) {
        TP_CHECK_EQ(m->tensors[i].len, tsz[i]);
    }
    // Half the buffers are ours, the other half the pipe allocates.
    void *mine[8] = {0};
    for (uint32_t i = 0; i < nt && i < 8; i++) {
        if (i % 2 == 0 && tsz[i] > 0) {
            mine[i] = malloc(tsz[i]);
            m->tensors[i].data = mine[i];
        }
    }
    atomic_store(&rd.done, 0);
    tp_pipe_read(p, m, rd.aio);
    op_wait(&rd, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(rd.aio), tp_aio_error(rd.aio));
    for (uint32_t i = 0; i < np; i++) {
        TP_CHECKF(check_fill(m->payloads[i].data, psz[i], seed * 100 + i),
                  "payload %u of message %u differs", i, seed);
    }
    for (uint32_t i = 0; i < nt; i++) {
        TP_CHECKF(check_fill(m->tensors[i].data, tsz[i], seed * 100 + 50 + i),
                  "tensor %u (%llu bytes) of message %u differs", i,
                  (unsigned long long)tsz[i], seed);
        if (i < 8 && mine[i] != NULL) {
            TP_CHECK(!m->tensors[i].pipe_owned);
        }
    }
    tp_message_destroy(m);
    for (int i = 0; i < 8; i++) {
        free(mine[i]);
    }
    op_fini(&rd);
}

// Writes @m on @tx and reads it on @rx. The write may complete only once
// the reader has the bytes (xth, cma read from the sender's buffer), so
// it is waited for after the read.
void
send_recv(tp_pipe *tx, tp_pipe *rx, tp_message *m, uint32_t np,
          const uint64_t *psz, uint32_t nt, const uint64_t *tsz, uint32_t seed)
{
    op w;
    op_init(&w, WAIT_MS);
    tp_pipe_write(tx, m, w.aio);
    recv_check(rx, np, psz, nt, tsz, seed);
    op_wait(&w, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(w.aio), tp_aio_error(w.aio));
    op_fini(&w);
}
