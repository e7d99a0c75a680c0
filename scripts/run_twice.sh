#!/usr/bin/env bash
# On a GPU: run each lab twice in a row (CLI defaults, nothing recorded) and compare the runs point by point
# against their spread (scripts/compare_runs.py). Reports go to docs/steadiness/<gpu>-<lab>.txt (and $OUT).
# RECORD=1 records the second run (content/recorded/<gpu>/<lab>.json).
#   bash scripts/run_twice.sh LAB [LAB ...]
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ROOFLINE_CACHE=${ROOFLINE_CACHE:-/tmp/rc}
KEY=$(python3 -c "from labs.engine import gpu; print(gpu.detect().key)")
mkdir -p /tmp/twice docs/steadiness
for lab in "$@"; do
  for n in 1 2; do
    record=""; [ "$n" = 2 ] && [ "${RECORD:-0}" = 1 ] && record="--record"
    python3 -m labs run "$lab" $record --out "/tmp/twice/$lab-$n.json" > "/tmp/twice/$lab-$n.log" 2>&1 \
      || { tail -5 "/tmp/twice/$lab-$n.log"; continue 2; }
    grep -v "^\[" "/tmp/twice/$lab-$n.log" | tail -3
  done
  python3 scripts/compare_runs.py "/tmp/twice/$lab-1.json" "/tmp/twice/$lab-2.json" --out "docs/steadiness/$KEY-$lab.txt" | tail -1
done
[ -n "${OUT:-}" ] && tar czf "$OUT/twice-$KEY.tgz" /tmp/twice docs/steadiness content/recorded/"$KEY" 2>/dev/null
exit 0
