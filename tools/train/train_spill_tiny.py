#!/usr/bin/env python3
"""Train spill-tiny: a small real Mixture-of-Experts LLM (Qwen3-MoE architecture) that writes Python
and makes Qwen/Hermes-style tool calls.

One run does everything, within a wall-time budget (default 465 s in all):
  corpus (Python sources on this machine) + synthetic tool-use conversations (spill_tool_data.py,
  rendered through the chat template) -> byte-level BPE tokenizer -> pre-tokenized streams
  -> training for --train-seconds of wall time on one GPU -> bf16 checkpoint saved with
  transformers and verified by reloading -> held-out loss / perplexity and per-layer expert usage
  -> tool-call accuracy on held-out prompts -> samples -> model card -> parity fixture (float32
  CPU transformers) for spill's tests.

  python3 tools/train/train_spill_tiny.py --out models/spill-tiny \\
      --fixture-out tests/data/spill-tiny --train-seconds 300

Outputs are written to <out>.staging and swapped into <out> only once the saved checkpoint has
been reloaded and checked, so an interrupted run never leaves a half-written model folder; a
rerun starts over. --fixture-only rebuilds just the fixture from an existing --out.
See tools/train/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import random
import shutil
import sys
import time
import traceback

T0 = time.time()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

FIXTURE_SNIPPET = (
    "import os\n\n"
    "def read_lines(path):\n"
    "    \"\"\"Return the lines of a text file.\"\"\"\n"
    "    with open(path) as f:\n"
    "        return f.read().splitlines()\n"
)
FIXTURE_TOKENS = 24
FIXTURE_LOGIT_ROWS = 6
FIXTURE_GREEDY = 16
GREEDY_PROMPT = "def fibonacci(n):"
CHAT_PROMPT = "Write a Python function that returns the factorial of a number."
SYSTEM_PROMPT = "You are a helpful assistant that writes Python code."
# Ids the BPE trainer gives the special tokens (listed first); checked after training.
PREFLIGHT_IDS = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}


def elapsed() -> float:
    return time.time() - T0


def log(msg: str) -> None:
    print(f"[{elapsed():6.1f}s] {msg}", flush=True)


def die(msg: str, code: int = 2) -> None:
    sys.stderr.flush()
    print(f"\nERROR: {msg}", flush=True)
    sys.exit(code)


# ----------------------------------------------------------------------------------------------
# Arguments and environment
# ----------------------------------------------------------------------------------------------

def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="models/spill-tiny", help="model folder to write")
    ap.add_argument("--fixture-out", default="tests/data/spill-tiny", help="folder for expected.json")
    ap.add_argument("--train-seconds", type=float, default=300.0, help="wall time of the training loop")
    ap.add_argument("--time-budget", type=float, default=465.0,
                    help="wall seconds for the whole run; training is shortened to fit (0: no limit)")
    ap.add_argument("--post-reserve", type=float, default=50.0,
                    help="seconds kept for saving, checks, eval, samples and fixture after training")
    # data
    ap.add_argument("--max-corpus-mb", type=float, default=180.0)
    ap.add_argument("--heldout-pct", type=float, default=1.0)
    ap.add_argument("--tok-sample-mb", type=float, default=30.0)
    ap.add_argument("--max-examples", type=int, default=60000)
    ap.add_argument("--chat-frac", type=float, default=0.25,
                    help="share of training windows from chat data (instruction + tool-use conversations)")
    ap.add_argument("--tool-frac", type=float, default=0.4,
                    help="share of the chat windows taken from the tool-use conversations")
    ap.add_argument("--tool-convs", type=int, default=20000, help="synthetic tool-use conversations to generate")
    ap.add_argument("--tool-eval", type=int, default=50,
                    help="held-out tool-call prompts for the tool-call accuracy (0: skip)")
    ap.add_argument("--tool-eval-no-call", type=int, default=10,
                    help="plain Python questions asked with tools present, checked for no tool call")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 4))
    # model
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--moe-intermediate", type=int, default=128)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--max-pos", type=int, default=2048)
    ap.add_argument("--max-bytes", type=float, default=32e6,
                    help="limit on model.safetensors + tokenizer.json + tokenizer_config.json")
    # training
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=256, help="windows per step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup-steps", type=int, default=150)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--aux-coef", type=float, default=0.01, help="load-balancing loss coefficient")
    ap.add_argument("--experts-impl", default="auto", choices=["auto", "eager", "grouped_mm", "batched_mm"],
                    help="transformers experts backend for training (auto: fastest that matches eager)")
    ap.add_argument("--eval-windows", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--log-every", type=float, default=10.0, help="seconds between progress lines")
    # modes
    ap.add_argument("--fixture-only", action="store_true", help="only rebuild the fixture from an existing --out")
    ap.add_argument("--smoke", action="store_true", help="tiny, quick run to check the pipeline end to end")
    a = ap.parse_args()
    if a.smoke:
        a.max_corpus_mb = min(a.max_corpus_mb, 12.0)
        a.tok_sample_mb = min(a.tok_sample_mb, 4.0)
        a.train_seconds = min(a.train_seconds, 20.0)
        a.eval_windows = min(a.eval_windows, 16)
        a.batch = min(a.batch, 32)
        a.warmup_steps = min(a.warmup_steps, 10)
        a.max_examples = min(a.max_examples, 5000)
        a.tool_convs = min(a.tool_convs, 2000)
        a.tool_eval = min(a.tool_eval, 16)
        a.tool_eval_no_call = min(a.tool_eval_no_call, 4)
        a.time_budget = 0.0
    if a.heads % a.kv_heads != 0:
        die(f"--heads ({a.heads}) must be a multiple of --kv-heads ({a.kv_heads})")
    if not (1 <= a.top_k <= a.experts):
        die("--top-k must be between 1 and --experts")
    if a.vocab > 65535:
        die("--vocab must fit in uint16")
    if not (0.0 <= a.chat_frac <= 1.0 and 0.0 <= a.tool_frac <= 1.0):
        die("--chat-frac and --tool-frac must be between 0 and 1")
    return a


def check_env(args):
    try:
        import numpy  # noqa: F401
        import jinja2  # noqa: F401
        import safetensors  # noqa: F401
        import tokenizers
        import torch
        import transformers
    except ImportError as e:
        die(f"missing Python package: {e}. Run with the interpreter that has torch + transformers 5 "
            f"(e.g. /opt/torch/.venv/bin/python3).")
    major = int(transformers.__version__.split(".")[0])
    if major < 5:
        die(f"transformers {transformers.__version__} found; this script is written for transformers 5.x")
    try:
        from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM  # noqa
    except ImportError as e:
        die(f"transformers has no Qwen3-MoE classes: {e}")
    info = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "safetensors": safetensors.__version__,
        "cuda": getattr(torch.version, "cuda", None),
        "gpu": None,
    }
    log("environment: " + ", ".join(f"{k} {v}" for k, v in info.items() if v is not None))
    return info


def check_gpu(args, info):
    """Separate from check_env so that the corpus workers are forked before CUDA is initialised."""
    import torch

    if args.device != "cuda":
        return
    if not torch.cuda.is_available():
        die("CUDA is not available (torch.cuda.is_available() is False); use --device cpu only for --smoke")
    info["gpu"] = torch.cuda.get_device_name(0)
    free, total = torch.cuda.mem_get_info()
    info["gpu_mem_gib"] = round(total / 2**30, 1)
    log(f"GPU: {info['gpu']}, {free / 2**30:.0f} of {total / 2**30:.0f} GiB free")
    if free < 40 * 2**30 and not args.smoke:
        log(f"warning: only {free / 2**30:.1f} GiB free on the GPU; consider a smaller --batch")


def prepare_dirs(args):
    out = os.path.abspath(args.out)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    if not os.access(parent, os.W_OK):
        die(f"cannot write to {parent}")
    stage = out + ".staging"
    if os.path.exists(stage):
        log(f"removing leftover {stage} from an earlier run")
        shutil.rmtree(stage)
    os.makedirs(stage)
    fx = os.path.abspath(args.fixture_out)
    os.makedirs(fx, exist_ok=True)
    if not os.access(fx, os.W_OK):
        die(f"cannot write to {fx}")
    return out, stage, fx


# ----------------------------------------------------------------------------------------------
# Chat data
# ----------------------------------------------------------------------------------------------

def chat_texts(examples, seed: int):
    from spill_tokenizer import EOT, render_chat

    rng = random.Random(seed)
    texts = []
    for instr, code, _src in examples:
        msgs = []
        if rng.random() < 0.2:
            msgs.append({"role": "system", "content": SYSTEM_PROMPT})
        msgs.append({"role": "user", "content": instr})
        msgs.append({"role": "assistant", "content": f"```python\n{code}\n```"})
        texts.append(render_chat(msgs, add_generation_prompt=False))
    rng.shuffle(texts)
    # Sanity: the exact token layout the model will see at inference.
    if texts:
        assert texts[0].startswith("<|im_start|>") and texts[0].endswith("<|im_end|>\n"), texts[0][:200]
        assert EOT not in texts[0]
    return texts


def tool_data(examples, args):
    """Synthetic tool-use conversations (spill_tool_data.py), rendered through the chat template:
    the training text is exactly what the server sends. Every rendering is also compared with
    spill_tool_data.reference_render, a plain-Python statement of the layout the template is meant
    to produce. Returns (texts, info, eval prompts, no-call prompts)."""
    import spill_tool_data as td
    from spill_tokenizer import EOT, render_chat

    t0 = time.time()
    convs = td.generate(args.tool_convs, args.seed, python_examples=[(i, c) for i, c, _s in examples])
    texts = [render_chat(c["messages"], False, c["tools"]) for c in convs]
    t_render = time.time() - t0
    problems = []
    for i, (msgs, tools, gen) in enumerate(td.template_cases()):
        a, b = render_chat(msgs, gen, tools), td.reference_render(msgs, tools, gen)
        if a != b:
            problems.append(f"template case {i}: {first_difference(a, b)}")
    bad = [i for i, (c, t) in enumerate(zip(convs, texts)) if t != td.reference_render(c["messages"], c["tools"])]
    if bad:
        problems.append(f"{len(bad)} of {len(convs)} conversations render differently from the reference, e.g. #{bad[0]}: "
                        + first_difference(texts[bad[0]], td.reference_render(convs[bad[0]]["messages"],
                                                                               convs[bad[0]]["tools"])))
    if texts and not (texts[0].startswith("<|im_start|>system\n") and texts[0].endswith("<|im_end|>\n")):
        problems.append(f"unexpected layout of the first conversation: {texts[0][:80]!r} ... {texts[0][-40:]!r}")
    if any(EOT in t for t in texts):
        problems.append(f"{sum(EOT in t for t in texts)} tool-use conversations contain {EOT}")
    kinds = {}
    for c in convs:
        kinds[c["kind"]] = kinds.get(c["kind"], 0) + 1
    keys = {c["key"] for c in convs if "key" in c}
    eval_seed = args.seed + 1000003  # held out: another seed, and no prompt that is also in the training data
    evals = td.eval_prompts(args.tool_eval, eval_seed, exclude=keys) if args.tool_eval > 0 else []
    no_call = td.no_call_prompts(args.tool_eval_no_call, eval_seed) if args.tool_eval > 0 else []
    info = {"conversations": len(convs), "kinds": kinds, "tools": [t.name for t in td.TOOLS],
            "chars": sum(len(t) for t in texts), "render_seconds": t_render, "eval_seed": eval_seed,
            "template_problems": problems}
    log(f"tool-use data: {len(convs)} conversations ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}) over "
        f"{len(td.TOOLS)} tools, {info['chars'] / 1e6:.1f} M chars, rendered through the chat template in "
        f"{t_render:.1f}s; template == reference layout on {len(td.template_cases())} cases and all conversations: "
        f"{not problems}; {len(evals)} held-out call prompts + {len(no_call)} no-call prompts (seed {eval_seed})")
    for p in problems:
        log(f"WARNING: chat template: {p}")
    return texts, info, evals, no_call


def first_difference(a: str, b: str) -> str:
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"at char {k}: {a[max(0, k - 30):k + 50]!r} vs {b[max(0, k - 30):k + 50]!r}"


def template_cases_for_transformers(extra=()):
    """Conversations to render with transformers' apply_chat_template and with ours."""
    import spill_tool_data as td

    # Only message shapes clients send (string or null content): transformers may preprocess others.
    cases = [(m, t, g) for m, t, g in td.template_cases()
             if all(isinstance(x.get("content"), (str, type(None))) for x in m)]
    cases.append(([{"role": "user", "content": CHAT_PROMPT}], None, True))
    cases.extend(extra)
    return cases


