"""What every run records about where it ran."""

from src.common.environment import describe


def test_describe_names_the_machine_and_the_libraries():
    env = describe(2, "cpu")
    assert env["threads"] == 2 and env["device"] == "cpu"
    assert env["cpu_model"] and env["git_commit"]
    assert {"torch", "transformers", "mlflow"} <= set(env["versions"])
