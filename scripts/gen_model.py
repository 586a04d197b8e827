#!/usr/bin/python3
"""gen_model.py: deterministic random Kimi K3 checkpoints in the release format.

  gen_model.py --preset m13|m14b12|numa|heads|realwidth [--out DIR] [--expected-dir DIR]
               [--layers N] [--experts N] [--topk K] [--no-expected]

Writes config.json (nested: kimi_k3 / text_config kimi_linear / linear_attn_config),
model-0000N-of-0000M.safetensors shards + model.safetensors.index.json, tiktoken.model
and tokenizer_config.json, exactly as spec K3-MODEL.md section 2 describes the release.
Every byte is a function of (preset, options): a fixed PCG64 stream per tensor name, only
exactly-rounded arithmetic (no libm) between the random bits and the stored values, so two
runs (on any machine with this numpy) write identical files.

m13 / m14b12 also get expected outputs (tests/expected/<name>.json, <name>.logits.f32) from
the float64 reference scripts/k3ref.py: the first prompt of a fixed list whose greedy run
has a top-1/top-2 logit gap >= GAP_FACTOR * tolerance at every checked position.
realwidth (K3's real widths, few layers and experts, several GB) is written streaming,
tensor by tensor and chunk by chunk; it has no expected outputs.
See docs/REFERENCE.md.
"""

import argparse
import base64
import collections
import hashlib
import json
import math
import os
import re
import struct
import sys

import numpy as np

# ----------------------------------------------------------------------------------------
# presets
# ----------------------------------------------------------------------------------------
PRESETS = {
    # 13 layers, AttnRes block 3 (blocks 0-2, 3-5, 6-8, 9-11 complete, 12 partial).
    "m13": dict(E=46, layers=13, block=3, full=[4, 8, 11, 13],
                kda_H=3, kda_D=16, conv_K=4, gate_lb=-5.0,
                mla_H=2, q_lora=24, kv_lora=16, nope=16, rope=8, vdim=12,
                I_dense=96, n_exp=16, topk=4, n_shared=2, I_moe=32, L_lat=64,
                rsf=1.0, shards=3, merges=252, n_gen=24),
    # 14 layers, the real block size 12 (one complete block + a partial one) and the
    # two-MLA tail of K3 (one-based 13 and 14).
    "m14b12": dict(E=42, layers=14, block=12, full=[4, 8, 13, 14],
                   kda_H=2, kda_D=32, conv_K=4, gate_lb=-5.0,
                   mla_H=3, q_lora=32, kv_lora=24, nope=16, rope=8, vdim=16,
                   I_dense=80, n_exp=10, topk=3, n_shared=2, I_moe=32, L_lat=64,
                   rsf=1.0, shards=2, merges=252, n_gen=24),
    # Wider trunk matrices (hundreds of KiB to 2 MiB: many pages each), 3 layers: the NUMA
    # guests' placement checks (tests/t_60_numa_guests.sh; generated there, not committed).
    "numa": dict(E=512, layers=3, block=3, full=[3],
                 kda_H=4, kda_D=64, conv_K=4, gate_lb=-5.0,
                 mla_H=4, q_lora=128, kv_lora=64, nope=32, rope=16, vdim=32,
                 I_dense=2048, n_exp=8, topk=2, n_shared=1, I_moe=64, L_lat=128,
                 rsf=1.0, shards=2, merges=252, n_gen=0),
    # Expert widths that are whole 128-column groups (I_moe and L_lat), 4 layers: the lane
    # layout of MXFP4 codes the expert cache uses in resident runs on Zen 4 (tests/t_58_lanes.sh
    # and tests/t_20_model_gates.sh; generated there, not committed).
    "lanes": dict(E=64, layers=4, block=3, full=[2, 4],
                  kda_H=2, kda_D=16, conv_K=4, gate_lb=-5.0,
                  mla_H=2, q_lora=24, kv_lora=16, nope=8, rope=8, vdim=8,
                  I_dense=64, n_exp=8, topk=3, n_shared=1, I_moe=128, L_lat=128,
                  rsf=1.0, shards=1, merges=252, n_gen=12),
    # More heads than one attention job takes (MLA: 8 heads a job; KDA: per head), 4 layers:
    # the engine's head blocking against the reference (tests/t_20_model_gates.sh; generated
    # there, not committed).
    "heads": dict(E=64, layers=4, block=3, full=[2, 4],
                  kda_H=9, kda_D=16, conv_K=4, gate_lb=-5.0,
                  mla_H=19, q_lora=24, kv_lora=16, nope=8, rope=8, vdim=8,
                  I_dense=64, n_exp=8, topk=2, n_shared=1, I_moe=32, L_lat=32,
                  rsf=1.0, shards=1, merges=252, n_gen=12),
    # K3's real widths, few layers/experts: benchmarks only (not committed).
    "realwidth": dict(E=7168, layers=6, block=12, full=None,
                      kda_H=96, kda_D=128, conv_K=4, gate_lb=-5.0,
                      mla_H=96, q_lora=1536, kv_lora=512, nope=128, rope=64, vdim=128,
                      I_dense=33792, n_exp=32, topk=16, n_shared=2, I_moe=3072, L_lat=3584,
                      rsf=1.0, shards=None, merges=None, n_gen=0),
}

