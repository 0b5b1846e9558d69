"""Trainers: TRL's SFT and GRPO trainers and the value model, on CPU torch.

The workspace venv has no torch, so each trainer is a workspace front end
(:mod:`.sft_train`, :mod:`.grpo_train`, :mod:`.value_model`) and a worker script
(``*_worker.py``) that runs in the training venv (:mod:`.llm_venv`), started and read by
:func:`orchard_swe.trainers.worker.run_worker`. :mod:`.trl_grpo` adapts BAR and sandbox
rewards to TRL's ``GRPOTrainer``. Importing this package imports nothing else (the workers
import its modules in the training venv).
"""
