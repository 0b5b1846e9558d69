"""Orchard's personal-assistant recipe: assistant tasks in seeded sandboxes, graded by
programmatic checkers, run under our ReAct harness or a foreign harness (openclaw, codex,
opencode) inside the sandbox, and scored with unbiased pass@k / pass^k."""
