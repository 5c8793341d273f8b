"""The accounts room: who a caller is and what a team may use: API keys and auth, the rate
limit, quotas and size classes, metering arithmetic, per-team bounds on what is held open."""
