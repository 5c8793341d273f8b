"""The built-in template table and unknown names, without VMs."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from pandastack.host.images.build import IMAGES, GuestImage
from pandastack.host.templates.builtin import (
    BUILTIN_TEMPLATES,
    IMAGE_WARMUP_COMMANDS,
    WARMUP_COMMANDS,
    BuiltinTemplate,
    TemplateStore,
    template_key,
)
from pandastack.host.vmm.driver import MachineShape, VMMDriver
from pandastack.hostport.errors import SetupError, TemplateNotFound


def test_builtins_name_known_images() -> None:
    assert {"base", "python", "node"} <= set(BUILTIN_TEMPLATES)
    for name, builtin in BUILTIN_TEMPLATES.items():
        assert builtin.name == name
        assert builtin.image in IMAGES
        if builtin.same_as is not None:
            target = BUILTIN_TEMPLATES[builtin.same_as]
            assert (target.image, target.warmup, target.same_as) == (
                builtin.image, builtin.warmup, None)
    assert BUILTIN_TEMPLATES["python"].same_as == "base"
    assert BUILTIN_TEMPLATES["node"].image == "node"


def test_full_runs_each_language_before_its_snapshot() -> None:
    """`full` (issue 37): each language once before the snapshot, so a sandbox's first use
    is warm; go builds once (the build cache), gcc compiles once; the interpreter as in
    `node`. Its warm-ups are part of its key (key_parts)."""
    full, node = BUILTIN_TEMPLATES["full"], BUILTIN_TEMPLATES["node"]
    assert (full.image, full.same_as, full.base_warmup) == ("full", None, None)
    assert "python3 -c" in " ".join(WARMUP_COMMANDS)  # every built-in's, full's too
    for needle in ("node -e", "bun -e", "go version", "go build", "gcc "):
        assert any(needle in cmd for cmd in full.warmup), needle
    assert (full.start, full.ready) == (node.start, node.ready)
    assert set(full.warmup) <= set(full.key_parts())


async def test_unknown_template_asks_for_no_image(tmp_path: Path) -> None:
    asked: list[str] = []

    async def images(variant: str, progress: Any) -> GuestImage:
        asked.append(variant)
        raise AssertionError("no image should be needed")

    store = TemplateStore(tmp_path, cast(VMMDriver, None), images)
    with pytest.raises(TemplateNotFound):
        await store.ensure("no-such-template", progress=lambda m: None)
    assert asked == [] and list(tmp_path.iterdir()) == []


def test_kernel_args_are_part_of_the_template_key(tmp_path: Path) -> None:
    class Driver:
        def identity(self) -> str:
            return "some-vmm|tcg|max|v1"

    image = GuestImage(key="img", kernel=tmp_path / "k", initrd=tmp_path / "i",
                       rootfs=tmp_path / "r", kernel_version="6.1", cmdline="console=ttyS0",
                       variant="base")
    driver = cast(VMMDriver, Driver())
    plain = template_key(image, driver, MachineShape())
    assert template_key(image, driver, MachineShape(), (), " norandmaps") != plain
    assert template_key(image, driver, MachineShape(), (), "") == plain


async def test_an_images_template_has_its_own_warm_up_in_its_key(tmp_path: Path) -> None:
    """Built-ins' keys are what they were (no base_warmup part); an OCI image's template warms
    with IMAGE_WARMUP_COMMANDS (an image need not have python3), part of its key, and may
    not take a built-in's name."""
    assert all(not any(p.startswith("base_warmup:") for p in b.key_parts())
               for b in BUILTIN_TEMPLATES.values())
    image_template = BuiltinTemplate("mine", "oci:x", base_warmup=IMAGE_WARMUP_COMMANDS)
    assert image_template.key_parts() == tuple(f"base_warmup:{c}" for c in IMAGE_WARMUP_COMMANDS)
    store = TemplateStore(tmp_path, cast(VMMDriver, None), cast(Any, None))
    image = GuestImage(key="img", kernel=tmp_path / "k", initrd=tmp_path / "i",
                       rootfs=tmp_path / "r", kernel_version="6.1", cmdline="", variant="oci:x")
    with pytest.raises(SetupError, match="built-in template's name"):
        await store.ensure_image("base", image)
