/* test_topology.c - the topology reader on described machines (sys/ and proc/
 * trees written under a temporary root: 1, 2, 4, 8 nodes, unequal cpus, an
 * affinity mask, a cgroup cpuset (v2 and v1) that hides a node, a memoryless
 * node, a kernel without NUMA, malformed files) and the placement rule on them
 * (servers per node, cpus per server, coordinator threads per node, the static
 * row partition per node, no oversubscription by default). Also reads this
 * machine once. */
#define _GNU_SOURCE
#include "common/topology.h"
#include "tests/unit/check.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_root[256];

static void mkdirs(const char *path) {
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') { *p = 0; mkdir(tmp, 0755); *p = '/'; }
}

static void put(const char *rel, const char *fmt, ...) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", g_root, rel);
    mkdirs(path);
    FILE *f = fopen(path, "w");
    if (!f) { printf("cannot write %s\n", path); exit(1); }
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fclose(f);
}

/* A fresh root with nodes 0..n-1; cpus[i] = node i's cpulist, mem_mb[i] its memory. */
static void machine(int n, const char *const *cpus, const int *mem_mb) {
    static int serial;
    snprintf(g_root, sizeof g_root, "%s/k3topo.%d.%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid(), serial++);
    mkdirs(g_root);
    mkdir(g_root, 0755);
    put("sys/devices/system/node/online", n == 1 ? "0\n" : "0-%d\n", n - 1);
    for (int i = 0; i < n; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "sys/devices/system/node/node%d/cpulist", i);
        put(rel, "%s\n", cpus[i]);
        snprintf(rel, sizeof rel, "sys/devices/system/node/node%d/meminfo", i);
        put(rel, "Node %d MemTotal:       %d kB\nNode %d MemFree:        %d kB\nNode %d MemUsed:        0 kB\n", i,
            mem_mb[i] * 1024, i, mem_mb[i] * 512, i);
    }
}

static void status(const char *cpus, const char *mems) {
    put("proc/self/status", "Name:\tk3\nCpus_allowed:\tff\nCpus_allowed_list:\t%s\nMems_allowed:\t3\nMems_allowed_list:\t%s\nvoluntary_ctxt_switches:\t1\n",
        cpus, mems);
}

static void cleanup(void) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    if (system(cmd) != 0) printf("cannot remove %s\n", g_root);
}

static const char *list(const topo_cpuset *s) {
    static char buf[4][128];
    static int k;
    k = (k + 1) % 4;
    return topo_cpuset_format(s, buf[k], sizeof buf[k]);
}

static int make(const k3_topology *t, int workers, int wpn, int threads, int wthreads, int numa, placement *pl) {
    placement_request rq = {workers, wpn, threads, wthreads, numa};
    k3_error err = {0};
    int rc = placement_make(t, &rq, pl, &err);
    if (rc) printf("placement_make: %s\n", err.msg);
    return rc;
}

static int read_topo(k3_topology *t) {
    k3_error err = {0};
    int rc = topology_read(g_root, t, &err);
    if (rc) printf("topology_read: %s\n", err.msg);
    return rc;
}

/* The domains' row ranges tile [0, rows) in order. */
static void check_rows_tile(const placement *pl, size_t rows, size_t block) {
    size_t at = 0;
    for (int d = 0; d < pl->n_domains; d++) {
        size_t r0, r1;
        placement_rows(pl, d, rows, block, &r0, &r1);
        CHECK(r0 == at && r1 >= r0, "rows %zu block %zu: domain %d has [%zu,%zu), expected start %zu", rows, block, d, r0, r1, at);
        at = r1;
    }
    CHECK(at == rows, "rows %zu: the domains cover %zu rows", rows, at);
}

