"""Model judges of GUI trajectories (WebJudge's three stages, a single-call judge) and
batch judging of run files; the prompts are package data under ``judges/prompts``."""

from .batch import JudgeFileSummary, judge_file, judged_copy, trajectory_key
from .core import (
    JUDGE_METHODS,
    JudgeConfig,
    JudgeResult,
    judge_trajectory,
    load_prompt,
    single_judge,
    webjudge,
)
from .parse import UNKNOWN, parse_key_points, parse_score, parse_verdict

__all__ = [
    "JUDGE_METHODS",
    "UNKNOWN",
    "JudgeConfig",
    "JudgeFileSummary",
    "JudgeResult",
    "judge_file",
    "judge_trajectory",
    "judged_copy",
    "load_prompt",
    "parse_key_points",
    "parse_score",
    "parse_verdict",
    "single_judge",
    "trajectory_key",
    "webjudge",
]
