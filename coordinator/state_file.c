/* state_file.c - saving and loading sequence state (contract: state_file.h). */
#define _GNU_SOURCE
#include "coordinator/state_file.h"
#include "common/file_read.h"
#include "common/hash64.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* What changes bits beyond the config: the numerics contract of docs/MODEL.md section 3 as this
 * engine implements it. Change the string when any kernel, norm or accumulation order changes. */
#define STATE_NUMERICS_ID \
    "k3 numerics 1: dot products 8 double lanes ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)); other sums sequential " \
    "double; fp-contract off; MLA latent norm eps 1e-6; bf16->f32 by shift; E2M1 x 2^k experts"

static const char MAGIC[8] = {'K', '3', 'S', 'T', 'A', 'T', 'E', 0};
enum { HDR = 24, SEC_HDR = 24, FPRT_LEN = 40, RUN_FIXED = 112, TOKS_FIXED = 16 };
#define MAX_HISTORY ((size_t)1 << 31)

/* ---------------------------------------------------------------- sizes */

static size_t kda_s_floats(const k3_config *c) { return (size_t)c->kda_num_heads * c->kda_head_dim * c->kda_head_dim; }
static size_t kda_conv_floats(const k3_config *c) {
    return 3 * (size_t)(c->short_conv_kernel_size - 1) * c->kda_num_heads * c->kda_head_dim;
}
static size_t mla_row(const k3_config *c) { return (size_t)c->kv_lora_rank + c->qk_rope_head_dim; }

uint64_t state_bytes_at(const k3_config *c, size_t pos) {
    uint64_t b = 0;
    for (int l = 0; l < c->num_hidden_layers; l++)
        b += c->layer_is_mla[l] ? (uint64_t)pos * mla_row(c) * 4 : (uint64_t)(kda_s_floats(c) + kda_conv_floats(c)) * 4;
    return b;
}

uint64_t state_file_bytes(const k3_config *c, size_t n_ids, size_t pos, size_t n_stop) {
    (void)pos;
    return HDR + (uint64_t)(3 + c->num_hidden_layers) * SEC_HDR + FPRT_LEN + RUN_FIXED + 4 * (uint64_t)n_stop +
           TOKS_FIXED + 4 * (uint64_t)n_ids + state_bytes_at(c, pos);
}

/* ---------------------------------------------------------------- fingerprint */

