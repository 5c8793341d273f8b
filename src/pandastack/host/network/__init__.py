"""Sandbox networking: namespaces, nftables policies and the egress proxy."""
