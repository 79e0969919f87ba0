"""The tasks a job can run (task.kind), each one config class registered once in TASKS: its own fields,
their validation, the rules it sets on the rest of the job, its checks once the model is loaded (before
anything is quantized or timed), the KV cache it holds, and its implementation.

Light: a task's implementation (src/tasks/<kind>.py, which imports torch) is imported when it runs.

Adding a task: a subclass here with KIND and MODULE (its implementation, whose `run(inputs) -> TaskResult`
the job calls), registered in TASKS; its fields in conf/task/_fields.yaml (with their defaults) and a conf/task/<name>.yaml naming it.
"""

from __future__ import annotations

import importlib
import logging
import urllib.parse
from dataclasses import dataclass
from typing import ClassVar

from src.common.schema import ConfigError, Kinds, check_choice, check_range
from src.data import prompts as prompt_file
from src.data.corpus import humaneval_problems, prompts
from src.quality import harness
from src.tasks import sandbox

log = logging.getLogger("quantspec")

TASKS = Kinds("task", "kind")
SANDBOXES = ("bwrap", "rlimit")  # where benchmark_code runs completions (src.tasks.sandbox)
REFERENCES = ("auto", "fp32", "bf16", "none")  # what a quality task measures the job's model against


@dataclass(frozen=True, kw_only=True)
class TaskConfig:
    """What every task has: its name (a conf/task file: benchmark and benchmark_long are one kind)."""

    KIND: ClassVar[str]
    MODULE: ClassVar[str]  # its implementation: a module with run(inputs) -> TaskResult
    DECODES: ClassVar[bool] = False  # a draft changes what it measures
    ROOFLINE: ClassVar[bool] = False  # its timed decode steps are set against the memory-bandwidth roofline
    READS_DATASET: ClassVar[bool] = False  # reads the dataset group's text (a calibrating precision may too)
    READS_PROMPTS: ClassVar[bool] = False  # reads a prompts dataset (dataset=jsonl) in place of its own prompts
    name: str  # the choice's name (conf/task/<name>.yaml): benchmark and benchmark_long share a kind

    @property
    def kind(self) -> str:
        return self.KIND

    def validate(self) -> None:
        pass

    def check_job(self, job) -> None:
        """The task's rules on the rest of the job (a JobConfig), said before any run is created."""

    def check_host(self) -> None:
        """What the task needs of this host beyond the model (a sandbox): said before anything loads."""

    def tags(self) -> dict[str, str]:
        """What the job's run is tagged with for this task."""
        return {}

    def preflight(self, job, loaded) -> None:
        """Checks that need the loaded model (its context, its tokenizer): said before anything is
        quantized or timed."""

    def kv_tokens(self, code_model: bool) -> int:
        """The longest sequence the task holds in a KV cache (the memory estimate's share)."""
        return 0

    def run(self, inputs):
        """The task's implementation: its module's run(inputs) -> TaskResult (imported now: it needs torch)."""
        return importlib.import_module(self.MODULE).run(inputs)


@dataclass(frozen=True, kw_only=True)
class Referenced:
    """A task that measures the job's model against the same weights in a float precision, run by torch
    (src.quality.reference; none: not measured; auto: fp32, or bf16 above 2B parameters, whose fp32 copy
    would not fit beside the job's model)."""

    reference: str = "auto"
    reference_top_k: int = 512  # the reference's most likely tokens kept per position (src.quality.divergence)

    def validate_reference(self) -> None:
        check_choice("task.reference", self.reference, REFERENCES)
        if self.reference_top_k < 1:
            raise ConfigError(f"task.reference_top_k={self.reference_top_k} must be at least 1")


def _on_batched_step(job, task: str, peer: str) -> None:
    """A task on quantspec's batched C++ step (src.engine.batching): engine=native, no draft; `peer`: what to use
    instead of the engine."""
    if job.engine.kind != "native":
        raise ConfigError(
            f"task={task} runs quantspec's batched C++ step (engine=native), not engine={job.engine.name}; {peer}"
        )
    if job.draft.active:
        raise ConfigError(f"task={task} batches without a draft: use draft=none")


def _refuse_random(job, what: str, metric: str) -> None:
    if job.model.weights == "random":
        raise ConfigError(
            f"task={job.task.name} measures {what}, and {job.model.name} has random weights "
            f"(model.weights=random): its {metric} would mean nothing; time it with task=benchmark, "
            f"or load the real weights"
        )


