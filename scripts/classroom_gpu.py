"""On the GPU: warm up (and record) every lab, then open every lab page in AppTest and press Run.

The second pass must be served from the runner's cache in under 1 s per page (issue: classroom).
Usage on the device: python3 scripts/classroom_gpu.py [--record] [--labs a,b]   (streamlit wheels on PYTHONPATH)
"""
import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from labs import all_labs, get_lab
from labs.engine import runner  # noqa: E402
from labs.engine.results import save_recording  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--record", action="store_true")
parser.add_argument("--labs")
args = parser.parse_args()
labs = [get_lab(n) for n in args.labs.split(",")] if args.labs else list(all_labs())

print("== warm-up, first pass", flush=True)
started = time.time()
report = runner.warmup(labs, lambda i, lab, s: print(f"  {lab.name}: {s}", flush=True),
                       on_result=(lambda r: print(f"  recorded {save_recording(r)}", flush=True)) if args.record else (lambda r: None))
print(f"first pass: {time.time() - started:.1f} s", flush=True)

print("== every lab page, Run pressed (served from the cache)", flush=True)
from streamlit.testing.v1 import AppTest  # noqa: E402

for lab in labs:
    if not (ROOT / "pages" / f"{lab.page_name}.py").exists():
        continue
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    at.run()
    at.switch_page(f"pages/{lab.page_name}.py")
    at.run()
    buttons = [b for b in at.button if b.key == f"run:{lab.name}"]
    if not buttons:
        print(f"  {lab.name:14s} no Run button: {[e.value for e in at.error][:1]} {[e.value for e in at.exception][:1]}")
        continue
    t0 = time.perf_counter()
    buttons[0].click().run()
    elapsed = time.perf_counter() - t0
    errors = [e.value[:200] for e in at.exception] + [e.value[:200] for e in at.error]
    print(f"  {lab.name:14s} page with Run: {elapsed:6.2f} s  exceptions/errors: {errors}", flush=True)
print("runner log entries:", len(runner.EVENT_LOG))
