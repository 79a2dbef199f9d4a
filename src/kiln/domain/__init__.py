"""kiln's domain layer (docs/architecture.md)."""
