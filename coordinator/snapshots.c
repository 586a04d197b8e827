/* snapshots.c - prefix snapshots in memory and on disk (contract: snapshots.h). */
#define _GNU_SOURCE
#include "coordinator/snapshots.h"
#include "common/hash64.h"
#include <dirent.h>
#include <fcntl.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    int32_t *ids;
    size_t n;
    uint64_t hash, bytes, last_use;
    float *data;  /* every KDA layer's S then conv, then every MLA layer's n rows */
} mem_entry;

typedef struct {
    char *name;
    uint64_t hash, size;
    size_t n;
    struct timespec mtime;
} disk_entry;

struct snap_store {
    snap_options opt;
    char *dir;
    mem_entry *mem;
    size_t n_mem, cap_mem;
    disk_entry *disk;
    size_t n_disk, cap_disk;
    uint64_t clock, seed;
    snap_stats st;
};

static size_t kda_s(const k3_config *c) { return (size_t)c->kda_num_heads * c->kda_head_dim * c->kda_head_dim; }
static size_t kda_conv(const k3_config *c) {
    return 3 * (size_t)(c->short_conv_kernel_size - 1) * c->kda_num_heads * c->kda_head_dim;
}
static size_t mla_row(const k3_config *c) { return (size_t)c->kv_lora_rank + c->qk_rope_head_dim; }

/* Keyed by the model: the same prompt on another model gets another file name. */
static uint64_t ids_hash(const snap_store *s, const int32_t *ids, size_t n) { return hash64(ids, n * sizeof *ids, s->seed); }

static int ts_before(struct timespec a, struct timespec b) {
    return a.tv_sec < b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec < b.tv_nsec);
}

static char *disk_path(const snap_store *s, const char *name) {
    size_t n = strlen(s->dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", s->dir, name);
    return p;
}

/* Lists file `name` (hash h, n positions, as stat'ed in sb) among the store's files. */
static int disk_add(snap_store *s, const char *name, uint64_t h, size_t n, const struct stat *sb, k3_error *err) {
    if (s->n_disk == s->cap_disk) {
        size_t nc = s->cap_disk ? 2 * s->cap_disk : 16;
        disk_entry *nd = realloc(s->disk, nc * sizeof *nd);
        if (!nd) return k3_fail(err, "out of memory");
        s->disk = nd;
        s->cap_disk = nc;
    }
    disk_entry *e = &s->disk[s->n_disk];
    if (!(e->name = strdup(name))) return k3_fail(err, "out of memory");
    e->hash = h;
    e->n = n;
    e->size = (uint64_t)sb->st_size;
    e->mtime = sb->st_mtim;
    s->n_disk++;
    s->st.disk_bytes += e->size;
    s->st.disk_files = s->n_disk;
    return 0;
}

static int scan_dir(snap_store *s, k3_error *err) {
    if (mkdir(s->dir, 0700) != 0 && errno != EEXIST) return k3_fail(err, "cannot create --state-dir %s: %s", s->dir, strerror(errno));
    DIR *d = opendir(s->dir);
    if (!d) return k3_fail(err, "cannot open --state-dir %s: %s", s->dir, strerror(errno));
    struct dirent *de;
    while ((de = readdir(d))) {
        unsigned long long h;
        size_t n;
        char tail[16];
        if (sscanf(de->d_name, "%16llx-%zu.%15s", &h, &n, tail) != 3 || strcmp(tail, "k3snap") != 0) continue;
        char *p = disk_path(s, de->d_name);
        struct stat sb;
        if (!p || stat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) { free(p); continue; }
        free(p);
        if (disk_add(s, de->d_name, (uint64_t)h, n, &sb, err)) {
            closedir(d);
            return -1;
        }
    }
    closedir(d);
    s->st.disk_files = s->n_disk;
    return 0;
}

int snap_store_open(snap_store **out, const snap_options *opt, k3_error *err) {
    *out = NULL;
    snap_store *s = calloc(1, sizeof *s);
    if (!s) return k3_fail(err, "out of memory");
    s->opt = *opt;
    s->seed = hash64(opt->fp, sizeof *opt->fp, 0x6b33736e6170ull);
    if (opt->dir) {
        if (!(s->dir = strdup(opt->dir))) { free(s); return k3_fail(err, "out of memory"); }
        s->opt.dir = s->dir;
        if (scan_dir(s, err)) { snap_store_free(s); return -1; }
    }
    *out = s;
    return 0;
}

static void mem_drop(snap_store *s, size_t i) {
    s->st.mem_bytes -= s->mem[i].bytes;
    free(s->mem[i].ids);
    free(s->mem[i].data);
    s->mem[i] = s->mem[--s->n_mem];
    s->st.mem_entries = s->n_mem;
}

static void disk_drop(snap_store *s, size_t i, int unlink_it) {
    if (unlink_it) {
        char *p = disk_path(s, s->disk[i].name);
        if (p) unlink(p);
        free(p);
    }
    s->st.disk_bytes -= s->disk[i].size;
    free(s->disk[i].name);
    s->disk[i] = s->disk[--s->n_disk];
    s->st.disk_files = s->n_disk;
}

void snap_store_free(snap_store *s) {
    if (!s) return;
    while (s->n_mem) mem_drop(s, 0);
    while (s->n_disk) disk_drop(s, 0, 0);
    free(s->mem);
    free(s->disk);
    free(s->dir);
    free(s);
}

snap_stats snap_get_stats(const snap_store *s) { return s->st; }

static int restore_mem(snap_store *s, mem_entry *e, seq_state *st, k3_error *err) {
    const k3_config *c = s->opt.cfg;
    if (seq_state_reserve(st, c, e->n, err)) return -1;
    const float *p = e->data;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (c->layer_is_mla[l]) continue;
        memcpy(st->kda[l].S, p, kda_s(c) * 4);
        p += kda_s(c);
        memcpy(st->kda[l].conv, p, kda_conv(c) * 4);
        p += kda_conv(c);
    }
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (!c->layer_is_mla[l]) continue;
        memcpy(st->mla[l].cache, p, e->n * mla_row(c) * 4);
        p += e->n * mla_row(c);
    }
    st->pos = e->n;
    e->last_use = ++s->clock;
    return 0;
}

