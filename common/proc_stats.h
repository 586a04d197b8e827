/* proc_stats.h - what the kernel reports about a process.
 * proc_peak_rss_bytes: VmHWM (peak resident set) of pid (0 = this process)
 * from /proc/PID/status, in bytes; 0 if the process is gone or it is unknown.
 * proc_cpu_s: CPU seconds (user + system) of this process, all threads summed
 * (CLOCK_PROCESS_CPUTIME_ID); on a shared machine, the time a phase actually ran. */
#ifndef K3_PROC_STATS_H
#define K3_PROC_STATS_H

#include <stdint.h>

uint64_t proc_peak_rss_bytes(int pid);
double proc_cpu_s(void);

#endif
