/* proc_stats.c - /proc readings (see proc_stats.h). */
#include "common/proc_stats.h"
#include <stdio.h>
#include <time.h>

uint64_t proc_peak_rss_bytes(int pid) {
    char path[64], line[256];
    unsigned long long kb = 0;
    if (pid > 0) snprintf(path, sizeof path, "/proc/%d/status", pid);
    else snprintf(path, sizeof path, "/proc/self/status");
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    return (uint64_t)kb * 1024;
}

double proc_cpu_s(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0;
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
