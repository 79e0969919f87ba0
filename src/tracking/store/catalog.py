"""Every name a quantspec run carries in MLflow: metrics, params, tags and artifacts, with what each means.

The one place they are named for readers: the docs' reference page is generated from this list, and the tests
check that every name a sweep of each task logs matches an entry here (`unlisted`), so a new metric without an
entry fails the suite instead of going undocumented. `<...>` in a name stands for any one segment (`<task>`:
an lm-eval task; `<group>`: a config group); the run-side names are a contract: they do not change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NAME_KINDS = ("metric", "param", "tag", "artifact")


@dataclass(frozen=True)
class Name:
    name: str
    kind: str  # metric, param, tag or artifact
    where: str  # which runs carry it
    meaning: str


def _n(kind: str, where: str, *entries: tuple[str, str]) -> list[Name]:
    return [Name(name, kind, where, meaning) for name, meaning in entries]


CATALOG: list[Name] = [
    # --- every job's run ---------------------------------------------------------------------------------
    *_n(
        "param",
        "every job",
        (
            "<group>.<key>",
            "the composed config as dot keys (model.name, precision.format, task.limit, ...); "
            "nested ones (draft.precision.alpha) likewise",
        ),
        (
            "<setting>",
            "the top-level settings: cache_dir, experiment, resume, report_at_end, rounds, busy_reruns, round",
        ),
        ("choice.<key>", "Hydra's choice for each group (choice.precision=w8a8; choice.draft.precision for a draft's)"),
        (
            "config_hash",
            "digest of the resolved config (everything but hydra, tracking, resume, report_at_end): "
            "what resume compares",
        ),
        ("executed.device", "the device that ran (cpu for a phx job on a host without its NPU)"),
        ("executed.cpu", "the CPU's model name"),
        ("executed.threads", "threads the job ran with"),
        (
            "executed.runtime",
            "what decoded: quantspec's engine and torch's version, transformers' generate, or "
            "another runtime with its version and settings",
        ),
        ("executed.kernels", "quantspec/<variant>, aten, or aten (fallback)"),
        (
            "executed.step_path",
            "native engine: the step path that runs the model (quantspec: the C++ step; python: the Python "
            "layer loop where the C++ step does not cover the model; static: the fixed-shape step, quantspec's "
            "on a GPU; transformers: its own forward)",
        ),
        ("executed.capture", "the static step's: eager, graph (a CUDA graph per draft length) or compile"),
        (
            "executed.huge_pages",
            "CPU jobs: how much of the weights the step streams sits on 2 MB pages (collapsed before timing), "
            "or why none",
        ),
        ("executed.draft_huge_pages", "the same for a draft model"),
        ("executed.int8_gemm", "w8a8's many-row path on this host: int_mm, float or amx (the probe's choice)"),
        ("executed.amx", "quantspec's AMX int8 GEMM: in use, or why not (no AMX on this CPU, Linux refused it)"),
        ("executed.draft_int8_gemm", "the same for a w8a8 draft"),
        (
            "executed.float_gemm",
            "CPU jobs with bf16 GEMMs of many rows (bf16, w8a16 and the 4-bit formats' prefill): bf16, or fp32 "
            "(the operands made fp32), whichever the host's probe found faster",
        ),
        ("executed.draft_float_gemm", "the same for a draft model"),
        (
            "executed.prefill_activations",
            "a grouped precision's prefill activations (precision.prefill_activations) and where its linears ran them: "
            "e.g. int8 (kernels 168), or torch for those multiplied by the fp32 fallback",
        ),
        ("executed.draft_prefill_activations", "the same for a draft model"),
        ("kernels.<kind>", "how many modules of each kind run on quantspec's kernels"),
        (
            "host.<key>",
            "what can change a figure on the same code, compared between sweeps by "
            "python -m src.regress: governor, turbo, thp (transparent huge pages), kernel, commit "
            "(-dirty), python and each library's version (torch, transformers, mlflow, ...)",
        ),
    ),
    *_n(
        "tag",
        "every job",
        ("quantspec.role", "job (or sweep on a sweep's parent)"),
        ("model", "the model's name"),
        ("hardware", "the hardware profile"),
        ("precision", "the precision"),
        ("draft", "the draft (none without one)"),
        ("task", "the task"),
        ("engine", "the engine"),
        ("export", "another runtime: the folder of its export"),
        ("executed_on", "the device that ran"),
        ("placement_note", "why it ran there, where not as asked"),
        (
            "engine_note",
            "why a model of one's own runs on transformers' generate: a family quantspec's engine does not map "
            "(model.arch=other)",
        ),
        ("ran_on", "the same in words: host CPU (AMD EPYC), or phx profile, ran on host CPU (...)"),
        ("outcome", "finished, skipped, failed or killed"),
        ("outcome_reason", "why, in one line"),
        ("git_commit", "the code's commit (-dirty with uncommitted changes)"),
        ("cpu_model", "the CPU's name"),
        ("threads", "threads the job ran with"),
        ("kernels", "quantspec, aten, or fallback (quantspec's asked for, ATen's ran)"),
        ("kernels_isa", "the kernel variant: avx512, avx_vnni, avx2, neon_dotprod, neon, reference"),
        ("kernels_note", "why a job runs on ATen's kernels"),
        ("node", "the Ray node id (local without Ray)"),
        ("node_host", "the node's host name"),
        ("weights", "random where model.weights=random"),
        ("host_busy", "true where other processes used more than tracking.busy_cores while it was timed"),
        ("host_busy_others_cores", "that CPU, in cores"),
        ("round", "the job's round (rounds > 1)"),
        ("quantspec.config_key", "a job's identity across a sweep's rounds"),
        ("quantspec.shown", "on the run that stands for its job in the view (its earliest round)"),
        ("busy_rounds", "rounds of the job timed busy"),
        ("quantspec.owner", "the process that owns the run (host, boot, pid, process start)"),
        ("quantspec.heartbeat", "the owner's last sign of life (every 30 s)"),
        ("quantspec.job_key", "a hash of the job's overrides"),
        ("quantspec.journal", "the job's journal file"),
        ("quantspec.sweep_id", "the sweep directory (on a job: its sweep's)"),
        ("quantspec.sweep_key", "a hash of the sweep's id"),
        ("mlflow.parentRunId", "MLflow's: the sweep's parent run"),
        ("mlflow.runName", "MLflow's: the job's name (model·hardware·precision...)"),
        ("mlflow.note.content", "MLflow's description: the figure, what ran and its condition (⚠ BUSY)"),
        ("mlflow.source.name", "MLflow's: the entry point"),
        ("mlflow.source.type", "MLflow's"),
        ("mlflow.source.git.commit", "MLflow's: the commit"),
        ("mlflow.user", "MLflow's: the user"),
        ("mlflow.datasets", "MLflow's: the texts the job read (name, digest, context)"),
        ("quant_cache", "quantized precisions: built, or the cache it was read from"),
        ("smoothquant_alpha", "SmoothQuant's alpha as used (the model's or precision.alpha)"),
        ("draft_quant_cache", "a quantized draft's, likewise"),
        ("draft_smoothquant_alpha", "a draft's"),
        ("reference", "what a quality job was measured against (fp32, bf16, none)"),
        ("search_trial", "hydra/sweeper=search: the Optuna trial the job measured"),
        ("on_search_front", "hydra/sweeper=search: true where its trial is on the search's front"),
        ("reference_cache", "built or cached: the reference's run"),
        ("sandbox", "benchmark_code: bwrap or rlimit"),
        ("server", "serve: what answered the load: quantspec, llama-server, vllm, or external (task.base_url)"),
        ("served_model", "serve: the model name its requests carried"),
        ("runner", "batch: whose batched decode was timed: quantspec or llama-batched-bench"),
        (
            "energy",
            "timed tasks: where energy_j came from (RAPL; on an NVIDIA GPU also NVML), or why the host gives none "
            "(unavailable: ...)",
        ),
        ("lm_eval_version", "lm_eval: the harness's version"),
        ("lm_eval_tasks", "lm_eval: its tasks"),
    ),
    *_n(
        "metric",
        "every timed job",
        ("prefill_ms_median", "prefill: start of generation to the first new token, median over examples"),
        ("time_per_token_ms_median", "the rest of the generation over its tokens, median over examples"),
        ("tokens_per_s_median", "1000 / time per token"),
        ("examples", "examples timed"),
        (
            "energy_j",
            "where the host has RAPL counters: the CPU packages' energy while the job timed, joules (a GPU job: plus "
            "the board's, from NVML)",
        ),
        ("energy_j_per_token", "that over every token the timed runs generated (the whole package's: see energy)"),
        ("ttft_ms_<latency>", "time to the first token, ms: p50, p90, p99, mean or max over examples"),
        ("tpot_ms_<latency>", "time per output token after the first (each example's mean gap), over examples"),
        ("itl_ms_<latency>", "inter-token latency: the gap before each token after the first, over all of them"),
        ("new_tokens_total", "tokens generated in all"),
        ("model_load_s", "loading the model"),
        ("decode_efficiency_median", "roofline time/token over measured time/token (CPU and CUDA jobs; at most 1)"),
        ("bandwidth_spread_max", "the bandwidth probe's best pass over its median pass, less one: the worst probe"),
        ("device_peak_gb", "a GPU job: the most its task held allocated on the device (weights included)"),
        (
            "bandwidth_probe_short",
            "examples whose step read faster than the bandwidth probe: rated 1.0 against the step's own rate",
        ),
        ("bandwidth_probe_short_max", "where there were any, the step's rate over the probe's, at worst"),
        (
            "step_fewer_threads_share",
            "the C++ step's calls run on fewer than hardware.threads (engine.adapt_threads), over all its calls",
        ),
        ("roofline_ms_median", "the memory roofline's time per token"),
        ("bandwidth_gbs", "the read bandwidth (a GPU's: copy), probed after each timed example (the median)"),
        ("step_weight_mb", "bytes a decode step must read"),
        ("weights_gb", "quantspec's engines: the model's tensors as held (quantized ones packed), each storage once"),
        ("kv_cache_gb", "quantspec's engines: keys and values at the job's longest context, in the model's dtype"),
        ("peak_rss_gb", "the job's peak resident memory, its child processes' included (a runtime's, a sandbox's)"),
        ("peak_rss_own_gb", "the job's process alone: its own peak (the kernel's VmHWM, reset at the job's start)"),
        ("peak_rss_children_gb", "its children: the largest sum of the live ones' own peaks, read every 0.2 s"),
        ("memory_estimate_gb", "its estimate before loading"),
        ("others_cpu_cores", "CPU other processes used while the job was timed"),
        ("export_s", "another runtime: building its export (or reading it from the cache)"),
        ("float_gemm_probe_ms_<float_path>", "the probe that chose the bf16 GEMMs' path: bf16 and fp32"),
        ("draft_float_gemm_probe_ms_<float_path>", "a draft model's"),
        # per example (step = the example's number), each named: a new series fails the suite until listed here
        ("by_example/prompt_tokens", "per example: its prompt's tokens"),
        ("by_example/new_tokens", "per example: the tokens it generated"),
        ("by_example/total_time_s", "per example: prefill and decode, seconds"),
        ("by_example/prefill_ms", "per example: the prompt's prefill"),
        ("by_example/time_per_token_ms", "per example: decode time per new token"),
        ("by_example/tokens_per_s", "per example: new tokens per second"),
        ("by_example/bandwidth_gbs", "per example: the host's read bandwidth, probed after it"),
        ("by_example/decode_efficiency", "per example: the roofline's time per token over the measured one"),
        ("by_example/acceptance_rate", "a drafted example: the share of proposed tokens kept"),
        ("by_example/accepted_per_step", "a drafted example: proposals kept per verification"),
        ("by_example/draft_k_mean", "a drafted example: tokens proposed per step"),
        ("by_example/draft_ms_per_step", "a drafted example: the draft's time per step"),
        ("by_example/verify_ms_per_step", "a drafted example: the target's verification per step"),
        ("by_example/baseline_time_per_token_ms", "a drafted example: its time/token without the draft, timed beside"),
        ("by_example/speedup_vs_no_draft", "a drafted example: that time over its own"),
        ("by_example/first_divergent_token", "decode against the reference: the first token that departs from it"),
        ("by_example/divergent_share", "decode against the reference: the share of tokens that depart"),
        # sampled while the job runs (src.common.sysmetrics), under the names MLflow's UI charts as system metrics
        ("system/cpu_utilization_percentage", "the host's CPU use, every interval"),
        ("system/system_memory_usage_megabytes", "the host's memory in use"),
        ("system/system_memory_usage_percentage", "the same, as a share"),
        ("system/process_rss_megabytes", "the job's resident memory"),
        ("system/others_cpu_cores_per_interval", "CPU other processes used over each interval, loading included"),
    ),
    *_n(
        "metric",
        "quantized precisions",
        ("quantize_s", "building the quantized weights"),
        ("quant_load_s", "reading them from the cache"),
        ("quantized_weights_mb", "their size"),
        ("draft_quantize_s", "a draft's, likewise"),
        ("draft_quant_load_s", "a draft's"),
        ("draft_quantized_weights_mb", "a draft's"),
        ("int8_gemm_probe_ms_<path>", "the probe that chose w8a8's many-row path: int_mm, float and amx"),
        ("draft_int8_gemm_probe_ms_<path>", "a w8a8 draft's"),
    ),
    *_n(
        "metric",
        "jobs with a draft",
        ("acceptance_rate_overall", "proposals kept over proposals made, pooled"),
        ("accepted_per_step_overall", "proposals kept per verification"),
        ("tokens_per_step_overall", "tokens per step"),
        ("draft_k_mean_overall", "proposals per step"),
        ("draft_ms_per_step_overall", "drafting per step"),
        ("verify_ms_per_step_overall", "a verification"),
        ("baseline_time_per_token_ms_median", "the same examples without the draft, timed in turns"),
        ("speedup_vs_no_draft_median", "the measured speedup"),
        ("draft_cost_ratio", "c: one draft forward over one plain target step"),
        ("alpha_estimated", "the acceptance α that explains the kept proposals"),
        ("expected_speedup", "Leviathan's (1 − α^(k+1)) / ((1 − α)(k·c + 1))"),
        ("output_identical_fraction", "greedy: outputs identical to decoding without the draft"),
        ("draft_vocab", "the draft's cut vocabulary (draft.vocab)"),
        ("draft_model_load_s", "loading the draft model"),
    ),
    *_n(
        "metric",
        "task=perplexity",
        ("perplexity", "over the windows"),
        ("perplexity_se", "its standard error"),
        ("perplexity_tokens", "tokens scored"),
        ("perplexity_windows", "windows scored"),
        ("perplexity_window", "tokens per window"),
        ("perplexity_eval_s", "the scoring pass"),
        ("window/nll", "per window (step = window number): the mean negative log-likelihood"),
        ("window/kl_mean", "per window: the mean KL divergence from the reference"),
        ("kl_mean", "KL divergence from the reference, mean over tokens"),
        ("kl_mean_se", "its standard error"),
        ("kl_median", "median"),
        ("kl_p90", "90th percentile"),
        ("kl_p99", "99th percentile"),
        ("kl_<stat>_low", "a KL statistic's 95% bootstrap interval, low end"),
        ("kl_<stat>_high", "high end"),
        ("kl_max", "the largest"),
        ("top1_agreement", "tokens whose most likely token is the reference's"),
        ("top1_agreement_low", "its 95% Wilson interval's lower end"),
        ("top1_agreement_high", "its 95% Wilson interval's upper end"),
        ("reference_perplexity", "the reference's"),
        ("reference_perplexity_se", "its se"),
        ("delta_perplexity", "the job's perplexity minus the reference's"),
        ("delta_perplexity_se", "its se (delta method, with the two NLLs' covariance)"),
        ("quality_ratio", "the reference's perplexity over the job's"),
        ("kl_tail_mass", "mean mass the reference's top-k cut left in its rest bucket"),
        ("reference_top_k", "tokens kept per position"),
    ),
    *_n(
        "metric",
        "task=decode against the reference",
        ("first_divergent_token", "the first token where the greedy choice departs from the reference's, mean"),
        ("first_divergent_token_se", "its se"),
        ("divergent_share", "share of divergent tokens, mean"),
        ("divergent_share_se", "its se"),
        ("identical_continuations", "continuations identical to the reference's"),
    ),
    *_n(
        "metric",
        "task=lm_eval",
        ("lm_eval/<task>/<metric>", "lm-eval's metric per task (and its _stderr)"),
        ("accuracy", "mean accuracy over the tasks"),
        ("accuracy_se", "its standard error"),
        ("lm_eval_items", "items scored"),
    ),
    *_n(
        "metric",
        "task=serve (aiperf's figures at the job's load level)",
        ("serve_output_tokens_per_s", "output tokens a second over the timed requests"),
        ("serve_requests_per_s", "requests finished a second"),
        ("serve_ttft_ms_<p>", "time to the first token, ms: p50, p90, p95, p99"),
        ("serve_tpot_ms_<p>", "time per output token after the first, per request, ms: p50, p90, p95, p99"),
        ("serve_itl_ms_<p>", "each gap between streamed tokens, ms: p50, p90, p95, p99"),
        ("serve_e2e_ms_<p>", "a request's end-to-end latency, ms: p50, p90, p95, p99"),
        ("serve_requests", "requests timed"),
        ("serve_errors", "requests that failed"),
        ("serve_error_pct", "their share, %"),
        ("serve_concurrency", "requests kept in flight (task.concurrency)"),
        ("serve_goodput_per_s", "with task.slo_*: requests a second that met every latency target given"),
        ("serve_good_fraction", "with task.slo_*: their fraction of the requests sent (errors count as missed)"),
        (
            "serve_prefix_hit_fraction",
            "quantspec's server: the share of prompt tokens taken from its prefix cache (warm-up requests' included)",
        ),
        ("serve_prefix_hits", "quantspec's server: requests that started from a kept prefix"),
    ),
    *_n(
        "metric",
        "task=batch (each batch size B of task.batch_sizes, as llama-batched-bench reports it)",
        ("batch_pp_tokens_per_s_b<b>", "prompt tokens a second, B sequences' prompts prefilled together"),
        ("batch_tg_tokens_per_s_b<b>", "generated tokens a second, B sequences decoded together"),
        ("batch_tokens_per_s_b<b>", "both over the whole run's time"),
        ("batch_pp_s_b<b>", "the prefill's seconds"),
        ("batch_tg_s_b<b>", "the generation's seconds"),
        ("batch_tg_tokens_per_s_max", "the best generation rate over the batch sizes"),
        ("batch_tg_best_b", "the batch size that gave it"),
        ("batch_tg_gain_max", "that rate over one sequence's (where B=1 was timed)"),
    ),
    *_n(
        "metric",
        "task=benchmark_code",
        ("pass_at_1", "HumanEval pass@1"),
        ("pass_at_<k>", "pass@k where sampled"),
        ("passed", "problems passed"),
        ("failed", "problems failed"),
        ("timed_out", "problems that ran out of time"),
        ("pass_at_1_no_draft", "with a draft: pass@1 of the same problems without it"),
        ("completions_identical_to_no_draft", "with a draft: completions identical to those without it"),
    ),
    *_n(
        "metric",
        "the run standing for a job, written by the report",
        ("rounds/time_per_token_ms_median", "the job's time/token over its rounds (3 significant digits)"),
        ("rounds/decode_speedup", "the median of its per-round speedups over the baseline"),
        ("rounds/decode_speedup_low", "their lowest"),
        ("rounds/decode_speedup_high", "their highest"),
        ("rounds/prefill_ms_median", "prefill over its rounds"),
        ("rounds/tokens_per_s_median", "tokens/s over its rounds"),
        ("rounds/ttft_ms_p99", "time to the first token, p99, over its rounds (each round's own p99, their median)"),
        ("rounds/itl_ms_p50", "inter-token latency, p50, over its rounds"),
        ("rounds/itl_ms_p90", "inter-token latency, p90, over its rounds"),
        ("rounds/itl_ms_p99", "inter-token latency, p99, over its rounds"),
        ("rounds/peak_rss_gb", "peak resident memory, its child processes' included, over its rounds"),
        ("busy", "1 where the figure stands on busy timings only"),
        ("round/time_per_token_ms_median", "per round (step = round): the job's time per token"),
        ("round/decode_speedup", "per round: its speedup over the sweep's baseline"),
        ("quality_below", "1: below quality.min_ratio of its reference"),
        (
            "front/time_per_token_ms_median",
            "a quality job's point on the speed–quality front: its configuration's speed",
        ),
        ("front/quality", "its quality figure"),
        ("front/on", "1 on the front"),
    ),
    # --- a sweep's parent run -----------------------------------------------------------------------------
    *_n(
        "tag",
        "a sweep's parent",
        ("overrides", "the sweep's command line"),
        ("jobs_<outcome>", "the latest attempt of each job, counted: finished, skipped, failed, killed, running"),
        ("best_time_per_token_job", "the fastest job"),
        ("best_speedup_job", "the job with the best speedup"),
        ("best_speedup_rounds", "the rounds that speedup is over"),
        ("best_speedup_condition", "how it was measured (quiet, or busy)"),
        ("front", "the configurations on the speed–quality front"),
        ("below_quality", "the configurations below quality.min_ratio"),
        ("search_front", "hydra/sweeper=search: the trials on the front, with their settings"),
    ),
    *_n(
        "metric",
        "a sweep's parent",
        ("best/time_per_token_ms_median", "the fastest job's time/token"),
        ("best/decode_speedup", "the best speedup"),
        ("best/decode_speedup_low", "its range over rounds, low"),
        ("best/decode_speedup_high", "high"),
    ),
    # --- artifacts ----------------------------------------------------------------------------------------
    *_n(
        "artifact",
        "every job",
        ("examples.md", "the seed table"),
        ("examples.csv", "the same as CSV"),
        (
            "result.json",
            "a finished job: its config, host, rows, summary figures, quantization and tags (format quantspec.job/1)",
        ),
        ("token_times.jsonl", "timed tasks: each example's TTFT and every inter-token gap, ms (its kept run)"),
        ("config.yaml", "the resolved config"),
        ("environment.json", "CPU model, threads, library versions, git commit"),
        ("notes.txt", "what the job told the console"),
        ("error.txt", "the traceback of a failed job"),
    ),
    *_n(
        "artifact",
        "quality and code tasks",
        ("responses.jsonl", "decode: each response and the reference's"),
        ("per_token.csv", "perplexity: each token's NLL, the reference's, KL and top-1 agreement"),
        ("lm_eval_samples.jsonl", "lm_eval: each item's outcome"),
        ("lm_eval_results.json", "lm_eval: its results"),
        ("completions.jsonl", "benchmark_code: each completion, its result and timing"),
        ("aiperf.json", "serve: the load generator's own export (every metric it measured)"),
        ("batch.md", "batch: the table of every batch size's prompt and generation figures"),
        ("serve_prompts.jsonl", "serve, task.prompts=seeds or dataset: the requests' prompts as aiperf read them"),
    ),
    *_n(
        "artifact",
        "a sweep's parent",
        ("report/<file>", "the report: report.md, report.json, summary.csv, plots, front.png, front.csv, serving.png"),
    ),
]


# Placeholders that stand for a fixed set (the config's groups and top-level settings, the statistics, paths and
# outcomes a name can carry), so a new name of that shape must be listed; any other stands for one segment of a
# name (no "/").
FIXED = {
    "<group>": "(model|hardware|precision|draft|task|engine|dataset|tracking|sampling)",
    "<key>": r"[\w.-]+",
    "<setting>": "(cache_dir|experiment|resume|report_at_end|rounds|busy_reruns|round)",
    "<stat>": "(median|p90|p99)",  # the KL quantiles with intervals (src.quality.divergence)
    "<path>": "(int_mm|float|amx)",  # w8a8's many-row paths (src.quant.prefill)
    "<float_path>": "(bf16|fp32)",  # the bf16 GEMMs' many-row paths (src.kernels.modules.FLOAT_GEMMS)
    "<outcome>": "(finished|skipped|failed|killed|running)",
    "<k>": r"\d+",
    "<latency>": "(p50|p90|p99|mean|max)",  # every token's statistics (src.common.latency)
}


def _pattern(name: str) -> re.Pattern:
    parts = re.split(r"(<[a-z_]+>)", name)
    return re.compile("".join(FIXED.get(p, r"[^/]+") if p.startswith("<") else re.escape(p) for p in parts))


_PATTERNS = {kind: [(_pattern(n.name), n) for n in CATALOG if n.kind == kind] for kind in NAME_KINDS}


def entry(kind: str, name: str) -> Name | None:
    """The catalog's entry for a name a run carries, or None."""
    for pattern, item in _PATTERNS[kind]:
        if pattern.fullmatch(name):
            return item
    return None


def unlisted(kind: str, names) -> list[str]:
    """The names no entry covers: each one a metric, param or tag the catalog (and the docs) lack."""
    return sorted(n for n in set(names) if entry(kind, n) is None)


def render() -> str:
    """The reference page's tables, by kind and by the runs that carry them."""
    out = []
    titles = {"metric": "Metrics", "param": "Params", "tag": "Tags", "artifact": "Artifacts"}
    for kind in NAME_KINDS:
        out += [f"## {titles[kind]}", ""]
        wheres = list(dict.fromkeys(n.where for n in CATALOG if n.kind == kind))
        for where in wheres:
            out += [f"### On {where}", "", "| name | meaning |", "|---|---|"]
            out += [
                f"| `{n.name}` | {n.meaning.replace('|', '/')} |"
                for n in CATALOG
                if n.kind == kind and n.where == where
            ]
            out.append("")
    return "\n".join(out)
