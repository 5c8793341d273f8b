"""The REST contract of the searches in a sandbox's files: grep (a literal substring in the
lines of the files under a path) and glob (the paths under a path that a pattern matches).
The guest walks its own file system (spec/guest-protocol.md §5); its bounds are the guest
protocol's, read from there so that a request the guest would refuse fails here first."""

from __future__ import annotations

from pydantic import Field, field_validator

from pandastack.guestproto.ops import (
    GLOB_MAX_PATHS,
    GREP_BINARY_PROBE_BYTES,
    GREP_MAX_FILE_BYTES,
    GREP_MAX_LINE_BYTES,
    GREP_MAX_MATCHES,
    GREP_MAX_TOTAL_BYTES,
    SEARCH_MAX_PATTERN_BYTES,
)
from pandastack.wire.base import Strict
from pandastack.wire.operations import SandboxOperation

# What a client gets back from this part of the API: `pandastack.sdk.models` re-exports
# these (`import *`), so a new result model is named here, beside its class.
__all__ = [
    "GlobMatches",
    "GrepMatches",
    "TextMatch",
]

_PATH = "absolute, in the guest"


def _absolute(path: str) -> str:
    # A relative path would be taken from the guest agent's working directory, which a
    # caller neither sees nor chooses.
    if not path.startswith("/"):
        raise ValueError("must be absolute (start with /)")
    if "\x00" in path:
        raise ValueError("must not contain NUL bytes")
    return path


def _pattern(pattern: str) -> str:
    size = len(pattern.encode("utf-8", "surrogatepass"))
    if not 1 <= size <= SEARCH_MAX_PATTERN_BYTES:
        raise ValueError(f"must be 1 to {SEARCH_MAX_PATTERN_BYTES} bytes of UTF-8, not {size}")
    if "\x00" in pattern:
        raise ValueError("must not contain NUL bytes")
    return pattern


class GrepRequest(Strict):
    path: str = Field(min_length=1, max_length=4096,
                      description=f"{_PATH}: a directory (searched recursively) or one file")
    pattern: str = Field(min_length=1, description=(
        "a literal substring of one line (not a regular expression), "
        f"1 to {SEARCH_MAX_PATTERN_BYTES} bytes of UTF-8, no newline"))
    ignore_case: bool = Field(False, description="fold ASCII letters")

    _path = field_validator("path")(_absolute)

    @field_validator("pattern")
    @classmethod
    def _one_line(cls, pattern: str) -> str:
        if "\n" in _pattern(pattern):
            raise ValueError("must not contain a newline: a match is within one line")
        return pattern


class GlobRequest(Strict):
    path: str = Field(min_length=1, max_length=4096,
                      description=f"{_PATH}: the directory the pattern is relative to")
    pattern: str = Field(min_length=1, description=(
        "relative to `path`, split at `/`: `*` any run of characters within one name, `?` "
        "one character, a part `**` any number of whole names (none included); "
        f"1 to {SEARCH_MAX_PATTERN_BYTES} bytes of UTF-8"))

    _path = field_validator("path")(_absolute)

    @field_validator("pattern")
    @classmethod
    def _under_path(cls, pattern: str) -> str:
        if _pattern(pattern).startswith("/"):
            raise ValueError("must be relative to path (no leading /)")
        if ".." in pattern.split("/"):
            raise ValueError("must not contain '..': it matches only under path")
        return pattern


class TextMatch(Strict):
    path: str
    line: int = Field(ge=1, description="counted from 1")
    text: str = Field(description="the line without its newline, cut to its first "
                                  f"{GREP_MAX_LINE_BYTES} bytes")


class GrepMatches(Strict):
    matches: list[TextMatch] = Field(description=(
        f"in path order, then line order; at most {GREP_MAX_MATCHES}. Binary files (a NUL "
        f"byte in the first {GREP_BINARY_PROBE_BYTES} bytes), empty ones and files over "
        f"{GREP_MAX_FILE_BYTES >> 20} MiB are skipped"))
    truncated: bool = Field(description=f"a bound (matches, {GREP_MAX_TOTAL_BYTES >> 20} MiB "
                                        "read in all) stopped the search: there may be more")


class GlobMatches(Strict):
    paths: list[str] = Field(description=f"sorted by path; at most {GLOB_MAX_PATHS}")
    truncated: bool = Field(description="a bound stopped the walk: there may be more")


# The routes and the SDK's calls are built from these rows (wire/operations.py).
_WALK = ("The guest walks `path` itself (no shell; symlinked directories are not followed) "
         "and stops at its bounds, saying `truncated`.")
GREP = SandboxOperation("POST", "files/grep", GrepRequest, GrepMatches, port="grep",
                        operation_id="grepFiles", description=_WALK,
                        summary="Lines holding a literal substring, in the files under a path")
GLOB = SandboxOperation("POST", "files/glob", GlobRequest, GlobMatches, port="glob",
                        operation_id="globFiles", description=_WALK,
                        summary="The paths under a path that a pattern (`*`, `?`, `**`) matches")