static int hash_file(const char *dir, const char *name, int optional, uint64_t *out, k3_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (optional && access(path, F_OK) != 0) { *out = hash64("absent", 6, 0); return 0; }
    size_t len = 0;
    char *b = file_read_all(path, (size_t)1 << 30, &len, err);
    if (!b) return -1;
    *out = hash64(b, len, 0);
    free(b);
    return 0;
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static int cmp_shard(const void *a, const void *b) {
    const ckpt_shard *x = *(ckpt_shard *const *)a, *y = *(ckpt_shard *const *)b;
    return strcmp(base_name(x->file.path), base_name(y->file.path));
}

/* Reads up to len bytes at off of path into buf; the count read, or -1. */
static long read_at(const char *path, uint64_t off, void *buf, size_t len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, (char *)buf + got, len - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    return (long)got;
}

int state_fingerprint_compute(state_fingerprint *fp, const char *model_dir, const char *tok_dir,
                              const checkpoint *ck, k3_error *err) {
    memset(fp, 0, sizeof *fp);
    if (!tok_dir) tok_dir = model_dir;
    if (hash_file(model_dir, "config.json", 0, &fp->config, err) ||
        hash_file(tok_dir, "tiktoken.model", 1, &fp->tok_model, err) ||
        hash_file(tok_dir, "tokenizer_config.json", 1, &fp->tok_config, err))
        return -1;
    hash64_state h;
    hash64_init(&h, 0);
    if (ck->has_index) {
        uint64_t ih;
        if (hash_file(model_dir, "model.safetensors.index.json", 0, &ih, err)) return -1;
        hash64_update(&h, &ih, 8);
    }
    ckpt_shard **sh = malloc((size_t)(ck->n_shards ? ck->n_shards : 1) * sizeof *sh);
    if (!sh) return k3_fail(err, "out of memory");
    for (int i = 0; i < ck->n_shards; i++) sh[i] = &ck->shards[i];
    qsort(sh, (size_t)ck->n_shards, sizeof *sh, cmp_shard);
    size_t cap = 4096;
    char *buf = malloc(cap);
    if (!buf) { free(sh); return k3_fail(err, "out of memory"); }
    int rc = 0;
    for (int i = 0; i < ck->n_shards && !rc; i++) {
        const st_file *f = &sh[i]->file;
        const char *bn = base_name(f->path);
        hash64_update(&h, bn, strlen(bn) + 1);
        if (!ck->has_index) { /* the header: 8-byte length + JSON */
            if (f->data_start > cap) {
                char *nb = f->data_start <= ((uint64_t)1 << 30) ? realloc(buf, f->data_start) : NULL;
                if (!nb) { rc = k3_fail(err, "%s: header too large to fingerprint", f->path); break; }
                buf = nb;
                cap = f->data_start;
            }
            long got = read_at(f->path, 0, buf, f->data_start);
            if (got != (long)f->data_start) { rc = k3_fail(err, "%s: cannot read the header to fingerprint", f->path); break; }
            hash64_update(&h, buf, f->data_start);
        }
        uint64_t avail = f->file_size > f->data_start ? f->file_size - f->data_start : 0;
        size_t want = avail < 4096 ? (size_t)avail : 4096;
        long got = read_at(f->path, f->data_start, buf, want);
        if (got != (long)want) { rc = k3_fail(err, "%s: cannot read tensor data to fingerprint", f->path); break; }
        hash64_update(&h, buf, want);
    }
    free(buf);
    free(sh);
    if (rc) return rc;
    fp->weights = hash64_digest(&h);
    fp->numerics = hash64(STATE_NUMERICS_ID, strlen(STATE_NUMERICS_ID), 0);
    return 0;
}

/* ---------------------------------------------------------------- writing */

typedef struct {
    int fd;
    uint64_t written;
    long long fault_at; /* -1 = none */
    int fault_crash;
    const char *path;
    k3_error *err;
} writer;

static int w_all(writer *w, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        size_t chunk = n;
        if (w->fault_at >= 0) {
            if (w->written >= (uint64_t)w->fault_at) {
                if (w->fault_crash) _exit(3);
                errno = ENOSPC;
                return k3_fail(w->err, "%s: write failed: %s (K3_STATE_FAULT)", w->path, strerror(errno));
            }
            if (w->written + chunk > (uint64_t)w->fault_at) chunk = (size_t)((uint64_t)w->fault_at - w->written);
        }
        ssize_t r = write(w->fd, c, chunk);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return k3_fail(w->err, "%s: write failed: %s", w->path, r < 0 ? strerror(errno) : "no progress");
        c += r;
        n -= (size_t)r;
        w->written += (uint64_t)r;
    }
    return 0;
}

typedef struct { const void *p; size_t n; } part;

static int w_section(writer *w, const char tag[4], uint32_t index, const part *parts, int np) {
    uint8_t hdr[SEC_HDR];
    uint64_t len = 0;
    for (int i = 0; i < np; i++) len += parts[i].n;
    memcpy(hdr, tag, 4);
    memcpy(hdr + 4, &index, 4);
    memcpy(hdr + 8, &len, 8);
    hash64_state h;
    hash64_init(&h, 0);
    hash64_update(&h, hdr, 16);
    for (int i = 0; i < np; i++) hash64_update(&h, parts[i].p, parts[i].n);
    uint64_t sum = hash64_digest(&h);
    memcpy(hdr + 16, &sum, 8);
    if (w_all(w, hdr, SEC_HDR)) return -1;
    for (int i = 0; i < np; i++)
        if (parts[i].n && w_all(w, parts[i].p, parts[i].n)) return -1;
    return 0;
}

static void put64(uint8_t *b, size_t *o, uint64_t v) { memcpy(b + *o, &v, 8); *o += 8; }
static void put32(uint8_t *b, size_t *o, uint32_t v) { memcpy(b + *o, &v, 4); *o += 4; }
static void putd(uint8_t *b, size_t *o, double v) { memcpy(b + *o, &v, 8); *o += 8; }

static void parse_fault(writer *w) {
    w->fault_at = -1;
    const char *f = getenv("K3_STATE_FAULT");
    if (!f) return;
    long long n;
    if (sscanf(f, "fail:%lld", &n) == 1) w->fault_at = n;
    else if (sscanf(f, "crash:%lld", &n) == 1) { w->fault_at = n; w->fault_crash = 1; }
}

