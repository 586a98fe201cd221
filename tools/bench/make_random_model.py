#!/usr/bin/env python3
"""Writes a random-weight Qwen3-MoE checkpoint (config.json + model.safetensors, BF16) of a
chosen size, for benchmarks on machines without torch. Standard library only.

The weights are random bf16 values of magnitude ~2^-6..2^-4 with random signs: enough for a
forward pass that costs what a trained model costs (same bytes, same FLOPs); the text it
generates is meaningless. Copy a tokenizer.json next to it to run `spill generate`.

  python3 tools/bench/make_random_model.py --out /tmp/bench-30m --tokenizer models/spill-tiny/tokenizer.json
"""
import argparse
import json
import os
import shutil
import struct

# High byte of a little-endian bf16: sign bit + top 7 exponent bits. Exponent fields 0x78..0x7b
# (2^-7 .. 2^-4) keep activations well scaled through a few layers.
_HIGH = bytes((0x80 if i & 1 else 0x00) | (0x3C + ((i >> 1) & 1)) for i in range(256))


def random_bf16(n):
    raw = bytearray(os.urandom(2 * n))
    raw[1::2] = raw[1::2].translate(_HIGH)
    return bytes(raw)


def ones_bf16(n):
    return struct.pack("<H", 0x3F80) * n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--expert-width", type=int, default=256)
    ap.add_argument("--tokenizer", help="tokenizer.json to copy next to the weights")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    H, D, V = a.hidden, a.head_dim, a.vocab
    tensors = []  # (name, shape, bytes)

    def add(name, shape, data=None):
        n = 1
        for d in shape:
            n *= d
        tensors.append((name, shape, data if data is not None else random_bf16(n)))

    add("model.embed_tokens.weight", [V, H])
    add("model.norm.weight", [H], ones_bf16(H))
    for l in range(a.layers):
        p = f"model.layers.{l}."
        add(p + "input_layernorm.weight", [H], ones_bf16(H))
        add(p + "post_attention_layernorm.weight", [H], ones_bf16(H))
        add(p + "self_attn.q_proj.weight", [a.heads * D, H])
        add(p + "self_attn.k_proj.weight", [a.kv_heads * D, H])
        add(p + "self_attn.v_proj.weight", [a.kv_heads * D, H])
        add(p + "self_attn.o_proj.weight", [H, a.heads * D])
        add(p + "self_attn.q_norm.weight", [D], ones_bf16(D))
        add(p + "self_attn.k_norm.weight", [D], ones_bf16(D))
        add(p + "mlp.gate.weight", [a.experts, H])
        for e in range(a.experts):
            add(p + f"mlp.experts.{e}.gate_proj.weight", [a.expert_width, H])
            add(p + f"mlp.experts.{e}.up_proj.weight", [a.expert_width, H])
            add(p + f"mlp.experts.{e}.down_proj.weight", [H, a.expert_width])
    header, offset = {}, 0
    for name, shape, data in tensors:
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, data in tensors:
            f.write(data)
    config = {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": V,
        "hidden_size": H, "intermediate_size": a.expert_width * 2, "moe_intermediate_size": a.expert_width,
        "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
        "head_dim": D, "num_experts": a.experts, "num_experts_per_tok": a.top_k, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "max_position_embeddings": 4096, "tie_word_embeddings": True, "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    if a.tokenizer:
        shutil.copy(a.tokenizer, os.path.join(a.out, "tokenizer.json"))
    params = sum(len(d) // 2 for _, _, d in tensors)
    active = params - a.layers * a.experts * 3 * H * a.expert_width * (a.experts - a.top_k) // a.experts
    print(f"wrote {a.out}: {params / 1e6:.1f} M parameters ({active / 1e6:.1f} M active per token), {offset / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
