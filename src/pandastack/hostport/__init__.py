"""The host port: the one seam between the control plane (`pandastack.server`) and a host
(`pandastack.host`), with the types both sides share.

    protocols  RuntimePort / SandboxPort / ...: what the control plane may ask of a host
    results    the values host operations return (ExecResult, FileInfo, SnapshotInfo, ...)
    network    the egress policy and the rules that judge it (always-denied ranges)
    errors     what a host raises, in-process or carried over the host API
    host_api   the host API's contract: the port's operations as a table (routes and client
               calls are built from it), its bodies, its JSON and error envelope
    frames     the host API's streamed bodies
    forwarding port methods a wrapper of ports passes on unchanged (HostPool, LeasedHost)

Implementations: `pandastack.host.local.LocalHost` (in this process) and
`pandastack.server.hostclient.HostClient` (a `pandastack agent` over the host API).
"""
