/* main.c - bin/k3, the coordinator's command line.
 *
 *   bin/k3 MODEL_DIR (--ids 1,2,3 | --prompt TEXT | --prompt-file FILE) [--gen N]
 *          [--json FILE] [--dump-logits FILE] [--teacher-force] [--full-recompute]
 *          [--threads N] [--simd auto|scalar|avx2|avx512] [--chunk N]
 *          [--workers N] [--workers-per-node N] [--numa auto|off] [--worker-threads N]
 *          [--expert-cache-mb MB] [--worker-timeout-ms MS] [--max-restarts N]
 *   bin/k3 --tok DIR (--encode FILE | --decode FILE) [--no-special]
 *
 * Exit status: 0 success, 2 usage error or refused model/input, 1 failure at run time.
 * Results go to stdout (ids) or the --json file; progress and logs to stderr. */
#define _GNU_SOURCE
#include "common/kernels.h"
#include "common/file_read.h"
#include "common/proc_stats.h"
#include "coordinator/cli.h"
#include "coordinator/chat_repl.h"
#include "coordinator/sampler.h"
#include "coordinator/server_http.h"
#include "coordinator/experts_local.h"
#include "coordinator/expert_predict.h"
#include "coordinator/experts_mpi.h"
#include "coordinator/draft.h"
#include "coordinator/generate.h"
#include "coordinator/outputs.h"
#include "coordinator/numa_place.h"
#include "coordinator/plan.h"
#include "coordinator/snapshots.h"
#include "coordinator/state_gen.h"
#include "coordinator/tokenize_cmd.h"
#include "coordinator/doctor.h"
#include "coordinator/verify.h"
#include "coordinator/tokenizer.h"
#include "coordinator/workers_pool.h"
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <jansson.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>



/* {"phase": {"wall_s", "cpu_s", "gflop"}, ...}: the phases that ran */
static json_t *phases_json(const fwd_phases *p) {
    json_t *o = json_object();
    for (int i = 0; i < FP_N; i++) {
        if (p->wall_s[i] == 0 && p->flop[i] == 0) continue;
        json_t *e = json_object();
        json_object_set_new(e, "wall_s", json_real(p->wall_s[i]));
        json_object_set_new(e, "cpu_s", json_real(p->cpu_s[i]));
        json_object_set_new(e, "gflop", json_real(p->flop[i] / 1e9));
        json_object_set_new(o, fwd_phase_name((fwd_phase)i), e);
    }
    return o;
}

