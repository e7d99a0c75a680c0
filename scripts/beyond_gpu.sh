#!/usr/bin/env bash
# Beyond one GPU (issue 17) on the device: run the transfers, collectives and training-memory labs through the
# project's CLI and print a compact table of every point (measured, model, error).
#
#   scripts/beyond_gpu.sh            run, write the JSON files and logs to /tmp/beyond, print the tables
#   scripts/beyond_gpu.sh --record   the same, and save each run as content/recorded/<gpu>/<lab>.json; since the
#                                    device's tree does not return, each recording is also copied to
#                                    $OUT/recorded__<gpu>__<lab>.json (flat: the device returns at most 8 files,
#                                    two folders deep), with all logs in $OUT/beyond.log
#
# On two or more GPUs (nvidia-h200-x2) the collectives lab runs across all of them (one process per GPU,
# torchrun + NCCL). On one GPU it cannot: the script then smoke-tests the same launcher with one process
# (NCCL, world size 1) so that every piece but the second GPU has run. NVLink multicast stays off.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:-$PWD}" ROOFLINE_CACHE="${ROOFLINE_CACHE:-/tmp/rc}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT_DIR="${OUT:-/tmp/beyond}"
WORK_DIR=/tmp/beyond_work  # JSON results and logs; only recordings and one log go to $OUT
mkdir -p "$OUT_DIR" "$WORK_DIR"
RECORD=""
[ "${1:-}" = "--record" ] && RECORD="--record"
export ROOFLINE_GIT_COMMIT="${ROOFLINE_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"

nvidia-smi --query-gpu=index,name,pcie.link.gen.max,pcie.link.width.max,memory.total --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -8
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")

status=0
MARK="$WORK_DIR/.started"; : > "$MARK"  # recordings written after this came from this run
run_lab() {  # run_lab NAME [k=v ...]: the CLI, its JSON and log in $WORK_DIR, the log also in $OUT_DIR/beyond.log
  local name=$1; shift
  local started=$SECONDS
  if python3 -m labs run "$name" "$@" $RECORD --out "$WORK_DIR/$name.json" 2> "$WORK_DIR/$name.log"; then
    echo "== $name: done in $((SECONDS - started)) s"
  else
    echo "== $name: FAILED after $((SECONDS - started)) s"; tail -20 "$WORK_DIR/$name.log"; status=1
  fi
  { echo "### $name"; cat "$WORK_DIR/$name.log"; } >> "$OUT_DIR/beyond.log"
  [ -n "$RECORD" ] && copy_recordings  # at once: a run cut short by its time limit still returns these
}

copy_recordings() {  # the device's tree does not come back: copy the recordings out, flat
  find content/recorded -newer "$MARK" -name '*.json' | while read -r f; do
    flat="recorded__$(basename "$(dirname "$f")")__$(basename "$f")"
    cp "$f" "$OUT_DIR/$flat"; echo "recorded $f (copy in \$OUT/$flat)"
  done
}

run_lab transfers
run_lab trainmem
if [ "$GPUS" -ge 2 ]; then
  run_lab collectives
elif [ "$GPUS" -eq 0 ]; then
  echo "== collectives: no GPU here, nothing to run"
else
  echo "== collectives: $GPUS GPU here; smoke test of the launcher with one process (no recording)"
  python3 - "$WORK_DIR" <<'EOF' || status=1
import json, sys, time
from labs import collectives, gpu
p = collectives.Params(sizes_kib=(1, 1024, 65536), layer_tokens=(1024,))
started = time.time()
rows = [r for r in collectives.run_rows(p, gpu.live_target(), 1, lambda f, m: None) if isinstance(r, dict)]
json.dump(rows, open(f"{sys.argv[1]}/collectives_smoke.json", "w"), indent=1)
print(f"   {len(rows)} rows from 1 process in {time.time() - started:.1f} s")
for r in rows:
    print(f"   {r['experiment']:10s} {r['op']:14s} {r['step']:13s} {r['size_bytes']:>11,d} B  {r['tokens']:>6d} tok  "
          f"{r['measured_ms']:9.4f} ms  check {r['check_rel_error']:.1e}")
EOF
fi

if [ -z "$RECORD" ] && [ "$OUT_DIR" != "$WORK_DIR" ]; then
  cp "$WORK_DIR"/*.json "$OUT_DIR"/ 2>/dev/null
fi

python3 - "$WORK_DIR" <<'EOF'
import json, os, sys

def fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)

COLUMNS = {
    "transfers": (("experiment", "direction", "memory", "size_bytes", "schedule"), ("ms", "gbps")),
    "collectives": (("experiment", "op", "size_bytes", "gpus", "step", "tokens"), ("ms", "busbw_gbps", "gbps")),
    "trainmem": (("batch", "checkpointing", "peak_phase"), ("peak_bytes", "state_bytes", "activation_bytes")),
}
EXTRA = {  # the model's inputs measured beside each point
    "transfers": ("model_route", "model_bandwidth_gbps", "model_first_piece_us", "cpu_read_gbps",
                  "cpu_copy_out_gbps", "pin_ms", "unpin_ms", "cpu_l2_bytes"),
    "collectives": ("model_bus_gbps", "model_host_us", "model_gpu_us", "model_simple_us", "model_protocol"),
}
for lab, (keys, metrics) in COLUMNS.items():
    path = os.path.join(sys.argv[1], f"{lab}.json")
    if not os.path.exists(path):
        continue
    result = json.load(open(path))
    print(f"\n## {lab}: {result['meta'].get('gpu', {}).get('name')} ({result['meta'].get('kind')}), "
          f"{len(result['rows'])} rows, complete={result.get('complete')}")
    for m in result.get("messages", []):
        print("  note:", m)
    extra = EXTRA.get(lab, ())
    head = list(keys) + [f"{w}_{m}" for m in metrics for w in ("meas", "model")] + ["err%"] + list(extra)
    print("  " + " | ".join(head))
    for r in result["rows"]:
        if r.get("measured_ms") is None and r.get("measured_peak_bytes") is None:
            continue
        cells = [fmt(r.get(k)) for k in keys]
        for m in metrics:
            cells += [fmt(r.get(f"measured_{m}")), fmt(r.get(f"predicted_{m}"))]
        cells.append(fmt(r.get("error_pct")))
        cells += [fmt(r.get(k)) for k in extra]
        print("  " + " | ".join(cells))
EOF
exit $status
