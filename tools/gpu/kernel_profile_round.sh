#!/usr/bin/env bash
# Device round: where a decode step's time goes per kernel, at several batch sizes. ncu times every
# kernel of an S30 step (2 layers, context 512) as a graph node (each carries ~2 us of ncu's launch and
# drain that a graph hides), one run per batch size in BATCHES (default "1 4 8"); then a table per batch:
# kernel, launches per step, us per launch, MB read per launch. BENCH names the cuda_decode_bench
# binary under .carry/bin (default cuda_decode_bench). Logs under $OUT (logs.tar.gz).
#   usage (repo root, device): BATCHES="1 8" tools/gpu/kernel_profile_round.sh    carry: [".carry/pack.tar.xz"]
cd "$(dirname "$0")/../.."
. tools/gpu/round_common.sh
for b in ${BATCHES:-1 4 8}; do
  timeout $(budget 120) ncu --clock-control none --graph-profiling node --csv \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum \
    $B/${BENCH:-cuda_decode_bench} --shape tests/data/shapes/s30.json --layers 2 --batches $b --context 512 \
    --steps 2 > "$OUT/ncu-b$b.txt" 2>&1
  echo "== batch $b: rc=$?"; stamp
  # CSV rows: "ID","Process ID","Process Name","Host Name","Kernel Name",...,"Metric Name","Metric Unit","Metric Value"
  python3 - "$OUT/ncu-b$b.txt" <<'PY'
# The last decode step's kernels in launch order (the kernels after the second-to-last sampling kernel).
import csv, sys
hdr, inst = None, {}
for r in csv.reader(open(sys.argv[1], errors="replace")):
    if r and r[0] == "ID": hdr = r; continue
    if not hdr or len(r) != len(hdr) or not r[0].isdigit(): continue
    k, g = hdr.index("Kernel Name"), hdr.index("Grid Size")
    d = inst.setdefault(int(r[0]), {"name": r[k].split("(")[0].replace("(anonymous namespace)::", ""), "grid": r[g]})
    scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "ns": 1e-3, "us": 1.0, "byte": 1e-6,
             "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3}
    d[r[hdr.index("Metric Name")]] = float(r[hdr.index("Metric Value")].replace(",", "")) * scale.get(r[hdr.index("Metric Unit")], 1.0)
samples = [i for i in sorted(inst) if "sample_rows" in inst[i]["name"]]
if len(samples) < 2: print("no two decode steps in", sys.argv[1]); sys.exit()
total = 0.0
print(f"{'kernel':58s} {'grid':>14s} {'us':>8s} {'MB':>8s}")
for i in sorted(inst):
    if samples[-2] < i <= samples[-1]:
        d = inst[i]; t = d.get("gpu__time_duration.sum", 0.0); total += t
        print(f"{d['name'][:58]:58s} {d['grid']:>14s} {t:8.2f} {d.get('dram__bytes_read.sum', 0.0):8.2f}")
print(f"{'step total (ncu: each kernel alone, ~2 us more than in a graph)':73s} {total:8.2f}")
PY
done
