"""The docs stay true to the code: every `python -m src.run` command the README and docs/ show composes into a
valid job config (its choices, fields and values), every report command's settings exist, and the blocks
marked runnable are found (scripts/check_docs.py runs them in CI)."""

import json
import re
import shutil

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from scripts import check_docs, headline
from src.assembly.config import ConfigError, job_config_from_dict
from src.assembly.overrides import composition_problem, unparsable
from src.common import doccommands
from src.tracking.readback import reporting as report
from tests.support.cli import compose_job

# What a reader fills in, and the value the check fills in for it: a command with one is checked with that value.
FILLS = [
    (re.compile(r"<[^>]*>"), "example"),  # <earlier-sweep>
    (re.compile(r"\bHEAD\b"), "127.0.0.1"),  # the head node's address (tracking.uri=http://HEAD:5000)
]
OPTIONAL = re.compile(r"^\[.*\]$")  # [sweep=<new-sweep>]: a setting a reader may leave out


def _filled(args: list[str]) -> list[str]:
    out = []
    for arg in args:
        if OPTIONAL.match(arg):
            arg = arg[1:-1]
        for pattern, value in FILLS:
            arg = pattern.sub(value, arg)
        out.append(arg)
    return out


# Hydra's own settings and the sweep's: they do not compose into a job
NOT_JOB = ("hydra.", "hydra/", "+hydra", "tracking.uri=", "rounds=", "busy_reruns=", "report_at_end=", "resume=")


# every command the docs show, with where: the pages read once for every module's commands below
SHOWN = [
    (block.where, words)
    for page in doccommands.pages()
    for block in doccommands.blocks(page)
    for words in doccommands.commands(block.text)
]


def _documented(module: str):
    for where, words in SHOWN:
        args = doccommands.module_args(words, module)
        if args is not None:  # every one, its placeholders filled in as a reader would
            args = _filled(args)
            yield pytest.param(where, args, id=f"{where}:{' '.join(args)[:60]}")


def _first_of_each_sweep(args: list[str]) -> list[str]:
    """One job of a sweep: the first value of each swept override."""
    parser = OverridesParser.create()
    out = []
    for arg in args:
        override = parser.parse_override(arg)
        if override.is_sweep_override():
            value = next(iter(override.sweep_string_iterator()))
            out.append(f"{override.get_key_element()}={value}")
        else:
            out.append(arg)
    return out


RUN_COMMANDS = list(_documented("src.run"))


def test_the_docs_show_commands_to_check():
    assert len(RUN_COMMANDS) >= 15
    runnable = [b for p in doccommands.pages() for b in doccommands.blocks(p) if b.runnable]
    assert len(runnable) >= 3 and all("python" in b.text for b in runnable)


@pytest.mark.parametrize("where, args", RUN_COMMANDS)
def test_every_documented_run_command_composes_a_valid_job(where, args):
    args = [a for a in args if a not in ("-m", "--multirun")]
    for check in (unparsable, composition_problem):
        assert check(args) is None, f"{where}: {check(args)}"
    job_args = [a for a in _first_of_each_sweep(args) if not a.startswith(NOT_JOB)]
    raw, _ = compose_job(job_args)
    if raw["model"]["arch"] == "auto":  # the reader's own model (model=hub, model=gguf) is not here: a family stands in
        raw["model"] = {**raw["model"], "arch": "llama", "model_type": "llama"}
    try:
        job_config_from_dict(raw)
    except ConfigError as err:
        pytest.fail(f"{where}: python -m src.run {' '.join(args)}: {err}")


@pytest.mark.parametrize("where, args", list(_documented("src.report")))
def test_every_documented_report_command_has_real_settings(where, args):
    args = [a for a in args if a not in ("--help", "-h")]
    report.settings(args)  # a setting the report lacks raises SettingError


def test_blocks_and_commands_are_read_as_a_reader_sees_them(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "Text\n\n    .venv/bin/python -m src.run -m precision=fp32,bf16 \\\n        task.limit=2   # two\n\n"
        "<!-- runnable -->\n```bash\nA=1 .venv/bin/python -m src.run model=tiny-llama\n```\n"
    )
    first, second = doccommands.blocks(page)
    assert not first.runnable and second.runnable
    words = doccommands.commands(first.text)[0]
    assert doccommands.module_args(words, "src.run") == ["-m", "precision=fp32,bf16", "task.limit=2"]
    assert doccommands.module_args(doccommands.commands(second.text)[0], "src.run") == ["model=tiny-llama"]


