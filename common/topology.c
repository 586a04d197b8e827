/* topology.c - NUMA nodes from sys/ and proc/ under a root, and the placement rule (see topology.h). */
#include "common/topology.h"
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- cpu sets ---- */

void topo_cpuset_clear(topo_cpuset *s) { memset(s, 0, sizeof *s); }

void topo_cpuset_add(topo_cpuset *s, int cpu) {
    if (cpu >= 0 && cpu < TOPO_MAX_CPUS) s->bits[cpu / 64] |= (uint64_t)1 << (cpu % 64);
}

int topo_cpuset_has(const topo_cpuset *s, int cpu) {
    return cpu >= 0 && cpu < TOPO_MAX_CPUS && (s->bits[cpu / 64] >> (cpu % 64) & 1);
}

int topo_cpuset_count(const topo_cpuset *s) {
    int n = 0;
    for (int i = 0; i < TOPO_MAX_CPUS / 64; i++) n += __builtin_popcountll(s->bits[i]);
    return n;
}

int topo_cpuset_nth(const topo_cpuset *s, int n) {
    for (int c = 0; c < TOPO_MAX_CPUS; c++)
        if (topo_cpuset_has(s, c) && n-- == 0) return c;
    return -1;
}

static void cpuset_and(topo_cpuset *a, const topo_cpuset *b) {
    for (int i = 0; i < TOPO_MAX_CPUS / 64; i++) a->bits[i] &= b->bits[i];
}

static void cpuset_or(topo_cpuset *a, const topo_cpuset *b) {
    for (int i = 0; i < TOPO_MAX_CPUS / 64; i++) a->bits[i] |= b->bits[i];
}

static int read_num(const char **p, long *v) {
    if (!isdigit((unsigned char)**p)) return -1;
    char *end;
    errno = 0;
    *v = strtol(*p, &end, 10);
    if (errno || *v < 0 || *v >= TOPO_MAX_CPUS) return -1;
    *p = end;
    return 0;
}

int topo_cpuset_parse(const char *s, topo_cpuset *out) {
    topo_cpuset_clear(out);
    const char *p = s;
    while (*p == ' ' || *p == '\t') p++;
    if (*p == '\n' || *p == 0) return 0;
    for (;;) {
        long a, b;
        if (read_num(&p, &a)) return -1;
        b = a;
        if (*p == '-') {
            p++;
            if (read_num(&p, &b) || b < a) return -1;
        }
        for (long c = a; c <= b; c++) topo_cpuset_add(out, (int)c);
        if (*p == ',') { p++; continue; }
        while (*p == ' ' || *p == '\t' || *p == '\n') p++;
        return *p ? -1 : 0;
    }
}

char *topo_cpuset_format(const topo_cpuset *s, char *buf, size_t len) {
    size_t at = 0;
    if (len) buf[0] = 0;
    for (int c = 0; c < TOPO_MAX_CPUS; c++) {
        if (!topo_cpuset_has(s, c)) continue;
        int e = c;
        while (e + 1 < TOPO_MAX_CPUS && topo_cpuset_has(s, e + 1)) e++;
        int n = e > c ? snprintf(buf + at, len > at ? len - at : 0, "%s%d-%d", at ? "," : "", c, e)
                      : snprintf(buf + at, len > at ? len - at : 0, "%s%d", at ? "," : "", c);
        if (n < 0 || (size_t)n >= (len > at ? len - at : 0)) break; /* truncated: keep what fits */
        at += (size_t)n;
        c = e;
    }
    return buf;
}

/* ---- files under the root ---- */

#define FILE_MAX 65536

/* Reads root/rel into buf (NUL-terminated). 1 read, 0 absent, -1 error (in err). */
static int read_file(const char *root, const char *rel, char *buf, size_t cap, k3_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT || errno == ENOTDIR) return 0;
        return k3_fail(err, "cannot read %s: %s", path, strerror(errno));
    }
    size_t n = fread(buf, 1, cap - 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad) return k3_fail(err, "cannot read %s", path);
    buf[n] = 0;
    return 1;
}

/* A cpu/node list file; absent -> *present = 0. */
static int read_list(const char *root, const char *rel, char *buf, topo_cpuset *s, int *present, k3_error *err) {
    int r = read_file(root, rel, buf, FILE_MAX, err);
    if (r < 0) return -1;
    *present = r;
    if (!r) return 0;
    if (topo_cpuset_parse(buf, s)) return k3_fail(err, "%s/%s: malformed list '%.60s'", root, rel, buf);
    return 0;
}

