"""Bad input never crashes a page: wrong types, huge sizes, negative numbers, unknown names, odd links."""

import dataclasses
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from labs import all_labs

ROOT = Path(__file__).resolve().parent.parent
LAB_PAGES = [lab for lab in all_labs() if (ROOT / "pages" / f"{lab.name}.py").exists()]
GARBAGE = ["-1", "1e99", "abc", "", "../../etc/passwd", "<script>alert(1)</script>", "1,2,-3", "nan"]


@pytest.mark.parametrize("lab", LAB_PAGES, ids=lambda lab: lab.name)
def test_garbage_query_parameters_give_a_message_not_a_traceback(lab):
    for value in GARBAGE:
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
        for f in dataclasses.fields(lab.Params):
            at.query_params[f.name] = value
        at.query_params["mode"] = value
        at.query_params["predict"] = value
        at.run()
        at.switch_page(f"pages/{lab.name}.py")
        at.run()
        assert not at.exception, (lab.name, value, [e.value for e in at.exception])
        assert at.title


def test_unknown_glossary_term_and_unknown_parameters_are_harmless():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.query_params["term"] = "../../no-such-term"
    at.query_params["unknown"] = "1"
    at.run()
    if (ROOT / "pages" / "glossary.py").exists():
        at.switch_page("pages/glossary.py")
        at.run()
    assert not at.exception
