"""What pulling or unpacking an OCI image raises: the host port's image errors
(hostport/errors.py, so the host API carries them by name and the API answers each with its
status), made here with the image's name first in the message.

    ImageError (hostport)
    ├── ImageNotFound          no such repository, tag or digest, or no linux/amd64 image
    ├── RegistryAuthError      the registry refused the credentials (or wants some)
    ├── RegistryUnavailable    no answer within the deadline, refused connection, 5xx
    ├── ImageTooLarge          over the image size, layer count or unpacked size bound
    └── ImageInvalid           digest mismatch, malformed JSON, unsupported media type,
        ├── InvalidImageReference  the text is not an image reference
        └── UnsafeLayerEntry   a layer entry that would write outside the root
"""

from __future__ import annotations

from pandastack.hostport import errors as port


class ImageError(port.ImageError):
    def __init__(self, image: str, message: str):
        super().__init__(f"image {image}: {message}")
        self.image = image


class ImageNotFound(ImageError, port.ImageNotFound):
    pass


class RegistryAuthError(ImageError, port.RegistryAuthError):
    pass


class RegistryUnavailable(ImageError, port.RegistryUnavailable):
    pass


class ImageTooLarge(ImageError, port.ImageTooLarge):
    pass


class ImageInvalid(ImageError, port.ImageInvalid):
    pass


class InvalidImageReference(ImageInvalid):
    pass


class UnsafeLayerEntry(ImageInvalid):
    pass