/* "Key:\tlist" line of proc/self/status. */
static int status_list(const char *status, const char *key, topo_cpuset *s, int *present) {
    size_t kl = strlen(key);
    *present = 0;
    for (const char *p = status; p && *p;) {
        if (!strncmp(p, key, kl) && p[kl] == ':') {
            char line[FILE_MAX / 4];
            const char *v = p + kl + 1, *e = strchr(v, '\n');
            size_t n = e ? (size_t)(e - v) : strlen(v);
            if (n >= sizeof line) return -1;
            memcpy(line, v, n);
            line[n] = 0;
            *present = 1;
            return topo_cpuset_parse(line, s);
        }
        p = strchr(p, '\n');
        if (p) p++;
    }
    return 0;
}

/* The cgroup cpuset's effective cpus and mems (v2, else v1), if any. */
static int read_cgroup(const char *root, char *buf, topo_cpuset *cpus, int *has_cpus, topo_cpuset *mems, int *has_mems,
                       k3_error *err) {
    *has_cpus = *has_mems = 0;
    int r = read_file(root, "proc/self/cgroup", buf, FILE_MAX, err);
    if (r <= 0) return r;
    char v2[2048] = "", v1[2048] = "";
    int have_v2 = 0, have_v1 = 0;
    char *save = NULL;
    for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c1 = 0;
        *c2 = 0;
        const char *ctrl = c1 + 1, *path = c2 + 1;
        if (!strcmp(line, "0") && !*ctrl) { snprintf(v2, sizeof v2, "%s", path); have_v2 = 1; }
        for (char *t = (char *)ctrl; t && *t;) {
            char *comma = strchr(t, ',');
            size_t n = comma ? (size_t)(comma - t) : strlen(t);
            if (n == 6 && !strncmp(t, "cpuset", 6)) { snprintf(v1, sizeof v1, "%s", path); have_v1 = 1; }
            t = comma ? comma + 1 : NULL;
        }
    }
    char rel[4200];
    char *tmp = malloc(FILE_MAX);
    if (!tmp) return k3_fail(err, "out of memory");
    int rc = 0;
    if (have_v1) {
        snprintf(rel, sizeof rel, "sys/fs/cgroup/cpuset%s/cpuset.effective_cpus", v1);
        rc = read_list(root, rel, tmp, cpus, has_cpus, err);
        snprintf(rel, sizeof rel, "sys/fs/cgroup/cpuset%s/cpuset.effective_mems", v1);
        if (!rc) rc = read_list(root, rel, tmp, mems, has_mems, err);
    } else if (have_v2) {
        /* the effective files of the process's own cgroup (absent when the cpuset controller is off there) */
        snprintf(rel, sizeof rel, "sys/fs/cgroup%s/cpuset.cpus.effective", strcmp(v2, "/") ? v2 : "");
        rc = read_list(root, rel, tmp, cpus, has_cpus, err);
        snprintf(rel, sizeof rel, "sys/fs/cgroup%s/cpuset.mems.effective", strcmp(v2, "/") ? v2 : "");
        if (!rc) rc = read_list(root, rel, tmp, mems, has_mems, err);
    }
    /* an empty effective list means "not restricted here" on some kernels */
    if (*has_cpus && topo_cpuset_count(cpus) == 0) *has_cpus = 0;
    if (*has_mems && topo_cpuset_count(mems) == 0) *has_mems = 0;
    free(tmp);
    return rc;
}

/* "... MemTotal:   123 kB" -> bytes; 0 when absent. */
static uint64_t meminfo_field(const char *text, const char *key) {
    const char *p = strstr(text, key);
    if (!p) return 0;
    p += strlen(key);
    while (*p == ':' || *p == ' ' || *p == '\t') p++;
    unsigned long long kb = strtoull(p, NULL, 10);
    return (uint64_t)kb * 1024;
}

void topology_free(k3_topology *t) {
    free(t->nodes);
    free(t->distance);
    memset(t, 0, sizeof *t);
}

