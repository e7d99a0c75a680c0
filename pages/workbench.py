"""Kernel workbench: write a kernel in the browser, see it checked, timed and placed against the model.

The learner's code runs only in the sandboxed worker (labs.workbench); this page shows the editor and the
verdict. `?exercise=matmul` opens an exercise; `?s=...` names the browser session whose last submission
per exercise comes back after a reload.
"""

import json
import math

import plotly.graph_objects as go
import streamlit as st

from labs.engine import gpu as gpu_mod
from labs.engine import runner
from labs.engine.params import ParamError
from labs.engine.results import list_recorded
from labs.workbench import EXERCISES, get_exercise, sandbox, store
from labs.workbench import verdict as verdict_mod
from ui import charts, classroom, tables, text, visitor
from ui.lab_page import choose_target, gpu_status_line

try:  # a real code editor (Ace): Python highlighting, line numbers
    from code_editor import code_editor
except ImportError:  # the component is not installed: a plain text area keeps the page usable
    code_editor = None

st.title("Kernel workbench")
st.caption("Write the kernel yourself: it is checked against float64, timed on the GPU in a sandbox, and placed "
           "beside our kernel, the vendor library and the model.")
target = choose_target()  # the GPU the model describes: the same selector, and default, as the lab pages
if gpu_mod.detect().available:
    st.markdown(gpu_status_line())
else:  # the page's one no-GPU notice
    st.info(f"No GPU on this machine: your kernel is checked, and counted, in Triton's interpreter, and the model "
            f"predicts the time of your launch on the {target.name} (change it in the sidebar).")

# --- which exercise, which browser session ------------------------------------------------------
names = [ex.name for ex in EXERCISES]
asked = st.query_params.get("exercise", names[0])
if asked not in names:
    st.warning(f"There is no exercise '{text.plain(asked, 80)}'; the exercises are: {', '.join(names)}.")
    asked = names[0]
chosen = st.selectbox("Exercise", names, index=names.index(asked), format_func=lambda n: get_exercise(n).title)
ex = get_exercise(chosen)
st.query_params["exercise"] = ex.name
# a learner's class key (pages/class.py) names the learner; otherwise the session's token is issued here, never
# taken from a link: a `?s=` this server did not issue to this browser (someone else's, or a made-up one) would
# let the link's sender read what this visitor writes
if "workbench.token" not in st.session_state:
    linked, browser = st.query_params.get("s"), visitor.browser_id()
    key = classroom.class_key()
    st.session_state["workbench.token"] = key or (linked if store.owns(linked, browser) else store.issue(browser))
    if linked and st.session_state["workbench.token"] != linked:
        st.caption("This link's session was not started in this browser: your work is kept under a new one.")
token = st.session_state["workbench.token"]
st.query_params["s"] = token
saved = store.load(token, ex.name)
st.caption(f"Share this exercise: `?exercise={ex.name}`. Your code and last verdict stay with this page's "
           "address (reload it and they come back).")

# --- the lesson -----------------------------------------------------------------------------------
sections = text.split_sections(text.link_terms(ex.lesson()))
st.markdown(sections.get("The exercise", ""))
st.markdown(f"**Write:** `{ex.signature}` (tolerance against float64: {ex.dtype}). "
            f"**Lab:** [{ex.lab}]({ex.lab}) · **Terms:** " +
            " · ".join(f"[{t.replace('-', ' ')}](glossary?term={t})" for t in ex.terms))
with st.expander("What to try"):
    st.markdown(sections.get("What to try", ""))

# --- the editor -------------------------------------------------------------------------------------
version_key = f"workbench.version.{ex.name}"
st.session_state.setdefault(version_key, 0)
code_key = f"workbench.code.{ex.name}"
if code_key not in st.session_state:
    st.session_state[code_key] = saved.get("code") or ex.starter()

c1, c2, _ = st.columns([2, 2, 3])
if c1.button("Reset to the starter", key="reset"):
    st.session_state[code_key] = ex.starter()
    st.session_state[version_key] += 1
if c2.button("Load our solution", key="solution", help="Spoiler: our own solution to this exercise"):
    st.session_state[code_key] = ex.solution()
    st.session_state[version_key] += 1

