"""Framework-neutral RL rollouts: a bash agent in an Orchard sandbox, recorded token by token.

``await rollout(task, policy, client)`` prepares the task's repository in a fresh sandbox
(as ``distill`` does, history hidden), runs a simple text-protocol agent loop (each reply
holds one ```bash block, run in the repository; ``submit`` ends it), takes the diff,
grades it (:func:`orchard_swe.grading.grade`: reward 1.0 when ``resolved``, else 0.0) and
returns a :class:`RolloutTrajectory`: per-turn token ids, loss mask and sampling logprobs,
the messages, the reward and a status (``completed``, ``truncated``, ``time_exceeded``,
``aborted``; the names of :class:`orchard_swe.training.bar.Status`).

**Token bookkeeping.** Turn ``k`` records the tokens added to the context before its
completion (``prompt_ids``: the whole chat-templated prompt for turn 0, afterwards the
closing of the previous assistant turn plus the observation turn and the next generation
prompt) and the completion's own ids, logprobs and loss mask. The context of turn ``k+1``
is the context of turn ``k`` + its completion ids + the new prompt ids; it is never
re-tokenised from text. So ``input_ids()`` (all turns concatenated) is exactly the
sequence the policy conditioned on and produced, and ``loss_mask()`` is 1 on generated
tokens only. The new prompt ids are the tokens of what the chat template appends for the
observation (the render of the messages with the observation and a generation prompt,
minus the render without it), and, when the completion did not end with the template's
end-of-turn token (cut by length), that token too.

**Policies** (:class:`Policy`):

- :class:`TokenPolicy`: a token-in/token-out ``POST {base_url}/generate``. Request
  ``{"input_ids": [int], "sampling_params": {"max_new_tokens": int, "temperature": float,
  "top_p": float, "seed": int|null, "stop_token_ids": [int]|null}}``; answer
  ``{"output_ids": [int], "output_logprobs": [float], "finish_reason": "stop"|"length"}``
  (one logprob per output id, the sampled token's under the sampling distribution; the
  stop token is part of ``output_ids`` when generated). SGLang's native answer shape
  (``meta_info.output_token_logprobs`` and ``meta_info.finish_reason.type``) is read too.
  The tiny LLM server implements it. No drift: the ids sent are the ids recorded.
- :class:`ChatPolicy`: an OpenAI-compatible ``/chat/completions`` with ``logprobs: true``.
  The completion's ids come from the returned logprobs' tokens: ``token_id:N`` (vLLM's
  ``return_tokens_as_token_ids``) when the server spells them so, else each token's
  ``bytes`` looked up in the tokenizer's vocabulary. Caveat: the server renders and
  tokenises the conversation itself, so what it conditioned on may differ from the
  recorded context (a different template, or a re-tokenisation of the history that
  splits text differently from how it was generated). Each turn's ``drift`` says whether
  the local re-render of the messages differs from the recorded context; a completion
  whose tokens cannot be mapped is re-encoded from its text and flagged too.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

import attrs
import httpx

from orchard_env_client import AsyncSandboxClient
from orchard_env_client.errors import OrchardError

from ..environment import PrepareError, prepare
from ..grading import grade
from ..harness import PatchError, truncate_middle
from ..harness.tools import SHELL_ENV, compute_final_patch, head_commit
from ..tasks import Task
from .bar import Sample, Status
from .sft_data import ChatRenderer, TemplateError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "SUBMIT_COMMAND",
    "SYSTEM_PROMPT",
    "ChatPolicy",
    "ChatTokens",
    "Generation",
    "Policy",
    "PolicyError",
    "RolloutConfig",
    "RolloutTrajectory",
    "TokenPolicy",
    "Turn",
    "parse_action",
    "rollout",
    "token_ids_from_logprobs",
]

SUBMIT_COMMAND: Final = "submit"
_MINI_SUBMIT: Final = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

SYSTEM_PROMPT: Final = (
    "You are a software engineer fixing an issue in the repository at {repo_dir}. Work in "
    "steps. In each reply, think briefly, then give exactly one shell command in a ```bash "
    "block. It runs in {repo_dir} in a fresh shell, and you will see its output. Edit files "
    "with shell tools (sed -i, cat <<'EOF' > file, python3). When the fix is done, reply "
    "with a ```bash block that holds only: submit"
)
"""The system message (``{repo_dir}`` is filled in)."""

_FORMAT_ERROR: Final = (
    "Your reply had no ```bash block. Reply with exactly one ```bash block holding one "
    "command, or `submit` when you are done."
)
_BLOCK = re.compile(r"```(?:bash|sh|shell)?[ \t]*\n(.*?)(?:```|\Z)", re.S)


class PolicyError(RuntimeError):
    """The policy's server failed or answered something unusable."""


