"""Model scorecard: how well each lab's model holds on the recorded runs of real GPUs (labs/repredict.py)."""

import plotly.graph_objects as go
import streamlit as st

from labs import all_labs, get_lab
from labs.engine.repredict import WITHIN_PCT, kernels_against_libraries, library_summary, misses, scorecard
from ui import charts, classroom, text


@st.cache_data(show_spinner="Re-predicting the recorded runs with this version's models")
def cached_scorecard() -> list:
    return scorecard(all_labs())


@st.cache_data(show_spinner=False)
def cached_library_cases() -> list:
    return kernels_against_libraries(all_labs())


def ratio_chart(cases: list, library: str) -> go.Figure:
    """Our speed over the library's per case, one bar series per recorded GPU, the target as a line."""
    fig = go.Figure()
    for gpu_name in sorted({c["gpu"] for c in cases}):
        mine = [c for c in cases if c["gpu"] == gpu_name]
        fig.add_bar(x=[c["case"] for c in mine], y=[c["speed_ratio"] for c in mine], name=gpu_name,
                    hovertemplate="%{x}: %{y:.2f}x<extra>" + gpu_name + "</extra>")
    for target in sorted({c["target"] for c in cases if c["target"] is not None}):
        charts.reference_line(fig, target, f"target {target:.2f}x (where set)", "y", line_dash="dash")
    fig.add_hline(y=1.0, line_color="grey", line_width=1)
    fig.update_layout(title=f"Speed against {library} (1.0 = as fast; above = faster)", barmode="group",
                      yaxis_title="library time / our time", height=420, xaxis_tickangle=-45)
    return fig


def share_heatmap(rows: list) -> go.Figure:
    """Labs down, GPUs across, each cell the share of points within 15 %."""
    labs = list(dict.fromkeys(r["title"] for r in rows))
    gpus = sorted({r["gpu"] for r in rows})
    cell = {(r["title"], r["gpu"]): r["within_15_pct"] for r in rows}
    z = [[cell.get((lab, g)) for g in gpus] for lab in labs]
    fig = go.Figure(go.Heatmap(z=z, x=gpus, y=labs, zmin=50, zmax=100, colorscale="RdYlGn",
                               text=[[f"{v:.0f} %" if v is not None else "no run" for v in row] for row in z],
                               texttemplate="%{text}", colorbar=dict(title="within 15 %")))
    fig.update_layout(title="Share of recorded points within 15 % of the model", height=60 + 32 * len(labs),
                      yaxis=dict(autorange="reversed"))
    return fig


st.title("Model scorecard")
classroom.instructor_mode()
sections = text.split_sections(text.link_terms(text.read("scorecard.md")))
st.markdown(sections[""])

rows = cached_scorecard()
if not rows:
    st.info("No recorded runs yet: record a lab on a GPU with `python -m labs run LAB --record`.")
    st.stop()
short = [r for r in rows if r["within_15_pct"] is not None and r["within_15_pct"] < 85]
far = sum(r["over_50_pct"] for r in rows)
st.caption(f"{len(rows)} recordings of {len({r['lab'] for r in rows})} labs on {len({r['gpu'] for r in rows})} GPUs; "
           f"{len(rows) - len(short)} reach 85 % of points within {WITHIN_PCT:.0f} %; {far} points off by more "
           "than 50 % in all.")
charts.show(share_heatmap(rows), width="stretch")
table = [{"lab": r["title"], "GPU": r["gpu"], "recorded": r["date"], "commit": r["commit"], "points": r["points"],
          "within 15 % (%)": r["within_15_pct"], "at recording (%)": r["recorded_within_15_pct"],
          "median |error| (%)": r["median_abs_error_pct"], "p90 |error| (%)": r["p90_abs_error_pct"],
          "worst (%)": r["worst_abs_error_pct"], "over 50 %": r["over_50_pct"],
          "re-predicted": "yes" if r["repredicted"] else "no (as recorded)"} for r in rows]
st.dataframe(table, hide_index=True, width="stretch",
             column_config={c: st.column_config.NumberColumn(format="%.1f") for c in
                            ("within 15 % (%)", "at recording (%)", "median |error| (%)", "p90 |error| (%)",
                             "worst (%)")})
st.markdown(sections.get("How to read it", ""))

st.header("Where a model misses")
st.markdown(sections.get("Where a model misses", ""))
titles = {r["title"]: r["lab"] for r in rows}
choice = st.selectbox("Lab", list(titles), key="scorecard:lab")
lab = get_lab(titles[choice])
missed = misses(lab)
if missed:
    st.dataframe(missed, hide_index=True, width="stretch")
else:
    st.success(f"Every recorded point of {choice} is within {WITHIN_PCT:.0f} % of the model.")
st.page_link(f"pages/{lab.page_name}.py", label=f"Open the {choice} lab and its lesson", icon=":material/science:")

st.header("Our kernels against the libraries")
st.markdown(sections.get("Our kernels against the libraries", ""))
cases = cached_library_cases()
if not cases:
    st.info("No recorded run times one of our kernels beside a library's yet.")
else:
    st.dataframe(library_summary(cases), hide_index=True, width="stretch",
                 column_config={c: st.column_config.NumberColumn(format="%.2f") for c in ("target (x)", "slowest (x)")})
    lab_title = st.selectbox("Lab", list(dict.fromkeys(c["title"] for c in cases)), key="scorecard:kernel-lab")
    in_lab = [c for c in cases if c["title"] == lab_title]
    library = st.selectbox("Against", list(dict.fromkeys(c["library"] for c in in_lab)), key="scorecard:library")
    chosen = [c for c in in_lab if c["library"] == library]
    charts.show(ratio_chart(chosen, library), width="stretch")
    missed = sorted((c for c in chosen if c["meets"] is False), key=lambda c: c["speed_ratio"])
    st.caption(f"{sum(c['meets'] is True for c in chosen)} of {sum(c['meets'] is not None for c in chosen)} cases with "
               f"a target meet it; the {len(missed)} below it, slowest first: "
               + (", ".join(f"{c['case']} on the {c['gpu']} ({c['speed_ratio']:.3f}x)" for c in missed[:8])
                  + (" ..." if len(missed) > 8 else "") if missed else "none") + ".")