# Logit tolerance for the engine-vs-reference gate: absolute, on logits of magnitude ~16.
# An engine with fp32 activations and double-accumulated dots differs from this float64
# reference by ~1e-4 typically; a float32-activation run of the reference (k3ref.py
# --dtype f32, double sums, i.e. the engine's numerics) on 30 random prompts of these models
# gave a median max-error of 1.2e-4 and a worst case of 7.6e-4: KDA's o_norm re-normalises
# outputs whose q.k dot nearly cancels, so an unlucky position magnifies fp32 rounding.
# 5e-3 keeps >= 6x margin over that worst case; every trap moves logits by O(1), and a
# bf16/fp16 rounding of activations (~4e-3 relative) would still exceed it.
TOL_ABS = 5e-3
GAP_FACTOR = 10.0  # the chosen prompts have top-1/top-2 gaps >= 10 * TOL_ABS everywhere

# ----------------------------------------------------------------------------------------
# deterministic randomness: one PCG64 stream per (preset seed, tensor name)
# ----------------------------------------------------------------------------------------
SEED = "k3-gen-v1"


class Rand:
    def __init__(self, tag):
        d = hashlib.sha256((SEED + "/" + tag).encode()).digest()
        self.bg = np.random.PCG64(int.from_bytes(d[:16], "little"))

    def raw(self, n):
        return self.bg.random_raw(n).astype(np.uint64)

    def uniform(self, n):
        # 53 random bits -> [0, 1): exact
        return (self.raw(n) >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)

    def normal(self, n):
        # Irwin-Hall(4), scaled to unit variance: sums and products only (exactly rounded)
        u = self.uniform(4 * n).reshape(4, n)
        return (((u[0] + u[1]) + (u[2] + u[3])) - 2.0) * 1.7320508075688772

    def ints(self, n, lo, hi):
        return (self.raw(n) % np.uint64(hi - lo)).astype(np.int64) + lo


def f64_to_bf16_bytes(x):
    f = np.ascontiguousarray(x, dtype=np.float64).astype(np.float32)  # RNE
    u = f.view(np.uint32).astype(np.uint64)
    r = ((u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)).astype("<u2")
    return r.tobytes()


# ----------------------------------------------------------------------------------------
# tokenizer: byte-level BPE learned on a fixed English text
# ----------------------------------------------------------------------------------------
CORPUS = """\
The river runs past the old mill and into the valley, where the town keeps its market on
every second morning. People come down from the hills with cheese, apples, wool and bread,
and the children run between the stalls while their parents talk about the weather, the
price of grain and the new bridge that the council has been planning for many years.
In the spring the water rises and the meadows turn green again. The farmers open the gates
and the sheep walk slowly to the higher fields. A small school stands near the church, and
the teacher reads stories to the class in the afternoon: stories about ships and storms,
about a clever fox and a patient bear, about a girl who found a map in the attic and
followed it across the mountains to the sea.
At night the town is quiet. A few windows are still bright, and somebody is always
playing music in the house by the square. The baker starts his work before the sun comes
up; by six o'clock the smell of fresh bread fills the street, and the first customers are
already waiting at the door. He says that good bread needs time, warm hands and a little
salt, and that nobody can hurry the dough.
The station was built in 1887. Trains stop there twice a day, once in the morning and once
in the evening, and the station master writes every arrival in a large green book. He has
kept the book for thirty years. When visitors ask him about the town, he tells them to walk
along the river, to climb the hill behind the church and to look at the valley from the
top, because from there you can see the whole place at once: the roofs, the fields, the
mill, the road to the city and the silver line of the water.
Numbers matter in the market: 12 eggs, 3 loaves, 250 grams of butter, 7 apples for the
price of 5. The old women count quickly and never make a mistake. They have done this for
most of their lives, and they remember the prices of every year since the war.
When the autumn comes, the leaves fall into the river and float away to the south. The
town prepares for winter: wood is cut and stacked, windows are checked, and the long
evenings begin. People read, write letters, repair their tools and tell the same stories
again, because a good story is better the second time, and the third time it belongs to
everybody who has heard it.
"Where does the river go?" asked the youngest child. "To the sea," said her grandfather,
"and then it comes back as rain, and it falls on the hills, and it runs past the mill
again. Nothing is really lost; it only travels for a while."
On Sunday the whole family walked up to the quarry, where the stones are grey and warm in
the afternoon light, and they counted the boats that were moving slowly down the river.
"""