/* Copies st into the memory tier (evicting LRU entries); 0 also when it does not fit. */
static int mem_put(snap_store *s, const int32_t *ids, uint64_t h, const seq_state *st, k3_error *err) {
    const k3_config *c = s->opt.cfg;
    size_t n = st->pos;
    for (size_t i = 0; i < s->n_mem; i++)
        if (s->mem[i].n == n && s->mem[i].hash == h && !memcmp(s->mem[i].ids, ids, n * 4)) {
            s->mem[i].last_use = ++s->clock;
            return 0;
        }
    uint64_t bytes = state_bytes_at(c, n) + n * 4;
    if (bytes > s->opt.mem_cap) return 0;
    while (s->st.mem_bytes + bytes > s->opt.mem_cap && s->n_mem) {
        size_t lru = 0;
        for (size_t i = 1; i < s->n_mem; i++)
            if (s->mem[i].last_use < s->mem[lru].last_use) lru = i;
        mem_drop(s, lru);
        s->st.evictions++;
    }
    if (s->n_mem == s->cap_mem) {
        size_t nc = s->cap_mem ? 2 * s->cap_mem : 8;
        mem_entry *nm = realloc(s->mem, nc * sizeof *nm);
        if (!nm) return k3_fail(err, "out of memory for a snapshot");
        s->mem = nm;
        s->cap_mem = nc;
    }
    mem_entry e = {.n = n, .hash = h, .bytes = bytes, .last_use = ++s->clock};
    e.ids = malloc((n ? n : 1) * 4);
    e.data = malloc(state_bytes_at(c, n) ? state_bytes_at(c, n) : 1);
    if (!e.ids || !e.data) {
        free(e.ids);
        free(e.data);
        return k3_fail(err, "out of memory for a snapshot of %zu positions", n);
    }
    memcpy(e.ids, ids, n * 4);
    float *p = e.data;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (c->layer_is_mla[l]) continue;
        memcpy(p, st->kda[l].S, kda_s(c) * 4);
        p += kda_s(c);
        memcpy(p, st->kda[l].conv, kda_conv(c) * 4);
        p += kda_conv(c);
    }
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (!c->layer_is_mla[l]) continue;
        memcpy(p, st->mla[l].cache, n * mla_row(c) * 4);
        p += n * mla_row(c);
    }
    s->mem[s->n_mem++] = e;
    s->st.mem_bytes += bytes;
    s->st.mem_entries = s->n_mem;
    return 0;
}

