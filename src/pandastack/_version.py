"""The version of pandastack: the one place it is written. pyproject.toml reads it for the
package's metadata, `pandastack --version` prints it, agents report it to the registry and
the OpenAPI documents carry it. The guest agent's copy (`pandastack.guest.__version__`, a
package that imports nothing of the host) is held to it by tests/cli/test_version.py.
A release is `X.Y.Z` and tagged `vX.Y.Z`; between releases it is the next one's `.dev0`
(docs/releasing.md)."""

__version__ = "0.2.0.dev0"
