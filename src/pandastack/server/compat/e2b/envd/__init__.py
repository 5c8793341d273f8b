"""E2B's in-sandbox daemon (envd) protocol over our guest agent's operations."""