int topology_read(const char *root, k3_topology *t, k3_error *err) {
    memset(t, 0, sizeof *t);
    if (!root || !*root) root = "/";
    char *buf = malloc(FILE_MAX);
    topo_cpuset *sets = malloc(5 * sizeof *sets);
    if (!buf || !sets) { free(buf); free(sets); return k3_fail(err, "out of memory"); }
    topo_cpuset *online = &sets[0], *allowed = &sets[1], *mems_allowed = &sets[2], *cg_cpus = &sets[3], *cg_mems = &sets[4];
    int rc = -1, present, has_allowed = 0, has_mems = 0, has_cg_cpus, has_cg_mems;
    /* the process: affinity and allowed nodes */
    int r = read_file(root, "proc/self/status", buf, FILE_MAX, err);
    if (r < 0) goto out;
    if (r == 1 && (status_list(buf, "Cpus_allowed_list", allowed, &has_allowed) ||
                   status_list(buf, "Mems_allowed_list", mems_allowed, &has_mems))) {
        k3_fail(err, "%s/proc/self/status: malformed Cpus_allowed_list or Mems_allowed_list", root);
        goto out;
    }
    if (read_cgroup(root, buf, cg_cpus, &has_cg_cpus, cg_mems, &has_cg_mems, err)) goto out;
    /* the nodes */
    if (read_list(root, "sys/devices/system/node/online", buf, online, &present, err)) goto out;
    t->numa_sysfs = present;
    if (!present) { /* no NUMA in this kernel: one node */
        topo_cpuset_clear(online);
        topo_cpuset_add(online, 0);
    }
    int n = topo_cpuset_count(online);
    if (n < 1 || n > TOPO_MAX_NODES) { k3_fail(err, "%s/sys/devices/system/node/online lists %d nodes", root, n); goto out; }
    t->n_nodes = n;
    t->nodes = calloc((size_t)n, sizeof *t->nodes);
    t->distance = malloc((size_t)n * (size_t)n * sizeof *t->distance);
    if (!t->nodes || !t->distance) { k3_fail(err, "out of memory"); goto out; }
    for (int i = 0; i < n; i++) {
        topo_node *nd = &t->nodes[i];
        nd->id = topo_cpuset_nth(online, i);
        char rel[256];
        if (t->numa_sysfs) {
            snprintf(rel, sizeof rel, "sys/devices/system/node/node%d/cpulist", nd->id);
            if (read_list(root, rel, buf, &nd->cpus, &present, err)) goto out;
            snprintf(rel, sizeof rel, "sys/devices/system/node/node%d/meminfo", nd->id);
            r = read_file(root, rel, buf, FILE_MAX, err);
            if (r < 0) goto out;
            nd->mem_total = r ? meminfo_field(buf, "MemTotal") : 0;
            nd->mem_free = r ? meminfo_field(buf, "MemFree") : 0;
        } else {
            if (read_list(root, "sys/devices/system/cpu/online", buf, &nd->cpus, &present, err)) goto out;
            if (!present) {
                if (!has_allowed) { k3_fail(err, "%s: no node, cpu or affinity information", root); goto out; }
                nd->cpus = *allowed;
            }
            r = read_file(root, "proc/meminfo", buf, FILE_MAX, err);
            if (r < 0) goto out;
            nd->mem_total = r ? meminfo_field(buf, "MemTotal") : 0;
            nd->mem_free = r ? meminfo_field(buf, "MemFree") : 0;
        }
        nd->n_cpus_online = topo_cpuset_count(&nd->cpus);
        if (has_allowed) cpuset_and(&nd->cpus, allowed);
        if (has_cg_cpus) cpuset_and(&nd->cpus, cg_cpus);
        nd->n_cpus = topo_cpuset_count(&nd->cpus);
        nd->memoryless = nd->mem_total == 0;
        nd->mem_usable = !nd->memoryless && (!has_mems || topo_cpuset_has(mems_allowed, nd->id)) &&
                         (!has_cg_mems || topo_cpuset_has(cg_mems, nd->id));
        t->n_cpus += nd->n_cpus;
        /* distances: a row of n numbers in node order; defaults 10 local, 20 remote */
        for (int j = 0; j < n; j++) t->distance[i * n + j] = i == j ? 10 : 20;
        if (t->numa_sysfs) {
            snprintf(rel, sizeof rel, "sys/devices/system/node/node%d/distance", nd->id);
            r = read_file(root, rel, buf, FILE_MAX, err);
            if (r < 0) goto out;
            const char *p = buf;
            for (int j = 0; r && j < n; j++) {
                char *end;
                long d = strtol(p, &end, 10);
                if (end == p || d < 0) { k3_fail(err, "%s/%s: malformed distance row", root, rel); goto out; }
                t->distance[i * n + j] = (int)d;
                p = end;
            }
        }
    }
    rc = 0;
out:
    free(buf);
    free(sets);
    if (rc) topology_free(t);
    return rc;
}

