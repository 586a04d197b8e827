/* numa_place.c - coordinator threads and trunk rows on every node (see numa_place.h). */
#define _GNU_SOURCE
#include "coordinator/numa_place.h"
#include "common/kernels_impl.h" /* K3_ROWBLOCK: the kernels' row block */
#include <errno.h>
#include <numaif.h>
#include <omp.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int numa_place_init(numa_place *np, const placement *pl, k3_error *err) {
    memset(np, 0, sizeof *np);
    np->pl = pl;
    if (!pl) return 0;
    np->pinned_bytes = calloc((size_t)pl->n_domains, sizeof *np->pinned_bytes);
    return np->pinned_bytes ? 0 : k3_fail(err, "out of memory");
}

void numa_place_free(numa_place *np) {
    free(np->pinned_bytes);
    memset(np, 0, sizeof *np);
}

int numa_place_threads(const placement *pl, k3_error *err) {
    if (!pl || !pl->bound) return 0;
    cpu_set_t *masks[64];
    size_t sz = CPU_ALLOC_SIZE(TOPO_MAX_CPUS);
    int nd = pl->n_domains < 64 ? pl->n_domains : 64, failed = 0;
    for (int d = 0; d < nd; d++) {
        if (!(masks[d] = CPU_ALLOC(TOPO_MAX_CPUS))) {
            for (int e = 0; e < d; e++) CPU_FREE(masks[e]);
            return k3_fail(err, "out of memory");
        }
        CPU_ZERO_S(sz, masks[d]);
        for (int c = 0; c < TOPO_MAX_CPUS; c++)
            if (topo_cpuset_has(&pl->coord[d].cpus, c)) CPU_SET_S(c, sz, masks[d]);
    }
#pragma omp parallel num_threads(pl->coord_threads) reduction(+ : failed)
    {
        int d = placement_thread_domain(pl, omp_get_thread_num());
        if (d >= nd) d = nd - 1;
        if (sched_setaffinity(0, sz, masks[d]) != 0) failed++;
    }
    for (int d = 0; d < nd; d++) CPU_FREE(masks[d]);
    return failed ? k3_fail(err, "cannot bind %d coordinator thread(s) to their nodes: %s", failed, strerror(errno)) : 0;
}

void numa_place_rows(void *ctx, uint8_t *data, size_t rows, size_t row_bytes, int refill) {
    numa_place *np = ctx;
    const placement *pl = np->pl;
    if (!pl || !pl->bound || !rows || !row_bytes) return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    if (refill) np->slot_fills++;
    for (int d = 0; d < pl->n_domains; d++) {
        size_t r0, r1;
        placement_rows(pl, d, rows, K3_ROWBLOCK, &r0, &r1);
        if (r1 <= r0 || pl->coord[d].node < 0) continue;
        /* whole pages of this domain's rows; a page shared with a neighbour stays where it is */
        uintptr_t a = ((uintptr_t)(data + r0 * row_bytes) + page - 1) / page * page;
        uintptr_t b = (uintptr_t)(data + r1 * row_bytes) / page * page;
        if (!refill && np->pinned_bytes) np->pinned_bytes[d] += (uint64_t)(r1 - r0) * row_bytes;
        if (b <= a) continue;
        /* a refilled slot: drop the old pages so the read faults new ones in on this node */
        if (refill) madvise((void *)a, b - a, MADV_DONTNEED);
        unsigned long mask[TOPO_MAX_NODES / (8 * sizeof(unsigned long))] = {0};
        int node = pl->coord[d].node;
        mask[node / (8 * sizeof(unsigned long))] |= 1ul << (node % (8 * sizeof(unsigned long)));
        /* a failure only costs bandwidth, never a bit: ignored */
        (void)mbind((void *)a, b - a, MPOL_PREFERRED, mask, TOPO_MAX_NODES, refill ? 0 : MPOL_MF_MOVE);
    }
}

void numa_place_print_topology(const k3_topology *t, const placement *pl, FILE *f) {
    topology_print(t, f, "k3: ");
    char list[256];
    if (!pl->bound)
        fprintf(f, "k3: placement: unbound (%s); coordinator %d threads, %d server%s\n",
                pl->n_domains == 1 && t->n_nodes > 1 ? "one usable node or --numa off" : "one node", pl->coord_threads,
                pl->n_servers, pl->n_servers == 1 ? "" : "s");
    else
        for (int d = 0; d < pl->n_domains; d++) {
            int ns = 0;
            for (int i = 0; i < pl->n_servers; i++) ns += pl->server_domain[i] == d;
            fprintf(f, "k3: placement: node %d cpus %s: coordinator %d thread%s, %d server%s\n", pl->coord[d].node,
                    topo_cpuset_format(&pl->coord[d].cpus, list, sizeof list), pl->coord[d].threads,
                    pl->coord[d].threads == 1 ? "" : "s", ns, ns == 1 ? "" : "s");
        }
    if (pl->oversubscribed)
        fprintf(f, "k3: placement: the counts asked for put more threads on a node than it has cpus (oversubscribed)\n");
}

