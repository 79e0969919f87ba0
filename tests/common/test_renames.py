"""One name per idea: the old spellings of a precision's fields and of the C++ step path are refused in one line
naming the new one (on the command line and in a YAML of one's own), and runs recorded under them read back under
today's names, so a regression or a resumed sweep matches them to runs recorded after."""

from __future__ import annotations

import shutil

import pytest
from mlflow.tracking import MlflowClient

from src.assembly.overrides import CONF_DIR, composition_problem
from src.common import renames
from src.tracking.readback.regression.judge import identity
from src.tracking.readback.sweeps import JobRecord
from src.tracking.sweep.record import CONFIG_HASH, _changed

OLD = {
    "precision.scheme": "w4a16",
    "precision.head_scheme": "w5a16",
    "precision.int8_linears": "['mlp.down_proj']",
    "precision.int8_linears_scheme": "w5a16",
    "draft.precision.scheme": "w8a8",
    "engine.step_path": "quantspec",
    "executed.step_path": "quantspec",
    "task.limit": "2",
}
NEW = {
    "precision.format": "w4a16",
    "precision.head_format": "w5a16",
    "precision.wide_linears": "['mlp.down_proj']",
    "precision.wide_format": "w5a16",
    "draft.precision.format": "w8a8",
    "engine.step_path": "cpp",
    "executed.step_path": "cpp",
    "task.limit": "2",
}


def test_recorded_params_read_under_todays_names():
    assert renames.current(OLD) == NEW
    assert renames.current(NEW) == NEW
    # a key recorded under both names keeps the new one's value
    assert renames.current({"precision.scheme": "w8a8", "precision.format": "w4a16"}) == {"precision.format": "w4a16"}


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["precision=w4a16", "precision.scheme=w8a8"],
            "precision.scheme is now precision.format: say precision.format=w8a8",
        ),
        (
            ["precision.int8_linears=[]"],
            "precision.int8_linears is now precision.wide_linears: say precision.wide_linears=[]",
        ),
        (["precision.head_scheme=null"], "precision.head_scheme is now precision.head_format"),
        (["precision.int8_linears_scheme=w6a16"], "precision.int8_linears_scheme is now precision.wide_format"),
        (["draft=self_w4a16", "draft.precision.scheme=w8a8"], "draft.precision.scheme is now draft.precision.format"),
        # in a sweep, at any of its values
        (["engine.step_path=python,quantspec"], "engine.step_path=quantspec is now engine.step_path=cpp"),
    ],
)
def test_an_old_spelling_on_the_command_line_is_refused_naming_the_new_one(args, line):
    said = composition_problem(args)
    assert said is not None and said.startswith(line), said
    assert "\n" not in said


def test_the_new_spellings_compose():
    assert composition_problem(["precision=w4a16", "precision.format=w4a16", "precision.wide_linears=[]"]) is None
    assert composition_problem(["engine.step_path=cpp,python,static,transformers"]) is None


def test_a_precision_yaml_of_ones_own_with_an_old_field_is_refused_naming_the_new_one(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    (conf / "precision" / "mine.yaml").write_text(
        "defaults:\n  - _fields\n  - _self_\n\nname: mine\ndtype: bfloat16\nmethod: rtn\nscheme: w4a16\ngroup_size: 128\n"
    )
    said = composition_problem(["--config-path", str(conf), "precision=mine"])
    assert said == "precision.scheme is now precision.format (in the precision entry's YAML)", said


def test_a_run_recorded_under_the_old_names_reads_as_one_recorded_under_the_new(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    experiment = client.create_experiment("quantspec")
    for params in (OLD, NEW):
        run = client.create_run(experiment)
        for key, value in params.items():
            client.log_param(run.info.run_id, key, value)
    old, new = (JobRecord.of(client.get_run(r.info.run_id)) for r in client.search_runs([experiment])[::-1])
    assert old.params == new.params == NEW
    assert identity(old.params) == identity(new.params)  # a regression matches the two


def test_a_resumed_sweep_keeps_a_job_finished_under_the_old_names():
    # the config hash moved with the names; the config did not
    old, new = {**OLD, CONFIG_HASH: "before"}, {**NEW, CONFIG_HASH: "after"}
    assert _changed(old, new) == ""
    moved = {**new, "task.limit": "3"}
    assert _changed(old, moved) == "task.limit: 2 -> 3"
