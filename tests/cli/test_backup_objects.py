"""`pandastack backup objects DIR` and `pandastack restore objects DIR` as an operator runs
them (docs/backup.md): the store named by PANDASTACK_OBJECT_STORE, copied out,
lost, put back; the session's real S3 server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from pandastack.host.objects import ObjectStore, ObjectStoreConfig


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pandastack", *args], text=True,
                          capture_output=True, timeout=180, env=env)


async def test_backup_and_restore_objects_through_the_cli(s3_env: dict[str, str],
                                                          tmp_path: Path) -> None:
    url = f"s3://{s3_env['PANDASTACK_S3_BUCKET']}/cli-{uuid.uuid4().hex[:12]}"
    env = {**os.environ, **s3_env, "PANDASTACK_OBJECT_STORE": url}
    config = ObjectStoreConfig.from_url(url, s3_env)
    store = ObjectStore(config, tmp_path / "host-cache")
    try:
        (tmp_path / "image").write_bytes(os.urandom(50_000))
        key = await store.put_file(tmp_path / "image")
        store.bucket.put_manifest("templates/t1", json.dumps({"rootfs": key}).encode())

        made = cli(env, "backup", "objects", str(tmp_path / "bk"))
        assert made.returncode == 0, made.stderr
        assert "backed up 1 objects (1 fetched" in made.stderr and "1 manifests" in made.stderr

        store.bucket.delete(key)
        store.bucket.delete_manifest("templates/t1")
        put_back = cli(env, "restore", "objects", str(tmp_path / "bk"))
        assert put_back.returncode == 0, put_back.stderr
        assert "restored 1 objects and 1 manifests" in put_back.stderr
        assert store.bucket.size_of(key) == 50_000
        assert json.loads(store.bucket.get_manifest("templates/t1") or b"") == {"rootfs": key}

        # No store configured, or no backup there: a clear error, exit 1, no traceback.
        bare = {k: v for k, v in env.items() if k != "PANDASTACK_OBJECT_STORE"}
        unset = cli(bare, "backup", "objects", str(tmp_path / "bk2"))
        assert unset.returncode == 1 and "no object store" in unset.stderr
        missing = cli(env, "restore", "objects", str(tmp_path / "nowhere"))
        assert missing.returncode == 1 and "no backup directory" in missing.stderr
        assert "Traceback" not in unset.stderr + missing.stderr
    finally:
        await store.close()