# Kimi's pre-tokenisation pattern (shared/spec/TOKENIZER.md) restricted to ASCII, which is
# all the corpus and the prompts contain: on ASCII text it splits exactly like the real one,
# so prompt_text encodes to prompt_ids under the engine's tokenizer too.
_CONTR = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
PRETOK = re.compile(r"[^\r\nA-Za-z0-9]?[A-Z]*[a-z]+" + _CONTR +
                    r"|[^\r\nA-Za-z0-9]?[A-Z]+[a-z]*" + _CONTR +
                    r"|[0-9]{1,3}| ?[^\sA-Za-z0-9]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def learn_bpe(n_merges):
    """Returns the list of token byte strings, rank = index (0..255 = single bytes)."""
    words = collections.Counter(tuple(bytes([b]) for b in m.group(0).encode()) for m in PRETOK.finditer(CORPUS))
    vocab = [bytes([b]) for b in range(256)]
    known = set(vocab)
    words = dict(words)
    while len(vocab) < 256 + n_merges:
        pairs = collections.Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        if best[1] < 2:
            break
        a, b = best[0]
        new = a + b
        if new not in known:
            vocab.append(new)
            known.add(new)
        nw = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(new)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            nw[tuple(out)] = nw.get(tuple(out), 0) + c
        words = nw
    return vocab


def bpe_encode(text, ranks):
    """tiktoken semantics: whole-piece lookup, else merge the lowest-rank adjacent concat."""
    ids = []
    for m in PRETOK.finditer(text):
        piece = m.group(0).encode()
        if piece in ranks:
            ids.append(ranks[piece])
            continue
        parts = [bytes([b]) for b in piece]
        while True:
            best, bi = None, -1
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and (best is None or r < best):
                    best, bi = r, i
            if best is None:
                break
            parts[bi:bi + 2] = [parts[bi] + parts[bi + 1]]
        ids.extend(ranks[p] for p in parts)
    return ids


def synthetic_vocab(n_base):
    """realwidth: 256 single bytes, then deterministic 2-, 3- and 4-byte strings."""
    vocab = [bytes([b]) for b in range(256)]
    pr = list(range(32, 127))
    for a in pr:
        for b in pr:
            vocab.append(bytes([a, b]))
    al = [ord(" ")] + list(range(ord("a"), ord("z") + 1))
    for a in al:
        for b in al:
            for c in al:
                vocab.append(bytes([a, b, c]))
    lo = list(range(ord("a"), ord("z") + 1))
    for a in lo:
        for b in lo:
            for c in lo:
                for d in lo:
                    if len(vocab) >= n_base:
                        return vocab
                    vocab.append(bytes([a, b, c, d]))
    return vocab[:n_base]


SPECIAL_NAMES = {0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>", 5: "<|sep|>",
                 254: "[UNK]", 255: "[PAD]"}


def write_tokenizer(out, vocab):
    n_base = len(vocab)
    with open(os.path.join(out, "tiktoken.model"), "wb") as f:
        for r, tok in enumerate(vocab):
            f.write(base64.b64encode(tok) + b" " + str(r).encode() + b"\n")
    dec = collections.OrderedDict()
    for k in range(256):
        i = n_base + k
        dec[str(i)] = {"content": SPECIAL_NAMES.get(k, "<|reserved_token_%d|>" % i), "lstrip": False,
                       "normalized": False, "rstrip": False, "single_word": False, "special": True}
    tc = collections.OrderedDict([
        ("added_tokens_decoder", dec),
        ("bos_token", "[BOS]"),
        ("eos_token", "<|end_of_msg|>"),
        ("pad_token", "[PAD]"),
        ("unk_token", "[UNK]"),
        ("additional_special_tokens", ["<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>"]),
        ("clean_up_tokenization_spaces", False),
        ("model_max_length", 1048576),
        ("tokenizer_class", "TikTokenTokenizer"),
    ])
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, indent=2)
        f.write("\n")


