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
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1], errors="replace")) if len(r) > 10 and r[0].isdigit()]
hdr = None
for r in csv.reader(open(sys.argv[1], errors="replace")):
    if r and r[0] == "ID": hdr = r; break
if not hdr or not rows: print("no ncu rows"); sys.exit()
k, mn, mu, mv = hdr.index("Kernel Name"), hdr.index("Metric Name"), hdr.index("Metric Unit"), hdr.index("Metric Value")
per = collections.defaultdict(lambda: collections.defaultdict(list))
for r in rows:
    name = r[k].split("(")[0].split("<")[0].strip()
    v = float(r[mv].replace(",", ""))
    scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0,
             "Gbyte": 1e3, "KB": 1e-3, "MB": 1.0, "GB": 1e3}
    v *= scale.get(r[mu], 1.0)  # us and MB
    per[name][r[mn]].append((r[0], v))
print(f"{'kernel':40s} {'count':>6s} {'us':>8s} {'MB':>8s}")
for name, m in sorted(per.items(), key=lambda kv: -sum(v for _, v in kv[1].get("gpu__time_duration.sum", []))):
    t = [v for _, v in m.get("gpu__time_duration.sum", [])]
    b = [v for _, v in m.get("dram__bytes_read.sum", [])]
    print(f"{name[:40]:40s} {len(t):6d} {sum(t)/max(1,len(t)):8.2f} {sum(b)/max(1,len(b)):8.2f}")
PY
done