def _lengths(loaded, texts: list[str]) -> list[int]:
    return [len(loaded.tokenizer(t).input_ids) for t in texts]


def _fits(job, loaded, lengths: list[int], new: int) -> None:
    """Prompts of these lengths in tokens, and `new` tokens after each, must fit the model's context."""
    longest = max(lengths)
    if longest + new > loaded.max_context:
        field = f"task.{'code_' if job.model.code else ''}max_new_tokens"
        raise ConfigError(
            f"{field}={new} with a {longest}-token prompt exceeds {job.model.name}'s context of "
            f"{loaded.max_context} tokens; use {field}={max(1, loaded.max_context - longest)} or "
            f"less, or a smaller task.limit"
        )


@dataclass(frozen=True, kw_only=True)
class Generating(TaskConfig):
    """A task that times generation through the engine (prefill, per-token, seed columns)."""

    DECODES: ClassVar[bool] = True
    ROOFLINE: ClassVar[bool] = True
    max_new_tokens: int = 60  # new tokens per example (a general model)
    code_max_new_tokens: int = 60  # new tokens for a code model (model.code)
    exact_new_tokens: bool = True  # generate exactly that many (past EOS), so runs compare
    limit: int | None = None  # the first N examples (null: all)
    warmup: int = 1  # untimed runs before the timed ones
    repeats: int = 1  # timed runs per example; the median one is kept
    min_time_s: float = 0.0  # more runs until the example has been timed this long (how long, not how many)

    def validate(self) -> None:
        for key in ("max_new_tokens", "code_max_new_tokens"):
            if getattr(self, key) < 1:
                raise ConfigError(f"task.{key}={getattr(self, key)} must be at least 1")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"task.limit={self.limit} must be at least 1 (or null for every example)")
        if self.repeats < 1:
            raise ConfigError(f"task.repeats={self.repeats} must be at least 1")
        if not 0 <= self.min_time_s <= 3600:
            raise ConfigError(f"task.min_time_s={self.min_time_s} must be between 0 and 3600 seconds")
        if self.warmup < 0:
            raise ConfigError(f"task.warmup={self.warmup} must be 0 or more")
        for key in ("warmup", "repeats"):  # runs of each example: past this a task never ends (min_time_s: by time)
            check_range(f"task.{key}", getattr(self, key), 0, MAX_RUNS, "task.min_time_s times by seconds")

    def new_tokens(self, code_model: bool) -> int:
        return self.code_max_new_tokens if code_model else self.max_new_tokens

    def kv_tokens(self, code_model: bool) -> int:
        return 512 + self.new_tokens(code_model)  # prompts of a few hundred tokens at most


@TASKS.register
@dataclass(frozen=True, kw_only=True)
class Decode(Generating, Referenced):
    """The seeds' decode table: ten general prompts (thirteen HumanEval stubs for code models), and how far
    the model's greedy choices depart from the reference's on them (where the weights are real)."""

    KIND: ClassVar[str] = "decode"
    MODULE: ClassVar[str] = "src.tasks.decode"
    READS_PROMPTS: ClassVar[bool] = True  # dataset=jsonl: the user's prompts in place of the seeds'

    def validate(self) -> None:
        super().validate()
        self.validate_reference()

    def preflight(self, job, loaded) -> None:
        if job.dataset.holds_prompts:  # the user's prompts, as the task will encode them
            try:
                lengths = [
                    len(prompt_file.encode(loaded.tokenizer, p, loaded.max_context))
                    for p in job.dataset.prompts[: self.limit]
                ]
            except prompt_file.PromptsError as err:
                raise ConfigError(f"dataset.path={job.dataset.path}: {err}") from None
        else:
            lengths = _lengths(loaded, prompts(job.model.code)[: self.limit])
        _fits(job, loaded, lengths, self.new_tokens(job.model.code))


