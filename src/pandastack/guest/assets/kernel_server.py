"""Entry of the pandastack code interpreter (runs in the guest): `/opt/venv/bin/python
/opt/pandastack/kernel_server.py` runs the `codeserver` package installed beside it (see its
docstring for the socket protocol).

Run as a script, this file's directory is first on sys.path, so the package is found there; it
is started by name rather than imported so that the host's type checker does not look for a
top-level `codeserver` module.
"""

import runpy

if __name__ == "__main__":
    runpy.run_module("codeserver", run_name="__main__", alter_sys=True)
