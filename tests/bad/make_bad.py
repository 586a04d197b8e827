#!/usr/bin/env python3
"""Regenerates the bad-input corpus in tests/bad/ (the files are committed; run
this only to change the corpus): python3 tests/bad/make_bad.py

Layout (read by tests/unit/test_bad_inputs.c):
  config/NAME.json        + NAME.expect   config_parse must refuse; every line of
                                           .expect must appear in the message
  config/NAME.json        + NAME.accept   config_parse must accept (positive control)
  safetensors/NAME.safetensors + .expect / .accept   same, through safetensors_open
  checkpoint/NAME/        a model directory (shards, maybe an index) with a file
                          EXPECT or ACCEPT, through checkpoint_open
config/valid_nested.json is also the base of the per-field tests in
test_bad_inputs.c (every required key deleted / ill-typed in turn)."""
import json, os, shutil, struct

HERE = os.path.dirname(os.path.abspath(__file__))

# A small valid release-layout config (same structure as tests/models/m13).
TEXT = {
    "model_type": "kimi_linear", "hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 256,
    "rms_norm_eps": 1e-5, "hidden_act": "situ", "activation_situ_beta": 4.0,
    "activation_situ_linear_beta": 25.0, "intermediate_size": 96, "first_k_dense_replace": 1,
    "moe_layer_freq": 1, "num_experts": 8, "num_experts_per_token": 2, "num_shared_experts": 1,
    "moe_intermediate_size": 32, "routed_expert_hidden_size": 32, "latent_moe_use_norm": True,
    "moe_router_activation_func": "sigmoid", "moe_renormalize": True, "routed_scaling_factor": 1.0,
    "use_grouped_topk": True, "num_expert_group": 1, "topk_group": 1, "topk_method": "noaux_tc",
    "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 32, "kv_lora_rank": 16,
    "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "mla_use_nope": True,
    "mla_use_output_gate": True, "attn_res_block_size": 2, "num_nextn_predict_layers": 0,
    "linear_attn_config": {"full_attn_layers": [2, 4], "kda_layers": [1, 3], "num_heads": 2,
                           "head_dim": 16, "short_conv_kernel_size": 4, "gate_lower_bound": -5.0,
                           "use_full_rank_gate": True},
}
ROOT = {"model_type": "kimi_k3", "architectures": ["KimiK3ForConditionalGeneration"],
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3, "tie_word_embeddings": False,
        "vision_config": {"hidden_size": 16}, "text_config": TEXT,
        "quantization_config": {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
                                "config_groups": {"group_0": {"weights": {"group_size": 32, "num_bits": 4}}}}}


def clean(d):
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)


def write(path, data):
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def case(d, name, ext, data, expect=None):
    """expect None -> must be accepted; a str or list -> substrings of the refusal."""
    write(os.path.join(d, name + ext), data)
    if expect is None:
        write(os.path.join(d, name + ".accept"), "")
    else:
        lines = [expect] if isinstance(expect, str) else expect
        write(os.path.join(d, name + ".expect"), "".join(l + "\n" for l in lines))


def cfg(**edits):
    """A copy of ROOT with text_config (t.KEY) / linear_attn_config (l.KEY) / root (r.KEY) edits;
    value DEL deletes the key."""
    r = json.loads(json.dumps(ROOT))
    for k, v in edits.items():
        scope, key = k.split("__", 1)
        obj = {"r": r, "t": r["text_config"], "l": r["text_config"]["linear_attn_config"]}[scope]
        if v is DEL:
            del obj[key]
        else:
            obj[key] = v
    return json.dumps(r, indent=1) + "\n"


DEL = object()


