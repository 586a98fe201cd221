#!/usr/bin/env bash
# Device round: what a hand-over between dependent ops costs (handoff_probe: PDL kernels in a graph
# against one persistent kernel with grid-wide counters), then time per output token of S30 (48 layers,
# batch 1) at contexts 4K, 32K and 128K for TPOT(128K) / TPOT(4K). Carry .carry/pack.tar.xz built by
#   EXTRA_BINS="handoff_probe=build/handoff_probe" tools/gpu/pack_spill.sh --tests
# Logs under $OUT (logs.tar.gz); the tables are printed last.
cd "$(dirname "$0")/../.." || exit 1
source tools/gpu/round_common.sh
timeout $(budget 120) $B/handoff_probe --phases 384 --reps 7 > "$OUT/handoff.txt" 2>&1; echo "== handoff rc=$?"; stamp
for ctx in ${CONTEXTS:-4096 32768 131072}; do
  timeout $(budget 400) $B/cuda_decode_bench --shape tests/data/shapes/s30.json --batches 1 --context $ctx --steps 24 \
    --prefill-chunk 4096 > "$OUT/tpot-$ctx.txt" 2>&1
  echo "== tpot $ctx rc=$?"; stamp
done
echo "== tables"
cat "$OUT/handoff.txt"
for ctx in ${CONTEXTS:-4096 32768 131072}; do echo "-- context $ctx"; grep -E '^\||prefill' "$OUT/tpot-$ctx.txt" | tail -6; done
