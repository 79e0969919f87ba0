"""Hostile text where it lands in markdown, checked on the rendered HTML (Python-Markdown with the site's
extensions, as the docs and a reader's viewer render it), not on the source: no tag, no javascript: link, no
code span opened, no table cell split, no bidi control; the text itself still shown."""

import html
import re

import markdown
import pytest

from src.common.mdtext import md_code, md_text, plain
from src.common.metrics import markdown_table
from src.tracking.sweep.naming import job_name

HOSTILE = [
    "a|b",
    "line one\nline two",
    "<img src=x onerror=alert(1)>",
    "[l](javascript:alert(2))",
    "<javascript:alert(3)>",
    "a ` lone backtick",
    "``double`` and `single`",
    "x\u202ey right-to-left",
    "\\[escaped\\](javascript:alert(4))",
    "![i](javascript:alert(5))",
    "&lt;img src=x&gt; already escaped",
]
EXTENSIONS = ["tables", "admonition", "pymdownx.details", "pymdownx.superfences"]


def render(doc: str) -> str:
    return markdown.markdown(doc, extensions=EXTENSIONS)


def shown(rendered: str) -> str:
    """What a reader sees: the tags dropped, the entities read."""
    return html.unescape(re.sub(r"<[^>]+>", "", rendered))


def assert_inert(rendered: str) -> None:
    """No tag made of the hostile text (an image with a handler, a javascript: link, raw HTML: the page's own
    tags, a report's plots among them, carry none of these), no bidi control."""
    for tag in re.findall(r"<[^>]+>", rendered):
        assert not re.search(r"onerror|javascript:|src=.?x\b|^<javascript", tag, re.IGNORECASE), (tag, rendered)
    assert "\u202e" not in rendered


@pytest.mark.parametrize("text", HOSTILE)
def test_text_is_shown_as_text_in_a_heading_a_list_a_sentence_and_a_table(text):
    want = plain(text)
    for doc in (f"# {md_text(text)}", f"- {md_text(text)}", f"Ran on {md_text(text)}."):
        rendered = render(doc)
        assert_inert(rendered)
        assert "<code" not in rendered, rendered
        assert want in shown(rendered), (doc, rendered)
    table = render(markdown_table(["host", "ms"], [[text, 1.0]]))
    assert_inert(table)
    assert table.count("<td") == 2 and want in shown(table), table  # one row, two cells, the text whole


@pytest.mark.parametrize("text", HOSTILE)
def test_code_is_shown_as_one_code_span_holding_the_text(text):
    rendered = render(f"Command: {md_code(text)}")
    assert rendered.count("<code>") == 1 and "<img" not in rendered and "href=" not in rendered, rendered
    (inside,) = re.findall(r"<code>(.*?)</code>", rendered)
    assert html.unescape(inside).strip() == plain(text), rendered


def test_a_run_name_loses_its_bidi_controls_and_keeps_the_rest():
    name = job_name(
        {"model": "tiny-llama", "hardware": "cpu", "precision": "fp32", "draft": "none", "task": "decode"},
        ["task.stop=x\u202eevil\u2066"],
        "task.stop",
    )
    assert name == "tiny-llama·cpu·fp32·none·decode·stop=xevil"
