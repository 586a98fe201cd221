#!/usr/bin/env python3
"""A random qwen3moe GGUF of a shape the peer tool ../shared/peers/llamacpp/make_gguf.py does not name, by
running that tool with one more entry in its shape table (it writes llama.cpp's layout with gguf-py).

    PYTHONPATH=GGUF_PY python3 tools/bench/make_random_gguf.py MAKE_GGUF_PY OUT.gguf SHAPE [EXPERT_TYPE]

SHAPE: moe1b = a ~0.9B-parameter MoE (16 layers, hidden 1024, 16 q / 4 kv heads of 64, 32 experts top-4,
width 512, vocab 32000; ~0.14B active per token), for CPU speed runs.
"""
import sys

SHAPES = {"moe1b": 'dict(L=16, H=1024, nh=16, nkv=4, hd=64, E=32, k=4, F=512, V=32000)'}
tool, out, shape = sys.argv[1], sys.argv[2], sys.argv[3]
source = open(tool).read()
anchor = '"tiny": dict('
assert anchor in source, "the shape table of make_gguf.py changed"
source = source.replace(anchor, f'"{shape}": {SHAPES[shape]}, ' + anchor, 1)
sys.argv = [tool, out, shape] + sys.argv[4:]
exec(compile(source, tool, "exec"), {"__name__": "__main__"})