@TASKS.register
@dataclass(frozen=True, kw_only=True)
class Benchmark(Generating):
    """Prompts of fixed token lengths cut from the dataset, each timed for exactly max_new_tokens."""

    KIND: ClassVar[str] = "benchmark"
    MODULE: ClassVar[str] = "src.tasks.benchmark"
    READS_DATASET: ClassVar[bool] = True
    prompt_lengths: tuple[int, ...] = ()  # prompt lengths in tokens, cut from the dataset

    def validate(self) -> None:
        super().validate()
        if not self.prompt_lengths:
            raise ConfigError("task.prompt_lengths is empty: a benchmark needs at least one prompt length")
        if any(n < 1 for n in self.prompt_lengths):
            raise ConfigError(f"task.prompt_lengths={list(self.prompt_lengths)} must all be at least 1")

    def kv_tokens(self, code_model: bool) -> int:
        return max(self.prompt_lengths) + self.new_tokens(code_model)

    def preflight(self, job, loaded) -> None:
        new, context = self.new_tokens(job.model.code), loaded.max_context
        dropped = [n for n in self.prompt_lengths if n + new > context]
        if len(dropped) == len(self.prompt_lengths):
            raise ConfigError(
                f"no prompt length of task {self.name} fits {job.model.name}'s context of {context} "
                f"tokens with {new} new tokens"
            )
        if dropped:  # said now, before the timing; the task drops them
            log.warning(
                "prompt lengths %s dropped: with %d new tokens they exceed the model's context of %d",
                dropped,
                new,
                context,
            )


# What a sandboxed run may be given: an hour and a TiB are far beyond HumanEval's needs, and far inside the C longs
# setrlimit takes (seconds, bytes).
MAX_SANDBOX_S = 3600
MAX_SANDBOX_MB = 2**20
MAX_SAMPLES = 1000
MAX_SANDBOX_WORKERS = 256
MAX_RUNS = 10_000  # untimed or timed runs of one example
MAX_FEWSHOT = 100


@TASKS.register
@dataclass(frozen=True, kw_only=True)
class BenchmarkCode(Generating):
    """HumanEval's problems completed and timed, then each completion's tests run in a sandbox: pass@k."""

    KIND: ClassVar[str] = "benchmark_code"
    MODULE: ClassVar[str] = "src.tasks.benchmark_code"
    samples: int = 1  # completions per problem (pass@k for k <= samples)
    sandbox: str = "bwrap"  # bwrap, or rlimit where bubblewrap cannot run
    sandbox_timeout_s: float = 3.0  # wall clock per problem's tests
    sandbox_memory_mb: int = 1024  # address space per problem's tests
    sandbox_workers: int = 2  # problems tested at once

    def validate(self) -> None:
        super().validate()
        check_choice("task.sandbox", self.sandbox, SANDBOXES)
        if self.samples < 1 or self.sandbox_workers < 1:
            raise ConfigError(
                f"task.samples={self.samples} and task.sandbox_workers={self.sandbox_workers} must be at least 1"
            )
        # bounded by what the sandbox's rlimits hold (a C long of seconds and bytes): 1e300 s overflowed setrlimit
        # inside every run, so every completion, a correct one too, was scored failed
        if not (0 < self.sandbox_timeout_s <= MAX_SANDBOX_S) or not (64 <= self.sandbox_memory_mb <= MAX_SANDBOX_MB):
            raise ConfigError(
                f"task.sandbox_timeout_s={self.sandbox_timeout_s} must be above 0 and at most {MAX_SANDBOX_S}, and "
                f"task.sandbox_memory_mb={self.sandbox_memory_mb} from 64 to {MAX_SANDBOX_MB}"
            )
        if self.samples > MAX_SAMPLES or self.sandbox_workers > MAX_SANDBOX_WORKERS:
            raise ConfigError(
                f"task.samples={self.samples} must be at most {MAX_SAMPLES} and "
                f"task.sandbox_workers={self.sandbox_workers} at most {MAX_SANDBOX_WORKERS}"
            )

    def check_job(self, job) -> None:
        _refuse_random(job, "whether generated code works", "pass@1")
        if self.samples > 1 and not job.sampling.do_sample:
            raise ConfigError(
                f"task.samples={self.samples} under greedy decoding gives identical completions; "
                f"set sampling.do_sample=true (e.g. sampling.temperature=0.8) for pass@k, or "
                f"task.samples=1"
            )

    def check_host(self) -> None:
        try:
            sandbox.check(self.sandbox)
        except sandbox.SandboxUnavailable as err:
            raise ConfigError(f"task.sandbox={self.sandbox}: {err}") from None

    def tags(self) -> dict[str, str]:
        return {"sandbox": self.sandbox}

    def preflight(self, job, loaded) -> None:
        texts = [p["prompt"] for p in humaneval_problems()][: self.limit]
        _fits(job, loaded, _lengths(loaded, texts), self.new_tokens(job.model.code))


