"""MMEngine registries of the plugin: where config ``type=`` entries are resolved.

Our MMEngine classes register into MMEngine's root registries with a decorator in their own module:
``GRPOLoop`` (``LOOPS``), the hooks (``HOOKS``), ``Sa2VATrainModel`` (``MODELS``). Lazy pure-Python configs
(``from ... import GRPOLoop`` + ``type=GRPOLoop``, as upstream Sa2VA's) need no registration at all; it serves
string configs (``type='GRPOLoop'`` with ``custom_imports=dict(imports=['projects.llava_sam2.rl_train.engine'])``).

``grpo/`` stays framework-free (docs/architecture.md), so its algorithm classes are registered here, in ``ALGORITHMS``
(``CycleGRPO``); rewards keep their own name registry (``rewards.base.REWARDS``), which ``CycleGRPO`` builds
from. Build with :func:`build_component`: ``ALGORITHMS`` has no parent in MMEngine's tree, and ``Registry.build``
would look for the runner's default scope (``mmengine``) there and warn on every build.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mmengine.registry import Registry

ALGORITHMS = Registry("grpo algorithm", scope="sa2va_rl")


def register_algorithms() -> None:
    """Register the framework-free algorithm classes of ``grpo/`` (idempotent)."""
    from ..grpo.trainer import CycleGRPO

    if ALGORITHMS.get("CycleGRPO") is None:
        ALGORITHMS.register_module(module=CycleGRPO)


def build_component(registry: Registry, cfg: Mapping[str, Any], **default_args: Any) -> Any:
    """Instantiate ``cfg`` (``dict(type=<class or registered name>, **kwargs)``); ``default_args`` fill in
    keys the config does not set (live objects such as the model, as in MMEngine's ``default_args``)."""
    if not isinstance(cfg, Mapping) or "type" not in cfg:
        raise TypeError(f"build_component({registry.name}): expected a config dict with a 'type' key, got {cfg!r}.")
    args = dict(cfg.items())  # ConfigDict.items() resolves lazy `type=Class` values
    kind = args.pop("type")
    if isinstance(kind, str):
        cls = registry.get(kind)
        if cls is None:
            raise KeyError(f"{kind!r} is not registered in the {registry.name!r} registry (known: "
                           f"{sorted(registry.module_dict)}); import its module or use type=<the class>.")
    elif callable(kind):
        cls = kind
    else:
        raise TypeError(f"build_component({registry.name}): type must be a class or a registered name, got {kind!r}.")
    for key, value in default_args.items():
        args.setdefault(key, value)
    return cls(**args)
