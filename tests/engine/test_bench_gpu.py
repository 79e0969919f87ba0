"""scripts/bench_gpu's CPU smoke (what CI can run of it): every phase decodes the same tokens, every result is a
JSON line written as it comes, and a phase out of time or a run past its deadline is said, not silent."""

import json

from scripts import bench_gpu


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_cpu_smoke_decodes_every_phase_alike_and_writes_each_result(tmp_path, capsys):
    out = tmp_path / "bench.jsonl"
    args = ["device=cpu", "tiny=true", "precisions=fp32,w4a16", "phases=python,static,hf_eager", "rounds=2"]
    assert bench_gpu.main([*args, "prompt=24", "new=12", f"out={out}"]) == 0
    results = lines(out)
    assert results[0]["kind"] == "bandwidth" and results[0]["gbs"] > 0
    decoded = [r for r in results if r["kind"] == "decode"]
    # fp32: three phases, w4a16: two (transformers' phases are float only), two rounds each
    assert len(decoded) == 2 * (3 + 2) and all(r["ms_per_token"] > 0 and r["limit_ms"] > 0 for r in decoded)
    for precision in ("fp32", "w4a16"):
        assert len({tuple(r["tokens"]) for r in decoded if r["precision"] == precision}) == 1, precision
    table = capsys.readouterr().out
    assert "fp32       static" in table and "w4a16 tokens/s over bf16's" not in table  # no bf16 asked


def test_a_phase_out_of_time_and_a_run_past_its_deadline_are_said(tmp_path):
    out = tmp_path / "bench.jsonl"
    common = ["device=cpu", "tiny=true", "precisions=fp32", "new=8", "prompt=16", "rounds=1", f"out={out}"]
    assert bench_gpu.main([*common, "phases=static", "phase_s=0.000001"]) == 0
    assert lines(out)[-1] == {**lines(out)[-1], "kind": "skipped", "phase": "static", "why": "over 0 s"}
    assert bench_gpu.main([*common, "phases=python", "deadline=0"]) == 0
    assert lines(out)[-1]["kind"] == "skipped" and lines(out)[-1]["why"] == "deadline"


def test_a_bad_setting_is_one_line(capsys):
    assert bench_gpu.main(["phases=turbo"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "phases" in err
