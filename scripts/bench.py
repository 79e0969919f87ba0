"""What every benchmark script shares (importing no torch: a script may set its libraries' ISA first): its command line (settings as key=value, the convention of quantspec's
commands, src.common.settings; the rest passed to src.run as Hydra overrides), the sweep it runs and reads back
from its store, and where its table goes (reports/ and, with doc=true, the docs' benchmark page)."""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from src.common import benchpage
from src.common.environment import PROJECT_ROOT, git_commit
from src.common.say import say
from src.common.settings import Command, Setting, SettingError
from src.tracking.readback.compare import busy, quiet, round_of
from src.tracking.readback.sweeps import JobRecord, sweep_jobs
from src.tracking.store.names import default_uri

DOC = Setting(
    "doc", False, "also append the result to the docs' benchmark page (docs/benchmarks/results/)", purpose="the result"
)


def command(module: str, doc: str, settings: list[Setting], takes: str = "overrides") -> Command:
    """A script's command: its own settings, doc=, and (takes="overrides") src.run's overrides after them."""
    return Command(f"python -m scripts.{module}", doc, [*settings, DOC], takes)


def parse(cmd: Command, argv: list[str]) -> tuple[SimpleNamespace, list[str]]:
    """The script's settings (as attributes) and the rest; --help prints its usage and exits 0, a bad setting
    is one line and exit 2."""
    if {"-h", "--help"} & set(argv):
        print(cmd.usage())
        sys.exit(0)
    try:
        values, rest = cmd.parse(argv)
    except SettingError as err:
        say(str(err), err=True)
        sys.exit(2)
    if values.get("doc") and git_commit().endswith("-dirty"):  # said before the measuring, not after it
        say(
            "doc=true records on the docs' benchmark pages only what a commit holds, and this tree has uncommitted "
            "changes: commit or stash them first (git status), or run without doc=true",
            err=True,
        )
        sys.exit(2)
    return SimpleNamespace(**{k.replace(".", "_"): v for k, v in values.items()}), rest


@dataclass
class Sweep:
    """A sweep a script ran with src.run, read back from its store."""

    dir: Path
    args: list[str]  # src.run's arguments, as run
    returncode: int
    jobs: list[JobRecord] = field(default_factory=list)
    uri: str = ""  # the store its jobs were read back from

    @property
    def finished(self) -> list[JobRecord]:
        return [j for j in self.jobs if j.tags.get("outcome") == "finished"]

    @property
    def rounds(self) -> int | None:
        """The rounds its command asked for (`rounds=3`), or None: one run, as the pages say."""
        asked = [a.split("=", 1)[1] for a in self.args if a.startswith("rounds=")]
        return int(asked[-1]) if asked and asked[-1].isdigit() else None

    @property
    def measured_rounds(self) -> int:
        """The rounds it measured: those asked for and any busy round measured again."""
        return max((round_of(j) for j in self.finished), default=0)

    @property
    def load(self) -> str:
        """What else ran, as the jobs' host_busy tags say; empty where every job was timed quiet."""
        timed_busy = [j for j in self.finished if busy(j)]
        if not timed_busy:
            return ""
        return (
            f"{len(timed_busy)} of {len(self.finished)} job runs timed while other processes used the CPU (host_busy), "
            f"left out where a quiet round of the same job remains; {self.measured_rounds} rounds measured"
        )

    def by(self, *groups: str) -> dict[tuple, dict[str, float]]:
        """Each configuration's figures (keyed by its choices of `groups`): each metric the median over the
        configuration's quiet rounds, over all of them where every round was busy."""
        return self.by_key(lambda job: tuple(job.choice(g) for g in groups))

    def by_key(self, key: Callable[[JobRecord], tuple]) -> dict[tuple, dict[str, float]]:
        """by(), each configuration keyed by `key(job)` (a param, a tag that is no axis)."""
        runs: dict[tuple, list[JobRecord]] = {}
        for job in self.finished:
            runs.setdefault(key(job), []).append(job)
        out = {}
        for key, jobs in runs.items():
            used = quiet(jobs)
            names = {name for j in used for name in j.metrics}
            out[key] = {name: statistics.median(j.metrics[name] for j in used if name in j.metrics) for name in names}
        return out

    @property
    def command(self) -> str:
        """How a user reruns it (the sweep directory left out)."""
        return "python -m src.run " + " ".join(a for a in self.args if not a.startswith("hydra.sweep.dir="))

    def publish(self, doc: bool, page: str, title: str, text: str, about: str) -> None:
        """publish() of this sweep's result: kept under reports/ by the sweep's name, its rounds and load on the page."""
        publish(doc, page, title, text, about, self.dir.name, rounds=self.rounds, load=self.load)


def run_sweep(name: str, args: list[str], **run) -> Sweep | None:
    """`python -m src.run -m <args>` into multirun/bench-<name>-<time>/, its jobs read back from the store the
    args name (tracking.uri=) or the default one. None where src.run refused the command line (exit 2, said)."""
    uri = next((a.split("=", 1)[1] for a in args if a.startswith("tracking.uri=")), default_uri())
    sweep_dir = PROJECT_ROOT / "multirun" / stamp(name)
    argv = ["-m", *args, f"hydra.sweep.dir={sweep_dir}"]
    print("running: -m src.run", " ".join(argv), flush=True)
    done = subprocess.run([sys.executable, "-m", "src.run", *argv], cwd=PROJECT_ROOT, **run)
    if done.returncode == 2:  # the command line refused, in one line: no sweep to read back
        return None
    _, jobs = sweep_jobs(uri, sweep_id=str(sweep_dir.resolve()))
    return Sweep(sweep_dir, argv, done.returncode, jobs, uri)


def publish(doc: bool, page: str, title: str, text: str, about: str, name: str, **entry) -> None:
    """The result printed, kept under reports/<name>.md (`about` above it: how it was measured), and with
    doc=true appended to the docs' benchmark page `page`. `entry`: rounds= and load= for that page."""
    print("\n" + text)
    benchpage.save_markdown(name, f"{about}\n\n{text}\n")
    benchpage.record(doc, page, title, f"{about}\n\n{text}", **entry)


def every_precision() -> tuple[str, ...]:
    """Every precision conf/precision/ holds: the floats first (fp32, the reference, then bf16), then the formats
    from the most bits to the fewest (weights, then activations), then the rest by name."""
    names = [p.stem for p in (PROJECT_ROOT / "conf" / "precision").glob("*.yaml") if not p.stem.startswith("_")]

    def order(name: str) -> tuple:
        found = re.fullmatch(r"w(\d+)a(\d+)", name)
        floats = {"fp32": 0, "bf16": 1}
        if name in floats:
            return (0, floats[name], 0, name)
        return (1, -int(found[1]), -int(found[2]), name) if found else (2, 0, 0, name)

    return tuple(sorted(names, key=order))


def whole_numbers(setting: str, values) -> list[int]:
    """A setting's values as whole numbers, or exit 2 after saying so in one line."""
    try:
        return [int(v) for v in values]
    except ValueError:
        say(f"{setting}={','.join(map(str, values))} must be whole numbers", err=True)
        sys.exit(2)


def stamp(name: str) -> str:
    """A report's file name: bench-<name>-<date>_<time>."""
    return f"bench-{name}-{time.strftime('%Y-%m-%d_%H-%M-%S')}"


def median_time(fn, n: int) -> float:
    """The median wall time of `n` calls of fn, in seconds (three warm-up calls first)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
