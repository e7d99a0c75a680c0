"""What the device scripts (scripts/*_gpu.py) share: a deadline in seconds since start (env DEADLINE_S), rows
printed as they are measured and kept for one JSON file under $OUT, and sections run in turn, where one that
fails is reported and the others still run."""
import json
import os
import time


class Report:
    def __init__(self, name: str, deadline_s: float):
        self.name = name
        self.started = time.monotonic()
        self.deadline = float(os.environ.get("DEADLINE_S", str(deadline_s)))
        self.out = os.environ.get("OUT")
        self.results: dict = {"rows": []}

    def record(self, section: str, **row) -> None:
        row["section"] = section
        self.results["rows"].append(row)
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)

    def late(self) -> bool:
        return time.monotonic() - self.started > self.deadline

    def save(self) -> None:
        if self.out:
            with open(os.path.join(self.out, f"{self.name}.json"), "w") as fh:
                json.dump(self.results, fh, indent=1, default=str)

    def run_sections(self, sections: dict, wanted) -> None:
        """Each wanted section in turn (none started past the deadline), saving after each."""
        for name in wanted:
            if self.late():
                print(f"skipped {name}: past the deadline", flush=True)
                continue
            started = time.monotonic()
            try:
                sections[name]()
            except Exception as exc:  # noqa: BLE001 - one broken section must not lose the others
                print(f"{name} failed: {type(exc).__name__}: {exc}", flush=True)
            print(f"-- {name}: {time.monotonic() - started:.1f} s", flush=True)
            self.save()