/* Tries disk entry i for the prefix; 1 restored, 0 refused/mismatch (entry dropped), -1 error. */
static int try_disk(snap_store *s, size_t i, const int32_t *ids, seq_state *st, k3_error *err) {
    const k3_config *c = s->opt.cfg;
    char *p = disk_path(s, s->disk[i].name);
    if (!p) return k3_fail(err, "out of memory");
    seq_state tmp;
    if (seq_state_init(&tmp, c, err)) { free(p); return -1; }
    state_loaded ld;
    k3_error lerr = {0};
    int rc = state_file_load(p, s->opt.fp, c, s->opt.max_positions, &tmp, &ld, &lerr);
    if (rc == 0 && (ld.n_ids != s->disk[i].n || tmp.pos != ld.n_ids || memcmp(ld.ids, ids, ld.n_ids * 4) != 0)) {
        k3_fail(&lerr, "%s: its history is not the one its name promises", p);
        rc = -1;
    }
    if (rc) {
        if (s->opt.log) fprintf(s->opt.log, "k3: snapshot refused and removed: %s\n", lerr.msg);
        s->st.refused++;
        disk_drop(s, i, 1);
        seq_state_free(&tmp);
        free(p);
        return 0;
    }
    state_loaded_free(&ld);
    seq_state old = *st;
    *st = tmp;
    seq_state_free(&old);
    /* LRU by file: a hit refreshes the mtime */
    if (utimensat(AT_FDCWD, p, NULL, 0) == 0) clock_gettime(CLOCK_REALTIME, &s->disk[i].mtime);
    free(p);
    return 1;
}

long snap_lookup(snap_store *s, const int32_t *ids, size_t n, size_t max_len, seq_state *st, k3_error *err) {
    if (max_len > n) max_len = n;
    long best = -1;
    for (size_t i = 0; i < s->n_mem; i++) {
        mem_entry *e = &s->mem[i];
        if (e->n == 0 || e->n > max_len || (best >= 0 && e->n <= s->mem[best].n)) continue;
        if (!memcmp(e->ids, ids, e->n * 4)) best = (long)i;
    }
    size_t have = best >= 0 ? s->mem[best].n : 0;
    /* disk: longer candidates than the memory hit, longest first */
    for (;;) {
        long cand = -1;
        for (size_t i = 0; i < s->n_disk; i++) {
            disk_entry *d = &s->disk[i];
            if (d->n <= have || d->n > max_len || (cand >= 0 && d->n <= s->disk[cand].n)) continue;
            if (d->hash == ids_hash(s, ids, d->n)) cand = (long)i;
        }
        if (cand < 0) break;
        int rc = try_disk(s, (size_t)cand, ids, st, err);
        if (rc < 0) return -1;
        if (rc == 1) {
            s->st.hits_disk++;
            if (mem_put(s, ids, ids_hash(s, ids, st->pos), st, err)) return -1;
            return (long)st->pos;
        }
    }
    if (best >= 0) {
        if (restore_mem(s, &s->mem[best], st, err)) return -1;
        s->st.hits_mem++;
        return (long)st->pos;
    }
    s->st.misses++;
    return 0;
}

static int disk_put(snap_store *s, const int32_t *ids, uint64_t h, const seq_state *st, k3_error *err) {
    size_t n = st->pos;
    for (size_t i = 0; i < s->n_disk; i++)
        if (s->disk[i].n == n && s->disk[i].hash == h) return 0;
    char name[64];
    snprintf(name, sizeof name, "%016llx-%zu.k3snap", (unsigned long long)h, n);
    char *p = disk_path(s, name);
    if (!p) return k3_fail(err, "out of memory");
    state_run run = {.kind = STATE_KIND_SNAPSHOT};
    sampler_config_default(&run.sampling);
    if (state_file_save(p, s->opt.fp, s->opt.cfg, ids, n, st, &run, err)) { free(p); return -1; }
    struct stat sb;
    if (stat(p, &sb) != 0) {
        k3_fail(err, "cannot stat %s", p);
        free(p);
        return -1;
    }
    free(p);
    if (disk_add(s, name, h, n, &sb, err)) return -1;
    while (s->st.disk_bytes > s->opt.disk_cap && s->n_disk) {
        size_t lru = 0;
        for (size_t i = 1; i < s->n_disk; i++)
            if (ts_before(s->disk[i].mtime, s->disk[lru].mtime)) lru = i;
        disk_drop(s, lru, 1);
        s->st.evictions++;
    }
    return 0;
}

int snap_insert(snap_store *s, const int32_t *ids, const seq_state *st, k3_error *err) {
    (void)err;
    if (st->pos == 0) return 0;
    uint64_t h = ids_hash(s, ids, st->pos);
    s->st.inserts++;
    /* best effort: a snapshot that cannot be kept (memory, a full disk) costs speed, not the run */
    k3_error e1 = {0}, e2 = {0};
    if (mem_put(s, ids, h, st, &e1) && s->opt.log) fprintf(s->opt.log, "k3: snapshot not kept in memory: %s\n", e1.msg);
    if (s->dir && disk_put(s, ids, h, st, &e2) && s->opt.log) fprintf(s->opt.log, "k3: snapshot not written: %s\n", e2.msg);
    return 0;
}
