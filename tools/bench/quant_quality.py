#!/usr/bin/env python3
"""Quantization quality of spill-tiny, spill's quantizer against llama-quantize's, one table.

For every type: perplexity and KL divergence against the BF16 model on held-out text
(tests/data/eval/heldout-python.txt), for
  * spill:  quantize on load (`spill eval --quant TYPE`), and the GGUF `spill quantize` writes;
  * llama:  llama-quantize's GGUF of the same type (from the BF16 GGUF llama.cpp's converter made);
each GGUF evaluated by both spill eval and llama-perplexity --kl-divergence, so the two quantizers are
compared by one evaluator at a time. Standard library only; prints a markdown table.

  python3 tools/bench/quant_quality.py --spill build/spill --llama-bin /work/llama-cpu-build/bin \\
      --bf16-gguf /work/gguf/spill-tiny-bf16.gguf --work /tmp/qq [--types q8_0,q4_k_m] [--out docs/perf/X.md]

With --out the table is written there as a whole report: date, machine, spill commit, llama.cpp build, the
command line, and per type the file sizes and bits per weight (tensor bytes x 8 / parameters, by `spill info`).
"""

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time

TYPES = ["q8_0", "q6_k", "q5_k_m", "q4_k_m", "q3_k_m", "q2_k", "iq4_xs"]


def run(cmd, **kw):
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def spill_eval(a, model, quant, out_json):
    cmd = [a.spill, "eval", "--model", model, "--reference", a.model, "--text", a.text, "--ctx", str(a.ctx),
           "--json", out_json, "--threads", str(a.threads)]
    if quant:
        cmd += ["--quant", quant]
    run(cmd)
    with open(out_json) as f:
        return json.load(f)


def llama_kld(a, gguf, base_logits):
    r = run([os.path.join(a.llama_bin, "llama-perplexity"), "-m", gguf, "-f", a.text, "-c", str(a.ctx),
             "--kl-divergence-base", base_logits, "--kl-divergence", "-t", str(a.threads)])
    log = r.stdout + r.stderr
    def grab(label):
        m = re.search(re.escape(label) + r"\s*:\s*([-0-9.eE+]+)", log)
        return float(m.group(1)) if m else float("nan")
    same = re.search(r"Same top p\s*:\s*([0-9.]+)", log)
    return {"ppl": grab("Mean PPL(Q)"), "kld_mean": grab("Mean    KLD"), "kld_p99": grab("99.0%   KLD"),
            "top1": float(same.group(1)) / 100 if same else float("nan")}


def bits_per_weight(a, gguf):
    """Tensor bytes x 8 / parameters, as `spill info` counts them (metadata not included)."""
    info = run([a.spill, "info", "--model", gguf]).stdout
    nbytes = int(re.search(r"^weights .*\((\d+) bytes\)", info, re.M).group(1))
    params = sum(int(m.group(1)) for m in re.finditer(r"^[a-zA-Z][a-zA-Z ]*?\s{2,}(\d+)\s+\d+\s+[0-9.]+%$", info, re.M))
    return 8.0 * nbytes / params


def machine():
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.*)", f.read())
            model = m.group(1).strip() if m else model
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}"


def git_commit():
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], text=True, capture_output=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], text=True,
                               capture_output=True, check=True).stdout.strip()
        return r.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "?"


