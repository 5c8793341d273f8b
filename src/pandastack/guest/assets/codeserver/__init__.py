"""pandastack code interpreter: persistent code contexts behind a unix socket (runs in the guest).

Installed into images that have a code interpreter as /opt/pandastack/codeserver (this package)
and run by /opt/venv/bin/python /opt/pandastack/kernel_server.py; the guest agent relays its
socket to the host (`code` op, spec/guest-protocol.md). One request per connection,
newline-delimited JSON both ways:

    {"op": "run", "code", "language", "context_id", "timeout", "env", "store_history"}
        -> {"type": "stdout"|"stderr", "text"}, {"type": "result", "data", "is_main_result"},
           {"type": "error", "name", "value", "traceback"}, ..., {"type": "end",
           "execution_count"}
    {"op": "create_context", "language", "cwd"}  -> {"type": "ok", "context": {...}}
    {"op": "list_contexts"}                      -> {"type": "ok", "contexts": [...]}
    {"op": "delete_context" | "restart_context", "id"} -> {"type": "ok"}

A request that cannot be carried out is answered by one {"type": "failure", "code", "message"}
line. Closing the connection during a run interrupts it like a timeout does.

Python contexts are ipykernel kernels driven through jupyter_client (python_kernel.py); bash and
javascript contexts are one persistent `bash` / `node` process each (shell.py, javascript.py).
Only the standard library is needed for bash and javascript: jupyter_client is imported when the
first python context starts.
"""
