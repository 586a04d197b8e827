#!/usr/bin/python3
"""mutate_checkpoint.py: damages a COPY of a model directory in one precise way, for the
refusal tests (tests/t_05_refusals.sh). Shards are rewritten whole (a valid safetensors
file with fresh offsets) unless the mutation is about the raw bytes.

  mutate_checkpoint.py DIR remove NAME [--keep-index]  drop a tensor from its shard (and the index)
  mutate_checkpoint.py DIR shape NAME D0,D1,...        new shape; data cut or zero-padded to fit
  mutate_checkpoint.py DIR dtype NAME DTYPE            new dtype; data cut or zero-padded to fit
  mutate_checkpoint.py DIR poke NAME OFFSET BYTE ...   set data bytes of tensors (e.g. scale 255)
  mutate_checkpoint.py DIR setval NAME INDEX VALUE     set element INDEX (or every element: all) of an
                                                       F32 / BF16 tensor to VALUE (nan, inf, -inf, a number)
  mutate_checkpoint.py DIR truncate SHARD NBYTES       cut the last NBYTES of a shard file
  mutate_checkpoint.py DIR index-move NAME SHARD       point the index entry of NAME at SHARD
  mutate_checkpoint.py DIR duplicate NAME SHARD        copy tensor NAME into SHARD as well
  mutate_checkpoint.py DIR garbage-header SHARD        overwrite a shard's JSON header with garbage
  mutate_checkpoint.py DIR scatter-experts             reorder every shard so that no expert's six
                                                       tensors are back to back (same bytes)
  mutate_checkpoint.py DIR config KEY JSON             set a config key (text_config or
                                                       linear_attn_config, wherever it is)
  mutate_checkpoint.py DIR config-del KEY              delete a config key
  mutate_checkpoint.py DIR shard-of NAME               print the shard holding NAME
  mutate_checkpoint.py --batch MODEL OUT FILE          for each line "NAME OP ARGS..." of FILE
                                                       (shell quoting): copy MODEL to OUT/NAME and
                                                       apply OP ARGS there (one Python start-up for
                                                       a whole test script)
SHARD is a file name inside DIR. Exit status 0, or 1 with a message."""
import json
import os
import re
import shlex
import shutil
import struct
import sys

DTYPE_SIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
              "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
INDEX = "model.safetensors.index.json"


def die(msg):
    sys.stderr.write("mutate_checkpoint.py: " + msg + "\n")
    sys.exit(1)