static json_t *ids_json(const int32_t *ids, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

typedef struct {
    int32_t *seq;        /* prompt then generated ids */
    size_t n_prompt, n_gen;
    int32_t *tf_pred;
    float *rows;         /* logits rows, positions first_pos.. */
    size_t first_pos, n_rows;
    double prefill_s, decode_s;
    double decode_step_min_s; /* the fastest one-id decode step (no draft): a shared host's noise only slows steps */
    double prefill_cpu_s, decode_cpu_s; /* CPU seconds of all threads in the same spans */
    fwd_phases prefill_ph, decode_ph;   /* the forwards of the same spans by phase */
    size_t prefill_ids;  /* positions this run's prefill step computed (after a state or snapshot) */
    size_t first_ids;    /* ids the prefill's step emitted (1; more with a speculative first step) */
    uint64_t spec_passes, spec_proposed, spec_accepted, spec_refeeds, spec_restores, decode_passes;
    int streamed;        /* the text was printed while generating */
    int finished;        /* --resume of a run that had already finished */
    size_t n_loaded;     /* --load-state: history ids that came from the file */
    size_t i0;           /* --resume: ids generated before this run */
    size_t n_ckpt;       /* checkpoints written, and their time */
    double ckpt_s;
} run_result;

/* State files and snapshots around a run (all optional). */
typedef struct {
    const state_fingerprint *fp;
    state_loaded *ld;     /* --load-state / --resume: the file's history and settings */
    seq_state *lst;       /* ... and its state (taken over by the run) */
    int keep_rng;         /* continue the file's generator */
    snap_store *snaps;    /* --state-dir */
    int text;             /* the run prints text (saved for --resume) */
} persist;

static int save_run(const char *path, const persist *ps, const k3_config *c, const gen_seq *g, const options *o,
                    size_t n, size_t N, k3_error *err) {
    state_run run = {.kind = STATE_KIND_RUN, .text = ps->text, .gen_target = N, .n_prompt = n,
                     .ckpt_every = o->checkpoint ? (uint64_t)o->checkpoint_every : 0};
    return gen_seq_save(path, ps->fp, c, g, &run, err);
}

/* Prints one token's bytes as they arrive, by complete code points. */
typedef struct {
    const tokenizer *tok;
    utf8_stream us;
    int tty;
    size_t n, N;
} token_printer;

static void print_token(void *ctx, int32_t id, int stop) {
    token_printer *tp = ctx;
    (void)stop;
    tp->n++;
    if (tp->tok) {
        utf8_stream_write_token(&tp->us, tp->tok, id, stdout);
    } else if (tp->tty) {
        fprintf(stderr, "\rk3: generated %zu/%zu", tp->n, tp->N);
    }
}

typedef struct {
    float *rows;
    size_t first, V;
} row_keeper;

static void keep_row(void *ctx, size_t pos, const float *row) {
    row_keeper *rk = ctx;
    memcpy(rk->rows + (pos - rk->first) * rk->V, row, rk->V * sizeof *row);
}

/* Runs the generation through the one generation step; with stream_tok, the
 * generated text goes to stdout as it is produced. Returns an exit status. */
static int run(engine *en, const options *o, draft_source *draft, int spec_pp, const tokenizer *stream_tok,
               run_result *r, const persist *ps, k3_error *err) {
    const k3_config *c = &en->model->cfg;
    size_t V = (size_t)c->vocab_size, n = r->n_prompt, N = (size_t)o->gen;
    size_t i0 = r->n_gen, have = n + i0; /* --resume: ids generated before the interruption */
    r->i0 = i0;
    r->first_pos = o->teacher_force ? 0 : have - 1;
    size_t last_pos = N > 0 ? n + N - 2 : n - 1;
    r->n_rows = last_pos + 1 - r->first_pos;
    /* every row is kept only when it is asked for */
    int keep = o->logits_path || o->teacher_force;
    if (keep && !(r->rows = malloc(r->n_rows * V * sizeof *r->rows))) {
        k3_fail(err, "out of memory for %zu rows of logits", r->n_rows);
        return EXIT_RUNTIME;
    }
    gen_seq g;
    if (gen_seq_init(&g, c, &o->sampling, o->stop_ids, o->n_stop_ids, n + N, err)) return EXIT_USAGE;
    int status = EXIT_RUNTIME;
    token_printer tp = {.tok = stream_tok, .tty = isatty(2), .N = N};
    utf8_stream_init(&tp.us, 1); /* an ill-formed sequence shows as U+FFFD, never half a code point */
    row_keeper rk = {r->rows, r->first_pos, V};
    g.full_recompute = o->full_recompute;
    g.on_token = print_token;
    g.on_token_ctx = &tp;
    if (keep && gen_seq_watch_rows(&g, r->first_pos, (size_t)o->chunk, keep_row, &rk, err)) goto out;
    if (draft && gen_seq_speculate(&g, c, (size_t)o->draft_max, spec_pp, err)) goto out;
    double t0 = k3_now_s(), c0 = proc_cpu_s();
    fwd_phases ph0 = en->phases;
    uint64_t passes0 = en->passes;
    size_t pos0 = 0; /* positions already in the state when the prefill starts */
    if (ps->ld) { /* continue the loaded state; the ids after its history are fed on top */
        if (gen_seq_adopt(&g, ps->lst, ps->ld->ids, ps->ld->n_ids, ps->keep_rng ? &ps->ld->run.rng : NULL, err) ||
            gen_seq_push(&g, r->seq + ps->ld->n_ids, have - ps->ld->n_ids, err))
            goto out;
        pos0 = g.st.pos;
        for (size_t i = 0; i < i0; i++) print_token(&tp, r->seq[n + i], 0); /* --resume: the run so far */
    } else if (ps->snaps && n > 1 && !o->full_recompute && !o->teacher_force) {
        /* start from the longest stored prefix; store the prompt minus its last id (an identical
         * prompt then feeds one id) */
        if (gen_seq_push(&g, r->seq, n - 1, err)) goto out;
        long L = snap_lookup(ps->snaps, g.ids, g.n, n - 1, &g.st, err);
        if (L < 0) goto out;
        if (L > 0) fprintf(stderr, "k3: started from a snapshot of %ld positions (feeding %zu)\n", L, n - (size_t)L);
        pos0 = (size_t)L;
        if (gen_feed(en, &g, (size_t)o->chunk, err)) goto out;
        if ((size_t)L < n - 1 && snap_insert(ps->snaps, g.ids, &g.st, err)) goto out;
        if (gen_seq_push(&g, r->seq + n - 1, 1, err)) goto out;
    } else if (gen_seq_push(&g, r->seq, n, err))
        goto out;
    sampler_observe_prompt(&g.smp, r->seq, n); /* --repetition-penalty: the prompt's ids */
    if (N == 0) {
        if (gen_feed(en, &g, (size_t)o->chunk, err)) goto out;
        r->prefill_s = k3_now_s() - t0;
        r->prefill_cpu_s = proc_cpu_s() - c0;
        fph_diff(&en->phases, &ph0, &r->prefill_ph);
        r->prefill_ids = g.st.pos - pos0;
    }
    const char *kill_after = getenv("K3_TEST_KILL_AFTER_CHECKPOINT"); /* tests: SIGKILL mid-run */
    size_t every = o->checkpoint ? (size_t)o->checkpoint_every : 0;
    double ckpt_cpu = 0;
    for (size_t i = i0; i < N;) {
        gen_event ev[64];
        size_t nev = 1;
        int32_t prop[63];
        size_t k = 0;
        if (i > 0 && draft && draft_propose(draft, g.ids, g.n, i, prop, (size_t)o->draft_max, &k, err)) goto out;
        double ts = k3_now_s();
        if (k ? gen_step_spec(en, &g, prop, k, N - i, ev, &nev, err) : gen_step(en, &g, (size_t)o->chunk, ev, err))
            goto out;
        int first = i == i0;
        if (!first && !k && nev == 1) {
            double d = k3_now_s() - ts;
            if (r->decode_step_min_s == 0 || d < r->decode_step_min_s) r->decode_step_min_s = d;
        }
        if (first) {
            r->prefill_s = k3_now_s() - t0;
            r->prefill_cpu_s = proc_cpu_s() - c0;
            fph_diff(&en->phases, &ph0, &r->prefill_ph);
            ph0 = en->phases;
            r->prefill_ids = g.st.pos > pos0 ? g.st.pos - pos0 : 0;
            t0 = k3_now_s();
            c0 = proc_cpu_s();
            passes0 = en->passes;
            experts_mpi_mark(en->experts); /* --mpi: the per-token counters cover the decode */
        }
        size_t before = i;
        int stop = 0;
        for (size_t j = 0; j < nev && !stop; j++) {
            r->seq[n + i] = ev[j].id;
            r->n_gen = ++i;
            stop = ev[j].stop;
        }
        if (first) r->first_ids = i - before;
        if (stop) break;
        if (every && i / every > before / every && i < N) { /* every --checkpoint-every generated ids */
            double tc = k3_now_s(), cc = proc_cpu_s();
            if (save_run(o->checkpoint, ps, c, &g, o, n, N, err)) goto out;
            r->ckpt_s += k3_now_s() - tc;
            ckpt_cpu += proc_cpu_s() - cc;
            r->n_ckpt++;
            if (kill_after && (size_t)atol(kill_after) == r->n_ckpt) raise(SIGKILL);
        }
    }
    r->decode_passes = en->passes - passes0;
    r->spec_passes = g.spec_passes;
    r->spec_proposed = g.spec_proposed;
    r->spec_accepted = g.spec_accepted;
    r->spec_refeeds = g.spec_refeeds;
    r->spec_restores = g.spec_restores;
    if (o->checkpoint) { /* the finished run: a --resume of it reports it whole */
        double tc = k3_now_s(), cc = proc_cpu_s();
        if (save_run(o->checkpoint, ps, c, &g, o, n, N, err)) goto out;
        r->ckpt_s += k3_now_s() - tc;
        ckpt_cpu += proc_cpu_s() - cc;
        r->n_ckpt++;
    }
    if (o->save_state && save_run(o->save_state, ps, c, &g, o, n, N, err)) goto out;
    if (ps->snaps && g.st.pos > 0 && !o->full_recompute && snap_insert(ps->snaps, g.ids, &g.st, err)) goto out;
    if (stream_tok) {
        utf8_stream_write_end(&tp.us, stdout);
        fputc('\n', stdout);
        fflush(stdout);
        r->streamed = 1;
    }
    if (tp.tty && N && !stream_tok) fprintf(stderr, "\n");
    if (N > 0 && r->n_gen < N) r->n_rows = n + r->n_gen - 1 - r->first_pos; /* stopped early: rows computed */
    if (N > 0) r->decode_s = k3_now_s() - t0 - r->ckpt_s;
    if (N > 0) r->decode_cpu_s = proc_cpu_s() - c0 - ckpt_cpu;
    if (N > 0) fph_diff(&en->phases, &ph0, &r->decode_ph);
    if (r->n_ckpt)
        fprintf(stderr, "k3: %zu checkpoint%s to %s, %.2f ms each (%.2f ms per generated token)\n", r->n_ckpt,
                r->n_ckpt == 1 ? "" : "s", o->checkpoint, 1e3 * r->ckpt_s / (double)r->n_ckpt,
                r->n_gen > i0 ? 1e3 * r->ckpt_s / (double)(r->n_gen - i0) : 0.0);
    if (o->teacher_force)
        for (size_t p = 0; p < n; p++) {
            r->tf_pred[p] = argmax_logits(r->rows + p * V, V);
            if (r->tf_pred[p] < 0) { k3_fail(err, "non-finite logits at position %zu", p); goto out; }
        }
    status = EXIT_OK;
out:
    gen_seq_free(&g);
    return status;
}

static json_t *workers_json(const expert_backend *eb, int n_workers) {
    json_t *a = json_array();
    for (int i = 0; i < n_workers; i++) {
        worker_stats ws;
        workers_pool_stats(eb, i, &ws);
        json_t *w = json_object();
        json_object_set_new(w, "worker", json_integer(i));
        json_object_set_new(w, "pid", json_integer(ws.pid));
        json_object_set_new(w, "node", json_integer(ws.node));
        json_object_set_new(w, "requests", json_integer((json_int_t)ws.requests));
        json_object_set_new(w, "expert_hits", json_integer((json_int_t)ws.hits));
        json_object_set_new(w, "expert_misses", json_integer((json_int_t)ws.misses));
        json_object_set_new(w, "bytes_read", json_integer((json_int_t)ws.bytes_read));
        json_object_set_new(w, "restarts", json_integer(ws.restarts));
        json_object_set_new(w, "cache_slots", json_integer(ws.cache_slots));
        json_object_set_new(w, "direct_io", json_boolean(ws.direct_io));
        json_object_set_new(w, "ring_wait_s", json_real(ws.wait_s));
        json_object_set_new(w, "compute_s", json_real(ws.compute_s));
        json_object_set_new(w, "peak_rss_bytes", json_integer((json_int_t)ws.peak_rss_bytes));
        json_array_append_new(a, w);
    }
    return a;
}

/* --mpi: per expert rank, totals and per decode token (counted from experts_mpi_mark) */
static json_t *mpi_json(const expert_backend *eb, size_t n_dec) {
    json_t *j = json_object(), *a = json_array();
    int n = experts_mpi_ranks(eb);
    double per = n_dec ? 1.0 / (double)n_dec : 0;
    uint64_t msgs = 0, bytes = 0;
    for (int r = 1; r <= n; r++) {
        mpi_rank_stats t, d;
        experts_mpi_stats(eb, r, 0, &t);
        experts_mpi_stats(eb, r, 1, &d);
        json_t *w = json_object();
        json_object_set_new(w, "rank", json_integer(r));
        json_object_set_new(w, "host", json_string(t.host));
        json_object_set_new(w, "local_servers", json_integer(t.servers));
        json_object_set_new(w, "requests", json_integer((json_int_t)t.requests));
        json_object_set_new(w, "bytes_sent", json_integer((json_int_t)t.bytes_sent));
        json_object_set_new(w, "bytes_received", json_integer((json_int_t)t.bytes_received));
        json_object_set_new(w, "wait_s", json_real(t.wait_s));
        json_object_set_new(w, "compute_s", json_real(t.compute_s));
        json_object_set_new(w, "heartbeats", json_integer((json_int_t)t.beats));
        json_object_set_new(w, "decode_messages_per_token", json_real(2.0 * (double)d.requests * per));
        json_object_set_new(w, "decode_bytes_per_token", json_real((double)(d.bytes_sent + d.bytes_received) * per));
        json_object_set_new(w, "decode_compute_s_per_token", json_real(d.compute_s * per));
        json_array_append_new(a, w);
        msgs += 2 * d.requests;
        bytes += d.bytes_sent + d.bytes_received;
    }
    mpi_exchange_stats x, xd;
    experts_mpi_exchange(eb, 0, &x);
    experts_mpi_exchange(eb, 1, &xd);
    json_object_set_new(j, "expert_ranks", json_integer(n));
    json_object_set_new(j, "exchanges", json_integer((json_int_t)x.exchanges));
    json_object_set_new(j, "exchange_s", json_real(x.exchange_s));
    json_object_set_new(j, "overhead_s", json_real(x.overhead_s));
    json_object_set_new(j, "decode_tokens", json_integer((json_int_t)n_dec));
    json_object_set_new(j, "decode_messages_per_token", json_real((double)msgs * per));
    json_object_set_new(j, "decode_bytes_per_token", json_real((double)bytes * per));
    json_object_set_new(j, "decode_exchanges_per_token", json_real((double)xd.exchanges * per));
    json_object_set_new(j, "decode_exchange_s_per_token", json_real(xd.exchange_s * per));
    json_object_set_new(j, "decode_overhead_s_per_token", json_real(xd.overhead_s * per));
    json_object_set_new(j, "ranks", a);
    return j;
}

/* --dump-expert-trace: one line per (position, MoE layer): "pos layer e1 ... ek" in top-k order. */
static void trace_route(void *ctx, int layer, size_t position, const int32_t *ids, int top_k) {
    FILE *f = ctx;
    fprintf(f, "%zu %d", position, layer);
    for (int j = 0; j < top_k; j++) fprintf(f, " %d", ids[j]);
    fputc('\n', f);
}

typedef struct {
    double load_s;                /* load_model_s + load_trunk_s + load_experts_s */
    double load_model_s;          /* model_load: config.json, the index, the shards' headers */
    double load_trunk_s;          /* trunk_create: the pinned units' reads */
    double load_experts_s;        /* the expert backend's start (with --preload-experts its reads) and engine_init */
    size_t experts_preloaded;     /* --preload-experts: experts read at load (all servers) */
    double load_cpu_s;            /* CPU seconds of all threads in those spans */
    int threads, n_workers, mpi;
    const expert_backend *eb;
    const tokenizer *tok;
    const mem_plan *plan;
    trunk *trunk;
    const k3_topology *topo;
    const numa_place *np;
    uint64_t cache_bytes;        /* per server */
    draft_source *draft;         /* speculation's draft (its model's passes go in --json) */
    const expert_predict *predict; /* --expert-prefetch (NULL: off) */
} run_info;

static json_t *memory_json(const run_info *ri, const expert_backend *eb) {
    json_t *j = json_object();
    const mem_plan *p = ri->plan;
    uint64_t self = proc_peak_rss_bytes(0), total = self, hits = 0, misses = 0, bytes = 0;
    for (int i = 0; i < ri->n_workers; i++) {
        worker_stats ws;
        workers_pool_stats(eb, i, &ws);
        total += ws.peak_rss_bytes;
        hits += ws.hits;
        misses += ws.misses;
        bytes += ws.bytes_read;
    }
    if (ri->n_workers == 0 && !ri->mpi) bytes = experts_local_stats(eb, &hits, &misses);
    trunk_stats ts = trunk_get_stats(ri->trunk);
    json_object_set_new(j, "budget_bytes", json_integer((json_int_t)p->budget));
    json_object_set_new(j, "floor_bytes", json_integer((json_int_t)p->floor));
    json_object_set_new(j, "planned_bytes", json_integer((json_int_t)p->total));
    json_object_set_new(j, "peak_rss_coordinator_bytes", json_integer((json_int_t)self));
    json_object_set_new(j, "peak_rss_total_bytes", json_integer((json_int_t)total));
    json_object_set_new(j, "trunk_pinned_units", json_integer(ts.n_pinned));
    json_object_set_new(j, "trunk_walk_units", json_integer(ts.n_walk));
    json_object_set_new(j, "trunk_slots", json_integer(ts.n_slots));
    json_object_set_new(j, "trunk_pinned_bytes", json_integer((json_int_t)ts.pinned_bytes));
    json_object_set_new(j, "trunk_bytes_streamed", json_integer((json_int_t)ts.bytes_streamed));
    json_object_set_new(j, "expert_cache_bytes_per_server", json_integer((json_int_t)p->expert_cache_per_worker));
    json_object_set_new(j, "expert_hits", json_integer((json_int_t)hits));
    json_object_set_new(j, "expert_misses", json_integer((json_int_t)misses));
    json_object_set_new(j, "expert_bytes_read", json_integer((json_int_t)bytes));
    json_object_set_new(j, "experts_preloaded", json_integer((json_int_t)ri->experts_preloaded));
    json_object_set_new(j, "read_threads", json_integer(ts.read_threads));
    json_object_set_new(j, "trunk_read_wait_s", json_real(ts.wait_s));
    if (ri->n_workers == 0 && !ri->mpi) {
        expert_cache_stats cs = experts_local_cache_stats(eb);
        json_object_set_new(j, "expert_read_wait_s", json_real(cs.read_wait_s));
        json_object_set_new(j, "experts_lane_layout", json_integer((json_int_t)cs.repacked));
        json_object_set_new(j, "expert_repack_s", json_real(cs.repack_s));
    }
    return j;
}

/* --expert-prefetch: the prediction's recall and what its reads did. */
static json_t *prefetch_json(const run_info *ri, const expert_backend *eb) {
    json_t *j = json_object();
    ep_stats s = expert_predict_stats(ri->predict);
    static const char *const modes[] = {"off", "predict", "on"};
    json_object_set_new(j, "mode", json_string(modes[expert_predict_mode(ri->predict)]));
    json_object_set_new(j, "layers_scored", json_integer((json_int_t)s.layers));
    json_object_set_new(j, "actual_experts", json_integer((json_int_t)s.actual));
    json_object_set_new(j, "predicted_experts", json_integer((json_int_t)s.predicted));
    json_object_set_new(j, "correct", json_integer((json_int_t)s.correct));
    json_object_set_new(j, "recall", s.actual ? json_real((double)s.correct / (double)s.actual) : json_null());
    json_object_set_new(j, "precision", s.predicted ? json_real((double)s.correct / (double)s.predicted) : json_null());
    json_object_set_new(j, "hinted", json_integer((json_int_t)s.hinted));
    json_object_set_new(j, "predict_s", json_real(s.predict_s));
    if (ri->n_workers == 0 && !ri->mpi) {
        expert_cache_stats cs = experts_local_cache_stats(eb);
        json_object_set_new(j, "hint_reads", json_integer((json_int_t)cs.hint_reads));
        json_object_set_new(j, "hint_hits", json_integer((json_int_t)cs.hint_hits));
        json_object_set_new(j, "hint_wasted", json_integer((json_int_t)cs.hint_wasted));
        json_object_set_new(j, "expert_read_wait_s", json_real(cs.read_wait_s));
    } else if (ri->n_workers > 0 && !ri->mpi) { /* the servers' caches, summed */
        uint64_t reads = 0, hits = 0, wasted = 0;
        for (int i = 0; i < workers_pool_count(eb); i++) {
            worker_stats ws;
            workers_pool_stats(eb, i, &ws);
            reads += ws.hint_reads;
            hits += ws.hint_hits;
            wasted += ws.hint_wasted;
        }
        json_object_set_new(j, "hint_reads", json_integer((json_int_t)reads));
        json_object_set_new(j, "hint_hits", json_integer((json_int_t)hits));
        json_object_set_new(j, "hint_wasted", json_integer((json_int_t)wasted));
    }
    return j;
}

/* The machine as this process may use it, and where everything goes (common/topology.h). */
static int make_placement(const options *o, k3_topology *t, placement *pl) {
    k3_error e = {0};
    /* --mpi: experts live in other ranks, no local servers */
    placement_request rq = {o->mpi ? 0 : (int)o->workers, (int)o->workers_per_node, (int)o->threads, (int)o->worker_threads, o->numa};
    if (topology_read(NULL, t, &e) || placement_make(t, &rq, pl, &e)) {
        fprintf(stderr, "k3: %s\n", e.msg);
        return -1;
    }
    return 0;
}

static json_t *placement_json(const run_info *ri) {
    const placement *pl = ri->np->pl;
    trunk_stats ts = trunk_get_stats(ri->trunk);
    json_t *j = json_object(), *sv = json_array();
    json_object_set_new(j, "bound", json_boolean(pl->bound));
    json_object_set_new(j, "oversubscribed", json_boolean(pl->oversubscribed));
    json_object_set_new(j, "coordinator", numa_place_coordinator_json(ri->np, ts.slot_bytes, ts.n_slots));
    for (int i = 0; i < ri->n_workers; i++) {
        worker_stats ws;
        workers_pool_stats(ri->eb, i, &ws);
        json_t *s = numa_place_server_json(pl, i);
        json_object_set_new(s, "worker", json_integer(i));
        json_object_set_new(s, "pid", json_integer(ws.pid));
        json_object_set_new(s, "cache_budget_bytes", json_integer((json_int_t)ri->cache_bytes));
        json_object_set_new(s, "cache_slots", json_integer(ws.cache_slots));
        json_object_set_new(s, "restarts", json_integer(ws.restarts));
        json_array_append_new(sv, s);
    }
    json_object_set_new(j, "servers", sv);
    return j;
}

static int write_outputs(const options *o, const run_result *r, const engine *en, const run_info *ri) {
    size_t V = (size_t)en->model->cfg.vocab_size;
    int status = EXIT_OK; /* the ids go out first; a failed file never drops them */
    if (!r->streamed) {
        for (size_t i = 0; i < r->n_gen; i++) printf("%s%d", i ? " " : "", r->seq[r->n_prompt + i]);
        printf("\n");
        fflush(stdout);
    }
    k3_error we = {0};
    if (o->logits_path && outputs_write_file(o->logits_path, r->rows, sizeof(float) * V * r->n_rows, &we)) {
        fprintf(stderr, "k3: %s\n", we.msg);
        status = EXIT_RUNTIME;
    }
    char *text = NULL;
    size_t text_len = 0;
    if (ri->tok) {
        if (tokenizer_decode(ri->tok, r->seq + r->n_prompt, r->n_gen, &text, &text_len, NULL)) text = NULL;
    }
    if (o->json_path) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        json_t *j = json_object();
        json_object_set_new(j, "prompt_ids", ids_json(r->seq, r->n_prompt));
        json_object_set_new(j, "generated_ids", ids_json(r->seq + r->n_prompt, r->n_gen));
        if (text) { /* JSON strings are UTF-8: ill-formed bytes become U+FFFD, as on stdout */
            char *u = malloc(UTF8_STREAM_MAX_OUT(text_len));
            if (u) {
                utf8_stream us;
                utf8_stream_init(&us, 1);
                size_t m = utf8_stream_push(&us, text, text_len, u);
                m += utf8_stream_flush(&us, u + m);
                json_t *js = json_stringn(u, m);
                if (js) json_object_set_new(j, "generated_text", js);
                free(u);
            }
        }
        if (o->teacher_force) json_object_set_new(j, "tf_pred", ids_json(r->tf_pred, r->n_prompt));
        json_object_set_new(j, "logits_first_position", json_integer((json_int_t)r->first_pos));
        if (o->load_state) json_object_set_new(j, "state_loaded_ids", json_integer((json_int_t)r->n_loaded));
        json_object_set_new(j, "mode", json_string(o->full_recompute ? "full-recompute" : "incremental"));
        json_object_set_new(j, "threads", json_integer(ri->threads));
        json_object_set_new(j, "simd", json_string(en->k->name));
        char kc[96];
        json_object_set_new(j, "kernel_choice", json_string(kernels_choice_text(en->k, kc, sizeof kc)));
        json_t *tm = json_object();
        /* load_s: every weight in before the first forward (headers, the pinned trunk's reads,
         * the expert backend); prefill_s: the prompt's forwards and the first token's pick */
        json_object_set_new(tm, "load_s", json_real(ri->load_s));
        json_object_set_new(tm, "load_model_s", json_real(ri->load_model_s));
        json_object_set_new(tm, "load_trunk_s", json_real(ri->load_trunk_s));
        json_object_set_new(tm, "load_experts_s", json_real(ri->load_experts_s));
        json_object_set_new(tm, "load_cpu_s", json_real(ri->load_cpu_s));
        json_object_set_new(tm, "prefill_s", json_real(r->prefill_s));
        json_object_set_new(tm, "prefill_tokens", json_integer((json_int_t)r->prefill_ids));
        json_object_set_new(tm, "prefill_tokens_per_s",
                            json_real(r->prefill_s > 0 ? (double)r->prefill_ids / r->prefill_s : 0));
        json_object_set_new(tm, "prefill_cpu_s", json_real(r->prefill_cpu_s));
        json_object_set_new(tm, "prefill_phases", phases_json(&r->prefill_ph));
        json_object_set_new(tm, "decode_s", json_real(r->decode_s));
        if (r->decode_step_min_s > 0) json_object_set_new(tm, "decode_step_min_s", json_real(r->decode_step_min_s));
        json_object_set_new(tm, "decode_cpu_s", json_real(r->decode_cpu_s));
        json_object_set_new(tm, "decode_phases", phases_json(&r->decode_ph));
        if (r->n_ckpt) {
            json_object_set_new(tm, "checkpoint_s", json_real(r->ckpt_s));
            json_object_set_new(tm, "checkpoints", json_integer((json_int_t)r->n_ckpt));
        }
        /* the first generated token comes from the prefill's logits (prefill_s covers its step, in
         * full recompute too), so decode_s covers the forwards of the ids generated after that
         * step in this run (not those of the run a --resume continues) */
        size_t n_dec = r->n_gen > r->i0 + r->first_ids ? r->n_gen - r->i0 - r->first_ids : 0;
        json_object_set_new(tm, "decode_tokens", json_integer((json_int_t)n_dec));
        json_object_set_new(tm, "decode_tokens_per_s", json_real(r->decode_s > 0 ? (double)n_dec / r->decode_s : 0));
        json_object_set_new(j, "timing", tm);
        /* passes over the weights per generated token after the first: 1 in plain decoding, less
         * with accepted speculation; each pass reads the whole trunk and the routed experts */
        uint64_t trunk_bytes = 0;
        for (int u = 0; u < en->model->n_units; u++) trunk_bytes += en->model->units[u].bytes;
        trunk_bytes += (uint64_t)en->model->lm_head.rows * en->model->lm_head.cols * (en->model->lm_head.dtype == DTYPE_F32 ? 4 : 2);
        json_t *sp = json_object();
        json_object_set_new(sp, "draft", json_string(ri->draft ? draft_name(ri->draft) : "none"));
        json_object_set_new(sp, "draft_max", json_integer(o->draft_max));
        json_object_set_new(sp, "verify_passes", json_integer((json_int_t)r->spec_passes));
        json_object_set_new(sp, "proposed", json_integer((json_int_t)r->spec_proposed));
        json_object_set_new(sp, "accepted", json_integer((json_int_t)r->spec_accepted));
        json_object_set_new(sp, "rollback", json_string(ri->plan && ri->plan->spec_per_position ? "states" : "refeed"));
        json_object_set_new(sp, "refeeds", json_integer((json_int_t)r->spec_refeeds));
        json_object_set_new(sp, "restores", json_integer((json_int_t)r->spec_restores));
        json_object_set_new(sp, "decode_passes", json_integer((json_int_t)r->decode_passes));
        uint64_t dbytes = 0;
        if (ri->draft && ri->draft->model) { /* a draft model's passes read its own weights */
            json_object_set_new(sp, "draft_passes", json_integer((json_int_t)ri->draft->model->passes));
            json_object_set_new(sp, "draft_trunk_bytes_per_pass", json_integer((json_int_t)ri->draft->model->trunk_bytes));
            dbytes = ri->draft->model->passes * ri->draft->model->trunk_bytes;
        }
        json_object_set_new(sp, "bytes_per_token", /* target and draft trunk bytes read per generated token */
                            json_real(n_dec ? ((double)r->decode_passes * (double)trunk_bytes + (double)dbytes) / (double)n_dec : 0));
        json_object_set_new(sp, "trunk_bytes_per_pass", json_integer((json_int_t)trunk_bytes));
        json_object_set_new(sp, "passes_per_token",
                            json_real(n_dec ? (double)r->decode_passes / (double)n_dec : 0));
        json_object_set_new(sp, "trunk_bytes_per_token",
                            json_real(n_dec ? (double)r->decode_passes * (double)trunk_bytes / (double)n_dec : 0));
        json_object_set_new(j, "speculation", sp);
        json_object_set_new(j, "peak_rss_bytes", json_integer((json_int_t)ru.ru_maxrss * 1024));
        json_object_set_new(j, "n_workers", json_integer(ri->n_workers));
        if (ri->n_workers > 0) json_object_set_new(j, "workers", workers_json(ri->eb, ri->n_workers));
        if (ri->mpi) json_object_set_new(j, "mpi", mpi_json(ri->eb, n_dec));
        json_object_set_new(j, "topology", numa_place_topology_json(ri->topo));
        json_object_set_new(j, "placement", placement_json(ri));
        json_object_set_new(j, "memory", memory_json(ri, ri->eb));
        json_object_set_new(j, "prefetch", prefetch_json(ri, ri->eb));
        int bad = json_dump_file(j, o->json_path, JSON_INDENT(1) | JSON_COMPACT);
        json_decref(j);
        if (bad) { fprintf(stderr, "k3: cannot write %s: %s\n", o->json_path, strerror(errno)); status = EXIT_RUNTIME; }
    }
    free(text);
    return status;
}