int state_file_save(const char *path, const state_fingerprint *fp, const k3_config *cfg, const int32_t *ids,
                    size_t n_ids, const seq_state *st, const state_run *run, k3_error *err) {
    if (st->pos > n_ids) return k3_fail(err, "%s: state has %zu fed positions but a history of %zu", path, st->pos, n_ids);
    if (run->n_stop_ids > STATE_MAX_STOP_IDS) return k3_fail(err, "%s: more than %d stop ids", path, STATE_MAX_STOP_IDS);
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 8);
    if (!tmp) return k3_fail(err, "out of memory");
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".k3tmp", 7);
    writer w = {.fd = -1, .path = tmp, .err = err};
    parse_fault(&w);
    int rc = -1;
    w.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (w.fd < 0) { k3_fail(err, "cannot create %s: %s", tmp, strerror(errno)); free(tmp); return -1; }
    uint8_t hdr[HDR];
    memcpy(hdr, MAGIC, 8);
    uint32_t ver = STATE_FILE_VERSION, nsec = 3 + (uint32_t)cfg->num_hidden_layers;
    memcpy(hdr + 8, &ver, 4);
    memcpy(hdr + 12, &nsec, 4);
    uint64_t hs = hash64(hdr, 16, 0);
    memcpy(hdr + 16, &hs, 8);
    if (w_all(&w, hdr, HDR)) goto out;
    uint64_t fpr[5] = {fp->config, fp->tok_model, fp->tok_config, fp->weights, fp->numerics};
    part pf = {fpr, sizeof fpr};
    if (w_section(&w, "FPRT", 0, &pf, 1)) goto out;
    uint8_t rb[RUN_FIXED];
    size_t o = 0;
    put32(rb, &o, run->kind);
    put32(rb, &o, (run->text ? 1u : 0u) | (run->thinking ? 2u : 0u));
    put32(rb, &o, (uint32_t)run->tmpl);
    put32(rb, &o, (uint32_t)run->n_stop_ids);
    put64(rb, &o, run->gen_target);
    put64(rb, &o, run->n_prompt);
    put64(rb, &o, run->ckpt_every);
    putd(rb, &o, run->sampling.temperature);
    putd(rb, &o, run->sampling.top_p);
    putd(rb, &o, run->sampling.min_p);
    put64(rb, &o, (uint64_t)(int64_t)run->sampling.top_k);
    put64(rb, &o, run->sampling.seed);
    for (int i = 0; i < 4; i++) put64(rb, &o, run->rng.s[i]);
    part pr[2] = {{rb, o}, {run->stop_ids, run->n_stop_ids * 4}};
    if (w_section(&w, "RUN ", 0, pr, 2)) goto out;
    uint8_t tb[TOKS_FIXED];
    o = 0;
    put64(tb, &o, n_ids);
    put64(tb, &o, st->pos);
    part pt[2] = {{tb, o}, {ids, n_ids * 4}};
    if (w_section(&w, "TOKS", 0, pt, 2)) goto out;
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        if (cfg->layer_is_mla[l]) {
            part pm = {st->mla[l].cache, st->pos * mla_row(cfg) * 4};
            if (w_section(&w, "MLA ", (uint32_t)l, &pm, 1)) goto out;
        } else {
            part pk[2] = {{st->kda[l].S, kda_s_floats(cfg) * 4}, {st->kda[l].conv, kda_conv_floats(cfg) * 4}};
            if (w_section(&w, "KDA ", (uint32_t)l, pk, 2)) goto out;
        }
    }
    if (fsync(w.fd) != 0) { k3_fail(err, "%s: fsync failed: %s", tmp, strerror(errno)); goto out; }
    if (close(w.fd) != 0) { w.fd = -1; k3_fail(err, "%s: close failed: %s", tmp, strerror(errno)); goto out; }
    w.fd = -1;
    if (rename(tmp, path) != 0) { k3_fail(err, "cannot rename %s to %s: %s", tmp, path, strerror(errno)); goto out; }
    /* the rename itself must reach the disk */
    char *dir = strdup(path);
    if (!dir) { k3_fail(err, "out of memory"); rc = -1; free(tmp); return -1; }
    char *slash = strrchr(dir, '/');
    const char *d = slash ? (slash == dir ? "/" : (*slash = 0, dir)) : ".";
    int dfd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || fsync(dfd) != 0) k3_fail(err, "cannot fsync the directory %s: %s", d, strerror(errno));
    else rc = 0;
    if (dfd >= 0) close(dfd);
    free(dir);
    free(tmp);
    return rc;