def read_shard(path):
    """-> (metadata or None, [(name, dtype, shape, bytes)] in data order)."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    hdr = json.loads(blob[8:8 + n])
    meta = hdr.pop("__metadata__", None)
    base = 8 + n
    items = sorted(hdr.items(), key=lambda kv: kv[1]["data_offsets"][0])
    return meta, [(k, v["dtype"], list(v["shape"]), blob[base + v["data_offsets"][0]:base + v["data_offsets"][1]])
                  for k, v in items]


def write_shard(path, meta, tensors):
    hdr, off = {}, 0
    if meta is not None:
        hdr["__metadata__"] = meta
    for name, dtype, shape, data in tensors:
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    hb = json.dumps(hdr, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + b"".join(t[3] for t in tensors))
    os.replace(tmp, path)


def shards(d):
    return sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))


def load_index(d):
    p = os.path.join(d, INDEX)
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)


def save_index(d, idx):
    with open(os.path.join(d, INDEX), "w") as f:
        json.dump(idx, f, indent=2)
        f.write("\n")


def shard_of(d, name):
    idx = load_index(d)
    if idx and name in idx["weight_map"]:
        return idx["weight_map"][name]
    for s in shards(d):
        if any(t[0] == name for t in read_shard(os.path.join(d, s))[1]):
            return s
    die("no tensor named " + name)


def numel(shape):
    n = 1
    for x in shape:
        n *= x
    return n


def fit(data, nbytes):
    return data[:nbytes] if len(data) >= nbytes else data + bytes(nbytes - len(data))


def edit_tensor(d, name, fn):
    s = shard_of(d, name)
    p = os.path.join(d, s)
    meta, ts = read_shard(p)
    out, hit = [], False
    for t in ts:
        if t[0] == name:
            hit = True
            t = fn(t)
            if t is None:
                continue
        out.append(t)
    if not hit:
        die("%s is not in %s" % (name, s))
    write_shard(p, meta, out)


def expert_key(name):
    m = re.search(r"\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight_(packed|scale)$", name)
    return m and (m.group(3), m.group(4), int(m.group(1)), int(m.group(2)))


def find_key(cfg, key):
    """The dict that holds key (linear_attn_config first, then text_config, then the root)."""
    tc = cfg.get("text_config", cfg)
    for obj in (tc.get("linear_attn_config"), cfg.get("linear_attn_config"), tc, cfg):
        if isinstance(obj, dict) and key in obj:
            return obj
    return None


def main(argv):
    if len(argv) < 3:
        die("usage: see the header of this file")
    d, op, args = argv[1], argv[2], argv[3:]
    if op == "remove":
        edit_tensor(d, args[0], lambda t: None)
        idx = load_index(d)
        if idx and "--keep-index" not in args:
            del idx["weight_map"][args[0]]
            save_index(d, idx)
    elif op == "shape":
        shape = [int(x) for x in args[1].split(",")] if args[1] else []
        edit_tensor(d, args[0], lambda t: (t[0], t[1], shape, fit(t[3], numel(shape) * DTYPE_SIZE[t[1]])))
    elif op == "dtype":
        dt = args[1]
        edit_tensor(d, args[0], lambda t: (t[0], dt, t[2], fit(t[3], numel(t[2]) * DTYPE_SIZE[dt])))
    elif op == "poke":
        if len(args) % 3 or not args:
            die("poke wants NAME OFFSET BYTE triples")
        for i in range(0, len(args), 3):
            name, off, val = args[i], int(args[i + 1]), int(args[i + 2])

            def poke(t, off=off, val=val):
                b = bytearray(t[3])
                if off >= len(b):
                    die("offset %d is outside %s (%d bytes)" % (off, t[0], len(b)))
                b[off] = val
                return (t[0], t[1], t[2], bytes(b))
            edit_tensor(d, name, poke)
    elif op == "setval":
        name, which, val = args[0], args[1], float(args[2])

        def setval(t):
            if t[1] not in ("F32", "BF16"):
                die("setval: %s is %s, not F32 or BF16" % (t[0], t[1]))
            es = DTYPE_SIZE[t[1]]
            enc = struct.pack("<f", val)
            enc = enc if es == 4 else enc[2:]
            b = bytearray(t[3])
            n = len(b) // es
            for i in (range(n) if which == "all" else [int(which)]):
                if i >= n:
                    die("element %d is outside %s (%d values)" % (i, t[0], n))
                b[i * es:(i + 1) * es] = enc
            return (t[0], t[1], t[2], bytes(b))
        edit_tensor(d, name, setval)
    elif op == "truncate":
        p = os.path.join(d, args[0])
        os.truncate(p, os.path.getsize(p) - int(args[1]))
    elif op == "index-move":
        idx = load_index(d)
        if args[0] not in idx["weight_map"]:
            die("no index entry " + args[0])
        idx["weight_map"][args[0]] = args[1]
        save_index(d, idx)
    elif op == "duplicate":
        src = shard_of(d, args[0])
        t = [t for t in read_shard(os.path.join(d, src))[1] if t[0] == args[0]][0]
        p = os.path.join(d, args[1])
        meta, ts = read_shard(p)
        write_shard(p, meta, ts + [t])
    elif op == "garbage-header":
        p = os.path.join(d, args[0])
        with open(p, "r+b") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            f.write(bytes((i * 37 + 11) % 251 for i in range(n)))
    elif op == "scatter-experts":
        moved = 0
        for s in shards(d):
            p = os.path.join(d, s)
            meta, ts = read_shard(p)
            experts = sorted((t for t in ts if expert_key(t[0])), key=lambda t: expert_key(t[0]))
            moved += len(experts)
            write_shard(p, meta, [t for t in ts if not expert_key(t[0])] + experts)
            # check: no expert keeps two of its tensors adjacent in the file
            order = [expert_key(t[0]) for t in read_shard(p)[1]]
            for a, b in zip(order, order[1:]):
                if a and b and a[2:] == b[2:]:
                    die("%s: expert %d of layer %d still has adjacent tensors" % (s, a[3], a[2]))
        if not moved:
            die("no expert tensors found")
    elif op in ("config", "config-del"):
        p = os.path.join(d, "config.json")
        with open(p) as f:
            cfg = json.load(f)
        holders = [o for o in (find_key(cfg, args[0]),) if o is not None]
        # the key may be duplicated (root and text_config): change every copy
        tc = cfg.get("text_config", cfg)
        for obj in (tc.get("linear_attn_config"), cfg.get("linear_attn_config"), tc, cfg):
            if isinstance(obj, dict) and args[0] in obj and not any(obj is h for h in holders):
                holders.append(obj)
        if op == "config":
            if not holders:
                holders = [tc]
            for h in holders:
                h[args[0]] = json.loads(args[1])
        else:
            if not holders:
                die("no config key " + args[0])
            for h in holders:
                del h[args[0]]
        with open(p, "w") as f:
            json.dump(cfg, f, indent=2)
    elif op == "shard-of":
        print(shard_of(d, args[0]))
    else:
        die("unknown operation " + op)


def batch(model, out, listing):
    with open(listing) as f:
        for line in f:
            words = shlex.split(line)
            if not words:
                continue
            d = os.path.join(out, words[0])
            shutil.copytree(model, d)
            main([sys.argv[0], d] + words[1:])


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--batch":
        batch(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        main(sys.argv)
