/* test_layer_schema.c - the layer schema is the one description of the model:
 *  - the tables are well formed (AttnRes pairs adjacent, trunk rows in a unit of
 *    their kind's part, experts U8, names parse back);
 *  - on tests/models/m13 and m14b12 the schema covers the checkpoint exactly
 *    (every tensor is a schema row or an expert part, nothing else);
 *  - the loader's units are the schema's grouping, in walk order;
 *  - the memory plan from the config alone equals the plan from the loaded model
 *    (walk, slot, small vectors, floor, expert slots) at several budgets;
 *  - the plan's unit bytes are what the trunk allocates (trunk_walk_unit_bytes);
 *  - an expert cache given the plan's per-server bytes gets exactly the plan's
 *    experts per server (one slot size: expert_cache_slot_bytes), also when the
 *    size is the user's (plan_set_expert_cache, --expert-cache-mb).
 * Run from the repository root. */
#include "common/layer_schema.h"
#include "coordinator/plan.h"
#include "coordinator/trunk.h"
#include "workers/expert_cache.h"
#include "tests/unit/check.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_tables(void) {
    for (int k = 0; k < LS_NKINDS; k++) {
        const ls_table *tb = ls_table_get((ls_kind)k);
        CHECK(tb && tb->n > 0 && tb->kind == (ls_kind)k, "table %d", k);
        if (!tb) continue;
        ls_unit_part part = k == LS_KDA || k == LS_MLA ? LS_UNIT_ATTN : k == LS_MLP || k == LS_MOE ? LS_UNIT_FFN : LS_NO_UNIT;
        for (int r = 0; r < tb->n; r++) {
            const ls_tensor *t = &tb->rows[r];
            CHECK(t->ndim >= 1 && t->ndim <= 3, "%s.%s: ndim %d", tb->name, t->suffix, t->ndim);
            if (t->place == LS_TRUNK) CHECK(t->unit == part && part != LS_NO_UNIT && t->ndim == 2, "%s.%s: trunk row outside its part", tb->name, t->suffix);
            else CHECK(t->unit == LS_NO_UNIT, "%s.%s: a unit for a non-trunk row", tb->name, t->suffix);
            if (t->place == LS_FOLD_NORM)
                CHECK(r + 1 < tb->n && tb->rows[r + 1].place == LS_FOLD_PROJ && !strcmp(tb->rows[r + 1].field, t->field),
                      "%s.%s: an AttnRes norm row must be followed by its projection", tb->name, t->suffix);
            if (t->place == LS_FOLD_PROJ)
                CHECK(r > 0 && tb->rows[r - 1].place == LS_FOLD_NORM, "%s.%s: projection without its norm", tb->name, t->suffix);
            CHECK((k == LS_EXPERT) == (t->place == LS_EXPERT_PART) && (k == LS_EXPERT) == (t->dtype == LS_U8),
                  "%s.%s: expert rows are the U8 expert parts", tb->name, t->suffix);
            CHECK(ls_dtype_ok(t, t->dtype == LS_U8 ? ST_U8 : ST_BF16) && !ls_dtype_ok(t, ST_F16) && !ls_dtype_ok(t, ST_I8),
                  "%s.%s: accepted dtypes", tb->name, t->suffix);
        }
    }
    CHECK(ls_table_get(LS_EXPERT)->n == LS_EXPERT_NT && LS_EXPERT_NT == EXPERT_NT, "six expert tensors");

    /* expert names: built by the schema, parsed back; anything else is not an expert */
    char name[256];
    const ls_table *ex = ls_table_get(LS_EXPERT);
    CHECK(!ls_tensor_name(ex, &ex->rows[3], 12, 895, name, sizeof name) &&
              !strcmp(name, "language_model.model.layers.12.block_sparse_moe.experts.895.w2.weight_scale"),
          "expert name '%s'", name);
    int l = -1, e = -1;
    CHECK(ls_expert_name_parse(name, &l, &e) == 1 && l == 12 && e == 895, "parse '%s' -> %d %d", name, l, e);
    static const char *const NOT_EXPERT[] = {
        "language_model.model.layers.1.block_sparse_moe.gate.weight",
        "language_model.model.layers.-1.block_sparse_moe.experts.3.w1.weight_packed",
        "language_model.model.layers. 1.block_sparse_moe.experts.3.w1.weight_packed",
        "language_model.model.layers.01.block_sparse_moe.experts.3.w1.weight_packed",
        "language_model.model.layers.1.block_sparse_moe.experts.+3.w1.weight_packed",
        "language_model.model.layers.1.block_sparse_moe.experts.3",
        "language_model.model.layers.99999999999.block_sparse_moe.experts.3.w1.weight_packed",
        "model.layers.1.block_sparse_moe.experts.3.w1.weight_packed",
        "",
    };
    for (size_t i = 0; i < sizeof NOT_EXPERT / sizeof NOT_EXPERT[0]; i++)
        CHECK(!ls_expert_name_parse(NOT_EXPERT[i], &l, &e), "'%s' parsed as an expert", NOT_EXPERT[i]);
    CHECK(ls_tensor_name(ex, &ex->rows[0], 1, 1, name, 20) == -1, "a short buffer is refused");
    CHECK(ls_buffer_bytes(0) == 8192 && ls_buffer_bytes(1) == 12288 && ls_buffer_bytes(4096) == 12288 &&
              ls_buffer_bytes(4097) == 16384,
          "buffer bytes");
}

