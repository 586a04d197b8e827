/* doctor.c - the machine check and settings advice of `bin/k3 --doctor` (see doctor.h).
 *
 * Order: gather facts (CPU, topology, memory, /dev/shm, limits, the model's file
 * system and read rate, DRAM read rate), then plan (plan_make from config.json
 * alone), then print facts, advice with its reasoning, and problems with fixes. */
#define _GNU_SOURCE /* O_DIRECT */
#include "coordinator/doctor.h"
#include "common/mono_clock.h"
#include "common/checkpoint.h"
#include "common/config.h"
#include "common/kernels.h"
#include "common/topology.h"
#include "coordinator/plan.h"
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <numa.h>
#include <omp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define GIB (1024.0 * 1024.0 * 1024.0)
#define MIB (1024.0 * 1024.0)
#define READ_TEST_SECONDS 2.0
#define READ_TEST_BYTES ((uint64_t)2 << 30)
#define READ_CHUNK ((uint64_t)8 << 20)
#define IO_ALIGN_ 4096u

typedef struct {
    char problems[32][512];
    int n;
} problem_list;

static void problem(problem_list *pl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(problem_list *pl, const char *fmt, ...) {
    if (pl->n >= 32) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pl->problems[pl->n++], sizeof pl->problems[0], fmt, ap);
    va_end(ap);
}

/* First line of a small file, newline stripped; "" if unreadable. */
static void read_line(const char *path, char *buf, size_t len) {
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (fgets(buf, (int)len, f)) buf[strcspn(buf, "\n")] = 0;
    fclose(f);
}

/* A "Key: N kB" value of a meminfo-style file, in bytes (counts without kB as is); 0 if absent. */
static uint64_t meminfo_value(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    uint64_t v = 0;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f)) {
        char *k = strstr(line, key);
        if (!k || k[kl] != ':' || (k != line && k[-1] != ' ')) continue;
        unsigned long long x = strtoull(k + kl + 1, NULL, 10);
        v = strstr(k, "kB") ? x * 1024ull : x;
        break;
    }
    fclose(f);
    return v;
}

/* ---- the model's file system ---- */

typedef struct {
    int fd;
    uint64_t size;
} rt_file;

typedef struct {
    rt_file *files;
    int n_files;
    pthread_mutex_t mu;
    int cur;
    uint64_t off, bytes, limit;
    double t_end;
    int err;
} read_test;

static void *read_test_thread(void *arg) {
    read_test *rt = arg;
    void *buf = NULL;
    if (posix_memalign(&buf, IO_ALIGN_, READ_CHUNK)) return NULL;
    for (;;) {
        pthread_mutex_lock(&rt->mu);
        while (rt->cur < rt->n_files && rt->off >= rt->files[rt->cur].size) { rt->cur++; rt->off = 0; }
        int stop = rt->cur >= rt->n_files || rt->bytes >= rt->limit || k3_now_s() > rt->t_end || rt->err;
        int fd = stop ? -1 : rt->files[rt->cur].fd;
        uint64_t off = rt->off;
        rt->off += READ_CHUNK;
        pthread_mutex_unlock(&rt->mu);
        if (stop) break;
        ssize_t r = pread(fd, buf, READ_CHUNK, (off_t)off);
        pthread_mutex_lock(&rt->mu);
        if (r < 0) rt->err = errno;
        else rt->bytes += (uint64_t)r;
        pthread_mutex_unlock(&rt->mu);
    }
    free(buf);
    return NULL;
}

typedef struct {
    int have_model, config_ok, ckpt_ok, n_shards;
    uint64_t shard_bytes;
    char fs_type[32];
    int direct_ok;          /* 1 accepted, 0 refused, -1 not tested */
    char direct_why[128];
    double read_gbs;        /* 0: not measured */
    uint64_t read_bytes;
    double read_s;
    int read_buffered;
} model_fs;

static const char *fs_name(long type) {
    switch ((unsigned long)type) {
    case 0xEF53: return "ext2/3/4";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x01021994: return "tmpfs";
    case 0x794C7630: return "overlayfs";
    case 0x6969: return "nfs";
    case 0x2FC12FC1: return "zfs";
    case 0x65735546: return "fuse";
    case 0xFF534D42: return "cifs";
    case 0x5346544E: return "ntfs";
    case 0xF2F52010: return "f2fs";
    case 0x01021997: return "9p";
    default: return NULL;
    }
}

