"""What each read-back command (python -m src.report, python -m src.regress) does before its work: --help,
its settings and the environment checked, its store found and its `out` folder writable, each failure one line
and exit 2."""

from __future__ import annotations

from collections.abc import Callable

from src.common import envvars
from src.common.environment import PROJECT_ROOT
from src.common.paths import unwritable
from src.common.say import say
from src.common.settings import SettingError
from src.tracking.store.experiment import store_problem
from src.tracking.store.names import default_uri


def start(argv: list[str], usage: Callable[[], str], settings: Callable[[list[str]], dict]) -> tuple[dict, str] | int:
    """(the settings, the store's uri), or the exit code where the command ends here (0 after --help)."""
    if {"-h", "--help"} & set(argv):
        print(usage())
        return 0
    try:
        envvars.check()
        cfg = settings(argv)
    except (SettingError, envvars.EnvError) as err:
        say(str(err), err=True)
        return 2
    uri = cfg["tracking.uri"] or default_uri()
    # the out folder said before the store is read: a traceback at the end had lost the work
    for line in (store_problem(uri), unwritable(PROJECT_ROOT / cfg["out"], f"out={cfg['out']}")):
        if line is not None:
            say(line, err=True)
            return 2
    return cfg, uri
