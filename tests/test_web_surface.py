"""The web surface against a hostile visitor (issue 32), under AppTest: every page with hostile values for each
of its query parameters, hostile uploads, parameters that overflow, workbench tokens from links.

What counts as a failure: an exception, or any element that shows the hostile host (evil.example) holding a
Markdown construct that would render as a link, an image, HTML or an autolinked address. Text that merely
names the host, escaped, is fine: it is shown as text.
"""

import dataclasses
import json
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from labs import all_labs
from labs.engine import results
from labs.engine.params import ParamError
from labs.engine.results import list_recorded
from labs.workbench import store
from ui import classroom, text

ROOT = Path(__file__).resolve().parent.parent
LABS = [lab for lab in all_labs() if (ROOT / "pages" / f"{lab.name}.py").exists()]
COMMON = ["mode", "predict"]  # read on every page (ui/classroom.py)
PAGE_PARAMS = {f"pages/{lab.name}.py": COMMON + [f.name for f in dataclasses.fields(lab.Params)] for lab in LABS}
PAGE_PARAMS.update({"pages/home.py": COMMON, "pages/gpu.py": COMMON, "pages/scorecard.py": COMMON,
                    "pages/glossary.py": COMMON + ["term"], "pages/workbench.py": COMMON + ["exercise", "s"]})
PAGE_PARAMS = {p: q for p, q in PAGE_PARAMS.items() if (ROOT / p).exists()}

HOST = "evil.example"
MARKUP = [f"[Session expired: log in here](https://{HOST}/login)", f"![t](http://{HOST}/x.png)",
          f"<img src=http://{HOST}/y.png onerror=alert(1)>", f"[x][1]\n\n[1]: https://{HOST}/ref",
          f"www.{HOST}/w and me@{HOST}", f"<https://{HOST}/auto> :red[red] $\\href{{https://{HOST}}}{{k}}$",
          f"javascript:alert(1)//{HOST} :material/home:"]
NUMBERS = ["9" * 400, "-" + "9" * 400, "NaN", "-Infinity", "1e999", "1/0", "1e308", "9" * 5000, "1," + "9" * 400]

# an unescaped Markdown construct (a backslash before the mark makes it text) ...
_UNESCAPED = re.compile(r"(?<!\\)\]\s*[(\[:]|(?<!\\)!\[|(?<!\\)<|(?<!\\)\$")
# ... or an address GFM autolinks after the escapes are resolved (remark's autolink-literal finds these in text)
_AUTOLINK = re.compile(r"(?ai)https?://|www\.|[-.\w+]+@[-\w]+\.|:material/")


def unescaped(source: str) -> str:
    return re.sub(r"\\(.)", r"\1", source)


def is_markup(source: str) -> bool:
    return bool(_UNESCAPED.search(source) or _AUTOLINK.search(unescaped(source)))


def shown_texts(at: AppTest) -> list:
    """Every string the page hands to Streamlit's Markdown renderer (and the titles)."""
    found = []
    for kind in ("markdown", "caption", "warning", "error", "info", "success", "title", "header", "subheader"):
        found += [str(e.value) for e in getattr(at, kind)]
    return found


def links_to_the_host(at: AppTest) -> list:
    return [t for t in shown_texts(at) if HOST in unescaped(t).replace("\u2060", "") and is_markup(t)]


def run_page(page: str, query: dict, through_app: bool = False) -> AppTest:
    """The page as a visitor's link opens it, the query on the first request; through app.py's navigation
    (twice the time) where the page needs it (Home links the labs' pages)."""
    at = AppTest.from_file(str(ROOT / ("app.py" if through_app else page)), default_timeout=120)
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    if through_app:
        at.switch_page(page)
        at.run()
    return at


@pytest.mark.parametrize("page", sorted(PAGE_PARAMS))
def test_every_page_shows_hostile_query_values_as_text(page):
    """Each parameter the page reads gets each hostile value (rotated, so that one run tries them all at once)."""
    names = PAGE_PARAMS[page]
    values = [" ".join(MARKUP)] + MARKUP[:2] + NUMBERS
    for shift in range(len(values)):
        query = {name: values[(shift + i) % len(values)] for i, name in enumerate(names)}
        at = run_page(page, query, through_app=page in ("pages/home.py", "pages/scorecard.py") or shift == 0)
        assert not at.exception, (page, query, [e.value for e in at.exception])
        assert not links_to_the_host(at), (page, query, links_to_the_host(at))
        assert at.title, (page, query)


