#!/usr/bin/python3
"""spill's logits against llama.cpp's on the same GGUF files, one table.

For each file: llama.cpp decodes greedily from a prompt (greedy_ids, built as README.md says) and
writes its full logits at every generated position; spill computes its logits over the same token
sequence (`spill logits`, teacher-forced on llama.cpp's tokens, so one disagreement does not
derail the rest). Per file: how many of llama.cpp's greedy tokens are spill's argmax too, the
largest difference of any logit, and the mean and largest KL divergence KL(llama || spill) of the
next-token distributions. numpy is the only dependency.

  /usr/bin/python3 tools/llamacpp/compare_logits.py --spill build/spill --greedy-ids /tmp/greedy_ids \\
      /work/gguf/spill-tiny-bf16.gguf /work/gguf/spill-tiny-Q4_K_M.gguf ...
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

PROMPT = "1,872,198,2134,45,311,1005,13,100,2000,3000,42"


def log_softmax(z):
    z = z.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def compare(a, path, work):
    raw = os.path.join(work, "llama.f32")
    r = subprocess.run([a.greedy_ids, path, str(a.steps), a.prompt, raw], capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": "llama.cpp: " + (r.stderr.strip().splitlines() or ["failed"])[-1]}
    ids = [int(t) for t in r.stdout.splitlines()[0].split(",")]
    n_prompt = len(a.prompt.split(","))
    llama = np.fromfile(raw, dtype=np.float32)
    llama = llama.reshape(a.steps, -1)
    npy = os.path.join(work, "spill.npy")
    r = subprocess.run([a.spill, "logits", "--model", path, "--ids", ",".join(map(str, ids)), "--out", npy,
                        "--threads", str(a.threads)], capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": "spill: " + (r.stderr.strip().splitlines() or ["failed"])[-1]}
    spill = np.load(npy)[n_prompt - 1:n_prompt - 1 + a.steps]
    lp_l, lp_s = log_softmax(llama), log_softmax(spill)
    kld = (np.exp(lp_l) * (lp_l - lp_s)).sum(axis=-1)
    same = int((spill.argmax(axis=-1) == np.array(ids[n_prompt:])).sum())
    return {"same": same, "max_dlogit": float(np.abs(spill - llama).max()), "kld_mean": float(kld.mean()),
            "kld_max": float(kld.max()), "logit_range": float(llama.max() - llama.min())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spill", required=True)
    ap.add_argument("--greedy-ids", required=True)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    print(f"prompt ids {a.prompt}; {a.steps} greedy steps of llama.cpp, spill teacher-forced on them\n")
    print("| file | greedy tokens spill agrees with | max abs logit difference | mean KL(llama.cpp \\|\\| spill) "
          "| max KL |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        for path in a.files:
            r = compare(a, path, work)
            name = os.path.basename(path)
            if "error" in r:
                print(f"| {name} | {r['error']} | | | |")
            else:
                print(f"| {name} | {r['same']}/{a.steps} | {r['max_dlogit']:.4f} | {r['kld_mean']:.6f} | "
                      f"{r['kld_max']:.6f} |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
