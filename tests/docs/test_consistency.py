"""What the docs enumerate, read against the code that holds it, so that a page cannot fall behind: how many
precisions there are (conf/precision/), the kernel variants and the many-row GEMM paths tracking.md lists."""

import re

from scripts.bench import every_precision
from src.common import doccommands
from src.kernels import variants
from src.kernels.modules import FLOAT_GEMMS
from src.quant import prefill

ROOT = doccommands.PROJECT_ROOT
NUMBERS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve".split())}


def _pages() -> dict[str, str]:
    pages = {str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "docs").rglob("*.md")}
    pages["README.md"] = (ROOT / "README.md").read_text()
    return pages


def test_a_page_that_counts_every_precision_counts_conf_precisions():
    count = len(every_precision())
    wrong = []
    for page, text in _pages().items():
        for m in re.finditer(r"\b(?:[Aa]ll|[Ee]very) (\w+) precisions\b|\b(\w+) precisions side by side", text):
            word = (m[1] or m[2]).lower()
            said = int(word) if word.isdigit() else NUMBERS.get(word)
            if said is not None and said != count:
                wrong.append(f"{page}: {m[0]!r} (conf/precision/ holds {count})")
    assert wrong == []


def test_tracking_md_lists_every_kernel_variant_and_many_row_gemm_path():
    text = (ROOT / "docs" / "reference" / "tracking.md").read_text()
    isa = text[text.index("`kernels_isa`") :].split(")")[0]
    assert [name for name in variants.NAMES if f"`{name}`" not in isa] == []
    gemm = text[text.index("`executed.int8_gemm`") :].split(")")[0]
    assert [path for path in (*prefill.PATHS, "amx") if f"`{path}`" not in gemm] == []
    floats = text[text.index("`executed.float_gemm`") :].split(";")[0]
    assert [path for path in FLOAT_GEMMS if f"`{path}`" not in floats] == []