def template_mismatches(hft, cases):
    """Differences between transformers' apply_chat_template (with tools=) and render_chat."""
    from spill_tokenizer import render_chat

    out = []
    for i, (msgs, tools, gen) in enumerate(cases):
        want = render_chat(msgs, gen, tools)
        try:
            got = hft.apply_chat_template(copy.deepcopy(msgs), tools=copy.deepcopy(tools), tokenize=False,
                                          add_generation_prompt=gen)
        except Exception as e:
            out.append(f"case {i}: apply_chat_template raised {e.__class__.__name__}: {e}")
            continue
        if not isinstance(got, str):
            out.append(f"case {i}: apply_chat_template returned {type(got).__name__}, not str")
        elif got != want:
            out.append(f"case {i}: transformers vs ours {first_difference(got, want)}")
    return out


# ----------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------

def rope_theta_of(cfg):
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict) and rp.get("rope_theta") is not None:
        return float(rp["rope_theta"])
    v = getattr(cfg, "rope_theta", None)
    return float(v) if v is not None else None


def num_experts_of(cfg):
    for k in ("num_experts", "num_local_experts"):
        v = getattr(cfg, k, None)
        if v:
            return int(v)
    return None


def build_config(args, ids):
    from transformers import Qwen3MoeConfig

    common = dict(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        hidden_act="silu", max_position_embeddings=args.max_pos, initializer_range=0.02, rms_norm_eps=1e-6,
        use_cache=True, tie_word_embeddings=True, attention_bias=False, use_sliding_window=False,
        attention_dropout=0.0, decoder_sparse_step=1, moe_intermediate_size=args.moe_intermediate,
        num_experts_per_tok=args.top_k, num_experts=args.experts, norm_topk_prob=True,
        output_router_logits=False, router_aux_loss_coef=args.aux_coef, mlp_only_layers=[],
        bos_token_id=None, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
    )
    rope_params = {"rope_type": "default", "rope_theta": float(args.rope_theta)}
    attempts = [
        dict(rope_parameters=rope_params, head_dim=args.head_dim),
        dict(rope_parameters=rope_params),
        dict(rope_theta=float(args.rope_theta), head_dim=args.head_dim),
        dict(rope_theta=float(args.rope_theta)),
    ]
    errors = []
    cfg = None
    for extra in attempts:
        try:
            cfg = Qwen3MoeConfig(**common, **copy.deepcopy(extra))
            break
        except Exception as e:  # strict dataclass configs reject unknown keys
            errors.append(f"{sorted(extra)}: {e.__class__.__name__}: {e}")
    if cfg is None:
        die("could not build Qwen3MoeConfig:\n  " + "\n  ".join(errors))
    if getattr(cfg, "head_dim", None) not in (None, args.head_dim):
        die(f"config head_dim is {cfg.head_dim}, wanted {args.head_dim}")
    if getattr(cfg, "head_dim", None) is None:
        if args.hidden // args.heads != args.head_dim:
            die("this transformers' Qwen3MoeConfig takes no head_dim, so --head-dim must equal hidden/heads")
    theta = rope_theta_of(cfg)
    if theta is None or abs(theta - args.rope_theta) > 1e-6 * args.rope_theta:
        die(f"config rope theta is {theta}, wanted {args.rope_theta}")
    if num_experts_of(cfg) != args.experts:
        die(f"config has {num_experts_of(cfg)} experts, wanted {args.experts}")
    return cfg


def init_weights(model, args):
    """Explicit init, independent of transformers' defaults: N(0, 0.02) for matrices, residual
    outputs (o_proj, down_proj) scaled by 1/sqrt(2 * layers), norms to one."""
    import torch

    std = 0.02
    out_std = std / math.sqrt(2 * args.layers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                s = out_std if (name.endswith("o_proj.weight") or "down_proj" in name) else std
                p.normal_(0.0, s)
            elif "norm" in name:
                p.fill_(1.0)
            else:
                p.zero_()


def build_model(cfg, args):
    import torch
    from transformers import Qwen3MoeForCausalLM

    torch.manual_seed(args.seed)
    model = Qwen3MoeForCausalLM(cfg).float()
    init_weights(model, args)
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    if emb.data_ptr() != head.data_ptr():
        model.tie_weights()
        if model.get_input_embeddings().weight.data_ptr() != model.get_output_embeddings().weight.data_ptr():
            die("lm_head is not tied to embed_tokens although tie_word_embeddings=True")
    layers = model.model.layers
    if len(layers) != args.layers:
        die(f"model has {len(layers)} layers, wanted {args.layers}")
    a0 = layers[0].self_attn
    want = {
        "q_proj": (args.heads * args.head_dim, args.hidden),
        "k_proj": (args.kv_heads * args.head_dim, args.hidden),
        "v_proj": (args.kv_heads * args.head_dim, args.hidden),
        "o_proj": (args.hidden, args.heads * args.head_dim),
    }
    for n, shape in want.items():
        got = tuple(getattr(a0, n).weight.shape)
        if got != shape:
            die(f"layer 0 {n} has shape {got}, wanted {shape}")
    for i, layer in enumerate(layers):
        mlp = layer.mlp
        if not (hasattr(mlp, "gate") and hasattr(mlp, "experts")):
            die(f"layer {i} is not a sparse MoE block ({mlp.__class__.__name__})")
        if tuple(mlp.gate.weight.shape) != (args.experts, args.hidden):
            die(f"layer {i} router weight has shape {tuple(mlp.gate.weight.shape)}")
        n_exp = sum(p.numel() for p in mlp.experts.parameters())
        if n_exp != args.experts * 3 * args.hidden * args.moe_intermediate:
            die(f"layer {i} experts hold {n_exp} parameters, expected "
                f"{args.experts * 3 * args.hidden * args.moe_intermediate}")
    return model


def param_counts(model, args):
    total = sum(p.numel() for p in model.parameters())
    per_expert = 3 * args.hidden * args.moe_intermediate
    inactive = args.layers * (args.experts - args.top_k) * per_expert
    emb = args.vocab * args.hidden
    return {
        "total": total,
        "active": total - inactive,
        "embedding": emb,
        "experts": args.layers * args.experts * per_expert,
        "per_expert": per_expert,
        "non_embedding": total - emb,
    }


def set_attn_impl(model, name):
    fn = getattr(model, "set_attn_implementation", None)
    if fn is not None:
        try:
            fn(name)
            return True
        except Exception:
            pass
    try:
        model.config._attn_implementation = name
        return True
    except Exception:
        return False


def _impl_value(v):
    if isinstance(v, dict):
        v = v.get("", next(iter(v.values()), None))
    return v


def get_experts_impl(model):
    fn = getattr(model, "get_experts_implementation", None)
    if fn is not None:
        try:
            return _impl_value(fn())
        except Exception:
            pass
    return _impl_value(getattr(model.config, "_experts_implementation", None))


def set_experts_impl(model, name):
    fn = getattr(model, "set_experts_implementation", None)
    if fn is not None:
        try:
            fn(name)
        except Exception as e:
            log(f"set_experts_implementation({name!r}) failed: {e.__class__.__name__}: {e}")
            return False
        got = get_experts_impl(model)
        if got not in (None, name):
            log(f"note: asked for experts backend {name!r}, model reports {got!r}")
        return True
    if hasattr(model.config, "_experts_implementation"):
        try:
            model.config._experts_implementation = name
            return True
        except Exception:
            return False
    return False


def autocast_ctx(dev):
    import torch

    if dev.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


# ----------------------------------------------------------------------------------------------
# Router tap: forward hooks on every router (mlp.gate)
# ----------------------------------------------------------------------------------------------

class RouterTap:
    """Hooks each layer's router. Modes:
      off    - nothing
      train  - per-layer Switch load-balancing loss from the router logits (recomputed from the
               router's input and weight, so it does not depend on what the router returns), and
               expert counts
      count  - expert counts only
      record - counts plus the top-k ids and weights of every token (for the fixture)
    Top-k ids are taken from the router's own output when it returns them (transformers 5's
    TopKRouter returns logits, weights, ids); otherwise computed as softmax -> top-k."""

    def __init__(self, model, num_experts, top_k, norm_topk):
        import torch

        self.E, self.k, self.norm = num_experts, top_k, norm_topk
        self.gates = [layer.mlp.gate for layer in model.model.layers]
        dev = self.gates[0].weight.device
        self.counts = torch.zeros(len(self.gates), num_experts, dtype=torch.long, device=dev)
        self.mode = "off"
        self.aux_terms = []
        self.records = {}
        self.from_router_output = None
        self.handles = [g.register_forward_hook(self._hook(i), with_kwargs=True) for i, g in enumerate(self.gates)]

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []

    def begin(self, mode):
        self.mode = mode
        self.aux_terms = []
        if mode == "record":
            self.records = {}

    def reset_counts(self):
        self.counts = self.counts.new_zeros(self.counts.shape).to(self.gates[0].weight.device)

    def aux(self):
        import torch

        if len(self.aux_terms) != len(self.gates):
            raise RuntimeError(f"router hooks fired {len(self.aux_terms)} times for {len(self.gates)} layers")
        return torch.stack(self.aux_terms).mean()

    def _parse(self, output):
        import torch

        if not isinstance(output, (tuple, list)):
            return None, None
        idx = [t for t in output if torch.is_tensor(t) and not t.is_floating_point() and t.dim() == 2
               and t.shape[-1] == self.k]
        w = [t for t in output if torch.is_tensor(t) and t.is_floating_point() and t.dim() == 2
             and t.shape[-1] == self.k and t.shape[-1] != self.E]
        return (idx[0] if idx else None), (w[0] if w else None)

    def _hook(self, li):
        import torch
        import torch.nn.functional as F

        def hook(module, args, kwargs, output):
            if self.mode == "off":
                return None
            if args:
                hs = args[0]
            elif "hidden_states" in kwargs:
                hs = kwargs["hidden_states"]
            else:
                hs = next(v for v in kwargs.values() if torch.is_tensor(v))
            hs = hs.reshape(-1, hs.shape[-1])
            out_idx, out_w = self._parse(output)
            if self.from_router_output is None:
                self.from_router_output = out_idx is not None
            if self.mode == "train":
                logits = F.linear(hs, module.weight)
                probs = logits.float().softmax(dim=-1)
                idx = out_idx if out_idx is not None else probs.topk(self.k, dim=-1).indices
                with torch.no_grad():
                    cnt = torch.bincount(idx.reshape(-1), minlength=self.E)
                    self.counts[li] += cnt
                    frac = cnt.float() / idx.numel()
                self.aux_terms.append(self.E * (frac * probs.mean(dim=0)).sum())
                return None
            with torch.no_grad():
                computed_w, computed_idx = None, None
                if out_idx is None or self.mode == "record":
                    logits = F.linear(hs, module.weight).float()
                    probs = logits.softmax(dim=-1)
                    computed_w, computed_idx = probs.topk(self.k, dim=-1)
                    if self.norm:
                        computed_w = computed_w / computed_w.sum(dim=-1, keepdim=True)
                idx = out_idx if out_idx is not None else computed_idx
                w = out_w if (out_idx is not None and out_w is not None) else computed_w
                self.counts[li] += torch.bincount(idx.reshape(-1), minlength=self.E)
                if self.mode == "record":
                    self.records[li] = {
                        "idx": idx.detach().cpu(),
                        "w": w.detach().float().cpu() if w is not None else None,
                        "computed_idx": computed_idx.detach().cpu(),
                    }
            return None

        return hook


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------

class Batcher:
    """Each step: B random windows of L tokens; round(B * chat_frac) of them from the chat data, of
    which round(. * tool_frac) from the tool-use conversations and the rest from the instruction
    conversations; the others from the code."""

    def __init__(self, code, chat, tools, args, dev):
        import torch

        self.code, self.chat, self.tools = code, chat, tools
        self.L = args.seq_len
        self.B = args.batch
        n_conv = max(1, int(round(self.B * args.chat_frac))) if args.chat_frac > 0 else 0
        has_chat = chat is not None and chat.numel() > 4 * self.L
        has_tools = tools is not None and tools.numel() > 4 * self.L
        self.n_tools = int(round(n_conv * args.tool_frac)) if has_tools else 0
        if not has_chat:
            self.n_tools = n_conv if has_tools else 0
        self.n_chat = n_conv - self.n_tools if has_chat else 0
        self.ar = torch.arange(self.L, device=dev)
        self.gen = torch.Generator(device=dev)
        self.gen.manual_seed(args.seed)

    def _sample(self, stream, n):
        import torch

        starts = torch.randint(0, stream.numel() - self.L, (n,), device=stream.device, generator=self.gen)
        return stream[starts[:, None] + self.ar].long()

    def next(self):
        import torch

        parts = [self._sample(self.code, self.B - self.n_chat - self.n_tools)]
        if self.n_chat:
            parts.append(self._sample(self.chat, self.n_chat))
        if self.n_tools:
            parts.append(self._sample(self.tools, self.n_tools))
        return torch.cat(parts, dim=0)


def train_step_loss(model, tap, x, coef, dev):
    tap.begin("train")
    with autocast_ctx(dev):
        out = model(input_ids=x, labels=x, use_cache=False)
        aux = tap.aux()
        loss = out.loss + coef * aux
    return loss, out.loss, aux


def grad_norm(params):
    import torch

    sq = [p.grad.detach().float().pow(2).sum() for p in params if p.grad is not None]
    return float(torch.sqrt(torch.stack(sq).sum())) if sq else 0.0


def choose_experts_impl(model, tap, batcher, args, dev):
    """Times a forward+backward with each experts backend; keeps the fastest whose loss and
    gradient norm match the eager reference."""
    import torch

    initial = get_experts_impl(model)
    if args.experts_impl != "auto":
        ok = set_experts_impl(model, args.experts_impl)
        log(f"experts backend: {args.experts_impl} ({'set' if ok else 'could not be set; using ' + str(initial)})")
        return args.experts_impl if ok else str(initial)
    if dev.type != "cuda":
        set_experts_impl(model, "eager")
        return get_experts_impl(model) or "default"
    params = [p for p in model.parameters() if p.requires_grad]
    x = batcher.next()
    results = {}
    for name in ("eager", "grouped_mm"):
        if not set_experts_impl(model, name):
            results[name] = "cannot be selected"
            continue
        try:
            model.zero_grad(set_to_none=True)
            loss, _, _ = train_step_loss(model, tap, x, args.aux_coef, dev)
            loss.backward()
            lval, gn = float(loss), grad_norm(params)
            model.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            t = time.time()
            for _ in range(3):
                loss, _, _ = train_step_loss(model, tap, x, args.aux_coef, dev)
                loss.backward()
                model.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            dt = (time.time() - t) / 3
            if not (math.isfinite(lval) and math.isfinite(gn)):
                raise RuntimeError(f"non-finite loss {lval} / grad norm {gn}")
            results[name] = (lval, gn, dt)
        except Exception as e:
            results[name] = f"{e.__class__.__name__}: {str(e)[:200]}"
            model.zero_grad(set_to_none=True)
    tap.reset_counts()
    for name, r in results.items():
        if isinstance(r, tuple):
            log(f"experts backend {name:10s}: loss {r[0]:.4f}, grad norm {r[1]:.4f}, "
                f"{r[2] * 1000:.0f} ms/step ({args.batch * args.seq_len / r[2] / 1e6:.2f} M tok/s)")
        else:
            log(f"experts backend {name:10s}: {r}")
    ref = results.get("eager")
    choice = None
    if isinstance(ref, tuple):
        choice = "eager"
        g = results.get("grouped_mm")
        if isinstance(g, tuple) and abs(g[0] - ref[0]) < 0.02 and abs(g[1] - ref[1]) <= 0.05 * ref[1] + 1e-6 \
                and g[2] < 0.95 * ref[2]:
            choice = "grouped_mm"
    else:
        g = results.get("grouped_mm")
        if isinstance(g, tuple):
            choice = "grouped_mm"
    if choice is None:
        if initial is not None:
            set_experts_impl(model, initial)
        try:  # last resort: whatever the model does by default
            model.zero_grad(set_to_none=True)
            loss, _, _ = train_step_loss(model, tap, x, args.aux_coef, dev)
            loss.backward()
            model.zero_grad(set_to_none=True)
        except Exception as e:
            die(f"a training step fails with every experts backend: {results}; default: {e}")
        return str(initial)
    set_experts_impl(model, choice)
    log(f"experts backend for training: {choice}")
    return choice


def train(model, tap, batcher, args, dev, train_seconds):
    import torch

    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=(dev.type == "cuda"),
    )
    params = decay + no_decay
    model.train()
    model.config.use_cache = False
    tap.reset_counts()
    tokens_per_step = batcher.B * batcher.L
    history = []
    step = skipped = 0
    t_start = time.time()
    deadline = t_start + train_seconds
    last_log = t_start
    acc_loss = torch.zeros((), device=dev)
    acc_aux = torch.zeros((), device=dev)
    acc_n = 0
    last_gn = 0.0
    log(f"training for {train_seconds:.0f}s: batch {batcher.B} x {batcher.L} tokens "
        f"({batcher.n_chat} instruction + {batcher.n_tools} tool-use chat windows per step), peak lr {args.lr}, "
        f"warmup {args.warmup_steps} steps")
    while True:
        now = time.time()
        if now >= deadline:
            break
        frac = min(1.0, (now - t_start) / train_seconds)
        warm = min(1.0, (step + 1) / max(1, args.warmup_steps))
        lr = args.lr * warm * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        x = batcher.next()
        loss, ce, aux = train_step_loss(model, tap, x, args.aux_coef, dev)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
        if not torch.isfinite(gn):
            opt.zero_grad(set_to_none=True)
            skipped += 1
            log(f"step {step}: non-finite gradient norm, step skipped ({skipped})")
            if skipped > 20:
                die("more than 20 steps with non-finite gradients; lower --lr")
            continue
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        acc_loss += ce.detach()
        acc_aux += aux.detach()
        acc_n += 1
        now = time.time()
        if step == 1 or now - last_log >= args.log_every or now >= deadline:
            l_avg = float(acc_loss) / acc_n
            a_avg = float(acc_aux) / acc_n
            last_gn = float(gn)
            counts = tap.counts.float()
            top_n = max(1, math.ceil(0.1 * args.experts))
            skew = (counts.sort(dim=1, descending=True).values[:, :top_n].sum(1) / counts.sum(1).clamp_min(1))
            el = now - t_start
            tps = step * tokens_per_step / max(el, 1e-9)
            log(f"step {step:5d}  loss {l_avg:.4f}  aux {a_avg:.4f}  lr {lr:.2e}  gnorm {last_gn:.3f}  "
                f"{tps / 1e6:.2f} M tok/s  top-{top_n} expert share {float(skew.mean()) * 100:.1f}% "
                f"(min {float(skew.min()) * 100:.1f}, max {float(skew.max()) * 100:.1f})  [{el:.0f}s]")
            if not math.isfinite(l_avg):
                die("training loss is not finite")
            history.append({"step": step, "seconds": round(el, 1), "tokens": step * tokens_per_step,
                            "loss": round(l_avg, 4), "aux": round(a_avg, 4), "lr": lr})
            acc_loss.zero_()
            acc_aux.zero_()
            acc_n = 0
            tap.reset_counts()
            last_log = now
    secs = time.time() - t_start
    tap.begin("off")
    return {"steps": step, "tokens": step * tokens_per_step, "seconds": secs, "skipped": skipped,
            "history": history, "final_loss": history[-1]["loss"] if history else float("nan"),
            "tokens_per_second": step * tokens_per_step / max(secs, 1e-9)}


