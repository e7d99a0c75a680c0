"""The class: learners join with a display name and the class code; the instructor (?key=... or the key typed in
the sidebar) sees every learner's best verdict ranked, the class's kernels on the roofline, the code and
history behind each, the prediction poll, a CSV export and a reset. Learners see the board without code.

Everything comes from the class store (labs/classroom); names are shown only as plain text.
"""

import datetime as dt

import streamlit as st

from labs import all_labs
from labs.classroom import board, get_store, is_instructor
from labs.engine.params import ParamError
from labs.workbench import EXERCISES, get_exercise
from labs.workbench import verdict as verdict_mod
from ui import classboard, classroom

st.title("Class")
store = get_store()

# --- who is this: the instructor (by key), a learner (by their key), or someone who may join -------------
asked_key = st.query_params.get("key")
if asked_key is not None:
    if is_instructor(asked_key, store):
        st.session_state["class.instructor"] = True
    del st.query_params["key"]  # a key in the address bar would be projected to the class
typed = st.sidebar.text_input("Instructor key", type="password", key="class.typed_key",
                              help="Printed in the app's log at start-up (or set by ROOFLINE_INSTRUCTOR_KEY).")
if typed:
    st.session_state["class.instructor"] = is_instructor(typed, store)
    if not st.session_state["class.instructor"]:
        st.sidebar.error("That is not the instructor key.")
instructor = st.session_state.get("class.instructor", False)
key = classroom.class_key()
me = store.learner(key) if key else None


def when(t) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%H:%M:%S") if t else ""


def board_section(code: str, show_names: bool, with_code: bool, me=None) -> None:
    """Per exercise: each learner's best verdict ranked, and the class's kernels on the roofline."""
    names = [ex.name for ex in EXERCISES]
    everyone = store.submissions(code)
    latest = everyone[-1]["exercise"] if everyone else names[0]  # first shown: the exercise worked on last
    exercise = st.selectbox("Exercise", names, index=names.index(latest) if latest in names else 0,
                            format_func=lambda n: get_exercise(n).title, key="class.exercise")
    subs = [s for s in everyone if s["exercise"] == exercise]
    rows = board.ranked(subs, hide_names=not show_names)
    if not rows:
        st.info(f"No answered submission of {exercise} in class {code} yet.")
        return
    st.dataframe([{"rank": r["rank"], "learner": r["learner"], "status": r["status"],
                   f"rate ({r['unit']})": float(f"{r['rate']:.4g}") if r["rate"] else None,
                   "of the model (%)": round(100 * r["share_of_model"], 1) if r["share_of_model"] else None,
                   "how measured": r["measured_by"],
                   "trusted": r["trusted"], "GPU": r["gpu"], "tries": r["attempts"], "last": when(r["last_at"])}
                  for r in rows], hide_index=True, key="class.board")
    mine = next((r for r in rows if me is not None and r["learner_id"] == me.id), None)
    if mine is not None:
        st.text(f"You: {'rank ' + str(mine['rank']) if mine['rank'] else 'not ranked yet'} of {len(rows)} on "
                f"{exercise} ({mine['status']}, {mine['attempts']} tries).")
    best = [store.submission(r["best_submission"]) for r in rows]
    label = {r["learner_id"]: r["learner"] for r in rows}
    ref = next((b["verdict"] for b in best if b and b.get("verdict") and b["verdict"].get("points")), None)
    if ref is not None:
        target = verdict_mod.verdict_target(ref)
        st.plotly_chart(classboard.class_chart(board.class_points(best, label), board.reference_points(ref),
                                               ref.get("metric"), target, exercise), width="stretch")
        if not any(r["rate"] for r in rows):
            st.caption("No submission was timed yet (timing needs a GPU): the chart holds the model, our kernel "
                       "and the library.")
    if not with_code:
        return
    st.download_button("Download the board (CSV)", board.to_csv(rows), f"class-{code}-{exercise}.csv", "text/csv",
                       key="class.csv")
    who = st.selectbox("Open a learner's code and history", [None] + [r["learner_id"] for r in rows],
                       format_func=lambda i: "(choose a learner)" if i is None else label[i], key="class.open")
    if who is not None:
        history = [s for s in subs if s["learner_id"] == who]
        chosen = store.submission(next(r["best_submission"] for r in rows if r["learner_id"] == who))
        st.text(f"Best submission #{chosen['id']} of {label[who]}, {chosen['status']}, at {when(chosen['created_at'])}")
        st.code(chosen["code"], language="python")
        if chosen["verdict"]:
            st.text(chosen["verdict"].get("message", ""))
        st.dataframe([{"#": s["id"], "at": when(s["created_at"]), "status": s["status"], "rate": s["rate"],
                       "how measured": s["measured_by"], "queued behind": s["queue_position"],
                       "seconds": s["seconds"]} for s in history], hide_index=True)
        pick = st.selectbox("Another try's code", [s["id"] for s in reversed(history)], key="class.try")
        if pick and pick != chosen["id"]:
            st.code(store.submission(pick)["code"], language="python")


