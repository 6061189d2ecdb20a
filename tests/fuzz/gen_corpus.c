// SPDX-License-Identifier: Apache-2.0
// gen_corpus.c - writes the seed corpus of the fuzz targets from valid
// encodings made by the real encoders (plus a few near misses: one byte
// off, one bound over). Usage, from the build directory:
//   tests/fuzz/fuzz_gen_corpus <source>/tests/fuzz/corpus
// It rewrites the seed files in place (deterministic output, so an
// unchanged wire format gives an unchanged corpus). Run it again after a
// change of the wire format and commit the result.

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "core/wire.h"
#include "fuzz.h"
#include "pipe/wire.h"

static const char *gen_root;
static int gen_count;

static void
gen_write(const char *target, const char *name, const uint8_t *data,
          size_t size)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", gen_root, target);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "mkdir %s: %s\n", path, strerror(errno));
        exit(1);
    }
    snprintf(path, sizeof(path), "%s/%s/%s", gen_root, target, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, size, f) != size || fclose(f) != 0) {
        fprintf(stderr, "write %s: %s\n", path, strerror(errno));
        exit(1);
    }
    gen_count++;
}

// fuzz_handshake inputs start with a selector byte.
static void
gen_write_hs(unsigned sel, const char *name, const uint8_t *data, size_t size)
{
    static uint8_t buf[1 + TP_WIRE_MAX_HANDSHAKE];
    FUZZ_CHECK(size < sizeof(buf));
    buf[0] = (uint8_t)sel;
    memcpy(buf + 1, data, size);
    gen_write("fuzz_handshake", name, buf, size + 1);
}

static void
gen_fill(char *dst, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        dst[i] = (char)('!' + (seed + i * 7) % 90);
    }
    dst[n] = '\0';
}

// ---- descriptor ----

static void
gen_desc(const char *name, uint32_t np, uint32_t nt, uint64_t mlen,
         unsigned info_len, uint64_t buf_len)
{
    tp_message *msg = NULL;
    FUZZ_CHECK(tp__message_create(np, nt, mlen, &msg) == TP_OK);
    for (uint64_t i = 0; i < mlen; i++) {
        ((uint8_t *)msg->metadata)[i] = (uint8_t)('a' + i % 26);
    }
    tp__chan_info *infos = nt > 0 ? calloc(nt, sizeof(*infos)) : NULL;
    for (uint32_t i = 0; i < np; i++) {
        msg->payloads[i].len = buf_len + i;
    }
    for (uint32_t i = 0; i < nt; i++) {
        msg->tensors[i].len = buf_len * 2 + i;
        infos[i].ci_len = (uint8_t)info_len;
        for (unsigned k = 0; k < info_len; k++) {
            infos[i].ci_bytes[k] = (uint8_t)(i * 16 + k);
        }
    }
    uint64_t size = tp__desc_size(msg, infos);
    uint8_t *out = malloc((size_t)size);
    FUZZ_CHECK(out != NULL);
    FUZZ_CHECK(tp__desc_encode(msg, infos, out, size) == size);
    gen_write("fuzz_desc", name, out, (size_t)size);
    free(out);
    free(infos);
    tp_message_destroy(msg);
}

static void
gen_desc_all(void)
{
    gen_desc("empty", 0, 0, 0, 0, 0);
    gen_desc("metadata-only", 0, 0, 40, 0, 0);
    gen_desc("one-payload", 1, 0, 8, 0, 100);
    gen_desc("one-tensor-cma-info", 0, 1, 0, 16, 4096);
    gen_desc("typical", 3, 5, 100, 12, 1000);
    gen_desc("tiny-limits-max", 4, 4, 64, 32, 1000);
    gen_desc("max-info", 0, 8, 0, TP_WIRE_MAX_CHAN_INFO, 1);
    gen_desc("huge-lengths", 2, 2, 0, 0, UINT64_C(1) << 62);
    // Near misses.
    uint8_t b[64] = {0};
    tp__put_u32le(b + 8, 2); // two payloads of 2^63: the sum overflows
    tp__put_u64le(b + 16, UINT64_C(1) << 63);
    tp__put_u64le(b + 24, UINT64_C(1) << 63);
    gen_write("fuzz_desc", "bad-sum-overflow", b, 32);
    memset(b, 0, sizeof(b));
    tp__put_u32le(b + 12, 1); // one tensor on device 1 (cuda)
    b[24] = 1;
    gen_write("fuzz_desc", "bad-device", b, 26);
    memset(b, 0, sizeof(b));
    gen_write("fuzz_desc", "bad-trailing", b, 17);
}

// ---- brochure ----

static tp__brochure gen_b;

static void
gen_brochure(const char *name)
{
    static uint8_t out[TP_WIRE_MAX_HANDSHAKE];
    size_t n = tp__brochure_encode(&gen_b, out, sizeof(out));
    FUZZ_CHECK(n > 0);
    gen_write("fuzz_brochure", name, out, n);
}

