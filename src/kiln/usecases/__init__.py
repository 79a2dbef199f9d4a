"""kiln's use-cases layer (docs/architecture.md): one function per thing a user does
(build an engine or a recipe image, smoke, publish, check, plan, render, rebuild), typed
in and typed out; the commands parse, call one, and print."""
