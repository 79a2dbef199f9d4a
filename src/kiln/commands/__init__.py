"""kiln's commands layer (docs/architecture.md)."""
