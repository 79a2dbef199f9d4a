"""kiln's infra layer (docs/architecture.md)."""
