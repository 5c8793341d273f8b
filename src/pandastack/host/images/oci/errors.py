"""What pulling or unpacking an OCI image raises; every message names the image.

    SetupError (hostport)
    └── ImageError
        ├── InvalidImageReference  the text is not an image reference
        ├── ImageNotFound          no such repository, tag or digest, or no linux/amd64 image
        ├── RegistryAuthError      the registry refused the credentials (or wants some)
        ├── RegistryUnavailable    no answer within the deadline, refused connection, 5xx
        ├── ImageTooLarge          over the image size, layer count or unpacked size bound
        └── ImageInvalid           digest mismatch, malformed JSON, unsupported media type,
            └── UnsafeLayerEntry   a layer entry that would write outside the root
"""

from __future__ import annotations

from pandastack.hostport.errors import SetupError


class ImageError(SetupError):
    def __init__(self, image: str, message: str):
        super().__init__(f"image {image}: {message}")
        self.image = image


class InvalidImageReference(ImageError):
    pass


class ImageNotFound(ImageError):
    pass


class RegistryAuthError(ImageError):
    pass


class RegistryUnavailable(ImageError):
    pass


class ImageTooLarge(ImageError):
    pass


class ImageInvalid(ImageError):
    pass


class UnsafeLayerEntry(ImageInvalid):
    pass
