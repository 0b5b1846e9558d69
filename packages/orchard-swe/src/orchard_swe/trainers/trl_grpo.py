"""TRL ``GRPOTrainer`` adapter: BAR-grouped rollouts whose rewards come from Orchard sandboxes.

Runs inside the training venv (:func:`orchard_swe.trainers.llm_venv.ensure_train_venv`, TRL 1.16 on
CPU torch) with ``PYTHONPATH=workspace_pythonpath()``; it imports nothing at module level
that the workspace venv lacks (torch and TRL are imported inside the functions that need
them), so the sandbox side is usable and testable without torch.

- :class:`ExprTask`: a tiny verifiable task, "write a Python arithmetic expression whose
  value is odd / a multiple of 3 / equal to 12". The answer is *executed* in a sandbox
  (``python3 -c PROGRAM ANSWER``); the reward is 1.0 when the printed value satisfies the
  task, else 0.0.
- :class:`SandboxExecutor`: runs answers in Orchard sandboxes through ``orchard_env_client``
  (one sandbox per batch, always deleted; :class:`OrchardUnavailable` when the server is not
  there) and records every execution (:class:`Execution`: job id, exit code, stdout, reward).
- :class:`BarRolloutFunc`: TRL's ``rollout_func``. For each prompt of the batch it runs
  :func:`~orchard_swe.algorithms.bar.bar_rollout`: sample a stride of completions with the
  trainer's own model, execute them, let :func:`~orchard_swe.algorithms.bar.decide` ask for
  more (up to ``n_max``) or pick the group; it hands TRL exactly the ``n`` chosen samples
  (``n == num_generations``), their sandbox rewards, and an ``env_mask`` that carries BAR's
  loss weights (0 for a group a filter dropped, 0 for zero-loss samples).
- :class:`SandboxReward`: TRL's reward function. After :class:`BarRolloutFunc` it returns
  the rewards the sandboxes gave (no second execution); on its own (TRL generating) it
  executes the completions itself.
- :class:`GrpoRunConfig`: the run's settings, shared by ``orchard-swe train-grpo`` and the
  worker script ``grpo_train_worker.py``.

See ``docs/swe-grpo.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Final, Literal, Protocol

import attrs

from orchard_env_client import AsyncSandbox, AsyncSandboxClient, Job
from orchard_env_client.errors import ConnectionFailed, OrchardError

from ..algorithms.bar import (
    BarConfig,
    DropUniform,
    GroupFilter,
    GroupResult,
    Sample,
    Status,
    ZeroLoss,
    bar_rollout,
)

__all__ = [
    "EXPR_PROGRAM",
    "ROW_FIELDS",
    "SANDBOX_LABELS",
    "BarRolloutFunc",
    "Completion",
    "ExecSession",
    "Execution",
    "ExprTask",
    "GroupRecord",
    "GrpoRunConfig",
    "ModelName",
    "ModelSampler",
    "OrchardUnavailable",
    "SandboxExecutor",
    "SandboxReward",
    "SandboxTask",
    "prompt_key",
    "trl_rows",
]

EXPR_PROGRAM: Final = (
    "import sys\n"
    "value = eval(compile(sys.argv[1], '<answer>', 'eval'), {'__builtins__': {}})\n"
    "print(repr(value))\n"
)
"""What a sandbox runs for :class:`ExprTask`: evaluate the answer (argv 1, no builtins)."""

SANDBOX_LABELS: Final = {"orchard-swe-role": "grpo"}
"""The labels of the sandboxes this module creates (to find leftovers)."""

ModelName = Literal["random-tiny", "smollm2"]


class OrchardUnavailable(RuntimeError):
    """The Orchard Env server cannot be reached or cannot create sandboxes."""


# ---------------------------------------------------------------- tasks


class SandboxTask(Protocol):
    """A prompt whose answers are verified by running a command in a sandbox."""

    @property
    def prompt(self) -> str:
        """The user message."""
        ...

    def command(self, answer: str) -> list[str]:
        """The argv that checks ``answer`` (run without a shell)."""
        ...

    def reward(self, job: Job) -> float:
        """The reward of the finished ``job``."""
        ...


@attrs.frozen
class ExprTask:
    """Write a Python arithmetic expression whose value satisfies a condition.

    The value must be an ``int`` equal to ``target``, or, with ``modulus``, congruent to
    ``target`` modulo ``modulus`` (``ExprTask(1, 2)``: odd). The answer is evaluated by
    :data:`EXPR_PROGRAM` in a sandbox; the text alone is not trusted (``3+4`` is odd).
    """

    target: int
    modulus: int | None = None

    def __attrs_post_init__(self) -> None:
        if self.modulus is not None and self.modulus < 2:
            raise ValueError(f"modulus must be >= 2, got {self.modulus}")

    @classmethod
    def parse(cls, spec: str) -> ExprTask:
        """``"12"`` (equal to 12) or ``"1%2"`` (remainder 1 modulo 2)."""
        target, _, modulus = spec.partition("%")
        try:
            return cls(int(target), int(modulus) if modulus else None)
        except ValueError:
            raise ValueError(f"not a task spec (T or T%M): {spec!r}") from None

    @property
    def spec(self) -> str:
        """The inverse of :meth:`parse`."""
        return str(self.target) if self.modulus is None else f"{self.target}%{self.modulus}"

    @property
    def prompt(self) -> str:
        """The user message."""
        if self.modulus is None:
            goal = f"equal to {self.target}"
        elif self.modulus == 2:
            goal = "an odd integer" if self.target % 2 else "an even integer"
        elif self.target % self.modulus == 0:
            goal = f"a multiple of {self.modulus}"
        else:
            goal = f"an integer that leaves remainder {self.target % self.modulus} when divided by {self.modulus}"
        return (
            f"Write a Python arithmetic expression whose value is {goal}. "
            "Reply with the expression only."
        )

    def command(self, answer: str) -> list[str]:
        """``python3 -c EXPR_PROGRAM ANSWER``."""
        return ["python3", "-c", EXPR_PROGRAM, answer]

    def satisfied_by(self, value: int) -> bool:
        """Whether ``value`` solves the task."""
        if self.modulus is None:
            return value == self.target
        return (value - self.target) % self.modulus == 0

    def reward(self, job: Job) -> float:
        """1.0 when the job exited 0 and printed an ``int`` that solves the task, else 0.0."""
        if job.exit_code != 0 or job.timed_out:
            return 0.0
        try:
            value = int(job.stdout.strip())  # repr of an int; "True", "7.0" are not
        except ValueError:
            return 0.0
        return 1.0 if self.satisfied_by(value) else 0.0


def prompt_key(prompt: str | Sequence[Mapping[str, Any]]) -> str:
    """The text that names a task: the prompt, or the content of its last message."""
    if isinstance(prompt, str):
        return prompt
    content = prompt[-1].get("content", "") if prompt else ""
    return content if isinstance(content, str) else str(content)


# ---------------------------------------------------------------- sandbox execution


@attrs.define(kw_only=True)
class Execution:
    """One answer run in a sandbox, and the reward it earned."""

    answer: str
    reward: float = 0.0
    status: Status = Status.COMPLETED
    """``time_exceeded`` when the command timed out, ``aborted`` when the sandbox failed;
    otherwise the status the answer came with (``completed`` / ``truncated``)."""
    job_id: str | None = None
    sandbox_id: str | None = None
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    """The last 300 characters."""
    timed_out: bool = False
    error: str | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``status`` as its string)."""
        out = attrs.asdict(self)
        out["status"] = str(self.status)
        return out


