"""scripts/cluster.py's pure parts, without a cluster: what each agent is told to dial."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from pandastack.host.objects import ObjectStoreConfig

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cluster.py"


def cluster_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cluster_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_agents_object_store_names_the_relay_not_this_namespaces_loopback() -> None:
    # What scripts/s3-server prints: the endpoint inside the URL's query (issue 33).
    url = "s3://pandastack?endpoint=http://127.0.0.1:41234&region=us-east-1"
    agents = cluster_script().via(url, "10.213.0.5")
    config = ObjectStoreConfig.from_url(agents, {})
    assert config.endpoint == "http://10.213.0.5:41234"
    assert (config.bucket, config.region) == ("pandastack", "us-east-1")


def test_via_keeps_a_dsns_credentials_and_only_moves_its_host() -> None:
    dsn = "postgresql+psycopg://postgres:pa%2Fss@127.0.0.1:5433/postgres"
    assert cluster_script().via(dsn, "10.213.0.1") == \
        "postgresql+psycopg://postgres:pa%2Fss@10.213.0.1:5433/postgres"