/* /metrics: the expert servers' and the trunk's counters. */
static void engine_stats(void *ctx, server_engine_stats *st) {
    const run_info *ri = ctx;
    memset(st, 0, sizeof *st);
    st->n_workers = ri->n_workers;
    for (int i = 0; i < ri->n_workers; i++) {
        worker_stats ws;
        workers_pool_stats(ri->eb, i, &ws);
        st->expert_hits += ws.hits;
        st->expert_misses += ws.misses;
        st->expert_bytes_read += ws.bytes_read;
        st->expert_restarts += ws.restarts;
    }
    if (ri->n_workers == 0 && !ri->mpi) st->expert_bytes_read = experts_local_stats(ri->eb, &st->expert_hits, &st->expert_misses);
    st->trunk_bytes_streamed = trunk_get_stats(ri->trunk).bytes_streamed;
}

/* The prompt as ids: parsed from --ids, or encoded from --prompt / --prompt-file
 * (special-token text allowed, like --encode). Returns an exit status. */
static int prompt_ids(const options *o, const tokenizer *tok, int32_t **ids, size_t *n) {
    if (o->ids_arg) {
        if (parse_ids(o->ids_arg, ids, n) == 0) return EXIT_OK;
        fprintf(stderr, "k3: --ids wants a comma-separated list of non-negative integers, got '%s'\n", o->ids_arg);
        return EXIT_USAGE;
    }
    size_t len = strlen(o->prompt ? o->prompt : "");
    k3_error fe = {0};
    char *text = o->prompt ? strdup(o->prompt) : file_read_stream(o->prompt_file, (size_t)1 << 30, &len, &fe);
    if (!text) { fprintf(stderr, "k3: %s\n", fe.set ? fe.msg : "out of memory"); return EXIT_USAGE; }
    k3_error te = {0};
    int rc = tokenizer_encode(tok, text, len, 1, ids, n, &te);
    free(text);
    if (rc) { fprintf(stderr, "k3: cannot encode the prompt: %s\n", te.msg); return k3_exit_status(&te); }
    if (*n == 0) { fprintf(stderr, "k3: the prompt is empty\n"); return EXIT_USAGE; }
    return EXIT_OK;
}

