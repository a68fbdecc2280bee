"""POP's agenda reclaimer: fail or retry stale AgendaProgress items, by scan or index query."""
