/* check.h - the one CHECK macro of the unit tests (each tests/unit/test_*.c is one program
 * and includes this once).
 *   CHECK(cond, fmt, ...)  counts a check; when cond is false counts a failure and prints
 *                          "FAIL file:line: cond: message" on stdout (the first 100 only)
 *   check_report("name")   prints "name: N checks, M failures"; returns the exit status
 *                          (0 when nothing failed, 1 otherwise): `return check_report(...);`
 * check_failures / check_count may be read (e.g. to stop early). */
#ifndef K3_TEST_CHECK_H
#define K3_TEST_CHECK_H

#include <stdio.h>

static int check_failures, check_count;

#define CHECK(cond, ...)                                                                                  \
    do {                                                                                                  \
        check_count++;                                                                                    \
        if (!(cond)) {                                                                                    \
            if (++check_failures <= 100) {                                                                \
                printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                    \
                printf(__VA_ARGS__);                                                                      \
                printf("\n");                                                                             \
                fflush(stdout);                                                                           \
            }                                                                                             \
        }                                                                                                 \
    } while (0)

static inline int check_report(const char *name) {
    printf("%s: %d checks, %d failures\n", name, check_count, check_failures);
    return check_failures ? 1 : 0;
}

#endif
