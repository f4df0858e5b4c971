"""Golden outputs of Hugging Face transformers for every architecture moe2dense supports, for
tests/test_hf.c: committed in tests/golden/hf/ (`make hf-goldens`), made afresh and compared live
by `make verify-hf`. Runs in tests/ref/.venv-hf (torch + transformers, tests/ref/requirements-hf.txt).

usage: hf_goldens.py --bin BUILD/moe2dense --out DIR
       hf_goldens.py --compare NEW_DIR OLD_DIR

Per model (MODELS below):
 1. transformers' own class (Qwen3MoeForCausalLM, Qwen3ForCausalLM) from a small config that keeps
    the structural features of the real family (GQA, head_dim != hidden / heads, q/k norms, RoPE
    theta, dense layers among MoE ones, top-k renormalised or not, tied or untied embeddings);
 2. its weights from the grid generator of tests/testmodel.h (seeded per tensor name), under the
    checkpoint names transformers writes, loaded with from_pretrained and written back with
    save_pretrained: config.json and model.safetensors as transformers writes them. The golden keeps
    the config.json text and the file's sha256; tests/test_hf.c writes the same config.json,
    rebuilds model.safetensors with moe2dense's own writer and must get the same sha256;
 3. the forward in float64 (eager attention and experts) over TOKENS: full logit rows at a few positions, the
    log-sum-exp and the next token's logit at every position, and the routing of every MoE layer
    and token (top-k experts and gate weights, taken from transformers' router modules).
Students (STUDENTS below): `moe2dense calibrate` + `convert` (the binary given with --bin) on a
teacher checkpoint; transformers loads the student (goldens as in 3) and writes it back with
save_pretrained, which must give moe2dense's model.safetensors byte for byte; the student's decisions
(selected experts and groups per layer, "plan") from its moe2dense.json.
--compare: the goldens in NEW_DIR (made now) must agree with those in OLD_DIR (the committed ones) in
what holds across machines (compare_golden): checkpoints, tokens, routing and students' decisions
exactly, a student's bytes only where exact by construction, logits and calibration statistics to
tests/hfcheck.c's tolerances.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402

VOCAB = 320  # the byte-level tokenizer below has 257 tokens; the rest is padding, as in real models
N_TOKENS = 48
POSITIONS = [0, 1, 7, 23, 47]

# name -> (class, config, dtype, seed)
MODELS = {
    # Qwen3-30B-A3B's shape in small: bf16, renormalised top-k, untied, a dense layer (mlp_only_layers),
    # a dense width below k * d_e (zero-padded in the student), head_dim * heads != hidden
    "qwen3moe": ("Qwen3MoeForCausalLM", dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=48, moe_intermediate_size=32, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, rms_norm_eps=1e-6,
        max_position_embeddings=256, tie_word_embeddings=False, eos_token_id=256), torch.bfloat16, 1),
    # the other branches: f32, top-k not renormalised, tied embeddings, decoder_sparse_step 2,
    # 3 query heads on 1 kv head, eps 1e-5, default theta
    "qwen3moe-f32": ("Qwen3MoeForCausalLM", dict(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=40, moe_intermediate_size=24, num_experts=6,
        num_experts_per_tok=3, norm_topk_prob=False, decoder_sparse_step=2, mlp_only_layers=[],
        num_hidden_layers=4, num_attention_heads=3, num_key_value_heads=1, head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, rms_norm_eps=1e-5,
        max_position_embeddings=128, tie_word_embeddings=True, eos_token_id=256), torch.float32, 2),
    # dense Qwen3 (the student's family), bf16 with tied embeddings as Qwen3-0.6B
    "qwen3": ("Qwen3ForCausalLM", dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        rms_norm_eps=1e-6, max_position_embeddings=256, tie_word_embeddings=True, eos_token_id=256),
        torch.bfloat16, 3),
    # YaRN (model/rope.h) on a model: the window (48) runs past the original context (16), so the
    # interpolated frequencies and the attention factor 0.1 ln 4 + 1 matter
    "qwen3moe-yarn": ("Qwen3MoeForCausalLM", dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=32, moe_intermediate_size=16, num_experts=4,
        num_experts_per_tok=2, norm_topk_prob=True, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                             "original_max_position_embeddings": 16},
        rms_norm_eps=1e-6, max_position_embeddings=64, tie_word_embeddings=False, eos_token_id=256), torch.float32, 4),
    # OLMoE-1B-7B's shape in small: bf16, q/k norm over the whole projection, top-k not renormalised,
    # GQA (OLMoE itself has none), and clip_qkv (clamping a good part of q, k, v)
    "olmoe": ("OlmoeForCausalLM", dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=32, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=False, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, clip_qkv=1.5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, rms_norm_eps=1e-5,
        max_position_embeddings=256, tie_word_embeddings=False, eos_token_id=256, pad_token_id=1), torch.bfloat16, 5),
    # the other branches: f32, attention biases (q, k, v, o), renormalised top-k, tied embeddings
    "olmoe-bias": ("OlmoeForCausalLM", dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=16, num_experts=4, num_experts_per_tok=2,
        norm_topk_prob=True, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, attention_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, rms_norm_eps=1e-5,
        max_position_embeddings=128, tie_word_embeddings=True, eos_token_id=256, pad_token_id=1), torch.float32, 6),
    # Qwen1.5-MoE's shape in small: bf16, q/k/v biases, top-k not renormalised, the shared expert with
    # its sigmoid gate, a dense layer (mlp_only_layers) of its own width, GQA, untied embeddings
    "qwen2moe": ("Qwen2MoeForCausalLM", dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=48, moe_intermediate_size=16,
        shared_expert_intermediate_size=32, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False,
        mlp_only_layers=[1], num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, rms_norm_eps=1e-6,
        max_position_embeddings=256, tie_word_embeddings=False, eos_token_id=256), torch.bfloat16, 8),
    # the other branches: f32, no q/k/v biases (qkv_bias false), renormalised top-k, tied embeddings
    "qwen2moe-f32": ("Qwen2MoeForCausalLM", dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=32, moe_intermediate_size=8,
        shared_expert_intermediate_size=24, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, qkv_bias=False,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, rms_norm_eps=1e-6,
        max_position_embeddings=128, tie_word_embeddings=True, eos_token_id=256), torch.float32, 9),
    # DeepSeek-V2-Lite's shape in small: bf16, MLA without q LoRA (values narrower than the heads), YaRN
    # with mscale = mscale_all_dim (the softmax mscale), a first dense layer, 2 shared experts, greedy
    # top-k not renormalised
    "deepseekv2": ("DeepseekV2ForCausalLM", dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=48, moe_intermediate_size=16, n_routed_experts=8,
        n_shared_experts=2, num_experts_per_tok=2, first_k_dense_replace=1, topk_method="greedy",
        routed_scaling_factor=1.0, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
                         "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
        rms_norm_eps=1e-6, max_position_embeddings=64, tie_word_embeddings=False, eos_token_id=256), torch.bfloat16, 10),
    # DeepSeek-V2's other branches: f32, q LoRA, group-limited routing, routed_scaling_factor, one
    # shared expert, YaRN with mscale != mscale_all_dim (an attention factor too), tied embeddings
    "deepseekv2-q": ("DeepseekV2ForCausalLM", dict(
        vocab_size=VOCAB, hidden_size=32, moe_intermediate_size=8, n_routed_experts=8, n_shared_experts=1,
        num_experts_per_tok=3, first_k_dense_replace=0, topk_method="group_limited_greedy", n_group=4, topk_group=2,
        routed_scaling_factor=2.5, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
                         "mscale": 1.0, "mscale_all_dim": 0.5},
        rms_norm_eps=1e-6, max_position_embeddings=64, tie_word_embeddings=True, eos_token_id=256), torch.float32, 11),
}

# name -> (teacher, class, calibrate args, convert args). Scores that are counts (freq), round-robin
# groups and uniform scaling (alpha = 1/2, exact) keep the student independent of float rounding
# in the calibration, so every build of moe2dense converts to the same bytes.
CALIBRATE = ["--seq-len", "32", "--samples", "8", "--threads", "1"]
STUDENTS = {
    "qwen3moe-student": ("qwen3moe", "Qwen3ForCausalLM", CALIBRATE,
                         ["--scoring", "freq", "--grouping", "rr", "--scaling", "uniform", "-K", "4"]),
    "qwen3moe-student-moe": ("qwen3moe", "Qwen3MoeForCausalLM", CALIBRATE,
                             ["--target", "moe", "--scoring", "freq", "--grouping", "rr", "--scaling",
                              "uniform", "-K", "6", "--groups", "4"]),
    # OLMoE's dense student: an OlmoeForCausalLM with one expert of width k * d_e routed top-1
    "olmoe-student": ("olmoe", "OlmoeForCausalLM", CALIBRATE,
                      ["--scoring", "freq", "--grouping", "rr", "--scaling", "uniform", "-K", "4"]),
    # Qwen2-MoE's dense student: a Qwen2ForCausalLM of width k * d_e + the shared expert's, the dense
    # layer zero-padded to it
    "qwen2moe-student": ("qwen2moe", "Qwen2ForCausalLM", CALIBRATE,
                         ["--scoring", "freq", "--grouping", "rr", "--scaling", "uniform", "-K", "4"]),
    # DeepSeek-V2's dense student (paper §4.6): every layer dense of width (k + shared) * d_e, the
    # first dense layer zero-padded to it, MLA unchanged
    "deepseekv2-student": ("deepseekv2", "DeepseekV2ForCausalLM", CALIBRATE,
                           ["--scoring", "acp", "--grouping", "rr", "--scaling", "avg-cp", "-K", "4"]),
    # the smaller MoE keeps the shared expert and its gate unchanged
    "qwen2moe-student-moe": ("qwen2moe", "Qwen2MoeForCausalLM", CALIBRATE,
                             ["--target", "moe", "--scoring", "freq", "--grouping", "rr", "--scaling",
                              "uniform", "-K", "6", "--groups", "4"]),
}

# name -> (dense teacher, class, prune args): `moe2dense prune` (Minitron, convert/prune.h) of a dense
# teacher; the importance file it computed is recorded in the golden ("importance_json"), and the
# test prunes with that file, so the kept indices (and with them the bytes: every value is copied)
# are the golden's on every CPU. L1 drops a layer (layer_types cut with it), H48 cuts the tied
# embedding's columns, A1/1 keeps one of the two kv groups and one of its two query heads.
PRUNED = {
    "qwen3-pruned": ("qwen3", "Qwen3ForCausalLM",
                     ["--shape", "L1-H48-F96-A1/1", "--seq-len", "32", "--samples", "8", "--threads", "1"]),
}


# RoPE parameters (model/rope.h): config fields (Hub spelling or transformers >= 5), rotated dims,
# and what transformers derives from them: inverse frequencies, the cos/sin attention factor, and
# DeepSeek-V2's softmax mscale (yarn_apply_mscale).
ROPE_CASES = {
    "default": (dict(rope_theta=1000000.0, max_position_embeddings=4096), 32),
    "linear": (dict(rope_theta=10000.0, max_position_embeddings=4096, rope_scaling={"type": "linear", "factor": 4.0}), 16),
    # DeepSeek-V2-Lite's config.json, as on the Hub
    "yarn-deepseek-v2-lite": (dict(rope_theta=10000, max_position_embeddings=163840, rope_scaling={
        "type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
        "mscale": 0.707, "mscale_all_dim": 0.707}), 64),
    # GPT-OSS's (truncate false), in the spelling of transformers >= 5
    "yarn-gpt-oss": (dict(max_position_embeddings=131072, rope_parameters={
        "rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "truncate": False, "original_max_position_embeddings": 4096}), 64),
    # Qwen3's documented YaRN (no betas: 32 / 1)
    "yarn-qwen3": (dict(rope_theta=1000000.0, max_position_embeddings=131072, rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}), 128),
    # mscale != mscale_all_dim: an attention factor other than 1 and a softmax mscale
    "yarn-mscale": (dict(rope_theta=10000.0, max_position_embeddings=512, rope_scaling={
        "type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64, "mscale": 1.0, "mscale_all_dim": 0.5}), 16),
    # factor null: max_position_embeddings / original; attention factor given
    "yarn-implicit": (dict(max_position_embeddings=256, rope_parameters={
        "rope_type": "yarn", "factor": None, "original_max_position_embeddings": 64, "rope_theta": 10000.0,
        "attention_factor": 1.5}), 16),
}


def rope_golden(fields, dim):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import yarn_apply_mscale
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    conf = transformers.LlamaConfig(hidden_size=2 * dim, num_attention_heads=2, head_dim=dim, **fields)
    kind = conf.rope_parameters["rope_type"]
    init = LlamaRotaryEmbedding.compute_default_rope_parameters if kind == "default" else ROPE_INIT_FUNCTIONS[kind]
    inv_freq, attention_factor = init(conf)
    saved = {k: v for k, v in conf.to_diff_dict().items() if k in ("rope_parameters", "max_position_embeddings")}
    return {"config": fields, "saved_config": saved, "dim": dim, "inv_freq": inv_freq.tolist(),
            "attention_factor": float(attention_factor),
            "softmax_mscale": float(yarn_apply_mscale(conf.rope_parameters, 1.0))}


# ---- the grid generator of tests/testmodel.h ----------------------------------------------------

M64 = (1 << 64) - 1


def fnv1a64(s):
    h = 0xCBF29CE484222325
    for b in s.encode("utf-8"):
        h = ((h ^ b) * 0x100000001B3) & M64
    return h


def splitmix64(state, n):
    """The first n outputs of splitmix64 started at state (tests/testmodel.c next_u64)."""
    with np.errstate(over="ignore"):
        z = np.uint64(state) + np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def grid_tensor(name, shape, seed):
    x = splitmix64(seed ^ fnv1a64(name), int(np.prod(shape)))
    if name.endswith("norm.weight"):
        v = 1.0 + ((x >> np.uint64(59)).astype(np.int64) - 16) / 128.0
    else:
        v = ((x >> np.uint64(56)).astype(np.int64) - 128) / 512.0
    return torch.from_numpy(v.reshape(shape).astype(np.float32))


def byte_tokenizer(path):
    """Byte-level BPE: the 256 byte symbols (ids = byte values) and <|endoftext|> = 256, no merges."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    vocab = {chr(c): b for b, c in zip(bs, cs)}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(["<|endoftext|>"])
    tk.save(path)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def read_text(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def checkpoint(cls_name, cfg, dtype, seed, out):
    """transformers' class and save_pretrained, the grid generator's weights: the checkpoint in OUT."""
    cls = getattr(transformers, cls_name)
    conf = getattr(transformers, cls_name.replace("ForCausalLM", "Config"))(**cfg)
    with tempfile.TemporaryDirectory() as tmp:
        cls(conf).save_pretrained(f"{tmp}/names")  # only for the checkpoint's tensor names and shapes
        with safe_open(f"{tmp}/names/model.safetensors", "pt") as f:
            names = {k: f.get_slice(k).get_shape() for k in f.keys()}
        weights = {k: grid_tensor(k, s, seed).to(dtype) for k, s in names.items()}
        save_file(weights, f"{tmp}/names/model.safetensors", metadata={"format": "pt"})
        model = cls.from_pretrained(f"{tmp}/names", dtype=dtype)
        model.save_pretrained(out)
    with safe_open(f"{out}/model.safetensors", "pt") as f:  # what it wrote is what it was given
        assert set(f.keys()) == set(weights), f"{out}: tensors differ from the generated ones"
        for k in f.keys():
            assert torch.equal(f.get_tensor(k), weights[k]), f"{out}: {k} differs from the generated tensor"


MOE_CLASSES = ("OlmoeForCausalLM", "DeepseekV2ForCausalLM")


def moe_router(layer):
    """The MoE router module of a decoder layer (None for a dense layer, or a dense layer stored as
    one expert routed top-1)."""
    gate = getattr(layer.mlp, "gate", None)
    if isinstance(gate, torch.nn.Module) and hasattr(gate, "top_k") and getattr(gate, "num_experts", 2) > 1:
        return gate
    return None


def calib_stats(layer, x, logits, ids, gates):
    """SPEC §1's statistics of one MoE layer over the tokens, from transformers' own modules: p the
    softmax of the router logits (float64 here), S(t) and g(t) the router's top-k and native gate
    weights, f_e(x) every routed expert's output (its experts module called with all tokens routed to
    e at weight 1)."""
    n, E = logits.shape
    p = torch.softmax(logits.double(), dim=-1)
    f = torch.stack([layer.mlp.experts(x, torch.full((n, 1), e), torch.ones((n, 1), dtype=x.dtype))
                     for e in range(E)])  # [E, n, d]
    norm = f.norm(dim=-1)  # [E, n]
    st = {k: [0.0] * E for k in ("n", "sum_p", "sum_p_sel", "sum_g", "sum_g2", "sum_f", "sum_f2", "sum_gf", "sum_g2f2")}
    st["sum_p"] = p.sum(0).tolist()
    for t in range(n):
        for e, g in zip(ids[t], gates[t]):
            nf = norm[e, t].item()
            st["n"][e] += 1
            st["sum_p_sel"][e] += p[t, e].item()
            st["sum_g"][e] += g
            st["sum_g2"][e] += g * g
            st["sum_f"][e] += nf
            st["sum_f2"][e] += nf * nf
            st["sum_gf"][e] += g * nf
            st["sum_g2f2"][e] += g * g * nf * nf
    flat = f.reshape(E, -1)
    st["gram"] = (flat @ flat.T).reshape(-1).tolist()
    st["logit_gram"] = (logits.double().T @ logits.double()).reshape(-1).tolist()  # the router's, bias included
    st["mu"] = (f.sum(1) / n).reshape(-1).tolist()
    return {k: [float(f"{v:.12g}") for v in vals] for k, vals in st.items()}


def forward(cls_name, model_dir, tokens):
    """transformers' forward in float64: logits [n, V], per MoE layer the routing (ids [n, k] in
    descending gate order, ties to the lower id, and gates [n, k]) and the calibration statistics.
    Eager attention and experts: the plain code of the modelling file (the fused kernels that
    transformers picks by default take no float64)."""
    kw = {"experts_implementation": "eager"} if "Moe" in cls_name or cls_name in MOE_CLASSES else {}
    model = getattr(transformers, cls_name).from_pretrained(model_dir, dtype=torch.float64,
                                                            attn_implementation="eager", **kw)
    model.eval()
    routing, inputs, stats = {}, {}, {}
    for i, layer in enumerate(model.model.layers):
        gate = moe_router(layer)
        if gate is None:
            continue

        def pre_hook(_mod, args, i=i):
            inputs[i] = args[0].reshape(-1, args[0].shape[-1])

        def hook(_mod, _inp, out, i=i, layer=layer):
            logits, scores, idx = out
            rows = [sorted(zip(s, j), key=lambda sj: (-sj[0], sj[1])) for s, j in zip(scores.tolist(), idx.tolist())]
            ids, gates = [[j for _, j in r] for r in rows], [[s for s, _ in r] for r in rows]
            routing[i] = (ids, gates)
            stats[i] = calib_stats(layer, inputs[i], logits, ids, gates)
        layer.mlp.register_forward_pre_hook(pre_hook)
        gate.register_forward_hook(hook)
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0]
    return logits, routing, stats


