"""The kernel workbench: learners write a kernel, and see it checked, timed and placed against the model.

    exercises.py   the six exercises, each tied to a lab (its reference, model and kernel)
    sandbox.py     the fenced-in worker process every submission runs in
    harness.py     the worker itself (copied into the sandbox; imports nothing of the repository)
    verdict.py     check against float64, timing, our kernel and the library beside it, the gap in words
    store.py       drafts and every submission with its verdict, kept in the class store (labs/classroom)
    pooled.py      a submission judged on a GPU of the pool (labs/engine/pool.py) when there is one, else here

A package, so `labs.all_labs()` does not import it at every app start.
"""

from labs.workbench.exercises import EXERCISES, Exercise, get_exercise

__all__ = ["EXERCISES", "Exercise", "get_exercise"]
