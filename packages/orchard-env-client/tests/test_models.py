"""Wire models: lossless round trips, tolerant parsing, requests without nulls."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchard_env_client import models

pytestmark = pytest.mark.fast

text = st.text(max_size=20)
opt_float = st.none() | st.floats(allow_nan=False, allow_infinity=False)
labels = st.dictionaries(text, text, max_size=3)

jobs = st.builds(
    models.Job,
    job_id=text,
    command=st.none() | text | st.lists(text, max_size=3),
    status=st.sampled_from(["queued", "running", "succeeded", "failed"]),
    stdout=text,
    exit_code=st.none() | st.integers(-255, 255),
    created_at=opt_float,
    timed_out=st.booleans(),
    usage=st.none()
    | st.builds(models.Usage, cpu_user_s=opt_float, max_rss_bytes=st.none() | st.integers(0)),
)


@given(jobs)
def test_job_round_trips(job):
    assert models.Job.from_json(job.to_json()) == job


@given(
    st.builds(
        models.CreateSandboxRequest,
        image=text,
        block_network=st.booleans(),
        sandbox_id=st.none() | text,
        timeout=opt_float,
        env=st.none() | labels,
        labels=st.none() | labels,
        ttl_seconds=opt_float,
    )
)
def test_create_request_round_trips_and_omits_nulls(req):
    wire = req.to_json()
    assert None not in wire.values()
    assert models.CreateSandboxRequest.from_json(wire) == req


@given(st.builds(models.Sandbox, sandbox_id=text, status=text, labels=labels, expires_at=opt_float))
def test_sandbox_round_trips(sandbox):
    assert models.Sandbox.from_json(sandbox.to_json()) == sandbox


@given(jobs)
def test_exit_events_carry_the_job_inline(job):
    event = models.ExecEvent(type="exit", job=job)
    wire = event.to_json()
    assert wire["type"] == "exit" and wire["job_id"] == job.job_id
    assert models.ExecEvent.from_json(wire) == event


def test_unknown_response_fields_are_ignored():
    job = models.Job.from_json({"job_id": "j", "status": "running", "new_field": 1})
    assert job.status == "running" and not job.succeeded and not job.done


def test_request_models_are_registered_with_their_field_names():
    names = {n: [f.name for f in attrs.fields(c)] for n, c in models.REQUEST_MODELS.items()}
    assert names["ExecRequest"] == [
        "command",
        "timeout_seconds",
        "cwd",
        "env",
        "login_shell",
        "wait",
        "stdin",
    ]
    assert "idle_timeout_seconds" in names["CreateSandboxRequest"]
    assert set(names) == {
        "CreateSandboxRequest",
        "ExecRequest",
        "ApplyPatchRequest",
        "WriteFileRequest",
    }
