#!/bin/bash
# Registers, spills and shared memory of every kernel in one CUDA source, as ptxas reports them for the
# build's own compile command (build/compile_commands.json). Usage: tools/gpu/ptxas_report.sh src/backend/cuda/ops.cu [regex]
set -euo pipefail
src="$1"; filter="${2:-.}"
cmd=$(python3 - "$src" <<'PY'
import json, sys, os
src = os.path.abspath(sys.argv[1])
for e in json.load(open("build/compile_commands.json")):
    if os.path.abspath(os.path.join(e["directory"], e["file"])) == src:
        c = e["command"]
        # compile only: the object goes to /tmp
        import shlex
        a = shlex.split(c)
        if "-o" in a: a[a.index("-o") + 1] = "/tmp/ptxas_report.o"
        print("cd " + shlex.quote(e["directory"]) + " && " + " ".join(shlex.quote(x) for x in a) + " -Xptxas -v")
        break
PY
)
[ -n "$cmd" ] || { echo "ptxas_report: $src is not in build/compile_commands.json" >&2; exit 1; }
CCACHE_DISABLE=1 bash -c "$cmd" 2>&1 | c++filt | awk '/Compiling entry function/ {name=$0} /registers|spill/ {print name; print}' |
  grep -A1 -E "$filter" | grep -v '^--$'