def test_the_reported_links_show_the_text_and_no_link():
    at = run_page("pages/glossary.py", {"term": MARKUP[0]})
    warning = at.warning[0].value
    assert "no entry named" in warning and not links_to_the_host(at)
    at = run_page("pages/workbench.py", {"exercise": MARKUP[1]})
    assert any("no exercise" in w.value for w in at.warning) and not links_to_the_host(at)


@pytest.mark.parametrize("page, name, value", [("roofline", "size_mib", "9" * 400),
                                               ("roofline", "flops_per_element", "1," + "9" * 400),
                                               ("divergence", "cost_ratios", "1/0"),
                                               ("inference", "usd_per_gpu_hour", "1/0")])
def test_an_overflowing_number_in_a_link_is_a_message(page, name, value):
    at = run_page(f"pages/{page}.py", {name: value})
    assert not at.exception, [e.value for e in at.exception]
    assert any("Ignoring the link's parameters" in w.value for w in at.warning)


def test_plain_escapes_every_construct_and_keeps_the_words():
    for hostile in MARKUP:
        escaped = text.plain(hostile)
        assert not is_markup(escaped), escaped
        assert "evil" in escaped
    assert text.plain("no-such-term") == "no-such-term"
    assert text.plain("- a list?").startswith("\\-") and "\n" not in text.plain("# a\n# b")
    assert len(text.plain("x" * 10_000, 50)) == 50
    assert "too large" in text.plain(10 ** 5000)


# --- uploads --------------------------------------------------------------------------------------
def recorded_dict(lab="roofline") -> dict:
    return json.loads(list_recorded(lab)[0].to_json())


