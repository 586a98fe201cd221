"""Tokenizer pieces for spill-tiny: a Qwen2-style byte-level BPE trained with HF tokenizers,
the chat template (ChatML with Qwen2.5/Qwen3-style tool calls), and the files transformers reads
(tokenizer.json, tokenizer_config.json).
"""

from __future__ import annotations

import json
import random
import time

EOT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIALS = [EOT, IM_START, IM_END]

# Qwen2's pre-tokenizer regex (split before ByteLevel, which then runs with use_regex=False).
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# Qwen2.5/Qwen3-style ChatML with tool use, without a default system message. A raw string, so
# '\n' reaches Jinja as an escape inside its string literals. Only common Jinja features (no
# loop.first / loop.last / loop.previtem, no look-ahead into messages): state lives in a
# namespace(). Layout:
#   tools given:  <|im_start|>system\n[SYSTEM\n\n]# Tools ... <tools>\n{tool|tojson}... </tools> ...<|im_end|>\n
#   no tools:     <|im_start|>system\nSYSTEM<|im_end|>\n only when messages[0] is a system message
#   user/system:  <|im_start|>ROLE\nCONTENT<|im_end|>\n
#   assistant:    <|im_start|>assistant\nCONTENT then per tool call (OpenAI {function: {name, arguments}}
#                 or plain {name, arguments}; arguments a dict -> tojson, a string -> as is)
#                 [\n]<tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>  (no \n before the
#                 first call when CONTENT is empty), then <|im_end|>\n
#   tool results: consecutive tool messages -> ONE user turn, each <tool_response>\nRESULT\n</tool_response>,
#                 joined by \n
#   add_generation_prompt: <|im_start|>assistant\n
CHAT_TEMPLATE = r"""{%- set ns = namespace(index=0, in_tool=false, sep='') %}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages and messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' ~ (tool | tojson) }}
    {%- endfor %}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages and messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'tool' %}
        {%- if ns.in_tool %}
            {{- '\n' }}
        {%- else %}
            {{- '<|im_start|>user\n' }}
            {%- set ns.in_tool = true %}
        {%- endif %}
        {{- '<tool_response>\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {{- message.content | tojson }}
        {%- endif %}
        {{- '\n</tool_response>' }}
    {%- else %}
        {%- if ns.in_tool %}
            {{- '<|im_end|>\n' }}
            {%- set ns.in_tool = false %}
        {%- endif %}
        {%- if message.role == 'assistant' %}
            {{- '<|im_start|>assistant\n' }}
            {%- if message.content is string and message.content %}
                {{- message.content }}
                {%- set ns.sep = '\n' %}
            {%- else %}
                {%- set ns.sep = '' %}
            {%- endif %}
            {%- if message.tool_calls %}
                {%- for tool_call in message.tool_calls %}
                    {%- set call = tool_call.function if tool_call.function is mapping else tool_call %}
                    {{- ns.sep ~ '<tool_call>\n{"name": "' ~ call.name ~ '", "arguments": ' }}
                    {%- if call.arguments is string %}
                        {{- call.arguments }}
                    {%- elif call.arguments is mapping %}
                        {{- call.arguments | tojson }}
                    {%- else %}
                        {{- '{}' }}
                    {%- endif %}
                    {{- '}\n</tool_call>' }}
                    {%- set ns.sep = '\n' %}
                {%- endfor %}
            {%- endif %}
            {{- '<|im_end|>\n' }}
        {%- elif not (message.role == 'system' and ns.index == 0) %}
            {{- '<|im_start|>' + message.role + '\n' }}
            {%- if message.content is string %}
                {{- message.content }}
            {%- endif %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
    {%- set ns.index = ns.index + 1 %}
{%- endfor %}
{%- if ns.in_tool %}
    {{- '<|im_end|>\n' }}
{%- endif %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""


def log(msg: str) -> None:
    print(f"[tokenizer] {msg}", flush=True)


_TEMPLATE = None


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """transformers' tojson filter (jinja2's own escapes HTML characters and sorts keys)."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def chat_environment():
    """The jinja2 environment transformers' apply_chat_template compiles templates in (minus its
    {% generation %} tracker, which CHAT_TEMPLATE does not use)."""
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def strftime_now(fmt):
        import datetime

        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_chat(messages, add_generation_prompt: bool, tools=None) -> str:
    """Renders CHAT_TEMPLATE the way transformers does (sandboxed jinja2, trim/lstrip blocks,
    transformers' tojson). tools: a list of OpenAI-style tool schemas, or None."""
    global _TEMPLATE
    if _TEMPLATE is None:
        _TEMPLATE = chat_environment().from_string(CHAT_TEMPLATE)
    return _TEMPLATE.render(messages=messages, tools=tools, documents=None,
                            add_generation_prompt=add_generation_prompt)


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


def encode_stream(tok, texts, eot_id: int, literal_specials: bool, batch: int = 1024):
    """Encodes texts and concatenates them, each followed by <|endoftext|>, as uint16.

    literal_specials=True: special-token strings inside the texts (Python sources do contain
    '<|endoftext|>') are encoded as ordinary text, so the only separators are the ones added here.
    """
    import numpy as np

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