/* --mpi: the same options on every rank; --workers N (N > 0) gives every expert rank N local servers */
static mpi_options mpi_opts(const options *o, const char *simd) {
    mpi_options mo = {o->model_dir, (int)o->timeout_ms, o->cache_mb > 0 ? (uint64_t)(o->cache_mb * 1048576.0) : 0,
                      o->cache_policy, simd, (int)o->worker_threads, (size_t)o->chunk,
                      o->workers > 0 ? (int)o->workers : 0, (int)o->workers_per_node, o->numa, (int)o->max_restarts};
    return mo;
}

static int start_backend(const options *o, k3_model *m, const kernels *k, int threads, int nw, uint64_t cache_bytes,
                         const placement *pl, expert_backend *eb, k3_error *err) {
    cache_policy pol = CACHE_POLICY_DEFAULT;
    if (o->cache_policy && cache_policy_parse(o->cache_policy, &pol)) return k3_fail(err, "unknown expert-cache policy");
    if (o->mpi) {
        mpi_options mo = mpi_opts(o, k->name);
        return experts_mpi_create(eb, m, &mo, err);
    }
    if (nw == 0) return experts_local_create(eb, m, k, cache_bytes, pol, err);
    pool_options po = {0};
    char path[4096];
    if (workers_pool_default_path(path, sizeof path)) return k3_fail(err, "cannot locate k3-expertd");
    po.n_workers = nw;
    po.place = pl; /* node, cpus and threads of every server (the same after a restart) */
    po.threads = o->worker_threads ? (int)o->worker_threads : (threads / nw > 0 ? threads / nw : 1);
    po.timeout_ms = (int)o->timeout_ms;
    po.max_restarts = (int)o->max_restarts;
    po.max_tokens = (size_t)o->chunk;
    po.expertd_path = path;
    po.simd = k->name;
    po.cache_bytes = cache_bytes;
    po.policy = cache_policy_name(pol);
    po.read_threads = (int)o->read_threads;
    po.preload = o->preload_experts;
    return workers_pool_create(eb, &m->cfg, m->ck.dir, &po, err);
}