def parse_action(text: str) -> str | None:
    """The command of the first ```bash block in ``text`` (None if there is none).

    ``submit`` (or mini-swe-agent's ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``) ends
    the episode and is returned as :data:`SUBMIT_COMMAND`. An unclosed last block counts.
    """
    match = _BLOCK.search(text)
    if match is None:
        return None
    command = match.group(1).strip()
    if not command:
        return None
    if command == SUBMIT_COMMAND or command.startswith(_MINI_SUBMIT):
        return SUBMIT_COMMAND
    return command


# ---------------------------------------------------------------- records


@attrs.define(kw_only=True)
class Turn:
    """One policy call: the tokens added before it, and what it generated."""

    prompt_ids: list[int]
    """Tokens appended to the context before this completion (turn 0: the whole prompt)."""
    completion_ids: list[int]
    logprobs: list[float]
    """Sampling logprob of each completion id."""
    loss_mask: list[int]
    """One 0/1 per completion id (1: generated by the policy, trained on)."""
    finish_reason: str = "stop"
    """``stop`` (an end token or stop sequence) or ``length``."""
    text: str = ""
    """The completion as text (the assistant message's content)."""
    drift: bool = False
    """ChatPolicy only: the server's view of the context may differ from ``prompt_ids``."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return attrs.asdict(self)


@attrs.define(kw_only=True)
class RolloutTrajectory:
    """A finished rollout: turns (token-exact), messages, reward and how it ended."""

    instance_id: str
    policy: str = ""
    turns: list[Turn] = attrs.field(factory=list)
    messages: list[dict[str, Any]] = attrs.field(factory=list)
    status: Status = Status.ABORTED
    reward: float = 0.0
    patch: str = ""
    grade_status: str | None = None
    """The grading outcome (``resolved``, ``unresolved``, ...), or None if not graded."""
    error: str | None = None
    duration_s: float = 0.0
    metadata: dict[str, Any] = attrs.field(factory=dict)

    def input_ids(self) -> list[int]:
        """Every token of the episode, in order: each turn's prompt ids, then its completion."""
        return [t for turn in self.turns for t in (*turn.prompt_ids, *turn.completion_ids)]

    def loss_mask(self) -> list[int]:
        """0/1 per token of :meth:`input_ids`: 1 only on trained completion tokens."""
        return [m for turn in self.turns for m in ([0] * len(turn.prompt_ids) + turn.loss_mask)]

    def logprobs(self) -> list[float]:
        """Sampling logprob per token of :meth:`input_ids` (0.0 on prompt tokens)."""
        return [lp for turn in self.turns for lp in ([0.0] * len(turn.prompt_ids) + turn.logprobs)]

    def to_bar_sample(self) -> Sample:
        """A :class:`orchard_swe.training.bar.Sample` carrying this rollout."""
        return Sample(reward=self.reward, status=self.status, payload=self)

    def to_verl(self) -> dict[str, Any]:
        """verl's ``AgentLoopOutput`` fields (the response is everything after turn 0's prompt)."""
        prompt = self.turns[0].prompt_ids if self.turns else []
        n = len(prompt)
        return {
            "prompt_ids": list(prompt),
            "response_ids": self.input_ids()[n:],
            "response_mask": self.loss_mask()[n:],
            "response_logprobs": self.logprobs()[n:],
            "reward_score": self.reward,
            "num_turns": len(self.messages),
        }

    def to_slime(self) -> dict[str, Any]:
        """slime's ``Sample`` fields; ``time_exceeded`` maps to its ``truncated``."""
        prompt = len(self.turns[0].prompt_ids) if self.turns else 0
        status = {Status.TIME_EXCEEDED: "truncated"}.get(self.status, str(self.status))
        return {
            "tokens": self.input_ids(),
            "response_length": len(self.input_ids()) - prompt,
            "loss_mask": self.loss_mask()[prompt:],
            "rollout_log_probs": self.logprobs()[prompt:],
            "reward": self.reward,
            "status": status,
            "response": "".join(t.text for t in self.turns),
        }

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``turns`` as dicts, ``status`` as its string)."""
        out = attrs.asdict(self, recurse=False)
        out["turns"] = [t.to_dict() for t in self.turns]
        out["status"] = str(self.status)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RolloutTrajectory:
        """Build from :meth:`to_dict` output."""
        fields = dict(data)
        fields["turns"] = [Turn(**t) for t in fields.get("turns", [])]
        fields["status"] = Status(fields.get("status", Status.ABORTED))
        return cls(**fields)


# ---------------------------------------------------------------- token bookkeeping


class ChatTokens:
    """The chat template's token-level pieces: the first prompt and each observation turn."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.renderer = ChatRenderer(tokenizer)
        self.tokenizer = tokenizer
        probe = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
        prompt = self.renderer.render(probe, [], generation_prompt=True)
        full = self.renderer.render([*probe, {"role": "assistant", "content": "A"}], [])
        if not full.startswith(prompt + "A"):
            raise TemplateError("the template does not render an assistant turn after its prompt")
        self.closing_ids = self.renderer.encode(full[len(prompt) + 1 :])
        """What the template writes after an assistant's text (``<|im_end|>\\n``)."""

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The first prompt: the messages rendered with a generation prompt, tokenized."""
        return self.renderer.encode(self.renderer.render(messages, [], generation_prompt=True))

    def observation_ids(
        self,
        messages: Sequence[Mapping[str, Any]],
        completion_ids: Sequence[int],
        observation: Mapping[str, Any],
    ) -> list[int]:
        """Tokens to append after a completion: its closing, the observation, a new prompt.

        ``messages`` end with the assistant message of that completion. The closing's
        end-of-turn token is left out when the completion already ends with it.
        """
        before = self.renderer.render(messages, [])
        after = self.renderer.render([*messages, observation], [], generation_prompt=True)
        if not after.startswith(before):
            raise TemplateError("the template re-renders earlier turns when one is added")
        closing = list(self.closing_ids)
        if completion_ids and closing and completion_ids[-1] == closing[0]:
            closing = closing[1:]
        return closing + self.renderer.encode(after[len(before) :])

    def text(self, ids: Sequence[int]) -> str:
        """A completion's text (special tokens dropped): the assistant message's content."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))


