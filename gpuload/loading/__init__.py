"""Loading: the order of an epoch, batches gathered into pinned memory and copied to the device."""
