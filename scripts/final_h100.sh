#!/usr/bin/env bash
# One device call after the last kernel change (nvidia-h100-x1): the Hopper lab's recording and target check,
# the workbench's hardware-counter check, and the labs whose models or kernels changed since the last recording.
# Each step is skipped once BUDGET_S seconds have passed; recordings are packed into $OUT after every step.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ROOFLINE_CACHE=/tmp/rc
BUDGET_S=${BUDGET_S:-380}
mkdir -p /tmp/final
# the workbench's jail: bubblewrap, unpacked from its .deb (carry .whl; README, "Threat model: the workbench")
for deb in .whl/bubblewrap_*.deb; do [ -f "$deb" ] && dpkg -x "$deb" /tmp/bw && export ROOFLINE_BWRAP=/tmp/bw/usr/bin/bwrap; done
pack() { tar czf "$OUT/final.tgz" content/recorded/nvidia-h100-80gb-hbm3 /tmp/final 2>/dev/null; }
step() {  # step NAME COMMAND...
  local name=$1; shift
  if [ "$SECONDS" -ge "$BUDGET_S" ]; then echo "== $name: skipped (budget)"; return; fi
  local t=$SECONDS
  "$@" > "/tmp/final/$name.log" 2>&1; local rc=$?
  echo "== $name: rc $rc in $((SECONDS - t)) s"; grep -v "^\[" "/tmp/final/$name.log" | tail -"${TAIL:-12}"
  pack
}
TAIL=30 step hopper bash -c 'python3 -m labs run hopper --record --out /tmp/final/hopper.json && python3 scripts/hopper_gpu.py --summarise /tmp/final/hopper.json'
TAIL=25 step wb-counters python3 scripts/workbench_gpu.py --counters
for lab in inference fusion recompute matmul attention; do
  TAIL=3 step "$lab" python3 -m labs run "$lab" --record --out "/tmp/final/$lab.json"
done
TAIL=20 step wb-record python3 scripts/workbench_gpu.py --record --skip-probes
echo "total $SECONDS s"
