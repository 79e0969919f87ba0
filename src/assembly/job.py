"""A job from its typed config, free of Hydra and MLflow: `build(cfg, recorder) -> Job`, `Job.run()`.

    job = build(cfg)            # place, load, quantize, install kernels, engine (+ draft): the slow part
    result = job.run()          # the task, and its decode steps against the roofline

The recorder receives what building measures and decides (model load time, quantization metrics, the
kernels used, placement tags) as it happens; src.tracking.sweep.record passes the job's tracked run, a script passes
nothing. src.tracking.sweep.record (for src.run) and scripts/ both build jobs here, so a job is assembled in one place.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from src import kernels
from src.assembly import hardware, memory
from src.assembly.config import ConfigError, JobConfig
from src.assembly.hardware import Placement
from src.common import environment
from src.data.corpus import Corpus, TextInput, file_prompts_input
from src.engine import cpp_step, engine_for, hugepages, native, roofline, runtimes, static_step
from src.engine.generation import Engine
from src.engine.runtimes.isolated import Isolated
from src.engine.speculative import ModelDrafter, PromptLookup
from src.engine.subset_head import cut_head, frequent_tokens
from src.kernels import amx, modules
from src.models.config import ARCHS, OTHER
from src.models.load import LoadedModel, checkpoint, gguf_path, load_model, tokenizer_mismatch
from src.models.random_weights import parameter_count
from src.quality.reference import Reference
from src.quality.scoring import torch_scorer
from src.quant import prefill
from src.quant.apply import prepare, unmade
from src.quant.linear import install_prefill, install_prefill_activations, w8a8_linears
from src.tasks.kinds import Referenced
from src.tasks.timed import BANDWIDTH, TaskInputs, TaskResult

log = logging.getLogger("quantspec")


class Recorder(Protocol):
    def log_metrics(self, values: dict[str, float], step: int = 0) -> None: ...
    def set_tags(self, tags: dict[str, str]) -> None: ...
    def log_params(self, params: dict[str, str]) -> None: ...
    def log_text(self, text: str, name: str) -> None: ...
    def log_input(self, text: TextInput, context: str) -> None: ...


class Discard:
    """A recorder for scripts and tests: what building measures is dropped."""

    def log_metrics(self, values, step=0):
        pass

    def set_tags(self, tags):
        pass

    def log_params(self, params):
        pass

    def log_text(self, text, name):
        pass

    def log_input(self, text, context):
        pass


@dataclass
class Job:
    cfg: JobConfig
    placement: Placement
    env: dict
    loaded: LoadedModel
    model: nn.Module
    corpus: Corpus
    engine: Engine
    baseline: Engine | None  # with a draft: the same engine without it, timed beside it
    quant_metrics: dict[str, float]
    recorder: Recorder
    on_row: Callable = lambda row, total: None  # each measured row, as it comes (src.tracking.sweep.record logs it)
    scorer: Callable | None = None  # another runtime's window_score where it has one (else torch's forward scores)
    close: Callable[[], object] = lambda: None  # ends another runtime's process (quantspec's engines hold none)

    def inputs(self) -> TaskInputs:
        cfg = self.cfg
        # another runtime scores with its own logits, in its own process; torch's model otherwise
        score = self.scorer or torch_scorer(self.model)
        return TaskInputs(
            self.model,
            self.loaded.tokenizer,
            cfg.task,
            cfg.model.code,
            cfg.sampling,
            self.loaded.max_context,
            self.corpus.reader("evaluation"),
            self.engine,
            baseline=self.baseline,
            record_input=lambda text: self.corpus.note(text, "evaluation"),
            on_row=self.on_row,
            bandwidth=self.probe if self.roofline_applies() else None,
            score=score,
            reference=self.reference(),
            # decode, dataset=jsonl: the user's prompts in place of the task's own
            prompts=cfg.dataset.prompts if cfg.task.READS_PROMPTS and cfg.dataset.holds_prompts else None,
            prompts_input=lambda texts: file_prompts_input(cfg.dataset, texts),
            cache_dir=cfg.cache_dir,
            gguf=lambda: gguf_path(cfg.model, cfg.cache_dir)[0],
            checkpoint=lambda: checkpoint(cfg.model, cfg.cache_dir),
            keep_text=self.recorder.log_text,
        )

    def reference(self) -> Reference | None:
        """What the task measures the model against: the same weights in task.reference's float precision
        (none where the task has no reference, it is off, or the weights are random: a random model's
        departure from itself says nothing of a method's quality)."""
        precision = self.cfg.task.reference if isinstance(self.cfg.task, Referenced) else "none"
        if precision == "none" or self.cfg.model.weights == "random":
            return None
        if precision == "auto":  # a 7B model's fp32 copy (28 GB) would not fit beside the job's own
            precision = "fp32" if parameter_count(self.loaded.model.config) <= AUTO_FP32_PARAMS else "bf16"
        return Reference(
            self.cfg.model, self.cfg.cache_dir, precision, self.cfg.task.reference_top_k, self.loaded.source_key
        )

    def run(self) -> TaskResult:
        gpu = self.placement.device == "cuda"
        if gpu:  # the device's peak from here: the weights already held, then what the task adds
            torch.cuda.reset_peak_memory_stats()
        try:
            result = self.cfg.task.run(self.inputs())
        finally:  # another runtime's process ends with its task
            self.close()
        if gpu:
            result.summary["device_peak_gb"] = torch.cuda.max_memory_allocated() / memory.GB
        for text, contexts in self.corpus.used():
            self.recorder.log_input(text, contexts)
        if self.cfg.model.weights == "random":
            _drop_quality(result)
        if result.rows and runtimes.runtime(self.cfg.engine) is None:  # another runtime's weights are its own
            result.summary.update(roofline.memory_figures(self.model, result.rows))
        if result.rows and self.roofline_applies():
            # each example against the bandwidth probed beside it; a task that times outside
            # src.tasks.timed.measure (no probes) is set against one probe taken now
            bandwidths = result.series.get(BANDWIDTH) or [self.probe()] * len(result.rows)
            result.series["decode_efficiency"], extra = roofline.efficiency(self.model, result.rows, bandwidths)
            result.summary.update(extra)
            if self.probe.spreads:  # how far one probe's passes were apart: the ceiling's own noise
                result.summary["bandwidth_spread_max"] = max(self.probe.spreads)
            if extra["bandwidth_probe_short"]:
                result.notes.append(
                    f"the bandwidth probe read slower than the decode step itself in "
                    f"{extra['bandwidth_probe_short']:.0f} of {len(result.rows)} examples (the step up to "
                    f"{extra['bandwidth_probe_short_max']:.2f}x the probe's rate): their decode_efficiency is "
                    f"taken as 1.0, against the step's own rate"
                )
        self._note_step_threads(result)
        return result

    def _note_step_threads(self, result: TaskResult) -> None:
        """How many threads the C++ step's calls ran on (src/kernels/step.cpp's Threads picks per call): the
        share of calls on fewer than hardware.threads is a metric, and a note where there were any."""
        counts = cpp_step.thread_counts(self.model)
        calls = sum(counts.values())
        if not calls:
            return
        fewer = sum(n for threads, n in counts.items() if threads < self.placement.threads)
        result.summary["step_fewer_threads_share"] = fewer / calls
        if fewer:
            spread = ", ".join(f"{n} on {t}" for t, n in sorted(counts.items(), reverse=True))
            result.notes.append(
                f"the decode step ran {fewer} of its {calls} calls on fewer than {self.placement.threads} threads "
                f"({spread}): fewer timed faster for those calls (work too small to share out, or a host that gave "
                f"this job less than its cores: the run's host_busy tag says whether it was busy)"
            )

    def roofline_applies(self) -> bool:
        """A task that times decode steps (its class's ROOFLINE) on torch's weights, on the CPU or a CUDA device:
        its steps are set against the memory-bandwidth roofline of the memory they read (another runtime holds
        weights of its own, whose bytes per step are not the torch model's)."""
        on_torch = runtimes.runtime(self.cfg.engine) is None and self.placement.device in ("cpu", "cuda")
        return self.cfg.task.ROOFLINE and on_torch

    @functools.cached_property
    def probe(self) -> roofline.Probe:
        """The step's own tensors, read in place (as many bytes as it reads, up to roofline.PROBE_MB), on its
        threads; on a GPU its memory, by a device copy."""
        if self.placement.device != "cpu":
            return roofline.Probe(self.placement.threads, roofline.DEVICE_PROBE_MB, device=self.placement.device)
        reads = roofline.step_reads(self.model)
        return roofline.Probe(self.placement.threads, roofline.probe_mb(self.model), reads=reads)


AUTO_FP32_PARAMS = 2_000_000_000  # task.reference=auto: fp32 up to this many parameters, bf16 above

# What a draft's agreement with its target says: nothing, where both are random.
QUALITY = ("acceptance_rate", "accepted_per_step", "tokens_per_step", "speedup_vs_no_draft", "expected_speedup")


def _drop_quality(result: TaskResult) -> None:
    dropped = sorted(k for k in (*result.summary, *result.series) if k.startswith(QUALITY))
    for key in dropped:
        result.summary.pop(key, None)
        result.series.pop(key, None)
    if dropped:
        result.notes.append(
            f"random weights: {', '.join(dropped)} not logged (a random draft agrees with a random "
            f"target by chance only); the timings stand, as the cost of drafting"
        )


def build(cfg: JobConfig, recorder: Recorder | None = None) -> Job:
    """Everything before the task (`recorder`: where it reports; none: nowhere). The caller has checked
    cfg.unsupported_reason()."""
    recorder = recorder or Discard()
    placement = hardware.resolve(cfg.hardware)
    if placement.note:
        log.warning(placement.note)
    torch.set_num_threads(placement.threads)
    _check_isa(cfg)
    env = _environment(cfg, placement, recorder)

    memory.release_freed()  # a sweep's previous job is freed, and its memory returned, before this one is weighed
    need = memory.check(cfg, device=placement.device)  # before loading: a job that cannot fit says so now, in one line
    cfg.task.check_host()
    recorder.set_tags({"weights": cfg.model.weights, **cfg.task.tags()})
    if need is not None:
        recorder.log_metrics({"memory_estimate_gb": need / memory.GB})
    corpus = Corpus(cfg.dataset)  # read only by the tasks and calibration that need it
    other = runtimes.runtime(cfg.engine)
    # a quantized job of random weights or of a local checkpoint makes none of the float weights its cached
    # quantized ones replace (a 7B's linears: 13 GB made or read, then dropped), and where they are not cached
    # yet, makes them a layer at a time
    hollow = (
        unmade(cfg.model, cfg.precision, corpus.reader("calibration"), cfg.cache_dir) if memory.streams(cfg) else None
    )
    # random weights for a float precision are made where they run (quantizing reads them on the CPU)
    device = placement.device if not cfg.precision.quantized else "cpu"
    # a streamed build (hollow) makes its float layers in the dtype the precision runs: a local bf16 checkpoint's
    # layers calibrated in bf16, as random weights are, where a float32 copy had doubled each layer and the
    # calibration forwards' time (42% of a 7B default w4a16 build, against ~20% in bf16)
    streamed = getattr(torch, cfg.precision.dtype) if hollow is not None else torch.float32
    loaded = load_model(cfg.model, cfg.cache_dir, device, hollow, dtype=streamed)
    recorder.log_metrics({"model_load_s": loaded.load_s})
    cfg.task.preflight(cfg, loaded)  # its context, before anything is quantized or timed
    if other is not None:  # another runtime: it quantizes and runs its own export of the weights, in a process
        # of its own, so that its crash fails this job and the sweep goes on
        make = other.build(cfg, loaded, placement, corpus, recorder)
        engine = Isolated(make, other.TITLE, other.crash_hint)
        return Job(
            cfg,
            placement,
            env,
            loaded,
            loaded.model,
            corpus,
            engine,
            None,
            {},
            recorder,
            scorer=engine.scorer,
            close=engine.close,
        )
    gemv = _kernels(cfg, placement, recorder)  # chosen once: quantized modules are built for it
    model, quant_metrics = _prepare_precision(
        cfg.model, cfg.precision, cfg, loaded, corpus, recorder, gemv, placement.device
    )
    model = _place(cfg, model, placement, gemv, recorder)
    _float_gemm(cfg, model, placement.device, recorder)
    _prefill_activations(cfg.precision, model, recorder)
    if placement.device == "cpu":  # before anything is timed: the weights' pages as a step streams them
        recorder.log_params({"executed.huge_pages": hugepages.back_with_huge_pages(model)})
    plain = engine_for(cfg.engine.kind, cfg.engine.step_path, compile=cfg.engine.compile)
    if cfg.engine.kind == "native":  # what the step path covers, said (and the C++ step built) before timing
        executed = native.executed_path(model, cfg.engine.step_path)
        if cfg.engine.compile and executed != "static":
            raise ConfigError(
                f"engine.compile=true compiles the static step, and this job's step path is {executed}: "
                "add engine.step_path=static"
            )
        recorder.log_params({"executed.step_path": executed})
        if executed == "static":  # how its steps run: eager, a CUDA graph per draft length, or compiled
            recorder.log_params(
                {"executed.capture": static_step.capture_mode(torch.device(placement.device), cfg.engine.compile)}
            )
        cpp_step.adapt_threads(model, cfg.engine.adapt_threads)
    drafter = _prepare_draft(cfg, loaded, corpus, placement, gemv, recorder) if cfg.draft.active else None
    engine = (
        plain
        if drafter is None
        else engine_for(
            cfg.engine.kind,
            cfg.engine.step_path,
            drafter,
            compile=cfg.engine.compile,
            k=cfg.draft.k,
            schedule=cfg.draft.schedule,
            k_max=cfg.draft.k_max,
        )
    )
    baseline = plain if drafter is not None and cfg.draft.baseline else None
    return Job(cfg, placement, env, loaded, model, corpus, engine, baseline, quant_metrics, recorder)


def engine_note(cfg) -> str:
    """Why a model of another family runs on transformers' generate (src.assembly.ownmodel moved it there), or ""."""
    if cfg.model.arch != OTHER:
        return ""
    note = (
        f"{cfg.model.name} is a {cfg.model.model_type or 'model of another family'}, which quantspec's engine does "
        f"not map (it maps {', '.join(ARCHS)}): it runs on transformers' generate (engine=hf)"
    )
    log.warning(note)
    return note


def _environment(cfg, placement, recorder) -> dict:
    """The host as the job sees it (environment.json), its placement's tags, and what executes."""
    env = environment.describe(placement.threads, placement.device)
    recorder.set_tags(
        {
            "executed_on": placement.executed_on,
            "placement_note": placement.note or "",
            "engine_note": engine_note(cfg),
            "git_commit": env["git_commit"],
            "cpu_model": env["cpu_model"],
            "threads": str(placement.threads),
        }
    )
    recorder.log_text(json.dumps(env, indent=2), "environment.json")
    _record_executed(cfg, placement, env, recorder)
    return env


def _record_executed(cfg, placement, env: dict, recorder) -> None:
    """What runs, beside what was asked (the `hardware.*` params are the profile's): params executed.*,
    and tag `ran_on`, which says where a profile's accelerator was not what ran ("phx profile, ran on
    host CPU (AMD EPYC)"). executed.kernels follows once the kernels are chosen (_kernels)."""
    where = f"host CPU ({env['cpu_model']})" if placement.device == "cpu" else placement.device
    other = runtimes.runtime(cfg.engine)
    runtime = other.runtime_name(cfg, placement.device) if other is not None else cfg.engine.runtime_name()
    recorder.log_params(
        {
            "executed.device": placement.device,
            "executed.cpu": env["cpu_model"],
            "executed.threads": str(placement.threads),
            "executed.runtime": runtime,
        }
    )
    recorder.set_tags({"ran_on": f"{cfg.hardware.name} profile, ran on {where}" if placement.note else where})


def _prepare_draft(cfg, loaded, corpus, placement, gemv: bool, recorder):
    """The drafter for draft.kind, built by its entry in DRAFT_BUILDS."""
    return DRAFT_BUILDS[cfg.draft.kind](cfg, loaded, corpus, placement, gemv, recorder)


def _prompt_lookup(cfg, loaded, corpus, placement, gemv: bool, recorder) -> PromptLookup:
    return PromptLookup(cfg.draft.max_ngram, cfg.draft.min_ngram)


def _draft_model(cfg, loaded, corpus, placement, gemv: bool, recorder) -> ModelDrafter:
    """A draft model at its precision (quantized once, through the same cache as targets), whose tokenizer
    must be the target's."""
    draft_loaded = load_model(cfg.draft_model, cfg.cache_dir)
    mismatch = tokenizer_mismatch(loaded.tokenizer, draft_loaded.tokenizer)
    if mismatch:
        raise ConfigError(
            f"draft model {cfg.draft_model.name} does not share {cfg.model.name}'s tokenizer "
            f"({mismatch}); pick a draft of the target's family"
        )
    recorder.log_metrics({"draft_model_load_s": draft_loaded.load_s})
    model, _ = _prepare_precision(
        cfg.draft_model, cfg.draft_precision, cfg, draft_loaded, corpus, recorder, gemv, placement.device, "draft_"
    )
    if cfg.draft.vocab:
        kept = cut_head(
            model, frequent_tokens(draft_loaded.tokenizer, corpus.reader("draft vocabulary")(), cfg.draft.vocab)
        )
        recorder.log_metrics({"draft_vocab": kept})
    model = _place(cfg, model, placement, gemv)
    _float_gemm(cfg, model, placement.device, recorder, "draft_")
    _prefill_activations(cfg.draft_precision, model, recorder, "draft_")
    if placement.device == "cpu":
        recorder.log_params({"executed.draft_huge_pages": hugepages.back_with_huge_pages(model)})
    return ModelDrafter(model, path=cfg.engine.step_path, compile=cfg.engine.compile)


# draft.kind -> what builds its drafter for a job (src.engine.speculative.DRAFTERS registers the kinds)
DRAFT_BUILDS: dict[str, Callable] = {"prompt_lookup": _prompt_lookup, "model": _draft_model}


def _check_isa(cfg) -> None:
    """engine.isa forced to a variant this CPU cannot run: one line, before anything loads."""
    if cfg.engine.module is None and cfg.engine.kernels == "quantspec" and cfg.engine.isa != "auto":
        try:
            kernels.candidates(cfg.engine.isa)
        except kernels.IsaUnavailable as err:
            raise ConfigError(str(err)) from None


def _kernels(cfg, placement, recorder) -> bool:
    """engine.kernels=quantspec: whether src/kernels run here (built on first use), and which variant.
    What ran is recorded either way: tag `kernels` is quantspec, aten (asked for, or not a CPU job) or
    fallback (asked for quantspec's and ATen's ran: the precision's times are then ATen's, said in one
    line and marked wherever the run's numbers are shown); param executed.kernels names the variant."""
    used, note, fallback = False, "", False
    if cfg.engine.kernels == "quantspec":
        if placement.device != "cpu":
            note = f"quantspec kernels are CPU kernels; {placement.device} keeps ATen's"
        elif kernels.load(cfg.cache_dir / "kernels", cfg.engine.isa):
            used = True
        else:
            fallback = True
            note = (
                f"quantspec kernels unavailable ({kernels.reason()}): ATen's kernels run, so this job's "
                f"{cfg.precision.name} times are ATen's, not the precision's"
            )
    if note:
        log.warning(note)
    variant = kernels.variant() if used else None
    executed = f"quantspec/{variant}" if used else ("aten (fallback)" if fallback else "aten")
    if used:  # AMX's tiles for w8a8's many rows, where the CPU has them; else why not (param executed.amx)
        refused = amx.enable(cfg.cache_dir / "kernels")
        if refused and not amx.missing():  # a CPU with AMX that cannot use it: said, not silent
            log.warning("AMX not used (%s): w8a8's prefill keeps ATen's int8 GEMM", refused)
        recorder.log_params({"executed.amx": "in use" if refused is None else refused})
    recorder.set_tags(
        {
            "kernels": "quantspec" if used else ("fallback" if fallback else "aten"),
            "kernels_isa": variant or "",
            "kernels_note": note,
        }
    )
    recorder.log_params({"executed.kernels": executed})
    return used


def _place(cfg, model, placement, gemv: bool, recorder=None):
    """On its device, with its attention, and (gemv) its float linears and norms on quantspec's kernels."""
    model = model.to(placement.device)
    model.set_attn_implementation(cfg.engine.attention)
    if gemv:
        counts = modules.install(model)
        if recorder is not None:
            recorder.log_params({f"kernels.{kind}": count for kind, count in sorted(counts.items())})
    return model


def _float_gemm(cfg, model, device: str, recorder, prefix: str = "") -> None:
    """The bf16 GEMMs of many rows (a prefill), in bf16 or made fp32: whichever this host runs faster
    (src.quant.prefill), recorded as param executed.float_gemm with the probe's times."""
    if device != "cpu" or not prefill.bf16_gemm_linears(model):
        return
    path, seconds = prefill.choose_float(cfg.cache_dir, environment.cpu_model(), torch.get_num_threads())
    prefill.install_float_gemm(model, path)
    recorder.log_params({f"executed.{prefix}float_gemm": path})
    recorder.log_metrics({f"{prefix}float_gemm_probe_ms_{p}": s * 1e3 for p, s in seconds.items()})


def _prefill_activations(precision, model, recorder, prefix: str = "") -> None:
    """A prefill's activations at the grouped linears (precision.prefill_activations), with where they run recorded
    (param executed.prefill_activations: e.g. "int8 (kernels 168)", or "int8 (kernels 144, torch 24)" where a format
    has no int8 GEMM on this variant and multiplies the same int8 x in an fp32 GEMM); and a batched step's
    (precision.batch_activations)."""
    cpp_step.set_batch_activations(model, precision.batch_activations)
    counts = install_prefill_activations(model, precision.prefill_activations)
    if counts:
        where = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        recorder.log_params({f"executed.{prefix}prefill_activations": f"{precision.prefill_activations} ({where})"})


def _prepare_precision(model_cfg, precision, cfg, loaded, corpus, recorder, gemv: bool, device: str, prefix: str = ""):
    """Cast to the precision's dtype, quantizing first (from the cache when it holds this key).
    Returns the model and the quantization step's metrics (empty for a float precision); quantized modules
    are built on `device` (the placement's). `prefix` names a draft's metrics and tags apart from the
    target's."""
    # a quantization's calibration forwards multiply bf16 as this host's prefill does (an AVX2 CPU's bf16 GEMM
    # ran at a few GF/s, against ~140 in fp32: a 7B layer's forwards had taken minutes)
    float_gemm = "bf16"
    if device == "cpu" and precision.quantized and precision.dtype == "bfloat16":
        float_gemm, _ = prefill.choose_float(cfg.cache_dir, environment.cpu_model(), torch.get_num_threads())
    model, report = prepare(
        loaded, model_cfg, precision, corpus.reader("calibration"), cfg.cache_dir, gemv, device, float_gemm
    )
    if report is None:
        return model, {}
    log.info(
        "%s%s %s in %.1f s (%s)",
        prefix.replace("_", " "),
        "quantized" if report.built else "loaded quantized weights",
        precision.name,
        report.seconds,
        report.cache_dir,
    )
    metrics = {prefix + k: v for k, v in report.metrics().items()}
    if w8a8_linears(model) and device == "cpu":  # their many-row path: whichever this host runs faster
        path, seconds = prefill.choose(cfg.cache_dir, environment.cpu_model(), torch.get_num_threads())
        install_prefill(model, path)
        recorder.log_params({f"executed.{prefix}int8_gemm": path})
        metrics.update({f"{prefix}int8_gemm_probe_ms_{p}": s * 1e3 for p, s in seconds.items()})
    recorder.log_metrics(metrics)
    recorder.set_tags(
        {
            prefix + "quant_cache": str(report.cache_dir),
            **({prefix + "smoothquant_alpha": str(report.alpha)} if report.alpha is not None else {}),
        }
    )
    return model, metrics
