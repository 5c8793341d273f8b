"""The events room: the event log as the API serves it, and webhooks (creation, delivery,
the lookups and address checks of their targets)."""
