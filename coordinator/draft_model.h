/* draft_model.h - a smaller checkpoint as the speculation draft (--draft-model DIR).
 *
 * The draft is a model in the same release format and with the same tokenizer as the target
 * (same vocab_size, same tiktoken.model and tokenizer_config.json bytes: refused otherwise,
 * naming what differs). It runs in the coordinator, everything resident: its own trunk,
 * in-process experts, engine (max_rows = chunk) and sequence state. A proposal never changes
 * an id (gen_step_spec checks it); the draft only decides how many ids a verification pass may
 * confirm.
 *
 * draft_model_propose(hist[0..n)) keeps the draft's state in step with the target's history:
 * the ids fed to the draft are always a prefix of hist (a history that no longer extends them,
 * e.g. a reset conversation, restarts the draft from position 0). It feeds hist's new ids (in
 * chunks; at least 1 pass), picks d0 by arg-max (lowest id on ties), then feeds d0..d(k-2) one
 * at a time for d1..d(k-1) (k-1 more passes), and rolls the draft back to n positions (a copy
 * of its KDA state taken at n; MLA rows past n are overwritten later). So a block costs k draft
 * passes, and the accepted ids are re-fed to the draft with the next block's new ids.
 * Memory: draft_model_plan_bytes (its plan with everything resident, from config.json alone,
 * minus the process allowance it shares with the coordinator) is the plan's draft line. */
#ifndef K3_DRAFT_MODEL_H
#define K3_DRAFT_MODEL_H

#include "coordinator/forward.h"
#include "coordinator/state_file.h"
#include "coordinator/trunk.h"

typedef struct {
    k3_model m;
    trunk *tr;
    expert_backend eb;
    engine en;
    seq_state st;
    int32_t *fed;         /* the ids in st: fed[0..st.pos) */
    size_t cap;           /* positions the draft may reach */
    float *row;           /* [vocab] */
    void *snap;           /* the recurrent part at the history's end */
    uint64_t passes;      /* draft forward passes */
    uint64_t trunk_bytes; /* bytes of one draft pass over its trunk */
    int open;
} draft_model;

/* Opens dir as the draft of a target with config tcfg and fingerprint tfp (its tokenizer parts
 * are compared). cap: the most positions a history may reach (the target's context) plus kmax. */
int draft_model_open(draft_model *d, const char *dir, const k3_config *tcfg, const state_fingerprint *tfp,
                     const kernels *k, int threads, size_t chunk, size_t cap, k3_error *err);
void draft_model_close(draft_model *d);
/* Up to kmax greedy ids after hist[0..n) into out; *n_out of them. -1 on a failed pass. */
int draft_model_propose(draft_model *d, const int32_t *hist, size_t n, int32_t *out, size_t kmax, size_t *n_out,
                        k3_error *err);
/* The bytes the draft holds, from its config alone (the same number for --plan-only and a run). */
int draft_model_plan_bytes(const char *dir, size_t chunk, size_t cap, uint64_t *bytes, k3_error *err);

#endif