static void test_cpuset_lists(void) {
    topo_cpuset s;
    char buf[64];
    CHECK(topo_cpuset_parse("0-3,8,10-11\n", &s) == 0 && topo_cpuset_count(&s) == 7, "parse a list");
    CHECK(!strcmp(topo_cpuset_format(&s, buf, sizeof buf), "0-3,8,10-11"), "format: %s", buf);
    CHECK(topo_cpuset_nth(&s, 4) == 8 && topo_cpuset_nth(&s, 7) == -1, "nth");
    CHECK(topo_cpuset_parse("\n", &s) == 0 && topo_cpuset_count(&s) == 0, "empty list");
    CHECK(topo_cpuset_parse("3-1", &s) < 0, "reversed range refused");
    CHECK(topo_cpuset_parse("1,,2", &s) < 0, "empty element refused");
    CHECK(topo_cpuset_parse("x", &s) < 0, "garbage refused");
    CHECK(topo_cpuset_parse("0-99999", &s) < 0, "cpu beyond TOPO_MAX_CPUS refused");
}

static void test_one_node(void) {
    const char *cpus[] = {"0-3"};
    int mem[] = {8192};
    machine(1, cpus, mem);
    status("0-3", "0");
    k3_topology t;
    placement pl;
    if (read_topo(&t)) { check_failures++; return; }
    CHECK(t.n_nodes == 1 && t.n_cpus == 4 && t.nodes[0].mem_total == 8192ull << 20, "1 node: %d nodes %d cpus", t.n_nodes, t.n_cpus);
    if (make(&t, -1, 1, 0, 0, 1, &pl) == 0) {
        CHECK(!pl.bound && pl.n_domains == 1 && pl.n_servers == 1, "1 node: unbound, one server");
        CHECK(pl.coord_threads == 4 && pl.server[0].threads == 4 && pl.server[0].node == -1, "1 node: threads %d / %d",
              pl.coord_threads, pl.server[0].threads);
        CHECK(!pl.oversubscribed, "1 node: not oversubscribed");
        placement_free(&pl);
    }
    if (make(&t, 8, 1, 0, 0, 1, &pl) == 0) { /* --workers 8 on 4 cpus: one thread each, forced to share */
        CHECK(pl.n_servers == 8 && pl.server[7].threads == 1 && pl.oversubscribed, "1 node, 8 servers");
        placement_free(&pl);
    }
    if (make(&t, 0, 1, 0, 0, 1, &pl) == 0) {
        CHECK(pl.n_servers == 0 && pl.coord_threads == 4, "--workers 0: no servers");
        placement_free(&pl);
    }
    topology_free(&t);
    cleanup();
}

