#!/usr/bin/python3
"""k3ref: an independent, readable reference forward pass of the Kimi K3 text model.

Written from shared/spec/K3-MODEL.md only (no engine code).  numpy float64 throughout:
weights are decoded from the files exactly (bf16 -> f32 -> f64, F32 -> f64, MXFP4 per
spec section 2) and every activation is a float64.  Dot products are computed as
(W * x).sum(axis=1) (numpy pairwise summation, no BLAS) so results do not depend on the
BLAS build or thread count of the machine.

CLI (same contract as bin/k3, plus reference-only options):
  k3ref.py MODEL_DIR --ids 1,2,3 [--gen N] [--json FILE] [--dump-logits FILE]
           [--teacher-force] [--trap NAME] [--list-traps] [--ignore-eos]
  accepted and ignored (so the reference can stand in for the engine in scripts):
           --full-recompute --threads N --simd LEVEL
JSON: {"prompt_ids", "generated_ids", "tf_pred"} (tf_pred = argmax at every prompt position).
--dump-logits: raw little-endian float32, vocab_size floats per row, one row per position
  that produced a prediction: positions n_prompt-1 .. n_prompt+gen-2 (with --teacher-force
  from position 0).  With --gen 0 the last prompt position is the last row.
Exit status: 0 ok, 2 usage error or refused model, 1 run-time failure.
"""

import argparse
import glob
import json
import math
import os
import struct
import sys

import numpy as np


class Refusal(Exception):
    """The model directory (or the command line) is refused: exit status 2."""


# ----------------------------------------------------------------------------------------
# Traps of spec section 5: each is a plausible WRONG reading; --trap NAME computes it.
# item = the section 5 item number.  "info" traps cannot change ids by construction and are
# listed so the reason is written down (they are checked elsewhere, e.g. kernel unit tests).
# ----------------------------------------------------------------------------------------
TRAPS = [
    # name, item, description, info-only reason (None = must be caught through ids)
    ("alog_per_channel", 1, "A_log indexed per channel (A_log[j]) instead of per head (A_log[h])", None),
    ("alog_no_exp", 1, "decay rate A_log[h] used without exp()", None),
    ("unbounded_gate", 1, "Kimi Linear gate -exp(A_log)*softplus(z) although gate_lower_bound is set", None),
    ("drop_rope_dims", 2, "MLA score ignores the rope dims (q_pe . k_pe dropped)", None),
    ("rope_scale_128", 2, "MLA score scale nope^-0.5 (128^-0.5 for K3) instead of (nope+rope)^-0.5", None),
    ("apply_rope", 2, "RoPE (theta 10000, half split) applied to q_pe and k_pe", None),
    ("bias_in_weights", 3, "routing weights taken from the bias-corrected keys s+bias", None),
    ("no_bias_selection", 3, "top-k selected on the raw scores (e_score_correction_bias ignored)", None),
    ("no_renorm", 3, "routing weights not renormalised", None),
    ("nibble_swap", 4, "HIGH nibble read as the even element", None),
    ("scale_bias_128", 4, "MXFP4 scale read as 2^(b-128)", None),
    ("e2m1_neg_reversed", 4, "E2M1 codes 8..15 read as two's-complement (-6 .. -0.5 reversed)", None),
    ("scale0_zero", 4, "scale byte 0 read as 0 instead of 2^-127", "2^-127 contributions vanish in any arithmetic; kernel unit tests must pin it"),
    ("zero_based_full_attn", 5, "full_attn_layers read as zero-based", None),
    ("mla_every_4th", 5, "layer map from (L+1)%4==0 instead of the list (misses the MLA tail / irregular list)", None),
    ("situ_capped_sigmoid", 6, "SiTU sigmoid applied to the CAPPED gate", None),
    ("swiglu_dense", 6, "dense layer 0 uses SwiGLU silu(g)*u instead of SiTU", None),
    ("situ_no_up_cap", 6, "SiTU up branch not capped (u instead of 25*tanh(u/25))", None),
    ("l2norm_mean", 7, "KDA L2norm with the MEAN of squares", None),
    ("q_scale_before_norm", 7, "KDA q scaled by D^-0.5 before the L2norm (scale lost)", None),
    ("read_before_write", 7, "KDA output read from the state before the delta write", None),
    ("decay_after_write", 7, "KDA decay applied after the delta write", None),
    ("no_conv_silu", 8, "no SiLU after the short conv", None),
    ("conv_taps_reversed", 8, "conv tap 0 multiplies the current token", None),
    ("conv_state_reset", 8, "conv history not carried across decode calls", None),
    ("kda_gate_then_norm", 9, "KDA output gated before the o_norm", None),
    ("mla_norm_gate", 9, "MLA output RMS-normalised per head before the gate", None),
    ("router_on_latent", 10, "router applied to the latent zlat (first L router columns)", None),
    ("router_on_residual", 10, "router applied to the un-normalised AttnRes output h", None),
    ("latent_norm_per_expert", 10, "latent RMSNorm applied to each expert output instead of the aggregate", None),
    ("no_latent_norm", 10, "latent RMSNorm skipped", None),
    ("shared_weighted", 10, "shared MLP output scaled by the sum of the selected (raw) router scores", None),
    ("shared_on_residual", 10, "shared MLP applied to h (before post_attention_layernorm)", None),
    ("combine_sorted_by_id", 10, "expert outputs summed in expert-id order", "reordering a float64 sum moves logits by ~1e-13; a unit test of the engine combine order must pin it"),
    ("attnres_raw_keys", 11, "AttnRes keys not RMS-normalised", None),
    ("attnres_normed_values", 11, "AttnRes mixes the normalised keys instead of the raw sources", None),
    ("attnres_no_norm_weight", 11, "AttnRes score uses w_proj only (res_norm weight dropped)", None),
    ("attnres_no_clear", 11, "partial sum not cleared after a block push", None),
    ("attnres_no_embed_source", 11, "embedding not pushed as source 0 (layer 0 does not push)", None),
    ("skip_final_mix", 11, "final model-level AttnRes mix skipped (h = partial sum)", None),
    ("mla_latent_eps_rms", 0, "MLA latent norms use rms_norm_eps instead of 1e-6 (spec 4.3 note)", None),
]
TRAP_NAMES = [t[0] for t in TRAPS]

