"""kiln's patch series, one module per job:

- applier:     the in-image applier and its parser (kiln.inimage.patch_applier, patch_format: stdlib only;
               the two patch files engine images carry);
- text_diff:   host-only unified diffs and the 3-way merge (`git merge-file --diff3`);
- series:      where series live (engine-wide, per feature and engine version), `patches check`;
- quilt:       scratch trees for editing a series: checkout / refresh;
- quilt_state: which series a scratch tree edits, where it lives, and its state file (.pc/kiln.json);
- bump:        `kiln engine bump`;
- arg_surface: an engine version's CLI flags and speculative-config keys, read statically from its sources,
               and what changed between two versions;
- bump_report: `kiln engine bump --dry-run --report`: the report (flags, every series' patches,
               requirements, image size), as text and Markdown;
- outdated:    `kiln engine outdated`: recipes' engine pins against the index's releases and kiln's series;
- rebase:      `kiln override rebase` / `to-patch`;
- overlay:     what a recipe image carries for a switched-on feature (used by the builder);
- yaml_edits:  round-trip YAML edits (ruamel.yaml).

The CLI wiring is kiln.commands.recipes.patches and kiln.commands.recipes.engine. This file
imports nothing, so that loading the applier as `kiln.inimage.patch_applier` costs nothing
more than the applier itself.
"""
