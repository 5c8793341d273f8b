"""`pandastack doctor`'s checks of what the services use: their configuration, ports, the
database, the object store, and the guest images and templates built ahead. None of them
changes anything: a missing image or template is reported, not built."""

from __future__ import annotations

import errno
import socket
from typing import TYPE_CHECKING

from .doctor_model import Context, Finding, unconfigured

if TYPE_CHECKING:
    from pandastack.host.images.build import GuestImage

# The templates `pandastack setup` builds ahead; a create of another bakes it first.
SETUP_TEMPLATES = ("base", "code-interpreter")


def check_settings(ctx: Context) -> Finding:
    """The configuration both services read (PANDASTACK_* variables, the env file's under
    systemd): a malformed value stops them at start."""
    from pandastack.host.config import HostConfig
    from pandastack.server.settings import Settings

    errors = []
    try:
        ctx.settings = Settings.from_env()
    except (ValueError, TypeError) as exc:
        errors.append(f"server: {exc}")
    try:
        ctx.host = HostConfig.from_env()
    except (ValueError, TypeError) as exc:
        errors.append(f"host: {exc}")
    if errors:
        return Finding("settings", "fail", "; ".join(errors),
                       "correct the variable in /etc/pandastack/pandastack.env (or the "
                       "environment), which lists every setting with its default")
    assert ctx.settings is not None and ctx.host is not None
    return Finding("settings", "ok", f"home {ctx.host.home}, API {ctx.settings.api_url}")


