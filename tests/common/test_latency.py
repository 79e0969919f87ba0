"""Every token's time (src.common.latency): from a generation's readings to TTFT, ITL and TPOT, their
percentiles, and the artifact that keeps every gap."""

import json
import math

import pytest

from src.common import latency


def test_readings_become_the_first_token_s_time_and_the_gaps_after_it():
    t = latency.token_times(3, 10.0, [10.25, 10.26, 10.28, 10.31])
    assert t.example == 3 and t.ttft_ms == pytest.approx(250)
    assert t.itl_ms == pytest.approx((10, 20, 30)) and t.tpot_ms == pytest.approx(20)
    one = latency.token_times(1, 0.0, [0.5])  # one token: no gap, no TPOT (NaN, not 0)
    assert one.itl_ms == () and math.isnan(one.tpot_ms)
    with pytest.raises(ValueError):
        latency.token_times(1, 0.0, [])


def test_percentiles_interpolate_between_ranks_over_the_finite_values():
    values = [float(v) for v in range(1, 11)]  # 1..10
    s = latency.stats("itl_ms", [*values, math.nan])
    assert s["itl_ms_p50"] == pytest.approx(5.5) and s["itl_ms_p90"] == pytest.approx(9.1)
    assert s["itl_ms_p99"] == pytest.approx(9.91) and s["itl_ms_max"] == 10 and s["itl_ms_mean"] == 5.5
    assert latency.stats("itl_ms", [math.nan]) == {}  # nothing measured: nothing logged


def test_the_summary_takes_ttft_and_tpot_per_example_and_itl_over_every_gap():
    a = latency.token_times(1, 0.0, [0.1, 0.101, 0.102])  # gaps 1, 1 ms
    b = latency.token_times(2, 0.0, [0.3, 0.31])  # one gap of 10 ms
    s = latency.summary([a, b])
    assert s["ttft_ms_max"] == pytest.approx(300) and s["ttft_ms_p50"] == pytest.approx(200)
    assert s["tpot_ms_p50"] == pytest.approx(5.5)  # the examples' means: 1 and 10
    assert s["itl_ms_p50"] == pytest.approx(1) and s["itl_ms_max"] == pytest.approx(10)  # the gaps: 1, 1, 10
    assert set(s) == {f"{f}_{stat}" for f in latency.FIGURES for stat in latency.STATS}
    lines = [json.loads(line) for line in latency.jsonl([a, b]).splitlines()]
    assert lines[1] == {"example": 2, "ttft_ms": 300.0, "itl_ms": [10.0]}
