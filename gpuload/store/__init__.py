"""The store: scan an image folder, decode, compress, and write and read memory-mapped datasets."""