def golden_record(name, cls_name, model_dir, tokens, logits, extra):
    """The fields every golden has: names, versions, EXTRA, the checkpoint's config and hash, and the
    logits (rows at POSITIONS, log-sum-exp and the next token's logit at every position)."""
    lse = torch.logsumexp(logits, dim=-1)
    return {"name": name, "class": cls_name,
            "versions": {"transformers": transformers.__version__, "torch": torch.__version__.split("+")[0]},
            **extra,
            "config_json": read_text(f"{model_dir}/config.json"),
            "safetensors_sha256": sha256(f"{model_dir}/model.safetensors"),
            "tokens": tokens,
            "positions": POSITIONS,
            "logit_rows": [[float(f"{v:.9g}") for v in logits[p].tolist()] for p in POSITIONS],
            "logsumexp": [float(f"{v:.12g}") for v in lse.tolist()],
            "next_logit": [float(f"{logits[t, tokens[t + 1]].item():.12g}") for t in range(len(tokens) - 1)]}


def goldens(name, cls_name, model_dir, tokens, extra):
    logits, routing, stats = forward(cls_name, model_dir, tokens)
    g = {**golden_record(name, cls_name, model_dir, tokens, logits, extra),
         "routing": [{"layer": l, "experts": routing[l][0],
                      "gates": [[float(f"{v:.9g}") for v in row] for row in routing[l][1]],
                      "calib_stats": stats[l]}
                     for l in sorted(routing)]}
    if not cls_name.startswith("Qwen3"):  # rebuilt by tests/test_hf.c from this list (grid generator)
        g["tensors"] = tensor_list(model_dir)
    return g


