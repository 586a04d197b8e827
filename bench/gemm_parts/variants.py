#!/usr/bin/python3
"""variants.py OUTDIR - writes timing-only variants of common/kernels_gemm_avx512.c into OUTDIR
(twelfth session, outside the build; docs/PERFORMANCE.md "Twelfth session"), each a copy of the
library source with one string replaced, for bench/gemm_parts/parts.c to include instead:

  now.c   the sub-tile decode (pack_w) skipped: stale doubles reused (WRONG RESULTS, timing only)
  nox.c   the activations' conversion (pack_x) skipped: stale xd reused (wrong results)
  tsc.c   rdtsc around the decode and each sub-tile's micro-kernels; parts.c prints the split
          when built with -DK3_PARTS_TSC (the first sub-tile of a column block, which converts
          the activations, against the other seven, in FMAs per TSC cycle)

  /usr/bin/python3 bench/gemm_parts/variants.py /tmp/gv
  cc -O2 -std=gnu11 -ffp-contract=off -I. -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx2 -mfma \\
     -DK3_PARTS_SRC='"/tmp/gv/tsc.c"' -DK3_PARTS_TSC bench/gemm_parts/parts.c build/libk3.a -lm -fopenmp -o /tmp/parts_tsc

A replacement that no longer matches the library source stops with the string it looked for."""
import os
import sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common", "kernels_gemm_avx512.c")
DECODE = """                    pack_w(kind, w, scales, cols, r0 + s0, ns, k0, kn, kn8, pf, kc, wd);
                    token_groups_f64(nt, ns, wd, xd, kn8 / 8, a, xsp);"""
VARIANTS = {
    "now.c": [(DECODE, """                    token_groups_f64(nt, ns, wd, xd, kn8 / 8, a, xsp); /* pack_w skipped */""")],
    "nox.c": [(DECODE, """                    pack_w(kind, w, scales, cols, r0 + s0, ns, k0, kn, kn8, pf, kc, wd);
                    token_groups_f64(nt, ns, wd, xd, kn8 / 8, a, NULL); /* pack_x skipped */""")],
    "tsc.c": [
        ("#include <immintrin.h>\n",
         "#include <immintrin.h>\n#include <x86intrin.h>\n"
         "unsigned long long k3_parts_tsc_pw, k3_parts_tsc_s0, k3_parts_tsc_sn, k3_parts_fma_s0, k3_parts_fma_sn;\n"),
        (DECODE, """                    const unsigned long long q0 = __rdtsc();
                    pack_w(kind, w, scales, cols, r0 + s0, ns, k0, kn, kn8, pf, kc, wd);
                    const unsigned long long q1 = __rdtsc();
                    token_groups_f64(nt, ns, wd, xd, kn8 / 8, a, xsp);
                    const unsigned long long q2 = __rdtsc();
                    k3_parts_tsc_pw += q1 - q0;
                    if (s0 == 0) k3_parts_tsc_s0 += q2 - q1, k3_parts_fma_s0 += ns * nt * (kn8 / 8);
                    else k3_parts_tsc_sn += q2 - q1, k3_parts_fma_sn += ns * nt * (kn8 / 8);"""),
    ],
}

def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    base = open(SRC).read()  # its #include "common/kernels_impl.h" is found through -I.
    for name, subs in VARIANTS.items():
        s = base
        for old, new in subs:
            if old not in s:
                sys.exit(f"variants.py: {name}: the library source no longer has:\n{old}")
            s = s.replace(old, new, 1)
        with open(os.path.join(out, name), "w") as f:
            f.write(s)
        print(os.path.join(out, name))

if __name__ == "__main__":
    main()
