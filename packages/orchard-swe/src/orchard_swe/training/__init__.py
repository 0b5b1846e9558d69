"""Training-side logic of the SWE recipe: BAR, credit-assignment SFT, SFT data, rollouts.

Pure and framework-neutral (no sandboxes, no trainer): :mod:`.bar` allocates rollouts,
:mod:`.credit` turns value curves into SFT samples, :mod:`.barsim` simulates BAR against
fixed-n GRPO and DAPO-style dynamic sampling. With a tokenizer (:mod:`.tokenizer`, no
torch): :mod:`.sft_data` tokenizes trajectories and credit samples with exact assistant-only
masks. With sandboxes and a model server: :mod:`.rollout` runs token-exact RL rollouts.
"""
