"""The lab contract: one `Lab` object per lab module, used the same way by pages, CLI and tests.

    predict(params, target) -> rows      the model; pure, needs no GPU
    measure(params, target, progress)    runs the real kernels (checked first), yields measured rows
                                         (and, optionally, strings: notes shown with the result)
    check(params, target)                optional: refuse what cannot run (memory, dtype support)

Rows from `predict` and `measure` share the `key` columns; the runner joins them and adds the
error on `metric` (measured_<metric> against predicted_<metric>). The runner calls `measure` once a pass
(labs/engine/passes.py): it may ask `timing.first_pass()` or use `timing.once_per_run` to check a kernel
against float64 once a run rather than once a pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional

Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class Headline:
    """The one number a learner is asked to predict before a run is revealed (predict-then-run).

    The answer is the row of the result whose columns equal `row`, read at measured_<metric>
    (and predicted_<metric> for the model's answer).
    """

    question: str  # "What TFLOP/s will the fp32 kernel reach at 1024 FLOP per element?"
    unit: str  # "TFLOP/s"
    row: dict  # e.g. {"dtype": "fp32", "flops_per_element": 1024}
    metric: str  # e.g. "tflops"
    scale: float = 1.0  # the metric's value per `unit` (1e9 to ask in GB for a metric in bytes)

    def answer(self, rows: list) -> tuple:
        """(measured, predicted) for the headline row in `unit`, None where absent."""
        for r in rows:
            if all(r.get(k) == v for k, v in self.row.items()):
                return tuple(None if r.get(f"{kind}_{self.metric}") is None else r[f"{kind}_{self.metric}"] / self.scale
                             for kind in ("measured", "predicted"))
        return None, None


@dataclass(frozen=True)
class Lab:
    name: str  # slug: module name, CLI name, page URL, recording file name
    title: str
    summary: str  # one sentence for the lab index
    terms: tuple  # glossary slugs this lab teaches
    Params: type  # dataclass of knobs (see labs.engine.params.param)
    predict: Callable[..., list]
    measure: Callable[..., Iterable[dict]]
    key: tuple  # columns that identify a row in both predict and measure
    metric: str  # headline quantity compared with the model, e.g. "tflops"
    order: int = 100  # position in the lab index
    check: Optional[Callable[..., None]] = None
    lesson_numbers: Optional[Callable[..., dict]] = None  # {{placeholders}} for the lesson text
    headline: Optional[Headline] = None  # the number to predict before a run
    page: str = ""  # the page that shows this lab, when another lab's page hosts it ("" = its own)
    counters: Optional[object] = None  # labs.engine.counters.Adapter: how Nsight Compute counts this lab
    # the runner measures the sweep in passes, one timing of each point per pass (labs/engine/passes.py); False
    # where measure() times in other processes (torchrun workers), which keep their repeats in one window
    timed_in_passes: bool = True

    @property
    def page_name(self) -> str:
        return self.page or self.name

    def default_params(self):
        return self.Params()


def noop_progress(fraction: float, message: str) -> None:
    """A progress callback that ignores progress."""