static void test_two_nodes(void) {
    const char *cpus[] = {"0-1", "2-3"};
    int mem[] = {1024, 1024};
    machine(2, cpus, mem);
    status("0-3", "0-1");
    put("sys/devices/system/node/node0/distance", "10 21\n");
    put("sys/devices/system/node/node1/distance", "21 10\n");
    k3_topology t;
    placement pl;
    if (read_topo(&t)) { check_failures++; return; }
    CHECK(t.n_nodes == 2 && t.distance[1] == 21, "2 nodes, distance read");
    if (make(&t, -1, 1, 0, 0, 1, &pl) == 0) {
        CHECK(pl.bound && pl.n_domains == 2 && pl.n_servers == 2, "2 nodes: 2 domains, 2 servers");
        CHECK(pl.server[0].node == 0 && !strcmp(list(&pl.server[0].cpus), "0-1") && pl.server[0].threads == 2, "server 0: node %d cpus %s",
              pl.server[0].node, list(&pl.server[0].cpus));
        CHECK(pl.server[1].node == 1 && !strcmp(list(&pl.server[1].cpus), "2-3"), "server 1: node %d cpus %s", pl.server[1].node,
              list(&pl.server[1].cpus));
        CHECK(pl.coord_threads == 4 && pl.coord[0].threads == 2 && pl.coord[1].threads == 2, "coordinator 2+2 threads");
        CHECK(placement_thread_domain(&pl, 1) == 0 && placement_thread_domain(&pl, 2) == 1, "threads numbered domain by domain");
        CHECK(!pl.oversubscribed, "not oversubscribed");
        size_t r0, r1;
        /* 100 rows in blocks of 4 = 25 blocks over 4 threads: 7,6,6,6 -> threads 0-1 have blocks 0-12 */
        placement_rows(&pl, 0, 100, 4, &r0, &r1);
        CHECK(r0 == 0 && r1 == 52, "domain 0 rows [%zu,%zu)", r0, r1);
        placement_rows(&pl, 1, 100, 4, &r0, &r1);
        CHECK(r0 == 52 && r1 == 100, "domain 1 rows [%zu,%zu)", r0, r1);
        check_rows_tile(&pl, 3, 4);
        check_rows_tile(&pl, 0, 4);
        check_rows_tile(&pl, 7168, 4);
        placement_free(&pl);
    }
    if (make(&t, -1, 2, 0, 0, 1, &pl) == 0) { /* --workers-per-node 2 */
        CHECK(pl.n_servers == 4, "2 per node: 4 servers");
        CHECK(pl.server[0].node == 0 && pl.server[1].node == 0 && pl.server[2].node == 1 && pl.server[3].node == 1, "2 per node: nodes");
        CHECK(!strcmp(list(&pl.server[0].cpus), "0") && !strcmp(list(&pl.server[1].cpus), "1") && !strcmp(list(&pl.server[3].cpus), "3"),
              "2 per node: one cpu each (%s %s %s)", list(&pl.server[0].cpus), list(&pl.server[1].cpus), list(&pl.server[3].cpus));
        CHECK(pl.server[2].threads == 1 && !pl.oversubscribed, "2 per node: 1 thread each");
        placement_free(&pl);
    }
    if (make(&t, 3, 1, 3, 0, 1, &pl) == 0) { /* --workers 3 --threads 3 */
        CHECK(pl.server_domain[0] == 0 && pl.server_domain[1] == 1 && pl.server_domain[2] == 0, "3 servers round robin");
        CHECK(!strcmp(list(&pl.server[0].cpus), "0") && !strcmp(list(&pl.server[2].cpus), "1") && !strcmp(list(&pl.server[1].cpus), "2-3"),
              "3 servers: cpus %s %s %s", list(&pl.server[0].cpus), list(&pl.server[1].cpus), list(&pl.server[2].cpus));
        CHECK(pl.coord[0].threads == 2 && pl.coord[1].threads == 1, "--threads 3: 2 + 1 (tie to the lower node)");
        check_rows_tile(&pl, 1000, 4);
        placement_free(&pl);
    }
    if (make(&t, -1, 1, 0, 0, 0, &pl) == 0) { /* --numa off */
        CHECK(!pl.bound && pl.n_domains == 1 && pl.n_servers == 1 && pl.server[0].node == -1, "numa off: unbound, one server");
        CHECK(!strcmp(list(&pl.coord[0].cpus), "0-3"), "numa off: every cpu");
        placement_free(&pl);
    }
    if (make(&t, -1, 1, 0, 4, 1, &pl) == 0) { /* --worker-threads 4 on 2-cpu nodes */
        CHECK(pl.server[0].threads == 4 && pl.oversubscribed, "--worker-threads beyond the node is flagged");
        placement_free(&pl);
    }
    topology_free(&t);
    cleanup();
}