submitted = False
if code_editor is not None:
    run_button = {"name": "Run", "feather": "Play", "primary": True, "hasText": True, "showWithIcon": True,
                  "alwaysOn": True, "commands": ["submit"], "style": {"bottom": "0.4rem", "right": "0.4rem"}}
    response = code_editor(st.session_state[code_key], lang="python", height=[20, 36], buttons=[run_button],
                           response_mode="blur", options={"showLineNumbers": True, "tabSize": 4, "wrap": True},
                           key=f"workbench.editor.{ex.name}.{st.session_state[version_key]}")
    if response.get("text"):
        st.session_state[code_key] = response["text"]
    last_event = f"workbench.event.{ex.name}"
    if response.get("type") == "submit" and response.get("id") != st.session_state.get(last_event):
        st.session_state[last_event] = response.get("id")
        submitted = True
    st.caption("Run with the button in the editor, or with **Run** below.")
else:
    st.warning("The code editor component (streamlit-code-editor) is not installed: a plain text box stands in.")
    st.session_state[code_key] = st.text_area("Your code", st.session_state[code_key], height=420)
code = st.session_state[code_key]
store.save(token, ex.name, code)

jail_status = sandbox.jail.status()
on_pool = bool(runner.cluster_address())  # submissions are judged in the jail of the pool's GPU workers
can_run = jail_status.ok or on_pool
if not jail_status.ok:  # no jail here: learner code is refused (unless the pool judges it), and the page says so
    (st.info if on_pool else st.error)(("Submissions go to the GPU pool and run in its workers' jail. If the pool "
                                        "cannot take one, this machine refuses it: " if on_pool else "")
                                       + jail_status.reason)
lines = sandbox.protection_lines()
with st.expander("The jail your code runs in" + ("" if all(a for _, a, _ in lines) else
                                                  " (some protections are off on this machine)")):
    for name, active, meaning in lines:
        # Streamlit's own icons: an emoji needs a font the learner's machine may not have (it drew empty boxes)
        st.markdown(f"{':green[:material/check_circle:]' if active else ':red[:material/cancel:]'} **{name}**: {meaning}")
    if jail_status.ok and not jail_status.jailed:
        st.warning(f"Submissions run without a jail on this machine ({sandbox.jail.UNJAILED_ENV}=1): fine for a "
                   "single-user laptop, never for a class. See the README's 'Threat model: the workbench'.")

if st.button("Run", type="primary", key="run", disabled=not can_run) or (submitted and can_run):
    bar = st.progress(0.0, "starting")
    queue = st.empty()
    try:  # judged and kept in the class store (labs/classroom); refused past the size or per-minute limit
        store.submit(token, ex, code, progress=lambda f, m: bar.progress(min(1.0, f), m),
                     on_wait=queue.info, model_gpu=None if target.live else target.name)
    except ParamError as exc:
        st.error(str(exc))
    bar.empty()
    queue.empty()
    saved = store.load(token, ex.name)