class ExecSession:
    """One sandbox of a :class:`SandboxExecutor`; runs answers concurrently, one process each."""

    def __init__(self, executor: SandboxExecutor, sandbox: AsyncSandbox) -> None:
        self.executor = executor
        self.sandbox = sandbox
        self._gate = asyncio.Semaphore(max(1, executor.concurrency))

    async def _one(self, task: SandboxTask, answer: str, status: Status) -> Execution:
        record = Execution(answer=answer, status=status, sandbox_id=self.sandbox.sandbox_id)
        started = time.monotonic()
        async with self._gate:
            try:
                job = await self.sandbox.exec(
                    task.command(answer), timeout=self.executor.exec_timeout_s
                )
            except ConnectionFailed as exc:
                raise OrchardUnavailable(
                    f"the Orchard Env server at {self.executor.base_url} went away: {exc}"
                ) from exc
            except OrchardError as exc:
                record.status, record.error = Status.ABORTED, f"{type(exc).__name__}: {exc}"
                record.seconds = time.monotonic() - started
                self.executor.executions.append(record)
                return record
        record.seconds = time.monotonic() - started
        record.job_id, record.exit_code = job.job_id, job.exit_code
        record.stdout, record.stderr, record.timed_out = (
            job.stdout,
            job.stderr[-300:],
            job.timed_out,
        )
        if job.timed_out:
            record.status = Status.TIME_EXCEEDED
        record.reward = float(task.reward(job))
        self.executor.executions.append(record)
        return record

    async def run(
        self, task: SandboxTask, answers: Sequence[str], statuses: Sequence[Status] | None = None
    ) -> list[Execution]:
        """Run every answer (in order of ``answers``); ``statuses`` default to completed."""
        marks = list(statuses) if statuses is not None else [Status.COMPLETED] * len(answers)
        return list(
            await asyncio.gather(
                *(self._one(task, a, s) for a, s in zip(answers, marks, strict=True))
            )
        )


