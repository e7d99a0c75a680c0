"""The parts every lab page shares: header, GPU choice, lesson, parameter widgets, run, results.

A lab page is then a short script:

    page = LabPage(LAB)                  # title, GPU status, which GPU the model describes
    page.lesson()                        # content/labs/<lab>.md with this GPU's numbers
    params = page.params_form()          # widgets built from LAB.Params metadata (None if invalid)
    live, model, recorded = page.results(params)   # run button, the model, committed recordings
    ... plotly chart of model + live + recorded ...
    page.table_and_downloads(live or model)
"""

from __future__ import annotations

import dataclasses

import streamlit as st

from labs.engine import gpu as gpu_mod
from labs.engine import params as params_mod
from labs.engine import runner
from labs.engine.lab import Lab
from labs.engine.repredict import score, with_current_model_or_recorded
from labs.engine.results import Result, list_recorded, normalised
from ui import classroom, tables, text
from ui.counters import counters_panel


def gpu_status_line() -> str:
    info = gpu_mod.detect()
    if info.available:
        return f"GPU: **{info.name}** (compute capability {info.compute_capability}, {info.sm_count} SMs)"
    return f"No GPU: {info.reason}"


@st.cache_data(show_spinner=False)
def _target_names() -> list[str]:
    live = gpu_mod.live_target()
    names = [f"This GPU: {live.name}"] if live else []
    recorded = {gpu_mod.datasheet_for(k.replace("-", " ")) for k in gpu_mod.recorded_gpu_keys()}
    # datasheet GPUs with committed measurements first: their ceilings are real
    rows = sorted(gpu_mod.DATASHEET, key=lambda r: r not in recorded)
    return names + [r.name for r in rows if not (live and live.datasheet is r)]


def choose_target(key: str = "target") -> gpu_mod.Target:
    """The GPU the model describes: the attached one by default, or any datasheet GPU."""
    names = _target_names()
    choice = st.sidebar.selectbox("Model the GPU", names, key=key,
                                  help="The model uses this GPU's ceilings: measured if it was calibrated "
                                       "(here or in a committed recording), else its datasheet.")
    if choice.startswith("This GPU"):
        return gpu_mod.live_target()
    return gpu_mod.datasheet_target(gpu_mod.datasheet_by_name(choice))


def _widget(field: dataclasses.Field, key: str, initial):
    m, label = field.metadata, field.name.replace("_", " ") + (f" ({field.metadata['unit']})" if field.metadata.get("unit") else "")
    helptext = m.get("help")
    default = field.default
    if isinstance(default, tuple):
        if m.get("choices") and not isinstance(default[0], (int, float)):
            chosen = st.multiselect(label, list(m["choices"]), default=list(initial), key=key, help=helptext)
            return ",".join(map(str, chosen))
        return st.text_input(label, ",".join(map(str, initial)), key=key, help=f"{helptext} (comma-separated)")
    if isinstance(default, bool):
        return str(st.checkbox(label, value=bool(initial), key=key, help=helptext))
    if m.get("choices"):
        options = list(m["choices"])
        return str(st.selectbox(label, options, index=options.index(initial) if initial in options else 0, key=key,
                                help=helptext))
    if isinstance(default, (int, float)):
        # bounds are checked by validation (with a message), not clamped silently by the widget
        step = m.get("step") or (1 if isinstance(default, int) else None)
        value = st.number_input(label, value=initial, step=step, key=key, help=helptext)
        return str(value)
    return st.text_input(label, str(initial), key=key, help=helptext)


def _initial_values(lab: Lab) -> dict:
    """Defaults, overridden by valid ?key=value query parameters (a shared link presets a run)."""
    values = {f.name: f.default for f in dataclasses.fields(lab.Params)}
    from_url = {k: v for k, v in st.query_params.items() if k in values}
    if from_url:
        try:
            values.update(dataclasses.asdict(params_mod.from_strings(lab.Params, from_url)))
        except (params_mod.ParamError, ArithmeticError, ValueError, TypeError) as exc:  # no link takes the page down
            st.warning(f"Ignoring the link's parameters: {text.plain(exc, 300)}")
    return values


