"""Commands that put images where others pull them and prove what they are: `publish`,
`promote` (with their signing steps), `verify` and `keys`."""
