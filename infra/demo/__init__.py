"""``make dev``'s demo, a dev-only package: the product's local definitions plus the demo
(``definitions.py``, the code location ``workspace.yaml`` loads), the demo traffic jobs and their
schedules (``defs.py``), each capability's demo traffic (``reclaim.py``, ``fleet.py``,
``batching.py``, ``progressor.py``; plain), the demo's cadence (``cadence.py``) and targets files
(``targets/``). Not imported by the product, not installed, not in the production image."""