# ----------------------------------------------------------------------------------------
# config
# ----------------------------------------------------------------------------------------
def make_config(p, vocab_size, n_base):
    nl = p["layers"]
    full = p["full"]
    kda = [i for i in range(1, nl + 1) if i not in full]
    lac = collections.OrderedDict([
        ("full_attn_layers", full), ("kda_layers", kda),
        ("num_heads", p["kda_H"]), ("head_dim", p["kda_D"]),
        ("short_conv_kernel_size", p["conv_K"]), ("gate_lower_bound", p["gate_lb"]),
        ("use_full_rank_gate", True)])
    quant = collections.OrderedDict([
        ("quant_method", "compressed-tensors"),
        ("format", "mxfp4-pack-quantized"),
        ("group_size", 32),
        ("config_groups", {"group_0": collections.OrderedDict([
            ("format", "mxfp4-pack-quantized"),
            ("targets", ["re:.*block_sparse_moe\\.experts\\.\\d+\\.w[123]$"]),
            ("weights", collections.OrderedDict([("num_bits", 4), ("type", "float"), ("strategy", "group"),
                                                 ("group_size", 32), ("symmetric", True),
                                                 ("scale_dtype", "e8m0")]))])}),
        ("ignore", ["language_model.lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\..*",
                    "re:.*routed_expert_(up|down)_proj$", "re:.*block_sparse_moe\\.gate$"]),
        ("quantization_status", "compressed")])
    tc = collections.OrderedDict([
        ("model_type", "kimi_linear"),
        ("architectures", ["KimiLinearForCausalLM"]),
        ("hidden_size", p["E"]), ("num_hidden_layers", nl), ("vocab_size", vocab_size),
        ("rms_norm_eps", 1e-05), ("hidden_act", "situ"),
        ("activation_situ_beta", 4.0), ("activation_situ_linear_beta", 25.0),
        ("intermediate_size", p["I_dense"]), ("first_k_dense_replace", 1), ("moe_layer_freq", 1),
        ("num_experts", p["n_exp"]), ("num_experts_per_token", p["topk"]),
        ("num_shared_experts", p["n_shared"]), ("moe_intermediate_size", p["I_moe"]),
        ("routed_expert_hidden_size", p["L_lat"]), ("latent_moe_use_norm", True),
        ("moe_router_activation_func", "sigmoid"), ("moe_renormalize", True),
        ("routed_scaling_factor", p["rsf"]), ("use_grouped_topk", True), ("num_expert_group", 1),
        ("topk_group", 1), ("topk_method", "noaux_tc"),
        ("num_attention_heads", p["mla_H"]), ("num_key_value_heads", p["mla_H"]),
        ("q_lora_rank", p["q_lora"]), ("kv_lora_rank", p["kv_lora"]),
        ("qk_nope_head_dim", p["nope"]), ("qk_rope_head_dim", p["rope"]), ("v_head_dim", p["vdim"]),
        ("mla_use_nope", True), ("mla_use_output_gate", True),
        ("attn_res_block_size", p["block"]),
        ("linear_attn_config", lac),
        ("num_nextn_predict_layers", 0),
        ("max_position_embeddings", 1048576),
        ("bos_token_id", n_base + 0), ("eos_token_id", n_base + 2), ("pad_token_id", n_base + 255),
        ("tie_word_embeddings", False), ("torch_dtype", "bfloat16"), ("use_cache", True),
        ("quantization_config", quant),
    ])
    cfg = collections.OrderedDict([
        ("architectures", ["KimiK3ForConditionalGeneration"]),
        ("model_type", "kimi_k3"),
        ("bos_token_id", n_base + 0), ("eos_token_id", n_base + 2), ("pad_token_id", n_base + 255),
        ("tie_word_embeddings", False), ("torch_dtype", "bfloat16"),
        ("text_config", tc),
        ("vision_config", collections.OrderedDict([("model_type", "moonvit"), ("hidden_size", 64),
                                                   ("num_hidden_layers", 0), ("patch_size", 14)])),
        ("quantization_config", quant),
    ])
    return cfg


# ----------------------------------------------------------------------------------------
# tensors: (name, dtype, shape, writer) with writer(f) streaming the bytes
# ----------------------------------------------------------------------------------------
E2M1_RMS = math.sqrt(68.5 / 8.0)  # rms of the 16 E2M1 values with uniform codes


class Spec:
    def __init__(self, name, dtype, shape, gen, group=None):
        self.name, self.dtype, self.shape, self.gen = name, dtype, tuple(shape), gen
        self.group = group  # expert key: its six tensors stay together
        n = 1
        for s in shape:
            n *= s
        self.numel = n
        self.nbytes = n * {"BF16": 2, "F32": 4, "U8": 1}[dtype]


