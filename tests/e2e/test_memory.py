"""A job's peak memory against the estimate it was weighed by before loading: the peak is the process's own
(VmHWM from the job's start), which a job run inside a test process would share with every test before it, so
the job runs as a command of its own."""

from mlflow.tracking import MlflowClient

from tests.support.cli import fresh_cache, run_process


def test_a_random_weight_job_is_timed_tagged_and_its_peak_within_the_estimate(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    fresh_cache(tmp_path / "cache")  # the kernels built already: a build inside the job would be its peak
    out = run_process(
        [
            "model=llama-160m",
            "model.weights=random",
            "task=benchmark",
            "task.prompt_lengths=[8,32]",
            "task.max_new_tokens=4",
            "task.warmup=0",
            "precision=w8a16",
            "draft=self_w8a8",
            "draft.k=2",
            # SmoothQuant's calibration of 160M random bf16 weights at its defaults (16 x 256 tokens) took 57 s a
            # model here; what this checks (the flow, its tags, the peak against the estimate) needs few tokens
            "precision.calib_samples=2",
            "precision.calib_seq_len=64",
            "draft.precision.calib_samples=2",
            "draft.precision.calib_seq_len=64",
            f"tracking.uri={store}",
            f"cache_dir={tmp_path / 'cache'}",
        ]
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "random weights: acceptance_rate" in out.stdout + out.stderr
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("quantspec").experiment_id])
    assert run.data.tags["weights"] == "random"
    metrics = run.data.metrics
    assert metrics["time_per_token_ms_median"] > 0 and "draft_ms_per_step_overall" in metrics
    assert not any(k.startswith(("acceptance_rate", "speedup_vs_no_draft", "expected_speedup")) for k in metrics)
    assert 0 < metrics["peak_rss_gb"] <= metrics["memory_estimate_gb"]


def test_a_streamed_quantization_peaks_within_the_bound_its_memory_check_claims(tmp_path):
    """Quantizing random weights layer by layer (AWQ, then GPTQ on every linear, the head too), the process's peak
    stays under the estimate the memory check weighed it by (src.assembly.memory: the float parts outside the
    layers, one layer and the method's working set, then the quantized weights), which counts no float layer but
    the one being rounded. Qwen1.5-0.5B's shape: 0.6 GB of bf16 in its 24 layers, a 152k-row head."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    fresh_cache(tmp_path / "cache")
    out = run_process(
        [
            "model=Qwen1.5-0.5B-Chat",
            "model.weights=random",
            "task=quantize",
            "precision=w4a16",
            "precision.awq_grid=2",  # what this checks is memory: few trials, few windows
            "precision.calib_samples=2",
            "precision.calib_seq_len=64",
            f"tracking.uri={store}",
            f"cache_dir={tmp_path / 'cache'}",
        ]
    )
    assert out.returncode == 0, out.stderr[-2000:]
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("quantspec").experiment_id])
    metrics = run.data.metrics
    assert 0 < metrics["peak_rss_gb"] <= metrics["memory_estimate_gb"], metrics