/* engine.on_pass: every pass starts with the coordinator's threads on their nodes. */
static void rebind_threads(void *ctx) {
    k3_error e = {0};
    if (numa_place_threads(ctx, &e)) fprintf(stderr, "k3: %s\n", e.msg);
}

/* The budget asked for: --mem-gb, --preset, or the auto preset. 0 = everything resident. */
static int budget_bytes(const options *o, uint64_t *bytes) {
    if (o->mem_gb > 0) { *bytes = (uint64_t)(o->mem_gb * 1024.0 * 1024.0 * 1024.0); return 0; }
    const char *name = o->preset ? o->preset : "auto";
    if (plan_preset_bytes(name, bytes) == 0) return 0;
    fprintf(stderr, "k3: unknown --preset '%s' (see --list-presets)\n", name);
    return -1;
}

static void list_presets(void) {
    for (const mem_preset *p = plan_presets(); p->name; p++) {
        uint64_t b = 0;
        plan_preset_bytes(p->name, &b);
        if (b) printf("%-12s %8.1f GiB  %s\n", p->name, b / (1024.0 * 1024.0 * 1024.0), p->what);
        else printf("%-12s %12s  %s\n", p->name, "-", p->what);
    }
}

/* Positions one sequence may reach: --max-context, else the prompt and the tokens
 * to generate (4096 for --chat, --serve and --plan-only). */
static size_t sequence_context(const options *o, size_t n_prompt) {
    return o->max_context ? (size_t)o->max_context : (o->chat || o->serve || o->plan_only) ? 4096 : n_prompt + (size_t)o->gen;
}

/* Positions the MLA cache is planned for: --serve holds one cache per slot. */
static size_t planned_context(const options *o, size_t n_prompt) {
    return sequence_context(o, n_prompt) * (o->serve ? (size_t)o->parallel : 1);
}

/* THE plan of a run and of --plan-only (m == NULL: from the config alone): the same
 * inputs give the same plan, --expert-cache-mb included. mpi_ranks: --mpi's expert ranks
 * (rank 0's plan: no experts in this process), 0 without --mpi. */
static int make_plan(const options *o, const k3_config *cfg, const k3_model *m, uint64_t budget, int n_workers, size_t ctx,
                     int mpi_ranks, mem_plan *plan, k3_error *err) {
    /* speculation: --draft-max proposals; rollback from per-position states unless refused or
     * (auto) the budget does not hold them, then one copy and a re-feed */
    size_t spec_k = (o->draft && strcmp(o->draft, "none")) || o->draft_model ? (size_t)o->draft_max : 0;
    const char *rb = o->draft_rollback ? o->draft_rollback : "auto";
    plan_spec sp = {spec_k, strcmp(rb, "refeed") != 0, 0, o->serve ? (size_t)o->parallel : 1, o->mpi ? mpi_ranks : 0,
                    o->expert_prefetch && !o->mpi ? expert_predict_bytes(cfg) : 0,
                    o->expert_prefetch == 2 && !o->mpi ? 2 * (size_t)cfg->num_experts_per_token : 0};
    if (o->draft_model && draft_model_plan_bytes(o->draft_model, (size_t)o->chunk, ctx + spec_k, &sp.draft_model_bytes, err))
        return -1;
    if (plan_make_spec(plan, cfg, m, budget, n_workers, (size_t)o->chunk, ctx, &sp, err)) {
        if (!(spec_k && !strcmp(rb, "auto"))) return -1;
        k3_error e2 = {0};
        plan_free(plan); /* the refused plan's walk */
        sp.per_position = 0;
        if (plan_make_spec(plan, cfg, m, budget, n_workers, (size_t)o->chunk, ctx, &sp, &e2)) return -1;
    }
    if (o->cache_mb > 0 && plan_set_expert_cache(plan, (uint64_t)(o->cache_mb * 1048576.0), err)) {
        plan_free(plan);
        return -1;
    }
    return 0;
}

/* --plan-only --mpi: rank 0's plan for the expert ranks of the `mpirun -np N` it runs under
 * (N - 1, from Open MPI's OMPI_COMM_WORLD_SIZE; MPI is not started; only rank 0 prints),
 * else (no mpirun) for one expert rank. */
static int plan_only_mpi_ranks(void) {
    const char *e = getenv("OMPI_COMM_WORLD_SIZE");
    long n = e ? strtol(e, NULL, 10) : 0;
    return n > 2 && n < 100000 ? (int)(n - 1) : 1;
}