class LabPage:
    def __init__(self, lab: Lab):
        self.lab = lab
        self.waiting_for_prediction = False
        self.refusal = ""  # why this GPU cannot run the chosen parameters ('' when it can)
        self.host, self.normalise = None, False  # host: the page's first lab when this one is shown below it
        st.title(lab.title)
        st.caption(lab.summary)
        if gpu_mod.detect().available:  # without one, the run panel says so once, where the Run button would be
            st.markdown(gpu_status_line())
        self.target = choose_target()
        st.sidebar.caption(f"Ceilings used by the model: {self.target.describe_ceilings()}")
        self.instructor = classroom.instructor_mode()
        classroom.predict_first()
        classroom.visit(lab.name)
        classroom.progress_download()

    @classmethod
    def second_lab(cls, lab: Lab, host: "LabPage") -> "LabPage":
        """A lab shown further down another lab's page: same GPU choice, its own parameters, runs and recordings."""
        page = cls.__new__(cls)
        page.lab, page.target, page.instructor, page.waiting_for_prediction = lab, host.target, host.instructor, False
        page.refusal, page.host, page.normalise = "", host, False
        classroom.visit(lab.name)
        return page

    # --- words -----------------------------------------------------------------------------
    def numbers(self) -> dict:
        """The lesson's numbers for the chosen GPU; none (the placeholders stay visible) where the lab cannot
        model that GPU, so that the page still serves the rest."""
        try:
            numbers = self.lab.lesson_numbers(self.target) if self.lab.lesson_numbers else {}
        except params_mod.ParamError:
            return {}
        # a figure the GPU's datasheet lacks (a T4 has no bf16 rate) comes out NaN: write it as '?', not 'nan'
        return {k: "?" if str(v).lower() == "nan" else v for k, v in numbers.items()}

    def lesson(self, expanded: bool = False) -> None:
        """'What you will learn' in full, the rest of the lesson in an expander. Sections whose heading
        starts with 'Near' or 'Why' are left for the page to show beside its charts (`section`); 'Behind the
        model' (why the model misses, and what else was measured) follows in an expander of its own, collapsed."""
        sections = text.split_sections(text.lesson(self.lab.name, self.numbers()))
        learn = sections.pop("What you will learn", "")
        behind = sections.pop("Behind the model", "")
        if learn:
            st.markdown("**What you will learn**\n\n" + learn)
        body = "\n\n".join((f"### {title}\n{content}" if title else content) for title, content in sections.items()
                           if content and not title.startswith(("Near", "Why")))
        with st.expander("Lesson: the idea, the experiment, what to try, questions", expanded=expanded):
            st.markdown(body)
        if behind:
            with st.expander("Behind the model", expanded=False):
                st.markdown(behind)
        self.term_links()

    def section(self, title: str) -> str:
        """One '## title' section of the lesson, numbers filled in ('' if the lesson has none)."""
        return text.split_sections(text.lesson(self.lab.name, self.numbers())).get(title, "")

    def term_links(self) -> None:
        if self.lab.terms:
            links = " · ".join(f"[{t.replace('-', ' ')}](glossary?term={t})" for t in self.lab.terms)
            st.markdown(f"**Terms in this lab:** {links}")

    # --- input -----------------------------------------------------------------------------
    def params_form(self, columns: int = 3):
        st.subheader("Parameters")
        initial = _initial_values(self.lab)
        fields = dataclasses.fields(self.lab.Params)
        cols = st.columns(columns)
        values = {}
        for i, f in enumerate(fields):
            with cols[i % columns]:
                values[f.name] = _widget(f, f"{self.lab.name}.{f.name}", initial[f.name])
        self.refusal = ""
        try:
            params = params_mod.from_strings(self.lab.Params, values)
        except (params_mod.ParamError, ArithmeticError, ValueError, TypeError) as exc:
            st.error(text.plain(exc, 300))
            return None
        if self.lab.check and self.target.live:
            try:
                self.lab.check(params, self.target)
            except params_mod.ParamError as exc:
                # this GPU cannot run these parameters, but the model and the recorded runs still can be shown
                self.refusal = str(exc)
                st.error(self.refusal)
        return params

    # --- results ---------------------------------------------------------------------------
    def results(self, params, stop: bool = True):
        """(live result or None, model result, recorded and uploaded results to overlay).

        With predict-first on, the page stops here until the learner has answered the lab's question
        (with stop=False it returns (None, model, []) and sets `waiting_for_prediction` instead).
        """
        params_dict = params_mod.to_dict(params)
        try:
            model = runner.model(self.lab, params, self.target)
        except (params_mod.ParamError, ArithmeticError) as exc:  # e.g. a dtype the chosen GPU has no rate for
            st.error(f"The model cannot describe these parameters on the {self.target.name}: {text.plain(exc, 300)}")
            model = Result(self.lab.name, params_dict, [], runner.run_metadata("model", None, self.target))
        panel = st.container()
        self.waiting_for_prediction = classroom.must_predict_first(self.lab, params_dict)
        if self.waiting_for_prediction:
            with panel:
                classroom.prediction_panel(self.lab, params_dict, model.rows, [], "")
            st.info("Write down your prediction (or skip) to see the model, the runs and the charts.")
            if stop:
                st.stop()
            return None, model, []
        live = self._live_panel(params)
        recorded = self._recorded_panel()
        with st.expander("Compare with your own result files"):
            recorded += classroom.uploads(self.lab.name)
        shown = live or (recorded[0] if recorded else None)
        with panel:
            classroom.prediction_panel(self.lab, params_dict, model.rows, shown.rows if shown else [],
                                       shown.label if shown else "")
        self.absolute = live or model  # the table and downloads always hold absolute numbers
        if self.host is not None:  # a second lab on the page follows the page's one scale switch
            self.normalise = self.host.normalise
        elif recorded:
            self.normalise = st.sidebar.radio("Overlay scale", ["absolute", "normalised"], key="scale",
                                              horizontal=True) == "normalised"
        if recorded and self.normalise:
            # normalised() divides by the largest value: the best of a rate, the slowest of a time
            st.caption(f"Normalised: every run's `{self.lab.metric}` is divided by that run's own largest value "
                       "(the model's by its own), so GPUs of different speeds compare by shape: on charts of "
                       f"`{self.lab.metric}`, read the axis as a fraction of that value, whatever unit it names. "
                       "The table below stays absolute.")
            live, model = (normalised(r, self.lab.metric) if r else None for r in (live, model))
            recorded = [normalised(r, self.lab.metric) for r in recorded]
        return live, model, recorded

    def axis(self, title: str) -> str:
        """A chart's title for an axis of the lab's metric: 'time (ms)' becomes 'time (normalised)' while the overlay
        scale is normalised (the values are then fractions of each run's largest, not ms)."""
        if not self.normalise:
            return title
        return (title[:title.rindex("(")].rstrip() if title.endswith(")") and "(" in title else title) + " (normalised)"

    def _live_panel(self, params):
        key = f"live:{self.lab.name}"
        info = runner.live_gpu()  # this machine's GPU, or the GPU pool's (ROOFLINE_CLUSTER)
        if not info.available:
            if self.host is None:  # once per page: a second lab below the first says nothing more
                # the reason may already say so ("No CUDA GPU found (...). Live runs are off; ...")
                st.info(info.reason if "Live runs are off" in info.reason else f"Live runs are off: {info.reason}")
            return None
        if params is None:
            return None
        if self.refusal:
            st.info("Live run disabled for these parameters (see above); the model and the recorded runs are shown.")
        elif st.button(f"Run on {info.name}", type="primary", key=f"run:{self.lab.name}"):
            bar = st.progress(0.0, text="starting")
            waiting = st.empty()
            try:
                result = runner.run(
                    self.lab, params,
                    progress=lambda f, m: bar.progress(min(max(f, 0.0), 1.0), text=m),
                    on_wait=lambda pos: waiting.info(runner.waiting_message(pos)))
                st.session_state[key] = result
            except params_mod.ParamError as exc:
                st.error(str(exc))
            except Exception as exc:  # a failed kernel must not take the page down
                st.error(f"The run failed: {type(exc).__name__}: {exc}")
            finally:
                waiting.empty()
                bar.empty()
        result = st.session_state.get(key)
        if result is not None and result.params != params_mod.to_dict(params):
            st.caption("The parameters changed since the last run: press Run to measure them.")
            return None
        if result is not None:
            for message in result.messages:
                st.warning(message)
            if runner.ran_on(result):
                st.caption(runner.ran_on(result))
        return result

    def _recorded_panel(self) -> list:
        # each recorded point against the model of this version (labs/repredict.py), not the one it was recorded with
        recorded = [with_current_model_or_recorded(self.lab, r) for r in list_recorded(self.lab.name)]
        if not recorded:
            st.caption("No recorded runs of this lab yet.")
            return []
        labels = [r.label for r in recorded]
        chosen = st.multiselect("Recorded runs of real GPUs to show", labels, default=labels,
                                key=f"recorded:{self.lab.name}")
        if any(r.meta.get("repredicted") for r in recorded):
            st.caption("Recorded runs are compared with this version's model, re-predicted from each run's own GPU, "
                       "ceilings and in-run probes; `recorded_error_pct` is the error the run showed when it was "
                       "recorded. " + model_scores(recorded))
        return [r for r in recorded if r.label in chosen]

    def table_and_downloads(self, result: Result, title: str = "Numbers") -> None:
        if result is not None and "normalised_by" in result.meta:
            result = self.absolute
        if result is None or not result.rows:
            return
        st.subheader(title)
        st.caption(f"{result.label}. error_pct = 100 x (measured - predicted) / predicted.")
        steadiness = result.steadiness()  # the timing rule's repeats and spread (labs/engine/timing.py)
        if steadiness:
            (st.warning if result.unsteady_rows() else st.caption)(steadiness)
        tables.show(result.rows, width="stretch")
        c1, c2 = st.columns(2)
        name = f"roofline-{self.lab.name}-{result.kind}"
        c1.download_button("Download CSV", result.to_csv(), f"{name}.csv", "text/csv", key=f"csv:{name}")
        c2.download_button("Download JSON", result.to_json(), f"{name}.json", "application/json", key=f"json:{name}")
        counters_panel(self.lab, result.params)  # "Count it": hardware counters beside the model (ui/counters.py)


