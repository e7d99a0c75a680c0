#!/usr/bin/env bash
# Verify on a GPU, recording nothing: each lab's defaults run through the CLI (every kernel checked against
# float64 before it is timed; the model's error printed), then the GPU-marked tests.
#   bash scripts/verify_gpu.sh [LAB ...]          (default: every single-GPU lab)
# Each step is skipped once BUDGET_S seconds have passed. GPU_TESTS (test files) narrows the tests.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ROOFLINE_CACHE=${ROOFLINE_CACHE:-/tmp/rc}
BUDGET_S=${BUDGET_S:-540}
mkdir -p /tmp/verify
if [ $# -eq 0 ]; then
  set -- $(python3 -c "import labs; print(' '.join(l.name for l in labs.all_labs() if l.name != 'collectives'))")
fi
for lab in "$@"; do
  if [ "$SECONDS" -ge "$BUDGET_S" ]; then echo "== $lab: skipped (budget, $SECONDS s)"; continue; fi
  t=$SECONDS
  python3 -m labs run "$lab" --out "/tmp/verify/$lab.json" > "/tmp/verify/$lab.log" 2>&1
  echo "== $lab: rc $? in $((SECONDS - t)) s"; grep -v "^\[" "/tmp/verify/$lab.log" | tail -"${TAIL:-2}"
done
if [ "$SECONDS" -lt "$BUDGET_S" ]; then
  # shellcheck disable=SC2086 - GPU_TESTS is a list of files
  timeout $((BUDGET_S - SECONDS + 60)) python3 -m pytest ${GPU_TESTS:-tests} -q -m gpu -p no:cacheprovider 2>&1 | tail -"${TAIL_TESTS:-15}"
fi
[ -n "${OUT:-}" ] && cp /tmp/verify/*.json "$OUT"/ 2>/dev/null
echo "total $SECONDS s"
