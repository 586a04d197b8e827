/* fwd_phases.h - where a forward pass's time goes, by phase (--json timing.prefill_phases,
 * timing.decode_phases).
 *
 * The forward thread takes a lap at every phase boundary: the wall and process CPU seconds
 * since the previous lap (CLOCK_MONOTONIC; CLOCK_PROCESS_CPUTIME_ID, all threads summed) go to
 * the phase just ended, with the multiply-add FLOP (2 per multiply-add) it computed. The
 * parallel regions are fork-join from that thread, so the phases of a pass add up to the
 * pass, and cpu_s / (wall_s x threads) is a phase's parallel efficiency (with
 * OMP_WAIT_POLICY=passive; spinning threads count as busy). Flops count the products the
 * engine computes (matmuls 2 x rows x cols per token; KDA 16 x heads x head_dim^2 per token;
 * MLA's absorbed projections, scores over kv_lora + rope and contexts over kv_lora per head
 * and attended position; routed experts 6 x I x L per (token, expert) pair), nothing else.
 * A lap costs two clock reads (~1 us): a pass has ~20 per layer. Timing only: no bit
 * depends on it. */
#ifndef K3_FWD_PHASES_H
#define K3_FWD_PHASES_H

#include "common/mono_clock.h"
#include "common/proc_stats.h"

typedef enum {
    FP_MIX,        /* embeddings, AttnRes mixes, RMSNorms, residual adds (forward.c) */
    FP_KDA_MATMUL, /* KDA projections q k v f_a f_b b g and o */
    FP_KDA_CORE,   /* short convolutions, the delta rule per head, head norm and gate */
    FP_MLA_MATMUL, /* MLA q_a q_b kv_a g and o */
    FP_MLA_CORE,   /* latent norms, cache writes, absorbed heads (q_lat, scores, softmax, context, values) */
    FP_MOE_IN,     /* router and latent down-projection (one region) */
    FP_ROUTE,      /* top-k selection, the next layer's prediction */
    FP_EXPERTS,    /* routed experts (the expert backend) */
    FP_MOE_OUT,    /* combine, latent norm, latent up-projection */
    FP_SHARED,     /* shared experts and their add */
    FP_MLP,        /* dense MLP layers */
    FP_LM_HEAD,    /* final mix and norm of the rows that want logits, the lm head */
    FP_N
} fwd_phase;

static inline const char *fwd_phase_name(fwd_phase p) {
    static const char *const n[FP_N] = {"mix", "kda_matmul", "kda_core", "mla_matmul", "mla_core", "moe_in",
                                        "route", "experts", "moe_out", "shared", "mlp", "lm_head"};
    return (unsigned)p < FP_N ? n[p] : "?";
}

typedef struct {
    double wall_s[FP_N], cpu_s[FP_N], flop[FP_N];
    double t_wall, t_cpu; /* the last lap */
} fwd_phases;

/* The start of a pass: the next lap measures from here. p may be NULL (nothing timed). */
static inline void fph_begin(fwd_phases *p) {
    if (!p) return;
    p->t_wall = k3_now_s();
    p->t_cpu = proc_cpu_s();
}

/* Phase ph ended now, having computed flop FLOP. */
static inline void fph_lap(fwd_phases *p, fwd_phase ph, double flop) {
    if (!p) return;
    double w = k3_now_s(), c = proc_cpu_s();
    p->wall_s[ph] += w - p->t_wall;
    p->cpu_s[ph] += c - p->t_cpu;
    p->flop[ph] += flop;
    p->t_wall = w;
    p->t_cpu = c;
}

/* d = a - b, phase by phase (the part of a run between two snapshots) */
static inline void fph_diff(const fwd_phases *a, const fwd_phases *b, fwd_phases *d) {
    for (int i = 0; i < FP_N; i++) {
        d->wall_s[i] = a->wall_s[i] - b->wall_s[i];
        d->cpu_s[i] = a->cpu_s[i] - b->cpu_s[i];
        d->flop[i] = a->flop[i] - b->flop[i];
    }
    d->t_wall = d->t_cpu = 0;
}

#endif
