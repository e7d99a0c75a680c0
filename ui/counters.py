"""The "Count it" panel: the GPU's hardware counters (Nsight Compute) beside the lab's model.

Shown on every lab page whose lab has a counter spec (LAB.counters). With a GPU and ncu a
learner counts the lab's points (through the runner's GPU lock); without them the committed counter
recordings of real GPUs are shown. Words: content/counters.md.
"""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from labs.engine import counters
from labs.engine import params as params_mod
from labs.engine.lab import Lab
from ui import charts, tables, text


def comparison_figure(rows: list, quantity: str, title: str) -> go.Figure:
    """Bars of the model and the counters for one quantity, one pair per point, the ratio written on top."""
    chosen = [r for r in rows if r["quantity"] == quantity]
    # one line per parameter, and only those the point has: long one-line names ("... ops=None n_cols=None") were
    # turned on their side and squeezed the bars into a corner
    labels = ["<br>".join(f"{k}={v}" for k, v in r.items() if k not in counters.COMPARISON_COLUMNS and v is not None)
              for r in chosen]
    fig = go.Figure()
    fig.add_bar(x=labels, y=[r["modelled"] for r in chosen], name="model", marker_color="lightgray")
    fig.add_bar(x=labels, y=[r["counted"] for r in chosen], name="counted by the GPU", marker_color="#1f77b4",
                text=[f"x{r['ratio']:.2f}" if r["ratio"] is not None else "" for r in chosen], textposition="outside")
    unit = chosen[0]["unit"] if chosen else ""
    fig.update_layout(barmode="group", title=title, yaxis_title=unit, height=420, margin=dict(t=60, b=10),
                      legend=charts.LEGEND_BELOW, yaxis_exponentformat="SI")  # 2G bytes, not 2B
    return fig


def explanation(lab_name: str) -> str:
    """content/counters.md: its opening, then the section on this lab (why model and counters differ)."""
    sections = text.split_sections(text.read("counters.md"))
    return text.link_terms("\n\n".join(p for p in (sections.get(""), sections.get(lab_name)) if p))


def _params_from(lab: Lab, params_dict: dict):
    try:
        return params_mod.from_dict(lab.Params, params_dict)
    except params_mod.ParamError:
        return None


def _count_action(lab: Lab, params) -> None:
    """Points to count, the button, and the count itself (kept in the session)."""
    adapter = counters.adapter_for(lab.name)
    points = adapter.points(params)
    if not points:
        st.caption("None of the counted experiments is selected in the parameters above.")
        return
    labels = [counters.point_label(p) for p in points]
    chosen = st.multiselect("Points to count", labels, default=labels, key=f"count-points:{lab.name}")
    if st.button("Count it", key=f"count:{lab.name}", disabled=not chosen):
        waiting = st.empty()
        with st.spinner("Counting under Nsight Compute (each kernel is replayed a few times: seconds)"):
            try:
                st.session_state[f"counted:{lab.name}"] = counters.count(
                    lab.name, params, [p for p, label in zip(points, labels) if label in chosen],
                    on_wait=lambda pos: waiting.info(f"Waiting for the GPU: {pos} run(s) ahead of yours."))
            except (counters.CountersUnavailable, params_mod.ParamError) as exc:
                st.warning(str(exc))
            except Exception as exc:  # a failed count must not take the page down
                st.error(f"The count failed: {type(exc).__name__}: {exc}")
            finally:
                waiting.empty()


def _show(result, key: str) -> None:
    for message in result.messages:
        st.caption(message)
    quantities = list(dict.fromkeys(r["quantity"] for r in result.rows if r.get("counted") is not None))
    if quantities:
        names = {q: counters.QUANTITIES[q][0] for q in quantities}
        q = st.selectbox("Quantity", quantities, format_func=names.get, key=f"quantity:{key}")
        charts.show(comparison_figure(result.rows, q, f"{names[q]}: model vs counted, {result.label}"),
                        width="stretch", key=f"chart:{key}")
    tables.show(result.rows, width="stretch", key=f"table:{key}")


def _value(v) -> str:
    """A parameter as the form above writes it: 1,2,4 rather than Python's [1, 2, 4] or ['fp32', 'bf16']."""
    return ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)


def counters_panel(lab: Lab, params_dict: dict) -> None:
    """The panel for one lab page (nothing if the lab has no counter spec)."""
    if not counters.has_counters(lab.name):
        return
    st.subheader("Count it: what the GPU says it moved")
    st.markdown(explanation(lab.name))
    reason = counters.why_unavailable()
    params = _params_from(lab, params_dict)
    if reason:
        from labs.engine import gpu as gpu_mod  # without a GPU the page has said so once already (the run panel)

        st.info("Live counting needs a GPU too; the recorded counts below still show." if not
                gpu_mod.detect().available else f"Live counting is off: {reason.removeprefix('Counting needs a GPU: ')}")
    elif params is not None:
        _count_action(lab, params)
    live = st.session_state.get(f"counted:{lab.name}")
    if live is not None and live.params == params_dict:
        _show(live, f"{lab.name}:live")
    recorded = counters.list_recordings(lab.name)
    if recorded:
        labels = [r.label for r in recorded]
        choice = st.selectbox("Recorded counter runs of real GPUs", labels, key=f"count-recorded:{lab.name}")
        shown = recorded[labels.index(choice)]
        st.caption(f"Counted with `python -m labs count {lab.name}` on {shown.label} (parameters: "
                   f"{'; '.join(f'{k} = {_value(v)}' for k, v in shown.params.items())}).")
        _show(shown, f"{lab.name}:recorded")
    elif not live:
        st.caption("No recorded counter runs of this lab yet.")
