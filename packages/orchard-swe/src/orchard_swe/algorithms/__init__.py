"""The recipe's algorithms: rollout allocation, credit assignment, value estimation, rollouts.

:mod:`.bar` allocates rollouts (BAR, with :mod:`.bar_reference` the public reference's rules
and :mod:`.bar_replay` both replayed on recorded prompts); :mod:`.barsim` simulates BAR
against fixed-n GRPO and DAPO-style dynamic sampling; :mod:`.credit` turns value curves
into SFT samples; :mod:`.estimators` estimates those curves (Monte-Carlo replay in
sandboxes, an LLM judge); :mod:`.rollout` runs token-exact RL rollouts. No trainer and no
torch here: the trainers are in :mod:`orchard_swe.trainers`.
"""
