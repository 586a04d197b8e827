/* mono_clock.c - monotonic seconds (contract: mono_clock.h). */
#include "common/mono_clock.h"
#include <time.h>

double k3_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