def poll_section(code: str, show_names: bool) -> None:
    """The class's predict-then-run answers per lab, against the model's and the measured answer."""
    answers = store.poll(code)
    if not answers:
        st.info("No predictions yet: learners answer a lab's question ('Predict, then run') while in the class.")
        return
    titles = {lab.name: lab.title for lab in all_labs()}
    questions = board.poll_summary(answers)
    labs_asked = list(dict.fromkeys(q["lab"] for q in questions))
    lab = st.selectbox("Lab", labs_asked, format_func=lambda n: titles.get(n, n), key="class.poll_lab")
    for q in [q for q in questions if q["lab"] == lab]:
        st.plotly_chart(classboard.poll_chart(q), width="stretch")
        st.caption(f"{q['answers']} answer(s), median {classboard.fmt(q['median_guess'], 4)} {q['unit']}; model "
                   f"{classboard.fmt(q['model'], 4)}; measured {classboard.fmt(q['measured'], 4)}"
                   + (f" ({q['measured_on']})" if q["measured_on"] else "") + f". Parameters: {q['params']}")
        if show_names:
            st.dataframe([{"learner": n, f"answer ({q['unit']})": g} for n, g in zip(q["names"], q["guesses"])],
                         hide_index=True)


# --- the instructor's view ------------------------------------------------------------------------------
if instructor:
    st.caption("Instructor view: the class's work, ranked; code one click away; the prediction poll.")
    with st.sidebar.form("class.new"):
        title = st.text_input("New class (title)")
        if st.form_submit_button("Create a class"):
            st.session_state["class.code"] = st.session_state["class.pick"] = store.create_class(title)
    known = store.classes()
    if not known:
        st.info("No class yet: create one in the sidebar, then show its code to the class.")
        st.stop()
    codes = [c["code"] for c in known]
    current = st.session_state.get("class.code")
    code = st.selectbox("Class", codes, index=codes.index(current) if current in codes else 0, key="class.pick",
                        format_func=lambda c: f"{c} · {next(k['title'] for k in known if k['code'] == c)}")
    projector = st.toggle("Projector mode (hide names)", key="class.projector")
    st.header(f"Class code: {code}")
    st.caption(f"Learners open this page, type the code {code} and a display name. "
               f"{len(store.learners(code))} learner(s) joined.")
    live = st.toggle("Live: refresh the board and the poll every 10 s", value=True, key="class.live")
    tab_board, tab_poll, tab_admin = st.tabs(["Board", "Prediction poll", "Learners and reset"])
    with tab_board:
        st.fragment(board_section, run_every=10 if live else None)(code, show_names=not projector, with_code=True)
    with tab_poll:
        st.fragment(poll_section, run_every=10 if live else None)(code, show_names=not projector)
    with tab_admin:
        if not projector:
            st.dataframe([{"learner": r["name"], "joined": when(r["created_at"])} for r in store.learners(code)],
                         hide_index=True)
        sure = st.checkbox(f"Yes, delete every submission and prediction of class {code}", key="class.sure")
        if st.button("Reset this class", disabled=not sure, key="class.reset"):
            gone = store.reset(code)
            st.success(f"Deleted {gone['submissions']} submission(s) and {gone['predictions']} prediction(s).")
    st.stop()

# --- a learner's view -----------------------------------------------------------------------------------
if me is None:
    join_tab, rejoin_tab = st.tabs(["Join a class", "Rejoin with your key"])
    with join_tab:
        with st.form("class.join"):
            code = st.text_input("Class code (your instructor shows it)", key="class.join_code")
            name = st.text_input("Display name (the class board shows it)", key="class.join_name")
            if st.form_submit_button("Join"):
                try:
                    me, key = store.join(code, name)
                    st.session_state["class.shown_key"] = key
                except ParamError as exc:
                    st.error(str(exc))
    with rejoin_tab:
        with st.form("class.rejoin"):
            typed_key = st.text_input("Your key", type="password", key="class.rejoin_key")
            if st.form_submit_button("Rejoin"):
                me = store.learner(typed_key.strip())
                if me is None:
                    st.error("No learner has that key.")
                else:
                    key = typed_key.strip()
    if me is None:
        st.stop()
    classroom.remember_key(key)
st.query_params["s"] = key  # the key stays in the address: a reload or a bookmark brings the work back
st.text(f"You are {me.name} in class {me.class_code}.")
shown = st.session_state.pop("class.shown_key", None)
if shown:
    st.warning("Your key, shown once: copy it now. With it you rejoin on another browser and your work comes "
               "back; without it nobody (you included) can write as you.")
    st.code(shown, language=None)
st.markdown(f"[Open the kernel workbench](workbench?s={key}): your code and verdicts are kept under your key.")
if st.button("Leave (forget my key on this browser)", key="class.leave"):
    classroom.remember_key("")
    del st.query_params["s"]
    st.rerun()
st.subheader("The class board")
board_section(me.class_code, show_names=True, with_code=False, me=me)
