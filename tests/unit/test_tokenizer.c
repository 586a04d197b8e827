#define _GNU_SOURCE
/* Job: unit tests for the Kimi tokenizer (coordinator/tokenizer.c, unicode_classes.c, tokenize_cmd.c):
 * Unicode class table, the pattern split (expected pieces computed by tiktoken itself through
 * shared/tools/tokenizer-oracle/split.cjs), BPE merge order, linear vs heap BPE, specials allowed /
 * disallowed, the wrapper's 400k / 25k chunking, invalid UTF-8, streaming decode, corrupt files, the CLI.
 * Without arguments it runs the tests and exits non-zero on any failure. Driver modes used by
 * tests/t_30_tokenizer_oracle.sh and scripts/bench_tokenizer.sh:
 *   test_tokenizer --encode-file DIR FILE [--no-special]   (= k3 --tok DIR --encode FILE)
 *   test_tokenizer --decode-file DIR FILE                  (= k3 --tok DIR --decode FILE)
 *   test_tokenizer --corpus DIR CORPUS OUT   encode every corpus record (format: tests/tokenizer/
 *                                            make_corpus.mjs) to one id line each in OUT; checks
 *                                            decode(encode(x)) == x; exit 1 on a round-trip failure
 *   test_tokenizer --bench DIR FILE [SECONDS] encode throughput (MB/s) of FILE, specials allowed */
#include "coordinator/tokenize_cmd.h"
#include "coordinator/tokenizer.h"
#include "coordinator/unicode_classes.h"

#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "tests/unit/check.h"
#define HARNESS_NO_ENGINE
#include "tests/unit/harness.h"

/* a cleared k3_error for the next call (the first failure wins, so each call gets a fresh one) */
#define ERRP (k3_error_clear(&err), &err)



static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) die("out of memory");
    return p;
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f)) die(path);
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *b = xmalloc(cap + 1);
    for (;;) {
        if (n == cap) {
            char *nb = realloc(b, 2 * cap + 1);
            if (!nb) die("out of memory");
            b = nb;
            cap *= 2;
        }
        size_t r = fread(b + n, 1, cap - n, f);
        n += r;
        if (!r) break;
    }
    fclose(f);
    b[n] = 0;
    *len = n;
    return b;
}

/* ------------------------------------------------------------ synthetic vocabularies */

typedef struct {
    char *buf;
    size_t n, cap;
} sbuf;

static void sb_add(sbuf *s, const void *p, size_t n)
{
    if (s->n + n + 1 > s->cap) {
        size_t nc = s->cap ? s->cap : 1024;
        while (nc < s->n + n + 1) nc *= 2;
        char *nb = realloc(s->buf, nc);
        if (!nb) die("out of memory");
        s->buf = nb;
        s->cap = nc;
    }
    memcpy(s->buf + s->n, p, n);
    s->n += n;
    s->buf[s->n] = 0;
}

static void sb_printf(sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *s, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int l = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (l < 0 || (size_t)l >= sizeof tmp) die("sb_printf overflow");
    sb_add(s, tmp, (size_t)l);
}

static void sb_b64(sbuf *s, const unsigned char *p, size_t n)
{
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < n; i += 3) {
        uint32_t w = (uint32_t)p[i] << 16;
        if (i + 1 < n) w |= (uint32_t)p[i + 1] << 8;
        if (i + 2 < n) w |= p[i + 2];
        char q[4] = { A[(w >> 18) & 63], A[(w >> 12) & 63], i + 1 < n ? A[(w >> 6) & 63] : '=',
                      i + 2 < n ? A[w & 63] : '=' };
        sb_add(s, q, 4);
    }
}

/* tiktoken.model: 256 single bytes (rank = byte value) then the given tokens in order. */
static void make_vocab(const char *dir, const char *const *toks, size_t ntoks, const char *config)
{
    mkdir(dir, 0700);
    sbuf s = { 0 };
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        sb_b64(&s, &c, 1);
        sb_printf(&s, " %d\n", b);
    }
    for (size_t i = 0; i < ntoks; i++) {
        sb_b64(&s, (const unsigned char *)toks[i], strlen(toks[i]));
        sb_printf(&s, " %zu\n", 256 + i);
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/tiktoken.model", dir);
    write_file(path, s.buf, s.n);
    free(s.buf);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    write_file(path, config, strlen(config));
}


static void path_in(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", test_tmpdir, name);
}

static int ids_eq(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

static void print_ids(const char *label, const int32_t *ids, size_t n)
{
    fprintf(stderr, "  %s (%zu):", label, n);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "%s\n", n > 40 ? " ..." : "");
}

/* ------------------------------------------------------------ tests */