def configs():
    d = os.path.join(HERE, "config")
    clean(d)
    case(d, "valid_nested", ".json", json.dumps(ROOT, indent=1) + "\n")
    flat = json.loads(json.dumps(TEXT))
    flat.update(flat.pop("linear_attn_config"))
    flat["tie_word_embeddings"] = False
    case(d, "valid_flat", ".json", json.dumps(flat, indent=1) + "\n")
    r = json.loads(json.dumps(ROOT))
    r["linear_attn_config"] = r["text_config"].pop("linear_attn_config")
    case(d, "valid_lac_at_root", ".json", json.dumps(r, indent=1) + "\n")
    case(d, "valid_no_kda_layers", ".json", cfg(l__kda_layers=DEL))
    case(d, "valid_unbounded_gate", ".json", cfg(l__gate_lower_bound=DEL))
    case(d, "valid_null_gate_bound", ".json", cfg(l__gate_lower_bound=None))
    case(d, "valid_null_bos", ".json", cfg(r__bos_token_id=None, r__pad_token_id=DEL))
    case(d, "valid_int_for_float", ".json", cfg(t__rms_norm_eps=0.5, t__activation_situ_beta=4, t__routed_scaling_factor=2))
    # syntax
    case(d, "empty", ".json", "", "invalid JSON")
    case(d, "truncated", ".json", json.dumps(ROOT)[:200], "invalid JSON")
    case(d, "not_object", ".json", "[1, 2, 3]\n", "not a JSON object")
    case(d, "trailing_garbage", ".json", json.dumps(ROOT) + " }", "invalid JSON")
    case(d, "duplicate_key", ".json", '{"text_config": {}, "text_config": {}}', ["invalid JSON", "duplicate"])
    case(d, "nan_literal", ".json", cfg().replace('"hidden_size": 64', '"hidden_size": NaN'), "invalid JSON")
    case(d, "binary_garbage", ".json", bytes(range(256)), "invalid JSON")
    case(d, "nul_in_text", ".json", cfg().replace('"situ"', '"si\x00tu"'), "invalid JSON")
    case(d, "huge_number", ".json", cfg().replace('"hidden_size": 64', '"hidden_size": 1e400'), "invalid JSON")
    case(d, "text_config_array", ".json", cfg(r__text_config=[1]), "text_config")
    case(d, "lac_not_object", ".json", cfg(t__linear_attn_config="x"), "linear_attn_config")
    # values
    case(d, "hidden_size_zero", ".json", cfg(t__hidden_size=0), "hidden_size")
    case(d, "hidden_size_negative", ".json", cfg(t__hidden_size=-64), "hidden_size")
    case(d, "hidden_size_huge", ".json", cfg(t__hidden_size=1 << 40), "hidden_size")
    case(d, "layers_too_many", ".json", cfg(t__num_hidden_layers=100000), "num_hidden_layers")
    case(d, "eps_zero", ".json", cfg(t__rms_norm_eps=0), "rms_norm_eps")
    case(d, "eps_one", ".json", cfg(t__rms_norm_eps=1.0), "rms_norm_eps")
    case(d, "eps_huge", ".json", cfg(t__rms_norm_eps=1e300), "rms_norm_eps")
    case(d, "situ_beta_negative", ".json", cfg(t__activation_situ_beta=-4.0), "SiTU")
    case(d, "experts_per_token_gt_experts", ".json", cfg(t__num_experts_per_token=9), "num_experts_per_token")
    case(d, "latent_not_multiple_32", ".json", cfg(t__routed_expert_hidden_size=48), "routed_expert_hidden_size")
    case(d, "moe_inter_not_multiple_32", ".json", cfg(t__moe_intermediate_size=40), "moe_intermediate_size")
    case(d, "moe_inter_too_small", ".json", cfg(t__moe_intermediate_size=16), "moe_intermediate_size")
    case(d, "conv_kernel_zero", ".json", cfg(l__short_conv_kernel_size=0), "short_conv_kernel_size")
    case(d, "moe_layer_freq_zero", ".json", cfg(t__moe_layer_freq=0), "moe_layer_freq")
    case(d, "bos_negative", ".json", cfg(r__bos_token_id=-1), "bos_token_id")
    case(d, "eos_string", ".json", cfg(r__eos_token_id="2"), "eos_token_id")
    # unsupported
    case(d, "hidden_act_silu", ".json", cfg(t__hidden_act="silu"), ["hidden_act", "silu"])
    case(d, "router_softmax", ".json", cfg(t__moe_router_activation_func="softmax"), "moe_router_activation_func")
    case(d, "mla_use_nope_false", ".json", cfg(t__mla_use_nope=False), "mla_use_nope")
    case(d, "expert_groups_8", ".json", cfg(t__num_expert_group=8), "num_expert_group")
    case(d, "topk_group_2", ".json", cfg(t__topk_group=2), "topk_group")
    case(d, "topk_method_greedy", ".json", cfg(t__topk_method="greedy"), "topk_method")
    case(d, "gqa", ".json", cfg(t__num_key_value_heads=1), ["num_key_value_heads", "num_attention_heads"])
    case(d, "low_rank_gate", ".json", cfg(l__use_full_rank_gate=False), "use_full_rank_gate")
    case(d, "tied_embeddings", ".json", cfg(r__tie_word_embeddings=True), "tie_word_embeddings")
    case(d, "tied_embeddings_in_text", ".json",
         cfg(r__tie_word_embeddings=DEL, t__tie_word_embeddings=True), "tie_word_embeddings")
    case(d, "quant_format", ".json",
         cfg(r__quantization_config={"format": "nvfp4-pack-quantized"}), "quantization_config")
    case(d, "quant_group_16", ".json",
         cfg(r__quantization_config={"config_groups": {"g": {"weights": {"group_size": 16}}}}), "group_size")
    case(d, "quant_not_object", ".json", cfg(r__quantization_config=[]), "quantization_config")
    # layer maps
    case(d, "full_attn_zero_based", ".json", cfg(l__full_attn_layers=[0, 2], l__kda_layers=DEL), "full_attn_layers")
    case(d, "full_attn_out_of_range", ".json", cfg(l__full_attn_layers=[2, 5], l__kda_layers=[1, 3]), ["full_attn_layers", "5"])
    case(d, "full_attn_duplicate", ".json", cfg(l__full_attn_layers=[2, 2, 4]), ["full_attn_layers", "twice"])
    case(d, "full_attn_string", ".json", cfg(l__full_attn_layers=[2, "4"]), "full_attn_layers")
    case(d, "full_attn_not_array", ".json", cfg(l__full_attn_layers=2), "full_attn_layers")
    case(d, "kda_not_complement_missing", ".json", cfg(l__kda_layers=[1]), ["kda_layers", "layer 3"])
    case(d, "kda_overlaps_full", ".json", cfg(l__kda_layers=[1, 2, 3]), "kda_layers")
    case(d, "kda_duplicate", ".json", cfg(l__kda_layers=[1, 3, 3]), "kda_layers")
    case(d, "kda_zero_based", ".json", cfg(l__kda_layers=[0, 2]), "kda_layers")
    case(d, "kda_out_of_range", ".json", cfg(l__kda_layers=[1, 3, 5]), "kda_layers")
    case(d, "kda_not_array", ".json", cfg(l__kda_layers={"1": 1}), "kda_layers")