def hostile_files() -> list:
    """(name, bytes, what the message says): HTML, links and images in every string field, wrong types,
    NaN and Infinity, overflowing numbers, deep nesting."""
    cases = []
    good = recorded_dict()
    strings = [("meta", "gpu", "name"), ("meta", "date"), ("meta", "versions", "torch"), ("meta", "git_commit"),
               ("messages", 0), ("rows", 0, "dtype"), ("params", "dtypes", 0)]
    for i, path in enumerate(strings):
        for hostile in MARKUP[:3]:
            data = json.loads(json.dumps(good))
            data.setdefault("messages", []).append("")
            node = data
            for step in path[:-1]:
                node = node[step]
            node[path[-1]] = hostile
            cases.append((f"markup{i}.json", json.dumps(data).encode(), "markup"))
    spoof = {**good["meta"]["gpu"], "name": "NVIDIA H100\u202e001H AIDIVN"}  # a right-to-left override
    cases.append(("bidi.json", json.dumps({**good, "meta": {**good["meta"], "gpu": spoof}}).encode(), "markup"))
    for meta, says in (({"gpu": "H100"}, "wrong type"), ({"versions": "x"}, "wrong type"),
                       ({"kind": "evil"}, "allowed"), ({"gpu": {"name": ["a"]}}, "wrong type"),
                       ({"gpu": {"name": 5}}, "wrong type"),
                       ({"ceilings": [1]}, "wrong type"), ({"ceilings": {"copy_tbps": "x"}}, "wrong type"),
                       ({"normalised_by": "x"}, "wrong type")):
        cases.append(("types.json", json.dumps({**good, "meta": {**good["meta"], **meta}}).encode(), says))
    body = json.dumps(good)
    for bad in ("NaN", "Infinity", "-Infinity", "1e999", "9" * 400):
        cases.append(("nan.json", body.replace('"schema": 1', f'"schema": 1, "x": {bad}', 1).encode(), "parse"))
    deep = "[" * 50_000 + "]" * 50_000
    cases.append(("deep.json", body.replace('"messages": [', f'"deep": {deep}, "messages": [', 1).encode(), "deeper"))
    csv_text = list_recorded("roofline")[0].to_csv()
    first, _, rest = csv_text.partition("\n")
    cases.append(("deep.csv", ("# roofline " + "{\"a\": " * 40_000 + "1" + "}" * 40_000 + "\n" + rest).encode(),
                  "deeper"))
    columns = rest.partition("\n")[0].count(",") + 1
    cases.append(("nan.csv", (csv_text + ",".join(["nan"] * columns) + "\n").encode(), "finite"))
    cases.append(("big.json", b" " * 6_000_000, "at most 5 MB"))
    rows = {**good, "rows": good["rows"] * (getattr(results, "MAX_UPLOAD_ROWS", 2000) // len(good["rows"]) + 1)}
    cases.append(("rows.json", json.dumps(rows).encode(), "more than"))
    cells = {**good, "rows": [{f"c{i}": 1 for i in range(90)}] * 1000}
    cases.append(("cells.json", json.dumps(cells).encode(), "at most 50,000"))
    return cases


def test_a_byte_order_mark_is_no_reason_to_refuse_a_file():
    rec = list_recorded("roofline")[0]
    assert classroom.parse_upload("bom.json", b"\xef\xbb\xbf" + rec.to_json().encode(), "roofline").rows == rec.rows


def test_every_committed_recording_passes_the_upload_schema():
    """The schema refuses hostile files, not the app's own: every recording, as JSON and as CSV."""
    for path in sorted((ROOT / "content" / "recorded").glob("*/*.json")):
        if "rows" not in json.loads(path.read_text()):
            continue  # ceilings.json
        rec = results.Result.from_json(path.read_text())
        for name, data in ((path.name, rec.to_json()), (path.stem + ".csv", rec.to_csv())):
            assert classroom.parse_upload(name, data.encode(), rec.lab).rows == rec.rows or name.endswith(".csv")


def test_compiler_output_may_hold_ptx_labels_and_nothing_else_that_markdown_reads():
    """A PTX excerpt (shown only in a code block) holds '$L__BB0_14' labels; HTML there, or '$' anywhere else,
    is still refused."""
    rec = results.Result.from_json((ROOT / "content" / "recorded" / "nvidia-h200" / "hopper.json").read_text())
    row = next(r for r in rec.rows if "$" in (r.get("ptx_excerpt") or ""))
    assert results.parse_untrusted(rec.to_json(), False).rows == rec.rows
    for bent in ({**row, "ptx_excerpt": "<script>x</script>"}, {**row, "config": "$x$"}):
        with pytest.raises(ParamError, match="markup"):
            results.parse_untrusted(json.dumps({**rec.to_dict(), "rows": [bent]}), False)


@pytest.mark.parametrize("name, data, says", hostile_files(), ids=[f"{n}-{i}" for i, (n, _, _) in
                                                                 enumerate(hostile_files())])
def test_a_hostile_upload_is_one_clear_message(name, data, says):
    with pytest.raises(ParamError, match=says) as caught:
        classroom.parse_upload(name, data, "roofline")
    message = str(caught.value)
    assert message.startswith(("Not a Roofline result file", "This file is")) and len(message) < 300
    assert HOST not in message  # nothing of the file's content is echoed back


def upload_page(files: list, runs: int = 1) -> AppTest:
    at = AppTest.from_file(str(ROOT / "pages" / "roofline.py"), default_timeout=120)
    at.run()
    uploader = next(u for u in at.get("file_uploader") if "Compare with result files" in u.label)
    uploader.set_value(files)
    for _ in range(runs):
        at.run()
    return at


def test_hostile_uploads_on_the_page_show_messages_and_no_markup():
    files = [(name, data, "application/json") for name, data, _ in hostile_files()[:30:3]]
    files.append((f"[x](https://{HOST}).json", b"{}", "application/json"))  # the file's own name
    at = upload_page(files)
    assert not at.exception, [e.value for e in at.exception]
    assert not links_to_the_host(at), links_to_the_host(at)
    assert sum("Not a Roofline result file" in e.value or "not read" in e.value for e in at.error) == len(files)


def test_an_upload_is_parsed_once_not_on_every_rerun(monkeypatch):
    calls = []
    real = results.parse_untrusted
    monkeypatch.setattr(results, "parse_untrusted", lambda *a, **k: calls.append(1) or real(*a, **k))
    rec = list_recorded("roofline")[0]
    hostile = json.dumps({**recorded_dict(), "messages": [MARKUP[0]]}).encode()
    at = upload_page([("mine.json", rec.to_json().encode(), "application/json"),
                      ("bad.json", hostile, "application/json")], runs=3)
    assert not at.exception and len(at.error) == 1
    assert len(calls) == 2  # each file once, the refused one too, over four runs of the page


def test_a_session_holds_a_bounded_number_of_files():
    rec = recorded_dict()
    files = []
    for i in range(classroom.MAX_SESSION_FILES + 3):  # distinct contents: each would be parsed
        data = {**rec, "messages": rec.get("messages", []) + [f"copy {i}"]}
        files.append((f"copy{i}.json", json.dumps(data).encode(), "application/json"))
    at = upload_page(files)
    assert not at.exception
    refused = [e.value for e in at.error if "at most" in e.value]
    assert len(refused) == 3, refused


def test_a_session_holds_a_bounded_number_of_rows(monkeypatch):
    monkeypatch.setattr(classroom, "MAX_SESSION_ROWS", 60)  # a recording of the roofline lab has 28 rows
    rec = recorded_dict()
    files = [(f"copy{i}.json", json.dumps({**rec, "messages": [f"copy {i}"]}).encode(), "application/json")
             for i in range(3)]
    at = upload_page(files, runs=2)
    assert not at.exception
    assert [e.value for e in at.error if "rows" in e.value] and len(at.error) == 1


# --- workbench tokens -----------------------------------------------------------------------------
def workbench(token=None) -> AppTest:
    query = {"exercise": "add"} | ({"s": token} if token else {})
    at = run_page("pages/workbench.py", query)
    assert not at.exception, [e.value for e in at.exception]
    return at


def token_of(at: AppTest) -> str:
    value = at.query_params["s"]
    return value[0] if isinstance(value, list) else value


def test_a_token_from_a_link_is_not_adopted_unless_this_server_issued_it():
    for linked in ("aaaaaaaa", store.new_token(), "A" * 64):  # the right shape, never issued
        at = workbench(linked)
        assert token_of(at) != linked
        assert store.owns(token_of(at))  # the page's token was issued by the server
    issued = token_of(workbench())
    assert token_of(workbench(issued)) == issued  # a reload of the page keeps the learner's session


def test_a_token_issued_to_another_browser_is_not_adopted():
    theirs = store.issue("browser-of-the-sender")
    assert not store.owns(theirs, "browser-of-the-victim") and not store.owns(theirs)
    assert store.owns(theirs, "browser-of-the-sender")
    assert token_of(workbench(theirs)) != theirs  # AppTest has no cookie: not the sender's browser either


def test_the_served_config_limits_uploads_and_hides_tracebacks():
    """.streamlit/config.toml, as this Streamlit reads it (an unknown value would fall back to the default)."""
    import tomllib

    from streamlit import config

    values = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert values["server"]["maxUploadSize"] * 1024 * 1024 >= results.MAX_UPLOAD_BYTES
    assert values["server"]["maxUploadSize"] <= 10
    assert values["client"]["showErrorDetails"] in ("none", "type")
    config.get_config_options(force_reparse=True)
    assert config.get_option("server.maxUploadSize") == values["server"]["maxUploadSize"]
    assert config.get_option("client.showErrorDetails") == values["client"]["showErrorDetails"]


_UNIT = re.compile(r"_(pct|ms|us|s|tbps|gbps|tflops|flops|bytes|gb|mib)$")


def odd_copies(lab) -> list:
    """A lab's own recording, bent: its key columns dropped or null, rows empty, other text columns numbers
    and other numbers text: refused (pages index rows by their key columns and compare the numbers); every
    other value null: refused too; reordered with a column more: shown without an exception."""
    d = recorded_dict(lab.name)
    key = lab.key[0]
    swap = {str: lambda v: 7, int: lambda v: "x", float: lambda v: "x"}
    bent = {"drop-key": [{k: v for k, v in r.items() if k != key} for r in d["rows"]],
            "null-key": [{**r, key: None} for r in d["rows"]],
            "empty-row": [{}],
            "swap-types": [{k: (v if k in lab.key or _UNIT.search(k) else swap.get(type(v), lambda v: v)(v))
                            for k, v in r.items()} for r in d["rows"]],
            "nulls": [{k: (v if k in lab.key else None) for k, v in r.items()} for r in d["rows"]],
            # accepted: the rows as recorded, in another order, with a column more
            "reordered": [{**r, "extra_note": "x"} for r in reversed(d["rows"])]}
    return [(f"{name}.json", json.dumps({**d, "rows": rows}).encode(), "application/json")
            for name, rows in bent.items()]


@pytest.mark.parametrize("lab", [lab for lab in LABS if list_recorded(lab.name)], ids=lambda lab: lab.name)
def test_an_odd_upload_shown_alone_never_breaks_the_page(lab):
    """The uploads are the only runs shown (the recorded ones deselected), so the page's own code reads them."""
    at = AppTest.from_file(str(ROOT / "pages" / f"{lab.name}.py"), default_timeout=120)
    at.run()
    uploader = next(u for u in at.get("file_uploader") if "Compare with result files" in u.label)
    uploader.set_value(odd_copies(lab))
    at.run()
    for chooser in at.multiselect:
        if chooser.key and chooser.key.startswith("recorded:"):
            chooser.set_value([])
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    refused = [e.value for e in at.error if "Not a result of this lab" in e.value]
    assert len(refused) == 5, refused  # all but the reordered rows, which the page shows
