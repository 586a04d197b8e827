/* plan.h - one memory budget for all processes, and what it buys.
 *
 * plan_make splits a total byte budget (coordinator + every expert server) into:
 * a per-process allowance, small resident vectors, sequence state (KDA state,
 * MLA latent cache for max_context positions), per-chunk scratch, the shared
 * rings (counted once per process that maps them), at least two trunk streaming
 * slots, and at least one expert slot per server; that sum is the FLOOR, and a
 * budget below it is refused with the floor in the message. What is left pins a
 * prefix of the trunk walk (every pinned byte saves a read per token), then goes
 * to the expert caches. The walk (units and their buffers), the small vectors and
 * the expert slot size come from the layer schema's layout (common/layer_schema.h):
 * the loaded model's (its tensors' real bytes) or, for --plan-only, one built from
 * the config alone (the release dtypes); the same code sizes both, so the two
 * print the same plan for a release-dtype checkpoint, and an expert slot is the
 * expert cache's slot (expert_cache_slot_bytes). The same ids come out at every
 * budget: the plan changes only what is resident. */
#ifndef K3_PLAN_H
#define K3_PLAN_H

#include "common/config.h"
#include "coordinator/model.h"
#include <stdio.h>

#define PLAN_PROCESS_BYTES (16ull << 20) /* code, libraries, stacks, allocator slack per process */
#define PLAN_MIN_SLOTS 2

typedef struct {
    /* inputs */
    uint64_t budget;            /* 0 = everything resident */
    int n_workers;              /* 0 = experts in-process */
    size_t chunk, max_context;
    /* sizes of the walk: per unit bytes (layer parts, then lm chunks) */
    int n_walk;
    uint64_t *walk_bytes;
    size_t lm_chunk_rows;
    uint64_t slot_bytes;
    uint64_t expert_slot_bytes, n_experts_total;
    /* outputs */
    uint64_t process_bytes, small_bytes, state_bytes, scratch_bytes, ring_bytes, worker_scratch_bytes;
    int n_slots, n_pinned;
    uint64_t pinned_bytes, walk_total;
    uint64_t expert_cache_per_worker;   /* per server, or the in-process cache */
    uint64_t floor, total;
    size_t spec_k;                      /* speculation: proposals per pass (0: none) */
    size_t spec_seqs;                   /* sequences with speculation buffers (--serve: slots) */
    int spec_per_position;              /* rollback from per-position states (else re-feed) */
    uint64_t spec_bytes;                /* k+1 logits rows and the state copies (gen_spec_bytes) */
    uint64_t draft_model_bytes;         /* --draft-model: its weights, state and scratch, resident */
    uint64_t predict_bytes;             /* --expert-prefetch: the next layers' router copies (expert_predict_bytes) */
    size_t prefetch_slots;              /* plan_spec.prefetch_slots: expert slots per cache kept before pinning */
    int mpi_ranks;                      /* --mpi: expert ranks holding every expert (0: not --mpi); this
                                           process (rank 0) has no expert cache, slot or batch scratch */
    uint64_t mpi_bytes;                 /* --mpi: rank 0's request/answer buffers, one set per expert rank */
    uint64_t snapshot_bytes;            /* prefix snapshots in memory (snapshots.h): what the budget
                                           leaves after the total; 4 states of max_context when
                                           everything is resident */
} mem_plan;

/* From a loaded model (real tensor sizes) or, with m == NULL, from cfg alone. */
int plan_make(mem_plan *p, const k3_config *cfg, const k3_model *m, uint64_t budget, int n_workers, size_t chunk,
              size_t max_context, k3_error *err);
/* Speculation's memory: k proposals per pass (0: none), the rollback, a draft model's bytes. */
typedef struct {
    size_t k;
    int per_position;
    uint64_t draft_model_bytes;  /* draft_model_plan_bytes, 0 without --draft-model */
    size_t seqs;                 /* sequences speculating at once (--serve: --parallel); 0 = 1 */
    int mpi_ranks;               /* --mpi: the plan of rank 0, experts on this many ranks (0: not --mpi) */
    uint64_t predict_bytes;      /* --expert-prefetch: expert_predict_bytes, 0 without it */
    size_t prefetch_slots;       /* --expert-prefetch on: expert slots per cache kept before the trunk
                                  * is pinned (2 x top-k: a layer in use and the next one predicted),
                                  * as far as the budget allows; 0: none */
} plan_spec;
/* plan_make with speculation (sp NULL or k 0: none, = plan_make); its buffers and a draft
 * model are more fixed lines ("speculation", "draft model"), in the floor. With
 * sp->mpi_ranks > 0 (--mpi, n_workers 0) it is rank 0's plan: no expert cache, no expert
 * slot and no expert-batch scratch (rank 0 computes no expert; experts_mpi.h), but its
 * MPI buffers (the "MPI buffers" line, in the floor); what the budget leaves after the
 * trunk goes to the prefix snapshots. */
int plan_make_spec(mem_plan *p, const k3_config *cfg, const k3_model *m, uint64_t budget, int n_workers, size_t chunk,
                   size_t max_context, const plan_spec *sp, k3_error *err);
/* --expert-cache-mb: every server's cache is `bytes` (whole slots of expert_slot_bytes:
 * exactly what expert_cache_create makes of them) instead of the budget's share;
 * total follows. Refused (naming the minimum) below one slot. Under --mpi (mpi_ranks > 0)
 * the caches are the expert ranks' and the plan does not change. */
int plan_set_expert_cache(mem_plan *p, uint64_t bytes, k3_error *err);
void plan_free(mem_plan *p);
void plan_print(const mem_plan *p, const k3_config *cfg, FILE *f);

typedef struct { const char *name; double gib; const char *what; } mem_preset;
/* NULL-terminated list; "max" (gib 0) = everything resident, "auto" = 85 % of MemAvailable. */
const mem_preset *plan_presets(void);
/* Budget in bytes for a preset name; -1 if unknown. "max" gives 0 (unlimited). */
int plan_preset_bytes(const char *name, uint64_t *bytes);

#endif
