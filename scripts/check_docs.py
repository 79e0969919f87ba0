"""Run the commands the docs mark runnable (`<!-- runnable -->` right above a fenced block), as a reader would:
each block in bash from the project's root, one line per block, exit 1 if any fails (with its output's end).

    .venv/bin/python -m scripts.check_docs            # every runnable block in README.md and docs/
    .venv/bin/python -m scripts.check_docs list=true  # which blocks, without running them

They run on tiny models in seconds, and write to the project's store (mlflow.db) as the reader's would. CI runs
this after `mkdocs build --strict`, so a renamed setting breaks the build instead of the reader.
"""

from __future__ import annotations

import subprocess
import sys
import time

from scripts import bench
from src.common import doccommands
from src.common.environment import PROJECT_ROOT
from src.common.settings import Command, Setting

COMMAND = Command(
    "python -m scripts.check_docs",
    __doc__,
    [
        Setting("list", False, "list the runnable blocks, run nothing"),
        Setting("timeout", 600, "seconds per block"),
    ],
)


def main(argv: list[str]) -> int:
    args, _ = bench.parse(COMMAND, argv)
    runnable = [b for page in doccommands.pages() for b in doccommands.blocks(page) if b.runnable]
    failed = 0
    for block in runnable:
        if args.list:
            print(f"{block.where}: {block.text.splitlines()[0]}")
            continue
        start = time.monotonic()
        try:
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", block.text],
                cwd=PROJECT_ROOT,
                capture_output=True,
                text=True,
                timeout=args.timeout,
            )
            ok, tail = done.returncode == 0, (done.stdout + done.stderr)[-2000:]
            why = f"exit {done.returncode}"
        except subprocess.TimeoutExpired:
            ok, tail, why = False, "", f"over {args.timeout} s"
        print(
            f"{block.where}: {'ok' if ok else 'FAILED (' + why + ')'} in {time.monotonic() - start:.0f} s", flush=True
        )
        if not ok:
            failed += 1
            print(tail, file=sys.stderr)
    if not args.list:
        print(f"check_docs: {len(runnable) - failed} of {len(runnable)} runnable blocks ran")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
