"""Text from outside (a setting's value, a CPU's or a host's name, a sweep's id) where it lands in markdown:
report.md, regress.md, search.md, the benchmark pages, and MLflow's run descriptions, which its UI renders as
markdown. One rule per form, applied where the text is written:

- `plain`: bidirectional controls (a U+202E right-to-left override reorders what the reader sees) and other
  control characters removed, on one line: for names (run names, tags) as for everything below;
- `md_text`: shown as text wherever markdown puts it (a table cell, a heading, a list item, a sentence): HTML's
  special characters as entities (no tag, no autolink), and markdown's link, code and table characters
  backslash-escaped (no `[link](javascript:...)`, no code span opened by a stray backtick, no cell split by `|`);
- `md_code`: shown as code, in a span fenced by more backticks than it holds in a row.
"""

from __future__ import annotations

import html
import re
import unicodedata

# Bidi embedding, override and isolate controls, the marks, and the Arabic letter mark.
BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
ESCAPED = "\\`[]|"  # a backslash first: the escapes added after it must stay escapes


def plain(value) -> str:
    """One line with no control or bidi characters: line breaks and tabs become spaces, the rest go."""
    text = " ".join(str(value).splitlines()).replace("\t", " ")
    return "".join(ch for ch in text if ch not in BIDI and unicodedata.category(ch) != "Cc")


def md_text(value) -> str:
    text = html.escape(plain(value), quote=False)
    for ch in ESCAPED:
        text = text.replace(ch, "\\" + ch)
    return text


def md_code(value) -> str:
    text = plain(value)
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or len(fence) > 1 else ""
    return f"{fence}{pad}{text}{pad}{fence}"
