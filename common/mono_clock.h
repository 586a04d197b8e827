/* mono_clock.h - THE clock of timings (runs, turns, requests, loads, verify and doctor rates):
 * k3_now_s() is CLOCK_MONOTONIC in seconds (never goes back; not the time of day). */
#ifndef K3_MONO_CLOCK_H
#define K3_MONO_CLOCK_H

double k3_now_s(void);

#endif
