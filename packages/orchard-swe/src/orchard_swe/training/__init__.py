"""Training-side logic of the SWE recipe: BAR rollout allocation and credit-assignment SFT.

Framework-neutral and pure (no sandboxes, no trainer): :mod:`.bar` allocates rollouts,
:mod:`.credit` turns value curves into SFT samples, :mod:`.barsim` simulates BAR against
fixed-n GRPO and DAPO-style dynamic sampling.
"""
