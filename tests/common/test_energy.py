"""Energy where the host can say it (src.common.energy): RAPL's package counters read around what is timed, a
counter's wrap taken into account; where there are none, nothing estimated and the reason said."""

from src.common.energy import Energy


def _domain(root, name: str, uj: int, max_uj: int = 1_000_000_000) -> None:
    d = root / name
    d.mkdir(parents=True)
    (d / "energy_uj").write_text(str(uj))
    (d / "max_energy_range_uj").write_text(str(max_uj))


def test_the_packages_energy_is_summed_and_a_counter_s_wrap_is_undone(tmp_path):
    """A powercap tree laid out as Linux lays it: two packages and a subdomain inside one (not counted twice)."""
    _domain(tmp_path, "intel-rapl:0", 5_000_000)
    _domain(tmp_path, "intel-rapl:0:0", 1_000_000)  # the cores of package 0: inside its count
    _domain(tmp_path, "intel-rapl:1", 999_000_000)
    with Energy(tmp_path) as e:
        (tmp_path / "intel-rapl:0" / "energy_uj").write_text("7000000")  # +2 J
        (tmp_path / "intel-rapl:0:0" / "energy_uj").write_text("9000000")
        (tmp_path / "intel-rapl:1" / "energy_uj").write_text("500000")  # wrapped at 1000 J: +1.5 J
    assert e.joules == 3.5 and e.why.startswith("RAPL, 2 package(s)")
    assert e.figures(7) == {"energy_j": 3.5, "energy_j_per_token": 0.5}


def test_a_host_without_counters_says_why_and_gives_no_figure(tmp_path):
    with Energy(tmp_path / "none") as e:
        pass
    assert e.joules is None and e.figures(10) == {} and e.why.startswith("unavailable: no RAPL counters")


def test_a_gpu_nvml_cannot_read_is_said_beside_the_cpu_s_part(tmp_path):
    """A GPU job's energy: NVML (nvidia-ml-py) asked for a board it does not know (here: no driver at all, or a UUID
    no board has) gives no figure and says so; the CPU's part is kept and named."""
    _domain(tmp_path, "intel-rapl:0", 5_000_000)
    with Energy(tmp_path, gpu="GPU-00000000-0000-0000-0000-000000000000") as e:
        (tmp_path / "intel-rapl:0" / "energy_uj").write_text("6000000")
    assert e.joules == 1.0 and e.why.startswith("RAPL, 1 package(s)")
    assert "; no GPU energy: NVML could not read GPU-00000000-" in e.why
    with Energy(tmp_path / "none", gpu="GPU-00000000-0000-0000-0000-000000000000") as e:
        pass
    assert e.joules is None and e.why.startswith("unavailable: no CPU energy: no RAPL counters")
    assert "no GPU energy" in e.why