/* --plan-only: the plan from config.json alone (no weights needed). */
static int plan_only(const options *o) {
    k3_config cfg;
    k3_error err = {0};
    uint64_t budget;
    if (budget_bytes(o, &budget)) return EXIT_USAGE;
    const char *rank = getenv("OMPI_COMM_WORLD_RANK");
    if (o->mpi && rank && strcmp(rank, "0")) return EXIT_OK; /* under mpirun: rank 0 prints the plan */
    if (config_load(o->model_dir, &cfg, &err)) { fprintf(stderr, "k3: refusing model: %s\n", err.msg); return EXIT_USAGE; }
    mem_plan plan;
    k3_topology topo;
    placement pl;
    if (make_placement(o, &topo, &pl)) { config_free(&cfg); return EXIT_USAGE; }
    omp_set_num_threads(pl.coord_threads); /* as the run does before it plans: the scratch is per thread */
    int n_servers = pl.n_servers;
    placement_free(&pl);
    topology_free(&topo);
    int rc = make_plan(o, &cfg, NULL, budget, n_servers, planned_context(o, 0), plan_only_mpi_ranks(), &plan, &err);
    if (rc) fprintf(stderr, "k3: %s\n", err.msg);
    else plan_print(&plan, &cfg, stdout);
    plan_free(&plan);
    config_free(&cfg);
    return rc ? EXIT_USAGE : EXIT_OK;
}

/* Step 3 (--load-state, --resume): loads the state file lpath into lst/ld and takes over its run
 * settings (prompt, target, sampler, stop ids, text) into o, ps, r, *n and *hist (ids before this
 * run's prompt); loads the tokenizer when the saved run printed text. 0, or an exit status. */
static int take_state_file(options *o, const char *lpath, int sources, const k3_model *m, state_fingerprint *fp,
                           seq_state *lst, state_loaded *ld, persist *ps, run_result *r, size_t *n, size_t *hist,
                           tokenizer **tok, const tokenizer **ri_tok) {
    k3_error err = {0};
    if (seq_state_init(lst, &m->cfg, &err)) { fprintf(stderr, "k3: %s\n", err.msg); return EXIT_RUNTIME; }
    if (state_file_load(lpath, fp, &m->cfg, o->max_context ? (size_t)o->max_context : (size_t)1 << 30, lst, ld, &err)) {
        fprintf(stderr, "k3: refusing the state file: %s\n", err.msg);
        return EXIT_USAGE;
    }
    ps->ld = ld;
    ps->lst = lst;
    ps->keep_rng = 1;
    if (o->resume) { /* the run as it was started: its prompt, target, sampler, stop ids */
        if (ld->run.kind != STATE_KIND_RUN || ld->n_ids > ld->run.n_prompt + ld->run.gen_target || ld->run.n_prompt == 0) {
            fprintf(stderr, "k3: refusing the state file: %s is not a run checkpoint (a chat or snapshot state: use --load-state)\n", lpath);
            return EXIT_USAGE;
        }
        *n = (size_t)ld->run.n_prompt;
        r->n_gen = ld->n_ids - *n;
        o->gen = (long)ld->run.gen_target;
        o->sampling = ld->run.sampling;
        free(o->stop_ids);
        o->stop_ids = NULL;
        o->n_stop_ids = 0;
        if (ld->run.n_stop_ids && !(o->stop_ids = malloc(ld->run.n_stop_ids * sizeof *o->stop_ids))) return EXIT_USAGE;
        if (ld->run.n_stop_ids) memcpy(o->stop_ids, ld->run.stop_ids, ld->run.n_stop_ids * sizeof *o->stop_ids);
        o->n_stop_ids = ld->run.n_stop_ids;
        if (!o->checkpoint) o->checkpoint = o->resume;
        if (ld->run.ckpt_every) o->checkpoint_every = (long)ld->run.ckpt_every;
        ps->text = ld->run.text;
        int done_already = r->n_gen >= (size_t)o->gen;
        for (size_t j = 0; r->n_gen > 0 && j < o->n_stop_ids; j++) done_already |= ld->ids[ld->n_ids - 1] == o->stop_ids[j];
        if (done_already) o->checkpoint = NULL; /* nothing left to run: just report it */
        fprintf(stderr, "k3: resuming %s: %zu prompt ids, %zu of %ld generated\n", lpath, *n, r->n_gen, o->gen);
        r->finished = done_already;
    } else {
        *hist = ld->n_ids;
        sampler_config dflt;
        sampler_config_default(&dflt);
        if (memcmp(&o->sampling, &dflt, sizeof dflt) == 0) o->sampling = ld->run.sampling; /* continue as saved */
        else if (o->sampling.seed != dflt.seed) ps->keep_rng = 0;                          /* a new seed: re-seeded */
        if (!o->n_stop_ids && ld->run.n_stop_ids) {
            if (!(o->stop_ids = malloc(ld->run.n_stop_ids * sizeof *o->stop_ids))) return EXIT_USAGE;
            memcpy(o->stop_ids, ld->run.stop_ids, ld->run.n_stop_ids * sizeof *o->stop_ids);
            o->n_stop_ids = ld->run.n_stop_ids;
        }
        if (!sources) ps->text = ld->run.text;
        if (ld->n_ids - lst->pos + *n == 0 && o->gen > 0) {
            fprintf(stderr, "k3: refusing the state file: %s has no pending id (saved after --gen 0?): give --ids or "
                            "--prompt to continue it\n", lpath);
            return EXIT_USAGE;
        }
        r->n_loaded = *hist;
    }
    fprintf(stderr, "k3: loaded %s: %zu ids (%zu fed)\n", lpath, ld->n_ids, lst->pos);
    if (ps->text && !*tok) { /* the saved run printed text: so does its continuation */
        k3_error te = {0};
        if (!(*tok = tokenizer_load(o->model_dir, &te))) {
            fprintf(stderr, "k3: cannot load the tokenizer: %s\n", te.msg);
            return EXIT_USAGE;
        }
        *ri_tok = *tok;
    }
    return 0;
}

/* Step 1: the output paths, then the modes that need no model (--encode/--decode, --list-presets,
 * --verify, --doctor, --plan-only). Returns 1 and sets *status when one of them ran (or refused). */
static int other_mode(const options *o, int *status) {
    k3_error oe = {0};
    if (sampler_adjusts(&o->sampling) && (o->save_state || o->checkpoint || o->load_state || o->resume || o->serve)) {
        fprintf(stderr, "k3: --presence-penalty, --frequency-penalty, --repetition-penalty and --logit-bias are not "
                        "kept in state files (--save-state, --checkpoint, --load-state, --resume) and are request "
                        "fields with --serve\n");
        *status = EXIT_USAGE;
        return 1;
    }
    if (outputs_check_paths(o->json_path, o->logits_path, o->trace_path, &oe) ||
        outputs_check_path("--save-state", o->save_state, &oe) || outputs_check_path("--checkpoint", o->checkpoint, &oe)) {
        fprintf(stderr, "k3: %s\n", oe.msg);
        *status = EXIT_USAGE;
        return 1;
    }
    if (o->encode_file || o->decode_file) *status = tokenize_command(o->tok_dir, o->encode_file, o->decode_file, o->no_special);
    else if (o->list_presets) { list_presets(); *status = EXIT_OK; }
    else if (o->verify) *status = verify_run(&(verify_options){o->model_dir, o->sha256, o->expect_path, o->json_path, (int)o->threads, 0});
    else if (o->doctor) *status = doctor_run(&(doctor_options){o->model_dir, o->json_path, o->chunk, o->mem_gb});
    else if (o->plan_only) *status = plan_only(o);
    else return 0;
    *status = outputs_finish(*status);
    return 1;
}

/* Step 2: the draft source of speculation (--draft, --draft-rollback); 0, or an exit status. */
static int open_draft(const options *o, draft_source *draft) {
    k3_error de = {0};
    if (draft_open(draft, o->draft, o->draft_ids, o->draft_model, &de)) { fprintf(stderr, "k3: %s\n", de.msg); return EXIT_USAGE; }
    const char *rb = o->draft_rollback ? o->draft_rollback : "auto";
    if (strcmp(rb, "auto") && strcmp(rb, "states") && strcmp(rb, "refeed")) {
        fprintf(stderr, "k3: --draft-rollback wants auto|states|refeed, got '%s'\n", rb);
        draft_close(draft);
        return EXIT_USAGE;
    }
    if (draft->kind != DRAFT_NONE && (o->full_recompute || (o->serve && draft->kind != DRAFT_NGRAM))) {
        fprintf(stderr, "k3: --draft works with --ids/--prompt runs, --chat and --serve --draft ngram (not with "
                        "--full-recompute, nor another draft in --serve)\n");
        draft_close(draft);
        return EXIT_USAGE;
    }
    return 0;
}

