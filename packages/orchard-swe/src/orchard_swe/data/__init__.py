"""Training data: trajectories and credit samples as tokenized chat samples.

:mod:`.chat_format` prepares OpenAI chat messages for a chat template (standard library
only: the tiny LLM server imports it in its own venv); :mod:`.tokenizer` loads tokenizers
without torch; :mod:`.sft_data` tokenizes samples with exact assistant-only loss masks.
Importing this package imports nothing else.
"""
