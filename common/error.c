/* error.c - k3_error formatting and escaping of quoted file bytes. */
#include "common/error.h"
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Length of the well-formed UTF-8 sequence at s (n bytes left) that is not a C1
 * control, or 0. */
static size_t utf8_ok(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? (c <= 0xef ? 3 : 0) : c >= 0xc2 ? 2 : 0;
    if (len == 0 || len > n) return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    if (c == 0xc2 && s[1] < 0xa0) return 0;                   /* U+0080..U+009F: C1 controls */
    if (c == 0xe0 && s[1] < 0xa0) return 0;                   /* overlong */
    if (c == 0xed && s[1] >= 0xa0) return 0;                  /* surrogates */
    if (c == 0xf0 && s[1] < 0x90) return 0;                   /* overlong */
    if (c == 0xf4 && s[1] >= 0x90) return 0;                  /* past U+10FFFF */
    return len;
}

size_t k3_escape(char *dst, size_t cap, const char *src, size_t n) {
    if (cap == 0) return 0;
    const unsigned char *s = (const unsigned char *)src;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t u = s[i] >= 0x80 ? utf8_ok(s + i, n - i) : (s[i] >= 0x20 && s[i] < 0x7f);
        if (u) {
            if (o + u >= cap) break;
            memcpy(dst + o, s + i, u);
            o += u;
            i += u;
        } else {
            if (o + 4 >= cap) break;
            snprintf(dst + o, 5, "\\x%02x", s[i]);
            o += 4;
            i++;
        }
    }
    dst[o] = 0;
    return o;
}

static void vset(k3_error *e, k3_errkind kind, const char *fmt, va_list ap) {
    if (e && !e->set) {
        char raw[sizeof e->msg];
        int n = vsnprintf(raw, sizeof raw, fmt, ap);
        size_t len = n < 0 ? 0 : (size_t)n < sizeof raw ? (size_t)n : sizeof raw - 1;
        k3_escape(e->msg, sizeof e->msg, raw, len);
        e->kind = kind;
        e->set = 1;
    }
}

#define K3_ERROR_FN(name, kind)                                                                           \
    int name(k3_error *e, const char *fmt, ...) {                                                         \
        va_list ap;                                                                                       \
        va_start(ap, fmt);                                                                                \
        vset(e, kind, fmt, ap);                                                                           \
        va_end(ap);                                                                                       \
        return -1;                                                                                        \
    }
K3_ERROR_FN(k3_fail, K3_EFAIL)
K3_ERROR_FN(k3_refuse, K3_EINPUT)
K3_ERROR_FN(k3_nomem, K3_ENOMEM)

int k3_fail_as(k3_error *e, k3_errkind kind, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vset(e, kind, fmt, ap);
    va_end(ap);
    return -1;
}