# ---------------------------------------------------------------- policies


@attrs.frozen(kw_only=True)
class Generation:
    """What a policy generated for one turn."""

    completion_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str = "stop"
    drift: bool = False


class Policy(Protocol):
    """Generates one assistant turn; ``context_ids`` and ``messages`` describe the same context.

    A token-level policy uses ``context_ids`` (and must not re-tokenise ``messages``); a
    chat-level one sends ``messages``. ``name`` labels the trajectories.
    """

    name: str
    tokenizer: PreTrainedTokenizerBase

    async def generate(
        self, context_ids: list[int], messages: list[dict[str, Any]], max_new_tokens: int
    ) -> Generation: ...

    async def aclose(self) -> None: ...


class _HTTPPolicy:
    def __init__(
        self, base_url: str, timeout_s: float, transport: httpx.AsyncBaseTransport | None
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/") + "/",
            timeout=httpx.Timeout(timeout_s, connect=min(30.0, timeout_s)),
            transport=transport,
        )

    async def _post(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = await self._http.post(route, json=body)
        except httpx.HTTPError as exc:
            raise PolicyError(f"POST {route}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 300:
            raise PolicyError(f"POST {route}: HTTP {response.status_code}: {response.text[:2000]}")
        try:
            data = response.json()
        except ValueError as exc:
            raise PolicyError(f"POST {route}: not JSON: {response.text[:2000]}") from exc
        if not isinstance(data, dict):
            raise PolicyError(f"POST {route}: not a JSON object")
        return data

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self._http.aclose()


def _finite(values: Sequence[Any], what: str) -> list[float]:
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v) or v > 1e-6:
            raise PolicyError(f"{what}: {v!r} is not a log-probability")
        out.append(float(v))
    return out


class TokenPolicy(_HTTPPolicy):
    """A token-in/token-out ``/generate`` server (see the module docstring for the protocol).

    ``base_url`` is the server root (``http://host:port``; a trailing ``/v1`` is dropped).
    """

    def __init__(
        self,
        base_url: str,
        tokenizer: PreTrainedTokenizerBase,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        timeout_s: float = 600.0,
        name: str = "token",
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(base_url.rstrip("/").removesuffix("/v1"), timeout_s, transport)
        self.tokenizer = tokenizer
        self.name = name
        self.temperature = temperature
        self.top_p = top_p
        self.seed = seed
        self.stop_token_ids = list(stop_token_ids) if stop_token_ids is not None else None
        self._text = ChatTokens(tokenizer)
        self.requests: list[list[int]] = []
        """The ``input_ids`` of every request sent, in order (for checks)."""

    async def generate(
        self, context_ids: list[int], messages: list[dict[str, Any]], max_new_tokens: int
    ) -> Generation:
        """POST the context ids; the output ids and logprobs exactly as returned."""
        sampling: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
        }
        if self.seed is not None:
            sampling["seed"] = self.seed
        if self.stop_token_ids is not None:
            sampling["stop_token_ids"] = self.stop_token_ids
        self.requests.append(list(context_ids))
        data = await self._post(
            "generate",
            {"input_ids": list(context_ids), "sampling_params": sampling, "return_logprob": True},
        )
        raw_meta = data.get("meta_info")
        meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
        ids = data.get("output_ids")
        logprobs = data.get("output_logprobs")
        if logprobs is None and "output_token_logprobs" in meta:  # SGLang: [logprob, id, text]
            entries = meta["output_token_logprobs"]
            logprobs = [e[0] for e in entries]
            ids = ids if ids is not None else [e[1] for e in entries]
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise PolicyError(f"/generate answered without output_ids: {str(data)[:500]}")
        if not isinstance(logprobs, list) or len(logprobs) != len(ids):
            raise PolicyError("/generate must return one logprob per output id")
        finish = data.get("finish_reason", meta.get("finish_reason"))
        if isinstance(finish, dict):
            finish = finish.get("type")
        return Generation(
            completion_ids=list(ids),
            logprobs=_finite(logprobs, "/generate"),
            text=self._text.text(ids),
            finish_reason=str(finish or "stop"),
        )


def _byte_vocab(tokenizer: PreTrainedTokenizerBase) -> dict[bytes, int]:
    """token bytes -> id for a byte-level BPE vocabulary (special tokens: their text)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    decoder = {c: b for b, c in bytes_to_unicode().items()}
    special = set(tokenizer.all_special_ids)
    out: dict[bytes, int] = {}
    for piece, tid in tokenizer.get_vocab().items():
        if tid not in special and all(c in decoder for c in piece):
            out.setdefault(bytes(decoder[c] for c in piece), tid)
        else:
            out.setdefault(piece.encode("utf-8"), tid)
    return out


def token_ids_from_logprobs(
    content: Sequence[Mapping[str, Any]],
    tokenizer: PreTrainedTokenizerBase,
    byte_vocab: Mapping[bytes, int] | None = None,
) -> list[int] | None:
    """Token ids of OpenAI ``logprobs.content`` entries; None when one cannot be mapped.

    ``token_id:N`` tokens give N; otherwise ``bytes`` (or the token's UTF-8) is looked up
    in ``byte_vocab`` (default: built from ``tokenizer``, byte-level BPE).
    """
    vocab = byte_vocab if byte_vocab is not None else _byte_vocab(tokenizer)
    ids: list[int] = []
    for entry in content:
        token = entry.get("token")
        if isinstance(token, str) and token.startswith("token_id:"):
            try:
                ids.append(int(token.removeprefix("token_id:")))
            except ValueError:
                return None
            continue
        raw = entry.get("bytes")
        key = bytes(raw) if isinstance(raw, list) else str(token or "").encode("utf-8")
        if key not in vocab:
            return None
        ids.append(vocab[key])
    return ids


class ChatPolicy(_HTTPPolicy):
    """An OpenAI-compatible ``/chat/completions`` endpoint, asked for ``logprobs``.

    ``base_url`` is the API root (``http://host:port/v1``). See the module docstring for
    how completion ids are recovered and what ``drift`` means.
    """

    def __init__(
        self,
        base_url: str,
        tokenizer: PreTrainedTokenizerBase,
        *,
        model: str = "default",
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        tokens_as_ids: bool = False,
        timeout_s: float = 600.0,
        name: str = "chat",
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, timeout_s, transport)
        self.tokenizer = tokenizer
        self.name = name
        self.model = model
        self.temperature = temperature
        self.top_p = top_p
        self.seed = seed
        self.tokens_as_ids = tokens_as_ids
        self._chat = ChatTokens(tokenizer)
        self._vocab: dict[bytes, int] | None = None

    async def generate(
        self, context_ids: list[int], messages: list[dict[str, Any]], max_new_tokens: int
    ) -> Generation:
        """Send the messages; ids from the returned logprobs (see the module docstring)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "logprobs": True,
        }
        if self.seed is not None:
            body["seed"] = self.seed
        if self.tokens_as_ids:
            body["return_tokens_as_token_ids"] = True
        data = await self._post("chat/completions", body)
        try:
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
            content = (choice.get("logprobs") or {}).get("content")
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise PolicyError(f"not a chat completion: {str(data)[:500]}") from exc
        if not isinstance(content, list):
            raise PolicyError("the server returned no logprobs (it must support logprobs: true)")
        drift = self._chat.prompt_ids(messages) != context_ids
        if self._vocab is None:
            self._vocab = _byte_vocab(self.tokenizer)
        ids = token_ids_from_logprobs(content, self.tokenizer, self._vocab)
        logprobs = _finite([e.get("logprob") for e in content], "logprobs")
        if ids is None or self._chat.text(ids) != text:
            ids = self._chat.renderer.encode(text)  # the best we can do: flagged as drift
            logprobs = [0.0] * len(ids) if len(logprobs) != len(ids) else logprobs
            drift = True
        return Generation(
            completion_ids=ids,
            logprobs=logprobs,
            text=text,
            finish_reason=str(choice.get("finish_reason") or "stop"),
            drift=drift,
        )


# ---------------------------------------------------------------- the loop


@attrs.frozen(kw_only=True)
class RolloutConfig:
    """Limits of one rollout and how it is graded."""

    max_turns: int = 30
    max_new_tokens: int = 512
    """Per policy call."""
    max_context_tokens: int = 8192
    """The episode is ``truncated`` when its context reaches this."""
    max_time_s: float = 1800.0
    """Wall time of the agent loop (not grading); then ``time_exceeded``."""
    command_timeout_s: float = 180.0
    max_output_chars: int = 10_000
    """Command output is cut in the middle beyond this."""
    grade: bool = True
    """Grade ``completed`` rollouts (reward 1.0 iff resolved); others get reward 0.0."""
    default_image: str | None = None
    system_prompt: str = SYSTEM_PROMPT


def _observation(exit_code: int | None, output: str, limit: int) -> str:
    return (
        f"<returncode>{exit_code}</returncode>\n<output>\n{truncate_middle(output, limit)}</output>"
    )


async def rollout(
    task: Task,
    policy: Policy,
    client: AsyncSandboxClient,
    config: RolloutConfig | None = None,
) -> RolloutTrajectory:
    """Run one episode of ``task`` with ``policy`` in a new sandbox and grade it.

    Never raises for the model's or the sandbox's failures: they end the episode as
    ``aborted`` with ``error`` set (a template that cannot be bookkept raises
    :class:`~orchard_swe.training.sft_data.TemplateError` before anything starts).
    """
    cfg = config or RolloutConfig()
    chat = ChatTokens(policy.tokenizer)
    started = time.monotonic()
    traj = RolloutTrajectory(instance_id=task.instance_id, policy=policy.name)
    backend = None
    try:
        backend = (await client.health()).backend
        sandbox, spec = await prepare(
            client,
            task,
            backend=backend,
            hide_history=True,
            default_image=cfg.default_image,
            labels={"orchard-swe-role": "rollout"},
        )
    except (PrepareError, OrchardError) as exc:
        traj.error = f"environment: {exc}"
        traj.duration_s = time.monotonic() - started
        return traj
    status: Status | None = None
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": cfg.system_prompt.format(repo_dir=spec.repo_dir)},
        {"role": "user", "content": f"<issue>\n{task.problem_statement.strip()}\n</issue>"},
    ]
    context = chat.prompt_ids(messages)
    pending = list(context)
    deadline = time.monotonic() + cfg.max_time_s  # the loop's own time, after preparing
    try:
        base = await head_commit(sandbox, spec.repo_dir)
        while status is None:
            budget = cfg.max_context_tokens - len(context)
            if len(traj.turns) >= cfg.max_turns or budget <= 0:
                status = Status.TRUNCATED
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                status = Status.TIME_EXCEEDED
                break
            try:
                gen = await asyncio.wait_for(
                    policy.generate(
                        list(context), [dict(m) for m in messages], min(cfg.max_new_tokens, budget)
                    ),
                    remaining,
                )
            except TimeoutError:
                status = Status.TIME_EXCEEDED
                break
            traj.turns.append(
                Turn(
                    prompt_ids=pending,
                    completion_ids=list(gen.completion_ids),
                    logprobs=list(gen.logprobs),
                    loss_mask=[1] * len(gen.completion_ids),
                    finish_reason=gen.finish_reason,
                    text=gen.text,
                    drift=gen.drift,
                )
            )
            context.extend(gen.completion_ids)
            messages.append({"role": "assistant", "content": gen.text})
            action = parse_action(gen.text)
            if action == SUBMIT_COMMAND:
                status = Status.COMPLETED
                break
            if action is None:
                observation = _FORMAT_ERROR
            else:
                timeout = max(1.0, min(cfg.command_timeout_s, deadline - time.monotonic()))
                job = await sandbox.exec(
                    "exec 2>&1\n" + action, cwd=spec.repo_dir, timeout=timeout, env=SHELL_ENV
                )
                output = job.stdout + job.stderr
                if job.timed_out:
                    output += f"\n[the command timed out after {timeout:.0f} s]"
                observation = _observation(job.exit_code, output, cfg.max_output_chars)
            obs = {"role": "user", "content": observation}
            pending = chat.observation_ids(messages, gen.completion_ids, obs)
            messages.append(obs)
            context.extend(pending)
        traj.patch = await compute_final_patch(sandbox, spec.repo_dir, base)
    except (PolicyError, OrchardError, PatchError) as exc:
        status = Status.ABORTED
        traj.error = f"{type(exc).__name__}: {exc}"
    finally:
        with contextlib.suppress(OrchardError):
            await sandbox.delete()
    traj.status = status if status is not None else Status.ABORTED
    traj.messages = messages
    traj.metadata = {
        "turns": len(traj.turns),
        "context_tokens": len(context),
        "repo_dir": spec.repo_dir,
        "backend": backend,
    }
    if status == Status.COMPLETED and cfg.grade:
        if traj.patch.strip():
            result = await grade(
                client, task, traj.patch, backend=backend, default_image=cfg.default_image
            )
            traj.grade_status = result.status
            traj.metadata["grading"] = result.to_dict()
        else:
            traj.grade_status = "unresolved"
        traj.reward = 1.0 if traj.grade_status == "resolved" else 0.0
    traj.duration_s = time.monotonic() - started
    return traj
