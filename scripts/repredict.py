"""Re-predict recorded runs with the current models, offline (no GPU): how many points each model gets within 15 %.

    python scripts/repredict.py [LAB ...] [--gpu KEY ...] [--show]
    python scripts/repredict.py --dump FILE         # every point's re-predicted error, as JSON
    python scripts/repredict.py --compare FILE      # the same, compared point by point with an earlier dump

For every recording content/recorded/<gpu>/<lab>.json it re-predicts each point with the model in this checkout
(labs/repredict.py says how; the app's pages show recordings the same way) and prints the share of points within
15 % and the number off by more than 50 %, before (the predictions stored in the recording) and after.
`--show` lists every point still off by more than 50 % after. `--dump` and `--compare` check that a change
which should not move any model (a refactoring) moves none: dump before, compare after; exit status 1 on
any difference.
"""
import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labs import all_labs  # noqa: E402
from labs.engine.params import ParamError  # noqa: E402
from labs.engine.repredict import FAR_PCT, repredicted_rows, score  # noqa: E402
from labs.engine.results import RECORDED_DIR  # noqa: E402


def shares(errors: list) -> tuple:
    """(share within 15 %, points off by more than 50 %, points without a prediction), as labs.engine.repredict.score."""
    s = score(errors)
    within = s["within_15_pct"] / 100 if s["within_15_pct"] is not None else float("nan")
    return within, s["over_50_pct"], len(errors) - s["points"]


def point_errors(labs: dict, names: list, gpus) -> dict:
    """{"<gpu>/<lab>": [[key columns, re-predicted error %], ...]} for every recording (or the reason it failed)."""
    found = {}
    for name in names:
        for path in sorted(RECORDED_DIR.glob(f"*/{name}.json")):
            if gpus is not None and path.parent.name not in gpus:
                continue
            try:
                rows = repredicted_rows(labs[name], json.loads(path.read_text()))
            except (ParamError, KeyError, TypeError, ValueError) as exc:
                found[f"{path.parent.name}/{name}"] = f"cannot re-predict: {type(exc).__name__}: {exc}"
                continue
            found[f"{path.parent.name}/{name}"] = [[{k: r.get(k) for k in labs[name].key}, r.get("after_pct")]
                                                   for r in rows]
    return found


def compare(before: dict, after: dict) -> int:
    """Print each recording's points that differ; 0 when every point is identical."""
    differ = 0
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        same = old == new
        differ += not same
        points = len(new) if isinstance(new, list) else 0
        print(f"{key:<44} {points:>4} points  {'identical' if same else 'DIFFERENT'}")
        if not same and isinstance(old, list) and isinstance(new, list):
            for o, n in zip(old, new):
                if o != n:
                    print(f"      {o[0]}: {o[1]} -> {n[1]}")
    print(f"{len(set(before) | set(after)) - differ} of {len(set(before) | set(after))} recordings identical")
    return 1 if differ else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("labs", nargs="*", help="lab names (default: every lab with a recording)")
    ap.add_argument("--gpu", nargs="*", default=None, help="GPU keys (default: every recorded GPU)")
    ap.add_argument("--show", action="store_true", help="list the points still off by more than 50 %%")
    ap.add_argument("--dump", metavar="FILE", help="write every point's re-predicted error to FILE (JSON)")
    ap.add_argument("--compare", metavar="FILE", help="compare every point with an earlier --dump")
    args = ap.parse_args(argv)
    labs = {lab.name: lab for lab in all_labs()}
    names = args.labs or sorted(labs)
    if args.dump or args.compare:
        # the keys of a dump go through JSON once, so that a fresh one compares like a stored one
        now = json.loads(json.dumps(point_errors(labs, names, args.gpu), sort_keys=True, default=str))
        if args.dump:
            Path(args.dump).write_text(json.dumps(now, indent=0, sort_keys=True) + "\n")
            print(f"wrote {args.dump}: {len(now)} recordings")
        return compare(json.loads(Path(args.compare).read_text()), now) if args.compare else 0
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
