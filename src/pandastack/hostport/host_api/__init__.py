"""The host API's own contract (spec/host-openapi.json), shared by the agent's routes
(`pandastack.host.api`) and their client (`pandastack.server.hostclient`):

    operations  the port's request/response operations as data: routes and calls are built
                from it (the streamed ones are hand-written: HAND_WRITTEN)
    models      its requests, the wrappers of its answers, its streams' RESULT frames
    codec       its JSON, and the error envelope that carries `hostport.errors` by name

The port's results cross as the dataclasses of `hostport.results` themselves. Nothing here
is the REST API's (`pandastack.wire`): the two contracts evolve apart.
"""
