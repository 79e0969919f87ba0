"""Benchmark results as documentation: each `python -m scripts.bench_* doc=true` run appends one entry (its table in
markdown, with the host, its CPU flags, the date, the commit, the command and the rounds) to
`docs/benchmarks/results/<page>.jsonl`; the docs site renders each page's entries (`docs/hooks/generate.py`): for
each question (an entry's title) the latest entry measured by a script on committed code with the host's flags
recorded, and every other entry in a collapsed history: an older one, one carried over from the README that
preceded the site, one measured with uncommitted changes (`-dirty`).

JSON lines rather than markdown written into the page: an entry is data (it keeps its host and commit
apart from its prose), a new run never rewrites an old one, and the page's layout can change without
touching what was measured.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shlex
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from src.common.environment import PROJECT_ROOT, cpu_model, git_commit
from src.common.mdtext import md_code, md_text

RESULTS = PROJECT_ROOT / "docs" / "benchmarks" / "results"
# The flags that decide which kernel variant runs and how fast: what a reader must know of the host.
FLAGS = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "avx512_fp16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "asimd",
    "asimddp",
    "sve",
)


@dataclass
class Entry:
    title: str
    body: str  # markdown: the table and what the reader needs to read it
    date: str  # YYYY-MM-DD
    commit: str  # the code measured ("-dirty": with uncommitted changes)
    host: str  # the CPU's name and cores
    flags: list[str]
    command: str
    rounds: int | None = None
    load: str = ""  # what else ran, where the script knows (busy rounds)
    origin: str = "script"  # script, or where an entry was carried from
    extra: dict = field(default_factory=dict)


def host_flags(cpuinfo: str | None = None) -> list[str]:
    """The host's flags among FLAGS, in that order."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
    have: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.split(":")[0].strip() in ("flags", "Features"):
            have |= set(line.split(":", 1)[1].split())
    return [f for f in FLAGS if f in have]


def entry(title: str, body: str, rounds: int | None = None, load: str = "", argv: list[str] | None = None) -> Entry:
    argv = sys.argv if argv is None else argv
    script = os.path.relpath(argv[0], PROJECT_ROOT) if argv and argv[0] else "?"
    if script.startswith("scripts/") and script.endswith(".py"):  # run as a module, as the scripts are
        script = f"-m {script.removesuffix('.py').replace('/', '.')}"
    commit = git_commit()
    return Entry(
        title=title,
        body=body.strip() + "\n",
        date=dt.date.today().isoformat(),
        commit=commit[:12] + ("-dirty" if commit.endswith("-dirty") else ""),
        host=f"{cpu_model()}, {os.cpu_count()} cores",
        flags=host_flags(),
        command=" ".join([".venv/bin/python", script, shlex.join(a for a in argv[1:] if a != "doc=true")]).strip(),
        rounds=rounds,
        load=load,
    )


def append(page: str, item: Entry, results: Path = RESULTS) -> Path:
    """One more entry on a page: appended, never rewriting what is there."""
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{page}.jsonl"
    with path.open("a") as out:
        out.write(json.dumps(asdict(item), ensure_ascii=False) + "\n")
    return path


def record(doc: bool, page: str, title: str, body: str, rounds: int | None = None, load: str = "") -> None:
    """Where the script was run with doc=true: the result on its page, and where it went."""
    if doc:
        path = append(page, entry(title, body, rounds, load))
        print(f"recorded on the docs' benchmark page: {os.path.relpath(path, PROJECT_ROOT)}")


def save_markdown(name: str, text: str) -> Path:
    """A benchmark script's result, as reports/<name>.md under the project root (reports/ is not tracked)."""
    out = PROJECT_ROOT / "reports" / f"{name}.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(text)
    print(f"\nwritten to {out.relative_to(PROJECT_ROOT)}")
    return out


def load(page: str, results: Path = RESULTS) -> list[Entry]:
    """A page's entries, oldest first (the order they were appended)."""
    path = results / f"{page}.jsonl"
    if not path.exists():
        return []
    entries = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                entries.append(Entry(**json.loads(line)))
            except (ValueError, TypeError) as err:
                raise ValueError(f"{path}:{number}: not a benchmark entry ({err})") from None
    return entries