def st_bytes(header, data=b"", hlen=None):
    hb = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(hb) if hlen is None else hlen) + hb + data


def t(dtype, shape, b, e):
    return {"dtype": dtype, "shape": shape, "data_offsets": [b, e]}


def safetensors():
    d = os.path.join(HERE, "safetensors")
    clean(d)
    E = ".safetensors"
    good = {"__metadata__": {"format": "pt"}, "w.weight": t("BF16", [2, 3], 0, 12), "n.weight": t("F32", [4], 12, 28)}
    case(d, "valid_small", E, st_bytes(good, bytes(28)))
    hb = json.dumps(good).encode()
    hb += b" " * (-len(hb) % 8)  # writers pad the header with spaces to 8 bytes
    case(d, "valid_padded_header", E, st_bytes(hb, bytes(28)))
    case(d, "valid_unordered", E, st_bytes({"b": t("U8", [4], 4, 8), "a": t("U8", [4], 0, 4)}, bytes(8)))
    case(d, "valid_empty_and_scalar", E, st_bytes({"z": t("I32", [0, 5], 0, 0), "s": t("F64", [], 0, 8)}, bytes(8)))
    case(d, "valid_no_tensors", E, st_bytes({}, b""))
    # file-level
    case(d, "short_file", E, b"\x10\x00\x00", ["short_file", "8-byte"])
    case(d, "header_len_zero", E, struct.pack("<Q", 0), ["header_len_zero", "header length"])
    case(d, "header_len_huge", E, struct.pack("<Q", 1 << 40) + b"{}", ["header_len_huge", "header length"])
    case(d, "header_len_past_eof", E, st_bytes(good, bytes(28), hlen=1000), ["header_len_past_eof", "past the end"])
    case(d, "header_len_all_ones", E, b"\xff" * 8 + b"{}", "header length")
    # JSON-level
    case(d, "garbage_header", E, st_bytes(bytes(range(1, 40))), ["garbage_header", "not valid JSON"])
    case(d, "truncated_json", E, st_bytes(json.dumps(good).encode()[:-9]), "not valid JSON")
    case(d, "header_array", E, st_bytes(b"[1,2]"), "not a JSON object")
    case(d, "nul_in_header", E, st_bytes(b'{"a\\u0000b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\0"), "not valid JSON")
    case(d, "duplicate_names", E, st_bytes(b'{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                           b'"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', bytes(2)),
         ["not valid JSON", "duplicate"])
    case(d, "nan_dim", E, st_bytes(b'{"w":{"dtype":"F32","shape":[NaN],"data_offsets":[0,4]}}', bytes(4)), "not valid JSON")
    case(d, "metadata_not_object", E, st_bytes({"__metadata__": "pt", "w": t("U8", [1], 0, 1)}, b"\0"), "__metadata__")
    case(d, "empty_name", E, st_bytes({"": t("U8", [1], 0, 1)}, b"\0"), "empty name")
    case(d, "entry_not_object", E, st_bytes({"w.weight": [1, 2]}), ["'w.weight'", "not an object"])
    # per-tensor
    case(d, "unknown_dtype", E, st_bytes({"w.weight": t("Q4_0", [4], 0, 4)}, bytes(4)), ["'w.weight'", "Q4_0"])
    case(d, "dtype_lowercase", E, st_bytes({"w.weight": t("bf16", [2], 0, 4)}, bytes(4)), ["'w.weight'", "bf16"])
    case(d, "dtype_not_string", E, st_bytes({"w.weight": t(8, [2], 0, 4)}, bytes(4)), ["'w.weight'", "dtype"])
    case(d, "dtype_missing", E, st_bytes({"w.weight": {"shape": [2], "data_offsets": [0, 4]}}, bytes(4)), ["'w.weight'", "dtype"])
    case(d, "shape_missing", E, st_bytes({"w.weight": {"dtype": "U8", "data_offsets": [0, 4]}}, bytes(4)), ["'w.weight'", "shape"])
    case(d, "shape_not_array", E, st_bytes({"w.weight": t("U8", 4, 0, 4)}, bytes(4)), ["'w.weight'", "shape"])
    case(d, "shape_negative", E, st_bytes({"w.weight": t("U8", [-4], 0, 4)}, bytes(4)), ["'w.weight'", "shape[0]"])
    case(d, "shape_float", E, st_bytes({"w.weight": t("U8", [2, 2.0], 0, 4)}, bytes(4)), ["'w.weight'", "shape[1]"])
    case(d, "shape_string", E, st_bytes({"w.weight": t("U8", ["4"], 0, 4)}, bytes(4)), ["'w.weight'", "shape[0]"])
    case(d, "shape_9_dims", E, st_bytes({"w.weight": t("U8", [1] * 9, 0, 1)}, b"\0"), ["'w.weight'", "dimensions"])
    case(d, "shape_overflow", E, st_bytes({"w.weight": t("F32", [1 << 62, 1 << 62], 0, 0)}), ["'w.weight'", "overflow"])
    case(d, "shape_overflow_elemsize", E, st_bytes({"w.weight": t("F64", [1 << 62], 0, 0)}), ["'w.weight'", "overflow"])
    case(d, "offsets_missing", E, st_bytes({"w.weight": {"dtype": "U8", "shape": [4]}}, bytes(4)), ["'w.weight'", "data_offsets"])
    case(d, "offsets_three", E, st_bytes({"w.weight": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4, 8]}}, bytes(8)),
         ["'w.weight'", "data_offsets"])
    case(d, "offsets_float", E, st_bytes({"w.weight": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4.0]}}, bytes(4)),
         ["'w.weight'", "data_offsets"])
    case(d, "offsets_negative", E, st_bytes({"w.weight": t("U8", [4], -4, 0)}, bytes(4)), ["'w.weight'", "data_offsets"])
    case(d, "offsets_reversed", E, st_bytes({"w.weight": t("U8", [4], 4, 0)}, bytes(4)), ["'w.weight'", "data_offsets"])
    case(d, "offsets_vs_shape", E, st_bytes({"w.weight": t("F32", [4], 0, 12)}, bytes(16)), ["'w.weight'", "needs 16"])
    case(d, "offsets_vs_dtype", E, st_bytes({"w.weight": t("BF16", [4], 0, 16)}, bytes(16)), ["'w.weight'", "BF16"])
    case(d, "offsets_huge", E, st_bytes({"w.weight": t("U8", [1 << 40], 0, 1 << 40)}, bytes(4)), ["'w.weight'", "past the end"])
    case(d, "truncated_data", E, st_bytes(good, bytes(20)), ["truncated_data", "'n.weight'", "truncated"])
    case(d, "overlap", E, st_bytes({"a.w": t("F32", [2], 0, 8), "b.w": t("F32", [2], 4, 12)}, bytes(12)),
         ["'a.w'", "'b.w'", "overlap"])
    case(d, "overlap_same_range", E, st_bytes({"a.w": t("U8", [4], 0, 4), "b.w": t("U8", [4], 0, 4)}, bytes(4)), "overlap")
    case(d, "overlap_contained", E, st_bytes({"a.w": t("U8", [8], 0, 8), "b.w": t("U8", [2], 2, 4)}, bytes(8)), "overlap")


