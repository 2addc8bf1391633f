"""Object storage: URLs and stores, the node's block cache, ranged reads, push, datasets at a URL."""
