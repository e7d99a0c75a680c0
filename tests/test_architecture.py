"""The house keeps its shape: no import circles, the engine imports no lab, no module over 600 lines, every
lab's model predicts without CUDA, and a lab built by docs/ARCHITECTURE.md's steps is found by the CLI and
the app."""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from labs import all_labs

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 600


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict:
    """{dotted name: path} of every module under labs/."""
    return {module_name(p): p for p in sorted((ROOT / "labs").rglob("*.py"))}


def imports_of(path: Path, name: str, known: dict) -> set:
    """The labs modules a file imports, at any depth of the file (an import inside a function is an arrow too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            # `from labs.x import y` names the submodule labs.x.y when there is one, else the module labs.x
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import labs.engine.gpu.x` -> the module that exists
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict:
    known = modules()
    return {name: imports_of(path, name, known) for name, path in known.items()}


def cycles(graph: dict) -> list:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_circles_anywhere_in_labs():
    # `labs` finds the lab packages by name at run time (labs/__init__.py), not by import statements, so the
    # package above every lab is not an arrow into them; inside a lab, modules import their siblings, never
    # the package's __init__ (which imports them)
    assert cycles(import_graph()) == []


def test_the_engine_imports_no_lab():
    graph = import_graph()
    leaks = {m: sorted(t for t in targets if t == "labs" or (t.startswith("labs.") and not t.startswith("labs.engine")))
             for m, targets in graph.items() if m.startswith("labs.engine")}
    assert {m: t for m, t in leaks.items() if t} == {}


def test_no_module_over_600_lines():
    too_long = {str(p.relative_to(ROOT)): n for folder in ("labs", "ui", "pages")
                for p in (ROOT / folder).rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert too_long == {}


def test_every_lab_is_a_package_with_kernels_and_a_pure_model():
    for lab in all_labs():
        folder = ROOT / "labs" / lab.name
        assert (folder / "__init__.py").exists() and (folder / "model.py").exists(), lab.name
        source = (folder / "model.py").read_text()
        assert "torch.cuda" not in source, f"{lab.name}/model.py touches torch.cuda"
        imported = imports_of(folder / "model.py", f"labs.{lab.name}.model", modules())
        assert not [m for m in imported if m.endswith((".kernels", ".measure"))], (lab.name, imported)
        assert lab.predict.__module__.startswith(f"labs.{lab.name}.model") or \
            lab.predict.__module__.startswith("labs."), lab.name


MODEL_CHECK = """
import json, os, sys
os.environ["CUDA_VISIBLE_DEVICES"] = ""
import importlib, torch
from labs.engine import gpu
target = gpu.datasheet_target(gpu.datasheet_by_name("H100 SXM"))
out = {}
for name in sys.argv[1:]:
    model = importlib.import_module(f"labs.{name}.model")
    lab = importlib.import_module(f"labs.{name}").LAB
    rows = model.predict(lab.Params(), target) if hasattr(model, "predict") else lab.predict(lab.Params(), target)
    out[name] = len(rows)
out["cuda_initialized"] = torch.cuda.is_initialized()
print(json.dumps(out))
"""


def test_every_model_imports_and_predicts_without_cuda():
    names = [lab.name for lab in all_labs()]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", MODEL_CHECK, *names], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts.pop("cuda_initialized") is False
    assert {n: c for n, c in counts.items() if not c} == {}, "a model predicted no rows"


# ---------------------------------------------------------------------------------------------------------
# "Add a lab in an afternoon", followed literally
# ---------------------------------------------------------------------------------------------------------
FENCE = re.compile(r"^```\w+ file=(\S+)\n(.*?)^```", re.M | re.S)


def howto_files() -> dict:
    return {path: body for path, body in FENCE.findall((ROOT / "docs" / "ARCHITECTURE.md").read_text())}


def test_the_howto_names_every_file_of_a_lab():
    files = howto_files()
    for part in ("__init__.py", "kernels.py", "model.py", "measure.py"):
        assert f"labs/scale/{part}" in files
    assert "pages/scale.py" in files and "content/labs/scale.md" in files


PAGE_CHECK = """
import sys
from streamlit.testing.v1 import AppTest
at = AppTest.from_file("app.py", default_timeout=120)
at.run()
at.switch_page("pages/scale.py")
at.run()
assert not at.exception, [e.value for e in at.exception]
print("TITLE", at.title[0].value if at.title else "")
print("CHARTS", len(at.get("plotly_chart")))
"""


def test_a_lab_built_by_the_howto_is_listed_and_has_a_page(tmp_path):
    house = tmp_path / "house"
    house.mkdir()
    for part in ("app.py", "labs", "pages", "ui", "content", ".streamlit"):
        source = ROOT / part
        if source.is_dir():
            shutil.copytree(source, house / part, ignore=shutil.ignore_patterns("__pycache__", "recorded"))
        elif source.exists():
            shutil.copy(source, house / part)
    for path, body in howto_files().items():
        (house / path).parent.mkdir(parents=True, exist_ok=True)
        (house / path).write_text(body)
    env = {**os.environ, "PYTHONPATH": str(house), "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    listed = subprocess.run([sys.executable, "-m", "labs", "list"], cwd=house, env=env, capture_output=True,
                            text=True, timeout=300)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert re.search(r"^scale\s+Scale", listed.stdout, re.M), listed.stdout[-1500:]
    predicted = subprocess.run([sys.executable, "-m", "labs", "run", "scale", "sizes_mib=64"], cwd=house, env=env,
                               capture_output=True, text=True, timeout=300)
    assert predicted.returncode == 0, predicted.stderr[-2000:]
    assert "predicted_tbps" in predicted.stdout
    shown = subprocess.run([sys.executable, "-c", PAGE_CHECK], cwd=house, env=env, capture_output=True, text=True,
                           timeout=300)
    assert shown.returncode == 0, (shown.stdout + shown.stderr)[-3000:]
    charts = re.search(r"^CHARTS (\d+)", shown.stdout, re.M)
    assert "TITLE Scale" in shown.stdout and charts and int(charts.group(1)) >= 1, shown.stdout


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "scripts").iterdir()))
def test_scripts_stay_few_and_short(script):
    total = sum(len(p.read_text().splitlines()) for p in (ROOT / "scripts").iterdir() if p.is_file())
    assert total <= 1500
    assert script in (ROOT / "README.md").read_text() or script in (ROOT / "docs" / "ARCHITECTURE.md").read_text(), \
        f"scripts/{script} is not documented"