TRAP = None  # the sprung trap name, or None


def T(name):
    assert name in TRAP_NAMES, name
    return TRAP == name


# ----------------------------------------------------------------------------------------
# safetensors reader (own, validating)
# ----------------------------------------------------------------------------------------
ELEM = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "U8": 1, "I8": 1, "I16": 2, "I32": 4, "I64": 8,
        "U16": 2, "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


class TensorRef:
    def __init__(self, path, name, dtype, shape, begin, end, mm):
        self.path, self.name, self.dtype, self.shape = path, name, dtype, tuple(shape)
        self.begin, self.end, self.mm = begin, end, mm

    @property
    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def raw(self):
        return self.mm[self.begin:self.end]


def read_shard(path, tensors):
    size = os.path.getsize(path)
    if size < 8:
        raise Refusal("%s: file too short for a safetensors header" % path)
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n < 2 or n > 100 * 1024 * 1024 or 8 + n > size:
            raise Refusal("%s: header length %d not sane for a %d-byte file" % (path, n, size))
        try:
            hdr = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise Refusal("%s: header is not valid JSON (%s)" % (path, e))
    if not isinstance(hdr, dict):
        raise Refusal("%s: header is not a JSON object" % path)
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    base = 8 + n
    spans = []
    for name, meta in hdr.items():
        if name == "__metadata__":
            continue
        if not isinstance(meta, dict) or set(meta) - {"dtype", "shape", "data_offsets"}:
            raise Refusal("%s: tensor %s: malformed entry" % (path, name))
        dt, shape, offs = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
        if dt not in ELEM:
            raise Refusal("%s: tensor %s: unknown dtype %r" % (path, name, dt))
        if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
            raise Refusal("%s: tensor %s: bad shape %r" % (path, name, shape))
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs)):
            raise Refusal("%s: tensor %s: bad data_offsets %r" % (path, name, offs))
        b, e = offs
        numel = 1
        for s in shape:
            numel *= s
        if b < 0 or e < b or base + e > size:
            raise Refusal("%s: tensor %s: data_offsets %r outside the file (%d data bytes)" % (path, name, offs, size - base))
        if e - b != numel * ELEM[dt]:
            raise Refusal("%s: tensor %s: %d bytes for %s %r (expected %d)" % (path, name, e - b, dt, shape, numel * ELEM[dt]))
        if name in tensors:
            raise Refusal("tensor %s appears in %s and in %s" % (name, tensors[name].path, path))
        tensors[name] = TensorRef(path, name, dt, shape, base + b, base + e, mm)
        spans.append((b, e, name))
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise Refusal("%s: tensors %s and %s overlap" % (path, n0, n1))


def open_checkpoint(model_dir):
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    tensors = {}
    if os.path.exists(idx):
        try:
            wm = json.load(open(idx))["weight_map"]
        except (ValueError, KeyError, TypeError) as e:
            raise Refusal("%s: no usable weight_map (%s)" % (idx, e))
        files = sorted(set(wm.values()))
        for fn in files:
            p = os.path.join(model_dir, fn)
            if not os.path.exists(p):
                raise Refusal("%s names shard %s, which is missing" % (idx, fn))
            read_shard(p, tensors)
        for name, fn in wm.items():
            if name not in tensors:
                raise Refusal("index maps %s to %s but no shard holds it" % (name, fn))
            if os.path.basename(tensors[name].path) != fn:
                raise Refusal("index maps %s to %s but it is in %s" % (name, fn, tensors[name].path))
    else:
        files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
        if not files:
            raise Refusal("%s: no model.safetensors.index.json and no *.safetensors" % model_dir)
        for p in files:
            read_shard(p, tensors)
    return tensors


