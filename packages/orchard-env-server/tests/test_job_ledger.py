"""The orchestrator's ledger of open jobs: what it answers for a job its agent lost."""

from __future__ import annotations

import pytest

from orchard_env_server.job_ledger import MAX_OPEN_PER_SANDBOX, JobLedger

pytestmark = pytest.mark.fast


def test_an_open_job_that_is_lost_answers_failed_with_the_reason_and_keeps_answering():
    ledger = JobLedger()
    job_id = ledger.open("sbx-1", "alice", ["sleep", "9"])
    assert job_id.startswith("sbx-1.") and len(job_id.partition(".")[2]) == 16
    lost = ledger.lost(job_id, "the agent died")
    assert lost is not None
    assert lost["status"] == "failed" and lost["exit_code"] is None
    assert lost["command"] == ["sleep", "9"] and lost["sandbox_id"] == "sbx-1"
    assert lost["error"] == "lost: the agent died; its output is gone"
    assert ledger.lost(job_id, "another reason") == lost  # the first answer stands
    assert ledger.declared_lost(job_id, "alice") == lost
    assert ledger.declared_lost(job_id, "mallory") is None  # tenants stay apart


def test_finished_and_discarded_jobs_leave_the_ledger():
    ledger = JobLedger()
    done = ledger.open("s", "t", "true")
    ledger.observe({"job_id": done, "status": "running"})
    assert ledger.get(done) is not None
    ledger.observe({"job_id": done, "status": "succeeded"})
    assert ledger.get(done) is None and ledger.lost(done, "x") is None
    gone = ledger.open("s", "t", "true")
    ledger.discard(gone)
    assert ledger.lost(gone, "x") is None and ledger.open_count("s") == 0


def test_a_lost_sandbox_loses_all_its_open_jobs_and_only_those():
    ledger = JobLedger()
    mine = [ledger.open("a", "t", f"echo {i}") for i in range(3)]
    other = ledger.open("b", "t", "echo b")
    ledger.lose_sandbox("a", "the sandbox was deleted while the job ran")
    assert all(ledger.declared_lost(j, "t") for j in mine)
    assert ledger.get(other) is not None and ledger.declared_lost(other, "t") is None


def test_open_jobs_per_sandbox_are_bounded():
    ledger = JobLedger()
    first = ledger.open("s", "t", "x")
    for _ in range(MAX_OPEN_PER_SANDBOX):
        ledger.open("s", "t", "x")
    assert ledger.open_count("s") == MAX_OPEN_PER_SANDBOX and ledger.get(first) is None


def test_another_tenants_job_is_never_answered_for():
    ledger = JobLedger()
    job_id = ledger.open("shared-name", "alice", "echo secret")
    assert ledger.lost(job_id, "gone", tenant="bob") is None  # open, but not bob's
    assert ledger.lost(job_id, "gone", tenant="alice") is not None
    assert ledger.lost(job_id, "gone", tenant="bob") is None  # declared lost, still not bob's
    assert ledger.declared_lost(job_id, "bob") is None