class Builder:
    def __init__(self, preset, p, fast):
        self.preset, self.p, self.fast = preset, p, fast
        self.specs = []

    def R(self, name):
        return Rand(self.preset + "/" + name)

    # exact normal values -> bf16 (small tensors)
    def bf16(self, name, shape, std, mean=0.0, rowscale=None):
        def gen(f, name=name, shape=shape, std=std, mean=mean, rowscale=rowscale):
            n = int(np.prod(shape))
            if self.fast and n > (1 << 20):
                return self.bf16_fast(f, name, n, std)
            x = self.R(name).normal(n) * std + mean
            if rowscale is not None:
                x = (x.reshape(shape[0], -1) * rowscale[:, None]).reshape(-1)
            f.write(f64_to_bf16_bytes(x))
        self.specs.append(Spec(name, "BF16", shape, gen))

    def bf16_fast(self, f, name, n, std):
        # random sign/mantissa, exponent in [e0-2, e0+1]: sane values of rms ~ std, fast
        e0 = 127 + int(math.floor(math.log2(std)))
        r = self.R(name)
        chunk = 1 << 24
        for i in range(0, n, chunk):
            m = min(chunk, n - i)
            w = r.raw((m + 3) // 4).view("<u2")[:m]
            exp = ((w >> 7) & 3).astype(np.uint16) + np.uint16(e0 - 2)
            f.write(((w & np.uint16(0x807F)) | (exp << np.uint16(7))).astype("<u2").tobytes())

    def f32(self, name, shape, values_fn):
        def gen(f, name=name, shape=shape):
            f.write(np.asarray(values_fn(self.R(name), int(np.prod(shape))), dtype="<f4").tobytes())
        self.specs.append(Spec(name, "F32", shape, gen))

    def mxfp4(self, prefix, rows, cols, target_std, group, outliers=True):
        """One MXFP4 matrix: base scale byte so that a dot with a unit-rms input of width
        cols has std ~ target_std; +-1 jitter per block; a few blocks near 0 / large."""
        base = 127 + int(round(math.log2(target_std / (E2M1_RMS * math.sqrt(cols)))))
        assert 8 < base < 240, base

        def gen_p(f, name=prefix + ".weight_packed"):
            n = rows * cols // 2
            r = self.R(name)
            chunk = 1 << 24
            for i in range(0, n, chunk):
                m = min(chunk, n - i)
                f.write(r.raw((m + 7) // 8).view(np.uint8)[:m].tobytes())

        def gen_s(f, name=prefix + ".weight_scale"):
            n = rows * cols // 32
            r = self.R(name)
            s = base + r.ints(n, -1, 2)
            if outliers:
                sel = r.ints(n, 0, 1000)
                s = np.where(sel < 25, r.ints(n, 0, 4), s)  # ~2.5 %: bytes 0..3 (2^-127..2^-124)
                s = np.where((sel >= 25) & (sel < 50), base + r.ints(n, 3, 5), s)  # ~2.5 %: 8-16x larger
            f.write(np.clip(s, 0, 254).astype(np.uint8).tobytes())

        self.specs.append(Spec(prefix + ".weight_packed", "U8", (rows, cols // 2), gen_p, group))
        self.specs.append(Spec(prefix + ".weight_scale", "U8", (rows, cols // 32), gen_s, group))


# Each layer's output projections are scaled down (OUT_SCALE) and the AttnRes score vectors
# kept moderate (RES_STD): a random network whose layers each rewrite the whole stream is
# chaotic (fp32 rounding grows ~2x per layer); with these values a float32-activation run
# stays within ~1e-4 of float64 while every trap still moves the logits by O(1).
OUT_SCALE = 0.3
RES_STD = 1.5


def build(preset, p, vocab_size, n_base):
    fast = preset == "realwidth"
    b = Builder(preset, p, fast)
    E, nl = p["E"], p["layers"]
    pre = "language_model.model."
    H, D, K = p["kda_H"], p["kda_D"], p["conv_K"]
    P = H * D
    Hm, nope, rope, vd = p["mla_H"], p["nope"], p["rope"], p["vdim"]
    full = set(p["full"])
    isq = 1.0 / math.sqrt(E)
    moe_idx = 0
    mla_idx = 0
    kda_idx = 0
    b.bf16(pre + "embed_tokens.weight", (vocab_size, E), 1.0)
    for L in range(nl):
        lp = pre + "layers.%d." % L
        b.bf16(lp + "input_layernorm.weight", (E,), 0.2, 1.0)
        b.bf16(lp + "post_attention_layernorm.weight", (E,), 0.2, 1.0)
        b.bf16(lp + "self_attention_res_norm.weight", (E,), 0.3, 1.0)
        b.bf16(lp + "self_attention_res_proj.weight", (1, E), RES_STD * isq)
        b.bf16(lp + "mlp_res_norm.weight", (E,), 0.3, 1.0)
        b.bf16(lp + "mlp_res_proj.weight", (1, E), RES_STD * isq)
        a = lp + "self_attn."
        if (L + 1) in full:
            # the first MLA layer has tiny latents so that the latent-norm eps matters
            tiny = 0.004 if mla_idx == 0 else 1.0
            mla_idx += 1
            b.bf16(a + "q_a_proj.weight", (p["q_lora"], E), isq * tiny)
            b.bf16(a + "q_a_layernorm.weight", (p["q_lora"],), 0.2, 1.0)
            b.bf16(a + "q_b_proj.weight", (Hm * (nope + rope), p["q_lora"]), 1.2 / math.sqrt(p["q_lora"]))
            rs = np.concatenate([np.full(p["kv_lora"], tiny), np.full(rope, 1.5)])
            b.bf16(a + "kv_a_proj_with_mqa.weight", (p["kv_lora"] + rope, E), isq, rowscale=rs)
            b.bf16(a + "kv_a_layernorm.weight", (p["kv_lora"],), 0.2, 1.0)
            b.bf16(a + "kv_b_proj.weight", (Hm * (nope + vd), p["kv_lora"]), 1.2 / math.sqrt(p["kv_lora"]))
            b.bf16(a + "g_proj.weight", (Hm * vd, E), 1.5 * isq)
            b.bf16(a + "o_proj.weight", (E, Hm * vd), OUT_SCALE / math.sqrt(Hm * vd))
        else:
            # every third KDA layer has small values so that the o_norm eps matters
            vstd = 0.02 if kda_idx % 3 == 2 else 1.0
            kda_idx += 1
            b.bf16(a + "q_proj.weight", (P, E), isq)
            b.bf16(a + "k_proj.weight", (P, E), isq)
            b.bf16(a + "v_proj.weight", (P, E), isq * vstd)
            for n in ("q", "k", "v"):
                b.f32(a + n + "_conv1d.weight", (P, 1, K), lambda r, n_: 0.6 * r.normal(n_))
            b.bf16(a + "f_a_proj.weight", (D, E), isq)
            b.bf16(a + "f_b_proj.weight", (P, D), 1.5 / math.sqrt(D))
            b.f32(a + "dt_bias", (P,), lambda r, n_: r.normal(n_))

            def alog(r, n_, H=H, D=D):
                # per-head log-rates spread over [-1.4, 2.1] (rates ~0.25..8), zero padded
                # to head_dim like the release (only the first H values are used)
                v = np.zeros(D)
                v[:H] = np.linspace(-1.4, 2.1, H) + 0.15 * r.normal(H)
                return v
            b.f32(a + "A_log", (D,), alog)
            b.bf16(a + "b_proj.weight", (H, E), 1.5 * isq)
            b.bf16(a + "g_proj.weight", (P, E), 1.5 * isq)
            b.bf16(a + "o_norm.weight", (D,), 0.3, 1.0)
            b.bf16(a + "o_proj.weight", (E, P), OUT_SCALE / math.sqrt(P))
        if L == 0:
            I = p["I_dense"]
            b.bf16(lp + "mlp.gate_proj.weight", (I, E), 6.0 * isq)   # |g| > 4 often
            b.bf16(lp + "mlp.up_proj.weight", (I, E), 30.0 * isq)    # |u| > 25 often
            b.bf16(lp + "mlp.down_proj.weight", (E, I), OUT_SCALE / (30.0 * math.sqrt(I)))
        else:
            m = lp + "block_sparse_moe."
            ne, Ll, Im = p["n_exp"], p["L_lat"], p["I_moe"]
            b.bf16(m + "gate.weight", (ne, E), 1.5 * isq)
            b.f32(m + "gate.e_score_correction_bias", (ne,), lambda r, n_: 0.25 * r.normal(n_))
            b.bf16(m + "routed_expert_down_proj.weight", (Ll, E), isq)
            b.bf16(m + "routed_expert_up_proj.weight", (E, Ll), OUT_SCALE / math.sqrt(Ll))
            b.bf16(m + "routed_expert_norm.weight", (Ll,), 0.2, 1.0)
            Is = Im * p["n_shared"]
            b.bf16(m + "shared_experts.gate_proj.weight", (Is, E), 4.0 * isq)
            b.bf16(m + "shared_experts.up_proj.weight", (Is, E), 20.0 * isq)
            b.bf16(m + "shared_experts.down_proj.weight", (E, Is), OUT_SCALE * 0.5 / (20.0 * math.sqrt(Is)))
            # even MoE layers: expert outputs ~3e-3 so the latent-norm eps matters
            y_std = 3e-3 if moe_idx % 2 == 0 else 1.0
            moe_idx += 1
            for e in range(ne):
                x = m + "experts.%d." % e
                g = (L, e)
                b.mxfp4(x + "w1", Im, Ll, 6.0, g)    # gate: SiTU cap engaged
                b.mxfp4(x + "w2", Ll, Im, y_std / 30.0, g)
                b.mxfp4(x + "w3", Im, Ll, 30.0, g)   # up: |u| > 25 often
    b.bf16(pre + "norm.weight", (E,), 0.2, 1.0)
    b.bf16(pre + "output_attn_res_norm.weight", (E,), 0.3, 1.0)
    b.bf16(pre + "output_attn_res_proj.weight", (1, E), RES_STD * isq)
    b.bf16("language_model.lm_head.weight", (vocab_size, E), 4.0 * isq)
    return b.specs


# ----------------------------------------------------------------------------------------
# shards
# ----------------------------------------------------------------------------------------
def layer_of(name):
    m = re.search(r"\.layers\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def assign_shards(specs, p):
    nl = p["layers"]
    if p["shards"] is None:  # realwidth: embed | one per layer | head
        S = nl + 2

        def shard(s):
            L = layer_of(s.name)
            if L is not None:
                return L + 1
            return 0 if "embed_tokens" in s.name else S - 1
    else:
        S = p["shards"]

        def lshard(L):
            return L * S // nl

        def shard(s):
            L = layer_of(s.name)
            if L is None:
                return 0 if "embed_tokens" in s.name else S - 1
            sh = lshard(L)
            # the experts of the last layer of a shard live in the next shard: a layer
            # split across files (each expert's six tensors still back to back)
            if s.group is not None and sh < S - 1 and lshard(L + 1) != sh:
                sh += 1
            return sh
    out = [[] for _ in range(S)]
    for s in specs:
        out[shard(s)].append(s)
    # within a shard: F32, then BF16, then U8 expert runs (keeps every tensor aligned)
    order = {"F32": 0, "BF16": 1, "U8": 2}
    return [sorted(lst, key=lambda s: order[s.dtype]) for lst in out]  # stable


def write_shards(out, shards):
    S = len(shards)
    wmap = {}
    total = 0
    for i, lst in enumerate(shards):
        fn = "model-%05d-of-%05d.safetensors" % (i + 1, S)
        hdr = collections.OrderedDict([("__metadata__", {"format": "pt"})])
        off = 0
        for s in lst:
            hdr[s.name] = collections.OrderedDict([("dtype", s.dtype), ("shape", list(s.shape)),
                                                   ("data_offsets", [off, off + s.nbytes])])
            off += s.nbytes
            wmap[s.name] = fn
            total += s.nbytes
        hb = json.dumps(hdr, separators=(",", ":")).encode()
        hb += b" " * ((8 - (8 + len(hb)) % 8) % 8)
        with open(os.path.join(out, fn), "wb") as f:
            f.write(struct.pack("<Q", len(hb)))
            f.write(hb)
            for s in lst:
                start = f.tell()
                s.gen(f)
                if f.tell() - start != s.nbytes:
                    raise SystemExit("internal error: %s wrote %d bytes, expected %d" % (s.name, f.tell() - start, s.nbytes))
    idx = collections.OrderedDict([("metadata", {"total_size": total}),
                                   ("weight_map", collections.OrderedDict(sorted(wmap.items())))])
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump(idx, f, indent=2)
        f.write("\n")
    return total


# ----------------------------------------------------------------------------------------
# expected outputs (reference)
# ----------------------------------------------------------------------------------------
PROMPTS = [
    "The river runs past the old mill and",
    "In the spring the water rises and the",
    "The baker starts his work before the sun",
    "When visitors ask him about the town, he",
    "The station was built in 1887. Trains",
    "At night the town is quiet. A few",
    "The old women count quickly and never",
    "A good story is better the second time",
    "Where does the river go? asked the child",
    "The teacher reads stories to the class",
    "People come down from the hills with",
    "The farmers open the gates and the sheep",
]


def gaps(rows):
    out = []
    for r in rows:
        t = np.sort(np.asarray(r, dtype=np.float64))
        out.append(float(t[-1] - t[-2]))
    return out


def write_expected(name, model_dir, exp_dir, p, ranks, stop_ids):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import k3ref
    k3ref.TRAP = None
    model = k3ref.Model(model_dir)
    cands = [(t, bpe_encode(t, ranks)) for t in PROMPTS]
    r = Rand(name + "/prompts")
    n_base = len(ranks)
    for i in range(40):
        cands.append((None, [int(v) for v in r.ints(10, 0, n_base)]))
    n_gen = p["n_gen"]
    for text, ids in cands:
        if any(t in stop_ids for t in ids):
            continue
        tf, gen, rows = k3ref.run(model, ids, n_gen, ignore_eos=True)
        if len(gen) != n_gen or any(t in stop_ids for t in gen):
            continue
        g = gaps(rows)
        if min(g) < GAP_FACTOR * TOL_ABS:
            continue
        break
    else:
        raise SystemExit("no prompt satisfies the gap criterion")
    os.makedirs(exp_dir, exist_ok=True)
    lf = name + ".logits.f32"
    with open(os.path.join(exp_dir, lf), "wb") as f:
        for row in rows:
            f.write(np.asarray(row, dtype="<f4").tobytes())
    mg = min(g)
    doc = collections.OrderedDict([
        ("model", "tests/models/" + name),
        ("prompt_text", text),
        ("prompt_ids", ids),
        ("tf_pred", tf),
        ("generated_ids", gen),
        ("n_gen", n_gen),
        ("logits_file", lf),
        ("logits_rows", len(rows)),
        ("logits_first_position", 0),
        ("vocab_size", int(len(rows[0]))),
        ("tolerance_abs", TOL_ABS),
        ("tolerance_note", "max |logit_engine - logit_ref| allowed (absolute). fp32 activations with double "
                           "accumulation typically differ by ~1e-4, worst seen 7.6e-4; see docs/REFERENCE.md"),
        ("min_top1_top2_gap", round(mg, 6)),
        ("min_gap_position", int(np.argmin(g))),
        ("max_abs_logit", round(float(max(np.max(np.abs(rw)) for rw in rows)), 6)),
    ])
    with open(os.path.join(exp_dir, name + ".json"), "w") as f:
        f.write("{\n" + ",\n".join("  %s: %s" % (json.dumps(k), json.dumps(v)) for k, v in doc.items()) + "\n}\n")
    return doc


# ----------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description="deterministic random K3 checkpoints")
    ap.add_argument("--preset", required=True, choices=sorted(PRESETS))
    ap.add_argument("--out")
    ap.add_argument("--expected-dir")
    ap.add_argument("--no-expected", action="store_true")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--experts", type=int)
    ap.add_argument("--topk", type=int)
    args = ap.parse_args()
    name = args.preset
    p = dict(PRESETS[name])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if args.layers:
        p["layers"] = args.layers
    if args.experts:
        p["n_exp"] = args.experts
    if args.topk:
        p["topk"] = args.topk
    if p["topk"] > p["n_exp"]:
        raise SystemExit("--topk > --experts")
    if p["full"] is None:  # realwidth: the last two layers are MLA (K3's tail)
        p["full"] = [p["layers"] - 1, p["layers"]]
    p["full"] = [i for i in p["full"] if i <= p["layers"]]
    if p["layers"] < 3 or 1 in p["full"]:
        raise SystemExit("need >= 3 layers with layer 0 KDA")
    out = args.out
    exp_dir = args.expected_dir
    if out is None:
        if name == "realwidth":
            raise SystemExit("--out is required for realwidth")
        out = os.path.join(root, "tests", "models", name)
        if exp_dir is None:
            exp_dir = os.path.join(root, "tests", "expected")
    os.makedirs(out, exist_ok=True)
    for fn in os.listdir(out):  # remove stale shards of another layout
        if fn.endswith(".safetensors"):
            os.unlink(os.path.join(out, fn))
    if p["merges"] is not None:
        vocab = learn_bpe(p["merges"])
    else:
        vocab = synthetic_vocab(163584)
    n_base = len(vocab)
    vocab_size = n_base + 256
    write_tokenizer(out, vocab)
    cfg = make_config(p, vocab_size, n_base)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    specs = build(name, p, vocab_size, n_base)
    shards = assign_shards(specs, p)
    total = write_shards(out, shards)
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print("%s: %d layers, E=%d, vocab %d (%d BPE ranks), %d experts top-%d, %d shards, "
          "%d tensor bytes, %d bytes on disk" % (name, p["layers"], p["E"], vocab_size, n_base, p["n_exp"],
                                                p["topk"], len(shards), total, size))
    if exp_dir and not args.no_expected and p["n_gen"] > 0:
        ranks = {t: i for i, t in enumerate(vocab)}
        doc = write_expected(name, out, exp_dir, p, ranks, {n_base + 1, n_base + 2})
        print("expected: prompt %s, %d generated, min gap %.4f (tolerance %g)" % (
            doc["prompt_ids"], len(doc["generated_ids"]), doc["min_top1_top2_gap"], TOL_ABS))


if __name__ == "__main__":
    main()