# ----------------------------------------------------------------------------------------
# config
# ----------------------------------------------------------------------------------------
class Config:
    def __init__(self, model_dir):
        path = os.path.join(model_dir, "config.json")
        try:
            raw = json.load(open(path))
        except (OSError, ValueError) as e:
            raise Refusal("%s: %s" % (path, e))
        self.raw = raw
        tc = raw.get("text_config", raw)
        lac = tc.get("linear_attn_config", raw.get("linear_attn_config", tc))
        self.tc, self.lac = tc, lac

        def get(key, kind, where=None):
            srcs = where or [tc]
            for s in srcs:
                if isinstance(s, dict) and key in s:
                    v = s[key]
                    if kind == "int" and (isinstance(v, bool) or not isinstance(v, int)):
                        raise Refusal("config field %s: expected an integer, got %r" % (key, v))
                    if kind == "float" and (isinstance(v, bool) or not isinstance(v, (int, float))):
                        raise Refusal("config field %s: expected a number, got %r" % (key, v))
                    if kind == "bool" and not isinstance(v, bool):
                        raise Refusal("config field %s: expected true/false, got %r" % (key, v))
                    if kind == "str" and not isinstance(v, str):
                        raise Refusal("config field %s: expected a string, got %r" % (key, v))
                    if kind == "list" and not (isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v)):
                        raise Refusal("config field %s: expected a list of integers, got %r" % (key, v))
                    return float(v) if kind == "float" else v
            raise Refusal("config field %s is missing" % key)

        kda = [lac, tc]
        self.E = get("hidden_size", "int")
        self.n_layers = get("num_hidden_layers", "int")
        self.vocab = get("vocab_size", "int")
        self.eps = get("rms_norm_eps", "float")
        act = get("hidden_act", "str")
        if act != "situ":
            raise Refusal("config hidden_act %r: only \"situ\" is implemented" % act)
        self.situ_beta = get("activation_situ_beta", "float")
        self.situ_lbeta = get("activation_situ_linear_beta", "float")
        self.I_dense = get("intermediate_size", "int")
        self.first_dense = get("first_k_dense_replace", "int")
        self.moe_freq = get("moe_layer_freq", "int")
        self.n_exp = get("num_experts", "int")
        self.topk = get("num_experts_per_token", "int")
        self.n_shared = get("num_shared_experts", "int")
        self.I_moe = get("moe_intermediate_size", "int")
        self.L_lat = get("routed_expert_hidden_size", "int")
        self.latent_norm = get("latent_moe_use_norm", "bool")
        rf = get("moe_router_activation_func", "str")
        if rf != "sigmoid":
            raise Refusal("config moe_router_activation_func %r: only sigmoid" % rf)
        self.renorm = get("moe_renormalize", "bool")
        self.rsf = get("routed_scaling_factor", "float")
        if get("use_grouped_topk", "bool"):
            if get("num_expert_group", "int") != 1:
                raise Refusal("config num_expert_group > 1 is not implemented")
            get("topk_group", "int")
        self.mla_H = get("num_attention_heads", "int")
        if get("num_key_value_heads", "int") != self.mla_H:
            raise Refusal("config num_key_value_heads != num_attention_heads (no GQA in K3)")
        self.q_lora = get("q_lora_rank", "int")
        self.kv_lora = get("kv_lora_rank", "int")
        self.nope = get("qk_nope_head_dim", "int")
        self.rope = get("qk_rope_head_dim", "int")
        self.vdim = get("v_head_dim", "int")
        if not get("mla_use_nope", "bool"):
            raise Refusal("config mla_use_nope false: only NoPE MLA is implemented")
        self.mla_gate = get("mla_use_output_gate", "bool")
        self.block = get("attn_res_block_size", "int")
        if self.block < 1:
            raise Refusal("config attn_res_block_size must be >= 1")
        full = get("full_attn_layers", "list", kda)
        kdal = get("kda_layers", "list", kda)
        nl = self.n_layers
        if T("zero_based_full_attn"):
            self.is_mla = [L in full for L in range(nl)]
        elif T("mla_every_4th"):
            self.is_mla = [(L + 1) % 4 == 0 for L in range(nl)]
        else:
            if sorted(set(full) | set(kdal)) != list(range(1, nl + 1)) or set(full) & set(kdal):
                raise Refusal("config full_attn_layers/kda_layers are not a one-based partition of 1..%d" % nl)
            self.is_mla = [(L + 1) in full for L in range(nl)]
        self.kda_H = get("num_heads", "int", kda)
        self.kda_D = get("head_dim", "int", kda)
        self.conv_K = get("short_conv_kernel_size", "int", kda)
        lb = None
        for s in kda:
            if isinstance(s, dict) and "gate_lower_bound" in s:
                lb = get("gate_lower_bound", "float", [s])
                break
        self.gate_lb = lb
        if not get("use_full_rank_gate", "bool", kda):
            raise Refusal("config use_full_rank_gate false: only the full-rank KDA output gate is implemented")
        if self.n_shared < 0 or self.topk < 1 or self.topk > self.n_exp:
            raise Refusal("config num_experts_per_token %d out of range" % self.topk)
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            v = raw.get(key, tc.get(key))
            setattr(self, key, v if isinstance(v, int) else None)

    def is_moe(self, L):
        return L >= self.first_dense and (L - self.first_dense) % self.moe_freq == 0


# ----------------------------------------------------------------------------------------
# weights
# ----------------------------------------------------------------------------------------
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)
E2M1_NEG_REV = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -6, -4, -3, -2, -1.5, -1, -0.5, -0.0], dtype=np.float64)
BIG = 1 << 24  # tensors above this many elements are not cached decoded (realwidth models)


def decode(ref, rows=None):
    """Decode an unquantised tensor (or a row range of a 2-D one) to float64."""
    raw = ref.raw()
    es = ELEM[ref.dtype]
    shape = ref.shape
    if rows is not None:
        rowlen = ref.numel // shape[0]
        raw = raw[rows[0] * rowlen * es: rows[1] * rowlen * es]
        shape = (rows[1] - rows[0],) + shape[1:]
    raw = np.asarray(raw)
    if ref.dtype == "BF16":
        x = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    elif ref.dtype == "F32":
        x = raw.view("<f4")
    elif ref.dtype == "F16":
        x = raw.view("<f2")
    elif ref.dtype == "F64":
        x = raw.view("<f8")
    else:
        raise Refusal("tensor %s: dtype %s where a float tensor is expected" % (ref.name, ref.dtype))
    return x.astype(np.float64).reshape(shape)