def tensor_list(model_dir):
    """[name, dtype, shape] of every tensor of the checkpoint (tests/hfcheck.c hf_build_listed)"""
    with safe_open(f"{model_dir}/model.safetensors", "pt") as f:
        return [[k, str(f.get_slice(k).get_dtype()), f.get_slice(k).get_shape()] for k in sorted(f.keys())]


def student_plan(student_dir):
    """The student's decisions from its moe2dense.json: per layer the selected experts and their
    groups. Decisions are exact on every CPU where far from ties (tests/hfcheck.c asserts the
    margin); the float plan (scores, merge weights, alpha) is not stored: the test recomputes it in
    float64 from the statistics and checks the weights within one bf16 ulp."""
    with open(f"{student_dir}/moe2dense.json", encoding="utf-8") as f:
        layers = json.load(f).get("layers", [])
    return [{"layer": x["layer"], "selected": x["selected"], "groups": x["groups"]} for x in layers]


def pruned_golden(binary, work, name, teacher, cls_name, args, calib_text, tokens):
    """`moe2dense prune` of TEACHER into WORK/NAME; transformers loads it, re-saves it unchanged, and
    gives the logits."""
    t, s, imp = f"{work}/{teacher}", f"{work}/{name}", f"{work}/{name}.importance.json"
    with open(f"{work}/calib.txt", "w", encoding="utf-8") as f:
        f.write(calib_text)
    run([binary, "prune", "--teacher", t, "--data", f"{work}/calib.txt", "--importance", imp, *args, "--out", s])
    resaved = f"{work}/{name}-resaved"
    getattr(transformers, cls_name).from_pretrained(s, dtype="auto").save_pretrained(resaved)
    with open(f"{s}/moe2dense.json", encoding="utf-8") as f:
        kept = json.load(f)["kept"]
    return goldens(name, cls_name, s, tokens, {
        "teacher": teacher, "prune": args, "calib_text": calib_text, "importance_json": read_text(imp),
        "kept": kept, "resaved_sha256": sha256(f"{resaved}/model.safetensors")})


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"hf_goldens.py: {' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()}")


