from __future__ import annotations

import pytest

from pandastack.host.objects import ObjectStoreConfig
from pandastack.host.objects.config import MAX_PARTS, MiB


def test_url_and_environment() -> None:
    env = {"PANDASTACK_S3_ACCESS_KEY": "a:b", "PANDASTACK_S3_SECRET_KEY": "s",
           "PANDASTACK_S3_ENDPOINT": "http://127.0.0.1:1", "PANDASTACK_S3_REGION": "eu-1"}
    cfg = ObjectStoreConfig.from_url("s3://bkt/some/prefix/?part_mb=16&parallel=2", env)
    assert (cfg.bucket, cfg.prefix, cfg.endpoint, cfg.region) == (
        "bkt", "some/prefix/", "http://127.0.0.1:1", "eu-1")
    assert (cfg.access_key, cfg.secret_key, cfg.part_size, cfg.parallel) == ("a:b", "s",
                                                                               16 * MiB, 2)
    # The URL's endpoint and region win over the environment's.
    cfg = ObjectStoreConfig.from_url("s3://bkt?endpoint=http://h:2&region=r", env)
    assert (cfg.prefix, cfg.endpoint, cfg.region) == ("", "http://h:2", "r")
    assert "s" not in cfg.describe().split()  # no secret in messages

    assert ObjectStoreConfig.from_env({}) is None
    assert ObjectStoreConfig.from_env({"PANDASTACK_OBJECT_STORE": "s3://b"}) == (
        ObjectStoreConfig(bucket="b"))


@pytest.mark.parametrize("url", ["http://b", "s3:///prefix", "s3://b?part_mb=1",
                                 "s3://b?parallel=0", "s3://b?colour=red", "s3://b?part_mb=x"])
def test_bad_urls(url: str) -> None:
    with pytest.raises(ValueError):
        ObjectStoreConfig.from_url(url, {})


def test_half_the_credentials() -> None:
    with pytest.raises(ValueError, match="both"):
        ObjectStoreConfig.from_url("s3://b", {"PANDASTACK_S3_ACCESS_KEY": "a"})


def test_part_size_grows_to_fit_the_part_limit() -> None:
    cfg = ObjectStoreConfig(bucket="b")
    assert cfg.part_size_for(40 * MiB) == 8 * MiB
    big = 100 << 30
    part = cfg.part_size_for(big)
    assert part % MiB == 0 and -(-big // part) <= MAX_PARTS
