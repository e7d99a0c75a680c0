"""Roofline's command line.

    python -m labs list                                   the labs and their parameters
    python -m labs run roofline size_mib=256 [--out F]    run a lab (model only without a GPU)
    python -m labs run roofline --record                  ... and commit it as content/recorded/<gpu>/roofline.json
    python -m labs calibrate [--record]                   measure this GPU's ceilings
    python -m labs warmup [--labs a,b]                    instructor warm-up: compile and run every lab once
    python -m labs --cluster tls://HOST:8786 run roofline on a GPU of a pool (labs/engine/pool.py; or ROOFLINE_CLUSTER)
    python -m labs count roofline [k=v ...] [--record]    hardware counters (ncu) beside the model's bytes and FLOPs
    python -m labs workbench list                         the workbench exercises
    python -m labs workbench run matmul my_kernel.py      check (and on a GPU, judge) a kernel in the jail [--record]
    python -m labs workbench prepare                      on a GPU server: settle the trusted judge's jail now
        [--learner NAME --class CODE]                     ... and keep it in the class store, as the page does
    python -m labs class new [TITLE] | list | board EXERCISE [--class CODE] [--csv]   the class (labs/classroom)

Progress goes to stderr; results go to --out (JSON, or CSV if the name ends in .csv) or stdout.
Bad input exits with status 2 and says what is allowed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from labs import all_labs, get_lab
from labs.engine import gpu
from labs.engine import params as params_mod
from labs.engine import runner
from labs.engine.results import save_recording


def _progress(fraction: float, message: str) -> None:
    print(f"[{100 * fraction:5.1f}%] {message}", file=sys.stderr, flush=True)


def _parse_assignments(items: list[str]) -> dict:
    values = {}
    for item in items:
        if "=" not in item:
            raise params_mod.ParamError(f"expected key=value, got {item!r}")
        key, value = item.split("=", 1)
        values[key.strip()] = value
    return values


def cmd_list(_args) -> int:
    for lab in all_labs():
        print(f"{lab.name:14s} {lab.title}: {lab.summary}")
        print(params_mod.describe(lab.Params))
    return 0


def cmd_run(args) -> int:
    lab = get_lab(args.lab)
    params = params_mod.from_strings(lab.Params, _parse_assignments(args.assignments))
    target = gpu.live_target()
    if target is None and not runner.cluster_address():
        if args.record:
            raise params_mod.ParamError(f"--record needs a GPU: {gpu.detect().reason}")
        print(f"{gpu.detect().reason}\nShowing the model for {args.model_gpu}.", file=sys.stderr)
        result = runner.model(lab, params, gpu.datasheet_target(gpu.datasheet_by_name(args.model_gpu)))
    else:
        result = runner.run(lab, params, progress=_progress,
                            on_wait=lambda pos: _progress(0, f"waiting for the GPU ({pos} ahead)"))
    for message in result.messages:
        print(message, file=sys.stderr)
    text = result.to_csv() if args.out and args.out.endswith(".csv") else result.to_json()
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    if args.record:
        print(f"recorded {save_recording(result)}", file=sys.stderr)
    worst = result.max_abs_error_pct()
    if worst is not None:
        print(f"largest |model error|: {worst:.1f}%", file=sys.stderr)
    if result.steadiness():
        print(result.steadiness(), file=sys.stderr)
    return 0


def cmd_calibrate(args) -> int:
    from labs.engine import calibration  # torch and Triton: imported only for this command

    ceilings = calibration.calibrate(_progress, record=args.record)
    print(json.dumps(ceilings.to_dict(), indent=2))
    return 0


def cmd_warmup(args) -> int:
    """Instructor warm-up: every lab's default run, twice; the second pass must come from the cache."""
    if not runner.live_gpu().available:
        raise params_mod.ParamError(f"warmup needs a GPU: {runner.live_gpu().reason}")
    labs = [get_lab(n) for n in args.labs.split(",")] if args.labs else list(all_labs())
    failed = False
    record = (lambda result: print(f"  recorded {save_recording(result)}", file=sys.stderr)) if args.record else None
    for attempt in ("first pass (compiles and measures)", "second pass (served from the cache)"):
        print(attempt, file=sys.stderr)
        report = runner.warmup(labs, lambda i, lab, s: _progress(i / len(labs), f"{lab.name}: {s}"),
                               **({"on_result": record} if record and attempt.startswith("first") else {}))
        for name, seconds, status in report:
            print(f"  {name:14s} {seconds:8.2f} s  {status}", file=sys.stderr)
            failed |= status.startswith("failed")
    from labs.workbench.verdict import prepare_judge  # the workbench's trusted judge, ready before the class

    print("  " + prepare_judge(background=False), file=sys.stderr)
    return 1 if failed else 0


