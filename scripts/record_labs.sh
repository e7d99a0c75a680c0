#!/usr/bin/env bash
# Re-record single-GPU labs on whatever GPU this runs on, from the CLI defaults, after the last kernel and model
# change: one device call (any single-GPU kind). Usage: bash scripts/record_labs.sh LAB [LAB ...]
# Each lab is skipped once BUDGET_S seconds have passed; the GPU's recordings are packed into $OUT after every lab,
# so what was recorded comes back even if the call runs out of time. The log of each run is packed beside them.
# GPUS=N (a machine of N GPUs of one kind): N lanes at once, lane i on GPU i (CUDA_VISIBLE_DEVICES), the labs
# dealt out in the order given (name the longest first); each lab still has a GPU to itself.
# GPU_TESTS (env, test files): run their GPU-marked tests after the recordings, if the budget allows.
# COUNT (env, lab names): after the recordings, count those labs under Nsight Compute and record the counts too
# (content/recorded/<gpu>/counters/), packed beside the runs.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ROOFLINE_CACHE=${ROOFLINE_CACHE:-/tmp/rc}
BUDGET_S=${BUDGET_S:-540}
GPUS=${GPUS:-1}
KEY=$(python3 -c "from labs.engine import gpu; print(gpu.detect().key)")
mkdir -p /tmp/record
pack() { [ -n "${OUT:-}" ] && tar czf "$OUT/recorded-$KEY.tgz" "content/recorded/$KEY" /tmp/record 2>/dev/null; }
echo "GPU key $KEY, commit ${ROOFLINE_GIT_COMMIT:-?}, $GPUS lane(s)"
record() {  # record LAB [GPU]: one lab through the CLI, its log kept
  local lab=$1 t=$SECONDS
  if [ "$SECONDS" -ge "$BUDGET_S" ]; then echo "== $lab: skipped (budget, $SECONDS s)"; return; fi
  CUDA_VISIBLE_DEVICES=${2:-${CUDA_VISIBLE_DEVICES:-0}} \
    python3 -m labs run "$lab" --record --out "/tmp/record/$lab.json" > "/tmp/record/$lab.log" 2>&1
  local rc=$?
  echo "== $lab: rc $rc in $((SECONDS - t)) s${2:+ on GPU $2}"; grep -v "^\[" "/tmp/record/$lab.log" | tail -"${TAIL:-4}"
}
if [ "$GPUS" -le 1 ]; then
  for lab in "$@"; do record "$lab"; pack; done
else
  labs=("$@")
  for ((lane = 0; lane < GPUS; lane++)); do
    ( for ((i = lane; i < ${#labs[@]}; i += GPUS)); do record "${labs[$i]}" "$lane"; done ) > "/tmp/record/lane-$lane.txt" &
  done
  wait
  cat /tmp/record/lane-*.txt
  pack
fi
for lab in ${COUNT:-}; do  # counted after the runs: each count takes 20-60 s
  if [ "$SECONDS" -ge "$BUDGET_S" ]; then echo "== count $lab: skipped (budget, $SECONDS s)"; continue; fi
  t=$SECONDS
  python3 -m labs count "$lab" --record > "/tmp/record/count-$lab.log" 2>&1
  echo "== count $lab: rc $? in $((SECONDS - t)) s"; grep -v "^\[" "/tmp/record/count-$lab.log" | tail -"${TAIL:-4}"
  pack
done
if [ -n "${GPU_TESTS:-}" ] && [ "$SECONDS" -lt "$BUDGET_S" ]; then
  # shellcheck disable=SC2086 - GPU_TESTS is a list of files
  python3 -m pytest $GPU_TESTS -q -m gpu -p no:cacheprovider 2>&1 | tail -"${TAIL:-15}"
fi
echo "total $SECONDS s"