def _code(text: str) -> str:
    """Text as an inline code span (src.common.mdtext.md_code)."""
    return md_code(text)


def isa(flags: list[str]) -> str:
    """What of the host decides the kernels, in a few words: a stable part of its name where CPU models repeat
    ("AMD EPYC" names hosts with and without AVX-512)."""
    have = set(flags)
    if not have:
        return "flags not recorded"
    if "avx512f" in have:
        extras = [
            name
            for flag, name in (("avx512_vnni", "VNNI"), ("avx512_bf16", "BF16"), ("avx512_fp16", "FP16"))
            if flag in have
        ]
        out = "AVX-512" + (f" {'/'.join(extras)}" if extras else "")
        out += ", AMX" if "amx_int8" in have else ""
        return out + (", AVX-VNNI" if "avx_vnni" in have else "")
    if "avx2" in have:
        return "AVX2" + (" + AVX-VNNI" if "avx_vnni" in have else "") + (" + FMA" if "fma" in have else "")
    if "asimd" in have:
        return "Arm NEON" + (" + dot product" if "asimddp" in have else "")
    return " ".join(flags)


def host_name(item: Entry) -> str:
    return f"{item.host} ({isa(item.flags)})"


def current(item: Entry) -> bool:
    """Whether an entry can stand as a page's latest: measured by its script, on committed code, its host's
    flags recorded."""
    return item.origin == "script" and not item.commit.endswith("-dirty") and bool(item.flags)


def why_history(item: Entry) -> str:
    if item.origin != "script":
        return "carried over, host and flags as its text says"
    if item.commit.endswith("-dirty"):
        return "measured with uncommitted changes"
    if not item.flags:
        return "host flags not recorded"
    return "superseded"


def latest(entries: list[Entry]) -> list[Entry]:
    """The newest current entry of each question (title), newest first."""
    out: dict[str, Entry] = {}
    for item in reversed(entries):
        if current(item) and item.title not in out:
            out[item.title] = item
    return list(out.values())


def _header(item: Entry) -> str:
    rounds = f"{item.rounds} rounds in turns" if item.rounds else "one run"
    return f"{md_text(item.date)} · {md_text(host_name(item))} · {rounds} · commit {_code(item.commit)}"


def _about(item: Entry) -> str:
    flags = " ".join(item.flags) or "not recorded"
    lines = [
        f"*Host*: {md_text(host_name(item))}; CPU flags {_code(flags)}.  ",
        f"*Measured*: {md_text(item.date)}, commit {_code(item.commit)}, "
        f"{f'{item.rounds} rounds in turns' if item.rounds else 'one run'}"
        f"{f'; {md_text(item.load)}' if item.load else ''}.  ",
        f"*Command*: {_code(item.command)}"
        + (f"  \n*From*: {md_text(item.origin)}" if item.origin != "script" else ""),
    ]
    return "\n".join(lines)


def render(entries: list[Entry]) -> str:
    """Each question's latest current entry in full, newest first; every other entry collapsed (Material's `???`
    blocks), newest first, saying why it is history."""
    if not entries:
        return "*No result recorded yet: run the script above with `doc=true`.*\n"
    shown = latest(entries)
    out: list[str] = []
    for item in shown:
        out += [f"## Latest: {md_text(item.title)}", "", _about(item), "", item.body.strip(), ""]
    if not shown:
        out += [
            "*No current result: every entry below was carried over, measured with uncommitted changes or without "
            "its host's flags. Run the script above with `doc=true` on committed code.*",
            "",
        ]
    earlier = [item for item in reversed(entries) if not any(item is s for s in shown)]
    if earlier:
        out += ["## History", ""]
        for item in earlier:
            title = f"{md_text(item.title)} ({_header(item)}; {why_history(item)})".replace('"', "&quot;")
            out.append(f'??? note "{title}"')
            block = _about(item) + "\n\n" + item.body.strip()
            out += [("    " + line) if line else "" for line in block.splitlines()]
            out.append("")
    return "\n".join(out)