static void test_unicode_table(void)
{
    size_t bad = 0;
    for (uint32_t c = 0; c <= UC_MAX_CP + 5; c++)
        if (uc_class(c) != uc_class_search(c)) bad++;
    CHECK(bad == 0, "%zu code points differ between the two lookups", bad);
    CHECK(uc_nruns > 3000 && uc_nruns < 3400, "runs %zu", uc_nruns);
    static const struct { uint32_t cp; unsigned mask; } want[] = {
        { 'a', UC_L | UC_W }, { 'A', UC_L | UC_U }, { '1', UC_N }, { ' ', UC_WS | UC_PYSPACE },
        { '\n', UC_WS | UC_PYSPACE }, { 0x1C, UC_PYSPACE }, { 0x1F, UC_PYSPACE }, { '!', 0 }, { 0, 0 },
        { 0x4E00, UC_L | UC_HAN }, { 0x3001, 0 }, { 0x30FC, UC_L | UC_U | UC_W }, { 0x2EBF0, UC_L | UC_HAN },
        { 0x323B0, 0 }, { 0x31350, UC_L | UC_HAN }, { 0x0301, UC_M | UC_U | UC_W }, { 0x3007, UC_N | UC_HAN },
        { 0x2E80, UC_HAN }, { 0x3005, UC_L | UC_HAN }, { 0x01C5, UC_L | UC_U }, { 0x02B0, UC_L | UC_U | UC_W },
        { 0x00A0, UC_WS | UC_PYSPACE }, { 0x0085, UC_WS | UC_PYSPACE }, { 0x3000, UC_WS | UC_PYSPACE },
        { 0xFEFF, 0 }, { 0x200B, 0 }, { 0x017F, UC_L | UC_W }, { 0x0661, UC_N }, { 0x2167, UC_N },
        { 0x0903, UC_M | UC_U | UC_W }, { 0x1C89, UC_L | UC_U }, { 0x110000, 0 },
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK(uc_class(want[i].cp) == want[i].mask, "U+%04X: class 0x%02X, want 0x%02X", want[i].cp,
              uc_class(want[i].cp), want[i].mask);
    /* Han ranges of the spec (Script=Han, Unicode 16.0) */
    static const uint32_t han[][2] = {
        { 0x2E80, 0x2E99 }, { 0x2E9B, 0x2EF3 }, { 0x2F00, 0x2FD5 }, { 0x3005, 0x3005 }, { 0x3007, 0x3007 },
        { 0x3021, 0x3029 }, { 0x3038, 0x303B }, { 0x3400, 0x4DBF }, { 0x4E00, 0x9FFF }, { 0xF900, 0xFA6D },
        { 0xFA70, 0xFAD9 }, { 0x16FE2, 0x16FE3 }, { 0x16FF0, 0x16FF1 }, { 0x20000, 0x2A6DF },
        { 0x2A700, 0x2B739 }, { 0x2B740, 0x2B81D }, { 0x2B820, 0x2CEA1 }, { 0x2CEB0, 0x2EBE0 },
        { 0x2EBF0, 0x2EE5D }, { 0x2F800, 0x2FA1D }, { 0x30000, 0x3134A }, { 0x31350, 0x323AF },
    };
    size_t nhan = 0, inside = 0;
    for (size_t i = 0; i < sizeof han / sizeof han[0]; i++)
        for (uint32_t c = han[i][0]; c <= han[i][1]; c++) {
            inside++;
            nhan += (uc_class(c) & UC_HAN) != 0;
        }
    size_t total = 0;
    for (uint32_t c = 0; c <= UC_MAX_CP; c++) total += (uc_class(c) & UC_HAN) != 0;
    CHECK(nhan == inside && total == inside, "Han: %zu of %zu in the spec ranges, %zu in total", nhan, inside,
          total);
}

static const struct {
    const char *text;
    const char *pieces[32];
} split_cases[] = {
    {"getUserName iPhone helloWorld HTTPServer", {"get", "User", "Name", " i", "Phone", " hello", "World", " HTTPServer", NULL}},
    {"\344\270\255\346\226\207abc \346\227\245\346\234\254\350\252\236\343\203\206\343\202\271\343\203\210 \343\200\205y \342\272\200\344\270\200x", {"\344\270\255\346\226\207", "abc", " ", "\346\227\245\346\234\254\350\252\236", "\343\203\206\343\202\271\343\203\210", " ", "\343\200\205", "y", " \342\272\200", "\344\270\200", "x", NULL}},
    {"I'M can't WE'LL you're", {"I'M", " can't", " WE'LL", " you're", NULL}},
    {"a\360\256\257\260b a\360\261\215\220b a\360\262\216\260b a\342\272\200b a\357\244\200b a\343\200\207b a\343\203\274b a\343\200\201b", {"a", "\360\256\257\260", "b", " a", "\360\261\215\220", "b", " a", "\360\262\216\260b", " a", "\342\272\200", "b", " a", "\357\244\200", "b", " a", "\343\200\207", "b", " a\343\203\274b", " a", "\343\200\201b", NULL}},
    {"x  \012\012  y   z\011\011\012", {"x", "  \012\012", " ", " y", "  ", " z", "\011\011\012", NULL}},
    {"1234567 \331\241\331\242\331\243\331\244 \302\275", {"123", "456", "7", " ", "\331\241\331\242\331\243", "\331\244", " ", "\302\275", NULL}},
    {"path/to/file.c // comment", {"path", "/to", "/file", ".c", " //", " comment", NULL}},
    {"na\303\257ve caf\303\251 \303\234n\303\257c\303\266d\303\251 e\314\201", {"na\303\257ve", " caf\303\251", " \303\234n\303\257c\303\266d\303\251", " e\314\201", NULL}},
    {"\360\237\244\226\360\237\221\251\342\200\215\360\237\221\251\342\200\215\360\237\221\247!!\012\012", {"\360\237\244\226\360\237\221\251\342\200\215\360\237\221\251\342\200\215\360\237\221\247!!\012\012", NULL}},
    {"Hello \344\275\240\345\245\275\344\270\226\347\225\214\357\274\214\350\277\231\346\230\257\346\265\213\350\257\225\343\200\202OK", {"Hello", " ", "\344\275\240\345\245\275\344\270\226\347\225\214", "\357\274\214", "\350\277\231\346\230\257\346\265\213\350\257\225", "\343\200\202OK", NULL}},
    {"'\305\277 x'\305\277 don'\305\277t 'Sx 'LL 'lL 'Ll", {"'\305\277", " x'\305\277", " don'\305\277", "t", " '", "Sx", " '", "LL", " '", "l", "L", " '", "Ll", NULL}},
    {"\314\201abc \314\201\314\201 \307\205x \312\260a A\312\260", {"\314\201abc", " \314\201\314\201", " \307\205x", " \312\260a", " A\312\260", NULL}},
    {" !x  !x \011!x", {" !", "x", " ", " !", "x", " ", "\011", "!x", NULL}},
    {"a \302\240b\343\200\200\343\200\200c  ", {"a", " ", "\302\240b", "\343\200\200", "\343\200\200c", "  ", NULL}},
    {"\015\012\015\012  \012 x", {"\015\012\015\012  \012", " x", NULL}},
    {"\034\034x \342\200\250y", {"\034\034", "x", " ", "\342\200\250y", NULL}},
    {"abc'", {"abc", "'", NULL}},
    {"A'S'T", {"A'S", "'T", NULL}},
    {"12a 3b4", {"12", "a", " ", "3", "b", "4", NULL}},
    {"..\015\012..\012\012!", {"..\015\012", "..\012\012", "!", NULL}},
    {"x\012y", {"x", "\012", "y", NULL}},
    {" \012", {" \012", NULL}},
    {"  \011\012\011 ", {"  \011\012", "\011 ", NULL}},
    {"\344\270\255'sx", {"\344\270\255", "'sx", NULL}},
};

static void test_split(void)
{
    for (size_t i = 0; i < sizeof split_cases / sizeof split_cases[0]; i++) {
        const char *t = split_cases[i].text;
        size_t *ends, n;
        k3_error err = {0};
        int rc = tokenizer_pretokenize(t, strlen(t), &ends, &n, ERRP);
        CHECK(rc == 0, "case %zu: %s", i, err.msg);
        if (rc) continue;
        size_t want = 0;
        while (split_cases[i].pieces[want]) want++;
        int ok = n == want;
        for (size_t k = 0, st = 0; ok && k < n; st = ends[k], k++) {
            const char *p = split_cases[i].pieces[k];
            ok = ends[k] - st == strlen(p) && memcmp(t + st, p, strlen(p)) == 0;
        }
        CHECK(ok, "case %zu \"%s\": split differs from tiktoken", i, t);
        if (!ok) {
            for (size_t k = 0, st = 0; k < n; st = ends[k], k++)
                fprintf(stderr, "  got [%.*s]\n", (int)(ends[k] - st), t + st);
        }
        free(ends);
    }
}

/* --- BPE */

static const char *const bpe_toks[] = { "bc", "ab", "cd", "abcd", "aa", "aaaa", "xy", "xyz" };
#define NB_BPE (256 + sizeof bpe_toks / sizeof bpe_toks[0])

static tokenizer *load_or_die(const char *dir)
{
    k3_error err = {0};
    tokenizer *t = tokenizer_load(dir, ERRP);
    if (!t) {
        fprintf(stderr, "load %s: %s\n", dir, err.msg);
        die("cannot load test tokenizer");
    }
    return t;
}

static void check_bpe(const tokenizer *t, const char *piece, int method, const int32_t *want, size_t nwant)
{
    int32_t *ids;
    size_t n;
    int rc = tokenizer_bpe_piece(t, piece, strlen(piece), method, &ids, &n);
    CHECK(rc == 0 && ids_eq(ids, n, want, nwant), "bpe(\"%s\", method %d)", piece, method);
    if (rc == 0 && !ids_eq(ids, n, want, nwant)) {
        print_ids("got", ids, n);
        print_ids("want", want, nwant);
    }
    free(ids);
}

/* Reference BPE straight from the definition, with a linear token table. */
static long naive_rank(const char *const *toks, size_t nt, const char *p, size_t n)
{
    if (n == 1) return (unsigned char)p[0];
    for (size_t i = 0; i < nt; i++)
        if (strlen(toks[i]) == n && memcmp(toks[i], p, n) == 0) return (long)(256 + i);
    return -1;
}

static size_t naive_bpe(const char *const *toks, size_t nt, const char *p, size_t len, int32_t *out)
{
    size_t *b = xmalloc((len + 1) * sizeof *b), nb = len + 1;
    for (size_t i = 0; i <= len; i++) b[i] = i;
    for (;;) {
        long best = -1;
        size_t bi = 0;
        for (size_t i = 0; i + 2 < nb; i++) {
            long r = naive_rank(toks, nt, p + b[i], b[i + 2] - b[i]);
            if (r >= 0 && (best < 0 || r < best)) { best = r; bi = i; }
        }
        if (best < 0) break;
        memmove(b + bi + 1, b + bi + 2, (nb - bi - 2) * sizeof *b);
        nb--;
    }
    for (size_t i = 0; i + 1 < nb; i++) out[i] = (int32_t)naive_rank(toks, nt, p + b[i], b[i + 1] - b[i]);
    free(b);
    return nb - 1;
}

static void test_bpe(void)
{
    char dir[600];
    path_in(dir, sizeof dir, "bpe");
    make_vocab(dir, bpe_toks, sizeof bpe_toks / sizeof bpe_toks[0], "{\"added_tokens_decoder\": {}}");
    tokenizer *t = load_or_die(dir);
    CHECK(tokenizer_n_base(t) == NB_BPE && tokenizer_n_special(t) == 256 &&
          tokenizer_vocab_size(t) == NB_BPE + 256, "sizes %zu %zu", tokenizer_n_base(t), tokenizer_n_special(t));
    for (int m = 0; m <= 2; m++) {
        /* lowest-ranked concatenation first: "bc" (256) before "ab" (257) */
        check_bpe(t, "abc", m, (const int32_t[]){ 'a', 256 }, 2);
        check_bpe(t, "abcdx", m, (const int32_t[]){ 'a', 256, 'd', 'x' }, 4);
        check_bpe(t, "aaa", m, (const int32_t[]){ 260, 'a' }, 2);         /* leftmost on ties */
        check_bpe(t, "aaaaa", m, (const int32_t[]){ 261, 'a' }, 2);
        check_bpe(t, "xyzq", m, (const int32_t[]){ 263, 'q' }, 2);        /* merged parts re-checked */
        check_bpe(t, "cdab", m, (const int32_t[]){ 258, 257 }, 2);
        check_bpe(t, "q", m, (const int32_t[]){ 'q' }, 1);
    }
    /* whole-piece lookup first (method 0 only): "abcd" is a token though no merge path reaches it */
    check_bpe(t, "abcd", 0, (const int32_t[]){ 259 }, 1);
    check_bpe(t, "abcd", 1, (const int32_t[]){ 'a', 256, 'd' }, 3);
    tokenizer_free(t);

    /* random vocabulary over {a,b,c}: linear, heap and the naive definition agree */
    static char store[200][8];
    const char *toks[200];
    size_t nt = 0;
    uint32_t seed = 12345;
#define RND(n) ((seed = seed * 1103515245u + 12345u), (seed >> 8) % (n))
    for (int len = 2; len <= 4; len++) {
        int total = 1;
        for (int k = 0; k < len; k++) total *= 3;
        for (int v = 0; v < total; v++) {
            if (RND(10) < 3) continue;
            int x = v;
            for (int k = 0; k < len; k++, x /= 3) store[nt][k] = (char)('a' + x % 3);
            store[nt][len] = 0;
            toks[nt] = store[nt];
            nt++;
        }
    }
    for (size_t i = nt; i > 1; i--) { /* shuffle the ranks */
        size_t j = RND(i);
        const char *tmp = toks[i - 1];
        toks[i - 1] = toks[j];
        toks[j] = tmp;
    }
    path_in(dir, sizeof dir, "bpe-rand");
    make_vocab(dir, toks, nt, "{\"added_tokens_decoder\": {}}");
    t = load_or_die(dir);
    char piece[400];
    int32_t *want = xmalloc(sizeof piece * sizeof *want);
    size_t bad = 0;
    for (int it = 0; it < 3000; it++) {
        size_t len = 1 + RND(it % 10 == 0 ? 390 : 40);
        for (size_t k = 0; k < len; k++) piece[k] = "abcabcx"[RND(7)];
        piece[len] = 0;
        size_t nw = naive_bpe(toks, nt, piece, len, want);
        for (int m = 1; m <= 2; m++) {
            int32_t *ids;
            size_t n;
            if (tokenizer_bpe_piece(t, piece, len, m, &ids, &n) != 0) die("bpe");
            if (!ids_eq(ids, n, want, nw) && bad++ < 3) fprintf(stderr, "  bpe mismatch method %d: %s\n", m, piece);
            free(ids);
        }
    }
#undef RND
    CHECK(bad == 0, "%zu random pieces differ from the naive BPE", bad);
    free(want);
    tokenizer_free(t);
}

/* --- specials and chunking */

static char special_dir[600];

static void make_special_vocab(void)
{
    path_in(special_dir, sizeof special_dir, "spec");
    char cfg[512];
    snprintf(cfg, sizeof cfg,
             "{\"added_tokens_decoder\": {\"%zu\": {\"content\": \"[BOS]\", \"special\": true},"
             " \"%zu\": {\"content\": \"<|open|>\"}, \"%zu\": {\"content\": \"<|op|>\"}, \"%zu\": {\"content\": \"[PAD]\"}}}",
             NB_BPE, NB_BPE + 3, NB_BPE + 4, NB_BPE + 255);
    make_vocab(special_dir, bpe_toks, sizeof bpe_toks / sizeof bpe_toks[0], cfg);
}

static void enc(const tokenizer *t, const char *s, size_t len, int sp, int32_t **ids, size_t *n)
{
    k3_error err = {0};
    if (tokenizer_encode(t, s, len, sp, ids, n, ERRP) != 0) {
        fprintf(stderr, "encode: %s\n", err.msg);
        die("encode failed");
    }
}

static void check_enc(const tokenizer *t, const char *s, int sp, const int32_t *want, size_t nwant)
{
    int32_t *ids;
    size_t n;
    enc(t, s, strlen(s), sp, &ids, &n);
    CHECK(ids_eq(ids, n, want, nwant), "encode(\"%s\", special %d)", s, sp);
    if (!ids_eq(ids, n, want, nwant)) {
        print_ids("got", ids, n);
        print_ids("want", want, nwant);
    }
    char *out;
    size_t olen;
    CHECK(tokenizer_decode(t, ids, n, &out, &olen, NULL) == 0 && olen == strlen(s) &&
          memcmp(out, s, olen) == 0, "round trip \"%s\"", s);
    free(out);
    free(ids);
}

static void test_specials(void)
{
    tokenizer *t = load_or_die(special_dir);
    const int32_t B = (int32_t)NB_BPE;
    char name[64];
    CHECK(tokenizer_special_id(t, "[BOS]") == B, "[BOS]");
    CHECK(tokenizer_special_id(t, "<|open|>") == B + 3, "<|open|>");
    CHECK(tokenizer_special_id(t, "[PAD]") == B + 255, "[PAD]");
    snprintf(name, sizeof name, "<|reserved_token_%d|>", B + 1);
    CHECK(tokenizer_special_id(t, name) == B + 1, "%s", name);
    snprintf(name, sizeof name, "<|reserved_token_%d|>", B + 256);
    CHECK(tokenizer_special_id(t, name) == -1, "%s", name);
    CHECK(tokenizer_special_id(t, "ab") == -1, "base token is not special");
    CHECK(tokenizer_is_special(t, B) && tokenizer_is_special(t, B + 255) && !tokenizer_is_special(t, B - 1) &&
          !tokenizer_is_special(t, B + 256) && !tokenizer_is_special(t, -1), "is_special");
    const char *bytes;
    size_t len;
    CHECK(tokenizer_token_bytes(t, B + 3, &bytes, &len) == 0 && len == 8 && !memcmp(bytes, "<|open|>", 8), "bytes");
    CHECK(tokenizer_token_bytes(t, B + 256, &bytes, &len) == -1, "out of range");

    check_enc(t, "a[BOS]b<|open|>", 1, (const int32_t[]){ 'a', B, 'b', B + 3 }, 4);
    check_enc(t, "[BOS][BOS]", 1, (const int32_t[]){ B, B }, 2);
    check_enc(t, "<|op|><|open|", 1, (const int32_t[]){ B + 4, '<', '|', 'o', 'p', 'e', 'n', '|' }, 8);
    /* the pattern never runs across a special: " x" is one piece, " " alone before a special */
    check_enc(t, " <|open|> x", 1, (const int32_t[]){ ' ', B + 3, ' ', 'x' }, 4);
    snprintf(name, sizeof name, "x<|reserved_token_%d|>", B + 7);
    check_enc(t, name, 1, (const int32_t[]){ 'x', B + 7 }, 2);
    /* disallowed: plain text */
    check_enc(t, "a[BOS]", 0, (const int32_t[]){ 'a', '[', 'B', 'O', 'S', ']' }, 6);
    int32_t *ids;
    size_t n;
    const char *s = "<|open|>message role=\"user\"<|sep|>hi[PAD]";
    enc(t, s, strlen(s), 0, &ids, &n);
    int any = 0;
    for (size_t i = 0; i < n; i++) any |= ids[i] >= B;
    CHECK(!any, "special id with specials disallowed");
    free(ids);
    /* empty input */
    enc(t, "", 0, 1, &ids, &n);
    CHECK(n == 0 && ids != NULL, "empty");
    free(ids);
    /* decode of specials, out of range ids */
    char *out;
    k3_error err = {0};
    CHECK(tokenizer_decode(t, (const int32_t[]){ B + 3, 'h', 'i', B + 255 }, 4, &out, &len, ERRP) == 0 &&
          len == 15 && !strcmp(out, "<|open|>hi[PAD]"), "decode specials");
    free(out);
    CHECK(tokenizer_decode(t, (const int32_t[]){ 'a', B + 256 }, 2, &out, &len, ERRP) == -1 &&
          strstr(err.msg, "position 1"), "decode out of range: %s", err.msg);
    CHECK(tokenizer_decode(t, (const int32_t[]){ -5 }, 1, &out, &len, ERRP) == -1, "negative id");
    tokenizer_free(t);
}

/* encode(a ++ b) == encode(a) ++ encode(b) where the wrapper cuts between a and b */
static void check_cut(const tokenizer *t, const char *a, size_t la, const char *b, size_t lb, int sp, const char *what)
{
    char *all = xmalloc(la + lb + 1);
    memcpy(all, a, la);
    memcpy(all + la, b, lb);
    int32_t *x, *y, *z;
    size_t nx, ny, nz;
    enc(t, all, la + lb, sp, &x, &nx);
    enc(t, a, la, sp, &y, &ny);
    enc(t, b, lb, sp, &z, &nz);
    int32_t *yz = xmalloc((ny + nz + 1) * sizeof *yz);
    memcpy(yz, y, ny * sizeof *y);
    memcpy(yz + ny, z, nz * sizeof *z);
    CHECK(ids_eq(x, nx, yz, ny + nz), "%s: encoding differs from the two pieces", what);
    free(all);
    free(x);
    free(y);
    free(z);
    free(yz);
}

static char *rep(const char *unit, size_t times, size_t *len)
{
    size_t ul = strlen(unit);
    char *s = xmalloc(ul * times + 1);
    for (size_t i = 0; i < times; i++) memcpy(s + i * ul, unit, ul);
    s[ul * times] = 0;
    *len = ul * times;
    return s;
}

static void test_chunking(void)
{
    tokenizer *t = load_or_die(special_dir);
    size_t la, lb;
    char *a = rep(" ", 25000, &la);
    check_cut(t, a, la, " x", 2, 1, "25001 spaces");
    /* exactly 25000: no cut, so " x" joins ("  x" pieces differ from the cut version) */
    {
        int32_t *x, *y;
        size_t nx, ny;
        char *s = rep(" ", 25000, &lb);
        char *s2 = xmalloc(lb + 2);
        memcpy(s2, s, lb);
        memcpy(s2 + lb, "x", 2);
        enc(t, s2, lb + 1, 1, &x, &nx);
        enc(t, s, lb - 1, 1, &y, &ny); /* 24999 spaces then " x" */
        CHECK(nx == ny + 2 && x[nx - 2] == ' ' && x[nx - 1] == 'x', "25000 spaces + x");
        free(x);
        free(y);
        free(s);
        free(s2);
    }
    free(a);
    a = rep("a", 25000, &la);
    check_cut(t, a, la, "a b", 3, 1, "25001 letters");
    free(a);
    a = rep("\x1c", 25000, &la); /* Python whitespace, but \S for the pattern */
    check_cut(t, a, la, "\x1c" "a", 2, 1, "25001 x U+001C");
    free(a);
    a = rep("\xe3\x80\x80", 25000, &la); /* U+3000, 3 bytes: counts code points, not bytes */
    check_cut(t, a, la, "\xe3\x80\x80" "a", 4, 1, "25001 x U+3000");
    free(a);
    /* 400,000-code-point slices */
    a = rep("ab \xc3\xa9", 100000, &la); /* 400,000 code points */
    check_cut(t, a, la, "cd ef", 5, 1, "400k slice");
    free(a);
    {
        /* "[BOS]" starts 2 code points before the 400k cut: it is not a special there */
        char *s = rep("ab ", 133333, &la); /* 399,999 code points */
        s[la - 1] = 0;
        la--;
        char *s2 = xmalloc(la + 8);
        memcpy(s2, s, la);
        memcpy(s2 + la, "[BOS]zz", 7);
        int32_t *x;
        size_t nx;
        enc(t, s2, la + 7, 1, &x, &nx);
        int any = 0;
        for (size_t i = 0; i < nx; i++) any |= x[i] == (int32_t)NB_BPE;
        CHECK(!any, "special across the 400k cut must not match");
        free(x);
        check_cut(t, s2, 400000, s2 + 400000, la + 7 - 400000, 1, "400k cut inside a special");
        /* the same special inside the slice is one */
        enc(t, s2 + 10, la + 7 - 10, 1, &x, &nx);
        CHECK(nx >= 3 && x[nx - 3] == (int32_t)NB_BPE, "special before the cut");
        free(x);
        free(s2);
        free(s);
    }
    tokenizer_free(t);
}

static void test_invalid_utf8(void)
{
    tokenizer *t = load_or_die(special_dir);
    static const struct { const char *s; size_t len, off; } cases[] = {
        { "\x80", 1, 0 }, { "ab\xc0\xaf", 4, 2 }, { "a\xed\xa0\x80", 4, 1 }, { "\xf4\x90\x80\x80", 4, 0 },
        { "abc\xe4\xb8", 5, 3 }, { "x\xe4\xb8\xadz\xff", 6, 5 }, { "\xf8\x88\x80\x80\x80", 5, 0 },
        { "ok\xe0\x80\xaf", 5, 2 }, { "\xf0\x9f\x98", 3, 0 }, { "\xc3\xa9\xc3", 3, 2 }, { "12345678\x80", 9, 8 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int32_t *ids = (int32_t *)1;
        size_t n = 99;
        char want[64];
        k3_error err = {0};
        int rc = tokenizer_encode(t, cases[i].s, cases[i].len, 1, &ids, &n, ERRP);
        snprintf(want, sizeof want, "byte offset %zu ", cases[i].off);
        CHECK(rc == -1 && ids == NULL && n == 0 && strstr(err.msg, want), "case %zu: rc %d err \"%s\"", i, rc, err.msg);
        CHECK(utf8_valid_prefix(cases[i].s, cases[i].len) == cases[i].off, "valid prefix %zu", i);
    }
    /* valid edge cases */
    static const char *ok[] = { "\xc2\x80", "\xdf\xbf", "\xe0\xa0\x80", "\xed\x9f\xbf", "\xee\x80\x80",
                                "\xf0\x90\x80\x80", "\xf4\x8f\xbf\xbf", "" };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        CHECK(utf8_valid_prefix(ok[i], strlen(ok[i])) == strlen(ok[i]), "valid %zu", i);
    int32_t *ids;
    size_t n;
    CHECK(tokenizer_encode(t, "a\0b", 3, 1, &ids, &n, NULL) == 0 && n == 3 && ids[1] == 0, "NUL byte");
    free(ids);
    tokenizer_free(t);
}

/* --- streaming */

static void test_stream(void)
{
    tokenizer *t = load_or_die(special_dir);
    const char *text = "a\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80 b<|open|>\xe2\x82\xac\xf0\x90\x8d\x88!";
    int32_t *ids;
    size_t n;
    enc(t, text, strlen(text), 1, &ids, &n);
    for (int replace = 0; replace <= 1; replace++) {
        utf8_stream st;
        utf8_stream_init(&st, replace);
        char got[256], out[UTF8_STREAM_MAX_OUT(64)];
        size_t g = 0;
        int halves = 0;
        for (size_t i = 0; i < n; i++) {
            const char *b;
            size_t l;
            if (tokenizer_token_bytes(t, ids[i], &b, &l)) die("token bytes");
            size_t w = utf8_stream_push(&st, b, l, out);
            if (utf8_valid_prefix(out, w) != w) halves++;
            memcpy(got + g, out, w);
            g += w;
        }
        size_t w = utf8_stream_flush(&st, out);
        CHECK(w == 0, "nothing left at the end");
        CHECK(!halves && g == strlen(text) && !memcmp(got, text, g), "stream replace=%d", replace);
    }
    free(ids);
    /* every split of a multi-byte text into two pushes */
    const char *u = "\xf0\x9f\x98\x80\xe4\xb8\xad\xc3\xa9";
    size_t ul = strlen(u);
    for (size_t cut = 0; cut <= ul; cut++) {
        utf8_stream st;
        utf8_stream_init(&st, 1);
        char out[UTF8_STREAM_MAX_OUT(16)], all[64];
        size_t w1 = utf8_stream_push(&st, u, cut, out);
        CHECK(utf8_valid_prefix(out, w1) == w1, "cut %zu: first push", cut);
        memcpy(all, out, w1);
        size_t w2 = utf8_stream_push(&st, u + cut, ul - cut, out);
        CHECK(utf8_valid_prefix(out, w2) == w2, "cut %zu: second push", cut);
        memcpy(all + w1, out, w2);
        CHECK(w1 + w2 == ul && !memcmp(all, u, ul), "cut %zu", cut);
    }
    /* ill-formed input */
    static const struct { const char *in, *rep, *raw, *flush_rep; } bad[] = {
        { "\xe4\xb8" "a", "\xef\xbf\xbd" "a", "\xe4\xb8" "a", "" },
        { "\xc0", "\xef\xbf\xbd", "\xc0", "" },
        { "\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", "\xed\xa0\x80", "" },
        { "x\xf0\x9f", "x", "x", "\xef\xbf\xbd" },
        { "\x80\xe2\x82", "\xef\xbf\xbd", "\x80", "\xef\xbf\xbd" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        for (int replace = 0; replace <= 1; replace++) {
            utf8_stream st;
            utf8_stream_init(&st, replace);
            char out[UTF8_STREAM_MAX_OUT(8)];
            size_t w = utf8_stream_push(&st, bad[i].in, strlen(bad[i].in), out);
            const char *want = replace ? bad[i].rep : bad[i].raw;
            CHECK(w == strlen(want) && !memcmp(out, want, w), "bad %zu replace %d", i, replace);
            w = utf8_stream_flush(&st, out);
            if (replace) CHECK(w == strlen(bad[i].flush_rep) && !memcmp(out, bad[i].flush_rep, w), "flush %zu", i);
            CHECK(utf8_stream_flush(&st, out) == 0, "second flush %zu", i);
        }
    }
    tokenizer_free(t);
}

/* --- corrupt files */

static void expect_load_error(const char *model, const char *config, const char *want1, const char *want2)
{
    char dir[600], path[700];
    k3_error err = {0};
    path_in(dir, sizeof dir, "bad");
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/tiktoken.model", dir);
    if (model) write_file(path, model, strlen(model));
    else unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (config) write_file(path, config, strlen(config));
    else unlink(path);
    tokenizer *t = tokenizer_load(dir, ERRP);
    CHECK(!t && strstr(err.msg, want1) && (!want2 || strstr(err.msg, want2)), "want \"%s\" / \"%s\", got \"%s\"", want1,
          want2 ? want2 : "", err.msg);
    tokenizer_free(t);
}

static char *good_model(const char *extra)
{
    sbuf s = { 0 };
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        sb_b64(&s, &c, 1);
        sb_printf(&s, " %d\n", b);
    }
    sb_add(&s, extra, strlen(extra));
    return s.buf;
}

static void test_corrupt(void)
{
    const char *cfg = "{\"added_tokens_decoder\": {}}";
    k3_error err = {0};
    char missing[600];
    path_in(missing, sizeof missing, "no-such-dir");
    tokenizer *t = tokenizer_load(missing, ERRP);
    CHECK(!t && strstr(err.msg, "tiktoken.model") && strstr(err.msg, "cannot open"), "%s", err.msg);
    char *m;
    m = good_model("YWI= 256\nYWJj\n");
    expect_load_error(m, cfg, "tiktoken.model:258: corrupt line", NULL);
    free(m);
    m = good_model("YWI= 256\nYWJj 2x57\n");
    expect_load_error(m, cfg, "tiktoken.model:258: corrupt line", "bad rank");
    free(m);
    m = good_model("YWI= 256\nYWJj 256\n");
    expect_load_error(m, cfg, "tiktoken.model:258: duplicate rank 256", NULL);
    free(m);
    m = good_model("YWI= 256\nYW!j 257\n");
    expect_load_error(m, cfg, "tiktoken.model:258: bad base64", NULL);
    free(m);
    m = good_model("YWI= 256\nYWJ 257\n");
    expect_load_error(m, cfg, "tiktoken.model:258: bad base64", NULL);
    free(m);
    m = good_model("YWI= 256\nYWI= 257\n");
    expect_load_error(m, cfg, "tiktoken.model:258: duplicate token", "rank 256");
    free(m);
    m = good_model("YWI= 256\nYWJj 300\n");
    expect_load_error(m, cfg, "tiktoken.model:258: rank 300 out of range", NULL);
    free(m);
    expect_load_error("YQ== 0\n", cfg, "tiktoken.model: byte 0x00 is not a token", NULL);
    expect_load_error("", cfg, "tiktoken.model: no tokens", NULL);
    m = good_model("");
    expect_load_error(m, NULL, "tokenizer_config.json", "cannot open");
    expect_load_error(m, "{\"added_tokens_decoder\": {", "tokenizer_config.json:1:", NULL);
    expect_load_error(m, "{}", "tokenizer_config.json: no \"added_tokens_decoder\"", NULL);
    expect_load_error(m, "{\"added_tokens_decoder\": {\"12\": {\"content\": \"x\"}}}", "tokenizer_config.json",
                      "outside the special range");
    expect_load_error(m, "{\"added_tokens_decoder\": {\"256\": {\"content\": \"x\"}, \"257\": {\"content\": \"x\"}}}",
                      "tokenizer_config.json", "same text");
    expect_load_error(m, "{\"added_tokens_decoder\": {\"abc\": {\"content\": \"x\"}}}", "is not an id", NULL);
    expect_load_error(m, "{\"added_tokens_decoder\": {\"256\": {\"special\": true}}}", "no usable \"content\"", NULL);
    free(m);
    /* CRLF lines and blank lines are fine; more specials when the config names ids past n_base + 255 */
    m = good_model("YWI= 256\r\n\nYWJj 257\r\n");
    char dir[600], path[700];
    path_in(dir, sizeof dir, "crlf");
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/tiktoken.model", dir);
    write_file(path, m, strlen(m));
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    const char *c2 = "{\"added_tokens_decoder\": {\"515\": {\"content\": \"[X]\"}}}";
    write_file(path, c2, strlen(c2));
    t = tokenizer_load(dir, ERRP);
    CHECK(t && tokenizer_n_base(t) == 258 && tokenizer_n_special(t) == 258 && tokenizer_special_id(t, "[X]") == 515,
          "crlf / 258 specials: %s", t ? "" : err.msg);
    tokenizer_free(t);
    free(m);
}

/* --- CLI */

static int run_cmd(const char *dir, const char *enc_f, const char *dec_f, int no_special, char **out, size_t *olen)
{
    char cap[700];
    path_in(cap, sizeof cap, "stdout.txt");
    fflush(stdout);
    int saved = dup(1);
    int fd = open(cap, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (saved < 0 || fd < 0 || dup2(fd, 1) < 0) die("redirect stdout");
    close(fd);
    int rc = tokenize_command(dir, enc_f, dec_f, no_special);
    fflush(stdout);
    if (dup2(saved, 1) < 0) die("restore stdout");
    close(saved);
    *out = read_all(cap, olen);
    if (!*out) die("read captured stdout");
    return rc;
}

static void test_cli(void)
{
    char in[700], out_s[64];
    char *out;
    size_t olen;
    path_in(in, sizeof in, "cli.txt");
    write_file(in, "a[BOS]b", 7);
    CHECK(run_cmd(special_dir, in, NULL, 0, &out, &olen) == 0, "encode rc");
    snprintf(out_s, sizeof out_s, "97 %zu 98\n", NB_BPE);
    CHECK(!strcmp(out, out_s), "encode output \"%s\"", out);
    free(out);
    CHECK(run_cmd(special_dir, in, NULL, 1, &out, &olen) == 0 && !strcmp(out, "97 91 66 79 83 93 98\n"),
          "--no-special \"%s\"", out);
    free(out);
    write_file(in, "", 0);
    CHECK(run_cmd(special_dir, in, NULL, 0, &out, &olen) == 0 && !strcmp(out, "\n"), "empty file");
    free(out);
    snprintf(out_s, sizeof out_s, "104 105\n%zu 10\n", NB_BPE + 3);
    write_file(in, out_s, strlen(out_s));
    CHECK(run_cmd(special_dir, NULL, in, 0, &out, &olen) == 0 && olen == 11 && !memcmp(out, "hi<|open|>\n", 11),
          "decode");
    free(out);
    write_file(in, "97 9x", 5);
    CHECK(run_cmd(special_dir, NULL, in, 0, &out, &olen) == 2 && olen == 0, "bad id");
    free(out);
    snprintf(out_s, sizeof out_s, "97 %zu", NB_BPE + 256);
    write_file(in, out_s, strlen(out_s));
    CHECK(run_cmd(special_dir, NULL, in, 0, &out, &olen) == 2, "id out of range");
    free(out);
    write_file(in, "-1", 2);
    CHECK(run_cmd(special_dir, NULL, in, 0, &out, &olen) == 2, "negative id");
    free(out);
    write_file(in, "ok\xff", 3);
    CHECK(run_cmd(special_dir, in, NULL, 0, &out, &olen) == 2 && olen == 0, "invalid UTF-8");
    free(out);
    char missing[700];
    path_in(missing, sizeof missing, "missing.txt");
    CHECK(run_cmd(special_dir, missing, NULL, 0, &out, &olen) == 2, "missing input");
    free(out);
    CHECK(run_cmd(special_dir, NULL, NULL, 0, &out, &olen) == 2, "usage");
    free(out);
    CHECK(run_cmd(special_dir, in, in, 0, &out, &olen) == 2, "usage both");
    free(out);
    CHECK(run_cmd(missing, in, NULL, 0, &out, &olen) == 2, "bad tokenizer dir (a refused input, like the model path)");
    free(out);
}

/* ------------------------------------------------------------ driver modes */

static int corpus_mode(const char *dir, const char *corpus, const char *outpath)
{
    k3_error err = {0};
    tokenizer *t = tokenizer_load(dir, ERRP);
    if (!t) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    size_t len;
    char *buf = read_all(corpus, &len);
    if (!buf) {
        fprintf(stderr, "%s: cannot read\n", corpus);
        tokenizer_free(t);
        return 1;
    }
    FILE *o = fopen(outpath, "wb");
    if (!o) die(outpath);
    size_t nrec = 0, ntok = 0, rt_bad = 0, pos = 0;
    int rc = 0;
    while (pos < len) {
        size_t nb;
        int sp, hl;
        char name[256];
        if (sscanf(buf + pos, "@ %zu %d %255s%n", &nb, &sp, name, &hl) != 3 || pos + (size_t)hl + 1 + nb + 1 > len) {
            fprintf(stderr, "%s: bad record header at byte %zu\n", corpus, pos);
            rc = 1;
            break;
        }
        const char *text = buf + pos + hl + 1;
        int32_t *ids;
        size_t n;
        if (tokenizer_encode(t, text, nb, sp, &ids, &n, ERRP) != 0) {
            fprintf(stderr, "%s: %s\n", name, err.msg);
            rc = 1;
            break;
        }
        for (size_t i = 0; i < n; i++) fprintf(o, i ? " %d" : "%d", ids[i]);
        fputc('\n', o);
        char *dec;
        size_t dl;
        if (tokenizer_decode(t, ids, n, &dec, &dl, ERRP) != 0 || dl != nb || memcmp(dec, text, nb)) {
            if (rt_bad++ < 5) fprintf(stderr, "round trip failed: %s\n", name);
        }
        free(dec);
        free(ids);
        ntok += n;
        nrec++;
        pos += (size_t)hl + 1 + nb + 1;
    }
    if (fclose(o)) rc = 1;
    printf("corpus: %zu records, %zu tokens, %zu round-trip failures\n", nrec, ntok, rt_bad);
    free(buf);
    tokenizer_free(t);
    return rc || rt_bad ? 1 : 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int bench_mode(const char *dir, const char *file, double seconds)
{
    k3_error err = {0};
    double t0 = now_s();
    tokenizer *t = tokenizer_load(dir, ERRP);
    if (!t) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    double load = now_s() - t0;
    size_t len;
    char *buf = read_all(file, &len);
    if (!buf) {
        tokenizer_free(t);
        return 1;
    }
    size_t reps = 0, ntok = 0;
    t0 = now_s();
    double c0 = cpu_s(), el;
    do {
        int32_t *ids;
        size_t n;
        if (tokenizer_encode(t, buf, len, 1, &ids, &n, ERRP) != 0) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        ntok = n;
        free(ids);
        reps++;
        el = now_s() - t0;
    } while (el < seconds || reps < 3);
    double cpu = cpu_s() - c0;
    printf("load %.3f s; encode %zu bytes -> %zu tokens, %zu reps in %.3f s wall, %.3f s cpu: %.2f MB/s wall, %.2f MB/s cpu\n",
           load, len, ntok, reps, el, cpu, (double)len * (double)reps / el / 1e6, (double)len * (double)reps / cpu / 1e6);
    free(buf);
    tokenizer_free(t);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 4 && !strcmp(argv[1], "--encode-file"))
        return tokenize_command(argv[2], argv[3], NULL, argc >= 5 && !strcmp(argv[4], "--no-special"));
    if (argc == 4 && !strcmp(argv[1], "--decode-file")) return tokenize_command(argv[2], NULL, argv[3], 0);
    if (argc == 5 && !strcmp(argv[1], "--corpus")) return corpus_mode(argv[2], argv[3], argv[4]);
    if (argc >= 4 && !strcmp(argv[1], "--bench")) return bench_mode(argv[2], argv[3], argc >= 5 ? atof(argv[4]) : 2.0);
    if (argc != 1) {
        fprintf(stderr, "usage: %s [--encode-file DIR FILE [--no-special] | --decode-file DIR FILE |"
                        " --corpus DIR CORPUS OUT | --bench DIR FILE [SECONDS]]\n", argv[0]);
        return 2;
    }
    test_tmpdir_make("test_tokenizer");
    make_special_vocab();
    test_unicode_table();
    test_split();
    test_bpe();
    test_specials();
    test_chunking();
    test_invalid_utf8();
    test_stream();
    test_corrupt();
    test_cli();
    test_tmpdir_remove();
    return check_report("test_tokenizer");
}