out:
    if (w.fd >= 0) close(w.fd);
    unlink(tmp);
    free(tmp);
    return -1;
}

/* ---------------------------------------------------------------- reading */

typedef struct {
    int fd;                 /* or -1: memory */
    const uint8_t *mem;
    uint64_t size, off;
    const char *name;
    k3_error *err;
} reader;

static int r_bytes(reader *r, void *dst, size_t n) {
    if (r->fd < 0) {
        memcpy(dst, r->mem + r->off, n);
        r->off += n;
        return 0;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(r->fd, (char *)dst + got, n - got);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return k3_fail(r->err, "%s: read error: %s", r->name, strerror(errno));
        if (k == 0) return k3_fail(r->err, "%s: truncated: the file ends at byte %llu", r->name, (unsigned long long)(r->off + got));
        got += (size_t)k;
    }
    r->off += n;
    return 0;
}

typedef struct {
    char what[48];          /* "KDA layer 3" */
    uint64_t len, sum;
    hash64_state h;
} section;

/* Reads a section header, checks tag/index and that `expect` (or, if expect is 0, at most
 * max) bytes follow inside the file. */
static int r_section(reader *r, section *s, const char tag[4], uint32_t index, const char *what, uint64_t expect,
                     uint64_t max) {
    snprintf(s->what, sizeof s->what, "%s", what);
    uint8_t hdr[SEC_HDR];
    if (r->off + SEC_HDR > r->size)
        return k3_fail(r->err, "%s: truncated: section '%s' starts at byte %llu but the file ends at byte %llu", r->name,
                       what, (unsigned long long)r->off, (unsigned long long)r->size);
    if (r_bytes(r, hdr, SEC_HDR)) return -1;
    uint32_t idx;
    memcpy(&idx, hdr + 4, 4);
    memcpy(&s->len, hdr + 8, 8);
    memcpy(&s->sum, hdr + 16, 8);
    if (memcmp(hdr, tag, 4) != 0 || idx != index)
        return k3_fail(r->err, "%s: corrupt: expected section '%s' at byte %llu, found another tag or index", r->name,
                       what, (unsigned long long)(r->off - SEC_HDR));
    if (expect ? s->len != expect : s->len > max)
        return k3_fail(r->err, "%s: corrupt: section '%s' has length %llu, the model's config needs %llu", r->name, what,
                       (unsigned long long)s->len, (unsigned long long)(expect ? expect : max));
    if (s->len > r->size - r->off) /* not r->off + s->len > r->size: a length near 2^64 wraps that sum */
        return k3_fail(r->err, "%s: truncated: section '%s' needs %llu bytes at byte %llu but the file ends at byte %llu",
                       r->name, what, (unsigned long long)s->len, (unsigned long long)r->off,
                       (unsigned long long)r->size);
    hash64_init(&s->h, 0);
    hash64_update(&s->h, hdr, 16);
    return 0;
}

static int r_payload(reader *r, section *s, void *dst, size_t n) {
    if (r_bytes(r, dst, n)) return -1;
    hash64_update(&s->h, dst, n);
    return 0;
}

static int r_check(reader *r, section *s) {
    if (hash64_digest(&s->h) != s->sum)
        return k3_fail(r->err, "%s: corrupt: section '%s' fails its checksum (bit flip or partial write)", r->name,
                       s->what);
    return 0;
}

static uint64_t get64(const uint8_t *b, size_t *o) { uint64_t v; memcpy(&v, b + *o, 8); *o += 8; return v; }
static uint32_t get32(const uint8_t *b, size_t *o) { uint32_t v; memcpy(&v, b + *o, 4); *o += 4; return v; }
static double getd(const uint8_t *b, size_t *o) { double v; memcpy(&v, b + *o, 8); *o += 8; return v; }

static int fp_compare(reader *r, const state_fingerprint *mine, const uint64_t f[5]) {
    static const char *const what[5] = {
        "another model: its config.json differs",
        "another tokenizer: tiktoken.model differs",
        "another tokenizer: tokenizer_config.json differs",
        "another checkpoint: the weights (index or shard headers, sampled tensor bytes) differ",
        "another engine numerics version: its results would differ in the last bits",
    };
    const uint64_t m[5] = {mine->config, mine->tok_model, mine->tok_config, mine->weights, mine->numerics};
    for (int i = 0; i < 5; i++)
        if (f[i] != m[i])
            return k3_fail(r->err, "%s: the state was made with %s (fingerprint %016llx, this model %016llx)", r->name,
                           what[i], (unsigned long long)f[i], (unsigned long long)m[i]);
    return 0;
}

