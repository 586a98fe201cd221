"""Corpus collection for spill-tiny: the Python source that is already on the machine.

Standard library only (no torch, numpy or tokenizers here), so it can be exercised with any
Python 3.10+:  python3 tools/train/spill_corpus.py --max-mb 20

Sources, in this order (first copy of a duplicated file wins):
  * the interpreter's standard library (sysconfig 'stdlib' path), license PSF-2.0;
  * every installed distribution (importlib.metadata), its own .py files as listed in its RECORD,
    with the license read from its METADATA (License-Expression, License, classifiers).
Distributions whose license is unknown, copyleft (any *GPL) or proprietary are left out and
listed as such. Files over 1 MB, non-UTF-8 files and data-like files (mostly very long lines)
are skipped. Files are deduplicated by content hash and split train / held-out by that hash.

Instruction data: from train files, functions and methods with a docstring become ChatML
conversations "Write a Python function that <first docstring sentence>" -> the source, in a
```python block (methods, whose first argument is self or cls, say "method").
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata as ilm
import multiprocessing as mp
import os
import re
import sys
import sysconfig
import textwrap
import time
import warnings
from dataclasses import dataclass, field

STDLIB = "python-stdlib"
STDLIB_LICENSE = "PSF-2.0"
MAX_FILE_BYTES = 1_000_000
LONG_LINE = 300  # a line longer than this counts as "data-like"


def log(msg: str) -> None:
    print(f"[corpus] {msg}", flush=True)


# ----------------------------------------------------------------------------------------------
# Licenses
# ----------------------------------------------------------------------------------------------

def _first_line(s: str) -> str:
    for line in s.strip().splitlines():
        line = line.strip()
        if line:
            return line
    return ""


_TEXT_LICENSES = (  # (phrase in a full license text, SPDX-ish name); first match wins
    ("GNU AFFERO GENERAL PUBLIC", "AGPL"),
    ("GNU LESSER GENERAL PUBLIC", "LGPL"),
    ("GNU LIBRARY GENERAL PUBLIC", "LGPL"),
    ("GNU GENERAL PUBLIC", "GPL"),
    ("MOZILLA PUBLIC LICENSE", "MPL-2.0"),
    ("APACHE LICENSE", "Apache-2.0"),
    ("PERMISSION IS HEREBY GRANTED, FREE OF CHARGE", "MIT"),
    ("REDISTRIBUTION AND USE IN SOURCE AND BINARY FORMS", "BSD"),
    ("PYTHON SOFTWARE FOUNDATION LICENSE", "PSF-2.0"),
    ("PERMISSION TO USE, COPY, MODIFY, AND/OR DISTRIBUTE", "ISC"),
    ("THIS IS FREE AND UNENCUMBERED SOFTWARE", "Unlicense"),
)


def _license_from_text(text: str) -> str:
    up = " ".join(text.upper().split())
    for phrase, name in _TEXT_LICENSES:
        if phrase in up:
            return name
    return ""


def dist_license(dist) -> str:
    """A short license string for a distribution, or '' when none can be found.
    Order: License-Expression; a short one-line License field; License classifiers; a license
    recognised in a full-text License field."""
    md = dist.metadata
    expr = (md.get("License-Expression") or "").strip()
    if expr:
        return expr
    lic = (md.get("License") or "").strip()
    if lic.upper() in ("UNKNOWN", "NONE", ""):
        lic = ""
    # A short single-line License field is the author's own statement: prefer it.
    if lic and "\n" not in lic and len(lic) <= 80 and not lic.lower().startswith("copyright"):
        return lic
    classifiers = [c for c in (md.get_all("Classifier") or []) if c.startswith("License ::")]
    names = []
    for c in classifiers:
        name = c.split("::")[-1].strip()
        if name and name != "OSI Approved" and name not in names:
            names.append(name)
    if names:
        return " / ".join(names)
    if lic:  # a whole license text
        return _license_from_text(lic)
    return ""


# Copyleft (any GPL), proprietary or custom (LicenseRef-*, vendor EULAs) licenses are left out.
_EXCLUDE_LICENSE = re.compile(r"GPL|PROPRIETARY|COMMERCIAL|LICENSEREF|NVIDIA|EULA|END USER", re.IGNORECASE)


def license_excluded(lic: str) -> str:
    """Reason to leave a distribution out because of its license, or ''."""
    if not lic:
        return "license unknown"
    if _EXCLUDE_LICENSE.search(lic):
        return f"license '{lic}' (copyleft, proprietary or custom)"
    return ""


# ----------------------------------------------------------------------------------------------
# File listing
# ----------------------------------------------------------------------------------------------

@dataclass
class Source:
    name: str
    version: str
    license: str
    files: list = field(default_factory=list)  # [(path, size)]
    excluded: str = ""

    @property
    def total_bytes(self) -> int:
        return sum(s for _, s in self.files)


def _stat_size(path: str) -> int:
    try:
        st = os.stat(path)
    except OSError:
        return -1
    return st.st_size


def list_stdlib() -> Source:
    root = sysconfig.get_paths()["stdlib"]
    src = Source(STDLIB, sys.version.split()[0], STDLIB_LICENSE)
    skip_dirs = {"site-packages", "dist-packages", "__pycache__"}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip_dirs and not d.startswith("."))
        for fn in sorted(filenames):
            if fn.endswith(".py"):
                p = os.path.join(dirpath, fn)
                src.files.append((p, _stat_size(p)))
    return src


def list_distributions() -> list:
    seen = set()
    out = []
    for dist in ilm.distributions():
        try:
            name = dist.metadata["Name"] or ""
        except Exception:
            name = ""
        if not name:
            continue
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        seen.add(key)
        try:
            lic = dist_license(dist)
        except Exception:
            lic = ""
        src = Source(name, dist.version or "", lic)
        src.excluded = license_excluded(lic)
        files = None
        try:
            files = dist.files
        except Exception:
            files = None
        if files is None:
            if not src.excluded:
                src.excluded = "no file list (RECORD) in its metadata"
            out.append(src)
            continue
        base = str(dist.locate_file(""))
        for f in files:
            rel = str(f)
            if not rel.endswith(".py") or ".." in rel.replace("\\", "/").split("/"):
                continue
            p = os.path.normpath(os.path.join(base, rel))
            src.files.append((p, _stat_size(p)))
        src.files.sort()
        out.append(src)
    out.sort(key=lambda s: s.name.lower())
    return out


def _path_order_key(path: str) -> str:
    return hashlib.sha1(path.encode("utf-8", "surrogateescape")).hexdigest()


def select_files(sources: list, max_bytes: int) -> tuple:
    """Pick files within max_bytes: the stdlib in full (if it fits), then a fair share per
    distribution (water-filling: every distribution gets min(its size, c) with one common cap c).
    Returns ([(path, source_name)], {source_name: bytes_selected})."""
    usable = []
    for s in sources:
        if s.excluded:
            continue
        files = [(p, n) for p, n in s.files if 0 < n <= MAX_FILE_BYTES]
        if files:
            usable.append((s, files))
    selected = []
    budget = max_bytes
    chosen_bytes = {}
    std = [u for u in usable if u[0].name == STDLIB]
    rest = [u for u in usable if u[0].name != STDLIB]
    # Stdlib first, in full if it fits.
    for s, files in std:
        take = sorted(files, key=lambda f: _path_order_key(f[0]))
        acc = 0
        for p, n in take:
            if acc + n > budget:
                continue
            selected.append((p, s.name))
            acc += n
        chosen_bytes[s.name] = acc
        budget -= acc
    if not rest or budget <= 0:
        return selected, chosen_bytes
    sizes = [sum(n for _, n in files) for _, files in rest]
    if sum(sizes) <= budget:
        cap = max(sizes)
    else:
        lo, hi = 0, max(sizes)
        while lo < hi:  # largest cap with sum(min(size, cap)) <= budget
            mid = (lo + hi + 1) // 2
            if sum(min(x, mid) for x in sizes) <= budget:
                lo = mid
            else:
                hi = mid - 1
        cap = lo
    for (s, files), total in zip(rest, sizes):
        take = sorted(files, key=lambda f: _path_order_key(f[0]))
        acc = 0
        for p, n in take:
            if acc + n > cap:
                continue
            selected.append((p, s.name))
            acc += n
        chosen_bytes[s.name] = acc
    return selected, chosen_bytes


# ----------------------------------------------------------------------------------------------
# Reading files and extracting instruction examples (runs in worker processes)
# ----------------------------------------------------------------------------------------------

_NON_VERBS = {
    "the", "a", "an", "this", "these", "that", "those", "it", "its", "helper", "internal", "utility",
    "function", "method", "wrapper", "decorator", "private", "simple", "dummy", "convenience", "generic",
    "main", "default", "base", "abstract", "new", "same", "like", "alias", "deprecated", "used", "called",
    "given", "if", "for", "when", "in", "on", "to", "with", "as", "by", "from", "of", "all", "some", "each",
    "every", "no", "not", "only", "just", "here", "there", "we", "you", "i", "our", "your", "note", "see",
    "todo", "fixme", "xxx", "test", "tests", "example", "examples", "backport", "legacy", "fast", "slow",
    "private", "public", "python", "pure", "shortcut", "entry", "implementation", "version", "equivalent",
    "handler", "parser", "getter", "setter", "checker", "loader", "writer", "reader", "builder", "container",
    "manager", "formatter", "converter", "iterator", "generator", "factory", "callback", "constructor",
    "accessor", "property", "context", "hook", "mixin", "class", "object", "instance", "module", "utility",
    "one", "two", "any", "both", "either", "most", "many", "other", "another", "such", "what", "how", "why",
    "hook", "called", "invoked", "run", "runs",
}

_VOWELS = set("aeiou")
_LY_VERBS = {"apply", "multiply", "supply", "reply", "rely", "comply", "embed", "feed", "need", "seed",
             "shed", "speed", "proceed", "exceed", "succeed", "mention", "function", "position", "partition",
             "question", "version", "condition", "section", "install", "signal", "label", "cancel", "total",
             "append", "extend", "send", "read", "add", "load", "find", "bind", "build", "embed", "shred"}


def _third_person(verb: str) -> str:
    v = verb.lower()
    if v.endswith("s") and not v.endswith("ss"):
        return v
    if v.endswith(("ss", "sh", "ch", "x", "z", "o")):
        return v + "es"
    if v.endswith("y") and len(v) > 1 and v[-2] not in _VOWELS:
        return v[:-1] + "ies"
    return v + "s"


def _instruction(sentence: str, kind: str = "function") -> str:
    first, _, rest = sentence.partition(" ")
    low = first.lower()
    verb_like = (first.isalpha() and first[0].isupper() and low not in _NON_VERBS and len(low) > 1
                 and not sentence.endswith("?")
                 and (low in _LY_VERBS
                      or not low.endswith(("ing", "ed", "ly", "able", "ible", "ion", "al", "or", "ness", "ment"))))
    if verb_like and rest:
        return f"Write a Python {kind} that {_third_person(first)} {rest}"
    return f"Write a Python {kind} for the following: {sentence}"


_SENT_RE = re.compile(r"(.+?[.!?])(?:\s|$)")
_BAD_START = ("todo", "deprecated", "test", "xxx", "fixme", "see ", "note", "internal", "private",
              "helper", "hack", "backwards", "compat", "do not", "don't", "args", "parameters", "returns:")


def _first_sentence(doc: str) -> str:
    para = doc.strip().split("\n\n")[0]
    para = " ".join(para.split())
    m = _SENT_RE.match(para)
    sent = m.group(1) if m else para
    return sent.strip()


def _iter_defs(body, depth=0):
    """Functions at module level and inside (nested) class bodies, not inside other functions."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node
        elif isinstance(node, ast.ClassDef) and depth < 3:
            yield from _iter_defs(node.body, depth + 1)


