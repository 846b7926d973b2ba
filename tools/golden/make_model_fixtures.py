#!/usr/bin/env python3
"""Golden fixtures for the CPU engine, made by Hugging Face transformers (an implementation we did not write).

For each tiny model: random weights rounded to bf16, saved as a Hugging Face checkpoint with per-expert tensor
names as published checkpoints have them; fixed prompts; greedy continuations from `generate`; and the float32
logits of one full forward over prompt + greedy[:-1] (rows 0..len-1 check the prompt forward, the last N rows each
decode step). Runs on the CPU in float32 (no TF32), so the logits are exact fp32 references.

Usage: python3 tools/golden/make_model_fixtures.py --out tests/data/golden
"""
import argparse
import json
import math
import os
import re

import torch
import transformers
from safetensors.torch import save_file

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

VOCAB = 320
PROMPT_LENS = [5, 12, 19, 27]
NEW_TOKENS = 8


def glm5_tiny():
    from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

    cfg = GlmMoeDsaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1, n_group=1, topk_group=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
        first_k_dense_replace=1, index_topk=8, index_head_dim=16, index_n_heads=16,
        indexer_types=["full", "full", "shared", "full"], max_position_embeddings=256, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, bos_token_id=0, eos_token_id=[1, 2],
        tie_word_embeddings=False,
    )
    return "glm5_tiny", cfg, GlmMoeDsaForCausalLM


def deepseek_v3_tiny():
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1, n_group=4, topk_group=2,
        routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
        max_position_embeddings=256, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0,
                         "mscale": 1.0, "mscale_all_dim": 1.0},
        rope_interleave=True, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
    )
    return "deepseek_v3_tiny", cfg, DeepseekV3ForCausalLM


def deepseek_v3_tiny_qproj():
    """q_lora_rank null (q_proj), non-interleaved RoPE, softmax-free default rope: the other spellings."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1,
        routed_scaling_factor=1.0, norm_topk_prob=False, first_k_dense_replace=1,
        max_position_embeddings=256, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
        rope_interleave=False, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
    )
    return "deepseek_v3_tiny_qproj", cfg, DeepseekV3ForCausalLM


def randomize(model, gen):
    """Weights large enough that greedy decisions have clear margins; every matrix rounded to bf16."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                fan_in = p.shape[-1]
                std = 1.0 / math.sqrt(fan_in)
                if name.endswith("lm_head.weight"):
                    std *= 4.0
                if "embed_tokens" in name:
                    std = 1.0
                p.copy_(torch.randn(p.shape, generator=gen) * std)
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
            else:  # norm weights
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=gen) * 0.5)


def published_state_dict(model):
    """Per-expert names as published checkpoints store them; bf16 except the router bias (f32)."""
    out = {}
    sd = model.state_dict()
    for k, v in sd.items():
        if "rotary_emb" in k or k.endswith("inv_freq") or "_cached_keys" in k:
            continue
        m = re.match(r"(.*\.mlp\.experts)\.gate_up_proj$", k)
        if m:
            n_exp, two_i, _ = v.shape
            inter = two_i // 2
            for e in range(n_exp):
                out[f"{m.group(1)}.{e}.gate_proj.weight"] = v[e, :inter].contiguous()
                out[f"{m.group(1)}.{e}.up_proj.weight"] = v[e, inter:].contiguous()
            continue
        m = re.match(r"(.*\.mlp\.experts)\.down_proj$", k)
        if m:
            for e in range(v.shape[0]):
                out[f"{m.group(1)}.{e}.down_proj.weight"] = v[e].contiguous()
            continue
        out[k] = v
    for k in list(out):
        t = out[k].detach().cpu()
        out[k] = t.to(torch.float32) if k.endswith("e_score_correction_bias") else t.to(torch.bfloat16)
    return out


def make(builder, out_root, seed):
    name, cfg, cls = builder()
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = cls(cfg).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    randomize(model, gen)
    d = os.path.join(out_root, name)
    os.makedirs(d, exist_ok=True)
    sd = published_state_dict(model)
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    cfg_dict = cfg.to_dict()
    cfg_dict["architectures"] = [cls.__name__]
    cfg_dict["torch_dtype"] = "bfloat16"
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=2, sort_keys=True, default=str)

    pgen = torch.Generator().manual_seed(seed + 1)
    prompts, greedy, logits, margins = [], [], {}, []
    for i, n in enumerate(PROMPT_LENS):
        ids = torch.randint(3, VOCAB, (1, n), generator=pgen)
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, min_new_tokens=NEW_TOKENS,
                                 eos_token_id=None, pad_token_id=0)
            new = out[0, n:].tolist()
            full = torch.cat([ids[0], torch.tensor(new[:-1])]).unsqueeze(0)
            lg = model(full, use_cache=False).logits[0].to(torch.float32)
        # The full forward's argmax must reproduce generate's tokens (same math, no cache).
        am = lg[n - 1:].argmax(-1).tolist()
        top2 = lg[n - 1:].topk(2, dim=-1).values
        margins.append(float((top2[:, 0] - top2[:, 1]).min()))
        if am != new:
            print(f"{name} prompt {i}: WARNING full-forward argmax {am} != generate {new}")
        prompts.append(ids[0].tolist())
        greedy.append(new)
        logits[f"logits.{i}"] = lg.contiguous()
    save_file(logits, os.path.join(d, "logits.safetensors"))
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump({"prompts": prompts, "greedy": greedy, "max_new_tokens": NEW_TOKENS,
                   "min_greedy_margin": margins, "transformers_version": transformers.__version__,
                   "torch_version": torch.__version__, "seed": seed}, f, indent=1)
    print(f"{name}: {sum(v.numel() for v in sd.values())} params, min greedy margins {margins}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/golden")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    print("transformers", transformers.__version__, "torch", torch.__version__)
    for b in (glm5_tiny, deepseek_v3_tiny, deepseek_v3_tiny_qproj):
        make(b, a.out, a.seed)


if __name__ == "__main__":
    main()
