"""Commands that serve a built image or prepare to: `run`/`ps`/`logs`/`stop`, `smoke`,
`render` (Kubernetes manifests) and `fetch` (the recipe's model snapshots)."""
