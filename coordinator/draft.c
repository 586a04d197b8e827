/* draft.c - speculative proposals: n-gram prompt lookup and a fixed list (see draft.h). */
#include "coordinator/draft.h"
#include "common/file_read.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>

int draft_open(draft_source *d, const char *kind, const char *ids_path, const char *model_dir, k3_error *err) {
    memset(d, 0, sizeof *d);
    if (!kind) kind = "none";
    if (model_dir && !strcmp(kind, "none")) kind = "model";
    if (model_dir && strcmp(kind, "model")) return k3_fail(err, "--draft-model goes with --draft model (or no --draft)");
    if (ids_path && strcmp(kind, "ids")) return k3_fail(err, "--draft-ids needs --draft ids");
    if (!strcmp(kind, "none")) return 0;
    if (!strcmp(kind, "ngram")) {
        d->kind = DRAFT_NGRAM;
        return 0;
    }
    if (!strcmp(kind, "model")) {
        if (!model_dir) return k3_fail(err, "--draft model needs --draft-model DIR");
        d->kind = DRAFT_MODEL;
        d->model_dir = model_dir;
        return 0;
    }
    if (strcmp(kind, "ids")) return k3_fail(err, "--draft wants none|ngram|ids|model, got '%s'", kind);
    if (!ids_path) return k3_fail(err, "--draft ids needs --draft-ids FILE");
    d->kind = DRAFT_IDS;
    size_t len;
    char *text = file_read_all(ids_path, (size_t)64 << 20, &len, err);
    if (!text) return -1;
    size_t cap = 0;
    for (char *p = text; *p;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end && !strchr(" \t\r\n", *end))) {
            free(text);
            draft_close(d);
            return k3_fail(err, "%s: token id %zu is not a non-negative integer", ids_path, d->n_list + 1);
        }
        if (d->n_list == cap) {
            cap = cap ? 2 * cap : 256;
            int32_t *l = realloc(d->list, cap * sizeof *l);
            if (!l) { free(text); draft_close(d); return k3_fail(err, "out of memory reading %s", ids_path); }
            d->list = l;
        }
        d->list[d->n_list++] = (int32_t)v;
        p = end;
    }
    free(text);
    return 0;
}

int draft_attach(draft_source *d, const k3_config *tcfg, const state_fingerprint *tfp, const kernels *k, int threads,
                 size_t chunk, size_t cap, k3_error *err) {
    if (d->kind != DRAFT_MODEL || d->model) return 0;
    if (!(d->model = malloc(sizeof *d->model))) return k3_fail(err, "out of memory");
    if (draft_model_open(d->model, d->model_dir, tcfg, tfp, k, threads, chunk, cap, err)) {
        free(d->model);
        d->model = NULL;
        return -1;
    }
    return 0;
}

void draft_close(draft_source *d) {
    free(d->list);
    if (d->model) draft_model_close(d->model);
    free(d->model);
    memset(d, 0, sizeof *d);
}

const char *draft_name(const draft_source *d) {
    return d->kind == DRAFT_NGRAM ? "ngram" : d->kind == DRAFT_IDS ? "ids" : d->kind == DRAFT_MODEL ? "model" : "none";
}

static size_t ngram(const int32_t *h, size_t n, int32_t *out, size_t kmax) {
    size_t Lmax = n > 1 ? n - 1 : 0;
    if (Lmax > DRAFT_NGRAM_MAX) Lmax = DRAFT_NGRAM_MAX;
    for (size_t L = Lmax; L >= 1; L--) {
        const int32_t *suf = h + n - L;
        for (size_t j = n - L; j-- > 0;) { /* most recent earlier occurrence first */
            if (memcmp(h + j, suf, L * sizeof *h)) continue;
            size_t k = 0;
            for (size_t at = j + L; at < n && k < kmax; at++) out[k++] = h[at];
            if (k) return k;
        }
    }
    return 0;
}

int draft_propose(draft_source *d, const int32_t *hist, size_t n_hist, size_t n_generated, int32_t *out, size_t kmax,
                  size_t *n_out, k3_error *err) {
    *n_out = 0;
    if (d->kind == DRAFT_NGRAM) *n_out = ngram(hist, n_hist, out, kmax);
    if (d->kind == DRAFT_IDS) {
        size_t k = 0;
        for (size_t i = n_generated; i < d->n_list && k < kmax; i++) out[k++] = d->list[i];
        *n_out = k;
    }
    if (d->kind == DRAFT_MODEL) {
        if (!d->model) return k3_fail(err, "internal: the draft model was not attached");
        return draft_model_propose(d->model, hist, n_hist, out, kmax, n_out, err);
    }
    return 0;
}