static void probe_model_fs(const char *dir, const checkpoint *ck, model_fs *mf) {
    struct statfs sf;
    if (statfs(dir, &sf) == 0) {
        const char *n = fs_name((long)sf.f_type);
        if (n) snprintf(mf->fs_type, sizeof mf->fs_type, "%s", n);
        else snprintf(mf->fs_type, sizeof mf->fs_type, "0x%lx", (unsigned long)sf.f_type);
    }
    mf->direct_ok = -1;
    if (!ck || ck->n_shards == 0) return;
    /* O_DIRECT: open and one aligned read of the first shard */
    int fd = open(ck->shards[0].file.path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0) {
        mf->direct_ok = 0;
        snprintf(mf->direct_why, sizeof mf->direct_why, "open(O_DIRECT): %s", strerror(errno));
    } else {
        void *buf = NULL;
        if (posix_memalign(&buf, IO_ALIGN_, IO_ALIGN_) == 0) {
            ssize_t r = pread(fd, buf, IO_ALIGN_, 0);
            mf->direct_ok = r >= 0;
            if (r < 0) snprintf(mf->direct_why, sizeof mf->direct_why, "aligned pread with O_DIRECT: %s", strerror(errno));
            free(buf);
        }
        close(fd);
    }
    /* bounded sequential read: the shards in order, 4 reads in flight */
    read_test rt = {.limit = READ_TEST_BYTES};
    rt.files = calloc((size_t)ck->n_shards, sizeof *rt.files);
    if (!rt.files) return;
    for (int s = 0; s < ck->n_shards; s++) {
        rt_file *f = &rt.files[rt.n_files];
        f->fd = open(ck->shards[s].file.path, O_RDONLY | O_CLOEXEC | (mf->direct_ok == 1 ? O_DIRECT : 0));
        f->size = ck->shards[s].file.file_size;
        if (f->fd >= 0) rt.n_files++;
    }
    mf->read_buffered = mf->direct_ok != 1;
    pthread_mutex_init(&rt.mu, NULL);
    pthread_t th[4];
    int started = 0;
    double t0 = k3_now_s();
    rt.t_end = t0 + READ_TEST_SECONDS;
    for (int i = 0; i < 4; i++)
        if (pthread_create(&th[started], NULL, read_test_thread, &rt) == 0) started++;
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    mf->read_s = k3_now_s() - t0;
    mf->read_bytes = rt.bytes;
    if (rt.bytes && mf->read_s > 0) mf->read_gbs = rt.bytes / mf->read_s / 1e9;
    for (int i = 0; i < rt.n_files; i++) close(rt.files[i].fd);
    free(rt.files);
    pthread_mutex_destroy(&rt.mu);
}

/* DRAM read rate: every thread sums its share of a 256 MiB buffer, best of 3. */
static double dram_read_gbs(void) {
    size_t n = (size_t)256 << 20 >> 3;
    uint64_t *a = malloc(n * sizeof *a);
    if (!a) return 0;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) a[i] = i;
    double best = 0;
    volatile uint64_t sink = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = k3_now_s();
        uint64_t s = 0;
#pragma omp parallel for schedule(static) reduction(+ : s)
        for (size_t i = 0; i < n; i++) s += a[i];
        double dt = k3_now_s() - t0;
        sink += s;
        if (dt > 0 && n * 8 / dt > best) best = n * 8 / dt;
    }
    (void)sink;
    free(a);
    return best / 1e9;
}

/* The exact kernels' weight rate in GB/s: one token through a 256 MiB BF16 matrix
 * (matmul_dense) and a 64 MiB packed MXFP4 matrix (matmul_mxfp4), all threads,
 * best of 2. This is the rate at which a resident trunk / cached expert is consumed:
 * the smaller of DRAM bandwidth and the kernels' arithmetic. */
static void kernel_rates(const kernels *k, double *bf16_gbs, double *mxfp4_gbs) {
    *bf16_gbs = *mxfp4_gbs = 0;
    size_t rows = 16384, cols = 8192;
    uint16_t *w = malloc(rows * cols * sizeof *w);
    uint8_t *packed = malloc(rows * cols / 2), *scales = malloc(rows * cols / 32);
    float *x = malloc(cols * sizeof *x), *y = malloc(rows * sizeof *y);
    if (k && w && packed && scales && x && y) {
#pragma omp parallel for schedule(static)
        for (size_t r = 0; r < rows; r++) {
            for (size_t c = 0; c < cols; c++) w[r * cols + c] = (uint16_t)(0x3c00 + ((r * 31 + c) & 0x3ff)); /* small finite bf16 */
            memset(packed + r * cols / 2, 0x35, cols / 2);
            memset(scales + r * cols / 32, 120, cols / 32);
        }
        for (size_t c = 0; c < cols; c++) x[c] = 1.0f / (float)(c + 1);
        dense_weight dw = {.dtype = DTYPE_BF16, .rows = rows, .cols = cols, .data = w};
        mxfp4_weight mw = {.rows = rows, .cols = cols, .packed = packed, .scales = scales};
        for (int rep = 0; rep < 2; rep++) {
            double t0 = k3_now_s();
            matmul_dense(k, &dw, x, 1, y);
            double t1 = k3_now_s();
            matmul_mxfp4(k, &mw, x, 1, y);
            double t2 = k3_now_s();
            double a = rows * cols * 2.0 / (t1 - t0) / 1e9, b = (rows * cols / 2.0 + rows * cols / 32.0) / (t2 - t1) / 1e9;
            if (a > *bf16_gbs) *bf16_gbs = a;
            if (b > *mxfp4_gbs) *mxfp4_gbs = b;
        }
    }
    free(w); free(packed); free(scales); free(x); free(y);
}

