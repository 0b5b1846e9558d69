"""Test and demo scaffolding, apart from the recipe.

:mod:`.replay` scripts the shared scripted model server (the offline demo and the proof's
data use it too); :mod:`.tiny_llm_server` is a real tiny model behind an OpenAI-compatible
endpoint, run in its own venv by :class:`.tiny_llm.TinyLLMServer`. Importing this package
imports nothing else (the server imports its modules in the tiny-LLM venv).
"""