@TASKS.register
@dataclass(frozen=True, kw_only=True)
class Perplexity(Referenced, TaskConfig):
    """Perplexity over non-overlapping windows of the dataset, and the divergence from the reference there:
    quality beside speed."""

    KIND: ClassVar[str] = "perplexity"
    MODULE: ClassVar[str] = "src.tasks.perplexity"
    READS_DATASET: ClassVar[bool] = True
    window: int = 512  # tokens per window
    windows: int = 8  # how many windows

    def validate(self) -> None:
        if self.window < 2 or self.windows < 1:
            raise ConfigError(f"task.window={self.window} and task.windows={self.windows} must be at least 2 and 1")
        self.validate_reference()

    def check_job(self, job) -> None:
        _refuse_random(job, "quality", "perplexity")

    def preflight(self, job, loaded) -> None:
        if self.window > loaded.max_context:
            raise ConfigError(
                f"task.window={self.window} exceeds {job.model.name}'s context of {loaded.max_context} "
                f"tokens; use task.window={loaded.max_context} or less"
            )

    def kv_tokens(self, code_model: bool) -> int:
        return self.window


@TASKS.register
@dataclass(frozen=True, kw_only=True)
class LmEval(TaskConfig):
    """lm-evaluation-harness's tasks scored by the job's model, quantized, on its own kernels or another
    runtime's logits (src.quality.harness): accuracy with its standard error, each item's outcome kept."""

    KIND: ClassVar[str] = "lm_eval"
    MODULE: ClassVar[str] = "src.tasks.lm_eval"
    tasks: tuple[str, ...] = ("quantspec_facts",)
    num_fewshot: int = 0
    limit: int | None = None  # items per task (None: all)
    max_new_tokens: int = 60  # generate_until's cap where a task sets none

    def validate(self) -> None:
        if not self.tasks:
            raise ConfigError("task.tasks is empty: name at least one lm-eval task (e.g. task.tasks=[quantspec_facts])")
        if self.num_fewshot < 0:
            raise ConfigError(f"task.num_fewshot={self.num_fewshot} must be 0 or more")
        # lm-eval samples them from a task's few-shot split, tens of documents; more had failed after the model loaded
        check_range("task.num_fewshot", self.num_fewshot, 0, MAX_FEWSHOT)
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"task.limit={self.limit} must be at least 1 (or null: every document)")

    def check_job(self, job) -> None:
        _refuse_random(job, "task accuracy", "accuracy")

    def check_host(self) -> None:
        problem = harness.unavailable()
        if problem:
            raise ConfigError(problem)

    def kv_tokens(self, code_model: bool) -> int:
        return 1024


@TASKS.register
@dataclass(frozen=True, kw_only=True)
class Quantize(TaskConfig):
    """Build the quantized-model cache ahead of a sweep."""

    KIND: ClassVar[str] = "quantize"
    MODULE: ClassVar[str] = "src.tasks.quantize"

    def check_job(self, job) -> None:
        if not job.precision.quantized:
            raise ConfigError(f"task=quantize needs a quantized precision, not precision={job.precision.name}")


SERVERS = ("quantspec", "llama-server", "vllm")  # task.server: what answers the load (src.tasks.serve)
ENDPOINTS = ("completions", "chat")  # task.endpoint: /v1/completions or /v1/chat/completions
SERVE_PROMPTS = ("synthetic", "seeds", "dataset")  # task.prompts: what the requests ask
# sequences one batched step holds: src.engine.batching.MAX_SEQUENCES (the same, read here without torch)
MAX_SEQUENCES = 16
RUNNERS = ("quantspec", "llama-batched-bench")  # task=batch's task.runner: whose batched decode is timed