void topology_print(const k3_topology *t, FILE *f, const char *prefix) {
    char list[256];
    fprintf(f, "%stopology: %d node%s, %d usable cpu%s%s\n", prefix, t->n_nodes, t->n_nodes == 1 ? "" : "s", t->n_cpus,
            t->n_cpus == 1 ? "" : "s", t->numa_sysfs ? "" : " (no NUMA in this kernel)");
    for (int i = 0; i < t->n_nodes; i++) {
        const topo_node *nd = &t->nodes[i];
        fprintf(f, "%s  node %d: cpus %s (%d of %d usable), memory %.2f GiB (%.2f free)%s%s\n", prefix, nd->id,
                nd->n_cpus ? topo_cpuset_format(&nd->cpus, list, sizeof list) : "-", nd->n_cpus, nd->n_cpus_online,
                nd->mem_total / 1073741824.0, nd->mem_free / 1073741824.0, nd->memoryless ? ", memoryless" : "",
                !nd->memoryless && !nd->mem_usable ? ", memory not allowed (cpuset)" : "");
    }
}

/* ---- placement ---- */

void placement_free(placement *pl) {
    free(pl->coord);
    free(pl->server);
    free(pl->server_domain);
    memset(pl, 0, sizeof *pl);
}

/* Splits total into n shares in proportion to weight[] (largest remainder, ties to the
 * lower index). weight[] is used as scratch: it holds -1 for indices that took a remainder. */
static void proportional(int total, int *weight, int n, int *share) {
    long wsum = 0;
    for (int i = 0; i < n; i++) wsum += weight[i];
    int given = 0;
    for (int i = 0; i < n; i++) {
        share[i] = wsum ? (int)((long)total * weight[i] / wsum) : 0;
        given += share[i];
    }
    while (given < total) {
        int best = -1;
        long best_rem = -1;
        for (int i = 0; i < n; i++) {
            long rem = weight[i] < 0 ? -1 : wsum ? (long)total * weight[i] % wsum : 0;
            if (weight[i] >= 0 && rem > best_rem) { best_rem = rem; best = i; }
        }
        if (best < 0) /* every remainder used (total > wsum happens only with wsum 0): round robin */
            for (int i = 0; i < n && given < total; i++) { share[i]++; given++; }
        else { share[best]++; given++; weight[best] = -1; }
    }
}