/* Step 5a (--serve): the HTTP server over the engine; an exit status. */
static int serve_main(const options *o, engine *en, const tokenizer *tok, const state_fingerprint *fp, run_info *ri) {
    server_config sc;
    server_config_default(&sc);
    sc.host = o->host;
    sc.port = (int)o->port;
    sc.api_key = o->api_key;
    sc.parallel = (size_t)o->parallel;
    sc.max_queue = (size_t)o->max_queue;
    sc.chunk = (size_t)o->chunk;
    sc.draft_max = ri->draft && ri->draft->kind == DRAFT_NGRAM ? (size_t)o->draft_max : 0;
    sc.draft_per_position = ri->plan->spec_per_position;
    sc.max_context = o->max_context ? (size_t)o->max_context : 4096;
    sc.default_max_tokens = (size_t)o->max_tokens;
    sc.thinking = o->thinking;
    sc.tmpl = o->tmpl;
    sc.snapshot_bytes = (uint64_t)o->snapshot_mb << 20;
    sc.state_dir = o->state_dir;
    sc.state_dir_bytes = (uint64_t)(o->state_dir_mb * 1048576.0);
    sc.fp = fp;
    sc.timeout_s = (unsigned)o->http_timeout;
    sc.engine_stats = engine_stats;
    sc.engine_stats_ctx = ri;
    k3_error err = {0};
    int status = server_run(en, tok, &sc, &err);
    if (status) fprintf(stderr, "k3: %s\n", err.msg);
    return status;
}

/* Step 5b (--chat): the REPL over the engine, at the planned context; an exit status. */
static int chat_main(const options *o, size_t plan_ctx, engine *en, const tokenizer *tok, const state_fingerprint *fp,
                     snap_store *snaps, run_info *ri) {
    chat_options co;
    chat_options_default(&co);
    co.system = o->system;
    co.thinking = o->thinking;
    co.tmpl = o->tmpl;
    co.max_tokens = (size_t)o->max_tokens;
    co.sampling = o->sampling;
    co.stop_ids = o->stop_ids;
    co.n_stop_ids = o->n_stop_ids;
    co.chunk = (size_t)o->chunk;
    co.max_context = plan_ctx; /* the planned context: --max-context or the default the plan was sized for */
    co.fp = fp;
    co.load_state = o->load_state;
    co.snaps = snaps;
    if (ri->draft && ri->draft->kind != DRAFT_NONE) {
        co.draft = ri->draft;
        co.draft_max = (size_t)o->draft_max;
        co.draft_per_position = ri->plan->spec_per_position;
    }
    return chat_repl(en, tok, &co, stdin, stdout, stderr);
}

