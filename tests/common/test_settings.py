"""One name per option across quantspec's commands: src.run's (Hydra's config) is the shared spelling, and every
other command takes it; an old spelling is refused in one line naming the new."""

import importlib
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from src.assembly.overrides import CONF_DIR
from src.common.settings import RENAMED, Command, Setting, SettingError
from src.tracking.readback.regression import cli as regress_cli
from src.tracking.store import sync

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.stem for p in (ROOT / "scripts").glob("*.py") if p.stem != "__init__")


def _commands() -> dict[str, Command]:
    found = {
        "src.report": importlib.import_module("src.tracking.readback.reporting.settings").command("report"),
        "src.regress": regress_cli.COMMAND,
        "src.sync": sync.COMMAND,
    }
    for name in SCRIPTS:
        command = getattr(importlib.import_module(f"scripts.{name}"), "COMMAND", None)
        if isinstance(command, Command):
            found[f"scripts.{name}"] = command
    return found


def _run_names() -> set[str]:
    """src.run's settings as dotted names (tracking.uri, task.limit, ...), from its composed default config."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = OmegaConf.to_container(compose("config"), resolve=False)
    return {f"{group}.{key}" for group, fields in cfg.items() if isinstance(fields, dict) for key in fields}


def test_every_command_spells_its_settings_as_src_run_does():
    commands = _commands()
    assert {"src.report", "src.regress", "src.sync", "scripts.bench_serve"} <= set(commands)
    run_names = _run_names()
    groups = {name.partition(".")[0] for name in run_names}
    assert "tracking.uri" in run_names and {"tracking", "task", "model"} <= groups
    for where, command in commands.items():
        for setting in command.settings:
            renamed = {**RENAMED, **command.renamed}
            assert setting.name not in renamed, f"{where} still takes {setting.name}= (now {renamed[setting.name][0]}=)"
            group = setting.name.partition(".")[0]
            if "." in setting.name and group in groups:  # under one of src.run's groups: as src.run spells it
                assert setting.name in run_names, f"{where}'s {setting.name}= is not src.run's"
    stores = {where for where, c in commands.items() for s in c.settings if s.name == "tracking.uri"}
    assert {"src.report", "src.regress", "src.sync"} <= stores


@pytest.mark.parametrize("where", ["src.report", "src.regress", "src.sync"])
def test_an_old_spelling_is_refused_in_one_line_naming_the_new(where):
    command = _commands()[where]
    with pytest.raises(SettingError, match=r"^tracking_uri= is now tracking\.uri= \(as python -m src\.run spells it\)"):
        command.parse(["tracking_uri=sqlite:///x.db"])
    values, _ = command.parse(["tracking.uri=sqlite:///x.db"])
    assert values["tracking.uri"] in ("sqlite:///x.db", ("sqlite:///x.db",))


def test_baseline_means_one_thing_the_job_a_speedup_is_over():
    """report's baseline.<axis>= names the job each speedup is over; regress's old sweep is against=, and its old
    spelling baseline= is refused naming both."""
    commands = _commands()
    takes = {where: s for where, c in commands.items() for s in c.settings if s.name == "baseline"}
    assert "src.report" in takes and "src.regress" not in takes
    for where, setting in takes.items():
        assert isinstance(setting.default, dict), f"{where}'s baseline= is not a choice per axis"
    regress = commands["src.regress"]
    with pytest.raises(
        SettingError, match=r"^baseline= is now against= \(the old sweep; baseline\.<axis>= is src\.report"
    ):
        regress.parse(["baseline=multirun/a"])
    assert regress.parse(["against=multirun/a"])[0]["against"] == "multirun/a"


@pytest.mark.parametrize("length", [38, 40, 41, 42, 50])
def test_help_keeps_every_default_apart_from_its_meaning(length):
    """A default as long as the column (a list of models) was printed run into its meaning: `...opt-6.7bthe`."""
    default = "x" * (length - len("name="))
    command = Command("demo", "Demo.", [Setting("name", default, "the meaning"), Setting("k", 1, "short")])
    lines = command.usage().splitlines()
    at = next(i for i, line in enumerate(lines) if f"name={default}" in line)
    same_line = lines[at].split(f"name={default}", 1)[1]
    assert same_line == "" or same_line.startswith("  "), lines[at]
    assert any("the meaning" in line for line in lines[at : at + 2])
