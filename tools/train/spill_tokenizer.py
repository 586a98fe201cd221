"""Tokenizer pieces for spill-tiny: a Qwen2-style byte-level BPE trained with HF tokenizers,
the ChatML chat template, and the files transformers reads (tokenizer.json, tokenizer_config.json).
"""

from __future__ import annotations

import json
import random
import time

import numpy as np

EOT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIALS = [EOT, IM_START, IM_END]

# Qwen2's pre-tokenizer regex (split before ByteLevel, which then runs with use_regex=False).
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# Qwen2.5-style ChatML without a default system message. Jinja string literals: '\n' is a newline.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def log(msg: str) -> None:
    print(f"[tokenizer] {msg}", flush=True)


_TEMPLATE = None


def render_chat(messages, add_generation_prompt: bool) -> str:
    """Renders CHAT_TEMPLATE the way transformers does (sandboxed jinja2, trim/lstrip blocks)."""
    global _TEMPLATE
    if _TEMPLATE is None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        _TEMPLATE = env.from_string(CHAT_TEMPLATE)
    return _TEMPLATE.render(messages=messages, add_generation_prompt=add_generation_prompt)


def train_tokenizer(docs, vocab_size: int, sample_mb: float, seed: int):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    t0 = time.time()
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    sample, size = [], 0
    for i in order:
        sample.append(docs[i])
        size += len(docs[i])
        if size >= sample_mb * 1e6:
            break
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(sample, trainer=trainer, length=len(sample))
    n = tok.get_vocab_size(with_added_tokens=True)
    ids = {t: tok.token_to_id(t) for t in SPECIALS}
    if any(v is None for v in ids.values()):
        raise RuntimeError(f"special tokens missing from the trained vocabulary: {ids}")
    if n > vocab_size:
        raise RuntimeError(f"trained vocabulary has {n} entries, more than {vocab_size}")
    # Round trip on ASCII text (NFC leaves it alone), and the specials must stay single tokens.
    probe = "def f(x):\n    return {'a': x ** 2}  # ok\n\n\tprint(f(3))\n"
    if tok.decode(tok.encode(probe, add_special_tokens=False).ids, skip_special_tokens=False) != probe:
        raise RuntimeError("tokenizer does not round-trip plain ASCII text")
    for t, i in ids.items():
        if tok.encode(t, add_special_tokens=False).ids != [i]:
            raise RuntimeError(f"special token {t} does not encode to its id {i}")
    log(f"trained byte-level BPE: {n} tokens on {len(sample)} files ({size / 1e6:.1f} MB) in "
        f"{time.time() - t0:.1f}s; specials {ids}")
    return tok, ids, {"sample_files": len(sample), "sample_mb": size / 1e6, "seconds": time.time() - t0}


def tokenizer_config(model_max_length: int, special_ids: dict) -> dict:
    added = {
        str(special_ids[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                              "single_word": False, "special": True}
        for t in SPECIALS
    }
    return {
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": model_max_length,
        "pad_token": EOT,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def write_json(path: str, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def _set_literal_specials(tok, on: bool) -> bool:
    """tokenizers' encode_special_tokens: when on, '<|endoftext|>' in text is encoded as text."""
    try:
        tok.encode_special_tokens = on
    except Exception:
        return False
    probe = tok.encode(EOT, add_special_tokens=False).ids
    return (len(probe) > 1) == on


def encode_stream(tok, texts, eot_id: int, literal_specials: bool, batch: int = 1024) -> np.ndarray:
    """Encodes texts and concatenates them, each followed by <|endoftext|>, as uint16.

    literal_specials=True: special-token strings inside the texts (Python sources do contain
    '<|endoftext|>') are encoded as ordinary text, so the only separators are the ones added here.
    """
    t0 = time.time()
    if literal_specials:
        if not _set_literal_specials(tok, True):
            log("encode_special_tokens unavailable: breaking up special-token strings in the text instead")
            texts = [t.replace("<|", "<\u200b|") if "<|" in t else t for t in texts]
    encode = getattr(tok, "encode_batch_fast", None) or tok.encode_batch
    eot = np.array([eot_id], dtype=np.uint16)
    parts = []
    n_tok = 0
    try:
        for i in range(0, len(texts), batch):
            for e in encode(texts[i:i + batch], add_special_tokens=False):
                a = np.asarray(e.ids, dtype=np.uint16)
                parts.append(a)
                parts.append(eot)
                n_tok += a.size + 1
    finally:
        if literal_specials:
            _set_literal_specials(tok, False)
    out = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)
    log(f"encoded {len(texts)} texts -> {out.size / 1e6:.2f} M tokens in {time.time() - t0:.1f}s")
    return out
