"""Guest images: kernel, initramfs and root filesystem, cached by content hash."""
