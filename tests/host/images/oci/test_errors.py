"""The image errors: raised in the room with the image's name, carried by the host API as the
host port's classes, answered by the API with their status."""

from __future__ import annotations

from pandastack.host.images.oci import errors as room
from pandastack.hostport import errors as port
from pandastack.hostport.host_api.codec import decode_error, encode_error, status_of
from pandastack.server.web.errors import from_host_error


def test_image_errors_are_the_host_ports_and_travel_with_their_status() -> None:
    """Raised in the room with the image's name; encoded over the host API as the host
    port's class (with `image`), and answered by the API with a 4xx (502: the registry)."""
    cases = [(room.ImageNotFound, port.ImageNotFound, 404, "not_found"),
             (room.RegistryAuthError, port.RegistryAuthError, 403, "forbidden"),
             (room.RegistryUnavailable, port.RegistryUnavailable, 502, "bad_gateway"),
             (room.ImageTooLarge, port.ImageTooLarge, 413, "payload_too_large"),
             (room.UnsafeLayerEntry, port.ImageInvalid, 422, "validation_error"),
             (room.InvalidImageReference, port.ImageInvalid, 422, "validation_error")]
    for raised, carried, status, code in cases:
        exc = raised("ghcr.io/acme/app:4", "what went wrong")
        assert isinstance(exc, room.ImageError) and isinstance(exc, carried)
        again = decode_error(encode_error(exc).error)
        assert type(again) is carried and str(again) == "image ghcr.io/acme/app:4: what went wrong"
        assert again.image == "ghcr.io/acme/app:4"
        assert status_of(exc) == status
        api = from_host_error(again)
        assert (api.status, api.code) == (status, code)
        assert "ghcr.io/acme/app:4" in api.message
