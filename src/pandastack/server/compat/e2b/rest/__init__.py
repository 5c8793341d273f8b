"""E2B's REST API (spec/openapi.yml of e2b-dev/E2B) over SandboxService."""
