"""runs-fleet's queue processors, clean-up tasks, dead letters and pool audit (docs/fleet.md)."""