def absolute(result: Result | None, metric: str) -> Result | None:
    """The run's own numbers again where the overlay scale is normalised (labs.engine.results.normalised divided
    measured_<metric> and predicted_<metric> by `normalised_by`): for sentences, diagrams and tables that carry
    units, which would otherwise print the normalised 1.00 as 1.00 TB/s."""
    best = result.meta.get("normalised_by") if result is not None else None
    if not best:
        return result
    columns = (f"measured_{metric}", f"predicted_{metric}")
    rows = [{**r, **{c: r[c] * best for c in columns if isinstance(r.get(c), (int, float))}} for r in result.rows]
    return dataclasses.replace(result, rows=rows, meta={k: v for k, v in result.meta.items() if k != "normalised_by"})


def model_scores(recorded: list) -> str:
    """One sentence: how this model holds on each recorded run (share of points within 15 %), with a link."""
    parts = []
    for r in recorded:
        s = score([row.get("error_pct") for row in r.rows])
        if s["points"]:
            parts.append(f"{text.plain(r.meta.get('gpu', {}).get('name', '?'), 80)} {s['within_15_pct']:.0f} % of "
                         f"{s['points']} points")
    return f"Within 15 % of the model: {'; '.join(parts)}. See the [model scorecard](scorecard)." if parts else ""


def recorded_caption(results: list) -> str:
    parts = []
    for r in results:
        v = r.meta.get("versions", {})
        parts.append(text.plain(f"{r.label} (torch {v.get('torch')}, triton {v.get('triton')}, commit "
                                f"{r.meta.get('git_commit') or 'not recorded'})", 300))
    return "Recorded: " + "; ".join(parts) if parts else ""

