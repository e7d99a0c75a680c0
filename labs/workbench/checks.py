"""A learner's output against the float64 reference: what passed, and the first element that did not, in words."""

from __future__ import annotations

import math

import torch

from labs.engine import timing


def compare(out, ref: torch.Tensor, dtype: str) -> dict:
    """Relative and max error against float64, and the first element that is wrong (or the worst one)."""
    tol = timing.TOLERANCE[dtype]
    if not isinstance(out, torch.Tensor):
        return {"passed": False, "message": "the function returned no tensor", "shape": list(ref.shape)}
    if tuple(out.shape) != tuple(ref.shape):
        return {"passed": False, "message": f"output shape {tuple(out.shape)}, expected {tuple(ref.shape)}",
                "shape": list(ref.shape)}
    out64, ref64 = out.detach().double(), ref.detach().double()
    rel = timing.rel_error(out64, ref64)
    diff = (out64 - ref64).abs()
    finite = torch.isfinite(out64)
    scale = ref64.abs().mean().item() or 1.0
    wrong = ~finite | (diff > 10 * tol * (ref64.abs() + scale))  # far off for this dtype, element by element
    result = {"passed": rel <= tol, "rel_error": rel, "tolerance": tol,
              "max_abs_error": float(diff[finite].max()) if finite.any() else float("inf"),
              "shape": list(ref.shape)}
    if not result["passed"]:
        flat = wrong.flatten().nonzero()
        i = int(flat[0]) if len(flat) else int(torch.nan_to_num(diff, nan=math.inf).flatten().argmax())
        index = [int(v) for v in torch.unravel_index(torch.tensor(i), tuple(ref.shape))]
        result.update({"first_wrong_index": index, "got": float(out64.flatten()[i]),
                       "expected": float(ref64.flatten()[i]),
                       "wrong_elements": int(wrong.sum()), "elements": ref.numel()})
    return result


def describe_check(case: dict) -> str:
    """One check case in plain sentences: "The 1003 case is wrong: ... at index 1000: got 0, expected 1.5." """
    shape = case.get("case") or "x".join(map(str, case.get("shape", []))) or "?"
    if case.get("passed"):
        return f"{shape}: correct, relative error {case['rel_error']:.2g}, largest absolute error {case['max_abs_error']:.2g}."
    if "first_wrong_index" not in case:
        return f"The {shape} case is wrong: {case.get('message', 'no output')}."
    index = ", ".join(map(str, case["first_wrong_index"]))  # [1000] -> 1000, [1, 2] -> 1, 2: never (1000,)
    return (f"The {shape} case is wrong: its relative error {case['rel_error']:.3g} is above the tolerance "
            f"{case['tolerance']:g}. The first wrong element is at index {index}: got {case['got']:.6g}, expected "
            f"{case['expected']:.6g}. {case['wrong_elements']} of {case['elements']} elements are wrong.")
