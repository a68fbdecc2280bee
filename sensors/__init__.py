"""Sensors that span capabilities (capability-specific ones live beside their capability)."""
