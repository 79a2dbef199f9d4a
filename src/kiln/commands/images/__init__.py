"""Commands that make, inspect or remove images: `build`, `base`, `prune`, `rebuild` and
`sbom`."""