def make_all(binary, out, work, only=None):
    """Every golden (ONLY: just those names, with the teachers their students need) into OUT."""
    tok_json = f"{out}/tokenizer.json"
    byte_tokenizer(tok_json)
    # tokens: the first three models' from one stream (as when the goldens began), then the
    # calibration text; every later model's from its own stream, so adding one changes no other
    rng = np.random.default_rng(7)
    tokens_of = {n: [int(t) for t in rng.integers(0, 257, N_TOKENS)] for n in ("qwen3moe", "qwen3moe-f32", "qwen3")}
    words = ["the", "expert", "router", "dense", "of", "and", "model", "token", "layer", "a", "merge", "group"]
    calib_text = " ".join(words[i] for i in rng.integers(0, len(words), 160)) + "\n"
    result = {}
    students = {n: v for n, v in STUDENTS.items() if only is None or n in only}
    pruned = {n: v for n, v in PRUNED.items() if only is None or n in only}
    wanted = None if only is None else set(only) | {v[0] for v in [*students.values(), *pruned.values()]}
    for name, (cls_name, cfg, dtype, seed) in MODELS.items():
        if wanted is not None and name not in wanted:
            continue
        tokens = tokens_of.get(name) or [int(t) for t in
                                         np.random.default_rng(fnv1a64(name) >> 32).integers(0, 257, N_TOKENS)]
        d = f"{work}/{name}"
        checkpoint(cls_name, cfg, dtype, seed, d)
        shutil.copy(tok_json, d)
        result[name] = goldens(name, cls_name, d, tokens, {"seed": seed})
    for name, (teacher, cls_name, cal, conv) in students.items():
        t, s = f"{work}/{teacher}", f"{work}/{name}"
        with open(f"{work}/calib.txt", "w", encoding="utf-8") as f:
            f.write(calib_text)
        run([binary, "calibrate", "--model", t, "--data", f"{work}/calib.txt", "--out", f"{work}/{name}.stats", *cal])
        run([binary, "convert", "--model", t, "--stats", f"{work}/{name}.stats", *conv, "--out", s])
        resaved = f"{work}/{name}-resaved"
        getattr(transformers, cls_name).from_pretrained(s, dtype="auto").save_pretrained(resaved)
        tokens = result[teacher]["tokens"]
        result[name] = goldens(name, cls_name, s, tokens, {
            "teacher": teacher, "calibrate": cal, "convert": conv, "plan": student_plan(s), "calib_text": calib_text,
            "resaved_sha256": sha256(f"{resaved}/model.safetensors")})
    for name, (teacher, cls_name, args) in pruned.items():
        result[name] = pruned_golden(binary, work, name, teacher, cls_name, args, calib_text, result[teacher]["tokens"])
    if only is None or "rope" in only:
        result["rope"] = {"name": "rope", "versions": {"transformers": transformers.__version__},
                          "cases": {k: rope_golden(*v) for k, v in ROPE_CASES.items()}}
    for name, g in result.items():
        with open(f"{out}/{name}.json", "w", encoding="utf-8") as f:
            json.dump(g, f, indent=1)
            f.write("\n")
    return result