void numa_place_print_coordinator(const numa_place *np, uint64_t slot_bytes, int n_slots, FILE *f) {
    const placement *pl = np->pl;
    if (!pl || !pl->bound) return;
    char list[256];
    int first = 0;
    for (int d = 0; d < pl->n_domains; d++) {
        fprintf(f, "k3: coordinator node %d: threads %d-%d on cpus %s, %.2f MiB of pinned trunk rows", pl->coord[d].node, first,
                first + pl->coord[d].threads - 1, topo_cpuset_format(&pl->coord[d].cpus, list, sizeof list),
                np->pinned_bytes[d] / 1048576.0);
        if (n_slots) fprintf(f, ", its rows of each of %d streaming slots (%.1f MiB each)", n_slots, slot_bytes / 1048576.0);
        fputc('\n', f);
        first += pl->coord[d].threads;
    }
}

static json_t *cpus_json(const topo_cpuset *s) {
    char list[4096];
    return json_string(topo_cpuset_format(s, list, sizeof list));
}

json_t *numa_place_topology_json(const k3_topology *t) {
    json_t *j = json_object(), *a = json_array();
    for (int i = 0; i < t->n_nodes; i++) {
        const topo_node *nd = &t->nodes[i];
        json_t *n = json_object();
        json_object_set_new(n, "node", json_integer(nd->id));
        json_object_set_new(n, "cpus", cpus_json(&nd->cpus));
        json_object_set_new(n, "usable_cpus", json_integer(nd->n_cpus));
        json_object_set_new(n, "online_cpus", json_integer(nd->n_cpus_online));
        json_object_set_new(n, "mem_total_bytes", json_integer((json_int_t)nd->mem_total));
        json_object_set_new(n, "mem_free_bytes", json_integer((json_int_t)nd->mem_free));
        json_object_set_new(n, "memoryless", json_boolean(nd->memoryless));
        json_object_set_new(n, "mem_usable", json_boolean(nd->mem_usable));
        json_array_append_new(a, n);
    }
    json_object_set_new(j, "nodes", a);
    json_object_set_new(j, "usable_cpus", json_integer(t->n_cpus));
    json_object_set_new(j, "numa_sysfs", json_boolean(t->numa_sysfs));
    return j;
}

json_t *numa_place_coordinator_json(const numa_place *np, uint64_t slot_bytes, int n_slots) {
    const placement *pl = np->pl;
    json_t *j = json_object(), *a = json_array();
    int first = 0;
    for (int d = 0; pl && d < pl->n_domains; d++) {
        json_t *g = json_object();
        json_object_set_new(g, "node", json_integer(pl->coord[d].node));
        json_object_set_new(g, "cpus", cpus_json(&pl->coord[d].cpus));
        json_object_set_new(g, "threads", json_integer(pl->coord[d].threads));
        json_object_set_new(g, "first_thread", json_integer(first));
        json_object_set_new(g, "trunk_pinned_bytes", json_integer((json_int_t)(np->pinned_bytes ? np->pinned_bytes[d] : 0)));
        first += pl->coord[d].threads;
        json_array_append_new(a, g);
    }
    json_object_set_new(j, "threads", json_integer(pl ? pl->coord_threads : 0));
    json_object_set_new(j, "groups", a);
    json_object_set_new(j, "streaming_slots", json_integer(n_slots));
    json_object_set_new(j, "slot_bytes", json_integer((json_int_t)slot_bytes));
    json_object_set_new(j, "slot_fills_placed", json_integer((json_int_t)np->slot_fills));
    return j;
}

json_t *numa_place_server_json(const placement *pl, int i) {
    json_t *j = json_object();
    json_object_set_new(j, "node", json_integer(pl->server[i].node));
    json_object_set_new(j, "cpus", cpus_json(&pl->server[i].cpus));
    json_object_set_new(j, "threads", json_integer(pl->server[i].threads));
    return j;
}
