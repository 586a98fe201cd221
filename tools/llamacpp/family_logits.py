#!/usr/bin/python3
"""llama.cpp against spill on the GGUF files spill writes for the deepseek2 / glm4moe / gpt-oss
family fixtures (tests/data/parity), one table.

For each fixture: `spill quantize --quant bf16` (`bf16,experts=mxfp4` for gpt_oss_mxfp4) writes its GGUF (a copy of the fixture folder with a
byte-level tokenizer, as tests/gguf_families_test.cpp makes it); gguf-py widens every BF16 tensor to
F32 (exact), so llama.cpp's CPU matmuls take F32 activations (a BF16 file makes ggml round them to
BF16 first); MXFP4 experts stay MXFP4. llama.cpp (greedy_ids, GREEDY_IDS_EXACT=1: F32 KV cache, no
flash attention) decodes greedily from the fixture's first prompt ids and writes its logits; spill
computes its logits over llama.cpp's sequence (teacher-forced) from the same F32 file. Per file: how
many of llama.cpp's greedy tokens are spill's argmax, the largest logit difference, and that over the
largest logit. With --save DIR, llama.cpp's logits and ids are written there (<fixture>.npy,
<fixture>.json) for tests/gguf_families_test.cpp.

  PYTHONPATH=/work/llama-src/gguf-py /usr/bin/python3 tools/llamacpp/family_logits.py \\
      --spill build/spill --greedy-ids /tmp/greedy_ids [--save tests/data/gguf/llamacpp]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import gguf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
from byte_vocab import byte_vocab  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
PARITY = os.path.join(ROOT, "tests", "data", "parity")
FIXTURES = ["deepseek_v3_per_expert", "deepseek_v3_fused", "deepseek_v3_noqlora_per_expert", "glm4_moe_per_expert",
            "glm4_moe_fused", "glm4_moe_noqknorm_per_expert", "gpt_oss_bf16", "gpt_oss_mxfp4"]
N_PROMPT, STEPS = 8, 16


def byte_tokenizer(vocab):
    """The tokenizer.json tests/gguf_families_test.cpp writes (write_byte_tokenizer)."""
    tokens, merges = byte_vocab(vocab)
    v = {t: i for i, t in enumerate(tokens)}
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": bl, "post_processor": None,
            "decoder": dict(bl, add_prefix_space=True),
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": v,
                      "merges": merges}}


def widen_to_f32(src, dst):
    """Every BF16 tensor of `src` as F32 (bf16 -> f32 is exact); metadata and other tensors as they are."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, r.fields["general.architecture"].contents())
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.alignment"):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, field.contents(), vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(name, field.contents(), vtype)
    for t in r.tensors:
        shape = list(reversed([int(x) for x in t.shape]))  # row-major
        if t.tensor_type == gguf.GGMLQuantizationType.BF16:
            a = (np.asarray(t.data).view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
            w.add_tensor(t.name, np.ascontiguousarray(a))
        elif t.tensor_type == gguf.GGMLQuantizationType.F32:
            w.add_tensor(t.name, np.asarray(t.data).reshape(shape))
        else:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def run(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{cmd[0]}: " + (r.stderr.strip().splitlines() or ["failed"])[-1])
    return r.stdout


def compare(a, fixture, work):
    cfg = json.load(open(os.path.join(PARITY, fixture, "config.json")))
    hf = os.path.join(work, fixture)
    os.makedirs(hf)
    for f in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(PARITY, fixture, f), hf)
    json.dump(byte_tokenizer(cfg["vocab_size"]), open(os.path.join(hf, "tokenizer.json"), "w"))
    bf16 = os.path.join(work, fixture + ".gguf")
    f32 = os.path.join(work, fixture + "-f32.gguf")
    # MXFP4 experts stay MXFP4 (llama.cpp then rounds their activations to Q8_0 blocks of 32).
    quant = "bf16,experts=mxfp4" if "mxfp4" in fixture else "bf16"
    run([a.spill, "quantize", "--model", hf, "--quant", quant, "--out", bf16])
    widen_to_f32(bf16, f32)
    prompt = json.load(open(os.path.join(PARITY, fixture, "expected.json")))["input_ids"][:N_PROMPT]
    raw = os.path.join(work, "llama.f32")
    out = run([a.greedy_ids, f32, str(STEPS), ",".join(map(str, prompt)), raw], env=dict(os.environ, GREEDY_IDS_EXACT="1"))
    ids = [int(t) for t in out.splitlines()[0].split(",")]
    llama = np.fromfile(raw, dtype=np.float32).reshape(STEPS, -1)
    npy = os.path.join(work, "spill.npy")
    run([a.spill, "logits", "--model", f32, "--ids", ",".join(map(str, ids)), "--out", npy, "--threads", "1"])
    spill = np.load(npy)[N_PROMPT - 1:N_PROMPT - 1 + STEPS]
    if a.save:
        os.makedirs(a.save, exist_ok=True)
        np.save(os.path.join(a.save, fixture + ".npy"), llama)
        json.dump({"ids": ids, "n_prompt": N_PROMPT, "file": "spill quantize --quant bf16, widened to F32 by gguf-py",
                   "llama_cpp": "greedy_ids with GREEDY_IDS_EXACT=1"}, open(os.path.join(a.save, fixture + ".json"), "w"))
    d = np.abs(spill - llama)
    same = int((spill.argmax(axis=-1) == np.array(ids[N_PROMPT:])).sum())
    top = np.sort(llama, axis=-1)
    return {"same": same, "max_d": float(d.max()), "scale": float(np.abs(llama).max()),
            "min_margin": float((top[:, -1] - top[:, -2]).min())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spill", required=True)
    ap.add_argument("--greedy-ids", required=True)
    ap.add_argument("--save")
    ap.add_argument("fixtures", nargs="*", default=FIXTURES)
    a = ap.parse_args()
    print(f"prompt: the fixture's first {N_PROMPT} input ids; {STEPS} greedy steps of llama.cpp, spill teacher-forced\n")
    print("| fixture | greedy tokens spill agrees with | max abs logit difference | over max abs logit | "
          "llama.cpp's smallest top-2 margin |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        for fx in a.fixtures:
            try:
                r = compare(a, fx, work)
                print(f"| {fx} | {r['same']}/{STEPS} | {r['max_d']:.3g} | {r['max_d'] / r['scale']:.3g} | "
                      f"{r['min_margin']:.3g} |")
            except RuntimeError as e:
                print(f"| {fx} | {e} | | | |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
