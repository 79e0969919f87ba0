"""The README's headline, made from a benchmark page's latest entries so the two cannot disagree: the table of the
users' decode path against llama.cpp (the latest `engine.isa=auto` entry of docs/benchmarks/llamacpp.md) and, at
the seeds' scale, the latest 7B entry of that page (scripts/bench_seven_b_decode's) between the README's headline
markers, and its picture, docs/headline.png, with docs/headline.json naming the entry it was
drawn from. tests/docs/test_docs.py fails when either is not the latest entry's.

    .venv/bin/python -m scripts.headline     # rewrite both from the latest entry (after a bench_llamacpp doc=true)
"""

from __future__ import annotations

import json
import math
import re
import sys
import textwrap
from pathlib import Path

from matplotlib.figure import Figure  # no pyplot: the figure is written to a file, never shown

from src.common import benchpage
from src.common.environment import PROJECT_ROOT
from src.common.metrics import md_text

PAGE = "llamacpp"
QUESTION = "engine.isa=auto"  # in the entry's title: the users' own path, as the CPU picks it
SEVEN_B = "decode and prefill against llama-bench"  # in a 7B entry's title (scripts/bench_seven_b_decode)
README = PROJECT_ROOT / "README.md"
PICTURE = PROJECT_ROOT / "docs" / "headline.png"
SOURCE = PICTURE.with_suffix(".json")
START = (
    "<!-- headline: made by python -m scripts.headline from the benchmark page's latest entry; not edited by hand -->"
)
END = "<!-- headline: end -->"


def entry(question: str = QUESTION) -> benchpage.Entry:
    found = [item for item in benchpage.latest(benchpage.load(PAGE)) if question in item.title]
    if not found:
        raise LookupError(f"docs/benchmarks/results/{PAGE}.jsonl has no current entry titled with {question}")
    return found[0]


def seven_b() -> benchpage.Entry | None:
    """The page's latest 7B entry, or None where it has none."""
    try:
        return entry(SEVEN_B)
    except LookupError:
        return None


def source(item: benchpage.Entry) -> dict:
    """What names an entry: the page, its title, date and commit."""
    return {"page": PAGE, "title": item.title, "date": item.date, "commit": item.commit}


def table(item: benchpage.Entry) -> list[str]:
    return [line for line in item.body.splitlines() if line.startswith("|")]


def significant(cell: str, digits: int = 3) -> str:
    """A number's cell at `digits` significant figures (9.69921 -> 9.70, 0.442587 -> 0.443, 21.9148 -> 21.9); a
    whole number or any other text as it is. The entries keep every digit measured; a reader needs three."""
    text = cell.strip()
    try:
        value = float(text)
    except ValueError:
        return text
    if not math.isfinite(value) or value == 0 or re.fullmatch(r"-?\d+", text):
        return text
    value = float(f"{value:.{digits}g}")  # rounded first: 9.99562 is 10.0, not 10.00
    return f"{value:.{max(0, digits - 1 - math.floor(math.log10(abs(value))))}f}"


def shown(item: benchpage.Entry) -> list[str]:
    """The entry's table, its numbers at three significant figures."""
    head, rule, *body = table(item)
    return [
        head,
        rule,
        *("| " + " | ".join(significant(c) for c in line.strip("|").split("|")) + " |" for line in body),
    ]


def _rounds(item: benchpage.Entry) -> str:
    return f"{item.rounds} rounds in turns" if item.rounds else "one run"