def cmd_count(args) -> int:
    """Hardware counters for the lab's points beside its model (labs/counters.py)."""
    from labs.engine import counters

    lab = get_lab(args.lab)
    params = params_mod.from_strings(lab.Params, _parse_assignments(args.assignments))
    try:
        result = counters.count(lab.name, params, progress=_progress,
                                on_wait=lambda pos: _progress(0, f"waiting for the GPU ({pos} ahead)"))
    except counters.CountersUnavailable as exc:
        print(f"no counters: {exc}", file=sys.stderr)
        return 3
    for message in result.messages:
        print(message, file=sys.stderr)
    print(counters.format_table(result.rows))
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(result.to_csv() if args.out.endswith(".csv") else result.to_json())
        print(f"wrote {args.out}", file=sys.stderr)
    if args.record:
        print(f"recorded {counters.save_recording(result)}", file=sys.stderr)
    return 0


def cmd_workbench(args) -> int:
    """The kernel workbench: list the exercises, or check (and time) a kernel file in the sandbox."""
    from labs.workbench import EXERCISES, get_exercise
    from labs.workbench import verdict as wb

    if args.action == "list":
        for ex in EXERCISES:
            print(f"{ex.name:10s} {ex.title}  [{ex.lab} lab]\n  write: {ex.signature}\n  starter: {ex.path('starter')}")
        return 0
    if args.action == "prepare":  # what the app does at start: the trusted judge's jail found and remembered
        said = wb.prepare_judge(background=False)
        print(said)
        return 0 if said.startswith("trusted judge ready") else 3
    if not args.exercise or not args.file:
        raise params_mod.ParamError("usage: python -m labs workbench run EXERCISE FILE [--record]")
    ex = get_exercise(args.exercise)
    try:
        with open(args.file) as fh:
            code = fh.read()
    except OSError as exc:
        raise params_mod.ParamError(f"cannot read {args.file}: {exc.strerror}") from None
    if args.learner or args.class_code:  # kept in the class store, like the page (labs/classroom/cli.py)
        from labs.classroom import cli as class_cli

        if not (args.learner and args.class_code):
            raise params_mod.ParamError("--learner and --class go together: your display name and the class code")
        verdict = class_cli.submit_as_learner(ex, code, args.learner, args.class_code, args.key, _progress,
                                              lambda message: _progress(0, message), model_gpu=args.model_gpu)
    else:
        verdict = wb.submit(ex, code, progress=_progress, model_gpu=args.model_gpu,
                            on_wait=lambda pos: _progress(0, f"waiting for the GPU ({pos} ahead)"))
    print(json.dumps(verdict, indent=1, default=str) if args.json else wb.summary_line(verdict))
    print(verdict.get("message", ""), file=sys.stderr)
    print(f"measured by: {verdict.get('measured_by')}; jail: {verdict.get('jail')}", file=sys.stderr)
    for row in verdict.get("points", []):
        if row.get("gap"):
            print(f"{row['point']}: {row['gap']}", file=sys.stderr)
    for note in verdict.get("notes", []):
        print(note, file=sys.stderr)
    if args.record:
        if not verdict.get("gpu") or verdict.get("status") != "correct":
            raise params_mod.ParamError("--record needs a GPU and a correct kernel.")
        print(f"recorded {save_recording(wb.to_result(verdict, os.path.basename(args.file)))}", file=sys.stderr)
    return 0 if verdict.get("status") == "correct" else 1


