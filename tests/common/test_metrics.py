"""The seed tables' arithmetic (docs/concepts/measured.md)."""

import math

import pytest

from src.common.metrics import Row, markdown_table, rows_csv, seed_table, summarize, timing_row


def test_timing_row_follows_the_definitions():
    # start at 10 s, first token at 10.25 s, generate returns at 12.25 s with 11 new tokens
    row = timing_row(3, 17, start=10.0, first_token=10.25, end=12.25, new_tokens=11)
    assert row.prefill_ms == pytest.approx(250.0)
    assert row.total_time_s == pytest.approx(2.25)
    assert row.time_per_token_ms == pytest.approx(200.0)  # (2.25 - 0.25) s / 10
    assert row.tokens_per_s == pytest.approx(5.0)  # 1000 / 200
    assert (row.example, row.prompt_tokens, row.new_tokens) == (3, 17, 11)


def test_single_token_has_no_decode_time():
    row = timing_row(1, 5, 0.0, 0.1, 0.1, 1)
    assert math.isnan(row.time_per_token_ms) and math.isnan(row.tokens_per_s)
    assert row.prefill_ms == pytest.approx(100.0)


def test_no_token_is_an_error():
    with pytest.raises(ValueError):
        timing_row(1, 5, 0.0, 0.1, 0.1, 0)


def test_summary_medians_skip_nan():
    rows = [timing_row(i, 4, 0.0, p, p + 0.1 * 9, 10) for i, p in enumerate([0.1, 0.3, 0.2], 1)]
    rows.append(timing_row(4, 4, 0.0, 0.9, 0.9, 1))
    s = summarize(rows)
    assert s["prefill_ms_median"] == pytest.approx(250.0)  # median of 100, 300, 200, 900
    assert s["time_per_token_ms_median"] == pytest.approx(100.0)
    assert s["tokens_per_s_median"] == pytest.approx(10.0)
    assert s["examples"] == 4 and s["new_tokens_total"] == 31


def test_seed_table_has_the_seed_columns():
    table = seed_table([Row(1, 8, 30, 24.9415, 1003.36, 824.246, 1.21323)])
    header = table.splitlines()[0]
    for col in (
        "Example#",
        "Prompt Length (tokens)",
        "New Tokens Generated",
        "Total Time (s)",
        "Prefill Phase (ms)",
        "Time/Token (ms)",
        "Tokens/Sec",
    ):
        assert col in header
    assert "824.246" in table and table.splitlines()[1].startswith("|---")


def test_csv_and_markdown_shapes():
    rows = [Row(1, 8, 30, 1.0, 2.0, 3.0, 4.0), Row(2, 9, 30, 1.5, 2.5, 3.5, float("nan"))]
    lines = rows_csv(rows).splitlines()
    assert lines[0] == "example,prompt_tokens,new_tokens,total_time_s,prefill_ms,time_per_token_ms,tokens_per_s"
    assert lines[2].endswith(",nan")
    assert markdown_table(["a", "bb"], [[1, 2.5]]).splitlines()[2] == "| 1 | 2.5 |"