def test_the_readmes_links_reach_files_in_the_repository():
    text = (doccommands.PROJECT_ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert local and [link for link in local if not (doccommands.PROJECT_ROOT / link).exists()] == []


@pytest.mark.parametrize("where, args", list(_documented("src.regress")))
def test_every_documented_regress_command_has_real_settings(where, args):
    from src.tracking.readback import regression as regress

    regress.settings([a for a in args if a not in ("--help", "-h")])  # SettingError for one it lacks


@pytest.mark.parametrize("where, args", list(_documented("src.sync")))
def test_every_documented_sync_command_has_real_settings(where, args):
    from src.tracking.store import sync

    sync.COMMAND.parse([a for a in args if a not in ("--help", "-h")])  # SettingError for one it lacks


def test_a_placeholder_is_filled_as_a_reader_fills_it():
    assert _filled(["baseline=<earlier-sweep>", "[sweep=<new-sweep>]", "tracking.uri=http://HEAD:5000"]) == [
        "baseline=example",
        "sweep=example",
        "tracking.uri=http://127.0.0.1:5000",
    ]


def test_shown_output_is_compared_without_what_changes_from_run_to_run():
    page = [
        "[2026-11-28 00:12:38,371][HYDRA] round 1 of 3: 4 jobs",
        "| [1 round] tiny-llama·cpu·w8a8·none·decode | host CPU (Intel(R) Xeon(R) Processor) | quantspec/avx512 | 1.76 | - |",
        "quantspec: compare the sweep in the MLflow UI: /quantspec/view/1/be0c7c3e6c374dbd7fe4f986",
    ]
    printed = [
        "[2026-12-01 09:00:00,001][HYDRA] round 1 of 3: 4 jobs",
        "measuring round 4 (1 of at most 2 more)",
        "| [⚠ BUSY, 2 rounds] tiny-llama·cpu·w8a8·none·decode | host CPU (AMD EPYC 9R14) | quantspec/avx2 | 0.93 | 1 |",
        "quantspec: compare the sweep in the MLflow UI: /quantspec/view/1/0123456789abcdef01234567",
    ]
    assert check_docs.match(page, printed) == ([0, 2, 3], [])
    # words are compared: a renamed precision, a changed message, a lost column
    for old, new in (("w8a8", "w8a16"), ("4 jobs", "4 runs"), ("| 0.93 | 1 |", "| 0.93 |")):
        assert check_docs.match(page, [line.replace(old, new) for line in printed])[1], new


def test_the_quality_mark_follows_the_figures_and_is_not_compared():
    # a tiny random model's w4a16 sits near the 0.99 floor: the host's sum order moves it across
    page = [
        "| tiny-llama·cpu·w4a16·none·perplexity | 0.341 ± 0.0043 |        0.9952 |",
        "| ★ tiny-llama·cpu·w4a16·none | 3.1 |",
    ]
    printed = [
        "| tiny-llama·cpu·w4a16·none·perplexity | 0.342 ± 0.0043 |      0.9884 ⚠ |",
        "| ★ \\[⚠ QUALITY 0.988 of fp32\\] tiny-llama·cpu·w4a16·none | 3.4 |",
    ]
    assert check_docs.match(page, printed) == ([0, 1], [])
    assert check_docs.match(page, [line.replace("w4a16", "w8a8") for line in printed])[1]


def test_an_excerpt_matches_in_any_order_and_is_rewritten_in_the_order_printed():
    printed = ["a 1", "", "b 2", "c 3", "d 4"]
    shown = ["...", "d 9", "a 7", "b 8"]
    found, missing = check_docs.match(shown, printed)
    assert (found, missing) == ([0, 2, 4], [])
    assert check_docs.excerpt(shown, printed, found) == ["...", "a 1", "", "b 2", "...", "d 4"]
    assert check_docs.match(["e 1"], printed) == ([], ["e 1"])


def test_a_runnable_block_runs_in_a_scratch_checkout_with_a_store_of_its_own(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        '<!-- runnable -->\n```bash\necho "$MLFLOW_TRACKING_URI"; pwd; ls mlflow.db 2>&1 || true\n```\n\n'
        "<!-- output -->\n```text\n```\n"
    )
    block, shown = doccommands.blocks(page)
    assert block.runnable and shown.output and not shown.runnable
    scratch = check_docs.scratch_checkout()
    try:
        why, output = check_docs.run(block, scratch, timeout=30)
        lines = check_docs.as_reader(output, scratch)
    finally:
        shutil.rmtree(scratch)
    assert why is None
    assert lines[:2] == ["sqlite:////home/you/quantspec/mlflow.db", "/home/you/quantspec"]
    assert "No such file" in lines[2]  # the project's own store is not linked in


def test_the_headline_shows_three_significant_figures_and_leaves_other_cells_as_they_are():
    cells = ["9.69921", "0.442587", "21.9148", "9.99562", "1", "-", "llama.cpp 0.3.36"]
    assert [headline.significant(c) for c in cells] == ["9.70", "0.443", "21.9", "10.0", "1", "-", "llama.cpp 0.3.36"]


def test_the_readmes_headline_is_the_benchmark_pages_latest_entry():
    """The README's table and picture are made from the page (python -m scripts.headline), so they cannot
    disagree with it: a newer entry on the page fails this until they are made again."""
    item = headline.entry()
    assert headline.readme_block(headline.README.read_text()) == headline.block(item, headline.seven_b())
    assert json.loads(headline.SOURCE.read_text()) == headline.source(item)
    assert headline.PICTURE.exists() and "(docs/headline.png)" in headline.README.read_text()
    names = [name for name, *_ in headline.rows(item)]
    assert any(name.startswith("llama.cpp") for name in names) and any(name.startswith("quantspec") for name in names)


def _hook(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, doccommands.PROJECT_ROOT / "docs" / "hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_command_reference_gives_every_setting_grouped_by_purpose():
    from src.tracking.readback.regression import COMMAND

    cliref = _hook("cliref")
    page = "\n".join(cliref._section("src.regress", ""))
    for setting in COMMAND.settings:
        assert f"| `{setting.name}` |" in page, setting.name
    for purpose in ("**Which sweeps**", "**The verdict**", "**The gate (its exit code)**", "**What it writes**"):
        assert purpose in page
    assert "| `unjudged` | text | `fail` | `fail`, `pass` |" in page
    assert "../walk/5-regress.md" in page


def test_the_configuration_reference_gives_the_values_a_field_accepts():
    configref = _hook("configref")
    accepted = configref.accepted()
    assert accepted["engine.isa"][:2] == ("auto", "avx512") and "reference" in accepted["engine.isa"]
    assert set(accepted["precision.format"]) >= {"w8a8", "w8a16", "w4a16", "w4a8"}
    assert "`str`: one of `sdpa`, `eager`" in configref._type_cell("engine.attention", "str")


def _documented_scripts():
    scripts = sorted(p.stem for p in (doccommands.PROJECT_ROOT / "scripts").glob("*.py") if p.stem != "__init__")
    for name in scripts:
        for param in _documented(f"scripts.{name}"):
            yield pytest.param(name, *param.values, id=f"{name}:{param.id}")


SCRIPT_COMMANDS = list(_documented_scripts())


def test_the_docs_show_the_benchmark_scripts_commands():
    assert {name for name, *_ in (p.values for p in SCRIPT_COMMANDS)} >= {
        "bench_llamacpp",
        "bench_prefill",
        "bench_quant",
    }


@pytest.mark.parametrize("name, where, args", SCRIPT_COMMANDS)
def test_every_documented_script_command_has_real_settings(name, where, args):
    """A documented `python -m scripts.<name>` exists, its settings are its own, and what it passes on to
    src.run is Hydra's override syntax."""
    import importlib

    module = importlib.import_module(f"scripts.{name}")
    command = getattr(module, "COMMAND", None)
    args = [a for a in args if a not in ("--help", "-h")]
    if command is None:  # a script without settings (headline) takes none
        assert args == [], f"{where}: python -m scripts.{name} takes no arguments"
        return
    _, rest = command.parse(args)  # SettingError for a setting it lacks
    if command.takes == "overrides":
        assert unparsable(rest) is None, f"{where}: {unparsable(rest)}"