def decode_mxfp4(packed, scale, name):
    """packed [rows, cols/2] u8, scale [rows, cols/32] u8 -> float64 [rows, cols]."""
    p = np.asarray(packed)
    s = np.asarray(scale)
    rows, half = p.shape
    cols = half * 2
    lo, hi = p & 15, p >> 4
    if T("nibble_swap"):
        lo, hi = hi, lo
    codes = np.empty((rows, cols), dtype=np.uint8)
    codes[:, 0::2] = lo
    codes[:, 1::2] = hi
    table = E2M1_NEG_REV if T("e2m1_neg_reversed") else E2M1
    vals = table[codes]
    if np.any(s == 255):
        r, b = np.argwhere(s == 255)[0]
        raise Refusal("tensor %s: scale byte 255 (NaN in OCP MX) at row %d block %d: refused" % (name, r, b))
    exp = s.astype(np.int64) - (128 if T("scale_bias_128") else 127)
    sc = np.ldexp(1.0, exp)  # exact in float64 (2^-127 is a normal double)
    if T("scale0_zero"):
        sc[s == 0] = 0.0
    return vals * np.repeat(sc, 32, axis=1)


class Weights:
    def __init__(self, model_dir, cfg, dtype=np.float64):
        self.cfg = cfg
        self.dt = dtype
        self.t = open_checkpoint(model_dir)
        if "language_model.model.embed_tokens.weight" in self.t:
            self.pre, self.head = "language_model.model.", "language_model.lm_head.weight"
        elif "model.embed_tokens.weight" in self.t:
            self.pre, self.head = "model.", "lm_head.weight"
        else:
            raise Refusal("no language_model.model.embed_tokens.weight tensor")
        self.cache = {}
        self.check_shapes()

    # names ---------------------------------------------------------------------------
    def name(self, short):
        return self.head if short == "lm_head" else self.pre + short

    def ref(self, short):
        n = self.name(short)
        if n not in self.t:
            raise Refusal("tensor %s is missing" % n)
        return self.t[n]

    def expect(self, short, shape, dtypes=("BF16", "F32", "F16", "F64"), min_first=None):
        r = self.ref(short)
        if r.dtype not in dtypes:
            raise Refusal("tensor %s: dtype %s, expected one of %s" % (r.name, r.dtype, "/".join(dtypes)))
        if min_first is not None:
            ok = len(r.shape) == 1 and r.shape[0] >= min_first
            if not ok:
                raise Refusal("tensor %s has shape %s, expected [>=%d]" % (r.name, list(r.shape), min_first))
        elif r.shape != tuple(shape):
            raise Refusal("tensor %s has shape %s, expected %s" % (r.name, list(r.shape), list(shape)))

    def check_shapes(self):
        c = self.cfg
        E, V = c.E, c.vocab
        self.expect("embed_tokens.weight", (V, E))
        self.expect("lm_head", (V, E))
        self.expect("norm.weight", (E,))
        self.expect("output_attn_res_norm.weight", (E,))
        self.expect("output_attn_res_proj.weight", (1, E))
        H, D, K = c.kda_H, c.kda_D, c.conv_K
        P = H * D
        Hm = c.mla_H
        for L in range(c.n_layers):
            p = "layers.%d." % L
            for n in ("input_layernorm", "post_attention_layernorm", "self_attention_res_norm", "mlp_res_norm"):
                self.expect(p + n + ".weight", (E,))
            self.expect(p + "self_attention_res_proj.weight", (1, E))
            self.expect(p + "mlp_res_proj.weight", (1, E))
            a = p + "self_attn."
            if c.is_mla[L]:
                self.expect(a + "q_a_proj.weight", (c.q_lora, E))
                self.expect(a + "q_a_layernorm.weight", (c.q_lora,))
                self.expect(a + "q_b_proj.weight", (Hm * (c.nope + c.rope), c.q_lora))
                self.expect(a + "kv_a_proj_with_mqa.weight", (c.kv_lora + c.rope, E))
                self.expect(a + "kv_a_layernorm.weight", (c.kv_lora,))
                self.expect(a + "kv_b_proj.weight", (Hm * (c.nope + c.vdim), c.kv_lora))
                if c.mla_gate:
                    self.expect(a + "g_proj.weight", (Hm * c.vdim, E))
                self.expect(a + "o_proj.weight", (E, Hm * c.vdim))
            else:
                for n in ("q", "k", "v"):
                    self.expect(a + n + "_proj.weight", (P, E))
                    self.expect(a + n + "_conv1d.weight", (P, 1, K))
                self.expect(a + "f_a_proj.weight", (D, E))
                self.expect(a + "f_b_proj.weight", (P, D))
                self.expect(a + "dt_bias", (P,))
                self.expect(a + "A_log", None, min_first=H)
                self.expect(a + "b_proj.weight", (H, E))
                self.expect(a + "g_proj.weight", (P, E))
                self.expect(a + "o_norm.weight", (D,))
                self.expect(a + "o_proj.weight", (E, P))
            if c.is_moe(L):
                m = p + "block_sparse_moe."
                self.expect(m + "gate.weight", (c.n_exp, E))
                self.expect(m + "gate.e_score_correction_bias", (c.n_exp,))
                self.expect(m + "routed_expert_down_proj.weight", (c.L_lat, E))
                self.expect(m + "routed_expert_up_proj.weight", (E, c.L_lat))
                if c.latent_norm:
                    self.expect(m + "routed_expert_norm.weight", (c.L_lat,))
                if c.n_shared > 0:
                    Is = c.I_moe * c.n_shared
                    self.expect(m + "shared_experts.gate_proj.weight", (Is, E))
                    self.expect(m + "shared_experts.up_proj.weight", (Is, E))
                    self.expect(m + "shared_experts.down_proj.weight", (E, Is))
                for x in ("w1", "w2", "w3"):
                    rows, cols = (c.L_lat, c.I_moe) if x == "w2" else (c.I_moe, c.L_lat)
                    if cols % 32:
                        raise Refusal("expert %s width %d is not a multiple of 32" % (x, cols))
                for e in range(c.n_exp):
                    for x in ("w1", "w2", "w3"):
                        rows, cols = (c.L_lat, c.I_moe) if x == "w2" else (c.I_moe, c.L_lat)
                        q = m + "experts.%d.%s." % (e, x)
                        self.expect(q + "weight_packed", (rows, cols // 2), dtypes=("U8",))
                        self.expect(q + "weight_scale", (rows, cols // 32), dtypes=("U8",))
                        sc = np.asarray(self.ref(q + "weight_scale").raw())
                        if np.any(sc == 255):
                            raise Refusal("tensor %s: scale byte 255 (NaN in OCP MX): refused" % self.name(q + "weight_scale"))
            else:
                self.expect(p + "mlp.gate_proj.weight", (c.I_dense, E))
                self.expect(p + "mlp.up_proj.weight", (c.I_dense, E))
                self.expect(p + "mlp.down_proj.weight", (E, c.I_dense))

    # access ------------------------------------------------------------------------------
    def w(self, short):
        """Whole tensor, decoded (cached)."""
        if short not in self.cache:
            self.cache[short] = decode(self.ref(short)).astype(self.dt)
        return self.cache[short]

    def row(self, short, i):
        return decode(self.ref(short), rows=(i, i + 1))[0].astype(self.dt)

    def mv(self, short, x):
        """y = W x for W [out, in] (row-major, as nn.Linear)."""
        r = self.ref(short)
        if r.numel <= BIG:
            return mv(self.w(short), x)
        rows = r.shape[0]
        step = max(1, BIG // (r.numel // rows))
        out = [mv(decode(r, rows=(i, min(rows, i + step))).astype(self.dt), x) for i in range(0, rows, step)]
        return np.concatenate(out)

    def expert(self, L, e):
        key = ("expert", L, e)
        if key in self.cache:
            return self.cache[key]
        m = "layers.%d.block_sparse_moe.experts.%d." % (L, e)
        ws = []
        for x in ("w1", "w2", "w3"):
            rp, rs = self.ref(m + x + ".weight_packed"), self.ref(m + x + ".weight_scale")
            ws.append(decode_mxfp4(np.asarray(rp.raw()).reshape(rp.shape), np.asarray(rs.raw()).reshape(rs.shape),
                                   self.name(m + x)).astype(self.dt))
        if sum(a.size for a in ws) <= BIG:
            self.cache[key] = ws
        return ws


def mv(W, x):
    # Elementwise products then numpy's pairwise row sums: deterministic, BLAS-free.
    if W.dtype == np.float32:  # --dtype f32 (tolerance study): fp32 values, double sums
        return (W.astype(np.float64) * x.astype(np.float64)).sum(axis=1).astype(np.float32)
    return (W * x).sum(axis=1)


# ----------------------------------------------------------------------------------------
# math (spec section 4)
# ----------------------------------------------------------------------------------------
def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))  # exp overflow -> inf -> 0: exact limit (see seterr below)


def silu(x):
    return x * sigmoid(x)


def softplus(x):
    return np.logaddexp(0.0, x)


def msq(x):
    """mean of squares over the last axis (keeps it for broadcasting)"""
    return (x * x).sum(axis=-1, keepdims=True) / x.shape[-1]


def rmsnorm(x, w, eps):
    """RMSNorm over the last axis: w * x / sqrt(mean(x^2) + eps)"""
    return w * (x / np.sqrt(msq(x) + eps))


def l2norm(x):
    """over the last axis: x / sqrt(sum(x^2) + 1e-6)"""
    if T("l2norm_mean"):
        return x / np.sqrt(msq(x) + 1e-6)
    return x / np.sqrt((x * x).sum(axis=-1, keepdims=True) + 1e-6)


def softmax(s):
    s = np.asarray(s)
    e = np.exp(s - s.max())
    return e / e.sum()


np.seterr(over="ignore")  # sigmoid/softplus of large arguments overflow exp() harmlessly

MLA_LATENT_EPS = 1e-6  # spec 4.3: the two MLA latent norms use the class default 1e-6


class Model:
    def __init__(self, model_dir, dtype=np.float64):
        self.cfg = Config(model_dir)
        self.W = Weights(model_dir, self.cfg, dtype)
        self.dt = dtype
        self.trace = None  # list to record (layer, tag, vector) for debugging, or None
        c = self.cfg
        # AttnRes: fold w_norm * w_proj into one vector per mix (spec 4.5)
        self.res = {}
        for L in range(c.n_layers):
            for kind in ("self_attention", "mlp"):
                self.res[(L, kind)] = self.fold("layers.%d.%s_res_norm.weight" % (L, kind),
                                                "layers.%d.%s_res_proj.weight" % (L, kind))
        self.res["out"] = self.fold("output_attn_res_norm.weight", "output_attn_res_proj.weight")
        self.stop_ids = set()
        if c.eos_token_id is not None:
            self.stop_ids.add(c.eos_token_id)
        tcfg = os.path.join(model_dir, "tokenizer_config.json")
        if os.path.exists(tcfg):
            try:
                dec = json.load(open(tcfg)).get("added_tokens_decoder", {})
                for k, v in dec.items():
                    if isinstance(v, dict) and v.get("content") in ("[EOS]", "<|end_of_msg|>"):
                        self.stop_ids.add(int(k))
            except (ValueError, OSError):
                pass

    def fold(self, norm, proj):
        wn = self.W.w(norm)
        wp = self.W.w(proj)[0]
        return wp if T("attnres_no_norm_weight") else wn * wp

    # --- AttnRes -------------------------------------------------------------------------
    def mix(self, sources, c):
        eps = self.cfg.eps
        keys = [v if T("attnres_raw_keys") else v / np.sqrt(msq(v) + eps) for v in sources]
        scores = np.array([np.sum(k * c) for k in keys])
        p = softmax(scores)
        vals = keys if T("attnres_normed_values") else sources
        out = np.zeros_like(sources[0])
        for ps, v in zip(p, vals):
            out = out + ps * v
        return out

    # --- state ---------------------------------------------------------------------------
    def new_state(self):
        c = self.cfg
        st = {"pos": 0, "layers": []}
        P = c.kda_H * c.kda_D
        for L in range(c.n_layers):
            if c.is_mla[L]:
                st["layers"].append({"k_nope": [], "v": [], "k_pe": []})
            else:
                st["layers"].append({"S": np.zeros((c.kda_H, c.kda_D, c.kda_D), dtype=self.dt),
                                     "conv": np.zeros((3, c.conv_K - 1, P), dtype=self.dt)})
        return st

    def new_call(self, st):
        """A new engine call (decode step) begins: only the conv_state_reset trap cares."""
        if T("conv_state_reset"):
            for L, ls in enumerate(st["layers"]):
                if "conv" in ls:
                    ls["conv"][:] = 0.0

    # --- KDA (4.2) -----------------------------------------------------------------------
    def kda(self, L, x, ls):
        c, W = self.cfg, self.W
        H, D, K = c.kda_H, c.kda_D, c.conv_K
        a = "layers.%d.self_attn." % L
        outs = []
        for i, n in enumerate(("q", "k", "v")):
            cur = W.mv(a + n + "_proj.weight", x)
            win = np.concatenate([ls["conv"][i], cur[None, :]], axis=0)  # [K, P], last row = current
            w = W.w(a + n + "_conv1d.weight")[:, 0, :]  # [P, K]
            if T("conv_taps_reversed"):
                w = w[:, ::-1]
            y = np.zeros(H * D, dtype=self.dt)
            for t in range(K):
                y = y + w[:, t] * win[t]
            ls["conv"][i] = win[1:]
            if not T("no_conv_silu"):
                y = silu(y)
            outs.append(y.reshape(H, D))
        q, k, v = outs
        beta = sigmoid(W.mv(a + "b_proj.weight", x))  # [H]
        z = W.mv(a + "f_b_proj.weight", W.mv(a + "f_a_proj.weight", x)) + W.w(a + "dt_bias")
        z = z.reshape(H, D)
        A = W.w(a + "A_log")
        gate = sigmoid(W.mv(a + "g_proj.weight", x)).reshape(H, D)
        onw = W.w(a + "o_norm.weight")
        # decay, per channel; A_log indexed per head
        if T("alog_per_channel"):
            rate = np.exp(np.resize(A, D))[None, :]  # [1, D]: the wrong, per-channel reading
        elif T("alog_no_exp"):
            rate = A[:H, None]
        else:
            rate = np.exp(A[:H])[:, None]  # [H, 1]
        if c.gate_lb is not None and not T("unbounded_gate"):
            g = c.gate_lb * sigmoid(rate * z)
        else:
            g = -rate * softplus(z)
        alpha = np.exp(g)  # [H, D]
        if T("q_scale_before_norm"):
            q = l2norm(q * D ** -0.5)
        else:
            q = l2norm(q) * D ** -0.5
        k = l2norm(k)
        S = ls["S"]  # [H, D_k, D_v]

        def read(S, vec):  # S^T vec per head: sum over the key index j of S[h, j, :] * vec[h, j]
            return (S * vec[:, :, None]).sum(axis=1)

        if T("decay_after_write"):
            u = v - read(S, k)
            S = S + k[:, :, None] * (beta[:, None] * u)[:, None, :]
            S = alpha[:, :, None] * S
            o = read(S, q)
        else:
            S = alpha[:, :, None] * S  # S = diag(alpha) S: row j scaled by alpha_j
            u = v - read(S, k)  # u = v - S^T k
            if T("read_before_write"):
                o = read(S, q)
            S = S + k[:, :, None] * (beta[:, None] * u)[:, None, :]  # S += k (beta u)^T
            if not T("read_before_write"):
                o = read(S, q)  # o = S^T q reads the UPDATED state
        ls["S"] = S
        if T("kda_gate_then_norm"):
            o_all = rmsnorm(o * gate, onw, c.eps)
        else:
            o_all = rmsnorm(o, onw, c.eps) * gate  # per head: norm first, then gate
        return W.mv(a + "o_proj.weight", o_all.reshape(-1))

    # --- MLA (4.3) -----------------------------------------------------------------------
    def rope(self, x, pos):
        d = x.shape[-1]
        half = d // 2
        inv = 10000.0 ** (-np.arange(half, dtype=np.float64) * 2.0 / d)
        ang = pos * inv
        cos, sin = np.cos(ang), np.sin(ang)
        x1, x2 = x[..., :half], x[..., half:2 * half]
        return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)

    def mla(self, L, x, ls, pos):
        c, W = self.cfg, self.W
        H, nope, rope, vd = c.mla_H, c.nope, c.rope, c.vdim
        a = "layers.%d.self_attn." % L
        leps = c.eps if T("mla_latent_eps_rms") else MLA_LATENT_EPS
        q = W.mv(a + "q_b_proj.weight", rmsnorm(W.mv(a + "q_a_proj.weight", x), W.w(a + "q_a_layernorm.weight"), leps))
        q = q.reshape(H, nope + rope)
        cc = W.mv(a + "kv_a_proj_with_mqa.weight", x)
        c_kv, k_pe = cc[:c.kv_lora], cc[c.kv_lora:]
        kv = W.mv(a + "kv_b_proj.weight", rmsnorm(c_kv, W.w(a + "kv_a_layernorm.weight"), leps)).reshape(H, nope + vd)
        q_nope, q_pe = q[:, :nope], q[:, nope:]
        if T("apply_rope"):
            q_pe = self.rope(q_pe, pos)
            k_pe = self.rope(k_pe, pos)
        ls["k_nope"].append(kv[:, :nope])
        ls["v"].append(kv[:, nope:])
        ls["k_pe"].append(k_pe)
        Kn = np.stack(ls["k_nope"])  # [T, H, nope]
        Vv = np.stack(ls["v"])  # [T, H, vd]
        Kp = np.stack(ls["k_pe"])  # [T, rope]
        scale = (nope + rope) ** -0.5
        if T("rope_scale_128"):
            scale = nope ** -0.5
        s = (Kn * q_nope[None]).sum(axis=2)  # [T, H]
        if not T("drop_rope_dims"):
            s = s + (Kp[:, None, :] * q_pe[None]).sum(axis=2)
        s = s * scale
        p = np.exp(s - s.max(axis=0))
        p = p / p.sum(axis=0)  # softmax over positions <= t, per head
        o = (p[:, :, None] * Vv).sum(axis=0)  # [H, vd]
        if T("mla_norm_gate"):
            o = o / np.sqrt(msq(o) + c.eps)
        o = o.reshape(-1)
        if c.mla_gate:
            o = o * sigmoid(W.mv(a + "g_proj.weight", x))
        return W.mv(a + "o_proj.weight", o)

    # --- FFN (4.1, 4.4) ------------------------------------------------------------------
    def situ(self, g, u, dense=False):
        c = self.cfg
        if T("swiglu_dense") and dense:
            return silu(g) * u
        b, lb = c.situ_beta, c.situ_lbeta
        capped = b * np.tanh(g / b)
        sg = sigmoid(capped) if T("situ_capped_sigmoid") else sigmoid(g)
        up = u if T("situ_no_up_cap") else lb * np.tanh(u / lb)
        return capped * sg * up

    def dense(self, L, x):
        p = "layers.%d.mlp." % L
        W = self.W
        h = self.situ(W.mv(p + "gate_proj.weight", x), W.mv(p + "up_proj.weight", x), dense=True)
        return W.mv(p + "down_proj.weight", h)

    def moe(self, L, x, h_raw):
        c, W = self.cfg, self.W
        m = "layers.%d.block_sparse_moe." % L
        zlat = W.mv(m + "routed_expert_down_proj.weight", x)
        if T("router_on_latent"):
            Wr = W.w(m + "gate.weight")
            n = min(Wr.shape[1], zlat.shape[0])
            logits = mv(Wr[:, :n], zlat[:n])
        elif T("router_on_residual"):
            logits = W.mv(m + "gate.weight", h_raw)
        else:
            logits = W.mv(m + "gate.weight", x)
        s = sigmoid(logits)
        bias = W.w(m + "gate.e_score_correction_bias")
        key = s if T("no_bias_selection") else s + bias
        order = sorted(range(c.n_exp), key=lambda e: (-key[e], e))[:c.topk]
        w = np.array([key[e] if T("bias_in_weights") else s[e] for e in order], dtype=self.dt)
        raw_sum = float(np.sum(s[order]))
        if c.renorm and c.topk > 1 and not T("no_renorm"):
            w = w / (np.sum(w) + 1e-20)
        w = w * c.rsf
        seq = list(zip(order, w))
        if T("combine_sorted_by_id"):
            seq.sort()
        acc = np.zeros(c.L_lat, dtype=self.dt)
        nw = W.w(m + "routed_expert_norm.weight") if c.latent_norm else None
        for e, wj in seq:
            w1, w2, w3 = W.expert(L, e)
            y = mv(w2, self.situ(mv(w1, zlat), mv(w3, zlat)))
            if T("latent_norm_per_expert"):
                y = rmsnorm(y, nw, c.eps)
            acc = acc + wj * y
        if c.latent_norm and not T("latent_norm_per_expert") and not T("no_latent_norm"):
            acc = rmsnorm(acc, nw, c.eps)
        out = W.mv(m + "routed_expert_up_proj.weight", acc)
        if c.n_shared > 0:
            sx = h_raw if T("shared_on_residual") else x
            sh = W.mv(m + "shared_experts.down_proj.weight",
                      self.situ(W.mv(m + "shared_experts.gate_proj.weight", sx),
                                W.mv(m + "shared_experts.up_proj.weight", sx)))
            if T("shared_weighted"):
                sh = sh * raw_sum
            out = out + sh
        return out

    # --- one token (4.5) -----------------------------------------------------------------
    def step(self, tok, st):
        c, W = self.cfg, self.W
        if not 0 <= tok < c.vocab:
            raise Refusal("token id %d outside the vocabulary (%d)" % (tok, c.vocab))
        pos = st["pos"]
        P = W.row("embed_tokens.weight", tok)
        B = []
        for L in range(c.n_layers):
            h = P if not B else self.mix(B + [P], self.res[(L, "self_attention")])
            if L % c.block == 0:
                if T("attnres_no_embed_source") and L == 0:
                    pass
                else:
                    B.append(P)
                    if not T("attnres_no_clear"):
                        P = None
            xin = rmsnorm(h, W.w("layers.%d.input_layernorm.weight" % L), c.eps)
            ls = st["layers"][L]
            a = self.mla(L, xin, ls, pos) if c.is_mla[L] else self.kda(L, xin, ls)
            P = a if P is None else P + a
            if self.trace is not None:
                self.trace.append((L, "attn", a))
            h = self.mix(B + [P], self.res[(L, "mlp")])
            xf = rmsnorm(h, W.w("layers.%d.post_attention_layernorm.weight" % L), c.eps)
            m = self.moe(L, xf, h) if c.is_moe(L) else self.dense(L, xf)
            P = P + m
            if self.trace is not None:
                self.trace.append((L, "ffn", m))
        h = P if T("skip_final_mix") else self.mix(B + [P], self.res["out"])
        st["pos"] = pos + 1
        return W.mv("lm_head", rmsnorm(h, W.w("norm.weight"), c.eps))


def argmax(logits):
    if not np.all(np.isfinite(logits)):
        raise RuntimeError("non-finite logits")
    return int(np.argmax(logits))  # first maximum = lowest id on ties


def run(model, prompt, n_gen, ignore_eos=False):
    """Returns (tf_pred, generated, rows) with rows = logits of every fed position."""
    st = model.new_state()
    rows = []
    for tok in prompt:  # the prompt is one call
        rows.append(model.step(tok, st))
    tf_pred = [argmax(r) for r in rows]
    gen = []
    last = rows[-1]
    for i in range(n_gen):
        nxt = argmax(last)
        gen.append(nxt)
        if i == n_gen - 1 or (nxt in model.stop_ids and not ignore_eos):
            break
        model.new_call(st)
        last = model.step(nxt, st)
        rows.append(last)
    return tf_pred, gen, rows


def main(argv=None):
    global TRAP
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir", nargs="?")
    ap.add_argument("--ids")
    ap.add_argument("--gen", type=int, default=0)
    ap.add_argument("--json")
    ap.add_argument("--dump-logits")
    ap.add_argument("--teacher-force", action="store_true")
    ap.add_argument("--trap")
    ap.add_argument("--list-traps", action="store_true")
    ap.add_argument("--ignore-eos", action="store_true", help="do not stop at stop ids")
    ap.add_argument("--dtype", choices=("f64", "f32"), default="f64", help="f32: activations in float32 (tolerance study only)")
    ap.add_argument("--full-recompute", action="store_true", help="accepted, no effect")
    ap.add_argument("--threads", type=int, help="accepted, no effect")
    ap.add_argument("--simd", help="accepted, no effect")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    if args.list_traps:
        for name, item, desc, info in TRAPS:
            print("%-24s %-3s %s%s" % (name, item if item else "-", desc, ("  [info: %s]" % info) if info else ""))
        return 0
    try:
        if args.trap is not None and args.trap not in TRAP_NAMES:
            raise Refusal("unknown trap %r (see --list-traps)" % args.trap)
        TRAP = args.trap
        if not args.model_dir or not args.ids:
            raise Refusal("usage: k3ref.py MODEL_DIR --ids 1,2,3 [--gen N] ...")
        try:
            prompt = [int(t) for t in args.ids.split(",") if t.strip() != ""]
        except ValueError:
            raise Refusal("--ids: not a comma-separated list of integers")
        if not prompt:
            raise Refusal("--ids: empty prompt")
        if args.gen < 0:
            raise Refusal("--gen must be >= 0")
        model = Model(args.model_dir, np.float64 if args.dtype == "f64" else np.float32)
        tf_pred, gen, rows = run(model, prompt, args.gen, args.ignore_eos)
    except Refusal as e:
        print("k3ref: refused: %s" % e, file=sys.stderr)
        return 2
    except (RuntimeError, FloatingPointError, MemoryError) as e:
        print("k3ref: error: %s" % e, file=sys.stderr)
        return 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"prompt_ids": prompt, "generated_ids": gen, "tf_pred": tf_pred}, f)
            f.write("\n")
    if args.dump_logits:
        sel = rows if args.teacher_force else rows[len(prompt) - 1:]
        with open(args.dump_logits, "wb") as f:
            for r in sel:
                f.write(np.asarray(r, dtype="<f4").tobytes())
    print("prompt:    %s" % ",".join(map(str, prompt)))
    print("tf_pred:   %s" % ",".join(map(str, tf_pred)))
    print("generated: %s" % ",".join(map(str, gen)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
