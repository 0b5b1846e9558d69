"""The OpenHands agent (``openhands-sdk``) as an Orchard SWE harness.

* :mod:`.terminal` / :mod:`.editor`: executors of OpenHands' stock ``terminal`` and
  ``file_editor`` tools that act in an Orchard sandbox;
* :mod:`.tools`: those tools bound to a sandbox for one conversation;
* :mod:`.runner`: :func:`~.runner.run_openhands_agent` (one episode in a prepared sandbox)
  and :func:`~.runner.run_task` (prepare, run, grade);
* :mod:`.convert`: OpenHands events → an Orchard trajectory;
* :mod:`.cli`: ``orchard-openhands run``.

Needs Python >= 3.12 (the SDK's floor). Submodules are not imported here: importing the
SDK takes seconds. Importing this package sets, unless already set,
``LITELLM_LOCAL_MODEL_COST_MAP=True`` (litellm would otherwise fetch its price list from the
internet, with retries) and ``OPENHANDS_SUPPRESS_BANNER=1``.
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")

__all__: list[str] = []