static int k3_main(int argc, char **argv, int *mpi_rank, int *mpi_size) {
    options o;
    if (cli_parse(argc, argv, &o)) { cli_usage(stderr); return EXIT_USAGE; }
    if (outputs_init()) return EXIT_RUNTIME; /* stdout closed */
    int early;
    if (other_mode(&o, &early)) return early;
    draft_source draft;
    if ((early = open_draft(&o, &draft))) return outputs_finish(early);
    /* Idle OpenMP threads must sleep, not spin: with expert servers the
     * coordinator's cores sit idle while they compute, and on a shared machine a
     * spinning barrier waits for a descheduled thread (measured: 3-4x slower
     * decoding in-process with one other busy process on 2 cores). libgomp reads
     * its wait policy only at start-up, so restart once with passive waiting. */
    if (!getenv("OMP_WAIT_POLICY")) {
        setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
        execv("/proc/self/exe", argv);
    }
    if (o.mpi) {
        k3_error me = {0};
        if (o.chat) { fprintf(stderr, "k3: --mpi works with --ids/--prompt runs and --serve, not --chat\n"); draft_close(&draft); return EXIT_USAGE; }
        if (o.preload_experts) {
            fprintf(stderr, "k3: --preload-experts is not available with --mpi (the expert ranks read on first use)\n");
            draft_close(&draft);
            return EXIT_USAGE;
        }
        if (experts_mpi_init(&argc, &argv, mpi_rank, mpi_size, &me)) {
            fprintf(stderr, "k3: %s\n", me.msg);
            draft_close(&draft);
            return EXIT_USAGE;
        }
        if (*mpi_rank > 0) { /* an expert rank: serve until rank 0 is done */
            draft_close(&draft);
            if (o.threads) omp_set_num_threads((int)o.threads);
            mpi_options mo = mpi_opts(&o, o.simd == SIMD_AUTO ? "auto" : o.simd == SIMD_SCALAR ? "scalar" : o.simd == SIMD_AVX2 ? "avx2" : "avx512");
            return experts_mpi_serve(&mo);
        }
    }
    const kernels *k = kernels_get(o.simd);
    if (!k) {
        static const char *const names[] = {"auto", "scalar", "avx2", "avx512"};
        fprintf(stderr, "k3: --simd %s is not supported by this CPU or build\n", names[o.simd]);
        return EXIT_USAGE;
    }
    k3_topology topo = {0};
    placement pl = {0};
    numa_place np = {0};
    run_info ri = {.topo = &topo, .np = &np};
    mem_plan plan = {0};
    trunk *tr = NULL;
    tokenizer *tok = NULL;
    if (o.prompt || o.prompt_file || o.tok_dir || o.chat || o.serve) {
        k3_error te = {0};
        if (!(tok = tokenizer_load(o.tok_dir ? o.tok_dir : o.model_dir, &te))) {
            fprintf(stderr, "k3: cannot load the tokenizer: %s\n", te.msg);
            return EXIT_USAGE;
        }
    }
    ri.tok = tok;
    run_result r = {0};
    int32_t *prompt = NULL;
    size_t n = 0;
    int sources = o.ids_arg || o.prompt || o.prompt_file;
    int status = (o.chat || o.serve || !sources) ? EXIT_OK : prompt_ids(&o, tok, &prompt, &n);
    if (status != EXIT_OK) { free(prompt); tokenizer_free(tok); return status; }
    double t0 = k3_now_s(), c0 = proc_cpu_s();
    k3_model m;
    k3_error err = {0};
    if (model_load(o.model_dir, &m, &err)) {
        fprintf(stderr, "k3: refusing model: %s\n", err.msg);
        free(prompt);
        tokenizer_free(tok);
        return EXIT_USAGE;
    }
    ri.load_model_s = k3_now_s() - t0;
    ri.load_cpu_s = proc_cpu_s() - c0;
    status = EXIT_USAGE;
    expert_backend eb = {0};
    expert_predict *predictor = NULL;
    engine en = {0};
    state_fingerprint fp;
    seq_state lst = {0};
    state_loaded ld = {0};
    snap_store *snaps = NULL;
    persist ps = {.fp = &fp, .text = !o.ids_arg};
    for (size_t i = 0; i < n; i++)
        if (prompt[i] >= m.cfg.vocab_size) {
            fprintf(stderr, "k3: prompt id %d is outside the vocabulary [0, %d)\n", prompt[i], m.cfg.vocab_size);
            goto done;
        }
    if (state_fingerprint_compute(&fp, o.model_dir, o.tok_dir, &m.ck, &err)) {
        fprintf(stderr, "k3: %s\n", err.msg);
        status = EXIT_RUNTIME;
        goto done;
    }
    const char *lpath = o.resume ? o.resume : o.chat ? NULL : o.load_state;
    size_t hist = 0; /* ids before this run's prompt */
    if (lpath && (status = take_state_file(&o, lpath, sources, &m, &fp, &lst, &ld, &ps, &r, &n, &hist, &tok, &ri.tok)))
        goto done;
    status = EXIT_USAGE;
    size_t total = o.resume ? n : hist + n; /* the prompt of this run (history + appended) */
    if (lpath && o.max_context && total + (size_t)o.gen > (size_t)o.max_context && !r.finished) {
        fprintf(stderr, "k3: refusing the state file: its history of %zu ids%s plus --gen %ld exceeds --max-context %ld\n",
                o.resume ? ld.n_ids : hist, o.resume || !n ? "" : " and the new prompt", o.gen - (long)r.n_gen, o.max_context);
        goto done;
    }
    r.n_prompt = total;
    r.seq = malloc((total + (size_t)o.gen) * sizeof *r.seq);
    r.tf_pred = malloc((total ? total : 1) * sizeof *r.tf_pred);
    status = EXIT_RUNTIME;
    if (!r.seq || !r.tf_pred) { fprintf(stderr, "k3: out of memory\n"); goto done; }
    if (o.resume) memcpy(r.seq, ld.ids, ld.n_ids * sizeof *r.seq);
    else {
        if (hist) memcpy(r.seq, ld.ids, hist * sizeof *r.seq);
        if (n) memcpy(r.seq + hist, prompt, n * sizeof *prompt);
    }
    n = total;
    uint64_t budget;
    status = EXIT_USAGE;
    if (budget_bytes(&o, &budget) || make_placement(&o, &topo, &pl)) goto done;
    numa_place_print_topology(&topo, &pl, stderr);
    omp_set_num_threads(pl.coord_threads);
    ri.threads = omp_get_max_threads();
    if (numa_place_init(&np, &pl, &err) || numa_place_threads(&pl, &err)) {
        fprintf(stderr, "k3: %s\n", err.msg);
        goto done;
    }
    /* the kernels' row blocks (common/kernels.h): a bound placement keeps the static partition
     * its rows were placed for; otherwise a thread the host deschedules leaves its blocks to the
     * others (4 blocks a grab: 32 rows of a one-token matmul, 96 of a multi-token one) */
    omp_set_schedule(pl.bound ? omp_sched_static : omp_sched_dynamic, pl.bound ? 0 : 4);
    ri.n_workers = pl.n_servers; /* 0 with --mpi (make_placement) */
    ri.mpi = o.mpi;
    if (workers_pool_check(&m, ri.n_workers, o.cache_mb > 0 ? (uint64_t)(o.cache_mb * 1048576.0) + 1 : 0, &err)) {
        fprintf(stderr, "k3: %s\n", err.msg);
        goto done;
    }
    size_t plan_ctx = sequence_context(&o, n);
    if (o.max_context && !o.chat && !o.serve && n + (size_t)o.gen > (size_t)o.max_context) {
        fprintf(stderr, "k3: the prompt (%zu tokens) plus --gen %ld exceeds --max-context %ld\n", n, o.gen, o.max_context);
        goto done;
    }
    size_t ctx = planned_context(&o, n);
    if (make_plan(&o, &m.cfg, &m, budget, ri.n_workers, ctx, *mpi_size - 1, &plan, &err)) {
        fprintf(stderr, "k3: %s\n", err.msg);
        goto done;
    }
    plan_print(&plan, &m.cfg, stderr);
    status = EXIT_RUNTIME;
    trunk_config tc = {plan.n_pinned, plan.n_slots, plan.lm_chunk_rows, (int)o.read_threads, (int)o.map_trunk};
    t0 = k3_now_s();
    c0 = proc_cpu_s();
    if (!(tr = trunk_create_placed(&m, &tc, numa_place_rows, &np, &err))) { fprintf(stderr, "k3: %s\n", err.msg); goto done; }
    ri.load_trunk_s = k3_now_s() - t0;
    t0 = k3_now_s();
    uint64_t cache_bytes = plan.expert_cache_per_worker; /* --expert-cache-mb is in the plan */
    ri.cache_bytes = cache_bytes;
    {
        trunk_stats ts = trunk_get_stats(tr);
        numa_place_print_coordinator(&np, ts.slot_bytes, ts.n_slots, stderr);
    }
    if (start_backend(&o, &m, k, ri.threads, ri.n_workers, cache_bytes, &pl, &eb, &err)) { fprintf(stderr, "k3: %s\n", err.msg); goto done; }
    if (ri.n_workers == 0 && !o.mpi && experts_local_set_readers(&eb, (int)o.read_threads, &err)) {
        fprintf(stderr, "k3: %s\n", err.msg);
        goto done;
    }
    if (o.preload_experts && !o.mpi &&
        (ri.n_workers == 0 ? experts_local_preload(&eb, &ri.experts_preloaded, &err)
                           : workers_pool_wait_preload(&eb, &ri.experts_preloaded, &err))) {
        fprintf(stderr, "k3: preloading experts: %s\n", err.msg);
        goto done;
    }
    if (o.expert_prefetch && !o.mpi) {
        if (!(predictor = expert_predict_create(&m, (ep_mode)o.expert_prefetch, &err))) { fprintf(stderr, "k3: %s\n", err.msg); goto done; }
        eb.predict = predictor;
    }
    ri.predict = predictor;
    ri.eb = &eb;
    ri.plan = &plan;
    ri.trunk = tr;
    en = (engine){.model = &m, .trunk = tr, .k = k, .experts = &eb};
    if (pl.bound) { en.on_pass = rebind_threads; en.on_pass_ctx = &pl; }
    if (engine_init(&en, (size_t)o.chunk, ctx, ri.threads, &err)) { fprintf(stderr, "k3: %s\n", err.msg); goto done; }
    if (draft_attach(&draft, &m.cfg, &fp, k, ri.threads, (size_t)o.chunk, ctx + (size_t)o.draft_max, &err)) {
        fprintf(stderr, "k3: %s\n", err.msg);
        status = EXIT_USAGE;
        goto done;
    }
    ri.draft = &draft;
    ri.load_experts_s = k3_now_s() - t0;
    ri.load_s = ri.load_model_s + ri.load_trunk_s + ri.load_experts_s;
    ri.load_cpu_s += proc_cpu_s() - c0;
    if ((o.state_dir || o.chat) && !o.serve) { /* prefix snapshots: in memory within the plan, on disk with --state-dir (--serve opens its own) */
        snap_options so = {.cfg = &m.cfg, .fp = &fp, .mem_cap = o.chat ? plan.snapshot_bytes : 0, .dir = o.state_dir,
                           .disk_cap = (uint64_t)(o.state_dir_mb * 1048576.0), .max_positions = ctx, .log = stderr};
        if (snap_store_open(&snaps, &so, &err)) { fprintf(stderr, "k3: %s\n", err.msg); status = EXIT_USAGE; goto done; }
        ps.snaps = o.state_dir ? snaps : NULL;
    }
    FILE *trace = NULL;
    if (o.trace_path) {
        if (!(trace = fopen(o.trace_path, "w"))) { fprintf(stderr, "k3: cannot write %s\n", o.trace_path); goto done; }
        fprintf(trace, "# k3 expert trace v1 layers=%d experts=%d top_k=%d\n", m.cfg.num_hidden_layers, m.cfg.num_experts,
                m.cfg.num_experts_per_token);
        en.on_route = trace_route;
        en.on_route_ctx = trace;
    }
    if (o.serve || o.chat) {
        status = o.serve ? serve_main(&o, &en, tok, &fp, &ri) : chat_main(&o, plan_ctx, &en, tok, &fp, snaps, &ri);
        if (trace) fclose(trace);
        goto done;
    }
    if (r.finished) { /* --resume of a finished run: report it */
        status = EXIT_OK;
        if (ps.text && tok) { /* the same bytes the streaming run printed */
            token_printer tp = {.tok = tok};
            utf8_stream_init(&tp.us, 1);
            for (size_t i = 0; i < r.n_gen; i++) print_token(&tp, r.seq[r.n_prompt + i], 0);
            utf8_stream_write_end(&tp.us, stdout);
            fputc('\n', stdout);
            r.streamed = 1;
        }
    }
    else status = run(&en, &o, draft.kind != DRAFT_NONE ? &draft : NULL, plan.spec_per_position, ps.text ? tok : NULL, &r,
                      &ps, &err);
    int trace_err = 0;
    if (trace && ((ferror(trace) | fclose(trace)) != 0)) trace_err = errno ? errno : EIO;
    if (status != EXIT_OK) fprintf(stderr, "k3: %s\n", err.msg);
    else status = write_outputs(&o, &r, &en, &ri); /* the ids even when the trace failed */
    if (trace_err) {
        fprintf(stderr, "k3: cannot write %s: %s\n", o.trace_path, strerror(trace_err));
        if (status == EXIT_OK) status = EXIT_RUNTIME;
    }
done:
    draft_close(&draft);
    snap_store_free(snaps);
    state_loaded_free(&ld);
    seq_state_free(&lst);
    engine_free(&en);
    if (eb.destroy) eb.destroy(&eb);
    expert_predict_free(predictor);
    trunk_free(tr);
    plan_free(&plan);
    free(prompt);
    free(r.seq);
    free(r.tf_pred);
    free(r.rows);
    free(o.stop_ids);
    model_free(&m);
    tokenizer_free(tok);
    numa_place_free(&np);
    placement_free(&pl);
    topology_free(&topo);
    return outputs_finish(status);
}

int main(int argc, char **argv) {
    int mpi_rank = -1, mpi_size = 0;
    int status = k3_main(argc, argv, &mpi_rank, &mpi_size);
    /* under --mpi: a clean end stops every expert rank; a failure ends them all (no orphans) */
    if (mpi_rank >= 0) experts_mpi_finish(mpi_rank, mpi_size, status == EXIT_OK, status);
    return status;
}