# The tolerances of tests/hfcheck.c, which checks moe2dense against these goldens: a golden made on
# another machine is checked against the same bounds. Two float64 forwards of transformers on two
# CPUs are not the same to the last bit: the modelling code rounds to fp32 in RMSNorm and the
# softmaxes, and torch's fp32 reductions there sum in an order set by the ISA's vector width (AVX2,
# AVX-512), so values differ by fp32 roundings (~6e-8 relative) carried through the layers: ~1e-6
# in the logits, far inside hfcheck's 2e-5 (its derivation: hf_check_forward), and 1e-9 would fail on
# such noise. The calibration statistics sum those outputs over 48 tokens: hfcheck's 2e-5 relative
# to each statistic's own scale (check_calib), the counts exact (integers of the routing, which is
# compared exactly: decisions far from ties).
LOGIT_TOL = 2e-5
CALIB_TOL = 2e-5


def student_bytes_exact(g):
    """Whether student golden G's bytes are the same on every CPU by construction (hfcheck.c's
    student_bytes_exact): scores that are routed counts (freq) and uniform or no scaling; any other
    scoring or scaling is computed from calibration statistics whose last bits depend on the CPU's
    GEMM kernels, so a few merged weights may round to the other bf16 neighbour."""
    if "prune" in g:
        return True  # copies of the teacher's values at the kept indices (the golden's importance file)
    conv = g.get("convert", [])
    opt = {a: b for a, b in zip(conv, conv[1:])}
    return opt.get("--scoring") == "freq" and opt.get("--scaling", "uniform") == "uniform"


