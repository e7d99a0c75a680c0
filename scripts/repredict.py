"""Re-predict recorded runs with the current models, offline (no GPU): how many points each model gets within 15 %.

    python scripts/repredict.py [LAB ...] [--gpu KEY ...] [--show]

For every recording content/recorded/<gpu>/<lab>.json it rebuilds the Target the run had (the GPU's shape from the
recording's metadata, the ceilings the run used), calls the lab's predict() for the recording's params, joins the
result with the recorded measurements on the lab's key, and prints the share of points within 15 % and the number
off by more than 50 %, before (the predictions stored in the recording) and after (the model in this checkout).
`--show` lists every point still off by more than 50 % after.

A prediction that a lab makes inside measure() from a figure probed in the same run needs that figure. A lab
module whose model uses such probes offers `repredict(recording, target) -> rows`, which reads the probed figures
back from the recording and predicts every row with them; without it, rows that carry a CPU time measured per
call (a `host_ms` or `gpu_model_ms` column) keep their recorded prediction, and the others get predict()'s.
"""
import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labs import all_labs, gpu  # noqa: E402
from labs.params import ParamError, from_dict  # noqa: E402
from labs.results import RECORDED_DIR, error_pct  # noqa: E402

WITHIN_PCT = 15.0
FAR_PCT = 50.0
IN_RUN_MARKS = ("host_ms", "gpu_model_ms")  # columns a measure() writes when it predicted a row from a probe


def recorded_target(meta: dict) -> gpu.Target:
    """The Target a recorded run predicted for: its GPU's shape and the ceilings it used."""
    g = meta.get("gpu", {})
    ceilings = gpu.Ceilings.from_dict(meta["ceilings"])
    name = g.get("name", ceilings.gpu)
    return gpu.Target(name, g.get("key", gpu.slug(name)), int(g["sm_count"]), int(g["l2_bytes"]),
                      int(g["memory_bytes"]), str(g.get("compute_capability", "9.0")), ceilings,
                      gpu.datasheet_for(name), live=False)


def recorded_params(lab, data: dict):
    """The run's params; keys this version of the lab no longer has are dropped (older recordings)."""
    known = {f.name for f in dataclasses.fields(lab.Params)}
    return from_dict(lab.Params, {k: v for k, v in data.items() if k in known})


def _key(row: dict, key: tuple) -> tuple:
    return tuple(row.get(k) for k in key)


def repredicted_rows(lab, recording: dict) -> list[dict]:
    """The recorded rows with `after_pct`: the error of the current model against each measurement."""
    target = recorded_target(recording["meta"])
    hook = getattr(sys.modules[lab.predict.__module__], "repredict", None)
    model = hook(recording, target) if hook else lab.predict(recorded_params(lab, recording["params"]), target)
    predicted = {_key(r, lab.key): r for r in model}
    out = []
    for row in recording["rows"]:
        measured = row.get(f"measured_{lab.metric}")
        if row.get("error_pct") is None or measured is None:
            continue
        if not hook and any(row.get(mark) is not None for mark in IN_RUN_MARKS):
            new = row
        else:
            new = predicted.get(_key(row, lab.key), {})
        out.append({**row, "after_pct": error_pct(measured, new.get(f"predicted_{lab.metric}"))})
    return out


def shares(errors: list) -> tuple:
    """(share within 15 %, points off by more than 50 %, points without a prediction)."""
    known = [abs(e) for e in errors if e is not None]
    within = sum(e <= WITHIN_PCT for e in known) / len(known) if known else float("nan")
    return within, sum(e > FAR_PCT for e in known), len(errors) - len(known)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("labs", nargs="*", help="lab names (default: every lab with a recording)")
    ap.add_argument("--gpu", nargs="*", default=None, help="GPU keys (default: every recorded GPU)")
    ap.add_argument("--show", action="store_true", help="list the points still off by more than 50 %%")
    args = ap.parse_args(argv)
    labs = {lab.name: lab for lab in all_labs()}
    names = args.labs or sorted(labs)
    print(f"{'lab':<12} {'gpu':<24} {'points':>6}  {'within 15 % before -> after':>28}  {'> 50 % before -> after':>22}")
    for name in names:
        for path in sorted(RECORDED_DIR.glob(f"*/{name}.json")):
            if args.gpu is not None and path.parent.name not in args.gpu:
                continue
            recording = json.loads(path.read_text())
            try:
                rows = repredicted_rows(labs[name], recording)
            except (ParamError, KeyError, TypeError, ValueError) as exc:
                print(f"{name:<12} {path.parent.name:<24} cannot re-predict: {type(exc).__name__}: {exc}")
                continue
            b_in, b_far, _ = shares([r["error_pct"] for r in rows])
            a_in, a_far, a_none = shares([r["after_pct"] for r in rows])
            none = f"  ({a_none} without a prediction now)" if a_none else ""
            print(f"{name:<12} {path.parent.name:<24} {len(rows):>6}  {b_in:>13.0%} -> {a_in:<12.0%}"
                  f"  {b_far:>9} -> {a_far:<10}{none}")
            if args.show:
                for r in rows:
                    if r["after_pct"] is not None and abs(r["after_pct"]) > FAR_PCT:
                        print("      ", " ".join(f"{k}={r.get(k)}" for k in labs[name].key),
                              f"before {r['error_pct']:+.0f} %, after {r['after_pct']:+.0f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