static void test_many_nodes(int n) {
    const char *cpus[8];
    int mem[8];
    char buf[8][16];
    for (int i = 0; i < n; i++) {
        snprintf(buf[i], sizeof buf[i], "%d-%d", 8 * i, 8 * i + 7);
        cpus[i] = buf[i];
        mem[i] = 2048;
    }
    machine(n, cpus, mem);
    /* no proc/self/status: no restriction */
    k3_topology t;
    placement pl;
    if (read_topo(&t)) { check_failures++; return; }
    CHECK(t.n_nodes == n && t.n_cpus == 8 * n, "%d nodes: %d cpus", n, t.n_cpus);
    if (make(&t, -1, 1, 0, 0, 1, &pl) == 0) {
        CHECK(pl.n_servers == n && pl.n_domains == n && pl.coord_threads == 8 * n, "%d nodes: %d servers", n, pl.n_servers);
        for (int i = 0; i < n; i++) {
            CHECK(pl.server[i].node == i && pl.server[i].threads == 8 && pl.server[i].n_cpus == 8, "%d nodes: server %d", n, i);
            CHECK(pl.coord[i].threads == 8 && topo_cpuset_nth(&pl.coord[i].cpus, 0) == 8 * i, "%d nodes: coordinator group %d", n, i);
        }
        check_rows_tile(&pl, 163840, 4);
        check_rows_tile(&pl, 7, 4);
        /* a fair share: every domain gets rows/n (within one block per thread) */
        for (int d = 0; d < n; d++) {
            size_t r0, r1;
            placement_rows(&pl, d, 163840, 4, &r0, &r1);
            CHECK(r1 - r0 == 163840 / (size_t)n, "%d nodes: domain %d has %zu rows", n, d, r1 - r0);
        }
        placement_free(&pl);
    }
    if (make(&t, -1, 3, 0, 0, 1, &pl) == 0) { /* 3 per node on 8 cpus: runs of 2, 3, 3 */
        CHECK(pl.n_servers == 3 * n, "3 per node");
        CHECK(pl.server[0].n_cpus == 2 && pl.server[1].n_cpus == 3 && pl.server[2].n_cpus == 3, "3 per node: 2/3/3 cpus");
        CHECK(pl.server[3 * n - 1].node == n - 1 && topo_cpuset_nth(&pl.server[3 * n - 1].cpus, 2) == 8 * n - 1, "last server, last cpus");
        CHECK(!pl.oversubscribed, "3 per node fits");
        placement_free(&pl);
    }
    if (make(&t, -1, 1, n + 1, 0, 1, &pl) == 0) { /* --threads n+1: one extra on node 0 */
        CHECK(pl.coord[0].threads == 2 && pl.coord[n - 1].threads == 1 && pl.coord_threads == n + 1, "--threads %d split", n + 1);
        check_rows_tile(&pl, 1001, 4);
        placement_free(&pl);
    }
    topology_free(&t);
    cleanup();
}

static void test_unequal(void) {
    const char *cpus[] = {"0-5", "6-7"};
    int mem[] = {4096, 1024};
    machine(2, cpus, mem);
    status("0-7", "0-1");
    k3_topology t;
    placement pl;
    if (read_topo(&t)) { check_failures++; return; }
    if (make(&t, -1, 2, 4, 0, 1, &pl) == 0) {
        CHECK(pl.coord[0].threads == 3 && pl.coord[1].threads == 1, "--threads 4 on 6+2 cpus: %d + %d", pl.coord[0].threads, pl.coord[1].threads);
        CHECK(!strcmp(list(&pl.server[0].cpus), "0-2") && !strcmp(list(&pl.server[1].cpus), "3-5") && pl.server[1].threads == 3,
              "node 0 servers: %s %s", list(&pl.server[0].cpus), list(&pl.server[1].cpus));
        CHECK(!strcmp(list(&pl.server[2].cpus), "6") && !strcmp(list(&pl.server[3].cpus), "7") && pl.server[3].threads == 1,
              "node 1 servers: %s %s", list(&pl.server[2].cpus), list(&pl.server[3].cpus));
        size_t r0, r1;
        placement_rows(&pl, 0, 400, 4, &r0, &r1); /* 100 blocks / 4 threads = 25 each: node 0 has 75 */
        CHECK(r0 == 0 && r1 == 300, "unequal: node 0 rows [%zu,%zu)", r0, r1);
        placement_free(&pl);
    }
    if (make(&t, -1, 1, 0, 0, 1, &pl) == 0) {
        CHECK(pl.coord[0].threads == 6 && pl.coord[1].threads == 2 && pl.server[0].threads == 6 && pl.server[1].threads == 2,
              "default threads follow the cpus");
        placement_free(&pl);
    }
    topology_free(&t);
    cleanup();
}

