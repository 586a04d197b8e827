#!/usr/bin/python3
"""state_file_tool.py - reads and damages k3 state files for tests/t_55_state.sh (the format is
docs/FORMATS.md "State files"; XXH64 re-implemented here independently of common/hash64.c).

  state_file_tool.py sections FILE            one line per section: offset tag index length
  state_file_tool.py flip FILE OUT K          OUT = FILE with one bit flipped in the middle of
                                              section K's payload; prints the section's name as
                                              the loader reports it
  state_file_tool.py version FILE OUT V       OUT = FILE with format version V (header checksum fixed)
  state_file_tool.py ids FILE                 the history ids, space-separated, then "pos=N"
"""
import struct
import sys

M64 = (1 << 64) - 1
P1, P2, P3, P4, P5 = (11400714785074694791, 14029467366897019727, 1609587929392839161,
                      9650029242287828579, 2870177450012600261)


def rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def rnd(acc, v):
    acc = (acc + v * P2) & M64
    return (rotl(acc, 31) * P1) & M64


def xxh64(b, seed=0):
    n, i = len(b), 0
    if n >= 32:
        v = [(seed + P1 + P2) & M64, (seed + P2) & M64, seed, (seed - P1) & M64]
        while i + 32 <= n:
            for k in range(4):
                v[k] = rnd(v[k], struct.unpack_from('<Q', b, i + 8 * k)[0])
            i += 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M64
        for k in range(4):
            h = ((h ^ rnd(0, v[k])) * P1 + P4) & M64
    else:
        h = (seed + P5) & M64
    h = (h + n) & M64
    while i + 8 <= n:
        h ^= rnd(0, struct.unpack_from('<Q', b, i)[0])
        h = (rotl(h, 27) * P1 + P4) & M64
        i += 8
    if i + 4 <= n:
        h ^= (struct.unpack_from('<I', b, i)[0] * P1) & M64
        h = (rotl(h, 23) * P2 + P3) & M64
        i += 4
    while i < n:
        h ^= (b[i] * P5) & M64
        h = (rotl(h, 11) * P1) & M64
        i += 1
    h ^= h >> 33
    h = (h * P2) & M64
    h ^= h >> 29
    h = (h * P3) & M64
    h ^= h >> 32
    return h


assert xxh64(b'') == 0xef46db3751d8e999 and xxh64(b'abc') == 0x44bc2cf5ad770999


def sections(b):
    out, o = [], 24
    while o + 24 <= len(b):
        tag, idx, ln = b[o:o + 4].decode('latin1'), *struct.unpack_from('<IQ', b, o + 4)
        out.append((o, tag, idx, ln))
        o += 24 + ln
    return out


def name(tag, idx):
    return {'FPRT': 'fingerprint', 'RUN ': 'run settings', 'TOKS': 'token history'}.get(tag, '%s layer %d' % (tag.strip(), idx))


def main():
    cmd, f = sys.argv[1], sys.argv[2]
    b = bytearray(open(f, 'rb').read())
    if cmd == 'sections':
        for o, tag, idx, ln in sections(b):
            print(o, tag.strip(), idx, ln)
    elif cmd == 'flip':
        o, tag, idx, ln = sections(b)[int(sys.argv[4])]
        b[o + 24 + ln // 2] ^= 0x08
        open(sys.argv[3], 'wb').write(b)
        print(name(tag, idx))
    elif cmd == 'version':
        struct.pack_into('<I', b, 8, int(sys.argv[4]))
        struct.pack_into('<Q', b, 16, xxh64(bytes(b[:16])))
        open(sys.argv[3], 'wb').write(b)
    elif cmd == 'ids':
        for o, tag, idx, ln in sections(b):
            if tag == 'TOKS':
                n, pos = struct.unpack_from('<QQ', b, o + 24)
                ids = struct.unpack_from('<%di' % n, b, o + 40)
                print(' '.join(map(str, ids)), 'pos=%d' % pos)
    else:
        sys.exit('unknown command ' + cmd)


if __name__ == '__main__':
    main()
