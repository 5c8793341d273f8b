"""An operator's registry that serves HTTPS with a certificate of its own CA (a mirror on
loopback here, Debian's docker-registry with `http.tls`): a pull fails naming the certificate
until PANDASTACK_REGISTRY_CA_BUNDLE names that CA, then works. No VM."""

from __future__ import annotations

from pathlib import Path

import pytest

from pandastack.host.images.oci.errors import RegistryUnavailable
from pandastack.host.images.oci.settings import RegistrySettings
from tests.host.images.oci.conftest import needs_registry
from tests.host.images.oci.helpers import pull, push_image
from tests.host.images.oci.layers import file, gzipped
from tests.host.images.oci.registry import run_registry
from tests.tls_certs import make_test_certs

pytestmark = needs_registry


def test_a_tls_registry_is_trusted_through_the_ca_bundle_setting(
        tmp_path: Path, skopeo_policy: Path) -> None:
    certs = make_test_certs(tmp_path / "certs")
    with run_registry(tmp_path / "registry", tls=(certs.server.cert, certs.server.key)) as tls:
        push_image(tls, tmp_path, skopeo_policy, "tests/tls", [gzipped([file("hello", "tls")])])
        image = "mirror.test/tests/tls:v1"
        env = {"PANDASTACK_REGISTRY_MIRRORS": f"mirror.test={tls.host}"}
        with pytest.raises(RegistryUnavailable,
                           match=f"image {image}: registry {tls.host} could not be reached "
                                 r"\(ConnectError: .*CERTIFICATE_VERIFY_FAILED"):
            pull(image, tmp_path, RegistrySettings.from_env(env))
        trusting = RegistrySettings.from_env(
            {**env, "PANDASTACK_REGISTRY_CA_BUNDLE": str(certs.ca)})
        _, rootfs = pull(image, tmp_path, trusting)
        assert (rootfs / "hello").read_text() == "tls"
