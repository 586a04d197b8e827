/* doctor.h - `bin/k3 --doctor [MODEL_DIR] [--json FILE]`: is this machine ready,
 * and which settings should it use?
 *
 * Looks at the CPU (the SIMD levels kernels_get accepts, cores, NUMA nodes with
 * their CPUs and memory), memory (MemTotal, MemAvailable, transparent huge
 * pages, hugetlb pages), /dev/shm, the limits ulimit -n/-l/-f/-v, and, with a
 * MODEL_DIR, its file system (type, whether O_DIRECT is accepted) and a bounded
 * sequential read of the shards (at most ~2 s / 2 GiB, O_DIRECT when accepted).
 * A short DRAM read measures memory bandwidth. From these and the memory plan
 * (plan.h, from config.json alone) it recommends --mem-gb, --workers /
 * --workers-per-node and --threads, and estimates seconds per token from the
 * plan's bytes per token and the measured rates (at --mem-gb when given), printing
 * the reasoning. Every
 * problem found is named with its fix. Report on stdout (and JSON in json_path).
 * Returns the exit status: 0 (problems are reported, not failures), 1 when the
 * JSON cannot be written. Reads only; changes nothing. */
#ifndef K3_DOCTOR_H
#define K3_DOCTOR_H

typedef struct {
    const char *model_dir;   /* NULL: machine only */
    const char *json_path;   /* NULL: none */
    long chunk;              /* prefill chunk the plan assumes (bin/k3's --chunk) */
    double mem_gb;           /* > 0: estimate s/token at this budget instead of the recommended one */
} doctor_options;

int doctor_run(const doctor_options *o);

#endif