static int load(reader *r, const state_fingerprint *fp, const k3_config *cfg, size_t max_positions, seq_state *st,
                state_loaded *out) {
    memset(out, 0, sizeof *out);
    uint8_t hdr[HDR];
    if (r->size < HDR)
        return k3_fail(r->err, "%s: truncated: %llu bytes, not even a state file header", r->name,
                       (unsigned long long)r->size);
    if (r_bytes(r, hdr, HDR)) return -1;
    if (memcmp(hdr, MAGIC, 8) != 0) return k3_fail(r->err, "%s: not a k3 state file (bad magic)", r->name);
    uint64_t hs;
    memcpy(&hs, hdr + 16, 8);
    if (hash64(hdr, 16, 0) != hs) return k3_fail(r->err, "%s: corrupt: the header fails its checksum", r->name);
    uint32_t ver, nsec;
    memcpy(&ver, hdr + 8, 4);
    memcpy(&nsec, hdr + 12, 4);
    if (ver > STATE_FILE_VERSION)
        return k3_fail(r->err, "%s: written by a newer k3 (state format version %u; this build reads version %d)",
                       r->name, ver, STATE_FILE_VERSION);
    if (ver != STATE_FILE_VERSION)
        return k3_fail(r->err, "%s: unsupported state format version %u", r->name, ver);
    section s;
    /* fingerprint */
    uint64_t f[5];
    if (r_section(r, &s, "FPRT", 0, "fingerprint", FPRT_LEN, 0) || r_payload(r, &s, f, sizeof f) || r_check(r, &s))
        return -1;
    if (fp_compare(r, fp, f)) return -1;
    if (nsec != 3 + (uint32_t)cfg->num_hidden_layers)
        return k3_fail(r->err, "%s: corrupt: %u sections, this model needs %d", r->name, nsec, 3 + cfg->num_hidden_layers);
    /* run settings */
    uint8_t rb[RUN_FIXED + 4 * STATE_MAX_STOP_IDS];
    if (r_section(r, &s, "RUN ", 0, "run settings", 0, sizeof rb)) return -1;
    if (s.len < RUN_FIXED || (s.len - RUN_FIXED) % 4)
        return k3_fail(r->err, "%s: corrupt: section 'run settings' has length %llu", r->name, (unsigned long long)s.len);
    if (r_payload(r, &s, rb, (size_t)s.len) || r_check(r, &s)) return -1;
    size_t o = 0;
    state_run *ru = &out->run;
    ru->kind = get32(rb, &o);
    uint32_t flags = get32(rb, &o);
    ru->text = flags & 1;
    ru->thinking = (flags >> 1) & 1;
    ru->tmpl = (int)get32(rb, &o);
    uint32_t nstop = get32(rb, &o);
    ru->gen_target = get64(rb, &o);
    ru->n_prompt = get64(rb, &o);
    ru->ckpt_every = get64(rb, &o);
    ru->sampling.temperature = getd(rb, &o);
    ru->sampling.top_p = getd(rb, &o);
    ru->sampling.min_p = getd(rb, &o);
    int64_t tk = (int64_t)get64(rb, &o);
    ru->sampling.seed = get64(rb, &o);
    for (int i = 0; i < 4; i++) ru->rng.s[i] = get64(rb, &o);
    if (ru->kind > STATE_KIND_SNAPSHOT || flags > 3 || ru->tmpl < 0 || ru->tmpl > 2 ||
        (uint64_t)nstop * 4 != s.len - RUN_FIXED || tk < 0 || tk > (int64_t)1 << 30)
        return k3_fail(r->err, "%s: corrupt: impossible values in section 'run settings'", r->name);
    ru->sampling.top_k = (int)tk;
    k3_error se = {0};
    if (sampler_config_check(&ru->sampling, &se))
        return k3_fail(r->err, "%s: section 'run settings': %s", r->name, se.msg);
    if (nstop) {
        if (!(ru->stop_ids = malloc(nstop * sizeof *ru->stop_ids))) return k3_fail(r->err, "out of memory");
        memcpy(ru->stop_ids, rb + RUN_FIXED, nstop * 4);
        ru->n_stop_ids = nstop;
        for (size_t i = 0; i < nstop; i++)
            if (ru->stop_ids[i] < 0 || ru->stop_ids[i] >= cfg->vocab_size)
                return k3_fail(r->err, "%s: stop id %d is outside the vocabulary [0, %d)", r->name, ru->stop_ids[i],
                               cfg->vocab_size);
    }
    /* history */
    if (r_section(r, &s, "TOKS", 0, "token history", 0, UINT64_MAX)) return -1;
    uint8_t tb[TOKS_FIXED];
    if (s.len < TOKS_FIXED || (s.len - TOKS_FIXED) % 4)
        return k3_fail(r->err, "%s: corrupt: section 'token history' has length %llu", r->name, (unsigned long long)s.len);
    if (r_payload(r, &s, tb, TOKS_FIXED)) return -1;
    o = 0;
    uint64_t n_ids = get64(tb, &o), pos = get64(tb, &o);
    if (n_ids != (s.len - TOKS_FIXED) / 4 || pos > n_ids)
        return k3_fail(r->err, "%s: corrupt: section 'token history' counts disagree", r->name);
    if (n_ids > max_positions || n_ids > MAX_HISTORY)
        return k3_fail(r->err, "%s: its history of %llu positions exceeds --max-context %zu", r->name,
                       (unsigned long long)n_ids, max_positions);
    if (!(out->ids = malloc((n_ids ? n_ids : 1) * sizeof *out->ids))) return k3_fail(r->err, "out of memory");
    out->n_ids = n_ids;
    if (r_payload(r, &s, out->ids, n_ids * 4) || r_check(r, &s)) return -1;
    for (size_t i = 0; i < n_ids; i++)
        if (out->ids[i] < 0 || out->ids[i] >= cfg->vocab_size)
            return k3_fail(r->err, "%s: history id %d at position %zu is outside the vocabulary [0, %d)", r->name,
                           out->ids[i], i, cfg->vocab_size);
    if (ru->n_prompt > n_ids) return k3_fail(r->err, "%s: corrupt: prompt longer than the history", r->name);
    /* layers */
    k3_error rerr = {0};
    if (seq_state_reserve(st, cfg, pos ? pos : 1, &rerr)) return k3_fail(r->err, "%s", rerr.msg);
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        char what[48];
        if (cfg->layer_is_mla[l]) {
            snprintf(what, sizeof what, "MLA layer %d", l);
            size_t n = (size_t)pos * mla_row(cfg) * 4;
            if (r_section(r, &s, "MLA ", (uint32_t)l, what, n ? n : 0, 0) || r_payload(r, &s, st->mla[l].cache, n) ||
                r_check(r, &s))
                return -1;
        } else {
            snprintf(what, sizeof what, "KDA layer %d", l);
            size_t a = kda_s_floats(cfg) * 4, b = kda_conv_floats(cfg) * 4;
            if (r_section(r, &s, "KDA ", (uint32_t)l, what, a + b, 0) || r_payload(r, &s, st->kda[l].S, a) ||
                r_payload(r, &s, st->kda[l].conv, b) || r_check(r, &s))
                return -1;
        }
    }
    if (r->off != r->size)
        return k3_fail(r->err, "%s: corrupt: %llu unexpected bytes after the last section", r->name,
                       (unsigned long long)(r->size - r->off));
    st->pos = pos;
    return 0;
}

int state_file_load_mem(const void *buf, size_t len, const char *name, const state_fingerprint *fp,
                        const k3_config *cfg, size_t max_positions, seq_state *st, state_loaded *out, k3_error *err) {
    reader r = {.fd = -1, .mem = buf, .size = len, .name = name, .err = err};
    int rc = load(&r, fp, cfg, max_positions, st, out);
    if (rc) state_loaded_free(out);
    return rc;
}

int state_file_load(const char *path, const state_fingerprint *fp, const k3_config *cfg, size_t max_positions,
                    seq_state *st, state_loaded *out, k3_error *err) {
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return k3_fail(err, "cannot open the state file %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return k3_fail(err, "%s: not a regular file", path);
    }
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    reader r = {.fd = fd, .size = (uint64_t)sb.st_size, .name = path, .err = err};
    int rc = load(&r, fp, cfg, max_positions, st, out);
    close(fd);
    if (rc) state_loaded_free(out);
    return rc;
}

void state_loaded_free(state_loaded *l) {
    free(l->ids);
    free(l->run.stop_ids);
    memset(l, 0, sizeof *l);
}