static void
gen_brochure_all(void)
{
    memset(&gen_b, 0, sizeof(gen_b));
    gen_brochure("empty");
    strcpy(gen_b.b_ctxname, "trainer-3");
    gen_b.b_ntransports = 2;
    strcpy(gen_b.b_transports[0].be_name, "shm");
    strcpy(gen_b.b_transports[0].be_domain, "boot:4f2a");
    strcpy(gen_b.b_transports[0].be_addr, "shm://tpipe-4242-1");
    strcpy(gen_b.b_transports[1].be_name, "tcp");
    strcpy(gen_b.b_transports[1].be_addr, "tcp://127.0.0.1:29500");
    gen_b.b_nchannels = 4;
    strcpy(gen_b.b_channels[0].be_name, "cma");
    strcpy(gen_b.b_channels[0].be_domain, "boot:4f2a/uid:1000");
    strcpy(gen_b.b_channels[1].be_name, "xth");
    strcpy(gen_b.b_channels[1].be_domain, "pid:4242");
    strcpy(gen_b.b_channels[2].be_name, "mpt");
    strcpy(gen_b.b_channels[3].be_name, "basic");
    gen_brochure("typical");

    memset(&gen_b, 0, sizeof(gen_b));
    gen_fill(gen_b.b_ctxname, TP_WIRE_MAX_CTXNAME, 0);
    gen_b.b_ntransports = TP_WIRE_MAX_BACKENDS;
    gen_b.b_nchannels = TP_WIRE_MAX_BACKENDS;
    for (unsigned i = 0; i < TP_WIRE_MAX_BACKENDS; i++) {
        gen_fill(gen_b.b_transports[i].be_name, TP_WIRE_MAX_NAME, i);
        gen_fill(gen_b.b_transports[i].be_domain, TP_WIRE_MAX_DOMAIN, i + 1);
        gen_fill(gen_b.b_transports[i].be_addr, TP_WIRE_MAX_ADDR, i + 2);
        gen_fill(gen_b.b_channels[i].be_name, TP_WIRE_MAX_NAME, i + 3);
        gen_fill(gen_b.b_channels[i].be_domain, TP_WIRE_MAX_DOMAIN, i + 4);
    }
    gen_brochure("max");

    // Near miss: 17 transports.
    uint8_t b[8] = {17, 0, 0, 0, 0};
    gen_write("fuzz_brochure", "bad-count", b, 5);
}

// ---- answer, join, frame header ----

static tp__answer gen_a;

static void
gen_answer(const char *name)
{
    static uint8_t out[TP_WIRE_MAX_HANDSHAKE];
    size_t n = tp__answer_encode(&gen_a, out, sizeof(out));
    FUZZ_CHECK(n > 0);
    gen_write_hs(1, name, out, n);
}

static void
gen_handshake_all(void)
{
    for (unsigned t = TP_FRAME_BROCHURE; t <= TP_FRAME_ACK; t++) {
        tp__frame_hdr h = {(uint8_t)t, TP_PIPE_WIRE_VERSION, t * 3, 100 * t};
        uint8_t out[TP_FRAME_HDR_LEN];
        tp__frame_hdr_encode(out, &h);
        char name[32];
        snprintf(name, sizeof(name), "hdr-type%u", t);
        gen_write_hs(0, name, out, sizeof(out));
    }

    memset(&gen_a, 0, sizeof(gen_a));
    strcpy(gen_a.a_ctxname, "server");
    strcpy(gen_a.a_reason, "no common transport");
    gen_answer("answer-refused");
    memset(&gen_a, 0, sizeof(gen_a));
    gen_a.a_accepted = true;
    strcpy(gen_a.a_ctxname, "server");
    strcpy(gen_a.a_transport, "shm");
    strcpy(gen_a.a_transport_addr, "shm://tpipe-77-3");
    gen_a.a_transport_reg_id = 5;
    strcpy(gen_a.a_channel, "mpt");
    gen_a.a_nconns = 2;
    strcpy(gen_a.a_conns[0].ac_addr, "tcp://127.0.0.1:29501");
    gen_a.a_conns[0].ac_reg_id = 6;
    strcpy(gen_a.a_conns[1].ac_addr, "tcp://127.0.0.1:29501");
    gen_a.a_conns[1].ac_reg_id = 7;
    gen_answer("answer-accepted");
    gen_a.a_nconns = TP_WIRE_MAX_CONNS;
    for (unsigned i = 0; i < TP_WIRE_MAX_CONNS; i++) {
        gen_fill(gen_a.a_conns[i].ac_addr, 40, i);
        gen_a.a_conns[i].ac_reg_id = 100 + i;
    }
    gen_answer("answer-max-conns");

    uint8_t j[TP_JOIN_LEN];
    tp__join_encode(42, 3, j);
    gen_write_hs(2, "join", j, sizeof(j));
    tp__join_encode(0, 0, j);
    gen_write_hs(2, "join-bad-reg-id", j, sizeof(j));
}

int
main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
        return 2;
    }
    gen_root = argv[1];
    if (mkdir(gen_root, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "mkdir %s: %s\n", gen_root, strerror(errno));
        return 1;
    }
    gen_desc_all();
    gen_brochure_all();
    gen_handshake_all();
    printf("wrote %d seed files under %s\n", gen_count, gen_root);
    return 0;
}
