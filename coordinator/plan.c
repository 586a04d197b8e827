/* plan.c - the memory plan (see plan.h). */
#include "coordinator/plan.h"
#include "coordinator/forward.h"
#include "coordinator/generate.h"
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define PAGE 4096ull
#define RU(x) (((x) + PAGE - 1) / PAGE * PAGE)
#define GIB (1024.0 * 1024.0 * 1024.0)
#define MIB (1024.0 * 1024.0)

static const mem_preset PRESETS[] = {
    {"laptop", 8, "8 GiB: a laptop; the trunk streams, few experts cached"},
    {"desktop", 32, "32 GiB: most of the attention trunk pinned"},
    {"workstation", 128, "128 GiB: the whole trunk pinned, a small expert cache"},
    {"server", 512, "512 GiB: trunk pinned, a third of the experts cached"},
    {"max", 0, "everything resident (the budget is what that needs)"},
    {"auto", -1, "85 % of MemAvailable"},
    {NULL, 0, NULL},
};

const mem_preset *plan_presets(void) { return PRESETS; }

int plan_preset_bytes(const char *name, uint64_t *bytes) {
    for (const mem_preset *p = PRESETS; p->name; p++) {
        if (strcmp(p->name, name)) continue;
        if (p->gib > 0) { *bytes = (uint64_t)(p->gib * GIB); return 0; }
        if (p->gib == 0) { *bytes = 0; return 0; }
        FILE *f = fopen("/proc/meminfo", "r");
        char line[256];
        unsigned long long kb = 0;
        while (f && fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
        if (f) fclose(f);
        if (!kb) return -1;
        *bytes = (uint64_t)((double)kb * 1024.0 * 0.85);
        return 0;
    }
    return -1;
}

/* The walk from the schema layout: each layer unit's buffer (every tensor gets
 * ls_buffer_bytes, as the trunk reads it tensor by tensor), then the lm head in
 * row chunks of at most the largest unit. The same code for a loaded model (its
 * tensors' real bytes) and for the config alone (the release dtypes). */
static int walk_from_layout(const k3_config *c, const ls_layout *lay, mem_plan *p, k3_error *err) {
    uint64_t biggest = 0;
    for (int u = 0; u < lay->n_units; u++) {
        uint64_t b = 0;
        for (int j = 0; j < lay->units[u].n; j++) b += ls_buffer_bytes(lay->items[lay->units[u].items[j]].bytes);
        if (b > biggest) biggest = b;
    }
    uint64_t V = (uint64_t)c->vocab_size;
    if (lay->lm_head_item < 0 || !V) return k3_fail(err, "internal: the layout has no lm head");
    uint64_t row = lay->items[lay->lm_head_item].bytes / V; /* bytes of one lm-head row */
    p->lm_chunk_rows = (size_t)(row && biggest / row ? biggest / row : 1);
    if (p->lm_chunk_rows > V) p->lm_chunk_rows = (size_t)V;
    uint64_t n_lm = (V + p->lm_chunk_rows - 1) / p->lm_chunk_rows;
    p->n_walk = lay->n_units + (int)n_lm;
    p->walk_bytes = malloc((size_t)p->n_walk * sizeof *p->walk_bytes);
    if (!p->walk_bytes) return k3_fail(err, "out of memory");
    for (int u = 0; u < lay->n_units; u++) {
        uint64_t b = 0;
        for (int j = 0; j < lay->units[u].n; j++) b += ls_buffer_bytes(lay->items[lay->units[u].items[j]].bytes);
        p->walk_bytes[u] = b;
    }
    for (uint64_t i = 0; i < n_lm; i++) {
        uint64_t rows = V - i * p->lm_chunk_rows < p->lm_chunk_rows ? V - i * p->lm_chunk_rows : p->lm_chunk_rows;
        p->walk_bytes[lay->n_units + i] = ls_buffer_bytes(rows * row);
    }
    return 0;
}

/* Resident small vectors: the float arrays the loader reads (a folded AttnRes
 * pair is one double vector), plus the expert location table. */
static uint64_t small_bytes_of(const k3_config *c, const ls_layout *lay) {
    uint64_t b = 0;
    for (int i = 0; i < lay->n_items; i++) {
        ls_place pl = lay->items[i].t->place;
        if (pl == LS_SMALL || pl == LS_SMALL_PREFIX) b += lay->items[i].numel * sizeof(float);
        if (pl == LS_FOLD_PROJ) b += lay->items[i].numel * sizeof(double);
    }
    return b + (uint64_t)c->num_hidden_layers * (uint64_t)c->num_experts * sizeof(expert_loc);
}

int plan_make(mem_plan *p, const k3_config *c, const k3_model *m, uint64_t budget, int W, size_t T, size_t ctx,
              k3_error *err) {
    return plan_make_spec(p, c, m, budget, W, T, ctx, NULL, err);
}

int plan_make_spec(mem_plan *p, const k3_config *c, const k3_model *m, uint64_t budget, int W, size_t T, size_t ctx,
                   const plan_spec *sp, k3_error *err) {
    memset(p, 0, sizeof *p);
    if (sp && sp->k) {
        p->spec_k = sp->k;
        p->spec_per_position = sp->per_position;
        p->spec_seqs = sp->seqs ? sp->seqs : 1;
        p->spec_bytes = p->spec_seqs * gen_spec_bytes(c, sp->k, sp->per_position);
        p->draft_model_bytes = sp->draft_model_bytes;
    }
    if (sp && sp->mpi_ranks > 0 && W == 0) p->mpi_ranks = sp->mpi_ranks;
    if (sp) p->predict_bytes = sp->predict_bytes;
    if (sp) p->prefetch_slots = sp->prefetch_slots;
    p->budget = budget;
    p->n_workers = W;
    p->chunk = T;
    p->max_context = ctx;
    ls_layout own = {0};
    const ls_layout *lay = m ? &m->layout : &own;
    if (!m && (ls_layout_build(c, &own, err) || ls_layout_group(&own, err))) { ls_layout_free(&own); return -1; }
    int rc = walk_from_layout(c, lay, p, err);
    uint64_t n_items = (uint64_t)lay->n_items;
    p->small_bytes = small_bytes_of(c, lay);
    ls_layout_free(&own);
    if (rc) return -1;
    uint64_t H = (uint64_t)c->kda_num_heads, D = (uint64_t)c->kda_head_dim, P = H * D;
    uint64_t K = (uint64_t)c->short_conv_kernel_size, N = (uint64_t)c->num_experts, k = (uint64_t)c->num_experts_per_token;
    uint64_t L = (uint64_t)c->routed_expert_hidden_size, I = (uint64_t)c->moe_intermediate_size;
    uint64_t V = (uint64_t)c->vocab_size;
    uint64_t kr = (uint64_t)c->kv_lora_rank;
    uint64_t rope = (uint64_t)c->qk_rope_head_dim;
    uint64_t layers = (uint64_t)c->num_hidden_layers, n_mla = 0, n_moe = 0, Tn = (uint64_t)T;
    for (int l = 0; l < c->num_hidden_layers; l++) { n_mla += c->layer_is_mla[l]; n_moe += c->layer_is_moe[l]; }
    uint64_t n_kda = layers - n_mla;
    /* the tensor index (names, shapes) held by every process; ~300 B per tensor while parsing */
    uint64_t n_tensors = n_items + n_moe * N * LS_EXPERT_NT;
    p->process_bytes = PLAN_PROCESS_BYTES + n_tensors * 300;
    uint64_t cap = 64;
    while (cap < ctx) cap *= 2;
    p->state_bytes = n_kda * (H * D * D + 3 * (K - 1) * P) * 4 + n_mla * cap * (kr + rope) * 4;
    /* the engine's arena, from the layout code that carves it (forward_scratch_bytes), the AVX-512
     * prefill kernels' workspace of each thread (the largest level's: the plan does not know it), plus
     * two rows of logits per chunk token (the generator's) and, in-process, the expert batch */
    p->scratch_bytes = forward_scratch_bytes(c, (size_t)T, (size_t)ctx, omp_get_max_threads(), p->lm_chunk_rows) +
                       (uint64_t)omp_get_max_threads() * matmul_gemm_ws_bytes() + /* the prefill kernels' workspace */
                       (uint64_t)forward_x_doubles(c) * sizeof(double) +          /* the one-token inputs in double */
                       Tn * V * 4 * 2 + (W == 0 && !p->mpi_ranks ? Tn * k * 4 * (2 * L + 2 * I) : 0);
    uint64_t pairs = Tn * k;
    uint64_t ring_one = 2 * (RU(256 + 12 * pairs) + RU(Tn * L * 4) + RU(pairs * L * 4) + 256) + PAGE;
    p->ring_bytes = W ? (uint64_t)W * ring_one * 2 : 0; /* mapped by both sides: counted twice */
    p->worker_scratch_bytes = W ? (uint64_t)W * (pairs * 4 * (2 * L + 2 * I) + pairs * 16 + Tn * L * 4) : 0;
    /* --mpi: per expert rank a request (16-byte head, rows, pairs), an answer (rows, 1200 bytes
     * for an error text or the seconds) and the pair indices: experts_mpi_create's buffers */
    p->mpi_bytes = (uint64_t)p->mpi_ranks * (16 + Tn * L * 4 + pairs * 8 + pairs * L * 4 + 1200 + pairs * 4);
    p->expert_slot_bytes = ls_buffer_bytes(ls_expert_bytes(c)); /* = expert_cache_slot_bytes: one slot, one size */
    p->n_experts_total = n_moe * N;
    p->slot_bytes = 0;
    for (int i = 0; i < p->n_walk; i++) {
        p->walk_total += p->walk_bytes[i];
        if (p->walk_bytes[i] > p->slot_bytes) p->slot_bytes = p->walk_bytes[i];
    }
    uint64_t servers = p->mpi_ranks ? 0 : W ? (uint64_t)W : 1; /* expert caches in this plan */
    uint64_t fixed = (1 + (uint64_t)W) * p->process_bytes + p->small_bytes + p->state_bytes + p->scratch_bytes +
                     p->ring_bytes + p->worker_scratch_bytes + p->spec_bytes + p->draft_model_bytes + p->mpi_bytes +
                     p->predict_bytes;
    p->floor = fixed + PLAN_MIN_SLOTS * p->slot_bytes + servers * p->expert_slot_bytes;
    uint64_t per_server_all = servers ? ((p->n_experts_total + servers - 1) / servers) * p->expert_slot_bytes : 0;
    if (budget == 0) { /* everything resident */
        p->n_pinned = p->n_walk;
        p->pinned_bytes = p->walk_total;
        p->n_slots = 0;
        p->expert_cache_per_worker = per_server_all;
        p->total = fixed + p->walk_total + servers * per_server_all;
        p->snapshot_bytes = 4 * p->state_bytes;
        return 0;
    }
    if (budget < p->floor)
        return k3_fail(err, "a budget of %.3f GiB is below this model's floor of %.3f GiB (%llu bytes)", budget / GIB,
                       p->floor / GIB, (unsigned long long)p->floor);
    uint64_t extra = budget - p->floor;
    /* --expert-prefetch on: up to prefetch_slots expert slots per cache before any trunk unit is
     * pinned (a hint needs free slots beside the layer in use); the floor has one already */
    uint64_t kept = 0;
    if (servers && p->prefetch_slots > 1) {
        uint64_t want = (uint64_t)p->prefetch_slots * p->expert_slot_bytes;
        if (want > per_server_all) want = per_server_all;
        uint64_t more = want > p->expert_slot_bytes ? want - p->expert_slot_bytes : 0;
        if (more * servers > extra) more = extra / servers / p->expert_slot_bytes * p->expert_slot_bytes;
        kept = more * servers;
        extra -= kept;
    }
    p->n_slots = PLAN_MIN_SLOTS;
    if (p->walk_total <= extra + PLAN_MIN_SLOTS * p->slot_bytes) { /* the whole walk fits: no slots at all */
        extra = extra + PLAN_MIN_SLOTS * p->slot_bytes - p->walk_total;
        p->n_pinned = p->n_walk;
        p->pinned_bytes = p->walk_total;
        p->n_slots = 0;
    } else {
        while (p->n_pinned < p->n_walk && p->walk_bytes[p->n_pinned] <= extra) {
            extra -= p->walk_bytes[p->n_pinned];
            p->pinned_bytes += p->walk_bytes[p->n_pinned];
            p->n_pinned++;
        }
    }
    extra += kept; /* what the trunk did not take, with the slots kept for prefetching */
    uint64_t cache = servers ? p->expert_slot_bytes + extra / servers / p->expert_slot_bytes * p->expert_slot_bytes : 0;
    p->expert_cache_per_worker = cache < per_server_all ? cache : per_server_all;
    p->total = fixed + p->pinned_bytes + (uint64_t)p->n_slots * p->slot_bytes + servers * p->expert_cache_per_worker;
    p->snapshot_bytes = budget > p->total ? budget - p->total : 0;
    return 0;
}

int plan_set_expert_cache(mem_plan *p, uint64_t bytes, k3_error *err) {
    if (p->mpi_ranks) return 0; /* the expert ranks' caches, not this process's */
    if (bytes < p->expert_slot_bytes)
        return k3_fail(err, "an expert cache of %llu bytes is below one expert slot (%llu bytes)", (unsigned long long)bytes,
                       (unsigned long long)p->expert_slot_bytes);
    uint64_t servers = p->n_workers ? (uint64_t)p->n_workers : 1;
    uint64_t cache = bytes / p->expert_slot_bytes * p->expert_slot_bytes;
    p->total = p->total - servers * p->expert_cache_per_worker + servers * cache;
    p->expert_cache_per_worker = cache;
    return 0;
}

void plan_free(mem_plan *p) {
    free(p->walk_bytes);
    p->walk_bytes = NULL;
}

void plan_print(const mem_plan *p, const k3_config *c, FILE *f) {
    uint64_t servers = p->n_workers ? (uint64_t)p->n_workers : 1;
    if (p->mpi_ranks)
        fprintf(f, "memory plan (%s, %d layers, %d experts/layer, MPI rank 0: the experts on %d expert rank%s):\n",
                p->budget ? "budget" : "everything resident", c->num_hidden_layers, c->num_experts, p->mpi_ranks,
                p->mpi_ranks == 1 ? "" : "s");
    else
        fprintf(f, "memory plan (%s, %d layers, %d experts/layer, %d expert server%s%s):\n",
                p->budget ? "budget" : "everything resident", c->num_hidden_layers, c->num_experts, p->n_workers,
                p->n_workers == 1 ? "" : "s", p->n_workers ? "" : " = in-process");
    if (p->budget) fprintf(f, "  budget                 %12.3f GiB\n", p->budget / GIB);
    fprintf(f, "  processes              %12.1f MiB  (%d x %.1f MiB: code, index, slack)\n",
            (1 + p->n_workers) * p->process_bytes / MIB, 1 + p->n_workers, p->process_bytes / MIB);
    fprintf(f, "  small vectors          %12.1f MiB  (norms, biases, conv taps, folded AttnRes)\n", p->small_bytes / MIB);
    fprintf(f, "  sequence state         %12.1f MiB  (KDA state + MLA latent cache for %zu positions)\n",
            p->state_bytes / MIB, p->max_context);
    fprintf(f, "  scratch                %12.1f MiB  (activations of a %zu-token chunk, prefill kernels' workspace)\n", p->scratch_bytes / MIB, p->chunk);
    if (p->spec_k)
        fprintf(f, "  speculation            %12.1f MiB  (%zu x %zu logits rows; %s)\n", p->spec_bytes / MIB, p->spec_seqs,
                p->spec_k + 1,
                p->spec_per_position ? "the state after each proposal: rollback without a pass"
                                     : "one state copy: rollback re-feeds the accepted ids");
    if (p->draft_model_bytes)
        fprintf(f, "  draft model            %12.1f MiB  (weights, state and scratch, everything resident)\n",
                p->draft_model_bytes / MIB);
    if (p->predict_bytes)
        fprintf(f, "  expert predictor       %12.1f MiB  (the next MoE layers' routers, bf16: --expert-prefetch)\n",
                p->predict_bytes / MIB);
    if (p->prefetch_slots)
        fprintf(f, "  prefetch slots         up to %zu expert slots per cache kept before the trunk is pinned "
                   "(--expert-prefetch on)\n", p->prefetch_slots);
    if (p->n_workers)
        fprintf(f, "  rings + server scratch %12.1f MiB\n", (p->ring_bytes + p->worker_scratch_bytes) / MIB);
    if (p->mpi_ranks)
        fprintf(f, "  MPI buffers            %12.1f MiB  (%d x %.1f MiB: a request and an answer per expert rank)\n",
                p->mpi_bytes / MIB, p->mpi_ranks, p->mpi_bytes / MIB / p->mpi_ranks);
    fprintf(f, "  trunk pinned           %12.1f MiB  (%d of %d walk units, %.1f MiB in all)\n", p->pinned_bytes / MIB,
            p->n_pinned, p->n_walk, p->walk_total / MIB);
    fprintf(f, "  trunk streaming        %12.1f MiB  (%d slots x %.1f MiB; lm head in chunks of %zu rows)\n",
            p->n_slots * p->slot_bytes / MIB, p->n_slots, p->slot_bytes / MIB, p->lm_chunk_rows);
    if (p->mpi_ranks)
        fprintf(f, "  expert cache           none in this process (%llu experts in all, on the %d expert rank%s)\n",
                (unsigned long long)p->n_experts_total, p->mpi_ranks, p->mpi_ranks == 1 ? "" : "s");
    else
        fprintf(f, "  expert cache           %12.1f MiB  (%llu x %.1f MiB = %llu experts of %.2f MiB per server; %llu experts in all)\n",
            servers * p->expert_cache_per_worker / MIB, (unsigned long long)servers, p->expert_cache_per_worker / MIB,
            (unsigned long long)(p->expert_cache_per_worker / p->expert_slot_bytes), p->expert_slot_bytes / MIB,
            (unsigned long long)p->n_experts_total);
    fprintf(f, "  MLA cache layout       compressed latent: %d floats per MLA layer per position\n",
            c->kv_lora_rank + c->qk_rope_head_dim);
    fprintf(f, "  prefix snapshots       %12.1f MiB  (what the budget leaves; %.1f states of %zu positions)\n",
            p->snapshot_bytes / MIB, p->state_bytes ? (double)p->snapshot_bytes / (double)p->state_bytes : 0.0,
            p->max_context);
    fprintf(f, "  floor                  %12.3f GiB\n", p->floor / GIB);
    fprintf(f, "  total                  %12.3f GiB\n", p->total / GIB);
}
