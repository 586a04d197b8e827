#!/usr/bin/python3
"""compare_logits.py A B --vocab V --tol T [--b-start R]

A and B are raw little-endian float32 logit dumps (vocab floats per row, see
scripts/k3ref.py).  Row i of A is compared with row R+i of B (R = --b-start, default 0):
use --b-start n_prompt-1 to compare an engine's default dump (rows from the last prompt
position) with a teacher-forced fixture (rows from position 0).  A must not have more rows
than B has from R on; with --exact-rows they must have the same count.
Prints the max |A-B|, where it is, and the worst rows; exits 1 when it exceeds T (or on a
shape mismatch), 0 otherwise.
"""
import argparse
import sys

import numpy as np


def load(path, vocab):
    a = np.fromfile(path, dtype="<f4")
    if a.size % vocab:
        sys.exit("compare_logits: %s has %d floats, not a multiple of vocab %d" % (path, a.size, vocab))
    return a.reshape(-1, vocab).astype(np.float64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--tol", type=float, required=True)
    ap.add_argument("--b-start", type=int, default=0)
    ap.add_argument("--exact-rows", action="store_true")
    args = ap.parse_args()
    A = load(args.a, args.vocab)
    B = load(args.b, args.vocab)[args.b_start:]
    if A.shape[0] == 0:
        print("compare_logits: %s has no rows" % args.a)
        return 1
    if A.shape[0] > B.shape[0] or (args.exact_rows and A.shape[0] != B.shape[0]):
        print("compare_logits: %s has %d rows, %s has %d rows from row %d" % (
            args.a, A.shape[0], args.b, B.shape[0], args.b_start))
        return 1
    B = B[:A.shape[0]]
    if not np.all(np.isfinite(A)):
        print("compare_logits: %s has non-finite values" % args.a)
        return 1
    d = np.abs(A - B)
    r, c = np.unravel_index(int(np.argmax(d)), d.shape)
    mx = float(d[r, c])
    per_row = d.max(axis=1)
    print("max |a-b| = %.3g at row %d (b row %d) id %d: a=%.6f b=%.6f  (tol %g, %d rows, max |b| %.3g)" % (
        mx, r, r + args.b_start, c, A[r, c], B[r, c], args.tol, A.shape[0], float(np.abs(B).max())))
    if mx > args.tol:
        bad = np.nonzero(per_row > args.tol)[0]
        print("rows over tolerance: %s" % ", ".join("%d (%.3g)" % (i, per_row[i]) for i in bad[:20]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
