"""The host runtime: VMM drivers, guest images, templates, storage and sandbox lifecycle."""
