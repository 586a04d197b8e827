/* numa_place.h - the coordinator on every node of a placement (common/topology.h).
 *
 * numa_place_threads binds OpenMP thread i (of placement.coord_threads) to the
 * cpus of its domain (threads numbered domain by domain), so the kernels' static
 * row partition gives each domain a contiguous run of every matrix's rows.
 * numa_place_rows, called by the trunk before a matrix's bytes are read into a
 * pinned buffer or a streaming slot, puts each domain's rows of that matrix in
 * the domain's node (mbind MPOL_PREFERRED on the page range; a refilled slot's
 * old pages are dropped first so the read faults them in where they belong).
 * The rows follow the one-token partition (blocks of K3_ROWBLOCK rows: decode, the
 * bandwidth-bound case); the multi-token GEMM tiles rows by 3, which moves a node's
 * boundary by a few rows (a few remote reads in prefill, which is compute-bound).
 * Nothing here changes what is computed: threads split rows only, and every
 * dot product keeps its fixed partition. With an unbound placement (one node,
 * --numa off) both do nothing. */
#ifndef K3_NUMA_PLACE_H
#define K3_NUMA_PLACE_H

#include "common/topology.h"
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
    const placement *pl;
    uint64_t *pinned_bytes;  /* [n_domains] bytes of pinned trunk placed per domain */
    uint64_t slot_fills;     /* streaming-slot fills placed */
} numa_place;

/* NULL pl or unbound: a no-op placer. 0 or -1 (out of memory). */
int numa_place_init(numa_place *np, const placement *pl, k3_error *err);
void numa_place_free(numa_place *np);
/* Binds the calling process's OpenMP threads (a parallel region of coord_threads). 0 or -1. */
int numa_place_threads(const placement *pl, k3_error *err);
/* trunk_config.place: data of `rows` rows of row_bytes each starts at data; refill: the pages were used before. */
void numa_place_rows(void *ctx, uint8_t *data, size_t rows, size_t row_bytes, int refill);

/* Start-up report (stderr) and its --json twins. */
void numa_place_print_topology(const k3_topology *t, const placement *pl, FILE *f);
json_t *numa_place_topology_json(const k3_topology *t);
/* {"bound", "threads", "groups": [{node, cpus, threads, trunk_pinned_bytes}], streaming slots} */
json_t *numa_place_coordinator_json(const numa_place *np, uint64_t slot_bytes, int n_slots);
/* {"node", "cpus", "threads"} of server i */
json_t *numa_place_server_json(const placement *pl, int i);
/* One stderr line per coordinator group (after the trunk is loaded). */
void numa_place_print_coordinator(const numa_place *np, uint64_t slot_bytes, int n_slots, FILE *f);

#endif