def add_class_parser(sub) -> None:
    """`class ...` (labs/classroom): where the class store's libraries (SQLAlchemy) are missing, every other
    command still works and `class` says what to install."""
    try:
        from labs.classroom import cli as class_cli
    except ImportError as exc:
        missing = sub.add_parser("class", help="the class store (needs SQLAlchemy: pip install -r requirements.txt)")
        missing.add_argument("rest", nargs="*")

        def refuse(_args, reason=str(exc)):
            raise params_mod.ParamError(f"The class store needs its libraries ({reason}): pip install -r requirements.txt")
        missing.set_defaults(func=refuse)
        return
    class_cli.add_parser(sub)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labs", description="Roofline's labs from the command line.")
    parser.add_argument("--cluster", metavar="ADDRESS",
                        help="run labs on a GPU pool: its Dask scheduler, e.g. tls://10.0.0.5:8786 "
                             "(as ROOFLINE_CLUSTER)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the labs and their parameters").set_defaults(func=cmd_list)
    run = sub.add_parser("run", help="run a lab: python -m labs run LAB [key=value ...]")
    run.add_argument("lab")
    run.add_argument("assignments", nargs="*", metavar="key=value")
    run.add_argument("--out", help="write the result here (.json or .csv)")
    run.add_argument("--record", action="store_true", help="also save it as a recorded run of this GPU")
    run.add_argument("--model-gpu", default="H100 SXM", choices=[r.name for r in gpu.DATASHEET],
                     help="without a GPU: which datasheet GPU to model (default: H100 SXM)")
    run.set_defaults(func=cmd_run)
    cal = sub.add_parser("calibrate", help="measure this GPU's ceilings (copy, FMA, matmul)")
    cal.add_argument("--record", action="store_true", help="also commit them under content/recorded/")
    cal.set_defaults(func=cmd_calibrate)
    warm = sub.add_parser("warmup", help="run every lab's default sweep so a class demo never waits on compilation")
    warm.add_argument("--labs", help="comma-separated lab names (default: all)")
    warm.add_argument("--record", action="store_true", help="also record each lab's first-pass run")
    warm.set_defaults(func=cmd_warmup)
    cnt = sub.add_parser("count", help="read the GPU's hardware counters (Nsight Compute) for a lab's points "
                                       "beside the model: python -m labs count LAB [key=value ...]")
    cnt.add_argument("lab")
    cnt.add_argument("assignments", nargs="*", metavar="key=value")
    cnt.add_argument("--out", help="also write the counted rows here (.json or .csv)")
    cnt.add_argument("--record", action="store_true",
                     help="also save it as a recorded counter run of this GPU (content/recorded/<gpu>/counters/)")
    cnt.set_defaults(func=cmd_count)
    wb = sub.add_parser("workbench", help="the kernel workbench: python -m labs workbench list | run EXERCISE FILE")
    wb.add_argument("action", choices=("list", "run", "prepare"),
                    help="prepare: find how the trusted judge's profiler works with the jail here (the app does it at start)")
    wb.add_argument("exercise", nargs="?")
    wb.add_argument("file", nargs="?", help="a Python file defining the exercise's function")
    wb.add_argument("--json", action="store_true", help="print the whole verdict as JSON (without a GPU it carries "
                    "interpreter_bytes and predicted_ms_yours: your launch counted in the interpreter, and modelled)")
    wb.add_argument("--model-gpu", default=None, choices=[r.name for r in gpu.DATASHEET],
                    help="without a GPU: which datasheet GPU to model (default: H100 SXM, as on the lab pages)")
    wb.add_argument("--record", action="store_true",
                    help="on a GPU: save the verdict as content/recorded/<gpu>/workbench-<exercise>.json")
    wb.add_argument("--learner", metavar="NAME", help="your display name in the class (with --class)")
    wb.add_argument("--class", dest="class_code", metavar="CODE", help="the class code: keep the run in the class store")
    wb.add_argument("--key", default="", help="your learner key (else kept from your first run, or ROOFLINE_LEARNER_KEY)")
    wb.set_defaults(func=cmd_workbench)
    add_class_parser(sub)
    args = parser.parse_args(argv)
    if args.cluster:
        os.environ["ROOFLINE_CLUSTER"] = args.cluster
    try:
        return args.func(args)
    except params_mod.ParamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