static void test_model(const char *dir) {
    k3_model m;
    k3_error err = {0};
    if (model_load(dir, &m, &err)) { CHECK(0, "cannot load %s: %s", dir, err.msg); return; }
    const k3_config *c = &m.cfg;
    const ls_layout *lay = &m.layout;

    /* the schema covers the checkpoint exactly */
    uint64_t experts = 0, items = 0;
    for (size_t i = 0; i < m.ck.n_entries; i++) {
        int l, e;
        if (ls_expert_name_parse(m.ck.entries[i].name, &l, &e)) experts++;
        else items++;
    }
    CHECK(items == (uint64_t)lay->n_items, "%s: %llu non-expert tensors, the schema has %d", dir, (unsigned long long)items, lay->n_items);
    CHECK(experts == (uint64_t)lay->n_moe_layers * (uint64_t)c->num_experts * LS_EXPERT_NT, "%s: %llu expert tensors", dir,
          (unsigned long long)experts);
    for (int i = 0; i < lay->n_items; i++) CHECK(lay->items[i].e != NULL, "%s: item %d not located", dir, i);

    /* units: the schema's grouping, every trunk matrix once, in item (= use) order */
    CHECK(m.n_units == lay->n_units && m.n_units > 0, "%s: %d units vs layout %d", dir, m.n_units, lay->n_units);
    int last = -1, n_trunk = 0;
    for (int u = 0; u < m.n_units; u++) {
        CHECK(m.units[u].bytes <= m.max_unit_bytes || m.units[u].n == 1, "%s: unit %d larger than the largest matrix", dir, u);
        for (int j = 0; j < m.units[u].n; j++) {
            int it = lay->units[u].items[j];
            CHECK(it > last, "%s: unit %d out of use order", dir, u);
            last = it;
            CHECK(m.units[u].e[j] == lay->items[it].e && lay->items[it].unit == u, "%s: unit %d tensor %d", dir, u, j);
            n_trunk++;
        }
    }
    int want_trunk = 0;
    for (int i = 0; i < lay->n_items; i++) want_trunk += lay->items[i].t->place == LS_TRUNK;
    CHECK(n_trunk == want_trunk, "%s: %d trunk matrices in units, %d in the layout", dir, n_trunk, want_trunk);

    /* plan from the config alone == plan from the loaded model */
    mem_plan a, b;
    uint64_t budgets[] = {0, 1ull << 26, 1ull << 27, 3ull << 26, 1ull << 30};
    for (int w = 0; w <= 2; w += 2)
        for (size_t i = 0; i < sizeof budgets / sizeof budgets[0]; i++) {
            k3_error ea = {0}, eb = {0};
            int ra = plan_make(&a, c, NULL, budgets[i], w, 64, 100, &ea);
            int rb = plan_make(&b, c, &m, budgets[i], w, 64, 100, &eb);
            CHECK(ra == rb && !strcmp(ea.msg, eb.msg), "%s budget %llu: config plan %d '%s', model plan %d '%s'", dir,
                  (unsigned long long)budgets[i], ra, ea.msg, rb, eb.msg);
            if (!ra && !rb) {
                CHECK(a.n_walk == b.n_walk && a.lm_chunk_rows == b.lm_chunk_rows && a.slot_bytes == b.slot_bytes &&
                          a.small_bytes == b.small_bytes && a.process_bytes == b.process_bytes && a.floor == b.floor &&
                          a.total == b.total && a.n_pinned == b.n_pinned && a.n_slots == b.n_slots &&
                          a.expert_slot_bytes == b.expert_slot_bytes && a.expert_cache_per_worker == b.expert_cache_per_worker,
                      "%s budget %llu workers %d: the plans differ", dir, (unsigned long long)budgets[i], w);
                for (int u = 0; u < a.n_walk && a.n_walk == b.n_walk; u++)
                    CHECK(a.walk_bytes[u] == b.walk_bytes[u], "%s: walk unit %d", dir, u);
                /* what the trunk allocates per unit is what the plan counted */
                CHECK(b.n_walk == trunk_walk_units(&m, b.lm_chunk_rows), "%s: walk length", dir);
                for (int u = 0; u < b.n_walk; u++)
                    CHECK(b.walk_bytes[u] == trunk_walk_unit_bytes(&m, b.lm_chunk_rows, u), "%s: unit %d: plan %llu, trunk %llu", dir,
                          u, (unsigned long long)b.walk_bytes[u], (unsigned long long)trunk_walk_unit_bytes(&m, b.lm_chunk_rows, u));
                /* one expert slot size: the cache given the plan's bytes holds the plan's experts */
                CHECK(b.expert_slot_bytes == expert_cache_slot_bytes(&m.experts), "%s: plan slot %llu, cache slot %llu", dir,
                      (unsigned long long)b.expert_slot_bytes, (unsigned long long)expert_cache_slot_bytes(&m.experts));
                k3_error ec = {0};
                expert_cache *cache = expert_cache_create(&m.experts, &m.ck, b.expert_cache_per_worker, -1, &ec);
                CHECK(cache && expert_cache_slots(cache) == b.expert_cache_per_worker / b.expert_slot_bytes,
                      "%s: cache of %llu bytes has %zu slots, the plan says %llu", dir, (unsigned long long)b.expert_cache_per_worker,
                      cache ? expert_cache_slots(cache) : 0, (unsigned long long)(b.expert_cache_per_worker / b.expert_slot_bytes));
                expert_cache_free(cache);
                /* --expert-cache-mb: the plan takes the user's bytes; the cache makes the same slots of them */
                uint64_t user = 3 * b.expert_slot_bytes + b.expert_slot_bytes / 2, total0 = b.total, per0 = b.expert_cache_per_worker;
                CHECK(!plan_set_expert_cache(&b, user, &ec), "%s: plan_set_expert_cache: %s", dir, ec.msg);
                cache = expert_cache_create(&m.experts, &m.ck, user, -1, &ec);
                CHECK(cache && expert_cache_slots(cache) == 3 && b.expert_cache_per_worker / b.expert_slot_bytes == 3 &&
                          b.total == total0 - (w ? (uint64_t)w : 1) * (per0 - 3 * b.expert_slot_bytes),
                      "%s: --expert-cache-mb: %zu slots, plan %llu", dir, cache ? expert_cache_slots(cache) : 0,
                      (unsigned long long)(b.expert_cache_per_worker / b.expert_slot_bytes));
                expert_cache_free(cache);
                CHECK(plan_set_expert_cache(&b, b.expert_slot_bytes - 1, &ec) == -1 && strstr(ec.msg, "below one expert slot"),
                      "%s: a cache below one slot must be refused", dir);
            }
            if (!ra) plan_free(&a);
            if (!rb) plan_free(&b);
        }
    model_free(&m);
}

int main(void) {
    test_tables();
    test_model("tests/models/m13");
    test_model("tests/models/m14b12");
    return check_report("test_layer_schema");
}
