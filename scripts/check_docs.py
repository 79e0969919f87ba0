"""Run the commands the docs mark runnable, as a reader would, and check what they print against what the pages
show.

    .venv/bin/python -m scripts.check_docs              # every runnable block in README.md and docs/
    .venv/bin/python -m scripts.check_docs list=true    # which blocks, without running them
    .venv/bin/python -m scripts.check_docs write=true   # run them and rewrite the pages' output excerpts
    .venv/bin/python -m scripts.check_docs only=docs/walk   # the pages under docs/walk only

A runnable block (`<!-- runnable -->` right above a fenced block) runs in bash (-euo pipefail), one line per block
here; exit 1 if any fails, with its output's end. An output block (`<!-- output -->` right above the fenced block
after a runnable one) is an excerpt of what that block prints: every line it shows must still be printed, `...`
standing for lines left out. Figures, ids and times change from run to run, so lines are compared with each number
read as `#` (an empty cell, `-`, too), hex ids as `<id>`, runs of spaces and dashes as one (a table's padding
follows its figures), and what names the host (its CPU, the kernel variant), a `⚠ BUSY` mark (a figure timed
beside other work), a regress verdict (slower, faster, no change) and the report's quality mark (⚠: below the
quality floor) are not compared: they follow the figures. `write=true` rewrites each excerpt with the lines this run
printed that it matched, so a page shows real output of the current code (an empty excerpt gets all
of it, to be cut down by hand).

Each page runs in a scratch checkout of its own: a temporary directory whose entries link to this project's,
except the ones a run writes (the store, multirun/, outputs/), with a store of its own (MLFLOW_TRACKING_URI), so
its blocks run in order as on a fresh clone whatever this checkout, or another page, already holds (a page's
report reads its own sweep). Pages run side by side in lanes, one per core (at most `lanes`), each lane's
processes held to its own core(s), as the test suite's workers are: a block spends most of its time starting
Python and importing torch on one core, and two jobs' thread pools on the same cores spin against each other.
The figures a page prints are timed beside the other lane and marked busy, which is not compared. Paths into a
scratch checkout, and the home directory, are shown as a reader's (/home/you/quantspec, /home/you). CI runs this
after `mkdocs build --strict`, so a renamed setting or a changed line of output breaks the build instead of the
reader.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from scripts import bench
from src.common import doccommands
from src.common.environment import PROJECT_ROOT
from src.common.settings import Command, Setting

COMMAND = Command(
    "python -m scripts.check_docs",
    __doc__,
    [
        Setting("list", False, "list the runnable blocks, run nothing"),
        Setting("write", False, "rewrite the pages' output excerpts from this run (each shown line still matched)"),
        Setting("only", "", "only the pages whose path (from the project's root) starts with this"),
        Setting("timeout", 600, "seconds per block"),
        Setting("lanes", 2, "pages run at once, at most one per core (1: one after another, on every core)"),
    ],
)

# what a run writes into the project's root: the scratch checkout gets fresh ones
RUN_STATE = {"mlflow.db", ".mlflow.db.lock", "mlartifacts", "mlruns", "multirun", "outputs", "tracking-server", "site"}
READER = Path("/home/you")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# how a figure timed beside other work is marked (and the rounds measured again for it): not compared, as the
# checked runs share a machine
BUSY = re.compile(
    r"⚠ BUSY( baseline)?(, | · | )?|, \d+ / \d+ busy| ?\[(\d+ busy rounds? left out|every round busy)\]"
    r"|.*rounds? ran on a busy host.*"
)
CPU = re.compile(r"host CPU \((?:[^()|]|\([^()|]*\))*\)")  # "host CPU (Intel(R) Xeon(R) Processor)"
ISA = re.compile(r"\b(avx512|avx_vnni|avx2|neon_dotprod|neon|reference)\b")
VERDICT = re.compile(r"\| *(slower|faster|no change) *\|")  # src.regress's, on figures that move run to run
# the report's quality mark: a figure near the 0.99 floor (a tiny random model's w4a16) crosses it with the host's
# sum order, so the mark, like a verdict, follows the figures
QUALITY_MARK = re.compile(r" ⚠(?= *\|)|\\?\[⚠ QUALITY [^\]]*?\\?\] ?")
EMPTY_CELL = re.compile(r"(?<=\|) *[-–] *(?=\|)")  # "-": nothing measured, e.g. no busy round
HEX_ID = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b")
NUMBER = re.compile(r"(?<![A-Za-z_])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")  # not in a name: w8a8, fp32, avx512
ELLIPSIS = "..."


def scratch_checkout() -> Path:
    root = Path(tempfile.mkdtemp(prefix="quantspec-docs-"))
    for entry in PROJECT_ROOT.iterdir():
        if entry.name not in RUN_STATE and entry.name != ".git":
            (root / entry.name).symlink_to(entry)
    return root


def as_reader(text: str, scratch: Path) -> list[str]:
    """The output as a reader in a checkout at /home/you/quantspec would see it."""
    text = ANSI.sub("", text)
    for path, shown in ((scratch, READER / "quantspec"), (PROJECT_ROOT, READER / "quantspec"), (Path.home(), READER)):
        text = text.replace(str(path), str(shown))
    return [line.rstrip() for line in text.splitlines()]


def key(line: str) -> str:
    """What must stay the same: the line without what a run or a host changes."""
    line = CPU.sub(
        "host CPU (<cpu>)", ISA.sub("<isa>", VERDICT.sub("| <verdict> |", QUALITY_MARK.sub("", BUSY.sub("", line))))
    )
    line = NUMBER.sub("#", HEX_ID.sub("<id>", EMPTY_CELL.sub(" # ", line)))
    line = re.sub(r"# (\w+?)s\b", r"# \1", line)  # "1 round", "3 rounds": the count is not compared, nor its plural
    return re.sub(r"\s+", " ", re.sub(r"-{2,}", "-", line)).strip()


def match(shown: list[str], printed: list[str]) -> tuple[list[int], list[str]]:
    """The printed lines each shown line matches (in order where the order holds, else anywhere: a table's rows
    come fastest first), and the shown lines nothing printed matches."""
    wanted = [line for line in shown if line.strip() != ELLIPSIS]
    keys = [key(line) for line in printed]
    found, at = [], -1
    for line in wanted:  # in order
        k = key(line)
        at = next((i for i in range(at + 1, len(printed)) if keys[i] == k), None)
        if at is None:
            break
        found.append(at)
    else:
        return found, []
    found, missing = [], []
    for line in wanted:  # anywhere, each printed line used once
        k = key(line)
        i = next((i for i in range(len(printed)) if keys[i] == k and i not in found), None)
        (missing.append(line) if i is None else found.append(i))
    return sorted(found), missing


def excerpt(shown: list[str], printed: list[str], found: list[int]) -> list[str]:
    """The printed lines found, in the order printed, with `...` where lines were left out between them (and at
    either end where the page had it)."""
    out = [ELLIPSIS] if shown and shown[0].strip() == ELLIPSIS else []
    for n, i in enumerate(found):
        if n and i > found[n - 1] + 1:
            gap = printed[found[n - 1] + 1 : i]
            out.extend(gap if not any(line.strip() for line in gap) else [ELLIPSIS])  # blank lines are kept
        out.append(printed[i])
    if shown and shown[-1].strip() == ELLIPSIS:
        out.append(ELLIPSIS)
    return out


def run(block: doccommands.Block, scratch: Path, timeout: int, cores: str = "") -> tuple[str | None, str]:
    """(None or why it failed, its output). `cores`: the CPU list its processes are held to (taskset), if any."""
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{scratch / 'mlflow.db'}", PYTHONUNBUFFERED="1")
    held = ["taskset", "--cpu-list", cores] if cores else []
    try:
        done = subprocess.run(
            [*held, "bash", "-euo", "pipefail", "-c", block.text],
            cwd=scratch,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # interleaved, as a terminal shows them
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as err:
        return f"over {timeout} s", err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
    return (None if done.returncode == 0 else f"exit {done.returncode}"), done.stdout


def check_page(page: Path, blocks: list[doccommands.Block], write: bool, timeout: int, cores: str) -> int:
    """Run a page's runnable blocks in order in a scratch checkout of its own, check each one's shown output (and
    with `write`, rewrite it): how many failed. Each block's verdict is printed as one line when it ends."""
    scratch = scratch_checkout()
    failed = 0
    rewrites: list[tuple[doccommands.Block, list[str]]] = []
    try:
        for n, block in enumerate(blocks):
            if not block.runnable:
                continue
            start = time.monotonic()
            why, output = run(block, scratch, timeout, cores)
            printed = as_reader(output, scratch)
            shown_block = blocks[n + 1] if n + 1 < len(blocks) and blocks[n + 1].output else None
            if why is None and shown_block is not None:
                shown = shown_block.text.splitlines()
                found, missing = match(shown, printed)
                if not shown:  # a new excerpt: all of it, for the writer to cut down to what matters
                    found = list(range(len(printed)))
                if not shown and not write:
                    why = f"{shown_block.where} shows no output: run python -m scripts.check_docs write=true"
                elif missing:
                    why = (
                        f"its output no longer shows {len(missing)} of the lines {shown_block.where} shows, "
                        f"first: {missing[0].strip()[:160]!r}"
                    )
                elif write:
                    rewrites.append((shown_block, excerpt(shown, printed, found)))
            took = time.monotonic() - start
            verdict = f"{block.where}: {'ok' if why is None else 'FAILED: ' + why} in {took:.0f} s"
            if why is not None:
                failed += 1
                verdict += "\n" + "\n".join(printed[-40:])  # one write: the other lane prints too
            print(verdict, file=sys.stderr if why else sys.stdout, flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if rewrites:
        lines = page.read_text().splitlines()
        for shown_block, new in sorted(rewrites, key=lambda r: -r[0].line):
            lines[shown_block.line : shown_block.end - 1] = new
        page.write_text("\n".join(lines) + "\n")
        print(f"{page.relative_to(PROJECT_ROOT)}: {len(rewrites)} output excerpt(s) rewritten", flush=True)
    return failed


def lane_cores(lanes: int) -> list[str]:
    """Each lane's CPU list for taskset: this process's cores dealt out round-robin ('' for one lane: no hold)."""
    cores = sorted(os.sched_getaffinity(0))
    lanes = max(1, min(lanes, len(cores)))
    if lanes == 1:
        return [""]
    return [",".join(str(c) for c in cores[i::lanes]) for i in range(lanes)]


def main(argv: list[str]) -> int:
    args, _ = bench.parse(COMMAND, argv)
    pages = [
        (page, doccommands.blocks(page))
        for page in doccommands.pages()
        if str(page.relative_to(PROJECT_ROOT)).startswith(args.only)
    ]
    count = sum(b.runnable for _, blocks in pages for b in blocks)
    if args.list:
        for _, blocks in pages:
            for b in blocks:
                if b.runnable:
                    print(f"{b.where}: {b.text.splitlines()[0]}")
        return 0
    todo = [(page, blocks) for page, blocks in pages if any(b.runnable for b in blocks)]
    failures: list[int] = []
    taken = threading.Lock()

    def lane(cores: str) -> None:  # takes the next page, in page order, until none is left
        while True:
            with taken:
                if not todo:
                    return
                page, blocks = todo.pop(0)
            try:
                failures.append(check_page(page, blocks, args.write, args.timeout, cores))
            except Exception as err:  # noqa: BLE001 - the page's blocks count as failed, the other pages go on
                print(f"{page.relative_to(PROJECT_ROOT)}: FAILED: {type(err).__name__}: {err}", file=sys.stderr)
                failures.append(sum(b.runnable for b in blocks))

    threads = [threading.Thread(target=lane, args=(cores,)) for cores in lane_cores(args.lanes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    failed = sum(failures)
    print(f"check_docs: {count - failed} of {count} runnable blocks ran and printed what their pages show")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