class SandboxExecutor:
    """Runs answers in Orchard Env sandboxes of ``image`` at ``base_url``; records them.

    :meth:`session` creates one sandbox and deletes it on exit, whatever happens; every
    answer runs as its own process there (``exec_timeout_s`` each, ``concurrency`` at a
    time). ``executions`` (in the order they finished), ``sandboxes_created`` and
    ``sandboxes_deleted`` keep the record.
    """

    def __init__(
        self,
        base_url: str,
        image: str,
        *,
        api_key: str | None = None,
        exec_timeout_s: float = 5.0,
        concurrency: int = 8,
        sandbox_ttl_s: float = 3600.0,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.image = image
        self.api_key = api_key
        self.exec_timeout_s = exec_timeout_s
        self.concurrency = concurrency
        self.sandbox_ttl_s = sandbox_ttl_s
        self.labels = dict(labels) if labels is not None else dict(SANDBOX_LABELS)
        self.executions: list[Execution] = []
        self.sandboxes_created: list[str] = []
        self.sandboxes_deleted: list[str] = []

    def _client(self, max_retries: int = 3) -> AsyncSandboxClient:
        # auto_cleanup off: session() deletes its sandbox itself, and a cleanup failing on a
        # dead server must not replace the error that says so.
        return AsyncSandboxClient(
            base_url=self.base_url,
            api_key=self.api_key,
            max_retries=max_retries,
            auto_cleanup=False,
        )

    async def check(self) -> str:
        """The server's backend name ("" if unnamed); :class:`OrchardUnavailable` if it does
        not answer."""
        async with self._client(max_retries=1) as client:
            try:
                return (await client.health()).backend or ""
            except OrchardError as exc:
                raise OrchardUnavailable(
                    f"no Orchard Env server answers at {self.base_url} ({type(exc).__name__}: "
                    f"{exc}). Start one (`orchard-env serve`) or let `orchard-swe train-grpo` "
                    "start its own (leave out --server-url)."
                ) from exc

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[ExecSession]:
        """A fresh sandbox for a batch of executions, deleted when the block ends."""
        async with self._client() as client:
            try:
                sandbox = await client.create_sandbox(
                    self.image, labels=self.labels, ttl_seconds=self.sandbox_ttl_s
                )
            except OrchardError as exc:
                raise OrchardUnavailable(
                    f"cannot create a sandbox ({self.image}) at {self.base_url}: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            self.sandboxes_created.append(sandbox.sandbox_id)
            try:
                yield ExecSession(self, sandbox)
            finally:
                await asyncio.shield(self._delete(client, sandbox))

    async def _delete(self, client: AsyncSandboxClient, sandbox: AsyncSandbox) -> None:
        try:
            await client.delete_sandbox(sandbox.sandbox_id)
        except OrchardError:
            return  # (the request was retried) the sandbox's TTL is the backstop
        self.sandboxes_deleted.append(sandbox.sandbox_id)

    async def run(self, items: Sequence[tuple[SandboxTask, str]]) -> list[Execution]:
        """Run ``(task, answer)`` pairs in one new sandbox; results in the same order."""
        async with self.session() as session:
            results = await asyncio.gather(*(session.run(task, [answer]) for task, answer in items))
        return [r for rs in results for r in rs]


# ---------------------------------------------------------------- generation (torch, lazily)


@attrs.frozen
class Completion:
    """One sampled completion: its ids (the end-of-turn token included when generated)."""

    ids: list[int]
    logprobs: list[float]
    """Each id's log-probability under the distribution it was sampled from."""
    text: str
    finished: bool
    """The model ended it (an end token), rather than ``max_completion_length``."""


def _allowed_mask(tokenizer: Any, vocab_size: int, allowed: str, keep: Sequence[int]) -> Any:
    """A ``LogitsProcessor`` that leaves only ``keep`` and the one-``allowed``-character tokens.

    transformers' ``suppress_tokens`` does the same with ``torch.isin`` over the whole
    vocabulary at every position (half the sampling time of the tiny model here); this masks
    with one precomputed boolean vector.
    """
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    chars = set(allowed)
    special = set(tokenizer.all_special_ids) - set(keep)
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    blocked = torch.ones(vocab_size, dtype=torch.bool)
    for i, text in enumerate(texts):
        if i < vocab_size and i not in special and text in chars:
            blocked[i] = False
    for i in keep:
        blocked[i] = False

    class AllowedTokens(LogitsProcessor):
        def __call__(self, input_ids: Any, scores: Any) -> Any:
            return scores.masked_fill(blocked.to(scores.device), -math.inf)

    return LogitsProcessorList([AllowedTokens()])


class ModelSampler:
    """Samples completions from a ``GRPOTrainer``'s model with transformers' ``generate``.

    Uses the trainer's sampling settings (``temperature``, ``top_p``, ``top_k``,
    ``max_completion_length``) and end tokens. ``allowed_chars`` (optional) restricts
    sampling to the single-character tokens of those characters, plus the end tokens
    (constrained decoding; the logprobs are then those of the constrained distribution).
    Single characters, because a vocabulary holds many runs like ``------`` that would
    otherwise dominate a random model's samples.
    """

    def __init__(self, trainer: Any, allowed_chars: str | None = None) -> None:
        self.trainer = trainer
        self.tokenizer = trainer.processing_class
        self.eos_ids = [int(t) for t in trainer.eos_token_ids]
        model = trainer.accelerator.unwrap_model(trainer.model)
        vocab = int(model.get_output_embeddings().weight.shape[0])
        self.mask = (
            _allowed_mask(self.tokenizer, vocab, allowed_chars, self.eos_ids)
            if allowed_chars
            else None
        )

    def prompt_ids(self, prompt: str | Sequence[Mapping[str, Any]]) -> list[int]:
        """The prompt's token ids: the chat template with a generation prompt for messages."""
        if isinstance(prompt, str):
            return [int(t) for t in self.tokenizer(text=prompt)["input_ids"]]
        encoded = self.tokenizer.apply_chat_template(
            [list(prompt)], add_generation_prompt=True, tokenize=True, return_dict=True
        )
        return [int(t) for t in encoded["input_ids"][0]]

    def sample(self, prompt_ids: Sequence[int], k: int) -> list[Completion]:
        """``k`` completions of ``prompt_ids``, cut after the first end token."""
        import torch

        trainer = self.trainer
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        inputs = torch.tensor([list(prompt_ids)], device=model.device)
        kwargs: dict[str, Any] = {
            "do_sample": True,
            "num_return_sequences": k,
            "max_new_tokens": trainer.max_completion_length,
            "temperature": trainer.temperature,
            "top_p": trainer.top_p,
            "top_k": trainer.top_k or 0,
            "eos_token_id": self.eos_ids,
            "pad_token_id": self.tokenizer.pad_token_id,
            "output_scores": True,
            "return_dict_in_generate": True,
        }
        if self.mask is not None:
            kwargs["logits_processor"] = self.mask
        try:
            with torch.no_grad():
                out = model.generate(
                    input_ids=inputs, attention_mask=torch.ones_like(inputs), **kwargs
                )
                scores = model.compute_transition_scores(
                    out.sequences, out.scores, normalize_logits=True
                )
        finally:
            model.train(was_training)
        new = out.sequences[:, inputs.shape[1] :].tolist()
        completions = []
        for ids, lps in zip(new, scores.tolist(), strict=True):
            end = next((i for i, t in enumerate(ids) if t in self.eos_ids), None)
            cut = len(ids) if end is None else end + 1
            text = self.tokenizer.decode(ids[:cut], skip_special_tokens=True).strip()
            completions.append(
                Completion(
                    ids=[int(t) for t in ids[:cut]],
                    logprobs=[float(x) for x in lps[:cut]],
                    text=text,
                    finished=end is not None,
                )
            )
        return completions


# ---------------------------------------------------------------- BAR rollout for TRL


@attrs.define(kw_only=True)
class GroupRecord:
    """What BAR did for one prompt at one step (for the report)."""

    step: int
    prompt: str
    task: str
    strides: list[int]
    """The size of every stride requested, in order."""
    requested: int
    outcome: str
    bounds: list[float] | None
    chosen: list[int]
    """Indices (into ``samples``) of the group handed to TRL, in that order."""
    positives: int
    positive_ratio: float
    dropped_by: str | None
    weights: list[float]
    """The loss weight of each chosen sample (TRL's ``env_mask``)."""
    samples: list[dict[str, Any]]
    """Every sample generated, in arrival order: its execution and token count."""
    generate_s: float = 0.0
    execute_s: float = 0.0
    """Time spent sampling, and running the answers in the sandbox (all strides)."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return attrs.asdict(self)


def _task_name(task: SandboxTask) -> str:
    return str(getattr(task, "spec", task.prompt))


ROW_FIELDS: Final = (
    "prompt_ids",
    "completion_ids",
    "logprobs",
    "env_mask",
    "orchard_reward",
    "orchard_status",
    "orchard_job_id",
)
"""The keys of :class:`BarRolloutFunc`'s output (TRL's three, ``env_mask``, and extras)."""


def trl_rows(result: GroupResult, prompt_ids: Sequence[int], n: int) -> dict[str, list[Any]]:
    """TRL's rows for one prompt: BAR's ``n`` chosen samples, in selection order.

    Each sample's payload is its ``(Completion, Execution)``. ``env_mask`` is the sample's
    loss weight after the filters on each completion token: all 0 for a dropped group, 0
    for a zero-loss sample, else 1 (TRL's mask is 0/1, so other weights raise).
    """
    chosen = result.selected
    if len(chosen.samples) != n:
        raise RuntimeError(f"BAR chose {len(chosen.samples)} samples, TRL needs {n}")
    weights = result.group.weights if result.group is not None else (0.0,) * n
    rows: dict[str, list[Any]] = {key: [] for key in ROW_FIELDS}
    for sample, weight in zip(chosen.samples, weights, strict=True):
        completion, execution = sample.payload
        if weight not in (0.0, 1.0):
            raise ValueError(f"TRL's env_mask is 0/1; a filter set a loss weight {weight}")
        rows["prompt_ids"].append(list(prompt_ids))
        rows["completion_ids"].append(list(completion.ids))
        rows["logprobs"].append(list(completion.logprobs))
        rows["env_mask"].append([int(weight)] * len(completion.ids))
        rows["orchard_reward"].append(execution.reward)
        rows["orchard_status"].append(str(execution.status))
        rows["orchard_job_id"].append(execution.job_id)
    return rows


class BarRolloutFunc:
    """TRL's ``rollout_func`` with BAR grouping and sandbox rewards.

    TRL calls it with the batch's prompts, each repeated ``num_generations`` times in a row,
    and expects one completion per row. For each prompt, :func:`bar_rollout` drives
    generation: strides of completions sampled from the trainer's model
    (:class:`ModelSampler`), each executed in a sandbox (``tasks[prompt_key(prompt)]``
    verifies it), until :func:`~orchard_swe.algorithms.bar.decide` selects ``n`` of them. Those
    ``n`` (``n`` must equal ``num_generations``) are the prompt's rows, in selection order.
    ``env_mask`` carries the group's loss weights: all 0 when a filter dropped the group (so
    it adds neither loss nor tokens to the normaliser), 0 on zero-loss samples (still in the
    group mean and std). Extra fields ``orchard_reward``, ``orchard_status`` and
    ``orchard_job_id`` reach the reward functions (see :class:`SandboxReward`). One sandbox
    serves a whole batch and is deleted when the batch is done. ``records`` keeps one
    :class:`GroupRecord` per prompt and step.
    """

    def __init__(
        self,
        tasks: Mapping[str, SandboxTask],
        executor: SandboxExecutor,
        cfg: BarConfig,
        filters: Sequence[GroupFilter] = (DropUniform(),),
        *,
        allowed_chars: str | None = None,
    ) -> None:
        self.tasks = dict(tasks)
        self.executor = executor
        self.cfg = cfg
        self.filters = tuple(filters)
        self.allowed_chars = allowed_chars
        self.records: list[GroupRecord] = []
        self._sampler: ModelSampler | None = None

    def _task(self, prompt: str | Sequence[Mapping[str, Any]]) -> SandboxTask:
        key = prompt_key(prompt)
        try:
            return self.tasks[key]
        except KeyError:
            raise KeyError(f"no sandbox task for the prompt {key[:200]!r}") from None

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """Generate, execute and group the batch; TRL's rollout output dict."""
        size = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
        if size != self.cfg.n:
            raise ValueError(f"BAR's n ({self.cfg.n}) must equal TRL's num_generations ({size})")
        if len(prompts) % size:
            raise ValueError(f"{len(prompts)} prompts are not whole groups of {size}")
        groups = [prompts[i : i + size] for i in range(0, len(prompts), size)]
        for group in groups:
            if len({prompt_key(p) for p in group}) != 1:
                raise ValueError("TRL's batch does not repeat each prompt num_generations times")
        if self._sampler is None or self._sampler.trainer is not trainer:
            self._sampler = ModelSampler(trainer, self.allowed_chars)
        step = int(trainer.state.global_step) + 1
        return asyncio.run(self._batch([g[0] for g in groups], self._sampler, step))

    async def _batch(
        self, prompts: list[Any], sampler: ModelSampler, step: int
    ) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {key: [] for key in ROW_FIELDS}
        async with self.executor.session() as session:
            for prompt in prompts:
                await self._group(session, sampler, prompt, step, out)
        return out

    async def _group(
        self,
        session: ExecSession,
        sampler: ModelSampler,
        prompt: Any,
        step: int,
        out: dict[str, list[Any]],
    ) -> None:
        """BAR for one prompt: strides of samples, executed, until a group is chosen."""
        task = self._task(prompt)
        ids = sampler.prompt_ids(prompt)
        strides: list[int] = []
        seconds = {"generate_s": 0.0, "execute_s": 0.0}

        async def generate(k: int) -> list[Sample]:
            strides.append(k)
            started = time.monotonic()
            completions = sampler.sample(ids, k)
            seconds["generate_s"] += time.monotonic() - started
            statuses = [Status.COMPLETED if c.finished else Status.TRUNCATED for c in completions]
            started = time.monotonic()
            runs = await session.run(task, [c.text for c in completions], statuses)
            seconds["execute_s"] += time.monotonic() - started
            return [
                Sample(reward=e.reward, status=e.status, payload=(c, e))
                for c, e in zip(completions, runs, strict=True)
            ]

        result = await bar_rollout(generate, self.cfg, self.filters)
        for key, values in trl_rows(result, ids, self.cfg.n).items():
            out[key].extend(values)
        record = self._record(step, prompt, task, strides, result)
        record.generate_s, record.execute_s = (
            round(seconds["generate_s"], 3),
            round(seconds["execute_s"], 3),
        )
        self.records.append(record)

    def _record(
        self, step: int, prompt: Any, task: SandboxTask, strides: list[int], result: GroupResult
    ) -> GroupRecord:
        chosen = result.selected
        weights = result.group.weights if result.group is not None else (0.0,) * len(chosen.samples)
        samples = []
        for sample in result.samples:
            completion, execution = sample.payload
            samples.append(
                {
                    **execution.to_dict(),
                    "tokens": len(completion.ids),
                    "finished": completion.finished,
                }
            )
        return GroupRecord(
            step=step,
            prompt=prompt_key(prompt),
            task=_task_name(task),
            strides=strides,
            requested=result.requested,
            outcome=chosen.outcome,
            bounds=list(chosen.bounds) if chosen.bounds is not None else None,
            chosen=list(chosen.indices),
            positives=chosen.positives,
            positive_ratio=chosen.positives / len(chosen.samples) if chosen.samples else math.nan,
            dropped_by=result.dropped_by,
            weights=list(weights),
            samples=samples,
        )


# ---------------------------------------------------------------- the reward function


def _completion_text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion.strip()
    content = completion[-1].get("content", "") if completion else ""
    return (content if isinstance(content, str) else str(content)).strip()


class SandboxReward:
    """TRL reward function: the reward of each completion, as a sandbox execution gave it.

    With :class:`BarRolloutFunc` the completions were already executed while BAR chose
    them; their rewards arrive as the ``orchard_reward`` column and are returned as they are
    (one execution per completion, never two). Without it (TRL generating), every
    completion is executed here, in one sandbox per call. ``calls`` records each call
    (step, where the rewards came from, rewards, job ids).
    """

    __name__ = "orchard_sandbox"

    def __init__(self, tasks: Mapping[str, SandboxTask], executor: SandboxExecutor) -> None:
        self.tasks = dict(tasks)
        self.executor = executor
        self.calls: list[dict[str, Any]] = []

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        """One reward per completion."""
        state = kwargs.get("trainer_state")
        step = int(state.global_step) + 1 if state is not None else None
        given = kwargs.get("orchard_reward")
        if given is not None and len(given) == len(prompts) and None not in given:
            rewards = [float(r) for r in given]
            job_ids = list(kwargs.get("orchard_job_id") or [None] * len(prompts))
            source = "rollout"
        else:
            items = [
                (self.tasks[prompt_key(p)], _completion_text(c))
                for p, c in zip(prompts, completions, strict=True)
            ]
            runs = asyncio.run(self.executor.run(items))
            rewards = [e.reward for e in runs]
            job_ids = [e.job_id for e in runs]
            source = "executed"
        self.calls.append({"step": step, "source": source, "rewards": rewards, "job_ids": job_ids})
        return rewards


# ---------------------------------------------------------------- run settings


def _tuple_of_str(value: Sequence[str] | str) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(str(v) for v in value)


@attrs.frozen(kw_only=True)
class GrpoRunConfig:
    """Settings of one ``train-grpo`` run (the CLI has one option per field).

    ``n`` is both BAR's group size and TRL's ``num_generations``; a step trains on
    ``prompts_per_step`` prompts, each with up to ``n_max`` samples generated in strides of
    ``stride``. ``eligible`` defaults to completed *and* truncated samples: a one-line answer
    cut at ``max_completion_length`` is still an answer, and it is executed like any other.
    ``tasks`` are :meth:`ExprTask.parse` specs. ``allowed_chars`` constrains sampling to
    those single-character tokens ("" samples freely).
    """

    model: ModelName = "random-tiny"
    steps: int = 3
    prompts_per_step: int = 2
    n: int = 4
    n_max: int = 8
    stride: int = 4
    p_min: float = 0.25
    p_max: float = 0.75
    bar_profile: str = "reference"
    eligible: tuple[str, ...] = attrs.field(
        default=("completed", "truncated"), converter=_tuple_of_str
    )
    drop_uniform: bool = True
    zero_loss_negatives: bool = False
    tasks: tuple[str, ...] = attrs.field(
        default=("1%2", "0%2", "0%3", "12"), converter=_tuple_of_str
    )
    max_completion_length: int = 6
    temperature: float = 1.0
    learning_rate: float = 1e-5
    seed: int = 0
    threads: int = 2
    allowed_chars: str = "0123456789+-*"
    exec_timeout_s: float = 2.0

    def __attrs_post_init__(self) -> None:
        if self.model not in ("random-tiny", "smollm2"):
            raise ValueError(f"unknown model {self.model!r} (random-tiny or smollm2)")
        if self.steps < 1 or self.prompts_per_step < 1 or self.n < 2:
            raise ValueError("need steps >= 1, prompts_per_step >= 1 and n >= 2 (GRPO)")
        self.bar_config()  # validates n, n_max, stride, bounds, eligible
        self.task_list()

    def bar_config(self) -> BarConfig:
        """BAR's configuration."""
        if self.bar_profile not in ("reference", "orchard"):
            raise ValueError(f"bar_profile must be reference or orchard, not {self.bar_profile!r}")
        return BarConfig(
            n=self.n,
            n_max=self.n_max,
            stride=self.stride,
            p_min=self.p_min,
            p_max=self.p_max,
            profile="orchard" if self.bar_profile == "orchard" else "reference",
            eligible=frozenset(Status(s) for s in self.eligible),
        )

    def filters(self) -> list[GroupFilter]:
        """BAR's group filters, in order."""
        out: list[GroupFilter] = []
        if self.drop_uniform:
            out.append(DropUniform())
        if self.zero_loss_negatives:
            out.append(ZeroLoss.negatives())
        return out

    def task_list(self) -> list[ExprTask]:
        """The tasks (distinct prompts)."""
        tasks = [ExprTask.parse(spec) for spec in self.tasks]
        if len({t.prompt for t in tasks}) != len(tasks):
            raise ValueError(f"two tasks have the same prompt: {self.tasks}")
        return tasks

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (:meth:`from_dict` reads it back)."""
        out = attrs.asdict(self)
        out["eligible"], out["tasks"] = list(self.eligible), list(self.tasks)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GrpoRunConfig:
        """Build from :meth:`to_dict` output."""
        return cls(**data)
