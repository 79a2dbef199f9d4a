"""Does a recipe fit its GPUs (`kiln plan`): per GPU, the recipe's weights, KV cache and
engine reserve against capacity x gpu-memory-utilization (domain/planning/plan.py says how
each is counted)."""

from __future__ import annotations

from kiln.basics.errors import UsageError
from kiln.domain.images.image_files import recipe_image_reader
from kiln.domain.planning.model_shape import plan_input
from kiln.domain.planning.plan import Layout, Plan, compute
from kiln.domain.recipes.accelerators import ACCELERATORS, NAMES, Accelerator
from kiln.domain.recipes.resolved import ResolvedRecipe
from kiln.domain.recipes.topology import effective


def plan_recipe(resolved: ResolvedRecipe, *, gpu: str | None = None, gpus: int | None = None) -> Plan:
    """The plan of a recipe on its own GPUs, or on `gpus` x `gpu` (its overrides are never
    read: a plan is arithmetic)."""
    loaded = resolved.loaded
    recipe = loaded.recipe
    topo = effective(recipe)
    inp = plan_input(loaded, image_json=recipe_image_reader(loaded.name))
    if recipe.engine.flavour == "cpu":
        return compute(inp, None, Layout.of(topo), nodes=topo.nodes)
    name = gpu or topo.accelerator
    if name is None:
        raise UsageError(f"{recipe.name} names no GPU (topology.accelerator): pass --gpu ({', '.join(NAMES)})")
    acc: Accelerator = ACCELERATORS[name]
    layout = Layout.of(topo)
    if gpus is not None and gpus != layout.gpus:
        layout = layout.over(gpus)
    nodes = (
        topo.nodes
        if layout.gpus == topo.nodes * topo.accelerators_per_node
        else max(1, -(-layout.gpus // max(1, topo.accelerators_per_node)))
    )
    return compute(inp, acc, layout, nodes=nodes)


# the use-case's surface: what a command, or a caller in Python, imports from here
__all__ = ["plan_recipe"]