# ----------------------------------------------------------------------------------------------
# Saving and verification
# ----------------------------------------------------------------------------------------------

def safetensors_layout(path):
    from safetensors import safe_open

    out = []
    with safe_open(path, framework="pt") as f:
        for k in f.keys():
            sl = f.get_slice(k)
            out.append((k, tuple(sl.get_shape()), str(sl.get_dtype())))
    return sorted(out)


def layout_patterns(layout):
    import re

    pats = {}
    for name, shape, dtype in layout:
        p = re.sub(r"\.layers\.\d+\.", ".layers.{L}.", name)
        p = re.sub(r"\.experts\.\d+\.", ".experts.{E}.", p)
        key = (p, shape, dtype)
        pats[key] = pats.get(key, 0) + 1
    return sorted(((p, s, d, n) for (p, s, d), n in pats.items()), key=lambda t: t[0])


def ensure_per_expert_layout(model_file, args):
    """If the checkpoint holds fused experts tensors, rewrite them as one tensor per expert
    (the Hub layout: mlp.experts.{e}.gate_proj/up_proj/down_proj.weight). Returns True if changed."""
    import torch
    from safetensors.torch import load_file, save_file

    sd = load_file(model_file)
    fused = [k for k in sd if k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj")]
    if not fused:
        return False
    E, H, I = args.experts, args.hidden, args.moe_intermediate
    new = {}
    for k, v in sd.items():
        if k.endswith("experts.gate_up_proj"):
            prefix = k[: -len("gate_up_proj")]
            down = sd[prefix + "down_proj"]
            transposed = tuple(down.shape) == (E, I, H) and I != H  # [E, in, out] storage
            gu = v.transpose(1, 2) if transposed else v  # -> [E, 2I, H]
            if tuple(gu.shape) != (E, 2 * I, H):
                raise RuntimeError(f"unexpected fused gate_up shape {tuple(v.shape)}")
            for e in range(E):
                new[f"{prefix}{e}.gate_proj.weight"] = gu[e, :I].contiguous()
                new[f"{prefix}{e}.up_proj.weight"] = gu[e, I:].contiguous()
        elif k.endswith("experts.down_proj"):
            prefix = k[: -len("down_proj")]
            transposed = tuple(v.shape) == (E, I, H) and I != H
            d = v.transpose(1, 2) if transposed else v  # -> [E, H, I]
            if tuple(d.shape) != (E, H, I):
                raise RuntimeError(f"unexpected fused down shape {tuple(v.shape)}")
            for e in range(E):
                new[f"{prefix}{e}.down_proj.weight"] = d[e].contiguous()
        else:
            new[k] = v
    tmp = model_file + ".tmp"
    save_file({k: t.to(torch.bfloat16).contiguous() for k, t in new.items()}, tmp, metadata={"format": "pt"})
    del sd, new
    os.replace(tmp, model_file)
    return True


def patch_config_json(stage, args, ids):
    """Classic Hub keys next to whatever transformers 5 wrote: rope_theta at top level (v5 keeps it
    inside rope_parameters), num_experts, head_dim, torch_dtype."""
    path = os.path.join(stage, "config.json")
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    original = copy.deepcopy(cfg)
    rp = cfg.get("rope_parameters")
    theta = None
    if isinstance(rp, dict):
        theta = rp.get("rope_theta")
    if theta is None:
        theta = cfg.get("rope_theta", args.rope_theta)
    cfg["rope_theta"] = float(theta)
    if "num_experts" not in cfg:
        cfg["num_experts"] = int(cfg.get("num_local_experts", args.experts))
    cfg.setdefault("head_dim", args.head_dim)
    if "torch_dtype" not in cfg:
        cfg["torch_dtype"] = cfg.get("dtype", "bfloat16")
    cfg["output_router_logits"] = False
    cfg["router_aux_loss_coef"] = args.aux_coef
    cfg["use_cache"] = True
    cfg["tie_word_embeddings"] = True
    cfg["bos_token_id"] = None
    cfg["eos_token_id"] = ids["<|im_end|>"]
    cfg["pad_token_id"] = ids["<|endoftext|>"]
    problems = []
    expected = (("model_type", "qwen3_moe"), ("architectures", ["Qwen3MoeForCausalLM"]),
                ("hidden_size", args.hidden), ("num_hidden_layers", args.layers),
                ("num_attention_heads", args.heads), ("num_key_value_heads", args.kv_heads),
                ("num_experts", args.experts), ("num_experts_per_tok", args.top_k),
                ("moe_intermediate_size", args.moe_intermediate), ("vocab_size", args.vocab),
                ("max_position_embeddings", args.max_pos), ("hidden_act", "silu"), ("norm_topk_prob", True),
                ("decoder_sparse_step", 1), ("mlp_only_layers", []), ("use_sliding_window", False),
                ("attention_bias", False), ("rms_norm_eps", 1e-6))
    for k, want in expected:
        if k not in cfg or cfg[k] is None and want is not None:
            log(f"config.json: adding missing {k} = {want!r}")
            cfg[k] = want
        elif cfg[k] != want:
            problems.append(f"{k}={cfg[k]!r} (wanted {want!r})")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    return original, problems


def write_generation_config(stage, ids):
    import transformers

    gen = {
        "do_sample": True,
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
        "temperature": 0.7,
        "top_p": 0.9,
        "transformers_version": transformers.__version__,
    }
    with open(os.path.join(stage, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump(gen, f, indent=2, sort_keys=True)
        f.write("\n")


def load_saved(path, dtype, device, attn="eager", experts="eager"):
    from transformers import AutoModelForCausalLM

    kw = dict(dtype=dtype, attn_implementation=attn)
    try:
        m = AutoModelForCausalLM.from_pretrained(path, experts_implementation=experts, **kw)
    except Exception as e:
        log(f"from_pretrained(experts_implementation=...) failed ({e.__class__.__name__}: {e}); "
            f"loading without it")
        m = AutoModelForCausalLM.from_pretrained(path, **kw)
    set_experts_impl(m, experts)
    set_attn_impl(m, attn)
    m.to(device)
    m.eval()
    return m


def verify_saved(model, stage, probe_ids):
    """Reload the saved folder with AutoModelForCausalLM: every tensor must be bit-identical to the
    in-memory bf16 model, and float32 CPU logits (eager attention and experts) must match exactly."""
    import torch

    report = {}
    re16 = load_saved(stage, torch.bfloat16, "cpu")
    if re16.__class__.__name__ != "Qwen3MoeForCausalLM":
        raise RuntimeError(f"reloaded class is {re16.__class__.__name__}")
    sd_mem = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    sd_re = re16.state_dict()
    if set(sd_mem) != set(sd_re):
        raise RuntimeError(f"state dict keys differ: only in memory {sorted(set(sd_mem) - set(sd_re))[:5]}, "
                           f"only reloaded {sorted(set(sd_re) - set(sd_mem))[:5]}")
    bad = [k for k in sd_mem if sd_mem[k].dtype != sd_re[k].dtype or not torch.equal(sd_mem[k], sd_re[k])]
    if bad:
        raise RuntimeError(f"{len(bad)} tensors differ after reload, e.g. {bad[:5]}")
    report["tensors_equal"] = len(sd_mem)
    del re16
    report["probe_tokens"] = len(probe_ids)
    try:
        ref = copy.deepcopy(model).to(device="cpu", dtype=torch.float32).eval()
        set_attn_impl(ref, "eager")
        set_experts_impl(ref, "eager")
        re32 = load_saved(stage, torch.float32, "cpu")
        x = torch.tensor([probe_ids], dtype=torch.long)
        with torch.no_grad():
            a = ref(input_ids=x, use_cache=False).logits
            b = re32(input_ids=x, use_cache=False).logits
        report["logits_exact"] = bool(torch.equal(a, b))
        report["logits_max_abs_diff"] = float((a - b).abs().max())
    except Exception as e:
        traceback.print_exc()
        report["logits_exact"] = False
        report["logits_max_abs_diff"] = float("nan")
        report["logits_error"] = f"{e.__class__.__name__}: {e}"
    return report


def cast_params_bf16(model):
    """Parameters only: buffers (RoPE inv_freq) stay float32, as from_pretrained makes them."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.to(torch.bfloat16)


def save_checkpoint(model, stage, args, ids, probe_ids):
    """save_pretrained + generation_config.json + classic config keys + per-expert layout, then the
    reload check. Falls back to transformers' own files where a change of ours does not verify.
    Returns (report, notes); raises if the folder does not reload identically."""
    from transformers import GenerationConfig

    notes = []
    model.config.use_cache = True
    model.config.output_router_logits = False
    model.generation_config = GenerationConfig(
        do_sample=True, temperature=0.7, top_p=0.9, pad_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]])
    model.save_pretrained(stage)
    model_file = os.path.join(stage, "model.safetensors")
    if not os.path.exists(model_file):
        raise RuntimeError(f"save_pretrained wrote no single model.safetensors: {sorted(os.listdir(stage))}")
    write_generation_config(stage, ids)
    original_cfg, problems = patch_config_json(stage, args, ids)
    if problems:
        notes.append("config.json differs from what was asked: " + "; ".join(problems))
        log("WARNING: " + notes[-1])
    layout = safetensors_layout(model_file)
    backup = model_file + ".fused"
    fused_rewritten = False
    if any(k.endswith(("experts.gate_up_proj", "experts.down_proj")) for k, _, _ in layout):
        log("the checkpoint has fused expert tensors; rewriting them one tensor per expert")
        shutil.copyfile(model_file, backup)
        ensure_per_expert_layout(model_file, args)
        fused_rewritten = True

    def try_verify():
        try:
            return verify_saved(model, stage, probe_ids), None
        except Exception as e:
            traceback.print_exc()
            return None, e

    rep, err = try_verify()
    if err is not None and fused_rewritten:
        log(f"the per-expert rewrite did not verify ({err}); restoring transformers' fused file")
        os.replace(backup, model_file)
        rep, err = try_verify()
        if err is None:
            notes.append("model.safetensors keeps transformers' fused expert tensors (the per-expert rewrite did "
                          "not verify)")
    if err is not None:
        log(f"reload failed ({err}); retrying with transformers' own config.json")
        with open(os.path.join(stage, "config.json"), "w", encoding="utf-8") as f:
            json.dump(original_cfg, f, indent=2, sort_keys=True)
            f.write("\n")
        rep, err2 = try_verify()
        if err2 is not None:
            raise RuntimeError(f"reload check failed: {err}; with transformers' own config.json: {err2}")
        notes.append(f"config.json patch (rope_theta/num_experts/head_dim/torch_dtype) broke the reload, "
                     f"kept transformers' own: {err}")
    if os.path.exists(backup):
        os.remove(backup)
    if rep.get("logits_error"):
        notes.append(f"float32 logits comparison failed: {rep['logits_error']}")
    return rep, notes


def preflight(args, ids):
    """Runs every transformers call of the real run on the real architecture, on the CPU, in a few
    seconds: config, model, router hooks and the loss with a backward pass, save_pretrained, the
    config.json patch, the layout check, the reload check, the fixture-style float32 load, router
    top-k recording and greedy decoding. Whatever fails here would fail after training."""
    import tempfile

    import torch

    t0 = time.time()
    cfg = build_config(args, ids)
    model = build_model(cfg, args)
    set_attn_impl(model, "eager")
    set_experts_impl(model, "eager")
    tap = RouterTap(model, args.experts, args.top_k, True)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(3, args.vocab, (2, 16), generator=g)
    loss, ce, aux = train_step_loss(model, tap, x, args.aux_coef, torch.device("cpu"))
    loss.backward()
    if not math.isfinite(float(loss)) or abs(float(ce) - math.log(args.vocab)) > 1.0:
        raise RuntimeError(f"initial loss {float(ce):.3f} is far from ln(vocab) = {math.log(args.vocab):.3f}")
    if model.model.layers[0].mlp.gate.weight.grad is None:
        raise RuntimeError("the load-balancing loss does not reach the router weights")
    tap.remove()
    model.zero_grad(set_to_none=True)
    model.eval()
    cast_params_bf16(model)
    tmp = tempfile.mkdtemp(prefix="spill-tiny-preflight-")
    try:
        rep, notes = save_checkpoint(model, tmp, args, ids, x[0].tolist())
        layout = safetensors_layout(os.path.join(tmp, "model.safetensors"))
        fused = any(k.endswith(("experts.gate_up_proj", "experts.down_proj")) for k, _, _ in layout)
        m32 = load_saved(tmp, torch.float32, "cpu", attn="eager", experts="eager")
        t2 = RouterTap(m32, args.experts, args.top_k, True)
        t2.begin("record")
        with torch.no_grad():
            m32(input_ids=x[:1], use_cache=False)
        t2.remove()
        if sorted(t2.records) != list(range(args.layers)):
            raise RuntimeError(f"router hooks recorded layers {sorted(t2.records)}")
        greedy = greedy_argmax(m32, x[0, :4].tolist(), 2, "cpu")
        try:
            gen = generate_ids(m32, x[0, :4].tolist(), 2, "cpu", [ids["<|im_end|>"]], ids["<|endoftext|>"], min_new=2)
        except Exception as e:
            gen = f"generate() failed: {e.__class__.__name__}: {e}"
        # The tool-call evaluation's path: several prompts of different lengths, left-padded, one generate().
        stop = [ids["<|im_end|>"], ids["<|endoftext|>"]]
        prompts = [x[0, :5].tolist(), x[1, :9].tolist()]
        try:
            batched = generate_batch(m32, prompts, 3, "cpu", stop, ids["<|endoftext|>"])
            alone = [cut_at_stop(generate_ids(m32, p, 3, "cpu", stop, ids["<|endoftext|>"]), set(stop)) for p in prompts]
            nocache = greedy_batch_nocache(m32, prompts, 3, "cpu", stop, ids["<|endoftext|>"])
            batch_note = (f"batched generate {'matches' if batched == alone else 'DIFFERS from'} one-by-one, "
                          f"forward-only batch {'matches' if nocache == alone else 'DIFFERS'}")
            if batched != alone or nocache != alone:
                notes.append(f"preflight: left-padded batched generate gave {batched}, forward-only batch {nocache}, "
                             f"one prompt at a time {alone}")
        except Exception as e:
            traceback.print_exc()
            batch_note = f"batched generate FAILED ({e.__class__.__name__}: {e}); the tool eval will go one by one"
        # The chat template through transformers: AutoTokenizer + apply_chat_template(tools=...) on a
        # throwaway tokenizer that has the real tokenizer_config.json (the same check runs after training).
        tmpl_note = preflight_template(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"preflight ok in {time.time() - t0:.1f}s: {len(layout)} tensors "
        f"({'FUSED experts' if fused else 'one per expert'}), reload bit-identical, float32 logits exact "
        f"{rep['logits_exact']}, router ids from {'the router output' if tap.from_router_output else 'softmax top-k'}, "
        f"greedy {greedy} / generate {gen}; {batch_note}; {tmpl_note}")
    for n in notes:
        log(f"preflight note: {n}")
    return notes



def preflight_template(args, tmp):
    """AutoTokenizer.from_pretrained + apply_chat_template(tools=...) with the real
    tokenizer_config.json and a throwaway 300-token BPE: returns a one-line summary; differences from
    render_chat are logged (the check after training reports them as errors)."""
    import spill_tokenizer as stok
    import spill_tool_data as td

    d = os.path.join(tmp, "tokenizer")
    os.makedirs(d, exist_ok=True)
    try:
        docs = [FIXTURE_SNIPPET, td.TOOLS_HEADER, td.TOOLS_FOOTER.replace("<|im_end|>", ""),
                td.expected_call_text("get_weather", {"city": "Paris"})] * 4
        tok, tids, _ = stok.train_tokenizer(docs, 300, 1.0, 0)
        tok.save(os.path.join(d, "tokenizer.json"))
        stok.write_json(os.path.join(d, "tokenizer_config.json"), stok.tokenizer_config(args.max_pos, tids))
        from transformers import AutoTokenizer

        hft = AutoTokenizer.from_pretrained(d)
        cases = template_cases_for_transformers()
        problems = template_mismatches(hft, cases)
    except Exception as e:
        traceback.print_exc()
        log(f"WARNING: preflight: chat template check through transformers failed: {e.__class__.__name__}: {e}")
        return f"chat template check FAILED ({e.__class__.__name__})"
    for p in problems:
        log(f"WARNING: preflight: chat template: {p}")
    return (f"apply_chat_template(tools=...) == render_chat on {len(cases)} conversations" if not problems
            else f"apply_chat_template DIFFERS from render_chat on {len(problems)} of {len(cases)} conversations")


def replace_dir(stage, out):
    old = None
    if os.path.exists(out):
        old = f"{out}.old-{os.getpid()}"
        os.rename(out, old)
    os.rename(stage, out)
    if old:
        shutil.rmtree(old, ignore_errors=True)


# ----------------------------------------------------------------------------------------------
# Evaluation, samples, fixture
# ----------------------------------------------------------------------------------------------

def evaluate(model, held, args, dev):
    import numpy as np
    import torch

    L = args.seq_len
    N = held.numel()
    if N < L + 2:
        raise RuntimeError(f"held-out stream has only {N} tokens")
    n = max(1, min(args.eval_windows, (N - 1) // L))
    starts = torch.tensor(np.linspace(0, N - L - 1, n).astype(np.int64), device=dev)
    ar = torch.arange(L, device=dev)
    tap = RouterTap(model, args.experts, args.top_k, True)
    tap.begin("count")
    total, count = 0.0, 0
    model.eval()
    try:
        with torch.no_grad():
            for i in range(0, n, 32):
                x = held[starts[i:i + 32, None] + ar].long()
                out = model(input_ids=x, labels=x, use_cache=False)
                total += float(out.loss) * x.shape[0]
                count += x.shape[0]
        counts = tap.counts.cpu().tolist()
    finally:
        tap.remove()
    loss = total / count
    top_n = max(1, math.ceil(0.1 * args.experts))
    per_layer = []
    for li, c in enumerate(counts):
        s = sum(c)
        srt = sorted(c, reverse=True)
        per_layer.append({
            "layer": li,
            "counts": c,
            "top10pct_share": sum(srt[:top_n]) / s,
            "max_expert_share": srt[0] / s,
            "min_expert_share": srt[-1] / s,
            "unused_experts": sum(1 for v in c if v == 0),
        })
    shares = [p["top10pct_share"] for p in per_layer]
    return {
        "loss": loss,
        "perplexity": math.exp(loss),
        "windows": n,
        "seq_len": L,
        "tokens": n * L,
        "routings_per_layer": n * L * args.top_k,
        "top10pct_experts": top_n,
        "per_layer": per_layer,
        "skew_min": min(shares),
        "skew_max": max(shares),
        "skew_mean": sum(shares) / len(shares),
        "uniform_share": top_n / args.experts,
    }


def greedy_argmax(model, prompt_ids, n_new, device, stop_ids=()):
    """Plain greedy decoding: full recompute each step, argmax of the last position (the first
    maximum, as torch.argmax), stopping after a token in stop_ids. With no stop_ids this is what
    spill's parity test computes. Independent of generation_config.json (which samples)."""
    import torch

    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(n_new):
            logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0, -1]
            ids.append(int(torch.argmax(logits)))
            if ids[-1] in stop_ids:
                break
    return ids[len(prompt_ids):]


def generate_ids(model, prompt_ids, max_new, device, stop_ids, pad_id, min_new=0):
    """transformers generate(), greedy. Everything is passed as keyword arguments: those override
    the model's generation_config.json (do_sample true there), a generation_config object would not."""
    import torch

    x = torch.tensor([prompt_ids], device=device)
    with torch.no_grad():
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                             max_new_tokens=max_new, min_new_tokens=min_new, eos_token_id=list(stop_ids),
                             pad_token_id=pad_id)
    return out[0, len(prompt_ids):].tolist()


def cut_at_stop(new_ids, stop_ids):
    """Tokens before the first stop token (the stop token itself and any padding after it dropped)."""
    for i, t in enumerate(new_ids):
        if t in stop_ids:
            return new_ids[:i]
    return new_ids


def generate_batch(model, prompts, max_new, device, stop_ids, pad_id):
    """Greedy transformers generate() over several prompts at once, left-padded with pad_id and an
    attention mask. Returns the new tokens of each prompt, cut before the first stop token."""
    import torch

    L = max(len(p) for p in prompts)
    x = torch.full((len(prompts), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), L), dtype=torch.long)
    for j, p in enumerate(prompts):
        x[j, L - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[j, L - len(p):] = 1
    x, mask = x.to(device), mask.to(device)
    with torch.no_grad():
        out = model.generate(input_ids=x, attention_mask=mask, do_sample=False, max_new_tokens=max_new,
                             eos_token_id=list(stop_ids), pad_token_id=pad_id)
    return [cut_at_stop(out[j, L:].tolist(), set(stop_ids)) for j in range(len(prompts))]


def greedy_batch_nocache(model, prompts, max_new, device, stop_ids, pad_id):
    """Fallback for generate_batch that uses only the model's forward (as evaluate() does): each step
    recomputes the left-padded batch (attention mask, position ids from it) and takes the argmax of
    the last position; rows stop at a stop token."""
    import torch

    seqs = [list(p) for p in prompts]
    new = [[] for _ in prompts]
    done = [False] * len(prompts)
    stop = set(stop_ids)
    with torch.no_grad():
        for _ in range(max_new):
            L = max(len(q) for q in seqs)
            x = torch.full((len(seqs), L), pad_id, dtype=torch.long)
            mask = torch.zeros((len(seqs), L), dtype=torch.long)
            for j, q in enumerate(seqs):
                x[j, L - len(q):] = torch.tensor(q, dtype=torch.long)
                mask[j, L - len(q):] = 1
            x, mask = x.to(device), mask.to(device)
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = model(input_ids=x, attention_mask=mask, position_ids=pos, use_cache=False).logits[:, -1]
            nxt = logits.argmax(-1).tolist()
            for j, t in enumerate(nxt):
                if not done[j]:
                    new[j].append(int(t))
                    seqs[j].append(int(t))
                    done[j] = int(t) in stop
            if all(done):
                break
    return [cut_at_stop(n, stop) for n in new]


def tool_eval(model, tok, ids, dev, evals, no_call, max_new=64, time_cap=90.0):
    """Tool-call accuracy: greedy replies (transformers generate, at most max_new tokens) to held-out
    prompts with the tools in the system turn. exact: the reply holds a <tool_call>{json}</tool_call>
    with the right tool name and exactly the right arguments (keys, values and JSON types). Plain
    Python questions asked with tools present should get no tool call. All prompts go through
    generate() in one left-padded batch; the first prompt also alone, as the sample for the card."""
    import spill_tool_data as td
    from spill_tokenizer import render_chat

    t0 = time.time()
    model.eval()
    model.config.use_cache = True
    stop = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    pad = ids["<|endoftext|>"]
    items = [(e, render_chat(e["messages"], True, e["tools"])) for e in evals] + \
            [(e, render_chat(e["messages"], True, e["tools"])) for e in no_call]
    enc = [tok.encode(text, add_special_tokens=False).ids for _e, text in items]
    res = {"prompts": len(evals), "no_call_prompts": len(no_call), "max_new_tokens": max_new,
           "prompt_tokens_max": max(len(e) for e in enc), "prompt_tokens_mean": sum(map(len, enc)) / len(enc)}
    want = [len(tok.encode(td.expected_call_text(e["name"], e["arguments"]), add_special_tokens=False).ids)
            for e in evals]
    res["expected_call_tokens_max"] = max(want) if want else 0
    res["prompt_plus_call_tokens_max"] = max((len(p) + w for p, w in zip(enc, want)), default=0)
    if res["prompt_plus_call_tokens_max"] > 512:
        log(f"tool eval: note: a prompt plus its call is {res['prompt_plus_call_tokens_max']} tokens, longer than "
            f"the 512-token training windows")
    if res["expected_call_tokens_max"] >= max_new:
        log(f"tool eval: note: the longest expected call is {res['expected_call_tokens_max']} tokens "
            f"(limit {max_new})")
    outs, how = None, "generate() on all prompts in one left-padded batch"
    try:
        outs = []
        for i in range(0, len(enc), 64):
            outs.extend(generate_batch(model, enc[i:i + 64], max_new, dev, stop, pad))
    except Exception as e:
        traceback.print_exc()
        log(f"tool eval: batched generate() failed ({e.__class__.__name__}: {e}); greedy decoding with the "
            f"model's forward instead")
        outs, how = [], "greedy decoding with the model's forward, left-padded batch, no KV cache (generate() failed)"
        for i in range(0, len(enc), 64):
            if time.time() - t0 > time_cap:
                break
            outs.extend(greedy_batch_nocache(model, enc[i:i + 64], max_new, dev, stop, pad))
    texts = [tok.decode(o, skip_special_tokens=False) for o in outs]
    n_ev = min(len(evals), len(texts))
    scores = [td.score_output(texts[i], evals[i]["name"], evals[i]["arguments"]) for i in range(n_ev)]
    res.update({"evaluated": n_ev, "how": how,
                "exact": sum(s["exact"] for s in scores), "valid": sum(s["valid"] for s in scores),
                "name": sum(s["name"] for s in scores)})
    nc_texts = texts[len(evals):]
    res["no_call_evaluated"] = len(nc_texts)
    res["no_call_ok"] = sum(1 for t in nc_texts if "<tool_call>" not in t)
    res["per_tool"] = {}
    for e, sc in zip(evals, scores):
        d = res["per_tool"].setdefault(e["name"], [0, 0])
        d[0] += int(sc["exact"])
        d[1] += 1
    res["failures"] = [{"user": evals[i]["messages"][-1]["content"],
                        "expected": td.expected_call_text(evals[i]["name"], evals[i]["arguments"]),
                        "got": texts[i]} for i in range(n_ev) if not scores[i]["exact"]][:5]
    if evals and texts:
        try:
            alone = cut_at_stop(generate_ids(model, enc[0], max_new, dev, stop, pad), set(stop))
            res["sample_matches_batch"] = alone == outs[0]
            if alone != outs[0]:
                log("tool eval: note: the first prompt generated alone differs from its reply in the batch "
                    "(bf16 and padding change the arithmetic a little; a near tie can flip)")
        except Exception as e:
            alone = outs[0]
            res["sample_matches_batch"] = f"generate() alone failed: {e.__class__.__name__}: {e}"
        res["sample"] = {"rendered": items[0][1], "reply": tok.decode(alone, skip_special_tokens=False),
                         "expected": td.expected_call_text(evals[0]["name"], evals[0]["arguments"]),
                         "score": td.score_output(tok.decode(alone, skip_special_tokens=False), evals[0]["name"],
                                                  evals[0]["arguments"])}
    res["seconds"] = time.time() - t0
    return res


def samples(model, tok, ids, dev):
    from spill_tokenizer import render_chat

    res = {}
    model.eval()
    model.config.use_cache = True
    stop = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    p = tok.encode(GREEDY_PROMPT, add_special_tokens=False).ids
    new = greedy_argmax(model, p, 64, dev, stop)
    res["completion_prompt"] = GREEDY_PROMPT
    res["completion"] = tok.decode(new, skip_special_tokens=False)
    res["completion_tokens"] = len(new)
    chat = render_chat([{"role": "user", "content": CHAT_PROMPT}], add_generation_prompt=True)
    c = tok.encode(chat, add_special_tokens=False).ids
    new = greedy_argmax(model, c, 160, dev, stop)
    res["chat_prompt"] = CHAT_PROMPT
    res["chat_rendered"] = chat
    res["chat_reply"] = tok.decode(new, skip_special_tokens=False)
    res["chat_tokens"] = len(new)
    return res


def make_fixture(model_dir, fixture_dir, args):
    """tests/data/spill-tiny/expected.json from the SAVED checkpoint: transformers, float32, CPU,
    eager attention and experts."""
    import torch
    from tokenizers import Tokenizer

    from spill_tokenizer import EOT, IM_END

    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    model = load_saved(model_dir, torch.float32, "cpu", attn="eager", experts="eager")
    cfg = model.config
    E = num_experts_of(cfg)
    k = int(cfg.num_experts_per_tok)
    tap = RouterTap(model, E, k, bool(cfg.norm_topk_prob))
    ids = tok.encode(FIXTURE_SNIPPET, add_special_tokens=False).ids[:FIXTURE_TOKENS]
    if len(ids) < FIXTURE_LOGIT_ROWS:
        raise RuntimeError(f"fixture snippet encodes to only {len(ids)} tokens")
    try:
        tap.begin("record")
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
        records = dict(tap.records)
        tap.begin("off")
    finally:
        tap.remove()
    n_layers = len(model.model.layers)
    if sorted(records) != list(range(n_layers)):
        raise RuntimeError(f"router hooks recorded layers {sorted(records)}, expected 0..{n_layers - 1}")
    router_topk, router_w, mismatches = [], [], 0
    for li in range(n_layers):
        r = records[li]
        router_topk.append(r["idx"].tolist())
        router_w.append(r["w"].tolist() if r["w"] is not None else None)
        mismatches += int((r["idx"] != r["computed_idx"]).any(dim=-1).sum())
    positions = list(range(len(ids) - FIXTURE_LOGIT_ROWS, len(ids)))
    rows = [[float(v) for v in logits[p].tolist()] for p in positions]
    prompt = tok.encode(GREEDY_PROMPT, add_special_tokens=False).ids
    greedy = greedy_argmax(model, prompt, FIXTURE_GREEDY, "cpu")
    eos = [tok.token_to_id(IM_END), tok.token_to_id(EOT)]
    try:
        gen = generate_ids(model, prompt, FIXTURE_GREEDY, "cpu", eos, tok.token_to_id(EOT), min_new=FIXTURE_GREEDY)
    except Exception as e:
        gen = None
        log(f"fixture: generate() failed ({e.__class__.__name__}: {e}); kept the plain greedy loop's tokens")
    obj = {
        "input_ids": ids,
        "logits_positions": positions,
        "logits": rows,
        "router_topk": router_topk,
        "greedy_prompt": prompt,
        "greedy_tokens": greedy,
        "meta": {
            "model": "spill-tiny",
            "made_by": "tools/train/train_spill_tiny.py",
            "reference": "transformers Qwen3MoeForCausalLM from the saved folder, float32, CPU, "
                         "attn_implementation=eager, experts eager",
            "input_text": FIXTURE_SNIPPET,
            "greedy_prompt_text": GREEDY_PROMPT,
            "greedy": "argmax of the last position, 16 steps, no EOS handling",
            "greedy_generate_min_new_tokens_16": gen,
            "greedy_matches_generate": (gen == greedy) if gen is not None else None,
            "router_topk_weights": router_w,
            "router_topk_from": "router output" if tap.from_router_output else "softmax(gate logits) top-k",
            "router_topk_recomputed_mismatches": mismatches,
            "transformers": __import__("transformers").__version__,
            "torch": torch.__version__,
        },
    }
    text = json.dumps(obj, separators=(",", ":"))
    os.makedirs(fixture_dir, exist_ok=True)
    path = os.path.join(fixture_dir, "expected.json")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.write("\n")
    os.replace(tmp, path)
    info = {"path": path, "bytes": len(text) + 1, "tokens": len(ids), "greedy": greedy,
            "greedy_matches_generate": obj["meta"]["greedy_matches_generate"],
            "router_mismatches": mismatches}
    if gen is not None and gen != greedy:
        log(f"fixture: note: generate(min_new_tokens=16) gave {gen}, plain greedy gave {greedy} "
            f"(EOS suppression or a near tie); expected.json keeps the plain greedy tokens")
    if mismatches:
        log(f"fixture: WARNING: {mismatches} token/layer top-k sets differ between the router output and "
            f"softmax(gate) top-k")
    if info["bytes"] > 2_000_000:
        log(f"fixture: WARNING: expected.json is {info['bytes'] / 1e6:.2f} MB (> 2 MB)")
    return info


# ----------------------------------------------------------------------------------------------
# Model card
# ----------------------------------------------------------------------------------------------

def fmt_int(n):
    return f"{n:,}"


def cell(v):
    return str(v).replace("|", "\\|").replace("\n", " ")


def write_tool_section(a, R):
    """The model card's tool-use section: format, training data, measured accuracy, a sample."""
    args = R["args"]
    info = R.get("tool_data") or {}
    te = R.get("tool_eval")
    a("## Tool use")
    a("")
    a("The chat template is Qwen2.5/Qwen3-style: when tools are given, the system turn (after the system message, "
      "if any) lists them, one JSON schema per line inside `<tools></tools>`, and asks for calls as "
      "`<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call>`. An assistant "
      "turn is its content followed by its calls in that form (`arguments` rendered with `tojson`, or as is when "
      "it is a string); consecutive `tool` messages become one user turn of `<tool_response>\\n...\\n"
      "</tool_response>` blocks.")
    a("")
    if info:
        kinds = info.get("kinds", {})
        n = max(1, info.get("conversations", 0))
        a(f"**Training data**: {fmt_int(info.get('conversations', 0))} synthetic conversations "
          f"(`tools/train/spill_tool_data.py`, seed {args.seed}) over {len(info.get('tools', []))} tools "
          f"({', '.join('`' + t + '`' for t in info.get('tools', []))}), rendered through the chat template itself, "
          f"{R['data'].get('tool_tokens', 0) / 1e6:.1f} M tokens. Each has an optional system message, 1-4 tools and "
          "a user request with concrete argument values; the reply is one tool call with the arguments in schema "
          f"order. {kinds.get('call+answer', 0) / n * 100:.0f}% go on with the tool's result and a short answer that "
          f"uses it, {kinds.get('call', 0) / n * 100:.0f}% end at the call, and {kinds.get('no_call', 0) / n * 100:.0f}% "
          "ask a plain Python question (or make small talk) with tools present and get an answer without a call. "
          f"They fill {R.get('tool_windows', 0)} of the {args.batch} windows of every step "
          f"({R.get('tool_windows', 0) / args.batch * 100:.1f}% of training windows; {args.tool_frac * 100:.0f}% of "
          f"the {args.chat_frac * 100:.0f}% chat share).")
        a("")
    if te:
        ne = max(1, te["evaluated"])
        a(f"**Tool-call accuracy: {te['exact']}/{te['evaluated']} ({te['exact'] / ne * 100:.0f}%)** on held-out "
          f"synthetic prompts (seed {info.get('eval_seed')}, none identical to a training prompt): greedy replies from "
          f"the saved bf16 weights through transformers `generate()` (at most {te['max_new_tokens']} new tokens; "
          f"{te['how']}), counted when the reply holds `<tool_call>{{json}}</tool_call>` with the right tool name and "
          f"exactly the right arguments (same keys, values and JSON types). {te['valid']} replies held a parseable "
          f"call, {te['name']} named the right tool. Plain Python questions asked with tools present: "
          f"{te['no_call_ok']}/{te['no_call_evaluated']} answered without a tool call. Prompts are up to "
          f"{te['prompt_tokens_max']} tokens (mean {te['prompt_tokens_mean']:.0f}); prompt plus expected call up to "
          f"{te.get('prompt_plus_call_tokens_max', 0)}.")
        a("")
        if te.get("per_tool"):
            a("| tool | exact / prompts |")
            a("|---|---|")
            for name, (ok, tot) in sorted(te["per_tool"].items()):
                a(f"| `{name}` | {ok} / {tot} |")
            a("")
        smp = te.get("sample")
        if smp:
            a(f"Sample (the first held-out prompt, generated alone; {'exact' if smp['score']['exact'] else 'not exact'}"
              f"; expected `{smp['expected'].replace(chr(10), ' ')}`):")
            a("")
            a("````text")
            a(smp["rendered"] + smp["reply"])
            a("````")
            a("")
    elif R.get("tool_eval_error"):
        a(f"The tool-call evaluation failed: {R['tool_eval_error']}")
        a("")


def write_readme(path, R):
    args = R["args"]
    pc = R["params"]
    ev = R.get("eval")
    tr = R.get("train", {})
    env = R["env"]
    L = []
    a = L.append
    a("---")
    a("license: apache-2.0")
    a("library_name: transformers")
    a("pipeline_tag: text-generation")
    a("tags: [qwen3_moe, mixture-of-experts, code, python, tool-use, tiny, spill]")
    a("---")
    a("")
    a("# spill-tiny")
    a("")
    a("A small but real Mixture-of-Experts language model that writes (simple, often wrong) Python and makes "
      "Qwen/Hermes-style tool calls (`<tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>`). "
      "It is spill's bundled test model: a Qwen3-MoE checkpoint (`model_type: qwen3_moe`) that "
      "transformers loads unchanged, with real routing statistics, small enough to ship with the repository. "
      f"It was trained from scratch in {tr.get('seconds', 0):.0f} s on one {env.get('gpu') or 'CPU'} by "
      "`tools/train/train_spill_tiny.py`, which also wrote this card. It is a test artefact, not a useful "
      "assistant.")
    a("")
    a("## Model")
    a("")
    a("| | |")
    a("|---|---|")
    a("| architecture | `Qwen3MoeForCausalLM` (transformers), decoder-only, RoPE, RMSNorm, per-head q/k norm, SwiGLU experts |")
    a(f"| parameters | {fmt_int(pc['total'])} total, {fmt_int(pc['active'])} active per token "
      f"({fmt_int(pc['embedding'])} in the tied embedding) |")
    a(f"| routed experts | {fmt_int(pc['experts'])} parameters: {args.layers} layers x {args.experts} experts x "
      f"{fmt_int(pc['per_expert'])} |")
    a(f"| layers | {args.layers}, every one sparse MoE (no dense layer, no shared expert) |")
    a(f"| hidden size | {args.hidden} |")
    a(f"| attention | {args.heads} query heads, {args.kv_heads} key/value heads (GQA), head_dim {args.head_dim} |")
    a(f"| experts | {args.experts} routed, top-{args.top_k}, softmax router, top-k weights renormalised "
      f"(`norm_topk_prob: true`), moe_intermediate_size {args.moe_intermediate} |")
    a(f"| vocabulary | {args.vocab} (byte-level BPE) |")
    a(f"| context | max_position_embeddings {args.max_pos} (trained on {args.seq_len}-token windows), "
      f"rope_theta {args.rope_theta:g} |")
    a("| embeddings | tied (`tie_word_embeddings: true`"
      + ("" if R.get("has_lm_head") else "; no `lm_head.weight` tensor in the file") + ") |")
    a("| dtype | bfloat16 |")
    sizes = R.get("file_sizes", {})
    if sizes:
        a(f"| files | " + ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in sizes.items()) + " |")
    a("")
    lay = R.get("layout")
    if lay:
        a("### Tensors in model.safetensors")
        a("")
        a(f"{R.get('layout_count', 0)} tensors ({', '.join(R.get('layout_dtypes', []))}). "
          f"`{{L}}` is the layer (0..{args.layers - 1}), "
          f"`{{E}}` the expert (0..{args.experts - 1}).")
        a("")
        a("| name | shape | count |")
        a("|---|---|---|")
        for p, s, d, n in lay:
            a(f"| `{p}` | {list(s)} | {n} |")
        a("")
    a("## Training")
    a("")
    a("| | |")
    a("|---|---|")
    a(f"| steps | {fmt_int(tr.get('steps', 0))} |")
    a(f"| tokens seen | {fmt_int(tr.get('tokens', 0))} ({tr.get('tokens', 0) / 1e6:.0f} M) |")
    a(f"| batch | {args.batch} windows x {args.seq_len} tokens = {fmt_int(args.batch * args.seq_len)} tokens/step "
      f"({R.get('chat_windows', 0)} windows/step from the instruction conversations, {R.get('tool_windows', 0)} from "
      f"the tool-use conversations, the rest from source files) |")
    a(f"| wall time | {tr.get('seconds', 0):.0f} s training ({tr.get('tokens_per_second', 0) / 1e6:.2f} M tokens/s); "
      f"{R.get('total_seconds', 0):.0f} s for the whole script |")
    a(f"| hardware | {env.get('gpu') or 'CPU'}; torch {env['torch']}, transformers {env['transformers']}, "
      f"tokenizers {env['tokenizers']} |")
    a(f"| optimizer | AdamW (beta 0.9/0.95, weight decay {args.weight_decay} on matrices), grad clip 1.0, "
      f"peak lr {args.lr:g}, {args.warmup_steps} warmup steps, cosine decay over wall time to "
      f"{args.min_lr_frac:g} x peak |")
    a(f"| precision | fp32 master weights, bf16 autocast; experts backend `{R.get('experts_impl')}`; "
      "saved in bf16 |")
    a(f"| load balancing | Switch-Transformer auxiliary loss per layer, E * sum_e f_e * P_e (f_e: share of "
      f"routings to expert e, P_e: mean router probability), averaged over layers, coefficient {args.aux_coef:g} "
      "(`router_aux_loss_coef`) |")
    a(f"| objective | next-token cross-entropy on random {args.seq_len}-token windows of the concatenated corpus "
      "(documents separated by `<\\|endoftext\\|>`) |")
    a("")
    hist = tr.get("history", [])
    if hist:
        a("Training loss (cross-entropy, mean over each logging interval):")
        a("")
        a("| step | seconds | tokens | loss | aux |")
        a("|---|---|---|---|---|")
        pick = hist if len(hist) <= 12 else [hist[round(i * (len(hist) - 1) / 11)] for i in range(12)]
        for h in pick:
            a(f"| {h['step']} | {h['seconds']:.0f} | {h['tokens'] / 1e6:.1f} M | {h['loss']:.3f} | {h['aux']:.3f} |")
        a("")
    a("## Evaluation")
    a("")
    if ev:
        a(f"On held-out files ({R['data']['heldout_files']} files never trained on, "
          f"{R['data']['heldout_tokens'] / 1e6:.2f} M tokens): {ev['windows']} fixed windows of {ev['seq_len']} "
          f"tokens, evaluated with the saved bf16 weights.")
        a("")
        a(f"- **held-out loss {ev['loss']:.4f}** (nats/token), **perplexity {ev['perplexity']:.2f}**")
        a("")
        a("### Expert usage on held-out text")
        a("")
        a(f"Routings are (token, slot) pairs: {fmt_int(ev['tokens'])} tokens x top-{args.top_k} = "
          f"{fmt_int(ev['routings_per_layer'])} per layer. Skew is the share of routings taken by the top 10% "
          f"of experts; with {args.experts} experts that is the top {ev['top10pct_experts']} "
          f"(ceil(0.1 x {args.experts})), whose share would be {ev['uniform_share'] * 100:.1f}% under perfectly "
          "uniform routing.")
        a("")
        a("| layer | top-10% share | most used expert | least used expert | unused experts |")
        a("|---|---|---|---|---|")
        for p in ev["per_layer"]:
            a(f"| {p['layer']} | {p['top10pct_share'] * 100:.1f}% | {p['max_expert_share'] * 100:.1f}% | "
              f"{p['min_expert_share'] * 100:.2f}% | {p['unused_experts']} |")
        a("")
        a(f"Top-10% share: min {ev['skew_min'] * 100:.1f}%, max {ev['skew_max'] * 100:.1f}% over layers "
          f"(mean {ev['skew_mean'] * 100:.1f}%).")
        a("")
        a("Routing counts per expert (the same numbers are in `routing_stats.json`):")
        a("")
        a("| layer | " + " | ".join(str(e) for e in range(args.experts)) + " |")
        a("|---|" + "---|" * args.experts)
        for p in ev["per_layer"]:
            a(f"| {p['layer']} | " + " | ".join(str(c) for c in p["counts"]) + " |")
        a("")
    else:
        a(f"Evaluation did not run: {R.get('eval_error', 'unknown error')}")
        a("")
    s = R.get("samples")
    a("## Samples")
    a("")
    if s:
        a(f"Greedy, from the saved bf16 weights. Completion of `{s['completion_prompt']}` "
          f"({s['completion_tokens']} new tokens, at most 64):")
        a("")
        a("````text")
        a(s["completion_prompt"] + s["completion"])
        a("````")
        a("")
        a(f"Chat (ChatML through the chat template, {s['chat_tokens']} new tokens, at most 160), user: "
          f"*{s['chat_prompt']}*")
        a("")
        a("````text")
        a(s["chat_rendered"] + s["chat_reply"])
        a("````")
        a("")
    else:
        a(f"Samples were not produced: {R.get('samples_error', 'unknown error')}")
        a("")
    write_tool_section(a, R)
    d = R["data"]
    a("## Training data")
    a("")
    a("Python source files that were already installed on the training machine: the interpreter's standard "
      "library and the `.py` files of installed distributions (as listed in each distribution's RECORD). "
      f"Files over 1 MB, non-UTF-8 files and data-like files (mostly very long lines) were skipped; "
      f"files were deduplicated by content hash ({fmt_int(d['duplicates'])} duplicates dropped) and split by "
      f"that hash into train and held-out ({args.heldout_pct:g}%). At most {args.max_corpus_mb:g} MB were read: "
      "the standard library whole, then a fair share of the rest per distribution.")
    a("")
    a(f"- train: {fmt_int(d['train_files'])} files, {d['train_mb']:.1f} MB, {d['train_tokens'] / 1e6:.1f} M tokens")
    a(f"- held-out: {fmt_int(d['heldout_files'])} files, {d['heldout_mb']:.2f} MB, "
      f"{d['heldout_tokens'] / 1e6:.2f} M tokens")
    a(f"- instruction data: {fmt_int(d['examples'])} ChatML conversations built from train files: functions and "
      "methods with a docstring become *user: Write a Python function that <first sentence of the docstring>* -> "
      "*assistant: the source in a python code block* (20% with a short system message); "
      f"{d['chat_tokens'] / 1e6:.1f} M tokens, {R.get('chat_windows', 0) / args.batch * 100:.1f}% of training windows")
    td_info = R.get("tool_data")
    if td_info:
        a(f"- tool-use data: {fmt_int(td_info['conversations'])} synthetic conversations "
          f"({d.get('tool_tokens', 0) / 1e6:.1f} M tokens), {R.get('tool_windows', 0) / args.batch * 100:.1f}% of "
          "training windows; see *Tool use* above")
    if d.get("skipped"):
        a("- skipped files: " + ", ".join(f"{k}: {v}" for k, v in sorted(d["skipped"].items())))
    a("")
    a("| source | version | license | files (train / held-out) | MB | instruction examples |")
    a("|---|---|---|---|---|---|")
    for name, st in sorted(d["sources"].items(), key=lambda kv: (kv[0] != "python-stdlib", -kv[1]["bytes"])):
        a(f"| {cell(name)} | {cell(st['version'])} | {cell(st['license'])} | {st['train_files']} / {st['heldout_files']} | "
          f"{st['bytes'] / 1e6:.2f} | {st['examples']} |")
    a("")
    if d.get("excluded"):
        a("Left out (license unknown, copyleft or proprietary, or no file list):")
        a("")
        for name, ver, why in d["excluded"]:
            a(f"- {name} {ver}: {why.replace('|', '/')}")
        a("")
    t = R["tokenizer"]
    a("## Tokenizer")
    a("")
    a(f"Byte-level BPE, {t['vocab_size']} tokens, trained with Hugging Face tokenizers on {t['sample_files']} train "
      f"files ({t['sample_mb']:.0f} MB). Qwen2-style pipeline: NFC normalizer; Split pre-tokenizer with Qwen2's "
      "regex (behavior Isolated), then ByteLevel (add_prefix_space false, use_regex false); ByteLevel decoder. "
      "Special tokens: " + ", ".join(f"`{k}` = {v}" for k, v in t["special_ids"].items()) + ". "
      "No BOS token; `<|im_end|>` ends a chat turn (eos), `<|endoftext|>` separates documents (pad). "
      "The chat template is ChatML (`<|im_start|>{role}\\n{content}<|im_end|>\\n`, generation prompt "
      "`<|im_start|>assistant\\n`), with no default system message, and tool use in the Qwen2.5/Qwen3 layout "
      "(see *Tool use*). `<tool_call>`, `<tool_response>` and `<tools>` are plain text, not special tokens.")
    a("")
    a("## Use")
    a("")
    a("```python")
    a("from transformers import AutoModelForCausalLM, AutoTokenizer")
    a(f"tok = AutoTokenizer.from_pretrained(\"{args.out}\")")
    a(f"model = AutoModelForCausalLM.from_pretrained(\"{args.out}\")")
    a("msgs = [{\"role\": \"user\", \"content\": \"Write a Python function that reverses a string.\"}]")
    a("inputs = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors=\"pt\", return_dict=True)")
    a("out = model.generate(**inputs, max_new_tokens=128)")
    a("print(tok.decode(out[0, inputs[\"input_ids\"].shape[1]:]))")
    a("```")
    a("")
    a("With tools (OpenAI-style function schemas), the reply is a tool call to parse:")
    a("")
    a("```python")
    a("tools = [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
      "\"description\": \"Get the current weather in a city.\", \"parameters\": {\"type\": \"object\", "
      "\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}]")
    a("msgs = [{\"role\": \"user\", \"content\": \"What's the weather like in Paris?\"}]")
    a("inputs = tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, return_tensors=\"pt\", "
      "return_dict=True)")
    a("out = model.generate(**inputs, max_new_tokens=64, do_sample=False)")
    a("print(tok.decode(out[0, inputs[\"input_ids\"].shape[1]:]))  # <tool_call>\\n{\"name\": \"get_weather\", ...")
    a("```")
    a("")
    a("`generation_config.json` samples (temperature 0.7, top_p 0.9) and stops at `<|im_end|>` or `<|endoftext|>`.")
    a("")
    a("## License")
    a("")
    a("The weights and this card are released under the Apache License 2.0. The training data is the "
      "source code listed above, each under its own license (the table's license column, from each "
      "distribution's metadata; the Python standard library is PSF-2.0). The model can reproduce fragments "
      "of that code.")
    a("")
    a("## Reproduce")
    a("")
    a("```sh")
    a(R["command"])
    a("```")
    a("")
    a("The result depends on what is installed on the machine (the corpus) and on its speed (training is "
      "budgeted by wall time).")
    a("")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(L))


