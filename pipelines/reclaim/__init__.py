"""Agenda reclaim (seed 000): fail or retry stale AgendaProgress, by scan or index query."""
