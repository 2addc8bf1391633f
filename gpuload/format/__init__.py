"""The dataset format and its reading: manifest, per-image table, dataset, verify."""
