"""The sandboxes room: the sandbox service (create, find, end, pause, hibernate, wake,
reconcile), names, the stopped state, the lifecycle reaper, snapshots and fork, team templates."""