def block(item: benchpage.Entry, seven: benchpage.Entry | None = None) -> str:
    rounds = _rounds(item)
    lines = [
        START,
        *shown(item),
        "",
        "Lower ms/token is faster; a ratio under 1 is faster than llama.cpp, through its Python binding (`/ llama.cpp`) "
        "or its own C++ llama-bench (`/ llama-bench tg`) where the entry has it. Decode efficiency is the share "
        "of the host's measured memory bandwidth a step's weight reads use (1 is the roofline).",
        "",
        f"{md_text(item.title)}: {md_text(item.date)}, {md_text(benchpage.host_name(item))}, {rounds}, commit "
        f"`{item.commit}`; ten seed prompts, 30 greedy tokens, whole jobs in turns with llama.cpp on the model's own "
        f"Q4_K_M GGUF ([Against llama.cpp](docs/benchmarks/llamacpp.md), where earlier entries and other hosts are).",
    ]
    if seven is not None:
        lines += [
            "",
            "At the seeds' scale, Llama-2-7B's shape with random weights on both sides, against llama-bench on the same "
            "weights (a ratio under 1 is faster):",
            "",
            *shown(seven),
            "",
            f"{md_text(seven.title)}: {md_text(seven.date)}, {md_text(benchpage.host_name(seven))}, "
            f"{_rounds(seven)}, commit `{seven.commit}`.",
        ]
    return "\n".join([*lines, END])


def readme_block(text: str) -> str | None:
    found = re.search(re.escape(START) + r".*?" + re.escape(END), text, re.S)
    return found.group(0) if found else None


def rows(item: benchpage.Entry) -> list[tuple[str, float, float, float]]:
    """(decoder, median, min, max) from the entry's table."""
    head, _, *body = table(item)
    names = [cell.strip() for cell in head.strip("|").split("|")]
    at = {name: i for i, name in enumerate(names)}
    value = next(i for name, i in at.items() if name.startswith("ms/token"))
    out = []
    for line in body:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        out.append((cells[0], float(cells[value]), float(cells[at["min"]]), float(cells[at["max"]])))
    return out


def draw(item: benchpage.Entry, path: Path = PICTURE) -> Path:
    data = rows(item)[::-1]  # the first row on top
    # the table's names carry how each was run, said in the title instead
    # and a precision's overrides, without their "precision." prefix, wrapped so a long one keeps the plot's width
    labels = [
        textwrap.fill(re.sub(r" \(engine\.isa=[^)]*\)", "", name).replace("precision.", ""), 34) for name, *_ in data
    ]
    fig = Figure(figsize=(8, 0.35 * sum(label.count("\n") + 1 for label in labels) + 0.15 * len(data) + 1.6))
    ax = fig.add_subplot()
    medians = [m for _, m, _, _ in data]
    spans = [[m - low for _, m, low, _ in data], [high - m for _, m, _, high in data]]
    colors = ["#9e9e9e" if name.startswith(("llama.cpp", "llama-bench")) else "#1f77b4" for name in labels]
    ax.barh(labels, medians, xerr=spans, color=colors, capsize=3)
    for y, (_, m, _, high) in enumerate(data):  # beside the whisker, not across it
        ax.text(high, y, f"  {m:.2f}", va="center")
    ax.set_xlabel("ms per token, median of rounds (whiskers: min–max); lower is better")
    ax.set_title(
        f"gemma3-270m decode on 2 threads, in turns with llama.cpp\n{benchpage.host_name(item)}\n"
        f"{item.date}, commit {item.commit}",
        fontsize=9,
    )
    ax.set_xlim(0, max(high for *_, high in data) * 1.15)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main(argv: list[str]) -> int:
    if argv:
        print(__doc__, file=sys.stdout if argv[0] in ("-h", "--help") else sys.stderr)
        return 0 if argv[0] in ("-h", "--help") else 2
    item = entry()
    text = README.read_text()
    old = readme_block(text)
    if old is None:
        print(f"quantspec: README.md has no headline block ({START!r} ... {END!r})", file=sys.stderr)
        return 2
    README.write_text(text.replace(old, block(item, seven_b())))
    draw(item)
    SOURCE.write_text(json.dumps(source(item), indent=1) + "\n")
    print(f"README.md's headline and {PICTURE.relative_to(PROJECT_ROOT)}: {item.title}, {item.date}, {item.commit}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
