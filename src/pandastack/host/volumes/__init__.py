"""Durable volumes on a host: raw ext4 images that outlive sandboxes (ADR 0027)."""