def _worst(got, want, scale):
    """max over i of |got[i] - want[i]| / scale(i) (scale: a function of i; lengths must agree)"""
    if len(got) != len(want):
        return float("inf")
    return max((abs(x - y) / max(scale(i), 1e-30) for i, (x, y) in enumerate(zip(got, want))), default=0.0)


def compare_golden(name, new_dir, old_dir, keys=("config_json", "safetensors_sha256", "tokens", "positions", "kept")):
    """What differs between golden NAME in NEW_DIR and OLD_DIR, comparing only what holds across
    machines: KEYS exactly (byte hashes of files written from fixed inputs, token ids, texts); for a
    student with a "plan" its decisions (selected experts and groups per layer) exactly, and its
    "safetensors_sha256" only where its bytes are exact by construction (student_bytes_exact); the
    routing exactly; logits to LOGIT_TOL absolute; calibration statistics (when recorded) to
    CALIB_TOL relative, the counts exactly."""
    bad = []
    with open(f"{new_dir}/{name}.json", encoding="utf-8") as f:
        g = json.load(f)
    with open(f"{old_dir}/{name}.json", encoding="utf-8") as f:
        o = json.load(f)
    float_student = "plan" in o and not student_bytes_exact(o)
    for key in keys:
        if key == "safetensors_sha256" and float_student:
            continue  # the merged weights may round differently on another CPU: the plan below instead
        if g.get(key) != o.get(key):
            bad.append(f"{name}: {key} differs")
    if ("plan" in g) != ("plan" in o) or g.get("plan") != o.get("plan"):
        bad.append(f"{name}: plan (selected experts / groups) differs")
    if [r["experts"] for r in g["routing"]] != [r["experts"] for r in o["routing"]]:
        bad.append(f"{name}: routing differs")
    new_rows, old_rows = g["logit_rows"] + [g["logsumexp"], g["next_logit"]], o["logit_rows"] + [o["logsumexp"], o["next_logit"]]
    d = float("inf") if len(new_rows) != len(old_rows) else \
        max((_worst(x, y, lambda i: 1.0) for x, y in zip(new_rows, old_rows)), default=0.0)
    if d > LOGIT_TOL:
        bad.append(f"{name}: logits differ by {d:.3g} > {LOGIT_TOL:g}")
    if len(g.get("calib", [])) != len(o.get("calib", [])):
        bad.append(f"{name}: calib differs")
    for x, y in zip(g.get("calib", []), o.get("calib", [])):
        for k in ("n", "sum_p", "sum_p_sel", "sum_g", "sum_f"):
            if k not in x and k not in y:
                continue
            tol = 0.0 if k == "n" else CALIB_TOL
            if k not in x or k not in y or _worst(x[k], y[k], lambda i, w=y[k]: abs(w[i]) if tol else 1.0) > tol:
                bad.append(f"{name}: layer {x['layer']}: calib '{k}' differs")
        # the Gram matrix relative to sqrt(G_ii G_jj) (hfcheck.c check_calib)
        gx, gy = x.get("gram", []), y.get("gram", [])
        E = int(round(len(gy) ** 0.5))
        if E * E != len(gy) or _worst(gx, gy, lambda i: (abs(gy[(i // E) * (E + 1)] * gy[(i % E) * (E + 1)])) ** 0.5) > CALIB_TOL:
            bad.append(f"{name}: layer {x['layer']}: calib 'gram' differs")
    return bad


def compare(new_dir, old_dir):
    bad = []
    with open(f"{new_dir}/rope.json", encoding="utf-8") as f, open(f"{old_dir}/rope.json", encoding="utf-8") as g:
        if json.load(f)["cases"] != json.load(g)["cases"]:
            bad.append("rope: differs")
    for name in [*MODELS, *STUDENTS, *PRUNED]:
        bad += compare_golden(name, new_dir, old_dir)
    return bad


def cli(make_all_fn, compare_fn, prog, tmp_prefix):
    """The command line both golden scripts share: --bin/--out make the goldens, --compare checks two sets."""
    ap = argparse.ArgumentParser(usage=sys.modules["__main__"].__doc__)
    ap.add_argument("--bin")
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs=2, metavar=("NEW_DIR", "OLD_DIR"))
    ap.add_argument("--only", help="comma-separated golden names to (re)make (default: all)")
    a = ap.parse_args()
    if a.compare:
        bad = compare_fn(*a.compare)
        for b in bad:
            print(f"{prog}: {b} in {a.compare[0]} and {a.compare[1]}", file=sys.stderr)
        sys.exit(1 if bad else 0)
    if not a.bin or not a.out:
        ap.error("--bin and --out are required")
    torch.manual_seed(0)
    os.makedirs(a.out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=tmp_prefix) as work:
        result = make_all_fn(os.path.abspath(a.bin), a.out, work, a.only.split(",") if a.only else None)
    for g in result.values():
        if "class" not in g:
            continue
        print(f"{g['name']}: {g['class']}, sha256 {g['safetensors_sha256'][:16]}, "
              f"{len(g['routing'])} MoE layers" + (f", re-saved {g['resaved_sha256'][:16]}" if "resaved_sha256" in g else ""))


def main():
    cli(make_all, compare, "hf_goldens.py", "m2d-hf-")


if __name__ == "__main__":
    main()