int placement_make(const k3_topology *t, const placement_request *rq, placement *pl, k3_error *err) {
    memset(pl, 0, sizeof *pl);
    if (rq->workers_per_node < 1) return k3_fail(err, "workers per node must be at least 1");
    int n = t->n_nodes, nd = 0;
    int *dom_node = malloc((size_t)(n + 1) * sizeof *dom_node); /* domain -> node index */
    int *w = malloc((size_t)(n + 1) * sizeof *w), *share = malloc((size_t)(n + 1) * sizeof *share);
    topo_cpuset *dcpus = calloc((size_t)n + 1, sizeof *dcpus);
    int rc = -1;
    if (!dom_node || !w || !share || !dcpus) { k3_fail(err, "out of memory"); goto out; }
    if (rq->numa) {
        for (int i = 0; i < n; i++)
            if (t->nodes[i].mem_usable && t->nodes[i].n_cpus > 0) {
                dcpus[nd] = t->nodes[i].cpus;
                dom_node[nd++] = i;
            }
        /* cpus of nodes without usable memory join the nearest domain */
        for (int i = 0; nd > 0 && i < n; i++) {
            if (t->nodes[i].n_cpus == 0 || (t->nodes[i].mem_usable)) continue;
            int best = 0;
            for (int d = 1; d < nd; d++)
                if (t->distance[i * n + dom_node[d]] < t->distance[i * n + dom_node[best]]) best = d;
            cpuset_or(&dcpus[best], &t->nodes[i].cpus);
        }
    }
    if (nd <= 1) { /* one domain or numa off: nothing bound, every usable cpu */
        topo_cpuset_clear(&dcpus[0]);
        for (int i = 0; i < n; i++) cpuset_or(&dcpus[0], &t->nodes[i].cpus);
        dom_node[0] = -1;
        pl->bound = 0;
        nd = 1;
    } else pl->bound = 1;
    if (topo_cpuset_count(&dcpus[0]) == 0) { k3_fail(err, "no usable cpu (affinity mask and cpuset leave none)"); goto out; }
    pl->n_domains = nd;
    pl->coord = calloc((size_t)nd, sizeof *pl->coord);
    int ns = rq->workers < 0 ? nd * rq->workers_per_node : rq->workers;
    pl->n_servers = ns;
    pl->server = calloc((size_t)ns + 1, sizeof *pl->server);
    pl->server_domain = calloc((size_t)ns + 1, sizeof *pl->server_domain);
    if (!pl->coord || !pl->server || !pl->server_domain) { k3_fail(err, "out of memory"); goto out; }
    int total_cpus = 0;
    for (int d = 0; d < nd; d++) {
        place_group *g = &pl->coord[d];
        g->node = dom_node[d] >= 0 ? t->nodes[dom_node[d]].id : -1;
        g->cpus = dcpus[d];
        g->n_cpus = topo_cpuset_count(&dcpus[d]);
        total_cpus += g->n_cpus;
        w[d] = g->n_cpus;
    }
    /* coordinator threads */
    int T = rq->threads > 0 ? rq->threads : total_cpus;
    proportional(T, w, nd, share);
    for (int d = 0; d < nd; d++) {
        pl->coord[d].threads = share[d];
        if (share[d] > pl->coord[d].n_cpus) pl->oversubscribed = 1;
    }
    pl->coord_threads = T;
    /* servers: i -> domain (default layout: workers_per_node consecutive per domain) */
    int *per = share; /* servers per domain */
    for (int d = 0; d < nd; d++) per[d] = 0;
    for (int i = 0; i < ns; i++) {
        int d = rq->workers < 0 ? i / rq->workers_per_node : i % nd;
        pl->server_domain[i] = d;
        per[d]++;
    }
    int *seen = w; /* index of a server among its domain's servers */
    for (int d = 0; d < nd; d++) seen[d] = 0;
    for (int i = 0; i < ns; i++) {
        int d = pl->server_domain[i], j = seen[d]++, s = per[d], c = pl->coord[d].n_cpus;
        place_group *g = &pl->server[i];
        g->node = pl->coord[d].node;
        topo_cpuset_clear(&g->cpus);
        if (s <= c)
            for (int k = j * c / s; k < (j + 1) * c / s; k++) topo_cpuset_add(&g->cpus, topo_cpuset_nth(&dcpus[d], k));
        else topo_cpuset_add(&g->cpus, topo_cpuset_nth(&dcpus[d], j % c));
        if (!pl->bound) g->cpus = dcpus[d]; /* unbound: threads may run anywhere */
        g->n_cpus = topo_cpuset_count(&g->cpus);
        int share_cpus = s <= c ? (j + 1) * c / s - j * c / s : 1;
        g->threads = rq->worker_threads > 0 ? rq->worker_threads : share_cpus;
    }
    /* does any domain's server threads exceed its cpus? */
    for (int d = 0; d < nd; d++) {
        int sum = 0;
        for (int i = 0; i < ns; i++)
            if (pl->server_domain[i] == d) sum += pl->server[i].threads;
        if (sum > pl->coord[d].n_cpus) pl->oversubscribed = 1;
    }
    rc = 0;
out:
    free(dom_node);
    free(w);
    free(share);
    free(dcpus);
    if (rc) placement_free(pl);
    return rc;
}

int placement_thread_domain(const placement *pl, int thread) {
    int at = 0;
    for (int d = 0; d < pl->n_domains; d++) {
        at += pl->coord[d].threads;
        if (thread < at) return d;
    }
    return pl->n_domains - 1;
}

/* First block of thread i of T over nblk blocks, OpenMP schedule(static) without chunk (libgomp's split). */
static size_t static_start(size_t nblk, size_t T, size_t i) {
    size_t q = nblk / T, r = nblk % T;
    return i < r ? i * (q + 1) : i * q + r;
}

void placement_rows(const placement *pl, int d, size_t rows, size_t block, size_t *r0, size_t *r1) {
    size_t T = pl->coord_threads > 0 ? (size_t)pl->coord_threads : 1, nblk = block ? (rows + block - 1) / block : 0;
    size_t t0 = 0;
    for (int i = 0; i < d; i++) t0 += (size_t)pl->coord[i].threads;
    size_t t1 = t0 + (size_t)pl->coord[d].threads;
    if (t1 > T) t1 = T;
    if (t0 > T) t0 = T;
    size_t b0 = static_start(nblk, T, t0), b1 = t1 >= T ? nblk : static_start(nblk, T, t1);
    *r0 = b0 * block < rows ? b0 * block : rows;
    *r1 = b1 * block < rows ? b1 * block : rows;
}
