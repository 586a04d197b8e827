/* error.c - k3_error formatting. */
#include "common/error.h"
#include <stdarg.h>
#include <stdio.h>

int k3_fail(k3_error *e, const char *fmt, ...) {
    if (e && !e->set) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
        e->set = 1;
    }
    return -1;
}
