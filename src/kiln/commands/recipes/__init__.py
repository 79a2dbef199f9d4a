"""Commands about recipes and what they pin, before any image is built: `list`, `show`,
`check`, `schema`, `plan` (does a recipe fit its GPUs), the patch-series tools
(`patches`, `engine`, `override`) and `kiln engine lock`."""
