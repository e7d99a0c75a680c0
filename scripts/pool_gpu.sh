#!/usr/bin/env bash
# The two-GPU load test of the GPU pool (issue 18), for the device kind nvidia-h200-x2, .whl carried:
#   bash scripts/pool_gpu.sh
# 1. warm: one run of each lab of the plan on both workers (compiles every kernel into the disk caches,
#    untimed), 2. 30 sessions in 2 app processes pressing Run, served by 1 GPU worker, 3. the same with
#    2 GPU workers, 4. the ratio of the wall times (target <= 0.6) and the per-GPU lock audit.
# Its work files are under /tmp/pool-load; the summaries (per-session records), the log and the workers'
# lock logs are copied to $OUT when it is set (the device tool brings $OUT back).
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 ROOFLINE_CACHE=/tmp/rc STREAMLIT_BROWSER_GATHER_USAGE_STATS=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
WORK=/tmp/pool-load
rm -rf "$WORK" && mkdir -p "$WORK"
nvidia-smi -L
python3 -c "import torch; n = torch.cuda.device_count(); print('GPUs:', n); assert n >= 2, 'needs 2 GPUs'" || exit 1
quiet() { "$@" 2>&1 | grep -v "missing ScriptRunContext" | tee -a "$WORK/pool-load.log"; }
started=$(date +%s)
quiet python3 scripts/pool_load.py --workers 2 --plan warm --out "$WORK"
echo "warm-up done after $(( $(date +%s) - started )) s"
quiet python3 scripts/pool_load.py --workers 1 --out "$WORK"
quiet python3 scripts/pool_load.py --workers 2 --out "$WORK"
quiet python3 scripts/pool_load.py compare "$WORK/pool-load-load-1.json" "$WORK/pool-load-load-2.json"
status=$?
echo "total $(( $(date +%s) - started )) s"
if [ -n "${OUT:-}" ]; then
  cp "$WORK"/pool-load-load-*.json "$WORK"/runner-load-*.log "$WORK/pool-load.log" "$OUT"/ 2>/dev/null
fi
exit "$status"