def previous_row(folder, t, wait_s=3600):
    """Type t's row of the earlier run in folder, waiting for it while that run is still going."""
    for _ in range(wait_s // 30 + 1):
        with open(os.path.join(folder, "rows.json")) as f:
            rows = {r["type"]: r for r in json.load(f)["rows"]}
        if t in rows:
            return rows[t]
        time.sleep(30)
    raise SystemExit(f"{folder}/rows.json has no row for {t}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spill", required=True)
    ap.add_argument("--llama-bin", required=True)
    ap.add_argument("--bf16-gguf", required=True)
    ap.add_argument("--model", default="models/spill-tiny")
    ap.add_argument("--text", default="tests/data/eval/heldout-python.txt")
    ap.add_argument("--work", required=True)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--with-load", action="store_true", help="also evaluate quantize on load (spill eval --quant)")
    ap.add_argument("--chars", type=int, default=0, help="use only the text's first N characters (whole lines)")
    ap.add_argument("--out", help="write the report (markdown) to this file as well as stdout")
    ap.add_argument("--reuse-llama", metavar="DIR",
                    help="a previous --work folder of the same text and settings: take llama.cpp's side (its base "
                         "logits, llama-quantize's files and their evaluations) and the BF16 rows from there, and "
                         "run spill's side only (after a change to spill's quantizer)")
    a = ap.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    commit = git_commit()  # at the start: the code that ran
    command = "python3 " + " ".join(shlex.quote(x) for x in sys.argv)
    text_name = a.text
    os.makedirs(a.work, exist_ok=True)
    if a.chars:
        with open(a.text, encoding="utf-8") as f:
            text = f.read()
        cut = text.rfind("\n", 0, a.chars) + 1
        a.text = os.path.join(a.work, "text.txt")
        with open(a.text, "w", encoding="utf-8") as f:
            f.write(text[:cut])
    prev = None
    if a.reuse_llama:
        with open(os.path.join(a.reuse_llama, "rows.json")) as f:
            prev = json.load(f)
        base_logits = os.path.join(a.reuse_llama, "bf16.kld")
        bf16, llama_bf16 = prev["bf16"], prev["llama_bf16"]
    else:
        base_logits = os.path.join(a.work, "bf16.kld")
        run([os.path.join(a.llama_bin, "llama-perplexity"), "-m", a.bf16_gguf, "-f", a.text, "-c", str(a.ctx),
             "--kl-divergence-base", base_logits, "-t", str(a.threads)])
        bf16 = spill_eval(a, a.model, "", os.path.join(a.work, "bf16.json"))
        llama_bf16 = llama_kld(a, a.bf16_gguf, base_logits)
    rows = []
    for t in a.types.split(","):
        lq = os.path.join(a.work, f"llama-{t}.gguf")
        sq = os.path.join(a.work, f"spill-{t}.gguf")
        if prev:
            p = previous_row(a.reuse_llama, t)
            run([a.spill, "quantize", "--model", a.model, "--quant", t, "--out", sq, "--threads", str(a.threads)])
            row = {"type": t, "llama_bytes": p["llama_bytes"], "spill_bytes": os.path.getsize(sq),
                   "llama_bpw": p["llama_bpw"], "spill_bpw": bits_per_weight(a, sq),
                   "llama_file_by_spill": p["llama_file_by_spill"], "llama_file_by_llama": p["llama_file_by_llama"]}
            if a.with_load:
                row["spill_load"] = spill_eval(a, a.model, t, os.path.join(a.work, f"load-{t}.json"))
            row["spill_file_by_spill"] = spill_eval(a, sq, "", os.path.join(a.work, f"sfile-{t}.json"))
            row["spill_file_by_llama"] = llama_kld(a, sq, base_logits)
            rows.append(row)
            with open(os.path.join(a.work, "rows.json"), "w") as f:
                json.dump({"bf16": bf16, "llama_bf16": llama_bf16, "rows": rows}, f, indent=1)
            continue
        run([os.path.join(a.llama_bin, "llama-quantize"), a.bf16_gguf, lq, t.upper(), str(a.threads)])
        run([a.spill, "quantize", "--model", a.model, "--quant", t, "--out", sq, "--threads", str(a.threads)])
        row = {"type": t, "llama_bytes": os.path.getsize(lq), "spill_bytes": os.path.getsize(sq),
               "llama_bpw": bits_per_weight(a, lq), "spill_bpw": bits_per_weight(a, sq)}
        if a.with_load:  # bit-identical to the spill file (tests/cli_quant_test.cpp); costs a run
            row["spill_load"] = spill_eval(a, a.model, t, os.path.join(a.work, f"load-{t}.json"))
        row["spill_file_by_spill"] = spill_eval(a, sq, "", os.path.join(a.work, f"sfile-{t}.json"))
        row["llama_file_by_spill"] = spill_eval(a, lq, "", os.path.join(a.work, f"lfile-{t}.json"))
        row["spill_file_by_llama"] = llama_kld(a, sq, base_logits)
        row["llama_file_by_llama"] = llama_kld(a, lq, base_logits)
        rows.append(row)
        with open(os.path.join(a.work, "rows.json"), "w") as f:
            json.dump({"bf16": bf16, "llama_bf16": llama_bf16, "rows": rows}, f, indent=1)
    lines = []
    out = lines.append
    if a.out:
        llama_version = run([os.path.join(a.llama_bin, "llama-perplexity"), "--version"])
        version = (llama_version.stdout + llama_version.stderr).strip().splitlines()
        out(f"# Quantization quality: spill's quantizer against llama-quantize ({started:%Y-%m-%d})\n")
        out(f"- Date: {started:%Y-%m-%d %H:%M} UTC (run took "
            f"{(datetime.datetime.now(datetime.timezone.utc) - started).total_seconds() / 60:.0f} min)")
        out(f"- Machine: {machine()}")
        out(f"- spill commit: {commit}; llama.cpp: {version[0] if version else '?'} ({a.llama_bin})")
        out(f"- Model: {a.model}; llama.cpp's side starts from {a.bf16_gguf}")
        out(f"- Text: {text_name}{f' (first {a.chars} characters, whole lines)' if a.chars else ''}; "
            f"windows of {a.ctx} tokens, the second half of each scored; {bf16['n_scored']} scored tokens")
        out(f"- Command: `{command}`")
        if a.reuse_llama:
            out(f"- llama.cpp's side (llama-quantize's files, every llama-perplexity run of them, the BF16 base) "
                f"and spill eval's BF16 row are from the earlier run in {a.reuse_llama}: same text, settings and "
                f"llama.cpp binaries")
        out("")
    out(f"BF16: spill eval PPL {bf16['ppl']:.4f} over {bf16['n_scored']} tokens; llama-perplexity PPL "
        f"{llama_bf16['ppl']:.4f}, KLD of llama.cpp's BF16 run against its own base {llama_bf16['kld_mean']:.6f}\n")
    out("| type | file bytes spill / llama | bits/weight spill / llama | evaluator | PPL spill / llama "
        "| mean KLD spill / llama | 99% KLD spill / llama | same top spill / llama |")
    out("|---|---|---|---|---|---|---|---|")
    for r in rows:
        size = f"{r['spill_bytes']:,} / {r['llama_bytes']:,}"
        bpw = f"{r['spill_bpw']:.3f} / {r['llama_bpw']:.3f}"
        for ev, s, l in (("spill eval", r["spill_file_by_spill"], r["llama_file_by_spill"]),
                         ("llama-perplexity", r["spill_file_by_llama"], r["llama_file_by_llama"])):
            out(f"| {r['type']} | {size} | {bpw} | {ev} | {s['ppl']:.4f} / {l['ppl']:.4f} | {s['kld_mean']:.6f} / "
                f"{l['kld_mean']:.6f} | {s['kld_p99']:.5f} / {l['kld_p99']:.5f} | {100 * s['top1']:.2f} / "
                f"{100 * l['top1']:.2f} % |")
    if a.with_load:
        out("\nquantize on load (spill eval --quant TYPE, no file):")
    for r in rows if a.with_load else []:
        s = r["spill_load"]
        out(f"  {r['type']}: PPL {s['ppl']:.4f}, mean KLD {s['kld_mean']:.6f}, 99% KLD {s['kld_p99']:.5f}, "
            f"same top {100 * s['top1']:.2f} %")
    print("\n".join(lines))
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
