"""The volumes room: volumes at the API level and their portable snapshots."""
