"""Does a lab agree with itself? Two result files of the same lab on one GPU, point by point, against their spread.

    python scripts/compare_runs.py FIRST.json SECOND.json [--out REPORT.txt]

A point agrees when its two medians differ by no more than the wider of their two spreads (p10 to p90, in % of
the median, as the timing rule keeps them on each row). Prints one line per point and the share that agree.
"""
import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labs import get_lab  # noqa: E402


def compare(first: dict, second: dict) -> list:
    lab = get_lab(first["lab"])
    metric = f"measured_{lab.metric}"
    keyed = {tuple(r.get(k) for k in lab.key): r for r in second["rows"] if r.get(metric) is not None}
    lines = []
    for a in first["rows"]:
        b = keyed.get(tuple(a.get(k) for k in lab.key))
        if a.get(metric) is None or b is None:
            continue
        diff = 200 * abs(a[metric] - b[metric]) / (a[metric] + b[metric])
        allowed = max(a.get("spread_pct") or 0.0, b.get("spread_pct") or 0.0)
        lines.append((" ".join(f"{k}={a.get(k)}" for k in lab.key), a[metric], b[metric], diff, allowed,
                      diff <= allowed, bool(a.get("unsteady") or b.get("unsteady"))))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("first")
    ap.add_argument("second")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    first, second = (json.loads(Path(p).read_text()) for p in (args.first, args.second))
    lines = compare(first, second)
    gpu = first.get("meta", {}).get("gpu", {}).get("name", "?")
    text = [f"{first['lab']} on {gpu}: two runs of the same parameters, point by point",
            f"{'point':<60} {'first':>10} {'second':>10} {'diff %':>7} {'spread %':>8}  agrees"]
    for name, a, b, diff, allowed, ok, unsteady in lines:
        text.append(f"{name[:60]:<60} {a:>10.4g} {b:>10.4g} {diff:>7.1f} {allowed:>8.1f}  "
                    f"{'yes' if ok else 'NO'}{' (unsteady)' if unsteady else ''}")
    agree = sum(1 for line in lines if line[5])
    text.append(f"{agree} of {len(lines)} points agree within their spread ({100 * agree / max(len(lines), 1):.0f} %)")
    print("\n".join(text))
    if args.out:
        Path(args.out).write_text("\n".join(text) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