# --- the verdict ------------------------------------------------------------------------------------
def fmt(x, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def performance_chart(v: dict, rows: list) -> go.Figure:
    """TB/s bars (memory-bound) or the roofline with the points (compute-bound)."""
    unit, metric = v["unit"], v["metric"]
    if metric == "tbps":
        fig = charts.figure("Achieved bandwidth", "", unit)
        for who, col in (("model (byte floor)", f"predicted_{metric}"), ("you", f"measured_{metric}"),
                         ("you, modelled from the interpreter's count", f"predicted_{metric}_yours"),
                         ("our kernel", f"ours_{metric}"), ("library", f"library_{metric}")):
            if any(r.get(col) is not None for r in rows):
                fig.add_trace(go.Bar(name=who, x=[r["point"] for r in rows], y=[r.get(col) for r in rows]))
        return fig
    target = verdict_mod.verdict_target(v)
    peak = target.ceilings.matmul_tflops.get("fp16") or target.ceilings.fma_tflops
    fig = charts.figure(f"Roofline of {target.name} (fp16 tensor cores)", "arithmetic intensity (FLOP/byte)",
                        "TFLOP/s", log_x=True, log_y=True)
    at = rows[0]["intensity_flop_per_byte"]
    xs = [at * 2 ** (k / 4) for k in range(-40, 21)]  # from 1/1024 to 32 times the exercise's intensity
    fig.add_trace(go.Scatter(x=xs, y=[min(peak, x * target.ceilings.copy_tbps) for x in xs], name="roof",
                             mode="lines", line=dict(color="black")))
    fig.update_yaxes(range=[math.log10(peak / 100), math.log10(peak * 2)])  # the points sit near the top
    for who, col, style in (("model", f"predicted_{metric}", charts.MODEL_STYLE),
                            ("you", f"measured_{metric}", charts.LIVE_STYLE),
                            ("you, modelled from the interpreter's count", f"predicted_{metric}_yours",
                             dict(charts.LIVE_STYLE, marker=dict(size=10, symbol="circle-open-dot"))),
                            ("our kernel", f"ours_{metric}", charts.RECORDED_STYLE),
                            ("library", f"library_{metric}", charts.RECORDED_STYLE)):
        charts.add_series(fig, rows, "intensity_flop_per_byte", col, who, dict(style, mode="markers"), ("point",))
    return fig


def show_verdict(v: dict) -> None:
    st.subheader("Verdict")
    status = v.get("status")
    # the message can carry what the learner's code printed: text, never Markdown; its extra lines as code
    first, _, rest = str(v.get("message", "")).partition("\n")
    if status == "not credible":
        st.warning("Not credible. " + text.plain(first, 500))
    else:
        (st.success if status == "correct" else st.error)(text.plain(first, 500))
    if rest.strip():
        st.code(rest, language=None)
    for note in v.get("notes", []):
        st.info(note)
    if v.get("checks"):
        tables.show([{"case": c.get("case"), "correct": c.get("passed"), "relative error": c.get("rel_error"),
                      "max abs error": c.get("max_abs_error"), "first wrong index": c.get("first_wrong_index"),
                      "got": c.get("got"), "expected": c.get("expected")} for c in v["checks"]])
    rows = v.get("points", [])
    for r in rows:
        if r.get("gap"):
            st.markdown(f"**{r['point']}:** {r['gap']}")
        if r.get("yours"):  # without a GPU: what the interpreter counted, and the model's time for that launch
            st.markdown(f"**{r['point']}, your launch:** {r['yours']}")
    if rows:
        unit, metric = v["unit"], v["metric"]
        tables.show([{"point": r["point"], f"you ({unit})": r.get(f"measured_{metric}"),
                       f"you, modelled ({unit})": r.get(f"predicted_{metric}_yours"),
                       "your bytes, interpreter": r.get("interpreter_bytes"),
                       "your programs": r.get("interpreter_programs"),
                       "you, modelled (ms)": r.get("predicted_ms_yours"),
                       f"model ({unit})": r.get(f"predicted_{metric}"), "error (%)": r.get("error_pct"),
                       f"our kernel ({unit})": r.get(f"ours_{metric}"), f"{r['library']} ({unit})": r.get(f"library_{metric}"),
                       "you (ms)": r.get("measured_ms"), "measured by": r.get("measured_by"),
                       "you, self-timed (ms)": r.get("self_ms"), "credible": r.get("credible"),
                       "model (ms)": r.get("predicted_ms"),
                       "DRAM bytes, model": r.get("bytes"), "DRAM bytes, measured": r.get("counted_dram_bytes"),
                       "measured / model bytes": r.get("dram_bytes_ratio"),
                       "our kernel from": r.get("ours_source"), "library from": r.get("library_source")}
                      for r in rows])
        charts.show(performance_chart(v, rows), width="stretch")
        st.caption(f"Model: {rows[0].get('model', '')}, on the {v.get('model_gpu')}'s ceilings.")
        if v.get("counters", {}).get("status") in ("measured", "partial"):
            st.caption(v["counters"]["message"])
    st.caption(f"Measured by: {v.get('measured_by', '?')}. Jail: {v.get('jail') or ', '.join(v.get('sandbox', []))}."
               + (f" Judged on: {text.plain(v['judged_on'], 200)}." if v.get("judged_on") else ""))
    d1, d2 = st.columns(2)
    d1.download_button("Download your code", code, f"{ex.name}.py", "text/x-python", key="dl-code")
    d2.download_button("Download the verdict (JSON)", json.dumps(v, indent=1, default=str), f"{ex.name}-verdict.json",
                       "application/json", key="dl-verdict")


if saved.get("verdict"):
    show_verdict(saved["verdict"])
else:
    st.info("Press **Run** to check your kernel" + (" and time it on the GPU." if gpu_mod.detect().available else
                                                    " and to see its launch modelled."))

recorded = list_recorded(f"workbench-{ex.name}")
if recorded:
    with st.expander("Our solution's verdict, recorded on a real GPU"):
        for rec in recorded:
            st.markdown(f"**{rec.label}**")
            for message in rec.messages:
                st.markdown(f"- {message}")
            tables.show(rec.rows)
