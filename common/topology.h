/* topology.h - the machine's NUMA nodes as this process may use them, and where
 * k3 puts its threads, servers and memory (a pure function of that).
 *
 * READING (topology_read). Everything comes from files under a root directory
 * ("/" for the machine itself; a test points it at a described tree):
 *   sys/devices/system/node/online              nodes ("0-3")
 *   sys/devices/system/node/nodeN/cpulist       cpus of node N
 *   sys/devices/system/node/nodeN/meminfo       "Node N MemTotal: X kB", MemFree
 *   sys/devices/system/node/nodeN/distance      SLIT row (optional)
 *   proc/self/status                            Cpus_allowed_list, Mems_allowed_list
 *                                               (the affinity mask and allowed nodes)
 *   proc/self/cgroup + sys/fs/cgroup/...        the cgroup cpuset: v2
 *                                               cpuset.{cpus,mems}.effective, v1
 *                                               cpuset/.../cpuset.effective_{cpus,mems}
 * A kernel without sys/devices/system/node is one node 0 holding every online cpu
 * (sys/devices/system/cpu/online) and proc/meminfo's memory. A node's usable cpus
 * are its cpus AND the affinity mask AND the cpuset's cpus; its memory is usable
 * when it has memory (MemTotal > 0) and is in Mems_allowed and the cpuset's mems.
 * Missing optional files mean "no restriction"; a malformed file is an error.
 *
 * PLACEMENT (placement_make, pure: the same topology and request give the same
 * placement). A *domain* is a node with usable memory and at least one usable
 * cpu; the usable cpus of a memoryless node (or of a node whose memory the
 * cpuset hides) join the domain nearest to it (smallest distance, then lowest
 * id). Nodes with memory but no usable cpu are not used. The rule:
 *  - servers: by default workers_per_node per domain; with an explicit count N,
 *    server i goes to domain i % n_domains. Server i is always expert-owner i
 *    (wire.h expert_owner), so the layout never changes what is computed;
 *  - a domain's cpus are split among its servers in contiguous, disjoint runs
 *    (server j of s gets cpus [j*c/s, (j+1)*c/s) of the domain's sorted c cpus;
 *    when s > c, server j gets cpu j % c); a server's threads default to its
 *    run's size (at least 1), --worker-threads overrides;
 *  - the coordinator's threads default to every usable cpu, numbered domain by
 *    domain (threads [0, t0) on domain 0, [t0, t0+t1) on domain 1, ...), each
 *    bound to its domain's cpus; --threads T splits T across domains in
 *    proportion to their cpus (largest remainder, ties to the lower domain);
 *  - no oversubscription by default: a domain's servers together get at most its
 *    cpus, and the coordinator's threads on a domain at most its cpus. The two
 *    share a domain's cores in TIME, not at once: the coordinator dispatches a
 *    layer's experts and sleeps (passive wait) until every server answered, and
 *    servers sleep on their rings while the coordinator computes. An explicit
 *    --workers / --worker-threads / --threads that cannot fit sets oversubscribed;
 *  - with numa off, or a single domain, nothing is bound (bound = 0): one group
 *    holding every usable cpu, node -1.
 * Memory: a server's cache goes on its domain's node; each coordinator domain
 * holds the rows of every trunk matrix that its threads compute under the
 * kernels' static row partition (placement_rows), so the bits never depend on
 * the placement: threads split rows only. */
#ifndef K3_TOPOLOGY_H
#define K3_TOPOLOGY_H

#include "common/error.h"
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define TOPO_MAX_CPUS 4096
#define TOPO_MAX_NODES 1024

typedef struct {
    uint64_t bits[TOPO_MAX_CPUS / 64];
} topo_cpuset;

void topo_cpuset_clear(topo_cpuset *s);
void topo_cpuset_add(topo_cpuset *s, int cpu);
int topo_cpuset_has(const topo_cpuset *s, int cpu);
int topo_cpuset_count(const topo_cpuset *s);
/* The n-th cpu (0-based) of the set in ascending order, or -1. */
int topo_cpuset_nth(const topo_cpuset *s, int n);
/* Parses a kernel cpu/node list ("0-3,8,10-11", whitespace and empty allowed). -1 if malformed. */
int topo_cpuset_parse(const char *s, topo_cpuset *out);
/* Writes the set as a list ("0-3,8"); "" for the empty set. Returns buf. */
char *topo_cpuset_format(const topo_cpuset *s, char *buf, size_t len);

typedef struct {
    int id;               /* node id as in sys/devices/system/node/nodeN */
    topo_cpuset cpus;     /* cpus of the node this process may run on */
    int n_cpus;           /* |cpus| */
    int n_cpus_online;    /* cpus of the node (before affinity and cpuset) */
    uint64_t mem_total, mem_free; /* bytes */
    int memoryless;       /* MemTotal == 0 */
    int mem_usable;       /* has memory and it is allowed (Mems_allowed, cpuset mems) */
} topo_node;

typedef struct {
    int n_nodes;
    topo_node *nodes;     /* [n_nodes], ascending id */
    int *distance;        /* [n_nodes * n_nodes], SLIT (10 = local); 10/20 when unknown */
    int n_cpus;           /* usable cpus over all nodes */
    int numa_sysfs;       /* 0: no node directory (one node synthesised) */
} k3_topology;

/* root: directory holding sys/ and proc/ ("/" or NULL: this machine). 0 or -1. */
int topology_read(const char *root, k3_topology *t, k3_error *err);
void topology_free(k3_topology *t);
/* One line per node: id, usable/online cpus and list, memory, flags. */
void topology_print(const k3_topology *t, FILE *f, const char *prefix);

typedef struct {
    int node;             /* node whose memory the group uses; -1: not bound */
    topo_cpuset cpus;     /* cpus its threads may run on (every usable cpu when unbound) */
    int n_cpus;
    int threads;
} place_group;

typedef struct {
    int workers;          /* -1: workers_per_node per domain; 0: experts in-process; N: N servers */
    int workers_per_node; /* >= 1 */
    int threads;          /* coordinator threads; 0: every usable cpu */
    int worker_threads;   /* threads per server; 0: its share of its domain's cpus */
    int numa;             /* 0: bind nothing */
} placement_request;

typedef struct {
    int bound;            /* threads and memory are bound to nodes */
    int n_domains;
    place_group *coord;   /* [n_domains]: the coordinator's threads per domain, in thread order */
    int coord_threads;    /* sum of coord[d].threads */
    int n_servers;
    place_group *server;  /* [n_servers]: server i */
    int *server_domain;   /* [n_servers] */
    int oversubscribed;   /* an explicit count put more threads on a domain than it has cpus */
} placement;

int placement_make(const k3_topology *t, const placement_request *rq, placement *pl, k3_error *err);
void placement_free(placement *pl);

/* The coordinator domain whose threads run thread number `thread` (0-based). */
int placement_thread_domain(const placement *pl, int thread);
/* Rows [*r0, *r1) of a matrix with `rows` rows that domain d's threads compute
 * when `rows` are cut into blocks of `block` rows and the blocks are shared by
 * the coord_threads threads with OpenMP schedule(static) (contiguous runs: the
 * first n % T threads get one block more). Every row belongs to one domain. */
void placement_rows(const placement *pl, int d, size_t rows, size_t block, size_t *r0, size_t *r1);

#endif