static void test_affinity_mask(void) {
    const char *cpus[] = {"0-1", "2-3"};
    int mem[] = {1024, 1024};
    machine(2, cpus, mem);
    status("0-2", "0-1"); /* taskset -c 0-2 */
    k3_topology t;
    placement pl;
    if (read_topo(&t)) { check_failures++; return; }
    CHECK(t.n_cpus == 3 && t.nodes[1].n_cpus == 1 && t.nodes[1].n_cpus_online == 2, "affinity: node 1 keeps cpu 2 only");
    if (make(&t, -1, 1, 0, 0, 1, &pl) == 0) {
        CHECK(pl.n_domains == 2 && !strcmp(list(&pl.server[1].cpus), "2") && pl.server[1].threads == 1, "affinity: server 1 on cpu 2");
        CHECK(pl.coord_threads == 3, "affinity: 3 coordinator threads");
        placement_free(&pl);
    }
    status("0-1", "0-1"); /* node 1 has no allowed cpu: its memory alone is not used */
    topology_free(&t);
    if (read_topo(&t)) { check_failures++; return; }
    if (make(&t, -1, 1, 0, 0, 1, &pl) == 0) {
        CHECK(pl.n_domains == 1 && !pl.bound && pl.n_servers == 1, "affinity hides node 1: one unbound domain");
        placement_free(&pl);
    }
    status("", "0-1"); /* nothing allowed: refused */
    topology_free(&t);
    if (read_topo(&t)) { check_failures++; return; }
    CHECK(make(&t, -1, 1, 0, 0, 1, &pl) != 0, "no usable cpu is refused");
    topology_free(&t);
    cleanup();
}

static void test_cpuset_hides_node(void) {
    const char *cpus[] = {"0-3", "4-7"};
    int mem[] = {1024, 1024};
    machine(2, cpus, mem);
    status("0-7", "0-1");
    /* cgroup v2: the process lives in /k3.slice whose cpuset is node 0 */
    put("proc/self/cgroup", "0::/k3.slice\n");
    put("sys/fs/cgroup/k3.slice/cpuset.cpus.effective", "0-3\n");
    put("sys/fs/cgroup/k3.slice/cpuset.mems.effective", "0\n");
    k3_topology t;
    placement pl;
    if (read_topo(&t)) { check_failures++; return; }
    CHECK(t.n_cpus == 4 && t.nodes[1].n_cpus == 0 && !t.nodes[1].mem_usable && t.nodes[0].mem_usable, "cgroup v2 cpuset hides node 1");
    if (make(&t, -1, 1, 0, 0, 1, &pl) == 0) {
        CHECK(pl.n_domains == 1 && !pl.bound && pl.n_servers == 1 && pl.coord_threads == 4, "hidden node: one domain, 4 threads");
        placement_free(&pl);
    }
    topology_free(&t);
    /* cpus allowed but the node's memory is not: its cpus join node 0 */
    put("sys/fs/cgroup/k3.slice/cpuset.cpus.effective", "0-7\n");
    if (read_topo(&t)) { check_failures++; return; }
    if (make(&t, -1, 1, 0, 0, 1, &pl) == 0) {
        CHECK(pl.n_domains == 1 && pl.coord_threads == 8, "memory of node 1 hidden: its cpus join node 0 (%d threads)", pl.coord_threads);
        placement_free(&pl);
    }
    topology_free(&t);
    /* cgroup v1 */
    put("proc/self/cgroup", "12:cpu,cpuacct:/x\n7:cpuset:/k3\n0::/\n");
    put("sys/fs/cgroup/cpuset/k3/cpuset.effective_cpus", "4-7\n");
    put("sys/fs/cgroup/cpuset/k3/cpuset.effective_mems", "1\n");
    if (read_topo(&t)) { check_failures++; return; }
    CHECK(t.n_cpus == 4 && t.nodes[0].n_cpus == 0 && t.nodes[1].n_cpus == 4 && !t.nodes[0].mem_usable, "cgroup v1 cpuset keeps node 1");
    topology_free(&t);
    put("sys/fs/cgroup/cpuset/k3/cpuset.effective_cpus", "4-x\n");
    k3_error err = {0};
    CHECK(topology_read(g_root, &t, &err) != 0 && strstr(err.msg, "effective_cpus"), "malformed cpuset file named: %s", err.msg);
    cleanup();
}

