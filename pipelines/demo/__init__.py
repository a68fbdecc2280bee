"""Local-only demo traffic, so every capability has live data in the UI under ``make dev``."""
