#!/usr/bin/env python3
"""phases_check.py MODEL_DIR RUN_JSON: the --json timing.prefill_phases / decode_phases of a run
(coordinator/fwd_phases.h) against the model: every phase's FLOP equals what the checkpoint's
shapes and the config give for the run's tokens (matmuls 2 x params of the trunk matrices, routed
experts 6 x I x L x top-k per MoE layer, KDA 16 x heads x head_dim^2 per KDA layer, MLA per head
the absorbed projections and the attended positions, the lm head 2 x vocab x hidden per logits
row), and the phases' wall time fits inside the span they were taken in. No speed is asserted."""
import glob, json, os, struct, sys

model, run = sys.argv[1], sys.argv[2]
cfg = json.load(open(os.path.join(model, "config.json")))
tc = cfg.get("text_config", cfg)
la = tc.get("linear_attn_config") or {}
L_ = tc["num_hidden_layers"]
mla_layers = [l - 1 for l in la.get("full_attn_layers", range(1, L_ + 1))]
n_mla, n_kda = len(mla_layers), len(la.get("kda_layers", []))
n_moe = sum(1 for l in range(L_) if l >= tc.get("first_k_dense_replace", 0) and l % tc.get("moe_layer_freq", 1) == 0)
E, V = tc["hidden_size"], tc["vocab_size"]
H, kr, rope = tc["num_attention_heads"], tc["kv_lora_rank"], tc["qk_rope_head_dim"]
nope, vd = tc["qk_nope_head_dim"], tc["v_head_dim"]

params = {"attn": 0, "moe_in": 0, "moe_out": 0, "shared": 0, "mlp": 0}
for fn in sorted(glob.glob(os.path.join(model, "*.safetensors"))):
    with open(fn, "rb") as f:
        hdr = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    for name, t in hdr.items():
        if name == "__metadata__" or len(t["shape"]) != 2:
            continue
        if (".experts." in name and "shared_experts." not in name) or any(
                s in name for s in ("embed_tokens", "lm_head", "_res_proj", "kv_b_proj")):
            continue  # routed experts, embeddings, lm head, AttnRes (mix), kv_b (MLA core) counted apart
        n = t["shape"][0] * t["shape"][1]
        part = ("shared" if "shared_experts." in name else "moe_in" if ".gate.weight" in name or "routed_expert_down" in name
                else "moe_out" if "routed_expert_up" in name else "mlp" if ".mlp." in name else "attn")
        params[part] += n

def expect(pos0, ntok, lm_rows):
    """FLOP by phase of ntok tokens at positions pos0.., lm_rows rows of logits"""
    mla = sum(2 * H * ((nope + vd) * kr + (p + 1) * (2 * kr + rope)) for p in range(pos0, pos0 + ntok)) * n_mla
    return {
        "attn_matmul": 2 * params["attn"] * ntok,
        "moe_in": 2 * params["moe_in"] * ntok, "moe_out": 2 * params["moe_out"] * ntok,
        "shared": 2 * params["shared"] * ntok, "mlp": 2 * params["mlp"] * ntok,
        "experts": 6 * tc["moe_intermediate_size"] * tc["routed_expert_hidden_size"] * tc["num_experts_per_token"] * n_moe * ntok,
        "kda_core": 16 * la.get("num_heads", 0) * la.get("head_dim", 0) ** 2 * n_kda * ntok,
        "mla_core": mla, "lm_head": 2 * V * E * lm_rows,
    }

j = json.load(open(run))
t = j["timing"]
bad = []
for span, pos0, ntok, rows, span_s in (("prefill", 0, t["prefill_tokens"], 1, t["prefill_s"]),
                                        ("decode", t["prefill_tokens"], t["decode_tokens"], t["decode_tokens"], t["decode_s"])):
    ph = t.get(span + "_phases")
    if ph is None:
        bad.append(f"no timing.{span}_phases")
        continue
    g = lambda k: ph.get(k, {}).get("gflop", 0.0)
    got = {"attn_matmul": g("kda_matmul") + g("mla_matmul"), "moe_in": g("moe_in"), "moe_out": g("moe_out"),
           "shared": g("shared"), "mlp": g("mlp"), "experts": g("experts"), "kda_core": g("kda_core"),
           "mla_core": g("mla_core"), "lm_head": g("lm_head")}
    for k, want in expect(pos0, ntok, rows).items():
        if abs(got[k] - want / 1e9) > 1e-9 * max(1.0, want / 1e9):
            bad.append(f"{span} {k}: {got[k]:.9g} GFLOP, expected {want / 1e9:.9g}")
    for k, e in ph.items():
        if min(e["wall_s"], e["cpu_s"], e["gflop"]) < 0:
            bad.append(f"{span} {k}: a negative figure {e}")
    wall = sum(e["wall_s"] for e in ph.values())
    if ntok and not (0 < wall <= span_s + 1e-6):
        bad.append(f"{span}: the phases' wall time {wall:.6f} s is not inside the span's {span_s:.6f} s")
if bad:
    print("\n".join("  " + b for b in bad))
    sys.exit(1)
print(f"phases of {run}: FLOP as the shapes give, wall time inside prefill_s and decode_s")
