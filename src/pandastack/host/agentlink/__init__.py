"""The host side of the guest agent protocol: the agent client, the code interpreter."""