def checkpoint():
    d = os.path.join(HERE, "checkpoint")
    clean(d)

    def shard(names):
        hdr, off = {}, 0
        for n in names:
            hdr[n] = t("F32", [2], off, off + 8)
            off += 8
        return st_bytes(hdr, bytes(off))

    def mk(name, shards, index=None, expect=None, raw_index=None):
        p = os.path.join(d, name)
        os.makedirs(p)
        for fn, data in shards.items():
            write(os.path.join(p, fn), data)
        if index is not None:
            write(os.path.join(p, "model.safetensors.index.json"),
                  json.dumps({"metadata": {"total_size": 0}, "weight_map": index}, indent=1) + "\n")
        if raw_index is not None:
            write(os.path.join(p, "model.safetensors.index.json"), raw_index)
        if expect is None:
            write(os.path.join(p, "ACCEPT"), "")
        else:
            lines = [expect] if isinstance(expect, str) else expect
            write(os.path.join(p, "EXPECT"), "".join(l + "\n" for l in lines))

    A, B = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    two = {A: shard(["a.x", "a.y"]), B: shard(["b.x"])}
    good_map = {"a.x": A, "a.y": A, "b.x": B}
    mk("valid_index", two, good_map)
    mk("valid_no_index", two)
    mk("valid_odd_names", {"first.safetensors": shard(["a.x"]), "zz.safetensors": shard(["b.x"])},
       {"a.x": "first.safetensors", "b.x": "zz.safetensors"})
    mk("dup_across_shards", {A: shard(["a.x", "dup.w"]), B: shard(["dup.w"])}, None, ["'dup.w'", "two shards"])
    mk("dup_across_shards_indexed", {A: shard(["a.x", "dup.w"]), B: shard(["b.x", "dup.w"])},
       {"a.x": A, "dup.w": A, "b.x": B}, ["'dup.w'", "two shards"])
    mk("index_wrong_shard", two, dict(good_map, **{"a.y": B}), ["'a.y'", "to " + B, "it is in " + A])
    mk("index_omits_a_shard", two, dict(good_map, **{"b.x": A}), ["'b.x'", "no shard contains it"])
    mk("index_missing_tensor", two, dict(good_map, **{"c.z": B}), ["'c.z'", "no shard"])
    mk("index_missing_shard", two, dict(good_map, **{"c.z": "model-00003-of-00002.safetensors"}),
       ["model-00003-of-00002.safetensors", "cannot open"])
    mk("index_path_escape", two, dict(good_map, **{"a.x": "../" + A}), ["'a.x'", "plain shard file name"])
    mk("index_no_weight_map", two, None, "weight_map", raw_index='{"metadata": {}}\n')
    mk("index_weight_map_array", two, None, "weight_map", raw_index='{"weight_map": ["a.x"]}\n')
    mk("index_not_json", two, None, ["model.safetensors.index.json", "invalid JSON"], raw_index='{"weight_map": {')
    mk("index_value_not_string", two, dict(good_map, **{"a.x": 1}), ["'a.x'", "plain shard file name"])
    mk("bad_shard_header", {A: shard(["a.x"]), B: b"\x20\0\0\0\0\0\0\0" + b"this is not json at all, no....."},
       None, [B, "not valid JSON"])
    mk("truncated_shard", {A: shard(["a.x"]), B: shard(["b.x", "b.y"])[:-3]}, None, [B, "'b.y'", "truncated"])
    mk("no_shards", {"README": b"nothing here\n"}, None, "no safetensors shards")


if __name__ == "__main__":
    configs()
    safetensors()
    checkpoint()