def extract_examples(text: str, limit: int = 12) -> list:
    """Documented functions and methods -> [(instruction, source)]."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return []
    except Exception:
        return []
    lines = text.splitlines()
    out = []
    for node in _iter_defs(tree.body):
        if len(out) >= limit:
            break
        if node.name.startswith("test"):
            continue
        try:
            doc = ast.get_docstring(node, clean=True)
        except Exception:
            doc = None
        if not doc:
            continue
        sent = _first_sentence(doc)
        if not (20 <= len(sent) <= 160) or not sent[0].isalpha() or sent.endswith(":"):
            continue
        if ">>>" in sent or "<|" in sent or sent.lower().startswith(_BAD_START):
            continue
        end = getattr(node, "end_lineno", None)
        if end is None:
            continue
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        body = lines[start - 1:end]
        if not (3 <= len(body) <= 60):
            continue
        src = textwrap.dedent("\n".join(body)).rstrip()
        if len(src) > 2000 or "<|" in src or "\t" in src or not src.lstrip().startswith(("def ", "async def ", "@")):
            continue
        args = node.args.posonlyargs + node.args.args
        kind = "method" if args and args[0].arg in ("self", "cls") else "function"
        out.append((_instruction(sent, kind), src))
    return out


def _data_like(text: str) -> bool:
    long_chars = 0
    for line in text.splitlines():
        if len(line) > LONG_LINE:
            long_chars += len(line)
    return long_chars > 0.1 * len(text)


def _read_worker(task):
    """(path, source, held_out_pct, want_examples) -> (path, source, sha1|None, text|reason, examples)"""
    path, source, held_pct, want_examples = task
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        return (path, source, None, f"unreadable: {e.__class__.__name__}", [])
    if len(raw) > MAX_FILE_BYTES:
        return (path, source, None, "over 1 MB", [])
    if len(raw) < 16:
        return (path, source, None, "tiny", [])
    if b"\x00" in raw:
        return (path, source, None, "binary", [])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return (path, source, None, "not UTF-8", [])
    if text.startswith("\ufeff"):
        text = text[1:]
    text = text.replace("\r\n", "\n")
    if _data_like(text):
        return (path, source, None, "data-like (long lines)", [])
    sha = hashlib.sha1(text.encode("utf-8")).hexdigest()
    examples = []
    if want_examples and not is_held_out(sha, held_pct):
        examples = extract_examples(text)
    return (path, source, sha, text, examples)


def is_held_out(sha1_hex: str, held_pct: float) -> bool:
    # held_pct percent of files, by content hash: stable across runs and machines.
    return (int(sha1_hex[:8], 16) % 10000) < int(round(held_pct * 100))


# ----------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------

@dataclass
class Corpus:
    train_docs: list          # [str]
    heldout_docs: list        # [str]
    train_sources: list       # source name per train doc
    heldout_sources: list
    examples: list            # [(instruction, source_code, source_name)]
    sources: list             # [Source]
    stats: dict               # per source: files/bytes kept, license, version
    skipped: dict             # reason -> count
    duplicates: int
    seconds: float


def collect(max_mb: float = 180.0, held_out_pct: float = 1.0, workers: int = 16,
            max_examples: int = 60000) -> Corpus:
    t0 = time.time()
    sources = [list_stdlib()] + list_distributions()
    listed = sum(len(s.files) for s in sources)
    log(f"listed {listed} .py files in {len(sources)} sources "
        f"({sum(1 for s in sources if s.excluded)} sources excluded by license/metadata) "
        f"in {time.time() - t0:.1f}s")
    selected, _ = select_files(sources, int(max_mb * 1e6))
    if not selected:
        raise SystemExit("corpus: no Python files found to read (is this the right interpreter?)")
    log(f"reading {len(selected)} files (cap {max_mb:.0f} MB) with {workers} processes")
    tasks = [(p, s, held_out_pct, True) for p, s in selected]
    ctx = mp.get_context("fork") if sys.platform.startswith("linux") else mp.get_context()
    results = []
    with ctx.Pool(processes=max(1, workers)) as pool:
        for r in pool.imap(_read_worker, tasks, chunksize=32):
            results.append(r)
    seen = set()
    seen_examples = set()
    train_docs, heldout_docs, train_src, held_src, examples = [], [], [], [], []
    skipped = {}
    dups = 0
    by_name = {s.name: s for s in sources}
    stats = {}
    for path, source, sha, payload, exs in results:
        if sha is None:
            skipped[payload] = skipped.get(payload, 0) + 1
            continue
        if sha in seen:
            dups += 1
            continue
        seen.add(sha)
        st = stats.setdefault(source, {"files": 0, "bytes": 0, "train_files": 0, "heldout_files": 0,
                                       "examples": 0, "license": by_name[source].license,
                                       "version": by_name[source].version})
        st["files"] += 1
        st["bytes"] += len(payload.encode("utf-8"))
        if is_held_out(sha, held_out_pct):
            heldout_docs.append(payload)
            held_src.append(source)
            st["heldout_files"] += 1
        else:
            train_docs.append(payload)
            train_src.append(source)
            st["train_files"] += 1
            for instr, code in exs:
                if len(examples) >= max_examples:
                    break
                h = hashlib.sha1(code.encode("utf-8")).hexdigest()
                if h in seen_examples:
                    continue
                seen_examples.add(h)
                examples.append((instr, code, source))
                st["examples"] += 1
    secs = time.time() - t0
    tb = sum(len(d) for d in train_docs)
    hb = sum(len(d) for d in heldout_docs)
    log(f"kept {len(train_docs)} train files ({tb / 1e6:.1f} M chars), {len(heldout_docs)} held-out files "
        f"({hb / 1e6:.2f} M chars), {dups} duplicates dropped, skipped {dict(sorted(skipped.items()))}, "
        f"{len(examples)} instruction examples, {secs:.1f}s")
    return Corpus(train_docs, heldout_docs, train_src, held_src, examples, sources, stats, skipped, dups, secs)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="Dry run of the spill-tiny corpus collection.")
    ap.add_argument("--max-mb", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 4)
    a = ap.parse_args()
    c = collect(a.max_mb, workers=a.workers)
    for name, st in sorted(c.stats.items(), key=lambda kv: -kv[1]["bytes"])[:40]:
        print(f"{name:32s} {st['files']:6d} files {st['bytes'] / 1e6:8.2f} MB  ex={st['examples']:5d}  {st['license']}")
    for s in c.sources:
        if s.excluded:
            print(f"excluded: {s.name} {s.version}: {s.excluded}")
    for instr, code, src in c.examples[:5]:
        print("----", src, "\n", instr, "\n", code[:300])