@TASKS.register
@dataclass(frozen=True, kw_only=True)
class Serve(TaskConfig):
    """Many requests at once: an OpenAI-compatible server (quantspec's, continuous batching on its kernels;
    llama.cpp's llama-server on the model's GGUF; or vLLM's CPU build on its float checkpoint) driven by a load generator (aiperf) at `concurrency` requests
    in flight, or at `request_rate` a second: throughput, TTFT, TPOT, ITL and end-to-end latency (src.tasks.serve).
    `python -m src.serve` runs the same server on its own, at `host`:`port`."""

    KIND: ClassVar[str] = "serve"
    MODULE: ClassVar[str] = "src.tasks.serve"
    READS_PROMPTS: ClassVar[bool] = True  # task.prompts=dataset: dataset=jsonl's prompts
    server: str = "quantspec"
    base_url: str | None = None  # a server already running (http://host:port): measured, none started
    served_model: str | None = None  # the model name requests carry (null: the one the server lists)
    endpoint: str = "completions"  # /v1/completions or /v1/chat/completions
    prompts: str = "synthetic"  # synthetic (prompt_tokens long), seeds (the seed prompts), dataset (dataset=jsonl)
    slo_ttft_ms: float | None = None  # goodput's targets: a request is good where it meets each one given
    slo_tpot_ms: float | None = None
    slo_e2e_ms: float | None = None
    concurrency: int = 1  # requests kept in flight (closed loop); with request_rate, the most in flight
    request_rate: float | None = None  # requests a second (Poisson arrivals); null: as fast as concurrency allows
    requests: int = 32  # requests timed at this level
    warmup_requests: int = 2  # sent first, not timed
    prompt_tokens: int = 128  # each request's prompt (aiperf's synthetic text, this many tokens)
    output_tokens: int = 64  # each request's new tokens (end of sequence ignored, as load generators ask)
    max_sequences: int = 16  # sequences decoding at once (the batched step's rows)
    max_batch_tokens: int = 32  # rows a step holds: decode rows, then prompt chunks
    max_waiting: int = 64  # requests queued beyond those; more are answered 503
    default_max_tokens: int = 256  # new tokens for a request that names no max_tokens (never the whole context)
    max_connections: int = 256  # open connections (a thread each); more are answered 503 and closed
    read_timeout_s: float = 30.0  # a request's headers and body arrive within this, or 408 and the connection closes
    prefix_cache_mb: int = 512  # finished sequences' keys and values kept for prompts that begin alike (0: off)
    host: str = "127.0.0.1"  # python -m src.serve: where it listens (a job's server takes a free loopback port)
    port: int = 8000

    def validate(self) -> None:
        check_choice("task.server", self.server, SERVERS)
        check_choice("task.endpoint", self.endpoint, ENDPOINTS)
        check_choice("task.prompts", self.prompts, SERVE_PROMPTS)
        if self.base_url is not None:
            url = urllib.parse.urlsplit(self.base_url)
            if url.scheme not in ("http", "https") or not url.hostname or url.path.rstrip("/") not in ("", "/v1"):
                raise ConfigError(
                    f"task.base_url={self.base_url} is not a server's address: give http://host:port (its API at /v1)"
                )
        for name in ("slo_ttft_ms", "slo_tpot_ms", "slo_e2e_ms"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ConfigError(f"task.{name}={getattr(self, name):g} must be above 0 ms (or null: no target)")
        check_range("task.concurrency", self.concurrency, 1, 1024)
        check_range("task.max_sequences", self.max_sequences, 1, MAX_SEQUENCES)
        for name in ("requests", "prompt_tokens", "output_tokens", "max_batch_tokens", "max_waiting"):
            if getattr(self, name) < 1:
                raise ConfigError(f"task.{name}={getattr(self, name)} must be at least 1")
        check_range("task.default_max_tokens", self.default_max_tokens, 1, 1 << 20)
        check_range("task.max_connections", self.max_connections, 1, 10_000, "a thread each")
        check_range("task.read_timeout_s", self.read_timeout_s, 0.1, 3600)
        check_range("task.prefix_cache_mb", self.prefix_cache_mb, 0, 1 << 20, "0: off")
        if self.warmup_requests < 0:
            raise ConfigError(f"task.warmup_requests={self.warmup_requests} must be 0 or more")
        if self.request_rate is not None and not self.request_rate > 0:
            raise ConfigError(f"task.request_rate={self.request_rate} must be above 0 (or null: closed loop)")
        check_range("task.port", self.port, 0, 65535)

    def check_job(self, job) -> None:
        if self.prompts == "dataset" and not job.dataset.holds_prompts:
            raise ConfigError(
                f"task.prompts=dataset serves a prompts file: add dataset=jsonl dataset.path=<file> (not "
                f"dataset={job.dataset.name})"
            )
        if self.prompts != "dataset" and job.dataset.holds_prompts:
            raise ConfigError(
                f"dataset=jsonl names prompts that task.prompts={self.prompts} would not send: add task.prompts=dataset"
            )
        chat = next((p for p in job.dataset.prompts if p.text is None), None) if self.prompts == "dataset" else None
        if chat is not None and self.endpoint != "chat":
            raise ConfigError(
                f"dataset.path={job.dataset.path} holds conversations (line {chat.line}): serve them on "
                "task.endpoint=chat"
            )
        if self.base_url is not None:
            return  # the server is running already: what this job loads gives only the tokenizer
        if self.server == "quantspec":
            _on_batched_step(job, "serve", "for llama.cpp's server use task.server=llama-server")
        elif job.draft.active:
            raise ConfigError("task=serve batches without a draft: use draft=none")
        if self.server == "vllm" and (job.model.weights == "random" or job.model.source == "tiny"):
            raise ConfigError(f"task.server=vllm reads a checkpoint's files; model={job.model.name} has none")

    def tags(self) -> dict[str, str]:
        return {"server": "external" if self.base_url is not None else self.server}

    def preflight(self, job, loaded) -> None:
        if self.prompts != "synthetic" or self.base_url is not None:
            return  # a prompt's length is its own; another server's context is its own to check
        if self.prompt_tokens + self.output_tokens > loaded.max_context:
            raise ConfigError(
                f"task.prompt_tokens={self.prompt_tokens} + task.output_tokens={self.output_tokens} exceed "
                f"{job.model.name}'s context of {loaded.max_context} tokens"
            )

    def kv_tokens(self, code_model: bool) -> int:
        return self.max_sequences * (self.prompt_tokens + self.output_tokens)


@TASKS.register
@dataclass(frozen=True, kw_only=True)
class Batch(TaskConfig):
    """Offline throughput at each batch size (llama-batched-bench's -npl): B sequences of `prompt_tokens` prefilled
    together, then `output_tokens` steps of B rows; prompt and generation tokens a second per B (src.tasks.batch),
    on quantspec's batched step or llama-batched-bench on the model's GGUF (`runner`)."""

    KIND: ClassVar[str] = "batch"
    MODULE: ClassVar[str] = "src.tasks.batch"
    READS_DATASET: ClassVar[bool] = True  # the prompts are cut from the corpus
    runner: str = "quantspec"
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    prompt_tokens: int = 128  # each sequence's prompt (llama-batched-bench's -npp)
    output_tokens: int = 64  # generation steps after it (-ntg)
    max_batch_tokens: int = 32  # quantspec: rows a prefill step holds, as the server's
    warmup: int = 1
    repeats: int = 1

    def validate(self) -> None:
        check_choice("task.runner", self.runner, RUNNERS)
        if not self.batch_sizes:
            raise ConfigError("task.batch_sizes is empty: give the batch sizes to time, e.g. [1,2,4,8,16]")
        for b in self.batch_sizes:
            check_range("task.batch_sizes", b, 1, MAX_SEQUENCES, "the batched step's sequences")
        if len(set(self.batch_sizes)) < len(self.batch_sizes):
            raise ConfigError(f"task.batch_sizes={list(self.batch_sizes)} names a size twice")
        for name in ("prompt_tokens", "output_tokens", "max_batch_tokens", "repeats"):
            if getattr(self, name) < 1:
                raise ConfigError(f"task.{name}={getattr(self, name)} must be at least 1")
        check_range("task.warmup", self.warmup, 0, 10_000)

    def check_job(self, job) -> None:
        if self.runner == "quantspec":
            _on_batched_step(job, "batch", "for llama.cpp's use task.runner=llama-batched-bench")
        elif job.draft.active:
            raise ConfigError("task=batch batches without a draft: use draft=none")

    def tags(self) -> dict[str, str]:
        return {"runner": self.runner}

    def preflight(self, job, loaded) -> None:
        if self.prompt_tokens + self.output_tokens + 1 > loaded.max_context:
            raise ConfigError(
                f"task.prompt_tokens={self.prompt_tokens} + task.output_tokens={self.output_tokens} exceed "
                f"{job.model.name}'s context of {loaded.max_context} tokens"
            )

    def kv_tokens(self, code_model: bool) -> int:
        return max(self.batch_sizes) * (self.prompt_tokens + self.output_tokens + 1)