static const char *limit_str(rlim_t v, char *buf, size_t len) {
    if (v == RLIM_INFINITY) snprintf(buf, len, "unlimited");
    else snprintf(buf, len, "%llu", (unsigned long long)v);
    return buf;
}

static json_t *jlimit(rlim_t v) { return v == RLIM_INFINITY ? json_string("unlimited") : json_integer((json_int_t)v); }

int doctor_run(const doctor_options *o) {
    problem_list pl = {.n = 0};
    json_t *j = json_object();
    /* ---- CPU ---- */
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online < 1) online = 1;
    char model_name[256] = "";
    FILE *ci = fopen("/proc/cpuinfo", "r");
    if (ci) {
        char line[512];
        while (fgets(line, sizeof line, ci))
            if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
                snprintf(model_name, sizeof model_name, "%s", strchr(line, ':') + 2);
                model_name[strcspn(model_name, "\n")] = 0;
                break;
            }
        fclose(ci);
    }
    int has_avx2 = kernels_get(SIMD_AVX2) != NULL, has_avx512 = kernels_get(SIMD_AVX512) != NULL;
    const kernels *best = kernels_get(SIMD_AUTO);
    printf("k3 doctor\n\nCPU\n  %s\n  %ld online cores; kernels: scalar yes, avx2 %s, avx512 %s -> --simd auto uses %s\n",
           model_name[0] ? model_name : "(model name unknown)", online, has_avx2 ? "yes" : "no", has_avx512 ? "yes" : "no",
           best ? best->name : "?");
    if (!has_avx2)
        problem(&pl, "no AVX2: the scalar kernels give the same bits but several times slower. Fix: run on a CPU with AVX2+FMA (Intel Haswell / AMD Zen or newer)");
    json_t *jc = json_object();
    json_object_set_new(jc, "model", json_string(model_name));
    json_object_set_new(jc, "online_cores", json_integer(online));
    json_object_set_new(jc, "avx2", json_boolean(has_avx2));
    json_object_set_new(jc, "avx512", json_boolean(has_avx512));
    json_object_set_new(jc, "simd_auto", json_string(best ? best->name : "?"));
    json_object_set_new(j, "cpu", jc);

    /* ---- topology (common/topology.h: nodes, usable cpus, memory, cpuset and affinity) ---- */
    k3_topology topo;
    k3_error te = {0};
    int topo_ok = topology_read("/", &topo, &te) == 0;
    int libnuma = numa_available() >= 0;
    printf("\nNUMA\n");
    if (topo_ok) topology_print(&topo, stdout, "  ");
    else printf("  topology unreadable: %s\n", te.msg);
    if (!libnuma) printf("  libnuma: NUMA not available (servers are not bound)\n");
    json_t *jt = json_array();
    for (int i = 0; topo_ok && i < topo.n_nodes; i++) {
        const topo_node *n = &topo.nodes[i];
        char list[256];
        json_t *jn = json_object();
        json_object_set_new(jn, "node", json_integer(n->id));
        json_object_set_new(jn, "cpus", json_string(topo_cpuset_format(&n->cpus, list, sizeof list)));
        json_object_set_new(jn, "n_cpus", json_integer(n->n_cpus));
        json_object_set_new(jn, "n_cpus_online", json_integer(n->n_cpus_online));
        json_object_set_new(jn, "mem_total_bytes", json_integer((json_int_t)n->mem_total));
        json_object_set_new(jn, "mem_free_bytes", json_integer((json_int_t)n->mem_free));
        json_object_set_new(jn, "mem_usable", json_boolean(n->mem_usable));
        json_array_append_new(jt, jn);
    }
    json_object_set_new(j, "numa_nodes", jt);
    if (!topo_ok) problem(&pl, "the NUMA topology cannot be read (%s): k3 itself would refuse to place its servers. Fix: check /sys/devices/system/node and /proc/self/status", te.msg);
    else if (topo.n_nodes > 1 && !libnuma)
        problem(&pl, "%d NUMA nodes but libnuma reports NUMA unavailable: expert servers cannot be bound to their node. Fix: boot without numa=off / run outside a container that hides NUMA", topo.n_nodes);
    if (topo_ok && topo.n_cpus < online)
        printf("  this process may use %d of the %ld online cpus (affinity mask or cpuset)\n", topo.n_cpus, online);

    /* ---- memory ---- */
    uint64_t mem_total = meminfo_value("/proc/meminfo", "MemTotal"), mem_avail = meminfo_value("/proc/meminfo", "MemAvailable");
    uint64_t hp_total = meminfo_value("/proc/meminfo", "HugePages_Total"), hp_free = meminfo_value("/proc/meminfo", "HugePages_Free");
    uint64_t hp_size = meminfo_value("/proc/meminfo", "Hugepagesize");
    char thp[128], thp_mode[32] = "unknown";
    read_line("/sys/kernel/mm/transparent_hugepage/enabled", thp, sizeof thp);
    char *lb = strchr(thp, '['), *rb = lb ? strchr(lb, ']') : NULL;
    if (lb && rb && rb - lb - 1 < (long)sizeof thp_mode) { memcpy(thp_mode, lb + 1, (size_t)(rb - lb - 1)); thp_mode[rb - lb - 1] = 0; }
    printf("\nMemory\n  total %.1f GiB, available %.1f GiB\n  transparent huge pages: %s (k3 does not depend on them)\n"
           "  hugetlb pages: %llu of %.0f KiB, %llu free (k3 does not use them)\n",
           mem_total / GIB, mem_avail / GIB, thp_mode, (unsigned long long)hp_total, hp_size / 1024.0, (unsigned long long)hp_free);
    if (hp_total && hp_size && hp_total * hp_size > mem_total / 4)
        problem(&pl, "%.1f GiB are reserved as hugetlb pages, which k3 does not use: that memory is missing from MemAvailable. Fix: echo 0 > /proc/sys/vm/nr_hugepages (as root) unless another program needs them",
                hp_total * hp_size / GIB);
    json_t *jm = json_object();
    json_object_set_new(jm, "total_bytes", json_integer((json_int_t)mem_total));
    json_object_set_new(jm, "available_bytes", json_integer((json_int_t)mem_avail));
    json_object_set_new(jm, "thp", json_string(thp_mode));
    json_object_set_new(jm, "hugetlb_pages", json_integer((json_int_t)hp_total));
    json_object_set_new(jm, "hugetlb_free", json_integer((json_int_t)hp_free));
    json_object_set_new(jm, "hugetlb_page_bytes", json_integer((json_int_t)hp_size));
    json_object_set_new(j, "memory", jm);

    /* ---- /dev/shm ---- */
    struct statvfs sv;
    uint64_t shm_total = 0, shm_free = 0;
    int shm_ok = statvfs("/dev/shm", &sv) == 0;
    if (shm_ok) { shm_total = (uint64_t)sv.f_blocks * sv.f_frsize; shm_free = (uint64_t)sv.f_bavail * sv.f_frsize; }
    if (shm_ok) printf("\n/dev/shm: %.1f MiB, %.1f MiB free\n", shm_total / MIB, shm_free / MIB);
    else printf("\n/dev/shm: missing (%s)\n", strerror(errno));
    if (!shm_ok) problem(&pl, "/dev/shm is missing: expert servers cannot create their rings (use --workers 0, or mount tmpfs on /dev/shm)");
    json_t *js = json_object();
    json_object_set_new(js, "total_bytes", json_integer((json_int_t)shm_total));
    json_object_set_new(js, "free_bytes", json_integer((json_int_t)shm_free));
    json_object_set_new(j, "dev_shm", js);

    /* ---- limits ---- */
    struct rlimit rn, rl, rf, rv;
    getrlimit(RLIMIT_NOFILE, &rn);
    getrlimit(RLIMIT_MEMLOCK, &rl);
    getrlimit(RLIMIT_FSIZE, &rf);
    getrlimit(RLIMIT_AS, &rv);
    char b1[32], b2[32], b3[32], b4[32];
    printf("\nLimits (soft)\n  ulimit -n %s (open files)\n  ulimit -l %s (locked memory; k3 locks none)\n  ulimit -f %s (file size)\n  ulimit -v %s (address space)\n",
           limit_str(rn.rlim_cur, b1, sizeof b1), limit_str(rl.rlim_cur == RLIM_INFINITY ? rl.rlim_cur : rl.rlim_cur / 1024, b2, sizeof b2),
           limit_str(rf.rlim_cur == RLIM_INFINITY ? rf.rlim_cur : rf.rlim_cur / 1024, b3, sizeof b3),
           limit_str(rv.rlim_cur == RLIM_INFINITY ? rv.rlim_cur : rv.rlim_cur / 1024, b4, sizeof b4));
    json_t *jl = json_object();
    json_object_set_new(jl, "nofile", jlimit(rn.rlim_cur));
    json_object_set_new(jl, "memlock_bytes", jlimit(rl.rlim_cur));
    json_object_set_new(jl, "fsize_bytes", jlimit(rf.rlim_cur));
    json_object_set_new(jl, "as_bytes", jlimit(rv.rlim_cur));
    json_object_set_new(j, "limits", jl);
    if (rf.rlim_cur != RLIM_INFINITY)
        problem(&pl, "ulimit -f is %llu KiB: --json, --dump-logits and --dump-expert-trace files larger than that are cut off (SIGXFSZ). Fix: ulimit -f unlimited",
                (unsigned long long)(rf.rlim_cur / 1024));
    /* thread stacks: the prefill kernels' 600 KiB tiles are in a per-thread heap workspace (since
     * 2026-12-01; kernels.h matmul_reserve_gemm); the largest frames left are ~75 KiB (the serve
     * scheduler's step) and ~65 KiB (the AVX2 prefill kernel), and rw6-shaped and test runs pass with
     * ulimit -s 128 and OMP_STACKSIZE=96K. The main thread's stack is ulimit -s, the OpenMP threads'
     * OMP_STACKSIZE (else the pthread default, ulimit -s): below these, a problem, with margin */
    struct rlimit rs;
    getrlimit(RLIMIT_STACK, &rs);
    const unsigned long long main_need = 512ull << 10, omp_need = 256ull << 10;
    if (rs.rlim_cur != RLIM_INFINITY && rs.rlim_cur < main_need)
        problem(&pl, "ulimit -s is %llu KiB: k3's threads need 512 KiB of stack to be safe. Fix: ulimit -s 8192",
                (unsigned long long)(rs.rlim_cur / 1024));
    const char *oss = getenv("OMP_STACKSIZE");
    if (oss && *oss) {
        char *end;
        double v = strtod(oss, &end);
        double mult = (*end == 'B' || *end == 'b') ? 1.0 : (*end == 'M' || *end == 'm') ? 1048576.0 : (*end == 'G' || *end == 'g') ? 1073741824.0 : 1024.0;
        if (v * mult < (double)omp_need)
            problem(&pl, "OMP_STACKSIZE=%s gives the OpenMP threads less than 256 KiB of stack, which k3's kernels need to be safe. Fix: unset OMP_STACKSIZE or set 8M",
                    oss);
    }

    /* ---- the model ---- */
    model_fs mf = {0};
    mf.direct_ok = -1;
    k3_config cfg;
    checkpoint ck;
    memset(&ck, 0, sizeof ck);
    if (o->model_dir) {
        k3_error e = {0};
        mf.have_model = 1;
        mf.config_ok = config_load(o->model_dir, &cfg, &e) == 0;
        printf("\nModel %s\n", o->model_dir);
        if (!mf.config_ok) {
            printf("  config.json refused: %s\n", e.msg);
            problem(&pl, "the model's config.json is refused (%s). Fix: re-download config.json; run bin/k3 --verify %s", e.msg, o->model_dir);
        }
        k3_error ce = {0};
        mf.ckpt_ok = checkpoint_open(o->model_dir, &ck, &ce) == 0;
        if (mf.ckpt_ok) {
            mf.n_shards = ck.n_shards;
            for (int s = 0; s < ck.n_shards; s++) mf.shard_bytes += ck.shards[s].file.file_size;
        } else if (strstr(ce.msg, "no safetensors shards")) {
            printf("  no shards (config only: the plan below still holds)\n");
        } else {
            printf("  shards refused: %s\n", ce.msg);
            problem(&pl, "the shards are refused (%s). Fix: run bin/k3 --verify %s to list every problem", ce.msg, o->model_dir);
        }
        probe_model_fs(o->model_dir, mf.ckpt_ok ? &ck : NULL, &mf);
        printf("  file system: %s; %d shard(s), %.2f GB\n", mf.fs_type[0] ? mf.fs_type : "unknown", mf.n_shards, mf.shard_bytes / 1e9);
        if (mf.direct_ok == 1) printf("  O_DIRECT: accepted\n");
        else if (mf.direct_ok == 0) {
            printf("  O_DIRECT: refused (%s)\n", mf.direct_why);
            problem(&pl, "O_DIRECT is refused on the model's file system (%s, %s): the trunk streamer and expert caches fall back to buffered reads, so the page cache holds shard data outside --mem-gb and may evict the plan's memory. Fix: keep the shards on ext4 or xfs on a local disk",
                    mf.fs_type, mf.direct_why);
        }
        if (mf.read_gbs > 0)
            printf("  sequential read: %.2f GB/s (%.2f GB in %.2f s, 8 MiB reads, 4 in flight%s)\n", mf.read_gbs, mf.read_bytes / 1e9, mf.read_s,
                   mf.read_buffered ? ", buffered: pages already cached read faster than the disk" : ", O_DIRECT");
        if (mf.read_gbs > 0 && mf.read_bytes < (64u << 20))
            printf("  (only %.1f MB of shards: too little to measure the device; the rate is dominated by per-read overhead)\n", mf.read_bytes / 1e6);
        /* open files: a process holds a buffered and an O_DIRECT descriptor per shard it reads, plus the in-process cache's */
        uint64_t need_fd = 3ull * (uint64_t)mf.n_shards + 64;
        if (mf.ckpt_ok && rn.rlim_cur != RLIM_INFINITY && rn.rlim_cur < need_fd)
            problem(&pl, "ulimit -n is %llu but a process can hold %llu descriptors (3 per shard for %d shards + 64). Fix: ulimit -n %llu%s",
                    (unsigned long long)rn.rlim_cur, (unsigned long long)need_fd, mf.n_shards, (unsigned long long)need_fd,
                    rn.rlim_max != RLIM_INFINITY && rn.rlim_max < need_fd
                        ? " after raising the hard limit (now below it: /etc/security/limits.conf nofile, or LimitNOFILE= for a systemd unit)"
                        : "");
    }
    json_t *jmod = json_object();
    if (mf.have_model) {
        json_object_set_new(jmod, "dir", json_string(o->model_dir));
        json_object_set_new(jmod, "config_ok", json_boolean(mf.config_ok));
        json_object_set_new(jmod, "shards", json_integer(mf.n_shards));
        json_object_set_new(jmod, "shard_bytes", json_integer((json_int_t)mf.shard_bytes));
        json_object_set_new(jmod, "filesystem", json_string(mf.fs_type));
        if (mf.direct_ok >= 0) json_object_set_new(jmod, "o_direct", json_boolean(mf.direct_ok));
        json_object_set_new(jmod, "read_gb_per_s", json_real(mf.read_gbs));
        json_object_set_new(jmod, "read_buffered", json_boolean(mf.read_buffered));
        json_object_set_new(j, "model", jmod);
    } else json_decref(jmod);

    /* ---- DRAM ---- */
    double dram = dram_read_gbs();
    printf("\nDRAM read: %.1f GB/s (%d threads summing 256 MiB, best of 3)\n", dram, omp_get_max_threads());
    json_object_set_new(j, "dram_read_gb_per_s", json_real(dram));
    double bf16_gbs, mxfp4_gbs;
    kernel_rates(best, &bf16_gbs, &mxfp4_gbs);
    printf("Kernels (%s, %d threads, one token): BF16 matrix %.2f GB/s, MXFP4 experts %.2f GB/s of weights\n", best ? best->name : "?",
           omp_get_max_threads(), bf16_gbs, mxfp4_gbs);
    json_object_set_new(j, "kernel_bf16_gb_per_s", json_real(bf16_gbs));
    json_object_set_new(j, "kernel_mxfp4_gb_per_s", json_real(mxfp4_gbs));

    /* ---- advice ---- */
    /* the default placement (topology.h): one server per domain, every usable cpu */
    int workers = 1, threads = (int)online, domains = 1;
    placement plc = {0};
    if (topo_ok) {
        placement_request rq = {.workers = -1, .workers_per_node = 1, .numa = libnuma};
        k3_error pe = {0};
        if (placement_make(&topo, &rq, &plc, &pe) == 0) {
            workers = plc.n_servers;
            threads = plc.coord_threads;
            domains = plc.n_domains;
        }
    }
    printf("\nAdvice\n  --threads %d: every usable cpu; the coordinator and the servers take turns on them (idle threads sleep)\n", threads);
    if (domains > 1)
        printf("  --workers-per-node 1 (= --workers %d): one expert server per NUMA domain keeps each server's cache in its node's memory;\n"
               "    more servers per node only split the same cache and cores\n", workers);
    else
        printf("  --workers 1 (the default on one node): one expert server; --workers 0 (in-process) saves the rings and one process\n");
    for (int i = 0; i < plc.n_servers && plc.bound; i++) {
        char list[256];
        printf("    server %d: node %d, cpus %s, %d threads\n", i, plc.server[i].node, topo_cpuset_format(&plc.server[i].cpus, list, sizeof list),
               plc.server[i].threads);
    }
    placement_free(&plc);
    json_t *ja = json_object();
    json_object_set_new(ja, "threads", json_integer(threads));
    json_object_set_new(ja, "workers", json_integer(workers));
    json_object_set_new(ja, "workers_per_node", json_integer(1));
    if (mf.have_model && mf.config_ok) {
        mem_plan all = {0}, pick = {0};
        k3_error pe = {0};
        size_t chunk = o->chunk > 0 ? (size_t)o->chunk : 64, ctx = 4096;
        if (plan_make(&all, &cfg, NULL, 0, workers, chunk, ctx, &pe) == 0) {
            uint64_t avail85 = (uint64_t)(0.85 * (double)mem_avail);
            /* everything resident, rounded up to 0.01 GiB, when it fits; else 85 % of MemAvailable rounded down */
            int fits = all.total < avail85;
            double gb = fits ? ceil(all.total / GIB * 100) / 100 : floor(avail85 / GIB * 100) / 100;
            uint64_t want = (uint64_t)(gb * GIB);
            printf("  --mem-gb %.2f: everything resident needs %.2f GiB, 85%% of MemAvailable is %.1f GiB, the floor is %.2f GiB;\n"
                   "    %s\n", gb, all.total / GIB, avail85 / GIB, all.floor / GIB,
                   fits ? "everything fits: more memory buys nothing" : "the budget pins the trunk first, then grows the expert caches (same ids at any budget)");
            json_object_set_new(ja, "mem_gb", json_real(gb));
            json_object_set_new(ja, "everything_resident_bytes", json_integer((json_int_t)all.total));
            json_object_set_new(ja, "floor_bytes", json_integer((json_int_t)all.floor));
            uint64_t ring_need = all.ring_bytes / 2; /* the plan counts each ring in both processes */
            if (shm_ok && ring_need > shm_free)
                problem(&pl, "/dev/shm has %.1f MiB free but %d server ring(s) need %.1f MiB at --chunk %zu. Fix: mount -o remount,size=%.0fM /dev/shm (docker: --shm-size=%.0fm), or a smaller --chunk, or --workers 0",
                        shm_free / MIB, workers, ring_need / MIB, chunk, (ring_need + shm_total - shm_free) / MIB * 1.25 + 1,
                        (ring_need + shm_total - shm_free) / MIB * 1.25 + 1);
            printf("  rings in /dev/shm at --chunk %zu: %.1f MiB (of %.1f MiB free)\n", chunk, ring_need / MIB, shm_free / MIB);
            if (avail85 < all.floor)
                problem(&pl, "85%% of MemAvailable (%.2f GiB) is below the floor of this model (%.2f GiB): k3 would refuse the budget. Fix: free memory or add RAM; the floor falls with a smaller --chunk and --max-context",
                        avail85 / GIB, all.floor / GIB);
            if (rv.rlim_cur != RLIM_INFINITY && rv.rlim_cur < want + (uint64_t)(1 + workers) * (1ull << 30))
                problem(&pl, "ulimit -v (%.1f GiB) leaves no room for a %.2f GiB budget plus code and thread stacks. Fix: ulimit -v unlimited",
                        rv.rlim_cur / GIB, gb);
            double est_gb = o->mem_gb > 0 ? o->mem_gb : gb; /* --mem-gb given: the estimate at that budget */
            uint64_t budget = (uint64_t)(est_gb * GIB);
            if (budget < all.floor)
                problem(&pl, "--mem-gb %.2f is below the floor of this model (%.2f GiB): k3 would refuse it. Fix: a budget of at least %.2f GiB", est_gb,
                        all.floor / GIB, ceil(all.floor / GIB * 100) / 100);
            if (budget >= all.floor && plan_make(&pick, &cfg, NULL, budget, workers, chunk, ctx, &pe) == 0) {
                /* bytes per token: the unpinned trunk streams from disk every token; experts hit the cache in the
                 * proportion it holds of all experts (uniform routing: a cautious assumption, real routing reuses more) */
                uint64_t trunk_disk = pick.walk_total - pick.pinned_bytes;
                double cached = (double)(workers ? workers : 1) * (double)pick.expert_cache_per_worker / (double)pick.expert_slot_bytes;
                double hit = pick.n_experts_total ? cached / (double)pick.n_experts_total : 1;
                if (hit > 1) hit = 1;
                int moe_layers = 0;
                for (int l = 0; l < cfg.num_hidden_layers; l++) moe_layers += cfg.layer_is_moe[l];
                double experts_tok = (double)moe_layers * cfg.num_experts_per_token;
                double expert_bytes = experts_tok * (double)pick.expert_slot_bytes;
                double disk = (double)trunk_disk + expert_bytes * (1 - hit), mem = (double)pick.pinned_bytes + expert_bytes * hit;
                printf("\nExpected speed at --mem-gb %.2f%s (bytes per token from the plan)\n", est_gb, o->mem_gb > 0 ? " (given)" : "");
                printf("  trunk: %.2f GB per token, %.2f GB pinned, %.2f GB streamed from disk\n", pick.walk_total / 1e9,
                       pick.pinned_bytes / 1e9, trunk_disk / 1e9);
                printf("  experts: %.0f per token x %.1f MB = %.2f GB; the caches hold %.1f%% of all experts -> %.2f GB from disk (uniform routing assumed)\n",
                       experts_tok, pick.expert_slot_bytes / 1e6, expert_bytes / 1e9, 100 * hit, expert_bytes * (1 - hit) / 1e9);
                json_t *je = json_object();
                json_object_set_new(je, "mem_gb", json_real(est_gb));
                json_object_set_new(je, "disk_bytes_per_token", json_integer((json_int_t)disk));
                json_object_set_new(je, "memory_bytes_per_token", json_integer((json_int_t)mem));
                json_object_set_new(je, "expert_cache_fraction", json_real(hit));
                if (disk > 0 && mf.read_gbs <= 0) {
                    printf("  no read rate measured (no shards here): s/token not estimated; %.2f GB per token come from disk\n", disk / 1e9);
                } else if (bf16_gbs > 0 && mxfp4_gbs > 0) {
                    /* every trunk byte and every routed expert is computed each token, at the kernels' rate;
                     * what is not resident is read first (the trunk reader runs one unit ahead, so reading
                     * and computing overlap partly: the truth lies between max and sum) */
                    double sd = disk > 0 ? disk / (mf.read_gbs * 1e9) : 0;
                    double sc = (double)pick.walk_total / (bf16_gbs * 1e9) + expert_bytes / (mxfp4_gbs * 1e9);
                    double lo = sd > sc ? sd : sc, hi = sd + sc;
                    printf("  disk: %.2f GB / %.2f GB/s = %.2f s; compute: %.2f GB / %.2f GB/s (BF16) + %.2f GB / %.2f GB/s (MXFP4) = %.2f s\n",
                           disk / 1e9, mf.read_gbs, sd, pick.walk_total / 1e9, bf16_gbs, expert_bytes / 1e9, mxfp4_gbs, sc);
                    printf("  expected: %.2f to %.2f s/token (reads overlapped with compute, or not; routing reuse lowers the disk term)\n", lo, hi);
                    json_object_set_new(je, "disk_seconds_per_token", json_real(sd));
                    json_object_set_new(je, "compute_seconds_per_token", json_real(sc));
                    json_object_set_new(je, "seconds_per_token_min", json_real(lo));
                    json_object_set_new(je, "seconds_per_token", json_real(hi));
                }
                json_object_set_new(j, "expected", je);
            }
            plan_free(&pick);
        } else {
            printf("  memory plan: %s\n", pe.msg);
        }
        plan_free(&all);
    } else if (!mf.have_model) {
        printf("  --mem-gb: give MODEL_DIR (its config.json is enough, e.g. configs/kimi-k3) for a budget and a speed estimate\n");
    }
    json_object_set_new(j, "advice", ja);

    printf("\n");
    if (pl.n == 0) printf("No problems found.\n");
    for (int i = 0; i < pl.n; i++) printf("PROBLEM: %s\n", pl.problems[i]);
    json_t *jp = json_array();
    for (int i = 0; i < pl.n; i++) json_array_append_new(jp, json_string(pl.problems[i]));
    json_object_set_new(j, "problems", jp);
    int status = 0;
    if (o->json_path && json_dump_file(j, o->json_path, JSON_INDENT(1))) {
        fprintf(stderr, "k3: cannot write %s\n", o->json_path);
        status = 1;
    }
    json_decref(j);
    if (mf.have_model && mf.config_ok) config_free(&cfg);
    if (mf.ckpt_ok) checkpoint_close(&ck);
    if (topo_ok) topology_free(&topo);
    return status;
}