static void test_memoryless(void) {
    const char *cpus[] = {"0-1", "2-3", "4-5"};
    int mem[] = {2048, 2048, 0};
    machine(3, cpus, mem);
    put("sys/devices/system/node/node2/distance", "20 12 10\n");
    k3_topology t;
    placement pl;
    if (read_topo(&t)) { check_failures++; return; }
    CHECK(t.nodes[2].memoryless && !t.nodes[2].mem_usable && t.nodes[2].n_cpus == 2, "node 2 is memoryless");
    if (make(&t, -1, 1, 0, 0, 1, &pl) == 0) {
        CHECK(pl.n_domains == 2 && pl.n_servers == 2, "memoryless node: 2 domains, 2 servers (%d, %d)", pl.n_domains, pl.n_servers);
        CHECK(!strcmp(list(&pl.coord[1].cpus), "2-5") && pl.coord[1].threads == 4 && pl.server[1].threads == 4 && pl.server[1].node == 1,
              "memoryless node's cpus join the nearest node (1): %s", list(&pl.coord[1].cpus));
        placement_free(&pl);
    }
    topology_free(&t);
    /* a memory-only node (no cpus) is not a domain */
    const char *cpus2[] = {"0-3", ""};
    int mem2[] = {2048, 8192};
    machine(2, cpus2, mem2);
    if (read_topo(&t)) { check_failures++; return; }
    if (make(&t, -1, 1, 0, 0, 1, &pl) == 0) {
        CHECK(pl.n_domains == 1 && !pl.bound, "cpu-less memory node unused");
        placement_free(&pl);
    }
    topology_free(&t);
    cleanup();
}

static void test_no_numa_kernel(void) {
    snprintf(g_root, sizeof g_root, "%s/k3topo.%d.flat", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    put("sys/devices/system/cpu/online", "0-5\n");
    put("proc/meminfo", "MemTotal:       16384000 kB\nMemFree:        8000000 kB\n");
    status("0-3", "0");
    k3_topology t;
    if (read_topo(&t)) { check_failures++; return; }
    CHECK(!t.numa_sysfs && t.n_nodes == 1 && t.nodes[0].n_cpus == 4 && t.nodes[0].n_cpus_online == 6 &&
              t.nodes[0].mem_total == 16384000ull * 1024,
          "no NUMA: one node, affinity applied");
    topology_free(&t);
    cleanup();
}

static void test_malformed(void) {
    const char *cpus[] = {"0-1", "2-z"};
    int mem[] = {1024, 1024};
    machine(2, cpus, mem);
    k3_topology t;
    k3_error err = {0};
    CHECK(topology_read(g_root, &t, &err) != 0 && strstr(err.msg, "node1/cpulist"), "malformed cpulist named: %s", err.msg);
    cleanup();
    const char *cpus2[] = {"0-1", "2-3"};
    machine(2, cpus2, mem);
    put("sys/devices/system/node/node0/distance", "10 x\n");
    err = (k3_error){0};
    CHECK(topology_read(g_root, &t, &err) != 0 && strstr(err.msg, "distance"), "malformed distance named: %s", err.msg);
    cleanup();
}

static void test_this_machine(void) {
    k3_topology t;
    k3_error err = {0};
    CHECK(topology_read(NULL, &t, &err) == 0, "this machine: %s", err.msg);
    if (err.set) return;
    CHECK(t.n_nodes >= 1 && t.n_cpus >= 1, "this machine: %d nodes, %d cpus", t.n_nodes, t.n_cpus);
    topology_print(&t, stdout, "");
    placement pl;
    if (make(&t, -1, 1, 0, 0, 1, &pl) == 0) {
        CHECK(pl.n_servers >= 1 && pl.coord_threads == t.n_cpus, "this machine: placement");
        placement_free(&pl);
    }
    topology_free(&t);
}

int main(void) {
    test_cpuset_lists();
    test_one_node();
    test_two_nodes();
    test_many_nodes(2);
    test_many_nodes(4);
    test_many_nodes(8);
    test_unequal();
    test_affinity_mask();
    test_cpuset_hides_node();
    test_memoryless();
    test_no_numa_kernel();
    test_malformed();
    test_this_machine();
    if (check_failures) { printf("%d failure(s)\n", check_failures); return 1; }
    printf("topology: all tests passed\n");
    return 0;
}
