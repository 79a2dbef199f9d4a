"""kiln's basics layer (docs/architecture.md)."""
