"""OCI images from registries (ADR 0046): references, the distribution protocol's pull, the
layer cache by digest, and layers applied into a root filesystem directory."""
