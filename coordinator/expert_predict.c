/* expert_predict.c - next-layer expert prediction from router scores (see expert_predict.h). */
#include "coordinator/expert_predict.h"
#include "common/mono_clock.h"
#include "coordinator/layers.h"
#include <stdlib.h>
#include <string.h>

struct expert_predict {
    k3_model *m;
    ep_mode mode;
    int n_layers, N, K;
    int *next_moe;           /* [n_layers]: the next MoE layer after l, -1 none */
    dense_weight *router;    /* [n_layers]: bf16 copies (data NULL for layers without one) */
    uint16_t *copies;
    int32_t *pred;           /* [n_layers][N]: the prediction for each layer */
    size_t *n_pred;          /* [n_layers]; 0: none pending */
    uint32_t *count;         /* [N] scratch */
    uint8_t *mark;           /* [N] scratch */
    ep_stats st;
};

uint64_t expert_predict_bytes(const k3_config *c) {
    uint64_t n = 0;
    int first = 1;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (!c->layer_is_moe[l]) continue;
        if (!first) n += (uint64_t)c->num_experts * (uint64_t)c->hidden_size * 2;
        first = 0;
    }
    /* the predicted lists and the scratch */
    return n + (uint64_t)c->num_hidden_layers * (uint64_t)c->num_experts * 4 + (uint64_t)c->num_experts * 5;
}

void expert_predict_free(expert_predict *p) {
    if (!p) return;
    free(p->next_moe);
    free(p->router);
    free(p->copies);
    free(p->pred);
    free(p->n_pred);
    free(p->count);
    free(p->mark);
    free(p);
}

expert_predict *expert_predict_create(k3_model *m, ep_mode mode, k3_error *err) {
    const k3_config *c = &m->cfg;
    expert_predict *p = calloc(1, sizeof *p);
    if (!p) { k3_fail(err, "out of memory"); return NULL; }
    p->m = m;
    p->mode = mode;
    p->n_layers = c->num_hidden_layers;
    p->N = c->num_experts;
    p->K = c->num_experts_per_token;
    size_t L = (size_t)p->n_layers, N = (size_t)p->N, E = (size_t)c->hidden_size;
    p->next_moe = malloc(L * sizeof *p->next_moe);
    p->router = calloc(L, sizeof *p->router);
    p->pred = malloc(L * N * sizeof *p->pred);
    p->n_pred = calloc(L, sizeof *p->n_pred);
    p->count = calloc(N, sizeof *p->count);
    p->mark = calloc(N, 1);
    size_t n_copies = 0;
    int first = -1;
    for (int l = 0; l < p->n_layers; l++)
        if (c->layer_is_moe[l]) { if (first >= 0) n_copies++; else first = l; }
    p->copies = malloc((n_copies ? n_copies : 1) * N * E * sizeof *p->copies);
    if (!p->next_moe || !p->router || !p->pred || !p->n_pred || !p->count || !p->mark || !p->copies) {
        expert_predict_free(p);
        k3_fail(err, "out of memory for the expert predictor's router copies");
        return NULL;
    }
    int next = -1;
    for (int l = p->n_layers - 1; l >= 0; l--) {
        p->next_moe[l] = next;
        if (c->layer_is_moe[l]) next = l;
    }
    size_t at = 0;
    float *row = malloc(E * sizeof *row);
    if (!row) { expert_predict_free(p); k3_fail(err, "out of memory"); return NULL; }
    for (int l = 0; l < p->n_layers; l++) {
        if (!c->layer_is_moe[l] || l == first) continue;
        const dense_weight *w = &m->layers[l].moe.router;
        const ckpt_entry *ce = NULL;
        for (int u = 0; u < m->n_units && !ce; u++)
            for (int j = 0; j < m->units[u].n; j++)
                if (m->units[u].w[j] == w) { ce = m->units[u].e[j]; break; }
        if (!ce || w->rows != N || w->cols != E) {
            free(row);
            expert_predict_free(p);
            k3_fail(err, "internal: the router of layer %d is not a trunk matrix of [%zu, %zu]", l, N, E);
            return NULL;
        }
        uint16_t *dst = p->copies + at * N * E;
        size_t es = w->dtype == DTYPE_F32 ? 4 : 2;
        for (size_t r = 0; r < N; r++) {
            if (checkpoint_read(&m->ck, ce, (uint64_t)r * E * es, es == 4 ? (void *)row : (void *)(dst + r * E), E * es, err)) {
                free(row);
                expert_predict_free(p);
                return NULL;
            }
            if (es == 4)
                for (size_t i = 0; i < E; i++) {
                    uint32_t b;
                    memcpy(&b, &row[i], 4);
                    dst[r * E + i] = (uint16_t)(b >> 16); /* truncated: a prediction needs no more */
                }
        }
        p->router[l] = (dense_weight){DTYPE_BF16, N, E, dst, -1, 0};
        at++;
    }
    free(row);
    return p;
}