def port_free(host: str, port: int) -> str | None:
    """None if `host:port` can be bound (as the server binds it), else why not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "in use"
            return exc.strerror or str(exc)
    return None


def check_ports(ctx: Context) -> Finding:
    if ctx.settings is None:
        return unconfigured("ports")
    s = ctx.settings
    taken: list[str] = []
    soft: list[str] = []
    if (why := port_free(s.host, s.port)) is not None:
        taken.append(f"API {s.host}:{s.port} ({why}; PANDASTACK_PORT)")
    preview = s.preview_listener_port
    if preview and (why := port_free(s.host, preview)) is not None:
        what = f"sandbox listener {s.host}:{preview} ({why}; PANDASTACK_PREVIEW_PORT)"
        # serve runs without a listener of its own choosing that is taken (cli/serve.py).
        (taken if s.preview_port is not None else soft).append(what)
    if taken:
        return Finding("ports", "fail", "taken: " + ", ".join(taken),
                       "stop what listens there (ss -ltnp) or choose other ports in "
                       "/etc/pandastack/pandastack.env")
    if soft:
        return Finding("ports", "warn", "taken: " + ", ".join(soft) + ": serve would run "
                       "without sandbox port URLs", "set PANDASTACK_PREVIEW_PORT to a free port")
    where = f"{s.host}:{s.port}" + (f" and :{preview}" if preview else "")
    return Finding("ports", "ok", f"free: {where}")


def check_database(ctx: Context) -> Finding:
    """Connects with the configured URL and credentials; never creates a SQLite file."""
    if ctx.settings is None:
        return unconfigured("database")
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from pandastack.server.store.db import normal_dsn

    dsn = ctx.settings.dsn
    fix = ("check PANDASTACK_DB (postgresql://USER:PASSWORD@HOST:PORT/DB, or sqlite:///PATH) "
           "and that the database answers from this host")
    try:
        url = make_url(normal_dsn(dsn))
    except Exception as exc:  # SQLAlchemy's ArgumentError and the dialects' own
        return Finding("database", "fail", f"PANDASTACK_DB is not a database URL: {exc}", fix)
    shown = url.render_as_string(hide_password=True)
    if url.get_backend_name() == "sqlite":
        from pathlib import Path

        path = Path(url.database or "")
        if not url.database or url.database == ":memory:":
            return Finding("database", "warn", f"{shown}: in memory, gone at every restart",
                           "set PANDASTACK_DB to a file or PostgreSQL")
        if not path.exists():
            parent = next(p for p in path.parents if p.exists())
            import os

            if not os.access(parent, os.W_OK):
                return Finding("database", "fail", f"{shown}: cannot be created ({parent} is "
                               "not writable)", fix)
            return Finding("database", "ok", f"{shown} (made at the first start)")
        # Read-only: a check must not turn a file into a database or change its journal.
        url = url.set(database=f"file:{path}", query={"mode": "ro", "uri": "true"})
        connect_args: dict[str, object] = {"timeout": 5}
    else:
        connect_args = {"connect_timeout": 5}
    try:
        engine = create_engine(url, connect_args=connect_args)
    except Exception as exc:  # no such dialect, or its driver not installed
        return Finding("database", "fail", f"{shown}: {exc}", fix)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # the driver's own errors: OperationalError and kin
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0][:300]
        return Finding("database", "fail", f"{shown}: {reason}", fix)
    finally:
        engine.dispose()
    return Finding("database", "ok", f"{shown} answers")


def check_object_store(ctx: Context) -> Finding:
    from pandastack.host.objects.config import ObjectStoreConfig

    try:
        config = ObjectStoreConfig.from_env()
    except ValueError as exc:
        return Finding("object store", "fail", str(exc),
                       "PANDASTACK_OBJECT_STORE=s3://BUCKET[/PREFIX]?endpoint=URL")
    if config is None:
        return Finding("object store", "ok", "none configured: snapshots and hibernated "
                       "sandboxes stay on their host")
    from pandastack.host.objects.s3 import S3Bucket
    from pandastack.hostport.errors import HostError

    bucket = S3Bucket(config)
    try:
        bucket.call("HEAD bucket", lambda: bucket.client.head_bucket(Bucket=config.bucket))
    except HostError as exc:
        return Finding("object store", "fail", str(exc),
                       "check PANDASTACK_OBJECT_STORE's endpoint and bucket and "
                       "PANDASTACK_S3_ACCESS_KEY / PANDASTACK_S3_SECRET_KEY")
    return Finding("object store", "ok", f"{config.describe()} answers")


def current_image(ctx: Context, variant: str) -> GuestImage | None:
    """The guest image this code would use for `variant`, if it is built (its key is computed
    from its inputs, as the build computes it; nothing is built). Memoized in the context."""
    from pathlib import Path

    # build.py's own key computation, private there: a copy here would drift from it.
    from pandastack.host.images.build import IMAGES, _gather, _load, image_key
    from pandastack.hostport.errors import HostError

    if ctx.host is None:
        return None
    note = f"image:{variant}"
    if note not in ctx.notes:
        try:
            inputs, _pkg, _spec = _gather(ctx.host.home, IMAGES[variant], lambda _m: None)
        except HostError as exc:  # a host tool or the guest agent's toolchain missing
            ctx.notes[f"image-error:{variant}"] = str(exc)
            return None
        ctx.notes[note] = str(ctx.host.home / "cache" / "images" / image_key(inputs))
    final = Path(ctx.notes[note])
    if not (final / "image.json").exists():
        return None
    return _load(final, final.name, variant)


def check_images(ctx: Context) -> Finding:
    if ctx.host is None:
        return unconfigured("guest image")
    variants = ("base", "code-interpreter")
    missing = [v for v in variants if current_image(ctx, v) is None]
    errors = [ctx.notes[f"image-error:{v}"] for v in variants if f"image-error:{v}" in ctx.notes]
    if errors:
        return Finding("guest image", "fail", f"cannot be built here: {errors[0]}",
                       "install the host's build tools: scripts/host-deps.sh")
    if "base" in missing:
        return Finding("guest image", "fail", f"not built: {', '.join(missing)}",
                       "run `pandastack setup` (as root, minutes: it builds the guest image and "
                       "the templates)")
    if missing:
        return Finding("guest image", "warn", f"not built: {', '.join(missing)} (the first "
                       "sandbox of its template waits for its build)", "run `pandastack setup`")
    return Finding("guest image", "ok", f"built: {', '.join(variants)}")


def template_dir(ctx: Context, name: str) -> str | None:
    """The directory of `name`'s current version (baked or not); "" when its image is not
    built (so neither is it); None where its key cannot be known (the accelerator unknown).
    The QEMU driver's key: the caller checks that it is the configured one."""
    from pandastack.host.templates.builtin import BUILTIN_TEMPLATES, template_key
    from pandastack.host.vmm.driver import MachineShape
    from pandastack.host.vmm.qemu.driver import QemuDriver

    host = ctx.host
    assert host is not None
    builtin = BUILTIN_TEMPLATES[name]
    image = current_image(ctx, builtin.image)
    if image is None:
        return ""
    if ctx.accel is None:
        return None
    driver = QemuDriver(ctx.accel, binary=host.qemu_binary, tb_size_mb=host.tb_size_mb,
                        tcg_cpu=host.tcg_cpu, volume_slots=host.volume_slots)
    key = template_key(image, driver, MachineShape(), builtin.key_parts(),
                       host.guest_kernel_args(ctx.accel))
    return str(host.templates_dir / name / key)


def check_templates(ctx: Context) -> Finding:
    from pathlib import Path

    if ctx.host is None:
        return unconfigured("templates")
    if ctx.host.vmm != "qemu":
        return Finding("templates", "warn", f"not checked for the {ctx.host.vmm} driver",
                       "run `pandastack setup` to be sure they are baked")
    dirs = {name: template_dir(ctx, name) for name in SETUP_TEMPLATES}
    missing = [n for n, d in dirs.items() if d is not None and
               not (d and (Path(d) / "template.json").exists())]
    if missing:
        return Finding("templates", "warn", f"not baked for this host: {', '.join(missing)} "
                       "(the first sandbox of each bakes it: minutes)", "run `pandastack setup`")
    unknown = [n for n, d in dirs.items() if d is None]
    if unknown:
        return Finding("templates", "warn", f"not checked: {', '.join(unknown)} (their key "
                       "holds the accelerator, not proven yet)",
                       "run `pandastack doctor` without --quick")
    return Finding("templates", "ok", f"baked: {', '.join(SETUP_TEMPLATES)}")
