#!/bin/sh
# Remove from the engine venv what vLLM never loads at run time, then report the
# largest trees so the next candidate is chosen by measurement, not by guess.
# Runs in the builder stage: removals here never reach a final-image layer.
set -eu
venv=$1
sp=$(ls -d "$venv"/lib/python3*/site-packages)
echo "strip-venv: before: $(du -sm "$venv" | cut -f1) MB"
echo "strip-venv: largest packages:"
du -sm "$sp"/* | sort -rn | head -25
echo "strip-venv: largest nvidia/ trees:"
du -sm "$sp"/nvidia/* "$sp"/nvidia/*/* 2>/dev/null | sort -rn | head -25
echo "strip-venv: largest files:"
find "$venv" -type f -size +40M -exec du -m {} + | sort -rn | head -30
echo "strip-venv: static libraries: $(find "$venv" -name '*.a' -exec du -cm {} + | tail -1)"
echo "strip-venv: after: $(du -sm "$venv" | cut -f1) MB"