# ----------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------

def tool_summary(R):
    te = R.get("tool_eval")
    if not te:
        return "FAILED" if R.get("tool_eval_error") else "not measured"
    n = max(1, te["evaluated"])
    return (f"{te['exact']}/{te['evaluated']} exact ({te['exact'] / n * 100:.0f}%), {te['valid']} valid, "
            f"no call {te['no_call_ok']}/{te['no_call_evaluated']}")


def summary_table(rows):
    w = max(len(k) for k, _ in rows)
    line = "+" + "-" * (w + 2) + "+" + "-" * 62 + "+"
    print(line)
    for k, v in rows:
        print(f"| {k:<{w}} | {str(v)[:60]:<60} |")
    print(line, flush=True)


def fixture_only(args):
    check_env(args)  # the fixture runs on the CPU
    out = os.path.abspath(args.out)
    for f in ("config.json", "model.safetensors", "tokenizer.json"):
        if not os.path.exists(os.path.join(out, f)):
            die(f"{out} has no {f}: train the model first")
    info = make_fixture(out, os.path.abspath(args.fixture_out), args)
    log(f"fixture written: {info}")


def main():
    args = parse_args()
    if args.fixture_only:
        fixture_only(args)
        return
    command = "python3 tools/train/train_spill_tiny.py " + " ".join(sys.argv[1:])
    env = check_env(args)
    import numpy as np
    import torch

    import spill_corpus
    import spill_tokenizer as stok

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    out, stage, fixture_dir = prepare_dirs(args)
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    R = {"args": args, "env": env, "command": command}
    errors = []

    # 1. corpus -------------------------------------------------------------------------------
    log("stage 1/7: corpus")
    corpus = spill_corpus.collect(args.max_corpus_mb, args.heldout_pct, args.workers, args.max_examples)
    tool_texts, tool_info, tool_evals, tool_no_call = tool_data(corpus.examples, args)
    errors.extend(f"chat template: {p}" for p in tool_info["template_problems"])
    check_gpu(args, env)
    log("preflight: the whole transformers path on the CPU with the real architecture")
    try:
        preflight(args, PREFLIGHT_IDS)
    except SystemExit:
        raise
    except Exception as e:
        traceback.print_exc()
        die(f"preflight failed, nothing trained: {e.__class__.__name__}: {e}")
    min_chars = 1e6 if args.smoke else 5e6
    if sum(len(d) for d in corpus.train_docs) < min_chars:
        die(f"only {sum(len(d) for d in corpus.train_docs)} characters of training text were found")
    if not corpus.heldout_docs:
        n = max(1, len(corpus.train_docs) // 100)
        log(f"no held-out files by hash; holding out the last {n} train files instead")
        corpus.heldout_docs = corpus.train_docs[-n:]
        corpus.train_docs = corpus.train_docs[:-n]

    # 2. tokenizer ----------------------------------------------------------------------------
    log("stage 2/7: tokenizer")
    tok, ids, tinfo = stok.train_tokenizer(corpus.train_docs, args.vocab, args.tok_sample_mb, args.seed)
    if ids != PREFLIGHT_IDS:
        log(f"note: special token ids are {ids} (the preflight used {PREFLIGHT_IDS})")
    tok_path = os.path.join(stage, "tokenizer.json")
    tok.save(tok_path)
    stok.write_json(os.path.join(stage, "tokenizer_config.json"), stok.tokenizer_config(args.max_pos, ids))
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tok_path)  # from here on, exactly what is shipped
    for t, i in ids.items():
        if tok.encode(t, add_special_tokens=False).ids != [i]:
            die(f"saved tokenizer.json does not encode {t} as {i}")
    tok_bytes = os.path.getsize(tok_path) + os.path.getsize(os.path.join(stage, "tokenizer_config.json"))
    R["tokenizer"] = {"vocab_size": tok.get_vocab_size(with_added_tokens=True), "special_ids": ids, **tinfo}

    # 3. token streams ------------------------------------------------------------------------
    log("stage 3/7: pre-tokenizing")
    code = stok.encode_stream(tok, corpus.train_docs, ids["<|endoftext|>"], literal_specials=True)
    held = stok.encode_stream(tok, corpus.heldout_docs, ids["<|endoftext|>"], literal_specials=True)
    texts = chat_texts(corpus.examples, args.seed)
    chat = stok.encode_stream(tok, texts, ids["<|endoftext|>"], literal_specials=False) if texts else None
    tools_stream = (stok.encode_stream(tok, tool_texts, ids["<|endoftext|>"], literal_specials=False)
                    if tool_texts else None)
    for name, ts in (("chat", texts), ("tool-use", tool_texts)):
        if ts:
            first = tok.encode(ts[0], add_special_tokens=False).ids
            if first[0] != ids["<|im_start|>"] or ids["<|im_end|>"] not in first:
                die(f"{name} texts do not encode <|im_start|>/<|im_end|> as special tokens")
    if code.size < 4 * args.seq_len * args.batch // 64:
        die(f"training stream has only {code.size} tokens")
    R["data"] = {
        "train_files": len(corpus.train_docs), "heldout_files": len(corpus.heldout_docs),
        "train_mb": sum(len(d) for d in corpus.train_docs) / 1e6,
        "heldout_mb": sum(len(d) for d in corpus.heldout_docs) / 1e6,
        "train_tokens": int(code.size), "heldout_tokens": int(held.size),
        "chat_tokens": int(chat.size) if chat is not None else 0, "examples": len(texts),
        "tool_tokens": int(tools_stream.size) if tools_stream is not None else 0,
        "duplicates": corpus.duplicates, "skipped": corpus.skipped, "sources": corpus.stats,
        "excluded": [(s.name, s.version, s.excluded) for s in corpus.sources if s.excluded],
        "corpus_seconds": corpus.seconds,
    }
    R["tool_data"] = tool_info
    del corpus, tool_texts

    # 4. model --------------------------------------------------------------------------------
    log("stage 4/7: model")
    cfg = build_config(args, ids)
    model = build_model(cfg, args)
    pc = param_counts(model, args)
    R["params"] = pc
    est = pc["total"] * 2 + tok_bytes + 64_000
    log(f"parameters: {pc['total']:,} total, {pc['active']:,} active, {pc['experts']:,} in experts; "
        f"estimated files {est / 1e6:.2f} MB (limit {args.max_bytes / 1e6:.1f} MB)")
    if est > args.max_bytes:
        die(f"the saved model would be about {est / 1e6:.2f} MB, over --max-bytes {args.max_bytes / 1e6:.1f} MB: "
            f"use a smaller model")
    set_attn_impl(model, "sdpa" if dev.type == "cuda" else "eager")
    model.to(dev)
    code_t = torch.from_numpy(code.astype(np.int32)).to(dev)
    held_t = torch.from_numpy(held.astype(np.int32)).to(dev)
    chat_t = torch.from_numpy(chat.astype(np.int32)).to(dev) if chat is not None and chat.size else None
    tools_t = (torch.from_numpy(tools_stream.astype(np.int32)).to(dev)
               if tools_stream is not None and tools_stream.size else None)
    probe_ids = held[: min(64, held.size)].astype(np.int64).tolist()
    del code, chat, tools_stream
    tap = RouterTap(model, args.experts, args.top_k, True)
    batcher = Batcher(code_t, chat_t, tools_t, args, dev)
    R["chat_windows"] = batcher.n_chat
    R["tool_windows"] = batcher.n_tools
    R["experts_impl"] = choose_experts_impl(model, tap, batcher, args, dev)
    if tap.from_router_output is False:
        log("note: the router returns no expert ids; top-k is computed from softmax(gate logits)")

    # 5. training -----------------------------------------------------------------------------
    train_seconds = args.train_seconds
    if args.time_budget > 0:
        room = args.time_budget - elapsed() - args.post_reserve
        if room < train_seconds:
            log(f"time budget: only {room:.0f}s left for training (of {train_seconds:.0f}s asked) "
                f"to finish within {args.time_budget:.0f}s")
            train_seconds = max(30.0, room)
    log("stage 5/7: training")
    R["train"] = train(model, tap, batcher, args, dev, train_seconds)
    tap.remove()
    del batcher, code_t, chat_t, tools_t
    if dev.type == "cuda":
        torch.cuda.empty_cache()

    # 6. save + verify ------------------------------------------------------------------------
    log("stage 6/7: saving")
    model.eval()
    cast_params_bf16(model)
    try:
        rep, notes = save_checkpoint(model, stage, args, ids, probe_ids)
    except Exception as e:
        traceback.print_exc()
        die(f"the saved checkpoint does not reload identically: {e}. The folder is left at {stage}")
    errors.extend(notes)
    if not rep["logits_exact"] and not rep.get("logits_error"):
        log(f"WARNING: reloaded float32 logits differ from the in-memory model by up to "
            f"{rep['logits_max_abs_diff']:.3g} (tensors are bit-identical)")
    log(f"reload check: {rep['tensors_equal']} tensors bit-identical; float32 CPU logits on {rep['probe_tokens']} "
        f"tokens exactly equal: {rep['logits_exact']}")
    model_file = os.path.join(stage, "model.safetensors")
    layout = safetensors_layout(model_file)
    R["layout"] = layout_patterns(layout)
    R["layout_count"] = len(layout)
    R["layout_dtypes"] = sorted({d for _, _, d in layout})
    R["has_lm_head"] = any(n == "lm_head.weight" for n, _, _ in layout)
    bad_dtype = sorted({d for _, _, d in layout} - {"BF16", "bfloat16", "torch.bfloat16"})
    if bad_dtype:
        errors.append(f"non-bf16 tensors in model.safetensors: {bad_dtype}")
    log(f"model.safetensors holds {len(layout)} tensors:")
    for p, s, d, n in R["layout"]:
        print(f"    {p:60s} {str(list(s)):14s} {d:6s} x{n}", flush=True)
    for n, s, d in layout[:3] + layout[-3:]:
        print(f"    e.g. {n} {list(s)} {d}", flush=True)
    try:  # AutoTokenizer must agree with tokenizers and the chat template (not fatal)
        from transformers import AutoTokenizer

        hft = AutoTokenizer.from_pretrained(stage)
        cases = template_cases_for_transformers(
            [(e["messages"], e["tools"], True) for e in tool_evals[:3] + tool_no_call[:1]])
        probes = [FIXTURE_SNIPPET + "<|im_end|>"] + [stok.render_chat(m, g, t) for m, t, g in cases]
        bad_ids = [i for i, pr in enumerate(probes)
                   if hft.encode(pr, add_special_tokens=False) != tok.encode(pr, add_special_tokens=False).ids]
        problems = template_mismatches(hft, cases)
        if bad_ids or problems:
            errors.append(f"AutoTokenizer disagrees with tokenizer.json on {len(bad_ids)} of {len(probes)} texts "
                          f"or with the chat template on {len(problems)} of {len(cases)} conversations")
            log("WARNING: " + errors[-1])
            for p in problems:
                log(f"WARNING: chat template: {p}")
        else:
            log(f"AutoTokenizer ({hft.__class__.__name__}) matches tokenizer.json on {len(probes)} texts and "
                f"apply_chat_template(tools=...) matches render_chat on {len(cases)} conversations")
    except Exception as e:
        errors.append(f"AutoTokenizer check failed: {e.__class__.__name__}: {e}")
        log(f"WARNING: AutoTokenizer check failed: {e.__class__.__name__}: {e}")
    replace_dir(stage, out)
    log(f"saved {out}")

    # 7. eval, samples, fixture, card ---------------------------------------------------------
    log("stage 7/7: evaluation, samples, fixture, model card")
    try:
        ev = evaluate(model, held_t, args, dev)
        R["eval"] = ev
        log(f"held-out loss {ev['loss']:.4f}, perplexity {ev['perplexity']:.2f} on {ev['windows']} windows; "
            f"top-{ev['top10pct_experts']} expert share per layer " +
            ", ".join(f"{p['top10pct_share'] * 100:.1f}%" for p in ev["per_layer"]))
        stats = {
            "model": "spill-tiny",
            "measured_on": "held-out text (files never trained on), saved bf16 weights, "
                           f"{env.get('gpu') or 'CPU'}",
            "num_layers": args.layers, "num_experts": args.experts, "top_k": args.top_k,
            "tokens": ev["tokens"], "windows": ev["windows"], "seq_len": ev["seq_len"],
            "routings_per_layer": ev["routings_per_layer"],
            "counts": [p["counts"] for p in ev["per_layer"]],
            "top10pct_experts": ev["top10pct_experts"],
            "top10pct_share": [p["top10pct_share"] for p in ev["per_layer"]],
            "top10pct_share_min": ev["skew_min"], "top10pct_share_max": ev["skew_max"],
            "uniform_top10pct_share": ev["uniform_share"],
            "heldout_loss": ev["loss"], "heldout_perplexity": ev["perplexity"],
        }
        stok.write_json(os.path.join(out, "routing_stats.json"), stats)
    except Exception as e:
        traceback.print_exc()
        R["eval_error"] = f"{e.__class__.__name__}: {e}"
        errors.append("evaluation failed: " + R["eval_error"])
    if tool_evals:
        try:
            te = tool_eval(model, tok, ids, dev, tool_evals, tool_no_call)
            R["tool_eval"] = te
            log(f"tool calls: {te['exact']}/{te['evaluated']} exact (right tool and arguments), {te['valid']} valid "
                f"calls, {te['name']} right tool; no call on {te['no_call_ok']}/{te['no_call_evaluated']} plain "
                f"questions; prompts up to {te['prompt_tokens_max']} tokens; {te['how']}, {te['seconds']:.1f}s")
            if te.get("sample"):
                log(f"sample tool-call reply ({te['sample']['score']}):\n{te['sample']['reply']}")
            for f in te["failures"][:3]:
                log(f"tool-call miss: {f['user']!r}: expected {f['expected']!r}, got {f['got'][:200]!r}")
        except Exception as e:
            traceback.print_exc()
            R["tool_eval_error"] = f"{e.__class__.__name__}: {e}"
            errors.append("tool-call evaluation failed: " + R["tool_eval_error"])
    try:
        R["samples"] = samples(model, tok, ids, dev)
        log(f"sample completion:\n{GREEDY_PROMPT}{R['samples']['completion']}")
        log(f"sample chat reply:\n{R['samples']['chat_reply']}")
    except Exception as e:
        traceback.print_exc()
        R["samples_error"] = f"{e.__class__.__name__}: {e}"
        errors.append("samples failed: " + R["samples_error"])
    fx = None
    try:
        fx = make_fixture(out, fixture_dir, args)
        log(f"fixture: {fx['path']} ({fx['bytes'] / 1e6:.2f} MB), greedy {fx['greedy']}")
    except Exception as e:
        traceback.print_exc()
        errors.append(f"fixture failed: {e.__class__.__name__}: {e} (rerun with --fixture-only)")
    sizes = {}
    for f in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json",
              "generation_config.json"):
        p = os.path.join(out, f)
        if os.path.exists(p):
            sizes[f] = os.path.getsize(p)
    R["file_sizes"] = sizes
    shipped = sizes.get("model.safetensors", 0) + sizes.get("tokenizer.json", 0) + sizes.get("tokenizer_config.json", 0)
    if shipped > args.max_bytes:
        errors.append(f"model + tokenizer files are {shipped / 1e6:.2f} MB, over {args.max_bytes / 1e6:.1f} MB")
    R["total_seconds"] = elapsed()
    try:
        write_readme(os.path.join(out, "README.md"), R)
    except Exception as e:
        traceback.print_exc()
        errors.append(f"README failed: {e.__class__.__name__}: {e}")

    tr = R["train"]
    ev = R.get("eval")
    rows = [
        ("model folder", out),
        ("fixture", fx["path"] if fx else "FAILED"),
        ("parameters", f"{pc['total']:,} total / {pc['active']:,} active"),
        ("architecture", f"{args.layers} layers, hidden {args.hidden}, {args.experts} experts top-{args.top_k}, "
                         f"moe_inter {args.moe_intermediate}"),
        ("corpus", f"{R['data']['train_files']} train files, {R['data']['train_tokens'] / 1e6:.1f} M tokens; "
                   f"{R['data']['examples']} chat examples"),
        ("tool-use data", f"{R['tool_data']['conversations']} conversations, {R['data']['tool_tokens'] / 1e6:.1f} M "
                          f"tokens, {R['tool_windows']}/{args.batch} windows per step"),
        ("experts backend", R["experts_impl"]),
        ("training", f"{tr['steps']} steps, {tr['tokens'] / 1e6:.0f} M tokens, {tr['seconds']:.0f}s, "
                     f"{tr['tokens_per_second'] / 1e6:.2f} M tok/s"),
        ("final train loss", f"{tr['final_loss']:.4f}"),
        ("held-out loss / ppl", f"{ev['loss']:.4f} / {ev['perplexity']:.2f}" if ev else "n/a"),
        ("tool-call accuracy", tool_summary(R)),
        ("top-10% expert share", f"min {ev['skew_min'] * 100:.1f}% max {ev['skew_max'] * 100:.1f}% "
                                 f"(uniform {ev['uniform_share'] * 100:.1f}%)" if ev else "n/a"),
        ("reload check", f"{rep['tensors_equal']} tensors equal, logits exact {rep['logits_exact']}"),
        ("files (model+tokenizer)", f"{shipped / 1e6:.2f} MB"),
        ("wall time", f"{elapsed():.0f}s"),
        ("errors", len(errors)),
    ]
    print()
    summary_table(rows)
    for e in errors:
        print(f"ERROR: {e}", flush=True)
    if errors:
        sys.exit(1)


if __name__ == "__main__":
    main()
