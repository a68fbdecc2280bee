"""The local demo: the ``demo_traffic`` job runs each capability's demo traffic
(``pipelines/<capability>/demo.py``), so every capability has live data in the UI under ``make dev``."""