ep_mode expert_predict_mode(const expert_predict *p) { return p ? p->mode : EP_OFF; }

int expert_predict_next(expert_predict *p, const kernels *k, int layer, const float *x, size_t R, float *logits,
                        int32_t *ids, double *weights, const int32_t **list, size_t *n) {
    *list = NULL;
    *n = 0;
    if (!p || p->mode == EP_OFF || layer < 0 || layer >= p->n_layers) return -1;
    int nl = p->next_moe[layer];
    if (nl < 0 || !p->router[nl].data) return -1;
    double t0 = k3_now_s();
    const k3_config *c = &p->m->cfg;
    size_t N = (size_t)p->N, K = (size_t)p->K;
    matmul_dense(k, &p->router[nl], x, R, logits);
    int32_t *out = p->pred + (size_t)nl * N;
    size_t m = 0;
    for (size_t t = 0; t < R; t++) {
        if (moe_route(c, logits + t * N, p->m->layers[nl].moe.router_bias, ids + t * K, weights + t * K)) continue;
        for (size_t j = 0; j < K; j++) {
            int e = ids[t * K + j];
            if (!p->count[e]++) out[m++] = e;
        }
    }
    /* most tokens first, then the lower id (insertion sort: m <= N) */
    for (size_t i = 1; i < m; i++) {
        int32_t e = out[i];
        size_t j = i;
        while (j > 0 && (p->count[out[j - 1]] < p->count[e] || (p->count[out[j - 1]] == p->count[e] && out[j - 1] > e))) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = e;
    }
    for (size_t i = 0; i < m; i++) p->count[out[i]] = 0;
    p->n_pred[nl] = m;
    p->st.predict_s += k3_now_s() - t0;
    *list = out;
    *n = m;
    return nl;
}

void expert_predict_score(expert_predict *p, int layer, const int32_t *ids, size_t n) {
    if (!p || layer < 0 || layer >= p->n_layers || !p->n_pred[layer]) return;
    size_t N = (size_t)p->N, np = p->n_pred[layer];
    const int32_t *pr = p->pred + (size_t)layer * N;
    for (size_t i = 0; i < np; i++) p->mark[pr[i]] = 1;
    uint64_t actual = 0, correct = 0;
    for (size_t i = 0; i < n; i++) {
        int e = ids[i];
        if (e < 0 || (size_t)e >= N || p->mark[e] & 2) continue;
        actual++;
        correct += p->mark[e] & 1;
        p->mark[e] |= 2;
    }
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && (size_t)ids[i] < N) p->mark[ids[i]] = 0;
    for (size_t i = 0; i < np; i++) p->mark[pr[i]] = 0;
    p->st.layers++;
    p->st.actual += actual;
    p->st.predicted += np;
    p->st.correct += correct;
    p->n_pred[layer] = 0;
}

void expert_predict_add_hinted(expert_predict *p, size_t n) {
    if (p) p->st.hinted += n;
}

ep_stats expert_predict_stats(const expert_predict *p) {
    ep_stats s = {0};
    if (p) s = p->st;
    return s;
}
